//! Test support: the agent binary as a guarded child process, the consul
//! stand-in (the binary itself in `-dev` mode, or a real `consul agent -dev`
//! when `CONSUL_BIN` names one or `consul` is on `PATH`), a one-line agent
//! client, a small blocking HTTP client over the project's own framing, and
//! deadline-bounded polling.
//!
//! Every process started here is killed by PID when its guard drops, even
//! when a test fails. The benches use it too (`benches/common` includes
//! this folder by path): they start the binary logging at info (the `env`
//! of [`Agent::start`]) and poll replies without a pause ([`poll_reply`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gitlab_haproxy_agent::http::{parse_response_head, BodyDecoder, Parse};

pub const BIN: &str = env!("CARGO_BIN_EXE_gitlab-haproxy-agent");

/// Every listener the binary would otherwise bind on a fixed port.
pub const NO_FIXED_PORTS: [&str; 6] = [
    "-listen-addr",
    "127.0.0.1:0",
    "-monitoring-addr",
    "",
    "-pprof-addr",
    "",
];

/// `-dev` with its dev KV on `127.0.0.1:0` ([`Agent::dev`]).
pub const DEV: [&str; 3] = ["-dev", "-dev-kv-addr", "127.0.0.1:0"];

/// The default `-kv-prefix`.
pub const STATE_PREFIX: &str = "gitlab-haproxy-agent/state";

/// No setting from the test runner's environment leaks into the agent.
pub fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CONSUL_") || k.starts_with("GITLAB_") {
            cmd.env_remove(k);
        }
    }
}

/// Polls `f` every 10 ms until it returns `Some`, or panics with `what`
/// after `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child process killed (SIGKILL, by PID) when dropped; its stderr is
/// collected line by line.
pub struct Proc {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// Spawns `cmd` with stderr captured.
    pub fn spawn(mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr piped");
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if std::env::var_os("TEST_SHOW_LOGS").is_some() {
                    eprintln!("[child] {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Proc { child, lines }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// All stderr lines so far.
    pub fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub fn wait_log(&self, needle: &str, limit: Duration) -> String {
        wait_for(limit, &format!("log line containing {needle:?}"), || {
            self.log().into_iter().find(|l| l.contains(needle))
        })
    }

    /// Sends a signal (by PID).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// Waits for exit; `None` if still running after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent binary, running, with the addresses it logged at start-up.
pub struct Agent {
    pub proc: Proc,
    pub listen: Option<SocketAddr>,
    pub monitoring: Option<SocketAddr>,
    pub pprof: Option<SocketAddr>,
    pub dev_kv: Option<SocketAddr>,
}

impl Agent {
    /// Starts the binary with `args` (every listener defaults to
    /// `127.0.0.1:0` unless `args` sets it; logs at debug unless `env` says
    /// otherwise) and waits for its `listening` line.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Agent {
        Agent::start_under(&[], args, env)
    }

    /// [`Agent::start`], the binary run by `wrapper` (a command and its
    /// arguments, such as `unshare --pid --fork --kill-child`; empty: none).
    pub fn start_under(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> Agent {
        let mut cmd = match wrapper.split_first() {
            Some((run, rest)) => {
                let mut c = Command::new(run);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        for (flag, default) in [
            ("-listen-addr", "127.0.0.1:0"),
            ("-monitoring-addr", "127.0.0.1:0"),
            ("-pprof-addr", "127.0.0.1:0"),
        ] {
            if !args.contains(&flag) {
                cmd.args([flag, default]);
            }
        }
        cmd.args(args);
        cmd.env_remove("CONSUL_HTTP_ADDR")
            .env_remove("CONSUL_HTTP_TOKEN")
            .env_remove("CONSUL_HTTP_TOKEN_FILE");
        // A test run under systemd must not tell it about these agents.
        for var in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "CREDENTIALS_DIRECTORY",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("GITLAB_LOG_LEVEL", "debug");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let proc = Proc::spawn(cmd);
        let line = proc.wait_log("\"msg\":\"listening\"", Duration::from_secs(10));
        let addr_of = |name: &str| process::logged_addr(&line, name);
        Agent {
            listen: addr_of("listen_addr"),
            monitoring: addr_of("monitoring_addr"),
            pprof: addr_of("pprof_addr"),
            dev_kv: addr_of("dev_kv_addr"),
            proc,
        }
    }

    /// The agent pointed at a consul address (`host:port`), answering on
    /// loopback.
    pub fn with_consul(consul: SocketAddr, prefix: &str, extra: &[&str]) -> Agent {
        let consul = consul.to_string();
        let mut args = vec!["-consul-addr", consul.as_str(), "-kv-prefix", prefix];
        args.extend_from_slice(extra);
        Agent::start(&args, &[])
    }

    /// The binary in `-dev` mode (its own dev KV on `127.0.0.1:0`) with
    /// `extra` flags, not waited on.
    pub fn dev(extra: &[&str]) -> Agent {
        Agent::dev_with(extra, &[])
    }

    /// [`Agent::dev`] with `env` (the benches: info logs).
    pub fn dev_with(extra: &[&str], env: &[(&str, &str)]) -> Agent {
        Agent::start(&[&DEV[..], extra].concat(), env)
    }

    /// The dev KV of an agent in `-dev` mode (the agent owns the process).
    pub fn kv(&self) -> Kv {
        Kv {
            addr: self.dev_kv.expect("dev KV address logged"),
            proc: None,
        }
    }

    pub fn listen(&self) -> SocketAddr {
        self.listen.expect("agent listener enabled")
    }

    /// One agent check: sends `line` as is, returns the reply (`None`: closed
    /// without one).
    pub fn check(&self, line: &str) -> Option<String> {
        check(self.listen(), line.as_bytes())
    }

    /// Waits until the reply for `identity` is `want`.
    pub fn wait_reply(&self, identity: &str, want: &str, limit: Duration) {
        let pause = Duration::from_millis(10);
        if let Err(last) = poll_reply(self.listen(), identity, want, limit, pause) {
            panic!("{identity}: expected {want:?} within {limit:?}, last reply {last:?}");
        }
    }

    /// GET on the monitoring listener: (status, body).
    pub fn monitoring_get(&self, path: &str) -> (u16, String) {
        let (st, body) = http(
            self.monitoring.expect("monitoring enabled"),
            "GET",
            path,
            b"",
        )
        .expect("monitoring answers");
        (st, String::from_utf8_lossy(&body).into_owned())
    }

    /// A metric's value from `/-/metrics` (`series` with labels as printed).
    pub fn metric(&self, series: &str) -> f64 {
        let (_, text) = self.monitoring_get("/-/metrics");
        metric_value(&text, series).unwrap_or_else(|| panic!("{series} not in /-/metrics"))
    }
}

/// A metric's value in an exposition, `None` if the series is absent.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|r| r.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Asks `addr` for `identity` every `pause` (zero: at once again, to time
/// the answer) until the reply is `want`: how long that took, or the last
/// reply once `limit` has passed.
pub fn poll_reply(
    addr: SocketAddr,
    identity: &str,
    want: &str,
    limit: Duration,
    pause: Duration,
) -> Result<Duration, Option<String>> {
    let line = format!("{identity}\n");
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < limit {
        last = check(addr, line.as_bytes());
        if last.as_deref() == Some(want) {
            return Ok(start.elapsed());
        }
        std::thread::sleep(pause);
    }
    Err(last)
}

/// One agent-check connection: send `request`, read until EOF; `None` if
/// the agent closed without a reply line.
pub fn check(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8(out).ok()?;
    text.strip_suffix('\n').map(str::to_owned)
}

/// A blocking HTTP/1.1 request (one per connection) over the project's own
/// response framing: (status, body).
pub fn http(addr: SocketAddr, method: &str, target: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    http_full(addr, method, target, body).map(|(st, _, b)| (st, b))
}

/// Response headers, names lowercased.
pub type Headers = Vec<(String, Vec<u8>)>;

/// Like [`http`], also returning the headers.
pub fn http_full(
    addr: SocketAddr,
    method: &str,
    target: &str,
    body: &[u8],
) -> Option<(u16, Headers, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(req.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        if let Parse::Done(head, used) = parse_response_head(&buf, 1 << 20) {
            let mut dec = BodyDecoder::new(head.framing, 256 << 20);
            let mut out = Vec::new();
            let mut rest = buf[used..].to_vec();
            loop {
                let n = dec.feed(&rest, &mut out).ok()?;
                rest.drain(..n);
                if dec.is_done() {
                    return Some((head.status, head.headers, out));
                }
                let got = s.read(&mut chunk).ok()?;
                if got == 0 {
                    dec.eof().ok()?;
                    return Some((head.status, head.headers, out));
                }
                rest.extend_from_slice(&chunk[..got]);
            }
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// [`Agent::dev`] once it answers from its KV (`ready 100%`), and that KV.
/// The identity waited for is one byte long: any `-max-line-bytes` takes it.
pub fn dev_agent(extra: &[&str]) -> (Agent, Kv) {
    let agent = Agent::dev(extra);
    agent.wait_reply("x", "ready 100%", Duration::from_secs(10));
    let kv = agent.kv();
    (agent, kv)
}

/// A consul KV API to write to: the dev KV (the binary in `-dev` mode, its
/// agent listener disabled) or a real `consul agent -dev`.
pub struct Kv {
    pub addr: SocketAddr,
    /// The dev KV process (killing it is "consul down"); `None` for a real
    /// consul shared by the test binary.
    pub proc: Option<Agent>,
}

impl Kv {
    /// The binary's own dev KV on `127.0.0.1:0`.
    pub fn dev() -> Kv {
        Kv::dev_at("127.0.0.1:0".parse().unwrap())
    }

    /// The dev KV on a given address (to restart "consul" on the same port).
    pub fn dev_at(addr: SocketAddr) -> Kv {
        Kv::dev_with(addr, &[], &[])
    }

    /// [`Kv::dev_at`] with `extra` flags (its own `-kv-prefix`) and `env`
    /// (the benches: info logs).
    pub fn dev_with(addr: SocketAddr, extra: &[&str], env: &[(&str, &str)]) -> Kv {
        let at = addr.to_string();
        let mut args = vec![
            "-dev",
            "-listen-addr",
            "",
            "-monitoring-addr",
            "",
            "-pprof-addr",
            "",
            "-dev-kv-addr",
            &at,
        ];
        args.extend_from_slice(extra);
        let a = Agent::start(&args, env);
        Kv {
            addr: a.dev_kv.expect("dev KV address logged"),
            proc: Some(a),
        }
    }

    /// A real consul when one is available (`CONSUL_BIN`, else `consul` on
    /// `PATH`), one per test binary; else a fresh dev KV.
    pub fn any() -> Kv {
        match real_consul() {
            Some(addr) => Kv { addr, proc: None },
            None => Kv::dev(),
        }
    }

    pub fn put(&self, key: &str, value: &str) {
        let (st, body) = http(self.addr, "PUT", &format!("/v1/kv/{key}"), value.as_bytes())
            .expect("KV answers PUT");
        assert_eq!((st, body.as_slice()), (200, &b"true"[..]), "PUT {key}");
    }

    /// A key's raw value (`?raw`), `None` when absent.
    pub fn get(&self, key: &str) -> Option<String> {
        let (st, body) =
            http(self.addr, "GET", &format!("/v1/kv/{key}?raw"), b"").expect("KV answers GET");
        (st == 200).then(|| String::from_utf8_lossy(&body).into_owned())
    }

    pub fn delete(&self, key: &str) {
        let (st, _) =
            http(self.addr, "DELETE", &format!("/v1/kv/{key}"), b"").expect("KV answers DELETE");
        assert_eq!(st, 200, "DELETE {key}");
    }

    pub fn delete_tree(&self, prefix: &str) {
        let (st, _) = http(
            self.addr,
            "DELETE",
            &format!("/v1/kv/{prefix}?recurse"),
            b"",
        )
        .expect("KV answers DELETE");
        assert_eq!(st, 200, "DELETE {prefix}?recurse");
    }
}

/// Pipelined keep-alive PUTs: `n` keys per connection, in batches.
pub fn put_many(addr: SocketAddr, keys: impl Iterator<Item = (String, &'static str)>) -> usize {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let keys: Vec<_> = keys.collect();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let mut done = 0;
    for batch in keys.chunks(200) {
        let mut req = Vec::new();
        for (k, v) in batch {
            req.extend_from_slice(
                format!(
                    "PUT /v1/kv/{k} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{v}",
                    v.len()
                )
                .as_bytes(),
            );
        }
        s.write_all(&req).unwrap();
        let mut answered = 0;
        while answered < batch.len() {
            if let Parse::Done(head, used) = parse_response_head(&buf, 1 << 16) {
                let mut dec = BodyDecoder::new(head.framing, 1 << 16);
                let mut body = Vec::new();
                let n = dec.feed(&buf[used..], &mut body).unwrap();
                if dec.is_done() {
                    assert_eq!((head.status, body.as_slice()), (200, &b"true"[..]));
                    buf.drain(..used + n);
                    answered += 1;
                    continue;
                }
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "dev KV closed a keep-alive connection");
            buf.extend_from_slice(&chunk[..n]);
        }
        done += answered;
    }
    done
}

/// Agent checks, one after another on fresh connections, on a thread of
/// their own until stopped: the latency of each (a check without a reply
/// counts as `Duration::MAX`).
pub struct Checker {
    stop: Arc<AtomicBool>,
    done: Arc<std::sync::atomic::AtomicUsize>,
    thread: std::thread::JoinHandle<Vec<Duration>>,
}

impl Checker {
    /// Checks made before [`Checker::finish`] stops (it waits for them,
    /// while the caller's load is still on).
    const AT_LEAST: usize = 20;

    pub fn start(addr: SocketAddr) -> Checker {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (flag, count) = (Arc::clone(&stop), Arc::clone(&done));
        let thread = std::thread::spawn(move || {
            let mut took = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = check(addr, b"be_web/srv1\n").as_deref() == Some("ready 100%");
                took.push(if ok { t.elapsed() } else { Duration::MAX });
                count.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
            took
        });
        Checker { stop, done, thread }
    }

    /// Stops; (p99, max) of the checks, each of which must have been
    /// answered.
    pub fn finish(self, what: &str) -> (Duration, Duration) {
        // A fast phase would leave too few checks to judge: the load is
        // still on until the caller returns, so wait for them (bounded).
        let end = Instant::now() + Duration::from_secs(10);
        while self.done.load(Ordering::Relaxed) < Self::AT_LEAST && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop.store(true, Ordering::Relaxed);
        let took = self.thread.join().unwrap();
        assert!(
            took.len() >= Self::AT_LEAST,
            "{what}: only {} checks in 10 s",
            took.len()
        );
        let max = took.iter().copied().max().unwrap();
        assert!(max != Duration::MAX, "{what}: a check got no reply");
        (p99(took), max)
    }
}

pub fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

/// A KV prefix no other test uses.
pub fn unique_prefix(test: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "test-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        test
    )
}

pub fn consul_bin() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("CONSUL_BIN").filter(|p| !p.is_empty()) {
        return Some(p.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("consul"))
            .find(|p| p.is_file())
    })
}

/// One `consul agent -dev` per test binary, on free loopback ports. It is
/// started from a thread that lives as long as the test binary, with
/// `PR_SET_PDEATHSIG`, so the kernel kills it when the tests end (whatever
/// way they end) and no consul outlives them.
fn real_consul() -> Option<SocketAddr> {
    static CONSUL: OnceLock<Option<SocketAddr>> = OnceLock::new();
    *CONSUL.get_or_init(|| {
        let bin = consul_bin()?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let port = free_port();
            let mut cmd = consul_command(&bin, port, &[]);
            // SAFETY: prctl(2) only, between fork and exec.
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let _proc = Proc::spawn(cmd);
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            wait_consul_leader(addr);
            let _ = tx.send(addr);
            // The death signal follows this thread: keep it for the binary's life.
            loop {
                std::thread::park();
            }
        });
        Some(rx.recv().expect("consul agent -dev started"))
    })
}

/// `consul agent -dev` on loopback, its HTTP API on `http_port`, every
/// other port free or off, plus `extra` arguments (`-hcl` settings).
pub fn consul_command(bin: &std::path::Path, http_port: u16, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    // Dev mode keeps everything in memory.
    cmd.args([
        "agent",
        "-dev",
        "-bind",
        "127.0.0.1",
        "-client",
        "127.0.0.1",
    ]);
    cmd.args(["-http-port", &http_port.to_string()]);
    cmd.args(["-grpc-port", "-1", "-dns-port", "-1"]);
    cmd.args(["-serf-lan-port", &free_port().to_string()]);
    cmd.args(["-serf-wan-port", &free_port().to_string()]);
    cmd.args(["-server-port", &free_port().to_string()]);
    cmd.args(extra);
    cmd
}

/// Waits until the consul agent at `addr` (its HTTP API) has elected itself.
pub fn wait_consul_leader(addr: SocketAddr) {
    wait_for(
        Duration::from_secs(30),
        "consul agent -dev to elect itself",
        || {
            http(addr, "GET", "/v1/status/leader", b"")
                .filter(|(st, b)| *st == 200 && b.len() > 2)
                .map(|_| ())
        },
    );
}

/// A port free right now on 127.0.0.1 (for processes that cannot report
/// their own bound port, like consul).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
pub mod haproxy;
pub mod metrics;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod rig;
pub mod tls;
