//! `cargo bench --bench swap`: a KV snapshot decoded and swapped.
//!
//! 1. In-process: `kv::decode_list` + `state::Snapshot::build` of a
//!    consul-shaped recurse listing with 1,000 / 10,000 / 100,000 keys:
//!    time (median and max of several runs) and allocations (counting
//!    global allocator).
//! 2. Through the release binary (`-dev`, pinned to CPU 0): 100,000 keys
//!    loaded, then one write makes the watcher re-read all of them while an
//!    open-loop load of 2,000 checks/s runs; reports the write-to-answer
//!    time and the latency of the checks in flight during the swap. In dev
//!    mode the same loop also *encodes* the listing (the dev KV), so this is
//!    an upper bound of what a real consul costs the loop.
//! 3. The state file (`-state-file`): in-process, the time from handing a
//!    1k / 10k / 100k-key snapshot to the writer thread until it is on disk
//!    (encode, write, fsync, rename, fsync of the directory); through the
//!    binary, part 2 again at 1,000 and 100,000 keys with and without
//!    `-state-file`, the window now lasting until the file is written too.

mod common;

use std::time::{Duration, Instant};

use common::support::STATE_PREFIX;
use common::*;
use gitlab_haproxy_agent::kv::decode_list;
use gitlab_haproxy_agent::persist::StateFile;
use gitlab_haproxy_agent::state::Snapshot;

#[global_allocator]
static ALLOC: Counting = Counting;

/// `BENCH_FLAGS=N`: every key's consul Flags (an expiry, as `-for` writes
/// it: e.g. 1800000000); 0 by default.
fn flags() -> u64 {
    std::env::var("BENCH_FLAGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The expiry count after a swap of `n` keys with Flags (loop work, in
/// 1 ms slices like the rest): its whole time and its number of slices.
fn expiry_count(n: usize) {
    use gitlab_haproxy_agent::slice::Slice;
    use gitlab_haproxy_agent::state::expiry::Expiry;
    use gitlab_haproxy_agent::state::{Clock, Swapper};
    let pairs = decode_list(&listing(n, flags())).expect("decode");
    let t0 = Instant::now();
    let mut state = Swapper::new(
        STATE_PREFIX,
        Clock::new(t0, std::time::SystemTime::now()),
        10,
    );
    state.swap(Snapshot::build(STATE_PREFIX, 1, pairs), t0);
    let mut e = Expiry::default();
    e.soon(t0);
    let unix = flags() + 1;
    let (start, mut slices) = (Instant::now(), 1);
    while !e.step(
        &state,
        Instant::now(),
        unix,
        &mut Slice::of_turn(Instant::now()),
    ) {
        slices += 1;
    }
    let took = start.elapsed();
    println!(
        "expiry count of {n} keys with Flags (all expired): {:.2} ms in {slices} slices of the loop, {} expired",
        took.as_secs_f64() * 1e3,
        e.expired()
    );
}

/// decode + build + change scan + drop, at 1k, 10k and 100k keys.
fn swap_table() {
    COUNT_ALL.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut t = Table::new(
        "swap",
        &[
            "keys",
            "body_bytes",
            "decode_ms",
            "build_ms",
            "diff_ms",
            "drop_ms",
            "total_ms_median",
            "total_ms_max",
            "allocations",
            "alloc_bytes",
            "runs",
        ],
    );
    for n in [1_000usize, 10_000, 100_000] {
        let body = listing(n, flags());
        let runs = if n >= 100_000 { 5 } else { 20 };
        let mut dec = Vec::new();
        let mut bld = Vec::new();
        let mut dif = Vec::new();
        let mut drp = Vec::new();
        let mut tot = Vec::new();
        let mut allocs_one = (0, 0);
        let mut current = Snapshot::default();
        for r in 0..runs {
            let (a0, b0) = allocs();
            let t0 = Instant::now();
            let pairs = decode_list(&body).expect("decode");
            let t1 = Instant::now();
            let snap = Snapshot::build(STATE_PREFIX, r as u64 + 1, pairs);
            let t2 = Instant::now();
            // The per-key change log the loop computes, a slice a turn.
            let changes = snap.changes_from(&current).len();
            std::hint::black_box(changes);
            let t2b = Instant::now();
            // The swap itself: the old snapshot is dropped here, as in the loop.
            let old = std::mem::replace(&mut current, snap);
            drop(old);
            let t3 = Instant::now();
            let (a1, b1) = allocs();
            allocs_one = (a1 - a0, b1 - b0);
            dec.push(t1 - t0);
            bld.push(t2 - t1);
            dif.push(t2b - t2);
            drp.push(t3 - t2b);
            tot.push(t3 - t0);
        }
        assert_eq!(current.len(), n);
        let med = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64() * 1e3
        };
        let max = tot.iter().max().unwrap().as_secs_f64() * 1e3;
        t.row(vec![
            n.to_string(),
            body.len().to_string(),
            format!("{:.2}", med(&mut dec)),
            format!("{:.2}", med(&mut bld)),
            format!("{:.2}", med(&mut dif)),
            format!("{:.2}", med(&mut drp)),
            format!("{:.2}", med(&mut tot)),
            format!("{max:.2}"),
            allocs_one.0.to_string(),
            allocs_one.1.to_string(),
            runs.to_string(),
        ]);
    }
    t.finish();
    COUNT_ALL.store(false, std::sync::atomic::Ordering::Relaxed);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    swap_table();
    if flags() != 0 {
        expiry_count(100_000);
    }
    // `BENCH_SWAP_ONLY=1`: the decode/build/swap table alone.
    if std::env::var_os("BENCH_SWAP_ONLY").is_some() {
        return;
    }

    state_file_writes();
    let dir = std::env::temp_dir().join(format!("gha-bench-swap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench temp dir");
    let mut t = in_flight_table();
    for n in [1_000, 100_000] {
        in_flight_during_swap(&mut t, n, None);
        in_flight_during_swap(&mut t, n, Some(&dir.join(format!("state-{n}.json"))));
    }
    t.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Snapshot handed over -> file on disk, through the writer thread.
fn state_file_writes() {
    let dir = std::env::temp_dir().join(format!("gha-bench-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench temp dir");
    let path = dir.join("state.json");
    let mut t = Table::new(
        "state_file_write",
        &[
            "keys",
            "file_bytes",
            "write_ms_median",
            "write_ms_max",
            "runs",
        ],
    );
    for n in [1_000usize, 10_000, 100_000] {
        let pairs = decode_list(&listing(n, flags())).expect("decode");
        let snap = std::sync::Arc::new(Snapshot::build(STATE_PREFIX, 1, pairs));
        let mut file = StateFile::start(path.clone(), STATE_PREFIX.to_owned()).expect("writer");
        let mut took = Vec::new();
        for _ in 0..5 {
            let before = file.writes();
            let t0 = Instant::now();
            file.save(snap.clone());
            while file.writes() == before {
                assert_eq!(file.write_errors(), 0, "state file write failed");
                std::thread::sleep(Duration::from_micros(200));
            }
            took.push(t0.elapsed());
        }
        file.finish(Duration::from_secs(5));
        took.sort();
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        t.row(vec![
            n.to_string(),
            bytes.to_string(),
            format!("{:.1}", took[took.len() / 2].as_secs_f64() * 1e3),
            format!("{:.1}", took[took.len() - 1].as_secs_f64() * 1e3),
            took.len().to_string(),
        ]);
    }
    t.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

fn in_flight_table() -> Table {
    Table::new(
        "swap_in_flight",
        &[
            "keys",
            "state_file",
            "write_to_answer_ms",
            "file_written_ms",
            "checks_in_window",
            "window_p50_us",
            "window_p99_us",
            "window_max_us",
            "baseline_p99_us",
            "errors",
        ],
    )
}

/// The file's inode: every write renames a new file into place.
fn inode(path: Option<&std::path::Path>) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path?).ok().map(|m| m.ino())
}

/// When `path` was replaced (its inode is no longer `before`), polled,
/// within 10 s. (Not its mtime: file times come from the kernel's coarse
/// clock, a few ms behind `SystemTime::now()`.)
fn replaced(path: Option<&std::path::Path>, before: Option<u64>) -> Option<Instant> {
    path?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if inode(path).is_some_and(|i| Some(i) != before) {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

fn in_flight_during_swap(table: &mut Table, n: usize, state_file: Option<&std::path::Path>) {
    raise_nofile();
    // Consul is another process, as in production: a second binary in -dev
    // mode serves the KV (its encoding of the 13 MB listing is not the
    // agent's work); the agent under test watches it over TCP.
    let consul = bench_consul(&[]);
    let consul_addr = consul.addr.to_string();
    let file_arg = state_file.map(|p| p.to_string_lossy().into_owned());
    let mut args = vec!["-consul-addr", consul_addr.as_str()];
    if let Some(f) = &file_arg {
        args.extend(["-state-file", f.as_str()]);
    }
    let agent = bench_agent(&args);
    if ncpus() >= 2 {
        pin(agent.proc.pid() as i32, &[0]);
    }
    let t = Instant::now();
    load_fleet(&consul, n, agent.listen(), Duration::from_secs(60));
    println!(
        "loaded {n} keys through PUTs in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Let the load's last state file write finish before measuring.
    std::thread::sleep(Duration::from_millis(if n >= 100_000 { 1500 } else { 300 }));

    let gen_cpu = if ncpus() >= 2 { vec![1] } else { vec![] };
    for rep in 0..3 {
        let addr = v4(agent.listen());
        let load = Load {
            keep_samples: true,
            cpus: gen_cpu.clone(),
            ..Load::new(addr, Mode::Open(2_000), Duration::from_secs(3))
        };
        let started = Instant::now();
        let h = std::thread::spawn(move || run(&load));
        std::thread::sleep(Duration::from_millis(1000));
        let flip = if rep % 2 == 0 {
            ("bench/flip", "maint", "maint 100%")
        } else {
            ("bench/flip", "drain", "drain 100%")
        };
        let before = inode(state_file);
        let w0 = Instant::now();
        let took = write_to_answer(&consul, &agent, flip, Duration::from_secs(10));
        let written = replaced(state_file, before);
        let w1 = written.map_or(Instant::now(), |w| w.max(Instant::now()));
        let o = h.join().unwrap();
        // Checks scheduled from the write until the answer changed and the
        // state file (if any) was written, plus 10 ms: the ones the swap or
        // the file could delay.
        let from = w0.duration_since(started).as_nanos() as u64;
        let to = (w1 + Duration::from_millis(10))
            .duration_since(started)
            .as_nanos() as u64;
        let shift = 5_000_000; // run() starts 5 ms after `started`
        let mut inwin: Vec<u64> = o
            .samples
            .iter()
            .filter(|(s, _)| s + shift >= from && s + shift <= to)
            .map(|&(_, l)| l)
            .collect();
        inwin.sort_unstable();
        let mut base: Vec<u64> = o
            .samples
            .iter()
            .filter(|(s, _)| s + shift < from)
            .map(|&(_, l)| l)
            .collect();
        base.sort_unstable();
        table.row(vec![
            n.to_string(),
            (if state_file.is_some() { "on" } else { "off" }).to_string(),
            took.map_or("timeout".into(), |d| {
                format!("{:.1}", d.as_secs_f64() * 1e3)
            }),
            written.map_or("-".into(), |w| {
                format!("{:.1}", w.duration_since(w0).as_secs_f64() * 1e3)
            }),
            inwin.len().to_string(),
            f1(quantile_us(&inwin, 0.5)),
            f1(quantile_us(&inwin, 0.99)),
            f1(quantile_us(&inwin, 1.0)),
            f1(quantile_us(&base, 0.99)),
            o.errors.total().to_string(),
        ]);
        std::thread::sleep(Duration::from_millis(300));
    }
}
