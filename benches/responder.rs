//! `cargo bench --bench responder`: the release binary under the project's
//! own load generator (benches/common), plus allocations per check counted
//! in-process.
//!
//! The agent runs in `-dev` mode on loopback port 0, with 1,000 keys
//! (`be_N/srv_M` = `ready`) loaded through PUTs, pinned to CPU 0; the
//! generator is pinned to CPU 1 (or on all CPUs for `c64-allcpus`).
//! Scenarios: closed loop c1, c16, c256, c64 on all CPUs; open loop 1,000 and
//! 10,000 checks/s; 10,000 idle connections (RSS per connection); a KV write
//! until the first check answers the new value.
//!
//! `BENCH_FLOOD=N` instead runs one scenario: closed loop c16 while a
//! thread holds N idle connections, closing its oldest and opening a new
//! one as fast as it can (run the agent with `-max-connections` N/2: the
//! limit held twice over; issue 39).
//!
//! Comparison mode: `BENCH_ADDR=127.0.0.1:9701 BENCH_PID=<pid>` drives that
//! responder instead (e.g. a yardstick; `scripts/bench-compare.sh` does the
//! full interleaved comparison). Knobs: `BENCH_DURATION` (s, default 4),
//! `BENCH_IDLE` (idle connections, default 10000), `BENCH_SRC_IPS` (source
//! addresses 127.0.0.1..N, default 1).

mod common;

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use common::support::{check, Kv, DEV, NO_FIXED_PORTS};
use common::*;

#[global_allocator]
static ALLOC: Counting = Counting;

/// Closed loop c16 while `n` idle connections are held and renewed.
fn flood(addr: SocketAddrV4, pid: u32, n: usize, dur: Duration, gen_cpu: &[usize]) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let flooder = {
        let (stop, opened) = (stop.clone(), opened.clone());
        std::thread::spawn(move || {
            let mut held = std::collections::VecDeque::from(hold_idle(addr, n));
            while !stop.load(Ordering::Relaxed) {
                if let Some(fd) = held.pop_front() {
                    close_rst(fd);
                }
                held.extend(hold_idle(addr, 1));
                opened.fetch_add(1, Ordering::Relaxed);
            }
            held.into_iter().for_each(close_rst);
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let c0 = proc_cpu(pid);
    let o = run(&Load {
        cpus: gen_cpu.to_vec(),
        ..Load::new(addr, Mode::Closed(16), dur)
    });
    let agent_cpu = proc_cpu(pid).saturating_sub(c0).as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = flooder.join();
    let mut t = Table::new(
        "responder_flood",
        &[
            "scenario",
            "checks/s",
            "p50_us",
            "p99_us",
            "max_us",
            "errors",
            "flood_conns/s",
            "agent_cpu_%",
        ],
    );
    let el = o.elapsed.as_secs_f64();
    t.row(vec![
        format!("c16+flood{n}"),
        f0(o.rate()),
        f1(o.q_us(0.5)),
        f1(o.q_us(0.99)),
        f1(o.q_us(1.0)),
        o.errors.total().to_string(),
        f0(opened.load(Ordering::Relaxed) as f64 / (el + 0.5)),
        f1(100.0 * agent_cpu / el),
    ]);
    if let Some(e) = o.first_error {
        println!("  first error: {e} ({:?})", o.errors);
    }
    t.finish();
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` / `cargo bench -- --list`
    }
    // `cargo bench --bench responder -- allocations`: that table alone
    // (in-process, no load generator, a few seconds).
    if std::env::args().any(|a| a == "allocations") {
        allocations_per_check();
        return;
    }
    raise_nofile();
    let dur = env_secs("BENCH_DURATION", 4.0);
    let idle_n: usize = std::env::var("BENCH_IDLE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let kv_writes: usize = std::env::var("BENCH_KV_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let src_ips: u8 = std::env::var("BENCH_SRC_IPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let cpus = ncpus();
    let gen_cpu = if cpus >= 2 { vec![1] } else { vec![] };

    let external = std::env::var("BENCH_ADDR")
        .ok()
        .map(|a| a.parse::<SocketAddrV4>().expect("BENCH_ADDR"));
    let mut agent = None;
    let (addr, pid, name) = match external {
        Some(a) => {
            let pid: u32 = std::env::var("BENCH_PID")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (a, pid, format!("external {a}"))
        }
        None => {
            let a = bench_agent(&["-read-timeout", "60s"]);
            if cpus >= 2 {
                pin(a.proc.pid() as i32, &[0]);
            }
            let t = Instant::now();
            load_fleet(&a.kv(), 1000, a.listen(), Duration::from_secs(10));
            println!(
                "loaded 1,000 keys through PUTs in {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            let r = (v4(a.listen()), a.proc.pid(), "agent".to_string());
            agent = Some(a);
            r
        }
    };
    println!(
        "responder: {name} (pid {pid}); generator pinned to {gen_cpu:?}; {dur:?} per scenario"
    );

    if let Some(n) = std::env::var("BENCH_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        flood(addr, pid, n, dur, &gen_cpu);
        return;
    }

    // Warm-up.
    run(&Load {
        cpus: gen_cpu.clone(),
        ..Load::new(addr, Mode::Closed(16), Duration::from_millis(500))
    });

    let mut t = Table::new(
        "responder",
        &[
            "scenario",
            "checks/s",
            "p50_us",
            "p90_us",
            "p99_us",
            "p99.9_us",
            "max_us",
            "errors",
            "agent_cpu_%",
            "agent_cpu_us/check",
            "gen_cpu_%",
            "rss_kB",
            "steal_%",
            "other_cpu_%",
        ],
    );
    let scenarios: Vec<(String, Mode, usize, Vec<usize>)> = vec![
        ("c1".into(), Mode::Closed(1), 1, gen_cpu.clone()),
        ("c16".into(), Mode::Closed(16), 1, gen_cpu.clone()),
        ("c256".into(), Mode::Closed(256), 1, gen_cpu.clone()),
        ("c64-allcpus".into(), Mode::Closed(64), cpus, vec![]),
        ("open1000".into(), Mode::Open(1000), 1, gen_cpu.clone()),
        ("open10000".into(), Mode::Open(10_000), 1, gen_cpu.clone()),
    ];
    for (label, mode, threads, pinned) in scenarios {
        let load = Load {
            threads,
            cpus: pinned,
            src_ips,
            ..Load::new(addr, mode, dur)
        };
        let (c0, s0) = (proc_cpu(pid), cpu_stat());
        let o = run(&load);
        let (c1, s1) = (proc_cpu(pid), cpu_stat());
        let agent_cpu = c1.saturating_sub(c0).as_secs_f64();
        let (busy, steal, total) = s0.iter().zip(&s1).fold((0, 0, 0), |a, (x, y)| {
            (a.0 + y.0 - x.0, a.1 + y.1 - x.1, a.2 + y.2 - x.2)
        });
        let el = o.elapsed.as_secs_f64();
        let ncpu = s0.len().max(1) as f64;
        // Busy time of all CPUs not explained by the agent or the generator,
        // in % of one core: a high value marks a disturbed run.
        let other = (busy as f64 / total.max(1) as f64 * ncpu * 100.0)
            - 100.0 * (agent_cpu + o.gen_cpu.as_secs_f64()) / el;
        t.row(vec![
            label,
            f0(o.rate()),
            f1(o.q_us(0.5)),
            f1(o.q_us(0.9)),
            f1(o.q_us(0.99)),
            f1(o.q_us(0.999)),
            f1(o.q_us(1.0)),
            o.errors.total().to_string(),
            f1(100.0 * agent_cpu / el),
            f1(agent_cpu * 1e6 / o.checks.max(1) as f64),
            f1(100.0 * o.gen_cpu.as_secs_f64() / el),
            rss_kb(pid).to_string(),
            f1(100.0 * steal as f64 / total.max(1) as f64),
            f0(other.max(0.0)),
        ]);
        if let Some(e) = o.first_error {
            println!("  first error: {e} ({:?})", o.errors);
        }
    }

    // Idle connections: RSS per connection.
    if idle_n > 0 && pid != 0 {
        let before = rss_kb(pid);
        let fds = hold_idle(addr, idle_n);
        std::thread::sleep(Duration::from_millis(500));
        let with = rss_kb(pid);
        let n = fds.len();
        for fd in fds {
            close_rst(fd);
        }
        std::thread::sleep(Duration::from_millis(300));
        let after = rss_kb(pid);
        let per = (with.saturating_sub(before)) as f64 * 1024.0 / n.max(1) as f64;
        t.sparse_row(&[
            ("scenario", format!("idle{n}")),
            (
                "rss_kB",
                format!("{before}->{with}->{after} ({per:.0} B/conn)"),
            ),
        ]);
    }

    // A KV write until the first check that answers it. Writes 1.1 s apart:
    // the watcher's token bucket (5 burst, 1/s) would otherwise delay
    // re-reads on purpose.
    if let Some(a) = agent.as_ref() {
        let kv = a.kv();
        let mut took = Vec::new();
        for i in 0..kv_writes {
            let flip = if i % 2 == 0 {
                ("bench/flip", "maint", "maint 100%")
            } else {
                ("bench/flip", "drain", "drain 100%")
            };
            match write_to_answer(&kv, a, flip, Duration::from_secs(2)) {
                Some(d) => took.push(d.as_nanos() as u64),
                None => took.push(u64::MAX),
            }
            std::thread::sleep(Duration::from_millis(1100));
        }
        took.sort_unstable();
        let failed = took.iter().filter(|&&x| x == u64::MAX).count();
        t.sparse_row(&[
            ("scenario", "kv-write-to-answer (1,001 keys)".into()),
            ("p50_us", f1(quantile_us(&took, 0.5))),
            ("max_us", f1(quantile_us(&took, 1.0))),
            ("errors", failed.to_string()),
        ]);
    }
    t.finish();
    drop(agent);

    allocations_per_check();
}

/// Runs the event loop in a thread of this process and counts that thread's
/// allocations over many checks (target: zero on the hot path).
fn allocations_per_check() {
    use gitlab_haproxy_agent::config::{self, Command};
    use gitlab_haproxy_agent::event_loop::{bind, EventLoop, Listeners};

    let args: Vec<std::ffi::OsString> = DEV.iter().chain(&NO_FIXED_PORTS).map(Into::into).collect();
    let Ok(Command::Run(mut cfg)) = config::parse(args, &|_| None) else {
        panic!("config");
    };
    let agent = bind(cfg.listen_addr.as_ref().expect("listen")).expect("bind");
    let devkv = bind(cfg.dev_kv_addr.as_ref().expect("kv")).expect("bind kv");
    let (addr, kv) = (agent.local_addr().unwrap(), devkv.local_addr().unwrap());
    if cfg.consul_follows_dev_kv() {
        cfg.consul.retarget(kv);
    }
    let listeners = Listeners {
        agent: Some(agent),
        monitoring: None,
        pprof: None,
        devkv: Some(devkv),
    };
    let mut el = EventLoop::new(&cfg, listeners).expect("loop");
    std::thread::spawn(move || {
        count_this_thread();
        let _ = el.run();
    });
    let kv = Kv {
        addr: kv,
        proc: None,
    };
    load_fleet(&kv, 1000, addr, Duration::from_secs(10));
    let lines = identity_lines(1000);
    let mut t = Table::new(
        "allocations",
        &["path", "checks", "allocations", "bytes", "allocs/check"],
    );
    // Warm-up so that buffers the loop keeps have reached their size.
    for l in lines.iter().take(2000 % lines.len()) {
        check(addr, l);
    }
    // 0: line in the socket at accept; 1: registered, whole line later;
    // 2: registered, line in two pieces.
    let mut measure = |label: &str, lines: &[Vec<u8>], n: usize, slow: u8| {
        let (a0, b0) = allocs();
        for i in 0..n {
            let line = &lines[i % lines.len()];
            if slow > 0 {
                // Connect, wait, then send (whole or in two pieces): the
                // slab, registration, timer (and partial-line) path.
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                std::thread::sleep(Duration::from_micros(300));
                use std::io::{Read, Write};
                let cut = if slow == 2 { 3 } else { line.len() };
                s.write_all(&line[..cut]).unwrap();
                std::thread::sleep(Duration::from_micros(300));
                s.write_all(&line[cut..]).unwrap();
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
            } else {
                check(addr, line);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        let (a1, b1) = allocs();
        t.row(vec![
            label.to_string(),
            n.to_string(),
            (a1 - a0).to_string(),
            (b1 - b0).to_string(),
            format!("{:.3}", (a1 - a0) as f64 / n as f64),
        ]);
    };
    measure("fast (line in socket at accept)", &lines, 10_000, 0);
    measure("registered, whole line later", &lines, 1_000, 1);
    measure("registered, line in 2 pieces", &lines, 1_000, 2);
    // An identity without a key is remembered at its first ask (its name
    // kept, bounded by -max-unknown-identities); asked again, it is not.
    let strangers: Vec<Vec<u8>> = (0..1000)
        .map(|i| format!("no_key_{i}/srv\n").into_bytes())
        .collect();
    measure("no key, first ask", &strangers, 1_000, 0);
    measure("no key, asked again", &strangers, 1_000, 0);
    t.finish();
}
