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

/// Every row of the command table is a command (the first word), listed
/// by the top-level `-h`, and answers its own `-h`.
#[test]
fn each_command_has_help() {
    let listed = commands_help();
    for word in TABLE.iter().map(|c| c.name) {
        assert!(is_command(word), "{word}");
        assert!(listed.contains(&format!("\n  {word} ")), "{listed}");
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

/// Issue 39: lint-haproxy printed configuration names raw and read
/// `/dev/zero` until out of memory.
#[test]
fn lint_shows_configuration_names_escaped_and_reads_only_regular_files() {
    let dir = std::env::temp_dir().join(format!("gha-cli-lint-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("evil.cfg");
    std::fs::write(&file, "backend be\x1b]52;c;ZXZpbA==\x07\u{9b}2J\u{202e}\n server s\u{200b}1 127.0.0.1:80 weight 100 agent-check agent-port 9777 agent-inter 1s agent-send \"be\x1b[2J/s1\\n\"\n").unwrap();
    let (_, out, _) = run_with("lint-haproxy", &[file.to_str().unwrap()], b"", &[]);
    assert!(
        !out.chars()
            .any(|c| c != '\n' && c != '\t' && crate::safe::hidden(c)),
        "{out:?}"
    );
    assert!(out.contains("\\u001b"), "{out}");
    let t = std::time::Instant::now();
    let (code, _, err) = run_with("lint-haproxy", &["/dev/zero"], b"", &[]);
    assert_eq!(code, USAGE, "{err}");
    assert!(err.contains("/dev/zero: not a regular file"), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(2));
    std::fs::remove_dir_all(&dir).unwrap();
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
    std::fs::write(&file, "backend be\n load-server-state-from-file local\n server s1 127.0.0.1:80 weight 100 slowstart 1s agent-check agent-port 9777 agent-inter 1s agent-send \"be/s1\\n\"\n").unwrap();
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

/// A haproxy CLI stand-in on a unix socket in `dir`: each connection's
/// command (read to the half-close) gets `answer(command)`; `None` holds
/// the connection open without a word.
fn cli_stand_in(
    dir: &std::path::Path,
    name: &str,
    answer: impl Fn(&str) -> Option<Vec<u8>> + Send + 'static,
) -> String {
    use std::io::{Read, Write};
    let path = dir.join(name);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut command = String::new();
            let _ = conn.read_to_string(&mut command);
            match answer(command.trim_end()) {
                Some(bytes) => {
                    let _ = conn.write_all(&bytes);
                }
                None => std::thread::sleep(std::time::Duration::from_secs(5)),
            }
        }
    });
    path.display().to_string()
}

const SERVERS_STATE: &str = "1\n# be_id be_name srv_id srv_name srv_admin_state\n2 be_web 1 srv1 8\n2 be_web 2 srv2 0\n3 be_api 1 a1 1\n\n";
const SHOW_PROC: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>\n100 master 1 0d00h00m09s 2.6.12\n# workers\n300 worker 0 0d00h00m01s 2.6.12\n# old workers\n200 worker 1 0d00h00m08s 2.6.12\n# programs\n\n";

fn save_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gha-save-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names in `dir` (a temporary file left behind shows here).
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn save_server_state_writes_the_current_workers_answer_and_keeps_the_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = save_dir("ok");
    let master = cli_stand_in(&dir, "master.sock", |command| match command {
        "show proc" => Some(SHOW_PROC.into()),
        "@!300 show servers state" => Some(SERVERS_STATE.into()),
        // The old worker's state is not the one to keep.
        "@!200 show servers state" => Some(b"1\n# be_id be_name\n9 old\n\n".to_vec()),
        _ => Some(b"Unknown command.\n\n".to_vec()),
    });
    let file = dir.join("server-state");
    let path = file.to_str().unwrap();
    let (code, out, err) = run_with(
        "save-server-state",
        &["-haproxy-master-socket", &master, "-o", path],
        b"",
        &[],
    );
    assert_eq!((code, err.as_str()), (OK, ""), "{out}");
    assert!(
        out.starts_with(&format!(
            "saved 3 servers of 2 backends from haproxy worker 300 ({master}) to {path} in "
        )),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), SERVERS_STATE);
    let mode = |f: &std::path::Path| std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o644, "a new file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let stats = cli_stand_in(&dir, "stats.sock", |command| match command {
        "show info" => Some(b"Name: HAProxy\nPid: 4242\n\n".to_vec()),
        "show servers state" => Some(SERVERS_STATE.replace("srv2 0", "srv2 8").into_bytes()),
        _ => None,
    });
    let (code, out, _) = run_with(
        "save-server-state",
        &["-haproxy-socket", &stats, "-o", path],
        b"",
        &[],
    );
    assert_eq!(code, OK, "{out}");
    assert!(out.contains("from haproxy worker 4242 ("), "{out}");
    assert!(std::fs::read_to_string(&file).unwrap().contains("srv2 8"));
    assert_eq!(mode(&file), 0o640, "the mode is kept");
    // The owner too, when the saver may (root, as the haproxy unit runs it):
    // haproxy, not the saver, reads the file.
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        let (code, out, _) = run_with(
            "save-server-state",
            &["-haproxy-socket", &stats, "-o", path],
            b"",
            &[],
        );
        assert_eq!(code, OK, "{out}");
        let m = std::fs::metadata(&file).unwrap();
        assert_eq!((m.uid(), m.gid(), mode(&file)), (65534, 65534, 0o640));
    }
    assert_eq!(names(&dir), ["master.sock", "server-state", "stats.sock"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn save_server_state_leaves_the_file_as_it_was_on_any_bad_answer() {
    let dir = save_dir("bad");
    let file = dir.join("server-state");
    let path = file.to_str().unwrap().to_owned();
    let before = "1\n# be_id be_name\n2 kept\n\n";
    std::fs::write(&file, before).unwrap();
    let half = &SERVERS_STATE[..SERVERS_STATE.len() / 2];
    let cases: Vec<(&str, Option<Vec<u8>>, &str)> = vec![
        (
            "garbage.sock",
            Some(b"\x1b[2Jwhat?\n\n".to_vec()),
            "not a show servers state answer: \"\\x1b[2Jwhat?\"",
        ),
        ("empty.sock", Some(Vec::new()), "an empty answer"),
        (
            "half.sock",
            Some(half.as_bytes().to_vec()),
            "the show servers state answer was cut short",
        ),
        (
            "none.sock",
            Some(b"1\n# be_id be_name srv_id\n\n".to_vec()),
            "lists no server",
        ),
        (
            "rows.sock",
            Some(b"1\n# be_id be_name srv_id\n2 be\n\n".to_vec()),
            "a row of 2 fields where the header names 3",
        ),
        ("silent.sock", None, "no complete answer in time"),
    ];
    for (name, answer, why) in cases {
        let socket = cli_stand_in(&dir, name, move |command| match command {
            "show info" => Some(b"Name: HAProxy\nPid: 1\n\n".to_vec()),
            _ => answer.clone(),
        });
        let started = std::time::Instant::now();
        let (code, out, err) = run_with(
            "save-server-state",
            &["-haproxy-socket", &socket, "-o", &path, "-timeout", "300ms"],
            b"",
            &[],
        );
        assert_eq!((code, out.as_str()), (FINDING, ""), "{name}: {err}");
        assert!(
            err.contains(why) && err.ends_with(&format!("; {path} left as it was\n")),
            "{name}: {err}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{name}: bounded by -timeout"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "{name}");
    }
    let (code, _, err) = run_with(
        "save-server-state",
        &[
            "-haproxy-socket",
            &format!("{}/gone.sock", dir.display()),
            "-o",
            &path,
        ],
        b"",
        &[],
    );
    assert_eq!(code, FINDING, "{err}");
    assert!(err.contains("cannot connect"), "{err}");
    // A master that lists only old workers, and one that reloads while asked.
    let only_old = cli_stand_in(&dir, "old.sock", |command| match command {
        "show proc" => Some(
            SHOW_PROC
                .replace(
                    "# workers\n300 worker 0 0d00h00m01s 2.6.12\n",
                    "# workers\n",
                )
                .into_bytes(),
        ),
        _ => Some(SERVERS_STATE.into()),
    });
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reloading = cli_stand_in(&dir, "reloading.sock", move |command| match command {
        "show proc" if asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 => {
            Some(SHOW_PROC.into())
        }
        "show proc" => Some(SHOW_PROC.replace("300 worker", "400 worker").into_bytes()),
        _ => Some(SERVERS_STATE.into()),
    });
    for (socket, why) in [
        (only_old, "only old workers"),
        (
            reloading,
            "a reload while saving: worker 300 answered, 400 is current now",
        ),
    ] {
        let (code, _, err) = run_with(
            "save-server-state",
            &["-haproxy-master-socket", &socket, "-o", &path],
            b"",
            &[],
        );
        assert_eq!(code, FINDING, "{err}");
        assert!(err.contains(why), "{err}");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    let left = names(&dir);
    assert!(
        left.iter()
            .all(|n| n == "server-state" || n.ends_with(".sock")),
        "no temporary file: {left:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn save_server_state_finds_the_file_in_haproxys_configuration() {
    let dir = save_dir("config");
    let socket = cli_stand_in(&dir, "stats.sock", |command| match command {
        "show info" => Some(b"Name: HAProxy\nPid: 7\n\n".to_vec()),
        _ => Some(SERVERS_STATE.into()),
    });
    let config = dir.join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n    server-state-base {}\n    server-state-file state\n",
            dir.display()
        ),
    )
    .unwrap();
    let save = || {
        let config = config.to_str().unwrap();
        run_with(
            "save-server-state",
            &["-haproxy-socket", &socket, "-haproxy-config", config],
            b"",
            &[],
        )
    };
    let (code, out, err) = save();
    assert_eq!(code, OK, "{err}");
    assert!(
        out.contains(&format!("to {}/state in ", dir.display())),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("state")).unwrap(),
        SERVERS_STATE
    );
    // A name from the configuration is outside text: shown escaped.
    let hostile = format!("{}/a\u{1b}]0;PWNED\u{7}", dir.display());
    std::fs::write(
        &config,
        format!("global\n    server-state-file \"{hostile}\"\n"),
    )
    .unwrap();
    let (code, out, _) = save();
    assert_eq!(code, OK);
    assert!(
        out.contains("/a\\u001b]0;PWNED\\u0007 in ") && !out.contains('\u{1b}'),
        "{out}"
    );
    std::fs::write(&config, "global\n    maxconn 10\n").unwrap();
    let config = config.to_str().unwrap();
    let relative = dir.join("relative.cfg");
    std::fs::write(&relative, "global\n    server-state-file state\n").unwrap();
    let relative = relative.to_str().unwrap().to_owned();
    let conditional = dir.join("conditional.cfg");
    std::fs::write(&conditional, "global\n.if version_atleast(3.0)\n    server-state-file /a\n.else\n    server-state-file /b\n.endif\n").unwrap();
    let conditional = conditional.to_str().unwrap().to_owned();
    let usage: [(&[&str], &str); 8] = [
        (
            &["-haproxy-socket", &socket, "-haproxy-config", config],
            "sets no server-state-file in global: give -o FILE",
        ),
        (&["-o", "x"], "give exactly one source"),
        (
            &[
                "-haproxy-socket",
                &socket,
                "-haproxy-master-socket",
                &socket,
                "-o",
                "x",
            ],
            "give exactly one source",
        ),
        (
            &[
                "-haproxy-socket",
                &socket,
                "-o",
                "x",
                "-haproxy-config",
                config,
            ],
            "not both",
        ),
        (
            &["-haproxy-socket", &socket, "-o", "x", "-timeout", "0s"],
            "invalid value \"0s\" for flag -timeout",
        ),
        (
            &[
                "-haproxy-socket",
                &socket,
                "-haproxy-config",
                "/nonexistent.cfg",
            ],
            "cannot read /nonexistent.cfg",
        ),
        (
            &["-haproxy-socket", &socket, "-haproxy-config", &relative],
            "server-state-file state is relative and no server-state-base",
        ),
        (
            &["-haproxy-socket", &socket, "-haproxy-config", &conditional],
            "is under an .if the lint cannot evaluate (feature, version, enabled): give -o FILE",
        ),
    ];
    for (args, why) in usage {
        let (code, _, err) = run_with("save-server-state", args, b"", &[]);
        assert_eq!(code, USAGE, "{args:?}: {err}");
        assert!(
            err.starts_with("gitlab-haproxy-agent save-server-state: ") && err.contains(why),
            "{args:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_prometheus_url_with_credentials_is_refused_without_showing_them() {
    let (code, _, err) = run_with(
        "wait-drained",
        &[
            "x/y",
            "-timeout",
            "1s",
            "-prometheus",
            "http://bob:hunter2pw@127.0.0.1:9",
        ],
        b"",
        &[],
    );
    assert_eq!(code, USAGE, "{err}");
    assert!(
        !err.contains("hunter2pw") && !err.contains("CONSUL_HTTP_AUTH"),
        "{err}"
    );
    assert!(err.contains("for flag -prometheus: credentials"), "{err}");
}

/// The table is the one source of each command's words: its `-h` is the
/// row's help, and every flag the row walks is one the help names.
#[test]
fn every_row_helps_with_the_flags_it_takes() {
    for c in TABLE {
        let (code, out, err) = run_with(c.name, &["-h"], b"", &[]);
        assert_eq!((code, err.as_str()), (OK, ""), "{}", c.name);
        assert_eq!(out, c.help, "{}", c.name);
        assert!(
            out.starts_with(&format!("usage: gitlab-haproxy-agent {}", c.name)),
            "{out}"
        );
        let flags = c.flags.values.iter().flat_map(|g| g.iter());
        for flag in flags.chain(c.flags.bools) {
            assert!(
                out.contains(&format!("-{flag}")),
                "{}: -{flag} unnamed in its help",
                c.name
            );
        }
        assert!(is_command(c.name));
        assert!(commands_help().contains(&format!("  {} {}\n", c.name, c.synopsis)));
    }
    let (code, _, err) = run_with("ask", &["-consul-addr", "c:8500", "be/s1"], b"", &[]);
    assert_eq!(code, USAGE);
    assert_eq!(
        err,
        "gitlab-haproxy-agent ask: flag provided but not defined: -consul-addr (-h for help)\n"
    );
}
