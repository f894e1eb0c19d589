//! `wait-drained` against real haproxy (issue 24): a `listen` proxy in
//! front of a test server that holds every connection until the client
//! closes it, agent-checked by the agent under test (dev KV), its stats
//! socket both a unix path and `ipv4@127.0.0.1:PORT`, and haproxy's own
//! Prometheus exporter. A client holding one connection through haproxy is
//! one session on the server; `wait-drained` must wait while it is open
//! and exit 0 within two intervals of its closing.
//!
//! Prometheus is the real one (Debian's, scraping both haproxies' exporters
//! every second), and a small loopback stand-in that answers the
//! instant-query API from a fresh scrape of each exporter (the real metric
//! names and labels, the `instance` label set to the scraped address), or
//! with no series at all, for the cases a real one makes slow to set up.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::haproxy::Haproxy;
use crate::support::{free_port, http, unique_prefix, wait_for, Agent, Kv};

const SEC: Duration = Duration::from_secs(1);
const INTERVAL: Duration = Duration::from_millis(500);
/// Two intervals and the time to ask.
const TWO_INTERVALS: Duration = Duration::from_millis(2 * 500 + 300);

/// A server that keeps each connection open until the peer closes it.
struct Holding {
    addr: SocketAddr,
}

impl Holding {
    fn start() -> Holding {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut conn in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                });
            }
        });
        Holding { addr }
    }
}

/// How a haproxy is started: [`Haproxy::start_with`] (one process) or
/// [`Haproxy::start_master_worker`].
type StartHaproxy = fn(&str, usize, Box<dyn FnOnce(SocketAddr) -> String>) -> Haproxy;

/// One haproxy: `listen app` on `front` to the holding server as `app/s1`,
/// agent-checked against `agent_port`; a second stats socket on
/// `ipv4@127.0.0.1:tcp_stats`; the exporter on `promex`.
struct Lb {
    hap: Haproxy,
    front: SocketAddr,
    tcp_stats: u16,
    promex: SocketAddr,
}

impl Lb {
    fn start(test: &str, agent_port: u16, real: SocketAddr) -> Lb {
        Lb::start_in(test, agent_port, real, Haproxy::start_with)
    }

    /// [`Lb::start`] with `start` (one-process or master-worker).
    fn start_in(test: &str, agent_port: u16, real: SocketAddr, start: StartHaproxy) -> Lb {
        let (front, tcp_stats, promex) = (free_port(), free_port(), free_port());
        let hap = start(
            test,
            1,
            Box::new(move |_| {
                format!(
                "\nglobal\n    stats socket ipv4@127.0.0.1:{tcp_stats} level admin\n\
                 \nfrontend prom\n    mode http\n    bind 127.0.0.1:{promex}\n    http-request use-service prometheus-exporter\n\
                 \nlisten app\n    bind 127.0.0.1:{front}\n    timeout client 60s\n    timeout server 60s\n\
                 \x20   default-server inter 1s\n\
                 \x20   server s1 {real} check inter 1s weight 100 agent-check agent-addr 127.0.0.1 agent-port {agent_port} agent-inter 100ms agent-send \"app/s1\\n\"\n"
            )
            }),
        );
        Lb {
            hap,
            front: format!("127.0.0.1:{front}").parse().unwrap(),
            tcp_stats,
            promex: format!("127.0.0.1:{promex}").parse().unwrap(),
        }
    }

    fn unix(&self) -> String {
        self.hap.socket.display().to_string()
    }

    fn tcp(&self) -> String {
        format!("ipv4@127.0.0.1:{}", self.tcp_stats)
    }

    /// A client connection through haproxy, once haproxy counts it on s1.
    fn hold(&self) -> TcpStream {
        let c = TcpStream::connect(self.front).unwrap();
        c.set_nodelay(true).unwrap();
        self.hap
            .wait_server("app/s1", "one session", 5 * SEC, |r| r.get("scur") == "1");
        c
    }

    fn wait_status(&self, prefix: &str) {
        self.hap.wait_server("app/s1", prefix, 10 * SEC, |r| {
            r.status().starts_with(prefix)
        });
    }
}

/// The agent on the dev KV, and the KV.
fn agent(test: &str) -> (Agent, Kv, String) {
    let kv = Kv::dev();
    let prefix = unique_prefix(test);
    let a = Agent::with_consul(kv.addr, &prefix, &[]);
    wait_for(10 * SEC, "agent readiness", || {
        (a.monitoring_get("/-/readiness").0 == 200).then_some(())
    });
    (a, kv, prefix)
}

/// `wait-drained` running, killed by PID if the test ends first.
struct WaitDrained {
    child: Child,
}

impl WaitDrained {
    /// `args`: the words after `wait-drained`, split at spaces.
    fn start(args: &str) -> WaitDrained {
        let child = Command::new(support::BIN)
            .arg("wait-drained")
            .args(args.split_whitespace())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        WaitDrained { child }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// (exit code, stdout, stderr, when it exited).
    fn finish(mut self, limit: Duration) -> (i32, String, String, Instant) {
        let code = wait_for(limit, "wait-drained to exit", || {
            self.child.try_wait().unwrap()
        });
        let at = Instant::now();
        let mut out = String::new();
        let mut err = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (code.code().unwrap_or(-1), out, err, at)
    }
}

impl Drop for WaitDrained {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn interval() -> String {
    format!("{}ms", INTERVAL.as_millis())
}

/// `wait-drained ARGS` started while `client` holds the server's one
/// session: still waiting after several polls, then exit 0 within
/// `within` of the client closing. Prints the time to exit (for `what`)
/// and returns stdout.
fn drains_when_closed(args: &str, client: TcpStream, what: &str, within: Duration) -> String {
    let mut w = WaitDrained::start(args);
    std::thread::sleep(4 * INTERVAL + INTERVAL / 2);
    assert!(w.running(), "exited while a session was open");
    let closed = Instant::now();
    drop(client);
    let (code, out, err, exited) = w.finish(10 * SEC);
    let took = exited - closed;
    assert_eq!(code, 0, "{out}{err}");
    // `within` is what the polling allows; SLACK is the busy machine's
    // (a poll, haproxy's answer and the exit each wait for a core). A
    // wait that misses the close runs to its 60 s timeout.
    const SLACK: Duration = Duration::from_millis(1500);
    assert!(
        took <= within + SLACK,
        "exit {took:?} after the close (polling allows {within:?})"
    );
    eprintln!("{what}: exit {took:?} after the last session closed (interval {INTERVAL:?})");
    out
}

#[test]
fn a_held_session_keeps_it_waiting_and_its_close_ends_the_wait() {
    let (a, kv, prefix) = agent("held");
    let real = Holding::start();
    let lb = Lb::start("held", a.listen().port(), real.addr);
    let client = lb.hold();
    kv.put(&format!("{prefix}/app/s1"), "drain");
    lb.wait_status("DRAIN");

    // At the timeout with the session open: exit 1, naming it where.
    let (unix, tcp, iv) = (lb.unix(), lb.tcp(), interval());
    let short = WaitDrained::start(&format!(
        "app/s1 -haproxy-socket {unix} -timeout 2s -interval {iv}"
    ));
    let (code, out, err, _) = short.finish(10 * SEC);
    assert_eq!(code, 1, "{out}{err}");
    let summary = out
        .split("not drained after")
        .nth(1)
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        summary.contains(&format!(
            "app/s1 at {unix}: 1 session, 0 queued, DRAIN (agent): holding"
        )),
        "{out}"
    );

    // Both sockets, the session open: still waiting after several polls.
    let args =
        format!("app/s1 -haproxy-socket {unix} -haproxy-socket {tcp} -timeout 60s -interval {iv}");
    let out = drains_when_closed(&args, client, "sockets", TWO_INTERVALS);
    // One line per change (not a terminal): holding at both, then drained.
    let lines: Vec<&str> = out.lines().collect();
    for source in [&unix, &tcp] {
        let holding = format!("app/s1 at {source}: 1 session, 0 queued, DRAIN (agent): holding");
        let drained = format!("app/s1 at {source}: 0 sessions, 0 queued, DRAIN (agent): drained");
        let at = |want: &str| lines.iter().position(|l| l.contains(want));
        let (h, d) = (at(&holding), at(&drained));
        assert!(h.is_some() && d.is_some() && h < d, "{out}");
        assert_eq!(
            lines.iter().filter(|l| l.contains(&holding)).count(),
            1,
            "a line per change only: {out}"
        );
    }
    assert!(
        out.contains("\ndrained after ")
            && out.contains("app/s1 (0 sessions, 0 queued at every source)"),
        "{out}"
    );
    // The one warning: this haproxy started seconds ago, so a process
    // older than it would not be seen through its stats socket.
    for line in out.lines().filter(|l| l.to_lowercase().contains("warning")) {
        assert!(
            line.contains("started less than 1h0m0s ago")
                && line.contains("give -haproxy-master-socket")
                && !line.contains("is not DRAIN or MAINT"),
            "{out}"
        );
    }
}

#[test]
fn two_haproxies_are_drained_only_when_both_are_at_zero() {
    let (a, kv, prefix) = agent("two");
    let real = Holding::start();
    let lb1 = Lb::start("two-a", a.listen().port(), real.addr);
    let lb2 = Lb::start("two-b", a.listen().port(), real.addr);
    let client = lb2.hold();
    kv.put(&format!("{prefix}/app/s1"), "drain");
    lb1.wait_status("DRAIN");
    lb2.wait_status("DRAIN");
    let (s1, s2, iv) = (lb1.unix(), lb2.tcp(), interval());
    let sources = format!("-haproxy-socket {s1} -haproxy-socket {s2}");
    let json = |out: &str| -> serde_json::Value {
        serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };

    // The first drained, the second still holding: 1, naming the second only.
    let w = WaitDrained::start(&format!(
        "app/s1 {sources} -timeout 1s -interval {iv} -json"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    let doc = json(&out);
    let rows = doc["servers"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(
        (rows[0]["source"].as_str(), rows[1]["source"].as_str()),
        (Some(s1.as_str()), Some(s2.as_str()))
    );
    assert_eq!(
        (rows[0]["drained"].clone(), rows[1]["drained"].clone()),
        (true.into(), false.into()),
        "{out}"
    );
    assert_eq!(
        (rows[0]["sessions"].as_u64(), rows[1]["sessions"].as_u64()),
        (Some(0), Some(1)),
        "{out}"
    );

    let mut w = WaitDrained::start(&format!(
        "app/s1 {sources} -timeout 60s -interval {iv} -json"
    ));
    std::thread::sleep(4 * INTERVAL + INTERVAL / 2);
    assert!(
        w.running(),
        "exited while the second haproxy held a session"
    );
    drop(client);
    let (code, out, err, _) = w.finish(10 * SEC);
    assert_eq!(code, 0, "{out}{err}");
    let doc = json(&out);
    assert_eq!(doc["drained"], true);
    let rows = doc["servers"].as_array().unwrap();
    assert!(
        rows.iter()
            .all(|r| r["sessions"] == 0 && r["status"] == "DRAIN (agent)"),
        "{out}"
    );
}

#[test]
fn a_server_not_draining_gets_a_warning_and_require_drain_fails_it() {
    let (a, _kv, _prefix) = agent("up");
    let real = Holding::start();
    let lb = Lb::start("up", a.listen().port(), real.addr);
    lb.wait_status("UP");
    let (unix, iv) = (lb.unix(), interval());
    let w = WaitDrained::start(&format!(
        "app/s1 -haproxy-socket {unix} -timeout 5s -interval {iv}"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("warning: app/s1 at {unix}: status UP is not DRAIN or MAINT: it may reach 0 sessions by chance while still taking new ones")),
        "{out}"
    );
    let w = WaitDrained::start(&format!(
        "app/s1 -haproxy-socket {unix} -timeout 1s -interval {iv} -require-drain"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("app/s1 at {unix}: 0 sessions, 0 queued, UP: NOT DRAINED (-require-drain): status UP is not DRAIN or MAINT")),
        "{out}"
    );
}

#[test]
fn a_server_no_haproxy_lists_or_a_dead_socket_is_not_drained() {
    let (a, _kv, _prefix) = agent("absent");
    let real = Holding::start();
    let lb = Lb::start("absent", a.listen().port(), real.addr);
    let (unix, iv) = (lb.unix(), interval());
    let dead = format!("ipv4@127.0.0.1:{}", free_port());
    let w = WaitDrained::start(&format!(
        "app/s1 app/nope -haproxy-socket {unix} -haproxy-socket {dead} -timeout 1s -interval {iv}"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("app/nope at {unix}: no counts: NOT DRAINED: not reported: this haproxy lists no such server")), "{out}");
    assert!(
        out.contains(&format!(
            "app/s1 at {dead}: no counts: NOT DRAINED: cannot connect: Connection refused"
        )),
        "{out}"
    );
}

#[test]
fn identities_map_through_the_haproxy_config_agent_send() {
    let (a, kv, prefix) = agent("config");
    let real = Holding::start();
    let port = a.listen().port();
    let hap = Haproxy::start_with("config", 2, |_| {
        format!(
            "\nbackend app\n    server web-1 {} weight 100 agent-check agent-addr 127.0.0.1 agent-port {port} agent-inter 100ms agent-send \"host-1\\n\"\n\
             \nbackend api\n    server w1 {} weight 100 agent-check agent-addr 127.0.0.1 agent-port {port} agent-inter 100ms agent-send \"host-1\\n\"\n",
            real.addr, real.addr
        )
    });
    kv.put(&format!("{prefix}/host-1"), "maint");
    for id in ["app/web-1", "api/w1"] {
        hap.wait_server(id, "MAINT", 10 * SEC, |r| r.status() == "MAINT");
    }
    let (cfg, unix) = (
        hap.config_path().display().to_string(),
        hap.socket.display().to_string(),
    );
    let w = WaitDrained::start(&format!(
        "host-1 -haproxy-config {cfg} -haproxy-socket {unix} -timeout 5s -require-drain"
    ));
    let (code, out, err, _) = w.finish(10 * SEC);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("app/web-1 (host-1) at"), "{out}");
    assert!(out.contains("api/w1 (host-1) at"), "{out}");
    let w = WaitDrained::start(&format!(
        "host-2 -haproxy-config {cfg} -haproxy-socket {unix} -timeout 5s"
    ));
    let (code, _, err, _) = w.finish(10 * SEC);
    assert_eq!(code, 2);
    assert_eq!(err, format!("gitlab-haproxy-agent wait-drained: no agent-checked server line of {cfg} sends \"host-2\" (-h for help)\n"));
}

/// A loopback Prometheus stand-in: every instant query is answered from a
/// fresh scrape of `targets` (haproxy exporters): the server metrics, the
/// process start time, `last_over_time` of the sessions (as now: the
/// stand-in keeps no history) or `changes` of the start time (0); with no
/// series while `empty` is set.
struct Prometheus {
    addr: SocketAddr,
    empty: Arc<AtomicBool>,
}

impl Prometheus {
    fn start(targets: Vec<SocketAddr>) -> Prometheus {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let empty = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&empty);
        std::thread::spawn(move || {
            for mut conn in l.incoming().flatten() {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && matches!(conn.read(&mut byte), Ok(1)) {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                assert!(head.starts_with("GET /api/v1/query?query="), "{head}");
                let series = if flag.load(Ordering::Relaxed) {
                    Vec::new()
                } else if head.contains("changes%28") {
                    // No history here: no start time changed within the
                    // lookback (`changes` drops the name as well).
                    let mut series = scrape(&targets, &[START_TIME]);
                    for s in &mut series {
                        s["metric"].as_object_mut().unwrap().remove("__name__");
                        s["value"][1] = "0".into();
                    }
                    series
                } else if head.contains(START_TIME) {
                    scrape(&targets, &[START_TIME])
                } else if head.contains("last_over_time") {
                    // A function's result has no metric name (Prometheus's
                    // `promql/functions.go`, `funcLastOverTime` keeps the
                    // labels but the engine drops `__name__`).
                    let mut series = scrape(&targets, &[SESSIONS]);
                    for s in &mut series {
                        s["metric"].as_object_mut().unwrap().remove("__name__");
                    }
                    series
                } else {
                    scrape(
                        &targets,
                        &[
                            SESSIONS,
                            "haproxy_server_current_queue",
                            "haproxy_server_status",
                        ],
                    )
                };
                let body = serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": series}}).to_string();
                let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            }
        });
        Prometheus { addr, empty }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

const SESSIONS: &str = "haproxy_server_current_sessions";
const START_TIME: &str = "haproxy_process_start_time_seconds";

/// The series of `names` from each exporter, as instant-query series
/// (`instance` set to the exporter's address, `job` haproxy).
fn scrape(targets: &[SocketAddr], names: &[&str]) -> Vec<serde_json::Value> {
    let mut series = Vec::new();
    for t in targets {
        let (_, body) = http(*t, "GET", "/metrics", b"").expect("the exporter answers");
        for line in String::from_utf8_lossy(&body).lines() {
            let (name, rest) = match line.split_once('{') {
                Some((name, rest)) => (name, rest.to_owned()),
                None => match line.split_once(' ') {
                    Some((name, value)) => (name, format!("}} {value}")),
                    None => continue,
                },
            };
            if !names.contains(&name) {
                continue;
            }
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            let mut metric = serde_json::Map::new();
            metric.insert("__name__".into(), name.into());
            metric.insert("instance".into(), t.to_string().into());
            metric.insert("job".into(), "haproxy".into());
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap();
                metric.insert(k.into(), v.trim_matches('"').into());
            }
            series.push(serde_json::json!({"metric": metric, "value": [1.7e9, value.trim()]}));
        }
    }
    series
}

/// `wait-drained` asking a Prometheus with no haproxy series for the
/// server: exit 1, no data (never 0 sessions).
fn assert_no_data(url: &str, iv: &str) {
    let w = WaitDrained::start(&format!(
        "app/s1 -prometheus {url} -timeout 1s -interval {iv}"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("app/s1 at {url}: no counts: NOT DRAINED: no data: Prometheus has no haproxy_server_current_sessions series for it")), "{out}");
}

#[test]
fn prometheus_sees_the_session_close_and_no_data_is_not_zero() {
    let (a, kv, prefix) = agent("prom");
    let real = Holding::start();
    let lb1 = Lb::start("prom-a", a.listen().port(), real.addr);
    let lb2 = Lb::start("prom-b", a.listen().port(), real.addr);
    let prom = Prometheus::start(vec![lb1.promex, lb2.promex]);
    let client = lb1.hold();
    kv.put(&format!("{prefix}/app/s1"), "drain");
    lb1.wait_status("DRAIN");
    lb2.wait_status("DRAIN");
    let (url, iv) = (prom.url(), interval());

    let w = WaitDrained::start(&format!(
        "app/s1 -prometheus {url} -timeout 1s -interval {iv} -expect-instances 2"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    let holder = format!("holding: {}: 1 session, 0 queued", lb1.promex);
    assert!(
        out.contains(&format!(
            "app/s1 at {url}: 1 session, 0 queued, DRAIN: {holder}"
        )),
        "{out}"
    );

    let args = format!("app/s1 -prometheus {url} -timeout 60s -interval {iv} -expect-instances 2");
    drains_when_closed(&args, client, "prometheus stand-in", TWO_INTERVALS);

    // Three instances expected, two report: not drained, and said so.
    let w = WaitDrained::start(&format!(
        "app/s1 -prometheus {url} -timeout 1s -interval {iv} -expect-instances 3"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("NOT DRAINED: 2 instances report it, fewer than -expect-instances 3"),
        "{out}"
    );

    // No haproxy target: no data, never 0.
    prom.empty.store(true, Ordering::Relaxed);
    assert_no_data(&url, &iv);
}

#[test]
fn a_real_prometheus_scraping_haproxy_sees_the_close_and_no_target_is_no_data() {
    let (a, kv, prefix) = agent("real-prom");
    let real = Holding::start();
    let lb1 = Lb::start("real-prom-a", a.listen().port(), real.addr);
    let lb2 = Lb::start("real-prom-b", a.listen().port(), real.addr);
    // Its scrape path is the agent's; haproxy's exporter answers any path.
    let prom = support::prometheus::Prometheus::start(&[lb1.promex, lb2.promex], &[]);
    let empty = support::prometheus::Prometheus::start(&[], &[]);
    let client = lb2.hold();
    kv.put(&format!("{prefix}/app/s1"), "drain");
    lb1.wait_status("DRAIN");
    lb2.wait_status("DRAIN");
    wait_for(
        20 * SEC,
        "Prometheus to see both haproxies draining s1",
        || {
            let up = prom
                .query("haproxy_server_status{proxy=\"app\",server=\"s1\",state=\"DRAIN\"} == 1");
            (up.len() == 2).then_some(())
        },
    );
    let (url, iv) = (format!("http://{}", prom.addr), interval());
    let args = format!(
        "app/s1 -prometheus {url} -timeout 60s -interval {iv} -expect-instances 2 -require-drain"
    );
    // A scrape a second: the close is seen within one scrape and two polls.
    drains_when_closed(&args, client, "real prometheus", SEC + TWO_INTERVALS);

    let url = format!("http://{}", empty.addr);
    assert_no_data(&url, &iv);
}

/// Debian runs haproxy master-worker (`-Ws -S /run/haproxy-master.sock`)
/// and reloads it with USR2: the old worker keeps serving its sessions,
/// and the new worker's stats socket does not see them (SPEC §12). Three
/// sessions held through a drained server, then a reload:
/// - the master socket sums every worker, names the old one, and is not
///   drained until the old worker's sessions close;
/// - the worker socket alone, asked after the reload, cannot see them: it
///   says so (the young process's warning names the master socket);
/// - a reload during a wait on the worker socket is not drained.
#[test]
fn a_reload_with_sessions_open_is_drained_only_through_the_master_socket() {
    let (a, kv, prefix) = agent("reload");
    let real = Holding::start();
    let lb = Lb::start_in(
        "reload",
        a.listen().port(),
        real.addr,
        Haproxy::start_master_worker,
    );
    let clients: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(lb.front).unwrap())
        .collect();
    lb.hap
        .wait_server("app/s1", "three sessions", 5 * SEC, |r| {
            r.get("scur") == "3"
        });
    let (unix, iv) = (lb.unix(), interval());
    let master = lb.hap.master_socket().display().to_string();

    // A reload during a wait on the worker socket: not drained, though the
    // new worker's socket shows 0 sessions; and no wait can change that,
    // so the run ends at once (not at its -timeout 10m), naming the master
    // socket.
    let w = WaitDrained::start(&format!(
        "app/s1 -haproxy-socket {unix} -timeout 10m -interval {iv}"
    ));
    std::thread::sleep(2 * INTERVAL);
    let reloaded = Instant::now();
    lb.hap.reload();
    let (code, out, err, at) = w.finish(30 * SEC);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("haproxy reloaded during the wait"), "{out}");
    assert!(
        out.contains("waiting would not change it; ask the master with -haproxy-master-socket"),
        "{out}"
    );
    assert!(
        at - reloaded < 15 * SEC,
        "{:?} after the reload",
        at - reloaded
    );
    let old: Vec<u32> = lb
        .hap
        .workers()
        .into_iter()
        .filter(|w| w.1)
        .map(|w| w.0)
        .collect();
    assert_eq!(
        old.len(),
        1,
        "the old worker serves its sessions: {:?}",
        lb.hap.workers()
    );

    kv.put(&format!("{prefix}/app/s1"), "drain");
    lb.wait_status("DRAIN");

    // The master: 3 sessions at the old worker, not drained, in -json too.
    let w = WaitDrained::start(&format!(
        "app/s1 -haproxy-master-socket {master} -require-drain -timeout 1500ms -interval {iv} -json"
    ));
    let (code, out, err, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = &doc["servers"][0];
    assert_eq!(row["sessions"], 3, "{out}");
    let workers = row["workers"].as_array().unwrap();
    let held: Vec<(bool, u64)> = workers
        .iter()
        .map(|w| (w["old"].as_bool().unwrap(), w["sessions"].as_u64().unwrap()))
        .collect();
    assert!(
        held.contains(&(true, 3)) && held.contains(&(false, 0)),
        "{out}"
    );
    assert_eq!(
        workers.iter().find(|w| w["old"] == true).unwrap()["pid"],
        old[0],
        "{out}"
    );

    // The new worker's socket alone: 0 sessions, and the blind spot said.
    let w = WaitDrained::start(&format!(
        "app/s1 -haproxy-socket {unix} -require-drain -timeout 1500ms -interval {iv}"
    ));
    let (_, out, _, _) = w.finish(10 * SEC);
    assert!(
        out.contains("started less than 1h0m0s ago") && out.contains("give -haproxy-master-socket"),
        "{out}"
    );

    // The sessions close: the old workers leave, and the master says drained.
    let args = format!(
        "app/s1 -haproxy-master-socket {master} -require-drain -timeout 60s -interval {iv}"
    );
    let mut clients = clients.into_iter();
    let first = clients.next().unwrap();
    drop(clients);
    let out = drains_when_closed(&args, first, "master socket", 6 * INTERVAL);
    assert!(
        out.contains(" old]"),
        "the table names the old worker: {out}"
    );
}

/// A server that every source answers without listing (a typo) is named on
/// the first poll, not after the whole `-timeout`.
#[test]
fn a_server_no_source_lists_is_named_at_once() {
    let (a, _kv, _prefix) = agent("typo");
    let real = Holding::start();
    let lb = Lb::start("typo", a.listen().port(), real.addr);
    let (unix, iv) = (lb.unix(), interval());
    let started = Instant::now();
    let w = WaitDrained::start(&format!(
        "app/s1 app/nope -haproxy-socket {unix} -timeout 60s -interval {iv}"
    ));
    let (code, out, _, exited) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    assert!(
        exited - started < 5 * SEC,
        "named after {:?}",
        exited - started
    );
    assert!(
        out.contains("no source lists app/nope: is the backend/server name right?"),
        "{out}"
    );
}

/// Draining a failing server, the most common incident case: held in drain
/// by the agent and DOWN (its health check fails), `show stat` says only
/// `DOWN`; `show servers state`'s admin state (8, forced drain) makes it
/// drained with 0 sessions, also under `-require-drain`.
#[test]
fn a_drained_server_that_is_down_is_drained_under_require_drain() {
    let (a, kv, prefix) = agent("down");
    let mut real = support::haproxy::RealServer::start();
    let lb = Lb::start("down", a.listen().port(), real.addr);
    kv.put(&format!("{prefix}/app/s1"), "drain");
    lb.wait_status("DRAIN");
    real.down();
    lb.hap
        .wait_server("app/s1", "DOWN", 10 * SEC, |r| r.status() == "DOWN");
    let admin = lb.hap.servers_state()["app/s1"]
        .get("srv_admin_state")
        .to_owned();
    assert_eq!(admin, "8", "forced drain");
    let (unix, iv) = (lb.unix(), interval());
    let w = WaitDrained::start(&format!(
        "app/s1 -haproxy-socket {unix} -require-drain -timeout 3s -interval {iv}"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 sessions, 0 queued, DOWN: drained"), "{out}");
    // Not held by the agent, a DOWN server is not drained under
    // -require-drain: it takes sessions again once its check passes.
    kv.delete(&format!("{prefix}/app/s1"));
    lb.hap.wait_server("app/s1", "ready, DOWN", 5 * SEC, |_| {
        lb.hap.servers_state()["app/s1"].get("srv_admin_state") == "0"
    });
    let w = WaitDrained::start(&format!(
        "app/s1 -haproxy-socket {unix} -require-drain -timeout 1s -interval {iv}"
    ));
    let (code, out, _, _) = w.finish(10 * SEC);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("NOT DRAINED (-require-drain): status DOWN"),
        "{out}"
    );
}
