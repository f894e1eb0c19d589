//! `cargo bench --bench fleet`: what one KV write costs a fleet of agents
//! watching the same prefix on one consul (issue 18).
//!
//! 1. In-process: gzip's cost per MB of a consul-shaped 10,000-key
//!    listing, inflating (the agent's side) and compressing (consul's).
//! 2. Processes: one consul (the release binary in `-dev` mode, its agent
//!    listener off, its own watch on another prefix) holding a 10,000-key
//!    prefix, and N agents (the release binary, `-consul-addr` it) watching
//!    that prefix, with gzip off, then on. Per write: the time from the PUT
//!    until each agent answers the new value (p50 and max over the fleet;
//!    a round-robin poller checks every agent not yet converged, so the
//!    figures include the poller's own round, a few ms), and the bytes the
//!    fleet received for it (the sum of the agents'
//!    `consul_received_bytes_total` deltas: what consul served). Reported:
//!    medians over the writes of the p50 and the max, the worst max, and
//!    the median bytes per write. On a small machine every agent shares
//!    its cores, so convergence there is mostly the fleet's CPU: run with
//!    `FLEET_AGENTS=1` for one agent's own time.
//!
//! Knobs: `FLEET_AGENTS` (50), `FLEET_KEYS` (10,000), `FLEET_WRITES` per
//! mode (5), `FLEET_SECS` (300: the whole run gives up past this; each
//! write waits at most 30 s). Everything it starts is stopped when it ends,
//! however it ends.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::support::{check, metrics, put_many, Agent, Kv, STATE_PREFIX};
use common::*;
use gitlab_haproxy_agent::http::{gzip, Inflater};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One agent of the fleet (gzip on or off) watching `consul`.
fn member(consul: SocketAddr, gzip: bool) -> Agent {
    let consul = consul.to_string();
    let gzip = if gzip { "true" } else { "false" };
    let args = [
        "-consul-addr",
        &consul,
        "-consul-gzip",
        gzip,
        "-pprof-addr",
        "",
    ];
    Agent::start(&args, &INFO_LOGS)
}

fn received(member: &Agent) -> f64 {
    member.metric(metrics::RECEIVED_BYTES)
}

/// The median of `runs` timings of `f`, in ms.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn inflate_cost(keys: usize) {
    let body = listing(keys, 0);
    let z = gzip(&body);
    let mb = body.len() as f64 / 1e6;
    let inflate = median_ms(21, || {
        let mut inf = Inflater::new(body.len());
        let mut out = Vec::with_capacity(body.len());
        let mut at = 0;
        // A turn's step at a time, as the client does.
        while at < z.len() || out.len() < body.len() {
            at += inf.feed(&z[at..], &mut out, 1 << 20).expect("inflate");
        }
        inf.finish().expect("whole");
        assert_eq!(out.len(), body.len());
    });
    let compress = median_ms(5, || {
        std::hint::black_box(gzip(&body));
    });
    let mut t = Table::new(
        "fleet_gzip_cost",
        &[
            "keys",
            "body_bytes",
            "gzip_bytes",
            "ratio",
            "inflate_ms",
            "inflate_ms_per_mb",
            "gzip_ms",
            "gzip_ms_per_mb",
        ],
    );
    t.row(vec![
        keys.to_string(),
        body.len().to_string(),
        z.len().to_string(),
        format!("{:.1}", body.len() as f64 / z.len() as f64),
        format!("{inflate:.2}"),
        format!("{:.2}", inflate / mb),
        format!("{compress:.1}"),
        format!("{:.1}", compress / mb),
    ]);
    t.finish();
}

/// Convergence of one write of `be_0/srv_0 = N%` (a value it never held
/// before: a write that changes nothing wakes nobody): each member's time
/// to answer it, or `None` when it did not within `limit`.
fn converge(fleet: &[Agent], kv: &Kv, n: usize, limit: Duration) -> Vec<Option<Duration>> {
    let line = b"be_0/srv_0\n";
    let want = format!("ready {n}%");
    let mut took = vec![None; fleet.len()];
    let t0 = Instant::now();
    kv.put(&format!("{STATE_PREFIX}/be_0/srv_0"), &format!("{n}%"));
    while took.iter().any(Option::is_none) && t0.elapsed() < limit {
        for (m, t) in fleet.iter().zip(took.iter_mut()) {
            if t.is_none() && check(m.listen(), line).as_deref() == Some(&want[..]) {
                *t = Some(t0.elapsed());
            }
        }
    }
    took
}

fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3
}

/// One write's figures: p50 and max convergence (ms), agents that did not
/// converge, bytes the fleet received.
struct WriteResult {
    p50: f64,
    max: f64,
    missed: usize,
    bytes: f64,
}

/// The run's settings.
struct Run {
    agents: usize,
    keys: usize,
    writes: usize,
    deadline: Instant,
}

/// One fleet with gzip on or off: started, synced, `run.writes` writes
/// (numbered on from `*seq`).
fn fleet_run(run: &Run, consul: &Kv, gzip: bool, seq: &mut usize) -> Vec<WriteResult> {
    let started = Instant::now();
    let fleet: Vec<Agent> = (0..run.agents).map(|_| member(consul.addr, gzip)).collect();
    for m in &fleet {
        let left = run.deadline.saturating_duration_since(Instant::now());
        m.wait_reply("bench/sentinel", "drain 100%", left);
    }
    println!(
        "gzip {}: {} agents synced on {} keys in {:.1} s",
        if gzip { "on" } else { "off" },
        run.agents,
        run.keys,
        started.elapsed().as_secs_f64()
    );
    let mut results = Vec::new();
    for _ in 0..run.writes {
        if Instant::now() >= run.deadline {
            println!("FLEET_SECS passed: stopping");
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        let before: f64 = fleet.iter().map(received).sum();
        *seq += 1;
        let limit =
            Duration::from_secs(30).min(run.deadline.saturating_duration_since(Instant::now()));
        let took = converge(&fleet, consul, *seq, limit);
        // Every agent's read of this write is counted once it answers.
        std::thread::sleep(Duration::from_millis(200));
        let bytes = fleet.iter().map(received).sum::<f64>() - before;
        let mut done: Vec<Duration> = took.iter().flatten().copied().collect();
        done.sort();
        let (p50, max) = match done.is_empty() {
            true => (f64::NAN, f64::NAN),
            false => (quantile_ms(&done, 0.5), quantile_ms(&done, 1.0)),
        };
        println!("gzip {gzip}: write {seq}: p50 {p50:.1} ms, max {max:.1} ms, {bytes:.0} bytes");
        results.push(WriteResult {
            p50,
            max,
            missed: run.agents - done.len(),
            bytes,
        });
    }
    results
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let agents = env_usize("FLEET_AGENTS", 50);
    let keys = env_usize("FLEET_KEYS", 10_000);
    let writes = env_usize("FLEET_WRITES", 5);
    let deadline = Instant::now() + env_secs("FLEET_SECS", 300.0);
    raise_nofile();
    inflate_cost(keys);

    // Consul: the dev KV of one process, its own watch on another prefix
    // (so it decodes nothing of the fleet's).
    let consul = bench_consul(&["-kv-prefix", "bench/consul-itself"]);
    let load = (0..keys).map(|i| {
        (
            format!("{STATE_PREFIX}/be_{}/srv_{}", i / 10, i % 10),
            fleet_value(i),
        )
    });
    put_many(consul.addr, load);
    consul.put(&format!("{STATE_PREFIX}/bench/sentinel"), "drain");
    let run = Run {
        agents,
        keys,
        writes,
        deadline,
    };
    let mut t = Table::new(
        "fleet",
        &[
            "gzip",
            "agents",
            "keys",
            "writes",
            "converged_p50_ms",
            "converged_max_ms",
            "worst_max_ms",
            "not_converged",
            "bytes_per_write",
            "bytes_per_agent",
        ],
    );
    let mut seq = 0;
    for gzip in [false, true] {
        let r = fleet_run(&run, &consul, gzip, &mut seq);
        let bytes = median(r.iter().map(|w| w.bytes).collect());
        t.row(vec![
            if gzip { "on" } else { "off" }.into(),
            agents.to_string(),
            keys.to_string(),
            r.len().to_string(),
            format!("{:.1}", median(r.iter().map(|w| w.p50).collect())),
            format!("{:.1}", median(r.iter().map(|w| w.max).collect())),
            format!("{:.1}", r.iter().map(|w| w.max).fold(0.0, f64::max)),
            r.iter().map(|w| w.missed).sum::<usize>().to_string(),
            format!("{bytes:.0}"),
            format!("{:.0}", bytes / agents as f64),
        ]);
    }
    t.finish();
}
