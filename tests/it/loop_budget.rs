//! Answers never wait on the agent itself (issue 26): its own operator
//! features (heavy renders, log lines) put no unbounded work on the loop.
//! Timing claims are asserted as structure (every check answered, memory
//! shared, lines counted as dropped), not as milliseconds; the figures are
//! `scripts/loop-stall.py`'s.
//!
//! Every test starts its own agent on loopback port 0 and bounds its
//! connection count and its time.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::process::rss_kib;
use crate::support::{check, metric_value, put_many, wait_for, Agent, Checker, BIN};

use crate::support::STATE_PREFIX as PREFIX;

/// A `-dev` agent holding `n` drained keys (`be_api/srv<i>`; the checker
/// asks for `be_web/srv1`), synced.
fn agent_with_keys(n: usize) -> Agent {
    let agent = Agent::dev(&[]);
    agent.wait_reply("be_web/srv1", "ready 100%", Duration::from_secs(5));
    let kv = agent.dev_kv.expect("dev KV");
    let keys = (0..n).map(|i| (format!("{PREFIX}/be_api/srv{i}"), "drain"));
    assert_eq!(put_many(kv, keys), n);
    agent.wait_reply(
        &format!("be_api/srv{}", n - 1),
        "drain 100%",
        Duration::from_secs(10),
    );
    agent
}

/// 32 pprof connections each ask `/debug/state` of 20,000 keys three times
/// and never read: they share the renders (a reference each, not a copy),
/// so memory grows by a few renders, not 32 × 3; checks are answered all
/// along (the render is built a slice at a time).
#[test]
fn thirty_two_non_reading_debug_state_connections_share_the_render() {
    let agent = agent_with_keys(20_000);
    let pprof = agent.pprof.unwrap();
    let pid = agent.proc.pid();
    // One render, read whole: its size.
    let (status, body) = support::http(pprof, "GET", "/debug/state", b"").unwrap();
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["state"]["keys"], 20_000);
    let render_kib = body.len() as u64 / 1024;
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss_kib(pid);
    let checks = Checker::start(agent.listen());
    let req = b"GET /debug/state HTTP/1.1\r\nHost: x\r\n\r\n".repeat(3);
    let held: Vec<TcpStream> = (0..32)
        .map(|_| {
            let mut s = TcpStream::connect(pprof).unwrap();
            s.write_all(&req).unwrap();
            s
        })
        .collect();
    // Time for every render asked (a few hundred ms of slices at most).
    std::thread::sleep(Duration::from_secs(3));
    let grown = rss_kib(pid).saturating_sub(idle);
    let (p99, max) = checks.finish("32 non-reading /debug/state connections");
    eprintln!(
        "non-reading: render {render_kib} KiB, RSS +{grown} KiB, checks p99 {p99:?} max {max:?}"
    );
    // A copy per connection would be 32 × render (the review: +169 MB).
    assert!(
        grown < 8 * render_kib + 8 * 1024,
        "RSS grew {grown} KiB for renders of {render_kib} KiB"
    );
    drop(held);
}

/// stderr is a pipe nobody reads (a stalled journald or container pipe):
/// 20,000 state-change lines fill it, the queue drops and counts the rest,
/// and every check is answered meanwhile. Once the reader reads, one line
/// says how many were lost.
#[test]
fn a_stalled_log_reader_never_stops_the_answers() {
    let mut cmd = Command::new(BIN);
    cmd.args(["-dev", "-dev-kv-addr", "127.0.0.1:0"])
        .args([
            "-listen-addr",
            "127.0.0.1:0",
            "-monitoring-addr",
            "127.0.0.1:0",
        ])
        .args(["-pprof-addr", "127.0.0.1:0"])
        .env("GITLAB_LOG_LEVEL", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // Read up to the listening line, then stop reading.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let line = loop {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "agent exited: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some(l) = text.lines().find(|l| l.contains("\"msg\":\"listening\"")) {
            break l.to_owned();
        }
    };
    let addr = |name: &str| -> std::net::SocketAddr {
        let start = line.find(&format!("{name}=")).unwrap() + name.len() + 1;
        let rest = &line[start..];
        rest[..rest.find([' ', '"']).unwrap()].parse().unwrap()
    };
    let (listen, kv, mon) = (
        addr("listen_addr"),
        addr("dev_kv_addr"),
        addr("monitoring_addr"),
    );
    let guard = KillOnDrop(child);
    wait_for(Duration::from_secs(5), "synced", || {
        (check(listen, b"be_web/srv1\n").as_deref() == Some("ready 100%")).then_some(())
    });
    let checks = Checker::start(listen);
    // 20,000 changes: 20,000 info lines (~3 MB), far past the pipe (64 KiB)
    // and the queue (1 MiB).
    let keys = (0..20_000).map(|i| (format!("{PREFIX}/be_api/srv{i}"), "drain"));
    put_many(kv, keys);
    let dropped = wait_for(Duration::from_secs(20), "lines dropped", || {
        let (_, body) = support::http(mon, "GET", "/-/metrics", b"")?;
        let text = String::from_utf8(body).ok()?;
        metric_value(&text, "gitlab_haproxy_agent_log_lines_dropped_total").filter(|&d| d > 0.0)
    });
    wait_for(Duration::from_secs(20), "every write answered", || {
        (check(listen, b"be_api/srv19999\n").as_deref() == Some("drain 100%")).then_some(())
    });
    let (p99, max) = checks.finish("a stalled log reader");
    eprintln!("stalled stderr: {dropped} lines dropped; checks p99 {p99:?} max {max:?}");
    // The reader catches up: a line says how many were lost.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n @ 1..) = stderr.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rest = Vec::new();
    while !String::from_utf8_lossy(&rest).contains("\"msg\":\"log lines dropped") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => rest.extend_from_slice(&chunk),
            Err(_) => panic!("no line says lines were lost"),
        }
    }
    drop(guard); // killed by PID; the reader thread then ends
}

/// Kills the child by PID when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
