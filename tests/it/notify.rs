//! systemd's `Type=notify` protocol, the real agent binary against a real
//! unix datagram socket standing in for systemd's `NOTIFY_SOCKET` (SPEC
//! §10): `READY=1` once the agent answers, or after 10 s without with a
//! `STATUS=` saying why; `WATCHDOG=1` at half of `WATCHDOG_USEC`;
//! `STOPPING=1` on SIGTERM; a socket file and an abstract (`@name`) socket
//! alike.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::{wait_for, Agent};

/// The socket systemd would listen on, and every datagram received, with
/// its arrival time.
struct Systemd {
    socket: UnixDatagram,
    name: String,
    dir: Option<PathBuf>,
    got: Vec<(Instant, String)>,
}

impl Systemd {
    fn at_path(tag: &str) -> Systemd {
        let dir = std::env::temp_dir().join(format!("gha-notify-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        Systemd {
            socket,
            name: path.to_str().unwrap().to_string(),
            dir: Some(dir),
            got: Vec::new(),
        }
    }

    fn abstract_name(tag: &str) -> Systemd {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("gha-notify-{tag}-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        Systemd {
            socket: UnixDatagram::bind_addr(&addr).unwrap(),
            name: format!("@{name}"),
            dir: None,
            got: Vec::new(),
        }
    }

    /// Receives until `until` holds for a datagram or `limit` passes;
    /// returns that datagram.
    fn wait(&mut self, limit: Duration, until: impl Fn(&str) -> bool) -> Option<(Instant, String)> {
        let deadline = Instant::now() + limit;
        let mut buf = [0u8; 4096];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            self.socket
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            let Ok(n) = self.socket.recv(&mut buf) else {
                continue;
            };
            let msg = String::from_utf8(buf[..n].to_vec()).expect("UTF-8 datagram");
            assert!(msg.ends_with('\n'), "{msg:?}");
            self.got.push((Instant::now(), msg.clone()));
            if until(&msg) {
                return self.got.last().cloned();
            }
        }
        None
    }

    fn all(&self) -> Vec<&str> {
        self.got.iter().map(|(_, m)| m.as_str()).collect()
    }
}

impl Drop for Systemd {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn has_line(msg: &str, line: &str) -> bool {
    msg.lines().any(|l| l == line)
}

#[test]
fn ready_once_the_first_consul_read_answers_then_watchdog_and_stopping() {
    let mut systemd = Systemd::at_path("ready");
    let started = Instant::now();
    let mut agent = Agent::start(
        &["-dev", "-dev-kv-addr", "127.0.0.1:0"],
        &[
            ("NOTIFY_SOCKET", systemd.name.as_str()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let ready = systemd
        .wait(Duration::from_secs(5), |m| has_line(m, "READY=1"))
        .unwrap_or_else(|| panic!("no READY=1 within 5 s: {:?}", systemd.all()));
    assert!(
        has_line(&ready.1, "STATUS=answering from consul"),
        "READY without the status: {:?}",
        systemd.all()
    );
    assert!(
        ready.0 - started < Duration::from_secs(3),
        "READY=1 took {:?} with the dev KV",
        ready.0 - started
    );
    // READY means it answers now.
    assert!(agent.check("be/srv\n").is_some(), "READY=1 but no answer");
    let before: Vec<&str> = systemd.all();
    let ready_at = before.iter().position(|m| has_line(m, "READY=1")).unwrap();
    for m in &before[..ready_at] {
        assert!(!m.contains("READY"), "{before:?}");
    }

    // Pings at half of 400 ms: about 10 in 2 s (a loose band: a loaded
    // machine delays some); READY=1 is never sent again.
    let from = Instant::now();
    systemd.wait(Duration::from_secs(2), |_| false);
    let pings = systemd
        .got
        .iter()
        .filter(|(t, m)| *t >= from && has_line(m, "WATCHDOG=1"))
        .count();
    assert!(
        (5..=14).contains(&pings),
        "{pings} pings in 2 s: {:?}",
        systemd.all()
    );
    let readies = systemd
        .all()
        .iter()
        .filter(|m| has_line(m, "READY=1"))
        .count();
    assert_eq!(readies, 1, "{:?}", systemd.all());

    agent.proc.signal(libc::SIGTERM);
    let stop = systemd.wait(Duration::from_secs(5), |m| has_line(m, "STOPPING=1"));
    assert!(stop.is_some(), "no STOPPING=1: {:?}", systemd.all());
    assert!(agent.proc.wait_exit(Duration::from_secs(10)).is_some());
}

/// WATCHDOG_PID names another process (systemd passed the variable on to
/// a child of the main process): no pings from this one.
#[test]
fn a_watchdog_meant_for_another_pid_is_not_pinged() {
    let mut systemd = Systemd::at_path("pid");
    let _agent = Agent::start(
        &["-dev", "-dev-kv-addr", "127.0.0.1:0"],
        &[
            ("NOTIFY_SOCKET", systemd.name.as_str()),
            ("WATCHDOG_USEC", "200000"),
            ("WATCHDOG_PID", "1"),
        ],
    );
    systemd
        .wait(Duration::from_secs(5), |m| has_line(m, "READY=1"))
        .unwrap_or_else(|| panic!("no READY=1: {:?}", systemd.all()));
    systemd.wait(Duration::from_millis(1000), |_| false);
    assert!(
        !systemd.all().iter().any(|m| m.contains("WATCHDOG=1")),
        "{:?}",
        systemd.all()
    );
}

/// consul unreachable and no state file: boot is not held; READY=1 comes
/// at 10 s, its STATUS says the agent does not answer and why, through an
/// abstract socket (`@name`, as systemd in a container may give).
#[test]
fn ready_after_ten_seconds_without_an_answer_says_why() {
    let mut systemd = Systemd::abstract_name("late");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let consul = closed.local_addr().unwrap().to_string();
    drop(closed);
    let started = Instant::now();
    let agent = Agent::start(
        &["-consul-addr", consul.as_str()],
        &[("NOTIFY_SOCKET", systemd.name.as_str())],
    );
    let first = systemd
        .wait(Duration::from_secs(5), |_| true)
        .unwrap_or_else(|| panic!("nothing sent at start"));
    assert!(
        first
            .1
            .starts_with("STATUS=starting: waiting for the first consul read"),
        "{first:?}"
    );
    let ready = systemd
        .wait(Duration::from_secs(14), |m| has_line(m, "READY=1"))
        .unwrap_or_else(|| panic!("no READY=1 within 14 s: {:?}", systemd.all()));
    let took = ready.0 - started;
    assert!(
        took >= Duration::from_millis(9_500) && took < Duration::from_secs(13),
        "READY=1 after {took:?}, not about 10 s"
    );
    let status = ready
        .1
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .unwrap_or_else(|| panic!("READY=1 without STATUS=: {:?}", ready.1));
    assert!(
        status.starts_with(
            "not answering: no complete consul read and no usable state file within 10s"
        ) && status.contains("last consul error: "),
        "{status}"
    );
    assert!(agent.check("be/srv\n").is_none(), "answered without state");
}

/// Without NOTIFY_SOCKET nothing changes; with one that cannot be used
/// (vsock, which this agent does not speak), a warning and a normal start.
#[test]
fn an_unusable_notify_socket_is_a_warning_not_a_failure() {
    let agent = Agent::start(
        &["-dev", "-dev-kv-addr", "127.0.0.1:0"],
        &[("NOTIFY_SOCKET", "vsock:2:1234")],
    );
    agent
        .proc
        .wait_log("NOTIFY_SOCKET=\\\"vsock:2:1234\\\"", Duration::from_secs(5));
    wait_for(Duration::from_secs(5), "an answer", || {
        agent.check("be/srv\n")
    });
}
