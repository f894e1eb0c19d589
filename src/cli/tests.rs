//! The commands over in-memory stdout, stderr, stdin and environment.

use std::ffi::OsString;

use super::*;

/// Runs `word args…` with `stdin`; (exit code, stdout, stderr).
fn run_with(word: &str, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> (u8, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut input = stdin;
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let code = run(
        word,
        &args,
        &mut Io {
            out: &mut out,
            err: &mut err,
            env: &lookup,
            stdin: &mut input,
            tty: false,
        },
    );
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (code, text(out), text(err))
}

#[test]
fn check_value_prints_the_reply_the_agent_would_write() {
    for (value, reply) in [
        ("drain", "drain 100%\n"),
        (" MAINT\n", "maint 100%\n"),
        ("ready", "ready 100%\n"),
        ("050%", "ready 50%\n"),
        ("256%", "ready 256%\n"),
    ] {
        let (code, out, _) = run_with("check-value", &[value], b"", &[]);
        assert_eq!((code, out.as_str()), (OK, reply), "{value:?}");
    }
    let (_, _, err) = run_with("check-value", &["50%"], b"", &[]);
    assert!(err.contains("explicit weight"), "{err}");
}

#[test]
fn check_value_names_why_a_value_would_be_ignored() {
    for (value, label) in [
        ("-5%", "syntax"),
        ("up", "health_word"),
        ("257%", "out_of_range"),
        ("drain now", "syntax"),
        ("", "syntax"),
    ] {
        let (code, out, _) = run_with("check-value", &[value], b"", &[]);
        assert_eq!(code, FINDING, "{value:?}");
        assert!(
            out.starts_with(&format!("invalid: {label}: ")),
            "{value:?}: {out}"
        );
        assert_eq!(out.lines().count(), 1);
    }
}

#[test]
fn check_value_reads_stdin_for_a_dash() {
    assert_eq!(
        run_with("check-value", &["-"], b"maint\n", &[]).1,
        "maint 100%\n"
    );
    let (code, out, _) = run_with("check-value", &["-"], b"\x00drain", &[]);
    assert_eq!((code, out.as_str()), (FINDING, "invalid: syntax: not one of ready, drain, maint or N% (0 to 256); the agent ignores the key and answers ready 100%\n"));
    let big = vec![b' '; (MAX_STDIN_VALUE + 1) as usize];
    assert_eq!(run_with("check-value", &["-"], &big, &[]).0, USAGE);
}

#[test]
fn usage_errors_are_one_line_and_exit_2() {
    for (word, args) in [
        ("check-value", &[][..]),
        ("check-value", &["a", "b"]),
        ("check-value", &["-nope"]),
        ("ask", &[]),
        ("ask", &["be/s1\nbe/s2"]),
        ("ask", &["be/s1", "-listen-addr", "nonsense"]),
        ("ask", &["be/s1", "-listen-addr="]),
        ("status", &["extra"]),
        ("lint-haproxy", &[]),
        ("lint-haproxy", &["-nope", "f"]),
        ("lint-haproxy", &["f", "-listen-addr"]),
        ("lint-haproxy", &["f", "-listen-addr", "x"]),
        ("lint-haproxy", &["f", "-max-line-bytes", "0"]),
        ("lint-haproxy", &["f", "-max-line-bytes", "x"]),
        ("lint-haproxy", &["/nonexistent/haproxy.cfg"]),
        ("status", &["-pprof-addr"]),
    ] {
        usage_error_of(word, args);
    }
    for args in [
        "-timeout 1s -haproxy-socket /s",
        "be/s1 -haproxy-socket /s",
        "be/s1 -timeout 1s",
        "be/s1 -timeout 0s -haproxy-socket /s",
        "be/s1 -timeout ten -haproxy-socket /s",
        "be/s1 -timeout 1s -interval 10ms -haproxy-socket /s",
        "be/s1 -timeout 1s -haproxy-socket ipv4@1.2.3.4",
        "be/s1 -timeout 1s -prometheus https://p:9090",
        "be/s1 -timeout 1s -haproxy-socket /s -expect-instances 2",
        "be/s1 -timeout 1s -prometheus p:9090 -expect-instances x",
        "be -timeout 1s -haproxy-socket /s",
        "be/s1 -timeout 1s -haproxy-socket /s -haproxy-config /nonexistent.cfg",
    ] {
        let args: Vec<&str> = args.split_whitespace().collect();
        usage_error_of("wait-drained", &args);
    }
}

/// Asserts exit 2, nothing on stdout, one line on stderr.
fn usage_error_of(word: &str, args: &[&str]) {
    let (code, out, err) = run_with(word, args, b"", &[]);
    assert_eq!(code, USAGE, "{word} {args:?}");
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{word} {args:?}: {err}");
    assert!(
        err.starts_with(&format!("gitlab-haproxy-agent {word}: ")),
        "{err}"
    );
}

#[test]
fn each_command_has_help() {
    for word in [
        "ask",
        "check-value",
        "status",
        "lint-haproxy",
        "wait-drained",
    ] {
        let (code, out, _) = run_with(word, &["-h"], b"", &[]);
        assert_eq!(code, OK);
        assert!(
            out.starts_with(&format!("usage: gitlab-haproxy-agent {word}")),
            "{out}"
        );
    }
}

#[test]
fn addresses_come_from_the_flag_then_the_daemons_variable_then_its_default() {
    // Nothing listens on port 1: the error names the address tried.
    let env = [("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "127.0.0.2:1")];
    let (code, _, err) = run_with("ask", &["be/s1"], b"", &env);
    assert_eq!(code, FINDING);
    assert!(err.contains("127.0.0.2:1"), "{err}");
    let (_, _, err) = run_with("ask", &["be/s1", "-listen-addr", ":1"], b"", &env);
    assert!(
        err.contains("127.0.0.1:1"),
        "the flag wins, all interfaces asked on loopback: {err}"
    );
    let env = [("GITLAB_HAPROXY_AGENT_PPROF_ADDR", "127.0.0.3:1")];
    let (code, _, err) = run_with("status", &[], b"", &env);
    assert_eq!(code, FINDING);
    assert!(err.contains("127.0.0.3:1"), "{err}");
}

/// Regression (issue 27): lint-haproxy checked agent-send against 256
/// bytes even for an agent run with a larger -max-line-bytes.
#[test]
fn lint_takes_max_line_bytes_from_the_flag_then_the_environment_then_256() {
    let dir = std::env::temp_dir().join(format!("gha-cli-lint-mlb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("long.cfg");
    let id = format!("be/{}", "x".repeat(297));
    std::fs::write(&file, format!("backend be\n server s1 127.0.0.1:80 weight 100 slowstart 1s agent-check agent-port 9777 agent-inter 1s agent-send \"{id}\\n\"\n")).unwrap();
    let file = file.to_str().unwrap();
    let too_long = "its first line is 300 bytes, over the agent's -max-line-bytes";
    let (code, out, _) = run_with("lint-haproxy", &[file], b"", &[]);
    assert_eq!(code, FINDING);
    assert!(out.contains(&format!("{too_long} 256")), "{out}");
    let env = [("GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES", "300")];
    let (code, out, _) = run_with("lint-haproxy", &[file], b"", &env);
    assert_eq!(code, OK, "the agent's variable: {out}");
    let (code, out, _) = run_with("lint-haproxy", &[file, "-max-line-bytes=299"], b"", &env);
    assert_eq!(code, FINDING, "the flag wins");
    assert!(out.contains(&format!("{too_long} 299")), "{out}");
    let (code, _, err) = run_with(
        "lint-haproxy",
        &[file],
        b"",
        &[("GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES", "0")],
    );
    assert_eq!(code, USAGE);
    assert_eq!(err, "gitlab-haproxy-agent lint-haproxy: invalid value \"0\" for GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES: must be between 1 and 65536 (-h for help)\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lint_takes_the_listen_address_from_each_flag_form_then_the_environment_then_9777() {
    let dir = std::env::temp_dir().join(format!("gha-cli-lint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("listen.cfg");
    std::fs::write(&file, "backend be\n server s1 127.0.0.1:80 weight 100 slowstart 1s agent-check agent-port 9777 agent-inter 1s agent-send \"be/s1\\n\"\n").unwrap();
    let file = file.to_str().unwrap();
    let ok = "1 server with agent-check, 0 errors, 0 warnings\n";
    assert_eq!(
        run_with("lint-haproxy", &[file], b"", &[]),
        (OK, ok.into(), String::new())
    );
    let env = [("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", ":9000")];
    for args in [
        vec!["-listen-addr", ":9000", file],
        vec![file, "-listen-addr=:9000"],
        vec!["--listen-addr", ":9000", file],
        vec!["--", file],
    ] {
        let (code, out, _) = run_with("lint-haproxy", &args, b"", &env);
        assert_eq!(code, FINDING, "{args:?}");
        assert!(
            out.contains("agent-port 9777 does not reach the agent, which listens on :9000"),
            "{out}"
        );
    }
    let (code, ..) = run_with("lint-haproxy", &[file, "-listen-addr", ":9777"], b"", &env);
    assert_eq!(code, OK, "the flag wins over the environment");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wait_drained_names_each_identity_no_server_line_sends() {
    let dir = std::env::temp_dir().join(format!("gha-wd-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("h.cfg");
    std::fs::write(&cfg, "backend be\n server s1 127.0.0.1:80 weight 100 agent-check agent-port 9777 agent-send \"web-1\\n\"\n").unwrap();
    let cfg = cfg.to_str().unwrap();
    let args = [
        "web-1",
        "be/s1",
        "web-9",
        "-timeout",
        "1s",
        "-haproxy-socket",
        "/s",
        "-haproxy-config",
        cfg,
    ];
    let (code, out, err) = run_with("wait-drained", &args, b"", &[]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((code, out.as_str()), (USAGE, ""));
    assert_eq!(
        err,
        format!("gitlab-haproxy-agent wait-drained: no agent-checked server line of {cfg} sends \"be/s1\", \"web-9\" (-h for help)\n")
    );
}
