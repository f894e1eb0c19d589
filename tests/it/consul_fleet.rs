//! A good citizen of consul at fleet scale (SPEC §5): gzip bodies asked
//! for and inflated under every framing, the gzip bomb, corrupt and unknown
//! codings, bounded stale reads (against the KV, and against a fake consul
//! whose stale and consistent answers differ), and the metrics that show
//! them. The reconnect spread after a consul restart is shown on a virtual
//! clock with a thousand clients (`consul::client` unit tests): one process
//! here could not show a fleet's spread.
//!
//! Every agent here runs with `-consul-wait 1s`, as in `consul_faults.rs`.

use crate::support;
use crate::support::metrics::{errors, RECEIVED_BYTES as BYTES, SWAPS};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::support::process::status_kib;
use crate::support::proxy::{After, Mode, Wire};
use crate::support::rig::Rig;
use crate::support::{unique_prefix, wait_for, Agent, Kv};
use base64::Engine as _;
use gitlab_haproxy_agent::http::{parse_request_head, render_response, Parse, Response};

const SYNC: Duration = Duration::from_secs(15);
const LAST_CONTACT: &str = "gitlab_haproxy_agent_consul_last_contact_seconds";
const KNOWN_LEADER: &str = "gitlab_haproxy_agent_consul_known_leader";
const REASKED: &str = "gitlab_haproxy_agent_consul_stale_reasked_total";

/// Keys `be/s0..n` under the prefix: 60 of them make a listing of about
/// 6 KiB, past consul's 1,400-byte gzip threshold.
const KEYS: usize = 60;

/// Synced on [`KEYS`] keys (`be/sN` = drain).
impl Rig {
    fn many_keys(test: &str, extra: &[&str]) -> Rig {
        let kv = Kv::any();
        let prefix = unique_prefix(test);
        let keys = (0..KEYS).map(|i| (format!("{prefix}/be/s{i}"), "drain"));
        assert_eq!(support::put_many(kv.addr, keys), KEYS);
        let rig = Rig::start(kv, prefix, Mode::Pass, extra);
        rig.agent.wait_reply("be/s1", "drain 100%", SYNC);
        rig
    }

    /// Sets `mode` until `reason` is counted; the last state is still
    /// answered and the agent ready; back to `Pass`, a write is applied.
    fn fault_keeps_listing(&self, mode: Mode, reason: &str) {
        let before = self.metric(&errors(reason));
        let swaps = self.metric(SWAPS);
        self.proxy.set_mode(mode);
        self.wait_metric(&errors(reason), before + 1.0, Duration::from_secs(10));
        assert_eq!(self.agent.check("be/s1\n").as_deref(), Some("drain 100%"));
        assert_eq!(self.agent.monitoring_get("/-/readiness").0, 200);
        assert_eq!(self.metric(SWAPS), swaps, "nothing swapped in");
        self.put("be/s1", "maint");
        self.proxy.set_mode(Mode::Pass);
        self.agent
            .wait_reply("be/s1", "maint 100%", Duration::from_secs(20));
    }

    /// Whether every request the proxy saw carried `Accept-Encoding: gzip`
    /// (`Some(true)`), none did (`Some(false)`), or some did.
    fn asked_gzip(&self) -> Option<bool> {
        let heads = self.proxy.request_heads();
        let asked = |h: &String| {
            h.lines()
                .any(|l| l.eq_ignore_ascii_case("accept-encoding: gzip"))
        };
        match heads.iter().filter(|h| asked(h)).count() {
            0 => Some(false),
            n if n == heads.len() => Some(true),
            _ => None,
        }
    }
}

// ---- gzip ----

#[test]
fn gzip_is_asked_for_inflated_and_moves_a_fraction_of_the_bytes() {
    let on = Rig::many_keys("gzip_on", &["-consul-gzip", "true"]);
    let off = Rig::many_keys("gzip_off", &["-consul-gzip", "false"]);
    assert_eq!(on.asked_gzip(), Some(true));
    assert_eq!(off.asked_gzip(), Some(false));
    // One write each, of the same size: the bytes it cost.
    let (on0, off0) = (on.metric(BYTES), off.metric(BYTES));
    on.put("be/s7", "maint");
    off.put("be/s7", "maint");
    on.agent
        .wait_reply("be/s7", "maint 100%", Duration::from_secs(5));
    off.agent
        .wait_reply("be/s7", "maint 100%", Duration::from_secs(5));
    let (on1, off1) = (on.metric(BYTES) - on0, off.metric(BYTES) - off0);
    assert!(off1 > 5_000.0, "{off1}");
    assert!(on1 * 4.0 < off1, "gzip {on1} bytes vs {off1}");
    for rig in [&on, &off] {
        assert_eq!(rig.metric("gitlab_haproxy_agent_state_keys"), KEYS as f64);
        // The KV (dev or real, on -dev) is its own leader.
        assert_eq!(rig.metric(KNOWN_LEADER), 1.0);
        assert_eq!(rig.metric(LAST_CONTACT), 0.0);
        assert_eq!(rig.metric(REASKED), 0.0);
    }
}

#[test]
fn gzip_auto_does_not_ask_a_consul_on_loopback() {
    let rig = Rig::many_keys("gzip_auto", &[]);
    assert_eq!(rig.asked_gzip(), Some(false));
}

/// The large-state rows of `consul_faults.rs`, gzipped: every framing,
/// then every ending, and each change is applied with no error counted.
#[test]
fn gzip_over_every_framing_then_every_ending() {
    let rig = Rig::many_keys("gzip_framings", &["-consul-gzip", "true"]);
    let mut step = 0;
    for wire in Wire::ALL {
        let afters: &[After] = if wire == Wire::CloseDelimited {
            &[After::Fin]
        } else {
            &[After::Keep, After::Fin, After::Reset, After::StrayByte]
        };
        for &after in afters {
            step += 1;
            let errors_before = rig.metric(&errors("bad_body")) + rig.metric(&errors("reset"));
            rig.proxy.set_mode(Mode::Reframe(wire, after));
            let value = ["maint", "50%", "drain"][step % 3];
            let reply = ["maint 100%", "ready 50%", "drain 100%"][step % 3];
            let identity = format!("be/s{}", step * 1000);
            rig.put(&identity, value);
            rig.agent
                .wait_reply(&identity, reply, Duration::from_secs(15));
            let errors_after = rig.metric(&errors("bad_body")) + rig.metric(&errors("reset"));
            assert_eq!(errors_after, errors_before, "{wire:?} then {after:?}");
        }
    }
    assert_eq!(rig.asked_gzip(), Some(true));
}

#[test]
fn a_gzip_bomb_is_too_large_keeps_the_last_state_and_memory_bounded() {
    let rig = Rig::many_keys(
        "gzip_bomb",
        &["-consul-gzip", "true", "-consul-max-body-bytes", "1048576"],
    );
    // 256 MiB inflated, about 256 KiB on the wire.
    rig.fault_keeps_listing(Mode::GzipBomb(256 << 20), "too_large");
    let pid = rig.agent.proc.pid();
    let peak = status_kib(pid, "VmHWM").expect("VmHWM");
    assert!(peak < 64 << 10, "peak RSS {peak} KiB");
}

#[test]
fn corrupt_gzip_is_bad_body_and_keeps_the_last_state() {
    let rig = Rig::many_keys("gzip_corrupt", &["-consul-gzip", "true"]);
    rig.fault_keeps_listing(Mode::CorruptGzip, "bad_body");
}

#[test]
fn an_unknown_content_encoding_is_bad_body_and_keeps_the_last_state() {
    let rig = Rig::many_keys("gzip_unknown", &["-consul-gzip", "true"]);
    rig.fault_keeps_listing(Mode::Encoding("br"), "bad_body");
    let line = rig
        .agent
        .proc
        .wait_log("unsupported Content-Encoding", Duration::from_secs(1));
    assert!(line.contains("\"reason\":\"bad_body\""), "{line}");
}

#[test]
fn dev_mode_with_gzip_watches_its_own_kv_through_the_same_path() {
    let agent = Agent::start(
        &[
            "-dev",
            "-dev-kv-addr",
            "127.0.0.1:0",
            "-consul-gzip",
            "true",
        ],
        &[],
    );
    let kv = agent.dev_kv.expect("dev KV bound");
    let prefix = "gitlab-haproxy-agent/state";
    let keys = (0..KEYS).map(|i| (format!("{prefix}/be/s{i}"), "maint"));
    assert_eq!(support::put_many(kv, keys), KEYS);
    agent.wait_reply("be/s59", "maint 100%", SYNC);
    let (status, headers, body) =
        support::http_full(kv, "GET", &format!("/v1/kv/{prefix}/?recurse&stale"), b"")
            .expect("dev KV answers");
    assert_eq!(status, 200);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("x-consul-lastcontact").as_deref(), Some("0"));
    assert_eq!(header("x-consul-knownleader").as_deref(), Some("true"));
    // The agent read the listing gzipped: fewer bytes than one plain copy.
    assert!(
        agent.metric(BYTES) < body.len() as f64,
        "{} vs {}",
        agent.metric(BYTES),
        body.len()
    );
    assert_eq!(agent.metric(KNOWN_LEADER), 1.0);
}

// ---- stale reads ----

#[test]
fn stale_reads_against_the_kv_carry_stale_and_apply_its_answers() {
    let rig = Rig::many_keys("stale_kv", &["-consul-max-stale", "2s"]);
    rig.put("be/s3", "50%");
    rig.agent
        .wait_reply("be/s3", "ready 50%", Duration::from_secs(5));
    let heads = rig.proxy.request_heads();
    assert!(
        heads
            .iter()
            .all(|h| h.lines().next().unwrap().contains("&stale=")),
        "{heads:#?}"
    );
    assert_eq!(rig.metric(REASKED), 0.0, "the KV's LastContact is 0");
}

/// Whether a request target asks for a stale read.
fn is_stale(target: &str) -> bool {
    let query = target.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .any(|p| p == "stale" || p.starts_with("stale="))
}

/// What the fake consul serves, per consistency mode.
#[derive(Clone)]
struct Answer {
    index: u64,
    value: &'static str,
    /// `X-Consul-LastContact` (`None`: not sent).
    last_contact: Option<&'static str>,
    known_leader: &'static str,
}

/// A consul whose servers disagree: `stale` requests are answered by a
/// follower (its own index, value and `X-Consul-LastContact`, changed with
/// [`FakeConsul::set_follower`]), consistent ones by the leader. A blocking
/// request at the index it would answer is held 300 ms (then answered: a
/// wait that timed out).
struct FakeConsul {
    addr: SocketAddr,
    follower: Arc<Mutex<Answer>>,
    /// Request lines received, in order.
    targets: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl FakeConsul {
    fn start(prefix: &str, follower: Answer, leader: Answer) -> FakeConsul {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let targets = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let follower = Arc::new(Mutex::new(follower));
        let (t, st, key, fol) = (
            Arc::clone(&targets),
            Arc::clone(&stop),
            format!("{prefix}/be/s1"),
            Arc::clone(&follower),
        );
        let acceptor = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (t, st, key) = (Arc::clone(&t), Arc::clone(&st), key.clone());
                        let (f, l) = (Arc::clone(&fol), leader.clone());
                        std::thread::spawn(move || serve_fake(conn, &key, &f, &l, &t, &st));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeConsul {
            addr,
            follower,
            targets,
            stop,
            acceptor: Some(acceptor),
        }
    }

    fn targets(&self) -> Vec<String> {
        self.targets.lock().unwrap().clone()
    }

    fn set_follower(&self, follower: Answer) {
        *self.follower.lock().unwrap() = follower;
    }
}

impl Drop for FakeConsul {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// One connection of the fake consul: request after request.
fn serve_fake(
    mut conn: TcpStream,
    key: &str,
    follower: &Mutex<Answer>,
    leader: &Answer,
    targets: &Mutex<Vec<String>>,
    stop: &AtomicBool,
) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let head = match parse_request_head(&buf, 1 << 16) {
            Parse::Done(head, used) => {
                buf.drain(..used);
                head
            }
            Parse::Invalid(_) => return,
            Parse::Partial => match conn.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => return,
            },
        };
        let stale = is_stale(&format!("?{}", head.query));
        targets
            .lock()
            .unwrap()
            .push(format!("{}?{}", head.path, head.query));
        let a = if stale {
            follower.lock().unwrap().clone()
        } else {
            leader.clone()
        };
        let asked: u64 = head
            .query
            .split('&')
            .find_map(|p| p.strip_prefix("index="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if asked >= a.index {
            std::thread::sleep(Duration::from_millis(300));
        }
        let value = base64::engine::general_purpose::STANDARD.encode(a.value);
        let body = format!(
            r#"[{{"LockIndex":0,"Key":"{key}","Flags":0,"Value":"{value}","CreateIndex":1,"ModifyIndex":{}}}]"#,
            a.index
        );
        let mut headers = vec![
            ("Content-Type", "application/json".to_owned()),
            ("X-Consul-Index", a.index.to_string()),
            ("X-Consul-Knownleader", a.known_leader.to_owned()),
        ];
        if let Some(lc) = a.last_contact {
            headers.push(("X-Consul-Lastcontact", lc.to_owned()));
        }
        let mut out = Vec::new();
        let resp = Response {
            status: 200,
            headers,
            body: body.into_bytes(),
        };
        render_response(&mut out, &resp, true, Some(2048), false);
        if conn.write_all(&out).is_err() {
            return;
        }
    }
}

/// The follower is 5 s behind and a write ahead of what the leader says
/// (its index is higher, its value `maint`); the leader says `drain`.
fn split_brain(prefix: &str, follower_last_contact: Option<&'static str>) -> FakeConsul {
    FakeConsul::start(
        prefix,
        Answer {
            index: 20,
            value: "maint",
            last_contact: follower_last_contact,
            known_leader: "false",
        },
        Answer {
            index: 10,
            value: "drain",
            last_contact: Some("0"),
            known_leader: "true",
        },
    )
}

#[test]
fn a_stale_answer_past_the_bound_is_never_applied_and_asked_of_the_leader() {
    let prefix = unique_prefix("stale_past");
    let consul = split_brain(&prefix, Some("5000"));
    let agent = Agent::with_consul(
        consul.addr,
        &prefix,
        &["-consul-wait", "1s", "-consul-max-stale", "2s"],
    );
    agent.wait_reply("be/s1", "drain 100%", SYNC);
    // Never the follower's value, whatever its higher index.
    reasked_and_still(&agent, "drain 100%");
    assert_eq!(agent.metric("gitlab_haproxy_agent_consul_index"), 10.0);
    assert_eq!(agent.metric(&errors("bad_body")), 0.0);
    let targets = consul.targets();
    let first_stale = targets.iter().position(|t| is_stale(t)).unwrap();
    each_stale_followed_by_the_leader(&targets[first_stale..], 10);
    // The gauges say what the last response said (the leader's).
    assert_eq!(agent.metric(LAST_CONTACT), 0.0);
    assert_eq!(agent.metric(KNOWN_LEADER), 1.0);
}

/// Regression (issue 27): a follower within the bound but behind the state
/// applied (its index lower) was taken as consul's "index went backwards":
/// the watch reset, re-read the follower's older state and applied it (a
/// drain undone, then redone when the follower caught up).
#[test]
fn a_stale_answer_behind_the_state_applied_is_never_applied_and_asked_of_the_leader() {
    let prefix = unique_prefix("stale_behind");
    let caught_up = Answer {
        index: 20,
        value: "maint",
        last_contact: Some("10"),
        known_leader: "true",
    };
    let leader = Answer {
        last_contact: Some("0"),
        ..caught_up.clone()
    };
    let consul = FakeConsul::start(&prefix, caught_up, leader);
    let agent = Agent::with_consul(
        consul.addr,
        &prefix,
        &["-consul-wait", "1s", "-consul-max-stale", "2s"],
    );
    agent.wait_reply("be/s1", "maint 100%", SYNC);
    let swaps = agent.metric(SWAPS);
    // Another follower, well within the bound, still at index 15 (drain).
    consul.set_follower(Answer {
        index: 15,
        value: "drain",
        last_contact: Some("10"),
        known_leader: "true",
    });
    let asked = consul.targets().len();
    reasked_and_still(&agent, "maint 100%");
    assert_eq!(agent.metric("gitlab_haproxy_agent_consul_index"), 20.0);
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_consul_index_resets_total"),
        0.0
    );
    assert_eq!(agent.metric(SWAPS), swaps, "nothing applied");
    // Never a reset (a read at index 0).
    let targets = consul.targets().split_off(asked);
    assert!(
        targets.iter().all(|t| t.contains("index=20")),
        "{targets:#?}"
    );
    each_stale_followed_by_the_leader(&targets, 20);
}

/// Waits for three stale answers discarded and re-asked, then checks for
/// a second that every check is still answered `reply`.
fn reasked_and_still(agent: &Agent, reply: &str) {
    wait_for(
        Duration::from_secs(10),
        "three stale answers re-asked",
        || (agent.metric(REASKED) >= 3.0).then_some(()),
    );
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        assert_eq!(agent.check("be/s1\n").as_deref(), Some(reply));
    }
}

/// Each stale request among `targets` is followed at once by one to the
/// leader, at `index` (the state applied), or by a first read.
fn each_stale_followed_by_the_leader(targets: &[String], index: u64) {
    let at = format!("index={index}");
    for pair in targets.windows(2) {
        if is_stale(&pair[0]) {
            assert!(!is_stale(&pair[1]), "{targets:#?}");
            assert!(
                pair[1].contains(&at) || !pair[1].contains("index="),
                "{targets:#?}"
            );
        }
    }
}

/// A follower that loses the leader during a hold answers only when the
/// wait ends: a stale blocking request asks for 30 s at most, whatever
/// `-consul-wait`; the leader is asked with the whole wait.
#[test]
fn a_stale_blocking_request_carries_a_wait_of_thirty_seconds_at_most() {
    let prefix = unique_prefix("stale_wait");
    let consul = split_brain(&prefix, Some("5000"));
    let agent = Agent::with_consul(
        consul.addr,
        &prefix,
        &["-consul-wait", "5m", "-consul-max-stale", "2s"],
    );
    agent.wait_reply("be/s1", "drain 100%", SYNC);
    wait_for(Duration::from_secs(10), "a stale blocking request", || {
        let targets = consul.targets();
        targets
            .iter()
            .any(|t| is_stale(t) && t.contains("index="))
            .then_some(targets)
    });
    let targets = consul.targets();
    for t in targets.iter().filter(|t| t.contains("index=")) {
        let wait = if is_stale(t) {
            "wait=30000ms"
        } else {
            "wait=300000ms"
        };
        assert!(t.contains(wait), "{t}: {targets:#?}");
    }
}

#[test]
fn a_stale_answer_that_does_not_say_how_stale_is_too_stale() {
    let prefix = unique_prefix("stale_unsaid");
    let consul = split_brain(&prefix, None);
    let agent = Agent::with_consul(
        consul.addr,
        &prefix,
        &["-consul-wait", "1s", "-consul-max-stale", "1h"],
    );
    agent.wait_reply("be/s1", "drain 100%", SYNC);
    wait_for(Duration::from_secs(10), "a stale answer re-asked", || {
        (agent.metric(REASKED) >= 1.0).then_some(())
    });
    assert_eq!(agent.check("be/s1\n").as_deref(), Some("drain 100%"));
}

#[test]
fn a_stale_answer_within_the_bound_is_applied() {
    let prefix = unique_prefix("stale_within");
    let consul = split_brain(&prefix, Some("5000"));
    let agent = Agent::with_consul(
        consul.addr,
        &prefix,
        &["-consul-wait", "1s", "-consul-max-stale", "10s"],
    );
    agent.wait_reply("be/s1", "maint 100%", SYNC);
    assert_eq!(agent.metric(REASKED), 0.0);
    assert_eq!(agent.metric(LAST_CONTACT), 5.0);
    assert_eq!(agent.metric(KNOWN_LEADER), 0.0);
    assert!(consul.targets().iter().all(|t| is_stale(t)));
}

#[test]
fn without_max_stale_only_the_leader_is_asked() {
    let prefix = unique_prefix("stale_off");
    let consul = split_brain(&prefix, Some("5000"));
    let agent = Agent::with_consul(consul.addr, &prefix, &["-consul-wait", "1s"]);
    agent.wait_reply("be/s1", "drain 100%", SYNC);
    std::thread::sleep(Duration::from_millis(700));
    let targets = consul.targets();
    assert!(targets.len() >= 2, "{targets:?}");
    assert!(targets.iter().all(|t| !is_stale(t)), "{targets:?}");
    assert_eq!(agent.check("be/s1\n").as_deref(), Some("drain 100%"));
}
