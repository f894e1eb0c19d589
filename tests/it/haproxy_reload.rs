//! A drained server takes no traffic across haproxy reloads and restarts
//! (SPEC §15), against a real master-worker haproxy (`-W -S`, reloaded with
//! SIGUSR2 as `systemctl reload` does) and the agent on the dev KV.
//!
//! One backend of four servers, each a stand-in that writes its name and
//! closes: `ready` (no key), `half` (`50%`), `drain` and `maint` (in that
//! order: haproxy spreads each server's first agent check over
//! `agent-inter` by its position, so the last one waits longest). A client
//! opens new connections through haproxy as fast as it can and counts who
//! answered. With `server-state-file` and `load-server-state-from-file
//! global`, and `save-server-state` run before each reload or stop, the
//! `maint` and `drain` servers answer no request and `half` is never at
//! full weight when the new worker starts; without them (the control), the
//! new worker sends traffic to both until their first agent check.

use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::haproxy::Haproxy;
use crate::support::{free_port, unique_prefix, wait_for, Agent, Kv};

const SEC: Duration = Duration::from_secs(1);
/// The README's `agent-inter`: the window a reload opens without the state
/// file is up to this long.
const AGENT_INTER: &str = "2s";
/// How long after a reload the client's answers are counted: past the last
/// server's first agent check (7/8 of `AGENT_INTER`) with a margin.
const WINDOW: Duration = Duration::from_millis(2500);
const RELOADS: usize = 5;

/// A stand-in server: writes its name to each connection and closes it.
fn named_server(name: &'static str, stop: Arc<AtomicBool>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut c, _)) => {
                    let _ = c.write_all(name.as_bytes());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    addr
}

/// Who answered each request through haproxy, and when.
type Answers = Arc<Mutex<Vec<(Instant, String)>>>;

/// A client opening new connections through `front` as fast as it can
/// until `stop`.
fn client(front: SocketAddr, stop: Arc<AtomicBool>) -> Answers {
    let answers: Answers = Arc::default();
    let sink = Arc::clone(&answers);
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut c) = TcpStream::connect_timeout(&front, Duration::from_millis(200)) else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let _ = c.set_read_timeout(Some(SEC));
            let mut name = String::new();
            if c.read_to_string(&mut name).is_ok() && !name.is_empty() {
                sink.lock().unwrap().push((Instant::now(), name));
            }
        }
    });
    answers
}

/// Requests each server answered since `from`.
fn count_since(answers: &Answers, from: Instant) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (at, name) in answers.lock().unwrap().iter() {
        if *at >= from {
            *counts.entry(name.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// The servers, in backend order (see the module header).
const SERVERS: [&str; 4] = ["ready", "half", "drain", "maint"];

/// The rig: the agent, its KV, haproxy and the stand-ins.
struct Rig {
    hap: Haproxy,
    agent: Option<Agent>,
    _kv: Kv,
    front: SocketAddr,
    /// haproxy's `server-state-file` (in the harness's directory).
    state_file: std::path::PathBuf,
    reals: HashMap<&'static str, SocketAddr>,
    stop: Arc<AtomicBool>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The backend's server line for `name` at `addr`.
fn server_line(name: &str, addr: SocketAddr) -> String {
    format!("    server {name} {addr} agent-send \"be_web/{name}\\n\"\n")
}

impl Rig {
    /// Starts it all; `load_state`: the two haproxy lines of SPEC §15.
    fn start(test: &str, load_state: bool) -> Rig {
        let kv = Kv::dev();
        let prefix = unique_prefix(test);
        kv.put(&format!("{prefix}/be_web/half"), "50%");
        kv.put(&format!("{prefix}/be_web/drain"), "drain");
        kv.put(&format!("{prefix}/be_web/maint"), "maint");
        let agent = Agent::with_consul(kv.addr, &prefix, &[]);
        wait_for(10 * SEC, "agent readiness", || {
            (agent.monitoring_get("/-/readiness").0 == 200).then_some(())
        });
        let stop = Arc::new(AtomicBool::new(false));
        let reals: HashMap<&'static str, SocketAddr> = SERVERS
            .iter()
            .map(|&name| (name, named_server(name, Arc::clone(&stop))))
            .collect();
        let front: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let agent_port = agent.listen().port();
        // The harness's `global` names the server-state-file (in its
        // directory); a `defaults` section starts empty, so the control's
        // backend loads nothing.
        let defaults = match load_state {
            true => "    load-server-state-from-file global\n",
            false => "",
        };
        let reals_in_order: Vec<SocketAddr> = SERVERS.iter().map(|n| reals[n]).collect();
        let hap = Haproxy::start_master_worker(test, SERVERS.len(), move |_| {
            let mut cfg = format!(
                "\ndefaults\n    mode tcp\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n    timeout check 1s\n{defaults}\
                 \nfrontend fe\n    bind {front}\n    default_backend be_web\n\
                 \nbackend be_web\n    balance roundrobin\n\
                 \x20   default-server check inter 1s weight 100 slowstart 10s agent-check agent-addr 127.0.0.1 agent-port {agent_port} agent-inter {AGENT_INTER}\n"
            );
            for (name, addr) in SERVERS.iter().zip(reals_in_order) {
                cfg.push_str(&server_line(name, addr));
            }
            cfg
        });
        let state_file = hap.dir.join("server-state");
        let rig = Rig {
            hap,
            agent: Some(agent),
            _kv: kv,
            front,
            state_file,
            reals,
            stop,
        };
        rig.wait_applied();
        rig
    }

    /// Until haproxy shows what the agent answers.
    fn wait_applied(&self) {
        self.hap
            .wait_all("the agent's answers applied", 15 * SEC, |id, r| match id {
                "be_web/maint" => r.status().starts_with("MAINT"),
                "be_web/drain" => r.status().starts_with("DRAIN"),
                "be_web/half" => r.weight() == 50,
                _ => r.status().starts_with("UP") && r.weight() == 100,
            });
    }

    /// `save-server-state` through the master socket, as the drop-in runs
    /// it; panics unless it saved.
    fn save(&self) {
        let out = Command::new(support::BIN)
            .args(["save-server-state", "-haproxy-master-socket"])
            .arg(self.hap.master_socket())
            .arg("-o")
            .arg(&self.state_file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && text.starts_with("saved 4 servers of 1 backend from haproxy worker "),
            "save-server-state: {:?} {text} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `half`'s weight in the new worker's `show stat`, read as soon as it
    /// answers.
    fn half_weight(&self) -> i64 {
        self.hap.server("be_web/half").weight()
    }
}

/// What the reloads did: per reload, the requests `maint` and `drain`
/// answered in [`WINDOW`] after it, and `half`'s weight when the new worker
/// first answered.
#[derive(Debug, Default)]
struct Seen {
    maint: Vec<usize>,
    drain: Vec<usize>,
    half_weight: Vec<i64>,
    total: usize,
}

/// Reloads `RELOADS` times under the client's load, saving first when
/// `save`.
fn reloads(rig: &mut Rig, save: bool) -> Seen {
    let answers = client(rig.front, Arc::clone(&rig.stop));
    wait_for(5 * SEC, "the client's first answers", || {
        (answers.lock().unwrap().len() > 10).then_some(())
    });
    let mut seen = Seen::default();
    for _ in 0..RELOADS {
        if save {
            rig.save();
        }
        let from = Instant::now();
        rig.hap.reload();
        seen.half_weight.push(rig.half_weight());
        std::thread::sleep(WINDOW.saturating_sub(from.elapsed()));
        let counts = count_since(&answers, from);
        seen.maint.push(counts.get("maint").copied().unwrap_or(0));
        seen.drain.push(counts.get("drain").copied().unwrap_or(0));
        seen.total += counts.values().sum::<usize>();
        rig.wait_applied();
    }
    eprintln!("reloads (save: {save}): {seen:?}");
    seen
}

#[test]
fn with_the_state_file_saved_before_each_reload_maint_and_drain_take_nothing() {
    let mut rig = Rig::start("reload-state", true);
    let seen = reloads(&mut rig, true);
    assert!(seen.total > 100, "the client got through: {seen:?}");
    assert_eq!(seen.maint, [0; RELOADS], "requests to maint per reload");
    assert_eq!(seen.drain, [0; RELOADS], "new sessions to drain per reload");
    assert!(
        seen.half_weight.iter().all(|w| *w < 100 && *w > 0),
        "half never at full weight when the new worker starts: {:?}",
        seen.half_weight
    );
}

/// The control: the same reloads without the state file. The new worker
/// starts `maint` and `drain` ready at full weight until their first
/// agent check, and the client reaches them.
#[test]
fn without_the_state_file_a_reload_sends_traffic_to_maint_and_drain() {
    let mut rig = Rig::start("reload-control", false);
    let seen = reloads(&mut rig, false);
    assert!(
        seen.maint.iter().sum::<usize>() > 0 && seen.drain.iter().sum::<usize>() > 0,
        "the leak this issue is about: {seen:?}"
    );
    assert!(
        seen.half_weight.contains(&100),
        "half at full weight in a new worker: {:?}",
        seen.half_weight
    );
}

/// A restart (stop, then start: `systemctl restart`, a reboot) loads the
/// file saved before the stop.
#[test]
fn a_restart_keeps_maint_and_drain_from_the_state_saved_before_the_stop() {
    let mut rig = Rig::start("restart-state", true);
    let answers = client(rig.front, Arc::clone(&rig.stop));
    for _ in 0..2 {
        rig.save();
        rig.hap.restart(SERVERS.len());
        let from = Instant::now();
        let half = rig.half_weight();
        wait_for(5 * SEC, "the client through the new haproxy", || {
            (count_since(&answers, from).values().sum::<usize>() > 50).then_some(())
        });
        std::thread::sleep(WINDOW.saturating_sub(from.elapsed()));
        let counts = count_since(&answers, from);
        eprintln!("restart: {counts:?}, half's weight at start {half}");
        assert_eq!(counts.get("maint"), None, "{counts:?}");
        assert_eq!(counts.get("drain"), None, "{counts:?}");
        assert!(half < 100 && half > 0, "half's weight at start: {half}");
        rig.wait_applied();
    }
}

/// The agent stopped: a reload keeps what haproxy had (the state file),
/// and the failing agent checks change nothing.
#[test]
fn a_reload_while_the_agent_is_stopped_keeps_maint_and_drain() {
    let mut rig = Rig::start("reload-agent-down", true);
    drop(rig.agent.take());
    let answers = client(rig.front, Arc::clone(&rig.stop));
    rig.save();
    let from = Instant::now();
    rig.hap.reload();
    std::thread::sleep(2 * WINDOW);
    let counts = count_since(&answers, from);
    eprintln!("reload with the agent down: {counts:?}");
    assert!(counts.values().sum::<usize>() > 50, "{counts:?}");
    assert_eq!(counts.get("maint"), None, "{counts:?}");
    assert_eq!(counts.get("drain"), None, "{counts:?}");
    let stat = rig.hap.stat();
    assert!(stat["be_web/maint"].status().starts_with("MAINT"));
    assert!(stat["be_web/drain"].status().starts_with("DRAIN"));
    assert_eq!(stat["be_web/half"].weight(), 50);
}

/// A configuration change: a server the new configuration adds starts as
/// it says (ready, full weight: the file has no line for it); one it
/// removes is passed over; the others keep their state.
#[test]
fn a_server_added_starts_as_configured_and_one_removed_is_ignored() {
    let mut rig = Rig::start("reload-change", true);
    let stop = Arc::clone(&rig.stop);
    let added = named_server("added", stop);
    let config = rig.hap.config.replace(
        &server_line("ready", rig.reals["ready"]),
        &server_line("added", added),
    );
    assert_ne!(
        config, rig.hap.config,
        "the ready server's line is replaced"
    );
    let answers = client(rig.front, Arc::clone(&rig.stop));
    rig.save();
    rig.hap.rewrite(config);
    let from = Instant::now();
    rig.hap.reload();
    let stat = rig.hap.stat();
    assert!(
        !stat.contains_key("be_web/ready"),
        "removed: {:?}",
        stat.keys()
    );
    assert_eq!(stat["be_web/added"].weight(), 100);
    std::thread::sleep(WINDOW);
    let counts = count_since(&answers, from);
    eprintln!("reload with a server added and one removed: {counts:?}");
    assert!(counts.get("added").copied().unwrap_or(0) > 10, "{counts:?}");
    assert_eq!(counts.get("maint"), None, "{counts:?}");
    assert_eq!(counts.get("drain"), None, "{counts:?}");
    assert!(
        !rig.hap.log().iter().any(|l| l.contains("ALERT")),
        "{:#?}",
        rig.hap.log()
    );
}

/// The drop-in's `[Service]` settings: (key, value) in order.
fn drop_in() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging/haproxy.service.d/gitlab-haproxy-agent.conf");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && *l != "[Service]")
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{l:?}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// One Exec line run as systemd runs it (no shell: words split at
/// spaces, `$VAR` words substituted; a leading `-` ignores a failure),
/// with the Debian paths of the drop-in pointed at the test's. `Ok` with
/// the output, or `Err` if a line whose failure counts failed.
fn run_exec(line: &str, rig: &Rig) -> Result<String, String> {
    let (ignore, line) = match line.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let master = rig.hap.master_socket().display().to_string();
    let mut argv: Vec<String> = Vec::new();
    for word in line.split_whitespace() {
        match word {
            "/usr/sbin/haproxy" => argv.push(support::haproxy::haproxy_bin().display().to_string()),
            // Debian's and Ubuntu's packages are built with systemd; the
            // upstream 2.8 the LTS step builds is not (3.x always is), and
            // refuses -Ws: the check is the same without it.
            "-Ws" if !built_with_systemd() => argv.push("-W".to_owned()),
            "/usr/local/bin/gitlab-haproxy-agent" => argv.push(support::BIN.to_owned()),
            "/run/haproxy-master.sock" => argv.push(master.clone()),
            "$CONFIG" => argv.push(rig.hap.config_path().display().to_string()),
            // Debian's EXTRAOPTS: "-S /run/haproxy-master.sock".
            "$EXTRAOPTS" => argv.extend(["-S".to_owned(), master.clone()]),
            "$MAINPID" => argv.push(rig.hap.pid().to_string()),
            w => argv.push(w.to_owned()),
        }
    }
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.success() || ignore {
        true => Ok(text),
        false => Err(format!("{argv:?}: {:?} {text}", out.status)),
    }
}

/// haproxy under test lists `+SYSTEMD` among its features (`-vv`).
fn built_with_systemd() -> bool {
    let out = Command::new(support::haproxy::haproxy_bin())
        .arg("-vv")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("+SYSTEMD")
}

/// The drop-in as `systemctl reload haproxy` runs it on Debian: Debian's
/// configuration check, the save, the USR2; then the stop's save. The save
/// never blocks (a `-` line), and the reload keeps maint and drain out.
#[test]
fn the_drop_in_saves_after_the_check_and_before_the_reload_and_the_stop() {
    let settings = drop_in();
    let reload: Vec<&str> = settings
        .iter()
        .filter(|(k, _)| k == "ExecReload")
        .map(|(_, v)| v.as_str())
        .collect();
    let stop: Vec<&str> = settings
        .iter()
        .filter(|(k, _)| k == "ExecStop")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(reload.len(), 4, "a reset, then three lines: {reload:?}");
    assert_eq!(
        reload[0], "",
        "the unit's own ExecReload lines are reset first"
    );
    // Debian's check and USR2, unchanged around the save.
    let debian = std::fs::read_to_string("/lib/systemd/system/haproxy.service")
        .expect("Debian's haproxy.service (apt-get install -y haproxy)");
    for own in [reload[1], reload[3]] {
        assert!(
            debian.contains(&format!("ExecReload={own}\n")),
            "{own:?} is Debian's"
        );
    }
    for save in [reload[2], stop[0]] {
        assert!(
            save.starts_with("-/usr/local/bin/gitlab-haproxy-agent save-server-state "),
            "{save}"
        );
    }
    assert_eq!(stop.len(), 1, "{stop:?}");

    let rig = Rig::start("drop-in", true);
    let answers = client(rig.front, Arc::clone(&rig.stop));
    for round in 0..2 {
        let before = rig.hap.current_workers();
        let from = Instant::now();
        let mut out = String::new();
        for line in &reload[1..] {
            out += &run_exec(line, &rig).unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(
            out.contains("saved 4 servers of 1 backend"),
            "round {round}: {out}"
        );
        rig.hap.wait_reloaded(&before);
        std::thread::sleep(WINDOW.saturating_sub(from.elapsed()));
        let counts = count_since(&answers, from);
        eprintln!("drop-in reload {round}: {counts:?}");
        assert!(counts.values().sum::<usize>() > 50, "{counts:?}");
        assert_eq!(counts.get("maint"), None, "{counts:?}");
        assert_eq!(counts.get("drain"), None, "{counts:?}");
    }
    std::fs::remove_file(&rig.state_file).unwrap();
    let out = run_exec(stop[0], &rig).unwrap();
    assert!(out.starts_with("saved 4 servers"), "{out}");
    let saved = std::fs::read_to_string(&rig.state_file).unwrap();
    assert!(saved.starts_with("1\n# be_id "), "{saved}");
}

/// systemd reads the drop-in over Debian's unit without a word (an
/// unknown key or a bad line is only a warning there, so it is looked for).
#[test]
fn systemd_reads_the_drop_in_over_debians_unit() {
    let dir = std::env::temp_dir().join(format!("gha-reload-unit-{}", std::process::id()));
    let d = dir.join("haproxy.service.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(
        "/lib/systemd/system/haproxy.service",
        dir.join("haproxy.service"),
    )
    .expect("Debian's haproxy.service (apt-get install -y haproxy)");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("packaging/haproxy.service.d/gitlab-haproxy-agent.conf"),
        d.join("gitlab-haproxy-agent.conf"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.join("haproxy.service"))
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display()))
        .output()
        .expect("systemd-analyze (apt-get install -y systemd)");
    let err = String::from_utf8_lossy(&out.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("gitlab-haproxy-agent.conf"), "{err}");
}

/// The first file: before any save, haproxy warns "Can't open global
/// server state file" at every start, and with `zero-warning` 2.6 and 2.8
/// refuse to start (or pass the reload's check) at all. A file holding the
/// version line alone, as the install docs create it, loads nothing and
/// passes on every line.
#[test]
fn a_version_line_alone_is_a_first_file_every_line_accepts_under_zero_warning() {
    let dir = std::env::temp_dir().join(format!("gha-zero-warning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("server-state");
    let config = dir.join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n    zero-warning\n    server-state-file {}\n\
             defaults\n    mode tcp\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n    load-server-state-from-file global\n\
             frontend fe\n    bind 127.0.0.1:{}\n    default_backend be\n\
             backend be\n    server s1 127.0.0.1:9 weight 100\n",
            state.display(),
            free_port()
        ),
    )
    .unwrap();
    let check = || {
        Command::new(support::haproxy::haproxy_bin())
            .args(["-c", "-q", "-f"])
            .arg(&config)
            .output()
            .unwrap()
    };
    std::fs::write(&state, "1\n").unwrap();
    let out = check();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
