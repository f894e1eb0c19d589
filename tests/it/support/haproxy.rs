//! A real haproxy for the integration suite: a backend-only config (no
//! frontend, `mode tcp`) whose servers are agent-checked against the agent
//! under test, run in the foreground under a [`Proc`] guard, and read only
//! through its admin stats socket (`show stat`, `show servers state`,
//! `get weight`).
//!
//! Each [`Haproxy`] owns a temp dir (config, socket), a "real server" (a TCP
//! listener thread accepting and dropping connections, so health checks pass
//! and the status reads `UP`), and the haproxy process; dropping it kills
//! the process by PID, stops the thread and removes the dir.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{wait_for, Proc};

/// The install hint every haproxy test fails with when haproxy is missing.
pub const NOT_FOUND: &str =
    "haproxy not found: set HAPROXY_BIN or install it (apt-get install -y haproxy)";

/// haproxy's binary: `HAPROXY_BIN`, else `PATH`, else `/usr/sbin/haproxy`
/// (Debian's place, often not on a user's `PATH`). Panics with
/// [`NOT_FOUND`] when none exists: these tests never skip.
pub fn haproxy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HAPROXY_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "{NOT_FOUND} (HAPROXY_BIN={} does not exist)",
            p.display()
        );
        return p;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("haproxy"))
            .find(|p| p.is_file())
    });
    let debian = Path::new("/usr/sbin/haproxy");
    on_path
        .or_else(|| debian.is_file().then(|| debian.to_path_buf()))
        .unwrap_or_else(|| panic!("{NOT_FOUND}"))
}

/// haproxy's (major, minor) and its `-v` first line, e.g. `(3, 0)` and
/// `HAProxy version 3.0.11-9e587df 2025/06/02 - https://haproxy.org/`.
pub fn haproxy_version() -> ((u32, u32), String) {
    let bin = haproxy_bin();
    let out = Command::new(&bin)
        .arg("-v")
        .output()
        .unwrap_or_else(|e| panic!("{} -v: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or("").to_owned();
    let version = first
        .split_once("version ")
        .and_then(|(_, v)| {
            let mut parts = v.split(|c: char| !c.is_ascii_digit());
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
        })
        .unwrap_or_else(|| panic!("{} -v: no version in {first:?}", bin.display()));
    (version, first)
}

/// One agent-checked `server` line.
#[derive(Clone, Debug)]
pub struct Server {
    pub backend: String,
    pub name: String,
    /// haproxy duration, e.g. `4s`.
    pub slowstart: String,
}

impl Server {
    pub fn new(backend: &str, name: &str) -> Server {
        Server {
            backend: backend.into(),
            name: name.into(),
            slowstart: "10s".into(),
        }
    }

    pub fn slowstart(mut self, d: &str) -> Server {
        self.slowstart = d.into();
        self
    }

    /// `backend/server`: the agent-send identity and the KV key below the
    /// prefix.
    pub fn id(&self) -> String {
        format!("{}/{}", self.backend, self.name)
    }
}

/// `n` servers `srv1..srvn` in `backend`.
pub fn servers(backend: &str, n: usize) -> Vec<Server> {
    (1..=n)
        .map(|i| Server::new(backend, &format!("srv{i}")))
        .collect()
}

/// A plain TCP listener standing in for the real server: accepts and drops
/// connections until dropped, so health checks pass; [`RealServer::down`]
/// and [`RealServer::up`] make them fail and recover on the same port.
pub struct RealServer {
    pub addr: SocketAddr,
    running: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl RealServer {
    pub fn start() -> RealServer {
        let mut real = RealServer {
            addr: "127.0.0.1:0".parse().unwrap(),
            running: None,
        };
        real.up();
        real
    }

    /// Listens (again) on its port.
    pub fn up(&mut self) {
        let l = TcpListener::bind(self.addr).expect("bind real server");
        self.addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for conn in l.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                drop(conn);
            }
        });
        self.running = Some((stop, thread));
    }

    /// Stops listening: connections are refused.
    pub fn down(&mut self) {
        if let Some((stop, thread)) = self.running.take() {
            stop.store(true, Ordering::Relaxed);
            // Wake the blocking accept.
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
            let _ = thread.join();
        }
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        self.down();
    }
}

/// A running haproxy, its servers agent-checked against one agent port.
pub struct Haproxy {
    proc: Option<Proc>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub config: String,
    _real: RealServer,
}

impl Haproxy {
    /// The server line the suite (and the README) uses.
    pub fn server_line(s: &Server, backend_addr: SocketAddr, agent_port: u16) -> String {
        format!(
            "server {name} {backend_addr} check inter 1s weight 100 slowstart {ss} agent-check agent-addr 127.0.0.1 agent-port {agent_port} agent-inter 100ms agent-send \"{id}\\n\"",
            name = s.name,
            ss = s.slowstart,
            id = s.id(),
        )
    }

    /// Writes the config for `servers` (grouped into backends in order of
    /// first appearance), starts `haproxy -db -f cfg` and waits until the
    /// stats socket lists every server.
    pub fn start(test: &str, agent_port: u16, servers: &[Server]) -> Haproxy {
        Haproxy::start_with(test, servers.len(), |real| {
            let mut backends: Vec<&str> = Vec::new();
            for s in servers {
                if !backends.contains(&s.backend.as_str()) {
                    backends.push(&s.backend);
                }
            }
            let mut cfg = String::new();
            for be in backends {
                // The README's shape: a default-server line before the
                // servers (haproxy 3.3/3.4 start a server without one at
                // agent health 0; tests/it/haproxy_lines.rs shows that shape).
                cfg.push_str(&format!(
                    "\nbackend {be}\n    balance roundrobin\n    default-server inter 1s\n"
                ));
                for s in servers.iter().filter(|s| s.backend == be) {
                    let line = Haproxy::server_line(s, real, agent_port);
                    cfg.push_str(&format!("    {line}\n"));
                }
            }
            cfg
        })
    }

    /// Starts haproxy with the suite's `global` and `defaults` followed by
    /// `proxies(address of a stand-in real server)`, and waits until the
    /// stats socket lists `want` servers.
    pub fn start_with(
        test: &str,
        want: usize,
        proxies: impl FnOnce(SocketAddr) -> String,
    ) -> Haproxy {
        Haproxy::start_mode(test, want, false, proxies)
    }

    /// [`Haproxy::start_with`] in master-worker mode (`-W -S
    /// <dir>/master.sock`, as Debian's unit runs it): the master CLI is
    /// [`Haproxy::master_socket`], a reload is [`Haproxy::reload`].
    pub fn start_master_worker(
        test: &str,
        want: usize,
        proxies: impl FnOnce(SocketAddr) -> String,
    ) -> Haproxy {
        Haproxy::start_mode(test, want, true, proxies)
    }

    fn start_mode(
        test: &str,
        want: usize,
        master_worker: bool,
        proxies: impl FnOnce(SocketAddr) -> String,
    ) -> Haproxy {
        let bin = haproxy_bin();
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gha-haproxy-{}-{}-{test}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create haproxy temp dir");
        let socket = dir.join("admin.sock");
        let real = RealServer::start();

        // The server state loaded across reloads, as the docs configure it
        // (the file exists only once `save-server-state` wrote it).
        let mut cfg = format!(
            "global\n    stats socket {} mode 600 level admin\n    server-state-file {}\n\n\
             defaults\n    mode tcp\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n    timeout check 1s\n    load-server-state-from-file global\n",
            socket.display(),
            dir.join("server-state").display()
        );
        cfg.push_str(&proxies(real.addr));
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, &cfg).expect("write haproxy.cfg");

        let mut cmd = Command::new(&bin);
        if master_worker {
            cmd.arg("-W").arg("-S").arg(dir.join("master.sock"));
        }
        cmd.arg("-db").arg("-f").arg(&path);
        let proc = Proc::spawn(cmd);
        let mut hap = Haproxy {
            proc: Some(proc),
            dir,
            socket,
            config: cfg,
            _real: real,
        };
        wait_for(
            Duration::from_secs(10),
            "haproxy's stats socket to list every server",
            || {
                if let Some(st) = hap.proc.as_mut().unwrap().child.try_wait().ok().flatten() {
                    panic!(
                        "haproxy exited with {st}: {:#?}",
                        hap.proc.as_ref().unwrap().log()
                    );
                }
                hap.try_command("show stat")
                    .map(|t| parse_csv(&t))
                    .filter(|rows| rows.iter().filter(|r| is_server(r)).count() == want)
            },
        );
        hap
    }

    /// The master CLI socket of [`Haproxy::start_master_worker`].
    pub fn master_socket(&self) -> PathBuf {
        self.dir.join("master.sock")
    }

    /// One master CLI command (followed by a half-close: 2.6's master
    /// answers only then); `None` if the socket is not there.
    pub fn master_command(&self, cmd: &str) -> Option<String> {
        let mut s = UnixStream::connect(self.master_socket()).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("{cmd}\n").as_bytes()).ok()?;
        s.shutdown(std::net::Shutdown::Write).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// The workers `show proc` lists: (pid, old).
    pub fn workers(&self) -> Vec<(u32, bool)> {
        let text = self.master_command("show proc").unwrap_or_default();
        let mut old = None;
        let mut workers = Vec::new();
        for line in text.lines() {
            match line.trim() {
                "# workers" => old = Some(false),
                "# old workers" => old = Some(true),
                l if l.starts_with('#') => old = None,
                l => {
                    let mut words = l.split_whitespace();
                    if let (Some(old), Some(pid), Some("worker")) =
                        (old, words.next(), words.next())
                    {
                        workers.extend(pid.parse().ok().map(|p| (p, old)));
                    }
                }
            }
        }
        workers
    }

    /// Reloads a master-worker haproxy (USR2 to the master, as
    /// `systemctl reload` does) and waits until a new worker answers the
    /// stats socket.
    pub fn reload(&self) {
        let before = self.current_workers();
        self.proc.as_ref().unwrap().signal(libc::SIGUSR2);
        self.wait_reloaded(&before);
    }

    /// The master's PID (systemd's `$MAINPID`).
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("haproxy running").pid()
    }

    /// The workers `show proc` lists as current (not old).
    pub fn current_workers(&self) -> Vec<u32> {
        self.workers()
            .into_iter()
            .filter(|w| !w.1)
            .map(|w| w.0)
            .collect()
    }

    /// Waits until a worker not in `before` is current and it, not the old
    /// one, answers the stats socket (the old worker can answer it for a
    /// moment after the reload: seen on 3.2). A reload sent by someone
    /// else (a unit's `kill -USR2`) is waited for the same way.
    pub fn wait_reloaded(&self, before: &[u32]) {
        let new = wait_for(Duration::from_secs(10), "a new haproxy worker", || {
            let now = self.current_workers();
            (!now.is_empty() && now.iter().all(|p| !before.contains(p))).then_some(now)
        });
        wait_for(
            Duration::from_secs(10),
            "the new worker on the stats socket",
            || {
                let info = self.try_command("show info")?;
                new.iter()
                    .any(|pid| info.lines().any(|l| l.trim() == format!("Pid: {pid}")))
                    .then_some(())
            },
        );
    }

    /// Stops a master-worker haproxy (SIGTERM to the master, as systemd's
    /// stop does) and starts it again on the same configuration file, as
    /// `systemctl restart` does; waits until the stats socket lists `want`
    /// servers.
    pub fn restart(&mut self, want: usize) {
        let mut old = self.proc.take().expect("haproxy running");
        old.signal(libc::SIGTERM);
        assert!(
            old.wait_exit(Duration::from_secs(10)).is_some(),
            "haproxy did not stop on SIGTERM"
        );
        let mut cmd = Command::new(haproxy_bin());
        cmd.arg("-W").arg("-S").arg(self.master_socket());
        cmd.arg("-db").arg("-f").arg(self.config_path());
        self.proc = Some(Proc::spawn(cmd));
        wait_for(
            Duration::from_secs(10),
            "the restarted haproxy to list every server",
            || {
                self.try_command("show stat")
                    .map(|t| parse_csv(&t).into_iter().filter(is_server).count())
                    .filter(|n| *n == want)
            },
        );
    }

    /// Replaces the configuration file (a reload or restart then reads it).
    pub fn rewrite(&mut self, config: String) {
        std::fs::write(self.config_path(), &config).expect("write haproxy.cfg");
        self.config = config;
    }

    /// Where the config was written.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("haproxy.cfg")
    }

    /// The haproxy process's stderr so far.
    pub fn log(&self) -> Vec<String> {
        self.proc.as_ref().map(Proc::log).unwrap_or_default()
    }

    /// One stats socket command; `None` if the socket is not there (yet).
    pub fn try_command(&self, cmd: &str) -> Option<String> {
        let mut s = UnixStream::connect(&self.socket).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("{cmd}\n").as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// One stats socket command; panics if the socket does not answer.
    pub fn command(&self, cmd: &str) -> String {
        self.try_command(cmd).unwrap_or_else(|| {
            panic!(
                "stats socket {} does not answer {cmd:?}",
                self.socket.display()
            )
        })
    }

    /// Every server row of `show stat`, keyed by `backend/server`.
    pub fn stat(&self) -> HashMap<String, Row> {
        parse_csv(&self.command("show stat"))
            .into_iter()
            .filter(is_server)
            .map(|r| (format!("{}/{}", r.get("pxname"), r.get("svname")), r))
            .collect()
    }

    /// One server's `show stat` row.
    pub fn server(&self, id: &str) -> Row {
        self.stat()
            .remove(id)
            .unwrap_or_else(|| panic!("{id} not in show stat"))
    }

    /// Every server of `show servers state`, keyed by `backend/server`
    /// (the output is space-separated after a version line and a `#`
    /// header).
    pub fn servers_state(&self) -> HashMap<String, Row> {
        let text = self.command("show servers state");
        let mut lines = text.lines().skip_while(|l| !l.starts_with('#'));
        let header: Vec<String> = lines
            .next()
            .unwrap_or("")
            .trim_start_matches('#')
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        lines
            .filter(|l| !l.trim().is_empty())
            .map(|l| Row::new(&header, l.split_whitespace().map(str::to_owned).collect()))
            .map(|r| (format!("{}/{}", r.get("be_name"), r.get("srv_name")), r))
            .collect()
    }

    /// `get weight be/srv`: (current user weight, initial weight).
    pub fn get_weight(&self, id: &str) -> (u32, u32) {
        let text = self.command(&format!("get weight {id}"));
        // "<uweight> (initial <iweight>)"
        let nums: Vec<u32> = text
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .filter_map(|s| s.parse().ok())
            .collect();
        match nums.as_slice() {
            [u, i] => (*u, *i),
            _ => panic!("get weight {id}: unexpected answer {text:?}"),
        }
    }

    /// Polls `show stat` every 20 ms until `ok` holds for server `id`,
    /// returning that row; panics with the last row after `limit`.
    pub fn wait_server(
        &self,
        id: &str,
        what: &str,
        limit: Duration,
        mut ok: impl FnMut(&Row) -> bool,
    ) -> Row {
        let deadline = Instant::now() + limit;
        loop {
            let row = self.server(id);
            if ok(&row) {
                return row;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{id}: timed out after {limit:?} waiting for {what}; last: {}",
                    row.summary()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls until every server row satisfies `ok` (given its id).
    pub fn wait_all(
        &self,
        what: &str,
        limit: Duration,
        mut ok: impl FnMut(&str, &Row) -> bool,
    ) -> HashMap<String, Row> {
        let deadline = Instant::now() + limit;
        loop {
            let stat = self.stat();
            let bad: Vec<String> = stat
                .iter()
                .filter(|(id, r)| !ok(id, r))
                .map(|(id, r)| format!("{id}: {}", r.summary()))
                .collect();
            if bad.is_empty() {
                return stat;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {limit:?} waiting for {what}; {} servers not there, e.g.:\n{}",
                    bad.len(),
                    bad[..bad.len().min(10)].join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asserts `ok` for server `id` on every sample during `d`.
    pub fn hold(&self, id: &str, what: &str, d: Duration, mut ok: impl FnMut(&Row) -> bool) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            let row = self.server(id);
            assert!(
                ok(&row),
                "{id}: expected {what} to hold for {d:?}; got {}",
                row.summary()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        drop(self.proc.take()); // kills by PID and reaps
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_server(r: &Row) -> bool {
    !matches!(r.get("svname"), "FRONTEND" | "BACKEND" | "")
}

/// One CSV (or `show servers state`) record, fields keyed by header name.
#[derive(Clone, Debug)]
pub struct Row {
    fields: HashMap<String, String>,
}

impl Row {
    fn new(header: &[String], values: Vec<String>) -> Row {
        Row {
            fields: header.iter().cloned().zip(values).collect(),
        }
    }

    /// A field by header name; `""` if absent or empty.
    pub fn get(&self, name: &str) -> &str {
        self.fields.get(name).map(String::as_str).unwrap_or("")
    }

    pub fn status(&self) -> &str {
        self.get("status")
    }

    /// The effective weight (`weight` column).
    pub fn weight(&self) -> i64 {
        self.get("weight").parse().unwrap_or(-1)
    }

    /// `agent_status` without the `* ` haproxy prefixes while a check runs.
    pub fn agent_status(&self) -> &str {
        self.get("agent_status").trim_start_matches('*').trim()
    }

    /// UP (any `UP i/n` variant), not draining, not in maint.
    pub fn is_up(&self) -> bool {
        self.status() == "UP" || self.status().starts_with("UP ")
    }

    pub fn summary(&self) -> String {
        let cols = [
            "status",
            "weight",
            "uweight",
            "throttle",
            "check_status",
            "agent_status",
            "agent_desc",
            "last_agt",
        ];
        cols.iter()
            .map(|c| format!("{c}={:?}", self.get(c)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Parses haproxy's `show stat` CSV: the first record is the header
/// (`# pxname,svname,...`), the rest are keyed by it. Quote-aware (RFC 4180:
/// `"` opens a quoted field in which `""` is a quote and commas and newlines
/// are data), because 2.6's `last_agt` can hold a newline.
pub fn parse_csv(text: &str) -> Vec<Row> {
    let mut records = csv_records(text).into_iter();
    let Some(mut header) = records.next() else {
        return Vec::new();
    };
    if let Some(first) = header.first_mut() {
        *first = first.trim_start_matches('#').trim().to_owned();
    }
    records
        .filter(|r| !(r.len() == 1 && r[0].is_empty()))
        .map(|r| Row::new(&header, r))
        .collect()
}

/// Splits CSV text into records of fields.
pub fn csv_records(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                c => field.push(c),
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            ',' => record.push(std::mem::take(&mut field)),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            c => field.push(c),
        }
    }
    if !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    records
}
