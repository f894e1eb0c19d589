//! The command line: usage and version, exit codes and the one-line
//! error, the four flag syntaxes and the environment fallbacks, signals, log
//! formats, and the consul token (sent as a header, never logged).

use crate::support;
use crate::support::metrics::errors;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::{
    clean_env, dev_agent, unique_prefix, wait_for, Agent, Kv, Proc, BIN, NO_FIXED_PORTS,
};

/// Runs the binary to completion (killed after 10 s): (exit code, stdout,
/// stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    clean_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), out, err)
}

/// Starts the binary as is (no default flags added) and waits for a stderr
/// line containing `ready_line`.
fn spawn(args: &[&str], env: &[(&str, &str)], ready_line: &str) -> (Proc, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    clean_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let proc = Proc::spawn(cmd);
    let line = proc.wait_log(ready_line, Duration::from_secs(10));
    (proc, line)
}

#[test]
fn help_prints_usage_with_defaults() {
    for flag in ["-h", "-help", "--help"] {
        let (code, out, err) = run(&[flag], &[]);
        assert_eq!(code, Some(0), "{flag}: {err}");
        assert!(
            out.starts_with("Usage: gitlab-haproxy-agent"),
            "{flag}: {out}"
        );
        for default in [
            "(default \":9777\"",
            "(default \":9778\"",
            "(default \"127.0.0.1:9779\"",
            "(default \"127.0.0.1:8500\"",
            "(default \"gitlab-haproxy-agent/state\"",
            "(default \"5s\"",
            "(default \"256\"",
            "(default \"20000\"",
            "(default \"5m\"",
            "(default \"67108864\"",
        ] {
            assert!(
                out.contains(default),
                "{flag}: usage lacks {default}:\n{out}"
            );
        }
        assert!(out.contains("GITLAB_HAPROXY_AGENT_LISTEN_ADDR"), "{out}");
        for command in [
            "ask IDENTITY",
            "check-value VALUE|-",
            "status [",
            "lint-haproxy FILE",
        ] {
            assert!(
                out.contains(command),
                "{flag}: usage lacks {command}:\n{out}"
            );
        }
        assert!(err.is_empty(), "{flag}: {err}");
    }
}

#[test]
fn version_prints_version_and_commit() {
    let (code, out, _) = run(&["-version"], &[]);
    assert_eq!(code, Some(0));
    let line = out.strip_suffix('\n').expect("one line");
    assert!(!line.contains('\n'), "{out:?}");
    let rest = line
        .strip_prefix(&format!(
            "gitlab-haproxy-agent {} (",
            env!("CARGO_PKG_VERSION")
        ))
        .unwrap_or_else(|| panic!("{line}"));
    let commit = rest.strip_suffix(')').unwrap_or_else(|| panic!("{line}"));
    assert!(!commit.is_empty() && !commit.contains(' '), "{line}");
    // Built from a checkout: the commit is a git hash.
    if std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.git")).exists() {
        assert!(
            commit.bytes().all(|b| b.is_ascii_hexdigit()) && commit.len() >= 7,
            "{line}"
        );
    }
}

/// (arguments, environment, what the error line must name).
type BadUsage = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[test]
fn bad_usage_exits_2_with_exactly_one_line() {
    let cases: &[BadUsage] = &[
        (&["-bogus"], &[], "-bogus"),
        (&["--no-such-flag=1"], &[], "no-such-flag"),
        (&["-read-timeout", "5"], &[], "-read-timeout"),
        (&["-read-timeout", "fast"], &[], "-read-timeout"),
        (&["-read-timeout=-1s"], &[], "-read-timeout"),
        (&["-listen-addr", "nonsense"], &[], "-listen-addr"),
        (&["-listen-addr", "127.0.0.1:99999"], &[], "-listen-addr"),
        (
            &["-monitoring-addr", "1.2.3.4.5:1"],
            &[],
            "-monitoring-addr",
        ),
        (&["-consul-addr", "127.0.0.1:notaport"], &[], "-consul-addr"),
        (&["-consul-wait", "11m"], &[], "-consul-wait"),
        (&["-consul-wait", "500ms"], &[], "-consul-wait"),
        (
            &["-consul-addr", "ftp://127.0.0.1:8501"],
            &[],
            "-consul-addr",
        ),
        (
            &[],
            &[("CONSUL_HTTP_ADDR", "ftp://127.0.0.1:8501")],
            "CONSUL_HTTP_ADDR",
        ),
        (
            &[],
            &[("CONSUL_CACERT", "/nonexistent/ca.pem")],
            "CONSUL_CACERT",
        ),
        (&["-consul-ca-path", "/nonexistent"], &[], "-consul-ca-path"),
        (
            &[],
            &[("CONSUL_CLIENT_CERT", "/etc/hostname")],
            "CONSUL_CLIENT_CERT is set without its pair",
        ),
        (&["-max-line-bytes", "0"], &[], "-max-line-bytes"),
        (
            &[],
            &[("GITLAB_HAPROXY_AGENT_READ_TIMEOUT", "soon")],
            "GITLAB_HAPROXY_AGENT_READ_TIMEOUT",
        ),
        (&[], &[("GITLAB_LOG_LEVEL", "loud")], "GITLAB_LOG_LEVEL"),
        (&["stray-argument"], &[], "stray-argument"),
    ];
    for (args, env, names) in cases {
        let mut all: Vec<&str> = NO_FIXED_PORTS.to_vec();
        all.extend_from_slice(args);
        let (code, out, err) = run(&all, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {err}");
        assert_eq!(
            err.lines().count(),
            1,
            "{args:?} {env:?}: exactly one line on stderr, got {err:?}"
        );
        assert!(
            err.ends_with('\n') && err.contains(names),
            "{args:?} {env:?}: {err:?} should name {names}"
        );
        assert!(!err.contains("Usage"), "no usage dump: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
}

#[test]
fn four_flag_syntaxes() {
    for (i, syntax) in [
        "-kv-prefix P",
        "-kv-prefix=P",
        "--kv-prefix P",
        "--kv-prefix=P",
    ]
    .iter()
    .enumerate()
    {
        let prefix = format!("syntax-{i}");
        let words: Vec<String> = syntax
            .replace('P', &prefix)
            .split(' ')
            .map(str::to_owned)
            .collect();
        let timeout = format!("--read-timeout={}ms", 1000 + i);
        let mut args: Vec<&str> = vec!["-dev", "-dev-kv-addr", "127.0.0.1:0", &timeout];
        args.extend(words.iter().map(String::as_str));
        let agent = Agent::start(&args, &[]);
        let line = agent
            .proc
            .wait_log("\"msg\":\"listening\"", Duration::from_secs(1));
        assert!(
            line.contains(&format!("\"kv_prefix\":\"{prefix}\"")),
            "{syntax}: {line}"
        );
        assert!(
            line.contains(&format!("\"read_timeout_ms\":{}", 1000 + i)),
            "{syntax}: {line}"
        );
    }
}

#[test]
fn environment_fallback_and_flag_beats_environment() {
    let dev = [
        "-dev",
        "-dev-kv-addr",
        "127.0.0.1:0",
        "-monitoring-addr",
        "",
        "-pprof-addr",
        "",
    ];
    let env = [
        ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "127.0.0.1:0"),
        ("GITLAB_HAPROXY_AGENT_KV_PREFIX", "from-env"),
    ];
    let (_p, line) = spawn(&dev, &env, "\"msg\":\"listening\"");
    let listen = line
        .split("listen_addr=")
        .nth(1)
        .and_then(|r| r.split([' ', '"']).next())
        .unwrap_or_else(|| panic!("{line}"));
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    assert!(
        addr.ip().is_loopback() && addr.port() != 9777,
        "the variable's address: {line}"
    );
    assert!(line.contains("\"kv_prefix\":\"from-env\""), "{line}");

    let mut args = dev.to_vec();
    args.extend(["-listen-addr", "127.0.0.1:0", "-kv-prefix", "from-flag"]);
    let env = [
        ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "127.0.0.2:0"),
        ("GITLAB_HAPROXY_AGENT_KV_PREFIX", "from-env"),
    ];
    let (_p, line) = spawn(&args, &env, "\"msg\":\"listening\"");
    assert!(
        line.contains("listen_addr=127.0.0.1:") && line.contains("\"kv_prefix\":\"from-flag\""),
        "{line}"
    );
}

#[test]
fn bind_failure_exits_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let taken6 = std::net::TcpListener::bind("[::]:0")
        .or_else(|_| std::net::TcpListener::bind("0.0.0.0:0"))
        .unwrap();
    let any = format!(":{}", taken6.local_addr().unwrap().port());
    // The address as the flag takes it, not a Rust debug name.
    for (flag, value) in [("-listen-addr", &addr), ("-monitoring-addr", &any)] {
        let mut args = vec!["-listen-addr", "127.0.0.1:0", "-monitoring-addr", ""];
        args.extend([
            "-pprof-addr",
            "",
            "-consul-addr",
            "127.0.0.1:1",
            flag,
            value,
        ]);
        let (code, _, err) = run(&args, &[]);
        assert_eq!(code, Some(1), "{err}");
        let want = format!(
            "\"error\":\"cannot listen on {flag} {value}: Address already in use (os error 98)\""
        );
        assert!(err.contains(&want), "{err}");
    }
}

#[test]
fn sigterm_finishes_in_flight_answers_then_exits_0() {
    let mut agent = Agent::dev(&[]);
    let kv = agent.kv();
    kv.put("gitlab-haproxy-agent/state/be/s1", "drain");
    agent.wait_reply("be/s1", "drain 100%", Duration::from_secs(5));
    // A check in flight: connected, half its line sent.
    let mut s = TcpStream::connect(agent.listen()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"be/").unwrap();
    wait_for(
        Duration::from_secs(2),
        "the connection to be open in the agent",
        || (agent.metric("gitlab_haproxy_agent_open_connections") >= 1.0).then_some(()),
    );
    agent.proc.signal(libc::SIGTERM);
    agent
        .proc
        .wait_log("\"msg\":\"shutting down", Duration::from_secs(2));
    // The listener closes right after that line.
    wait_for(Duration::from_secs(2), "new connections refused", || {
        TcpStream::connect_timeout(&agent.listen(), Duration::from_secs(1))
            .is_err()
            .then_some(())
    });
    s.write_all(b"s1\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"drain 100%\n", "the in-flight check is answered");
    let st = agent
        .proc
        .wait_exit(Duration::from_secs(5))
        .expect("exits after SIGTERM");
    assert_eq!(st.code(), Some(0));
}

#[test]
fn text_log_format() {
    let mut args = vec!["-dev", "-dev-kv-addr", "127.0.0.1:0"];
    args.extend(NO_FIXED_PORTS);
    let (proc, line) = spawn(&args, &[("GITLAB_LOG_FORMAT", "text")], "listening");
    assert!(
        !line.starts_with('{') && line.contains("listen_addr=127.0.0.1:"),
        "{line}"
    );
    wait_for(Duration::from_secs(5), "first read line", || {
        proc.log()
            .into_iter()
            .find(|l| l.contains("first consul read complete"))
    });
    for l in proc.log() {
        assert!(
            !l.trim_start().starts_with('{'),
            "a JSON line in text format: {l}"
        );
        // `2026-12-03T09:06:58.928Z`: always three fraction digits.
        let stamp = l.split_whitespace().next().unwrap_or("");
        let shape: String = stamp
            .chars()
            .map(|c| if c.is_ascii_digit() { '9' } else { c })
            .collect();
        assert_eq!(shape, "9999-99-99T99:99:99.999Z", "{l}");
        assert!(
            serde_json::from_str::<serde_json::Value>(&l).is_err(),
            "{l}"
        );
    }
}

#[test]
fn token_is_sent_as_a_header_and_never_logged() {
    const TOKEN: &str = "5e6b1d2c-token-never-logged-9f00";
    let kv = Kv::any();
    let prefix = unique_prefix("token");
    kv.put(&format!("{prefix}/be/s1"), "drain");
    let proxy = Proxy::start(kv.addr);
    let consul = proxy.addr.to_string();
    let args = [
        "-consul-addr",
        consul.as_str(),
        "-kv-prefix",
        &prefix,
        "-consul-wait",
        "1s",
    ];
    let agent = Agent::start(
        &args,
        &[("CONSUL_HTTP_TOKEN", TOKEN), ("GITLAB_LOG_LEVEL", "trace")],
    );
    agent.wait_reply("be/s1", "drain 100%", Duration::from_secs(10));
    kv.put(&format!("{prefix}/be/s1"), "maint");
    agent.wait_reply("be/s1", "maint 100%", Duration::from_secs(5));
    // Errors are logged with consul's explanation: still no token.
    let before = agent.metric(&errors("http_5xx"));
    proxy.set_mode(Mode::Status(500));
    wait_for(Duration::from_secs(5), "a 5xx", || {
        (agent.metric(&errors("http_5xx")) > before).then_some(())
    });
    proxy.set_mode(Mode::Pass);
    wait_for(Duration::from_secs(10), "several requests", || {
        (proxy.requests() >= 4).then_some(())
    });
    for _ in 0..3 {
        assert!(agent.check("be/s1\n").is_some());
    }

    let heads = proxy.request_heads();
    assert!(heads.len() >= 4);
    for h in &heads {
        let header = h.lines().any(|l| {
            let (name, value) = l.split_once(':').unwrap_or(("", ""));
            name.eq_ignore_ascii_case("x-consul-token") && value.trim() == TOKEN
        });
        assert!(header, "X-Consul-Token sent: {h}");
        let target = h.lines().next().unwrap();
        assert!(!target.contains("token="), "never ?token=: {target}");
    }
    let log = agent.proc.log();
    assert!(
        log.iter().any(|l| l.contains("\"level\":\"trace\"")),
        "trace logging is on"
    );
    for l in &log {
        assert!(
            !l.contains(TOKEN) && !l.contains("token-never-logged"),
            "token in a log line: {l}"
        );
    }
}

#[test]
fn token_file_beats_token_variable() {
    let kv = Kv::any();
    let prefix = unique_prefix("token_file");
    let proxy = Proxy::start(kv.addr);
    let file = std::env::temp_dir().join(format!("gha-token-{}", std::process::id()));
    std::fs::write(&file, "file-token-1234\n").unwrap();
    let consul = proxy.addr.to_string();
    let env = [
        ("CONSUL_HTTP_TOKEN", "env-token-5678"),
        ("CONSUL_HTTP_TOKEN_FILE", file.to_str().unwrap()),
    ];
    let agent = Agent::start(
        &["-consul-addr", consul.as_str(), "-kv-prefix", &prefix],
        &env,
    );
    agent.wait_reply("be/s1", "ready 100%", Duration::from_secs(10));
    let _ = std::fs::remove_file(&file);
    let head = proxy.request_heads().into_iter().next().unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("x-consul-token: file-token-1234\r\n"),
        "{head}"
    );
    assert!(!head.contains("env-token-5678"), "{head}");
}

/// An empty token file (a secret that was not mounted) was passed over
/// silently; it still is passed over, as consul's client does, but loudly.
#[test]
fn an_empty_token_file_is_a_warning_naming_it() {
    let kv = Kv::any();
    let file = std::env::temp_dir().join(format!("gha-empty-token-{}", std::process::id()));
    std::fs::write(&file, " \n").unwrap();
    let consul = kv.addr.to_string();
    let agent = Agent::start(
        &["-consul-addr", consul.as_str()],
        &[("CONSUL_HTTP_TOKEN_FILE", file.to_str().unwrap())],
    );
    let want = format!(
        "\"level\":\"warn\",\"msg\":\"CONSUL_HTTP_TOKEN_FILE \\\"{}\\\" is empty: sending no ACL token\"",
        file.display()
    );
    let line = agent.proc.wait_log("is empty", Duration::from_secs(5));
    let _ = std::fs::remove_file(&file);
    assert!(line.contains(&want), "{line}\n{want}");
}

/// The operator commands as processes against a running agent that has no
/// state yet (its consul is down): the answers say why nothing is answered.
#[test]
fn operator_commands_against_an_agent_without_state() {
    let prefix = unique_prefix("operator-nostate");
    let a = Agent::start(&["-consul-addr", "127.0.0.1:1", "-kv-prefix", &prefix], &[]);
    let listen = a.listen().to_string();
    let pprof = a.pprof.unwrap().to_string();
    let (code, out, err) = run(&["ask", "be/s1", "-listen-addr", &listen], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.is_empty());
    assert!(err.contains("closed without answering"), "{err}");
    assert!(err.contains("no complete consul read"), "{err}");
    // Its own consul (down) for the records, never the machine's :8500.
    let consul = ["-consul-addr", "127.0.0.1:1", "-kv-prefix", &prefix];
    let (code, out, _) = run(
        &[&["status", "-pprof-addr", &pprof][..], &consul].concat(),
        &[],
    );
    assert_eq!(code, Some(1));
    assert!(out.starts_with("NOT ANSWERING"), "{out}");
    // The variable the daemon reads names the address too.
    let env = [("GITLAB_HAPROXY_AGENT_PPROF_ADDR", pprof.as_str())];
    let (code, out, _) = run(&[&["status", "-json"][..], &consul].concat(), &env);
    assert_eq!(code, Some(1));
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (doc["ok"].as_bool(), doc["source"].is_null()),
        (Some(false), true)
    );
}

#[test]
fn operator_commands_against_a_synced_agent() {
    let (a, kv) = dev_agent(&[]);
    kv.put("gitlab-haproxy-agent/state/be/s1", "maint");
    a.wait_reply("be/s1", "maint 100%", Duration::from_secs(5));
    let listen = a.listen().to_string();
    let ask = |id: &str| run(&["ask", id, "-listen-addr", &listen], &[]);
    assert_eq!(
        ask("be/s1"),
        (Some(0), "maint 100%\n".into(), String::new())
    );
    assert_eq!(ask("be/none").1, "ready 100%\n");
    // A line the agent refuses: no reply, and why.
    let (code, _, err) = ask("be/\u{1}s1");
    assert_eq!(code, Some(1));
    assert!(err.contains("control byte"), "{err}");
    let long = "x".repeat(300);
    assert_eq!(ask(&long).0, Some(1));
    // check-value from stdin, as a KV-writing tool would pipe it.
    let mut child = Command::new(BIN)
        .args(["check-value", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"up\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("invalid: health_word: "));
    // Asked since its write (the checks here stand in for haproxy).
    let pprof = a.pprof.unwrap().to_string();
    let consul = format!("http://{}", kv.addr);
    let out = wait_for(
        Duration::from_secs(5),
        "status 0: be/s1 asked since its write",
        || {
            a.check("be/s1\n");
            let args = ["status", "-pprof-addr", &pprof, "-consul-addr", &consul];
            let (code, out, _) = run(&args, &[]);
            assert!(!out.contains("UNASKED"), "{out}");
            (code == Some(0)).then_some(out)
        },
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("be/s1") && l.contains("maint 100%")),
        "{out}"
    );
}

/// Issue 34: an ask 100 ms after the write, in the same second, is an ask
/// since the write (the agent orders them by the swap that applied the
/// write, not by whole seconds). Three writes, so that at least one ask
/// falls in the second of its write.
#[test]
fn status_counts_an_ask_in_the_second_of_the_write_as_asked() {
    let (a, kv) = dev_agent(&[]);
    let pprof = a.pprof.unwrap().to_string();
    let consul = format!("http://{}", kv.addr);
    for value in ["drain", "maint", "drain"] {
        kv.put("gitlab-haproxy-agent/state/be/s1", value);
        std::thread::sleep(Duration::from_millis(100));
        let want = format!("{value} 100%");
        wait_for(Duration::from_secs(5), "the write applied", || {
            (a.check("be/s1\n").as_deref() == Some(want.as_str())).then_some(())
        });
        let args = ["status", "-pprof-addr", &pprof, "-consul-addr", &consul];
        let (code, out, _) = run(&args, &[]);
        assert!(!out.contains("WAITING"), "{value}: {out}");
        assert_eq!(code, Some(0), "{value}: {out}");
    }
}

/// SPEC §13, the whole loop an incident runs: `set ... -reason INC-123
/// -for 2s` (the record and the expiry in Flags), `status` (BY, REASON,
/// UNTIL), the expiry passing (the metric, one warning, `/debug/state`,
/// `status` exit 1 with EXPIRED, and still answered `drain`: the agent
/// never acts on it), a raw put without `-flags` (clears it, as consul's
/// `api/kv.go` Put sends Flags 0 when unset: "changed outside the
/// writers"), a raw put with `?flags=` (counts the same), and `unset`.
#[test]
fn the_incident_loop_set_with_a_reason_and_an_expiry_status_the_alert_metric_and_unset() {
    let (a, kv) = dev_agent(&[]);
    let consul = format!("http://{}", kv.addr);
    let pprof = a.pprof.unwrap().to_string();
    let id = "be/s1";
    let writer = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-consul-addr", consul.as_str()]);
        run(&all, &[("USER", "alice")])
    };
    let status = |json: bool| {
        let mut args = vec![
            "status",
            "-pprof-addr",
            pprof.as_str(),
            "-consul-addr",
            consul.as_str(),
        ];
        if json {
            args.push("-json");
        }
        run(&args, &[])
    };
    // Long enough for the writer, a check and `status` to run before it
    // expires on a busy machine (the expiry is counted in whole seconds).
    let (code, out, err) = writer(&["set", "be/s1=drain", "-reason", "INC-123", "-for", "6s"]);
    assert_eq!(code, Some(0), "{out}{err}");
    a.wait_reply(id, "drain 100%", Duration::from_secs(5));
    a.check("be/s1\n");
    let (_, out, _) = status(false);
    let row = out
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("alice@") && row.contains("INC-123") && row.contains(" in "),
        "{out}"
    );
    assert_eq!(a.metric("gitlab_haproxy_agent_state_expired_keys"), 0.0);
    // Past it: counted on the one deadline, warned once, still drain.
    let warned = a.proc.wait_log("past its expiry", Duration::from_secs(15));
    assert!(
        warned.contains("\"level\":\"warn\"") && warned.contains("be/s1"),
        "{warned}"
    );
    assert_eq!(a.metric("gitlab_haproxy_agent_state_expired_keys"), 1.0);
    assert_eq!(
        a.check("be/s1\n").as_deref(),
        Some("drain 100%"),
        "never acted on"
    );
    let (code, out, _) = status(false);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("EXPIRED ") && out.contains("1 past its expiry"),
        "{out}"
    );
    let (code, out, _) = status(true);
    assert_eq!(code, Some(1));
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = &doc["diverted"][0];
    assert_eq!(
        (row["expired"].as_bool(), row["record"].as_str()),
        (Some(true), Some("written"))
    );
    assert_eq!(row["reason"], "INC-123");
    assert!(row["until_unix_seconds"].as_u64().is_some(), "{row}");
    std::thread::sleep(Duration::from_millis(1100));
    let warnings = a
        .proc
        .log()
        .iter()
        .filter(|l| l.contains("past its expiry"))
        .count();
    assert_eq!(warnings, 1, "one warning per key");
}

/// Raw writes after a writer's (SPEC §13): a put without `-flags` clears
/// the expiry (consul's `api/kv.go` Put sends the pair's Flags, 0 when
/// unset) and leaves the record older than the key; a put with `?flags=`
/// counts as `-for` does; `unset` deletes the key and its record.
#[test]
fn raw_puts_clear_or_set_the_expiry_and_status_says_the_key_changed_outside_the_writers() {
    let (a, kv) = dev_agent(&[]);
    let consul = format!("http://{}", kv.addr);
    let pprof = a.pprof.unwrap().to_string();
    let (id, key) = ("be/s1", "gitlab-haproxy-agent/state/be/s1");
    let writer = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-consul-addr", consul.as_str()]);
        run(&all, &[("USER", "alice")])
    };
    let (code, out, err) = writer(&["set", "be/s1=drain", "-reason", "INC-123", "-for", "1h"]);
    assert_eq!(code, Some(0), "{out}{err}");
    a.wait_reply(id, "drain 100%", Duration::from_secs(5));
    // A raw put without -flags clears the expiry and outdates the record.
    kv.put(key, "maint");
    a.wait_reply(id, "maint 100%", Duration::from_secs(5));
    wait_for(Duration::from_secs(5), "the count after the swap", || {
        (a.metric("gitlab_haproxy_agent_state_expired_keys") == 0.0).then_some(())
    });
    let (_, out, _) = run(
        &["status", "-pprof-addr", &pprof, "-consul-addr", &consul],
        &[],
    );
    assert!(out.contains("changed outside the writers"), "{out}");
    assert!(out.contains("the record says until"), "{out}");
    // A raw put with -flags (an expiry already past) counts the same.
    let past = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 60;
    let (st, _) = support::http(
        kv.addr,
        "PUT",
        &format!("/v1/kv/{key}?flags={past}"),
        b"drain",
    )
    .unwrap();
    assert_eq!(st, 200);
    wait_for(Duration::from_secs(5), "expired again", || {
        (a.metric("gitlab_haproxy_agent_state_expired_keys") == 1.0).then_some(())
    });
    let (_, body) = support::http(a.pprof.unwrap(), "GET", "/debug/state?diverted", b"").unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["state"]["identities"][id]["expires_unix_seconds"], past);
    assert_eq!(doc["expiry"]["expired_keys"], 1);
    // unset: the key and its record go; nothing expired remains.
    let (code, out, err) = writer(&["unset", id]);
    assert_eq!(code, Some(0), "{out}{err}");
    wait_for(Duration::from_secs(5), "no expired key", || {
        (a.metric("gitlab_haproxy_agent_state_expired_keys") == 0.0).then_some(())
    });
    assert_eq!(kv.get("gitlab-haproxy-agent/meta/be/s1"), None);
}
