//! `lint-haproxy` as a real process on configuration files that the real
//! haproxy (`haproxy -c`) accepts: the findings it must report, exactly,
//! the clean file's silence, and the usage error.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::haproxy::{haproxy_bin, haproxy_version};
use crate::support::BIN;

/// A temp dir removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("gha-lint-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Dir(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write fixture");
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What haproxy needs besides the backend (the server state loaded across
/// reloads, as the docs configure it); a frontend so that `-c` exits 0.
const HEAD: &str = "\
global
    server-state-file /var/lib/haproxy/server-state
defaults
    load-server-state-from-file global
    mode tcp
    timeout connect 1s
    timeout client 5s
    timeout server 5s

frontend fe
    bind 127.0.0.1:18080
    default_backend be_web

";

/// Asserts that `haproxy -c -f file` accepts the file (exit 0).
fn haproxy_accepts(file: &Path) {
    let out = Command::new(haproxy_bin())
        .args(["-c", "-f"])
        .arg(file)
        .output()
        .expect("run haproxy -c");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{} rejects {}:\n{}{}",
        haproxy_version().1,
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `gitlab-haproxy-agent lint-haproxy args…`: (code, stdout, stderr).
fn lint(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .arg("lint-haproxy")
        .args(args)
        .env_remove("GITLAB_HAPROXY_AGENT_LISTEN_ADDR")
        .env_remove("GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES")
        .output()
        .expect("run lint-haproxy");
    let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8 output");
    (out.status.code(), text(out.stdout), text(out.stderr))
}

#[test]
fn reports_exactly_the_unweighted_and_the_single_quoted_server() {
    let dir = Dir::new("findings");
    let file = dir.write(
        "haproxy.cfg",
        &format!(
            "{HEAD}backend be_web
    default-server check inter 1s slowstart 10s agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s
    server srv1 127.0.0.1:8081 weight 100 agent-send \"be_web/srv1\\n\"
    server srv2 127.0.0.1:8082 agent-send \"be_web/srv2\\n\"
    server srv3 127.0.0.1:8083 weight 100 agent-send 'be_web/srv3\\n'
    server srv4 127.0.0.1:8084 weight 100 agent-send \"be_web/srv4\\n\"
"
        ),
    );
    haproxy_accepts(&file);
    let (code, out, err) = lint(&[file.as_os_str()]);
    let f = file.display();
    let want = format!(
        "{f}:17: be_web/srv2: error: no weight: haproxy's default weight is 1 and an agent's N% is a share of it (50% of 1 is 0); set one, e.g. weight 100\n\
         {f}:18: be_web/srv3: error: agent-send 'be_web/srv3\\n' is single-quoted: haproxy sends a literal backslash and n, not a newline; use double quotes\n\
         4 servers with agent-check, 2 errors, 0 warnings\n"
    );
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(1), want.as_str(), "")
    );
}

#[test]
fn a_clean_config_exits_0_with_no_finding() {
    let dir = Dir::new("clean");
    let file = dir.write(
        "haproxy.cfg",
        &format!(
            "{HEAD}backend be_web
    server srv1 127.0.0.1:8081 check weight 100 slowstart 10s agent-check agent-addr 127.0.0.1 agent-port 9777 agent-send \"be_web/srv1\\n\" agent-inter 2s
    server srv2 127.0.0.1:8082 check weight 100 slowstart 10s agent-check agent-addr 127.0.0.1 agent-port 9777 agent-send \"be_web/srv2\\n\" agent-inter 2s
    server plain 127.0.0.1:8083 check
"
        ),
    );
    haproxy_accepts(&file);
    let (code, out, err) = lint(&[
        file.as_os_str(),
        "-listen-addr".as_ref(),
        "127.0.0.1:9777".as_ref(),
    ]);
    let want = "2 servers with agent-check, 0 errors, 0 warnings\n";
    assert_eq!((code, out.as_str(), err.as_str()), (Some(0), want, ""));
}

/// One agent-checked server line of `be_web`, all right but for `rest`.
fn server(name: &str, rest: &str) -> String {
    format!("    server {name} 127.0.0.1:8081 check weight 100 slowstart 10s agent-check agent-port 9777 agent-inter 2s {rest}\n")
}

#[test]
fn with_the_wildcard_default_checks_must_go_to_this_host() {
    let dir = Dir::new("wildcard");
    let body = [
        server("srv1", "agent-addr 127.0.0.1 agent-send \"be_web/srv1\\n\""),
        server("srv2", "agent-addr 10.9.9.9 agent-send \"be_web/srv2\\n\""),
        server("srv3", "agent-send \"be_web/srv3\\n\"").replace("127.0.0.1:8081", "10.0.0.1:8081"),
    ]
    .concat();
    let file = dir.write("haproxy.cfg", &format!("{HEAD}backend be_web\n{body}"));
    haproxy_accepts(&file);
    let (code, out, err) = lint(&[file.as_os_str()]);
    let f = file.display();
    let want = format!(
        "{f}:16: be_web/srv2: error: agent checks go to agent-addr 10.9.9.9, not to this host, where the agent listens on :9777\n\
         {f}:17: be_web/srv3: error: agent checks go to the server's address (no agent-addr) 10.0.0.1, not to this host, where the agent listens on :9777\n\
         3 servers with agent-check, 2 errors, 0 warnings\n"
    );
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(1), want.as_str(), "")
    );
}

#[test]
fn an_identity_the_agent_never_answers_is_an_error() {
    let dir = Dir::new("unanswered");
    let body = [
        server(
            "srv1",
            "agent-addr 127.0.0.1 agent-send \"\\nbe_web/srv1\\n\"",
        ),
        server(
            "srv2",
            "agent-addr 127.0.0.1 agent-send \"be_web/srv2\\t1\\n\"",
        ),
    ]
    .concat();
    let file = dir.write("haproxy.cfg", &format!("{HEAD}backend be_web\n{body}"));
    haproxy_accepts(&file);
    let (code, out, _) = lint(&[file.as_os_str()]);
    let f = file.display();
    let want = format!(
        "{f}:15: be_web/srv1: error: agent-send \"\\nbe_web/srv1\\n\": the agent answers nothing for this line (its first line is empty once trimmed), so this server never changes\n\
         {f}:16: be_web/srv2: error: agent-send \"be_web/srv2\\t1\\n\": the agent answers nothing for this line (its first line holds a control byte (below 0x20, or 0x7f)), so this server never changes\n\
         2 servers with agent-check, 2 errors, 0 warnings\n"
    );
    assert_eq!((code, out.as_str()), (Some(1), want.as_str()));
}

#[test]
fn a_directory_is_read_as_haproxy_reads_it() {
    let dir = Dir::new("directory");
    dir.write("10-head.cfg", HEAD);
    let web = server("srv1", "agent-addr 127.0.0.1 agent-send \"be_web/srv1\\n\"");
    dir.write("20-web.cfg", &format!("backend be_web\n{web}"));
    dir.write("20-web.cfg.bak", "backend be_old\n    server x y\n");
    dir.write(".30-hidden.cfg", "backend be_hidden\n    server x y\n");
    let b = server("s", "agent-addr 127.0.0.1").replace("weight 100 ", "");
    dir.write("30-b.cfg", &format!("backend b\n{b}"));
    haproxy_accepts(&dir.0);
    let (code, out, err) = lint(&[dir.0.as_os_str()]);
    let d = dir.0.display();
    let want = format!(
        "{d}/30-b.cfg:2: b/s: error: no weight: haproxy's default weight is 1 and an agent's N% is a share of it (50% of 1 is 0); set one, e.g. weight 100\n\
         {d}/30-b.cfg:2: b/s: error: no agent-send: haproxy sends nothing and the agent never answers; add agent-send \"b/s\\n\"\n\
         2 servers with agent-check, 2 errors, 0 warnings\n"
    );
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(1), want.as_str(), "")
    );
}

/// The game day's fleet-style `conf.d`: `setenv` in a global file and
/// `"${AGENT_PORT}"` in a backend file, which `haproxy -c` accepts, is
/// linted as haproxy reads it (exit 0, no finding); a directory of
/// `*.conf` files only, which haproxy refuses, is exit 1 and said so.
#[test]
fn a_conf_d_with_setenv_reads_as_haproxy_reads_it_and_one_without_cfg_is_an_error() {
    let dir = Dir::new("confd");
    dir.write(
        "00-global.cfg",
        &HEAD.replacen("global\n", "global\n    setenv AGENT_PORT 9777\n", 1),
    );
    let web = server("srv1", "agent-addr 127.0.0.1 agent-send \"be_web/srv1\\n\"")
        .replace("agent-port 9777", "agent-port \"${AGENT_PORT}\"");
    assert!(web.contains("${AGENT_PORT}"), "{web}");
    dir.write("10-web.cfg", &format!("backend be_web\n{web}"));
    haproxy_accepts(&dir.0);
    let (code, out, err) = lint(&[dir.0.as_os_str()]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            Some(0),
            "1 server with agent-check, 0 errors, 0 warnings\n",
            ""
        )
    );
    let conf = Dir::new("confd-conf");
    conf.write("haproxy.conf", HEAD);
    let refused = Command::new(haproxy_bin())
        .args(["-c", "-f"])
        .arg(&conf.0)
        .output()
        .unwrap();
    assert_ne!(refused.status.code(), Some(0), "haproxy refuses it too");
    let (code, out, _) = lint(&[conf.0.as_os_str()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with(&format!(
            "{}: error: this directory holds no *.cfg file",
            conf.0.display()
        )),
        "{out}"
    );
    assert!(
        out.ends_with(
            "0 servers with agent-check, 1 error, 0 warnings
"
        ),
        "the summary counts it: {out}"
    );
}

#[test]
fn a_condition_nested_50000_deep_is_refused_not_a_crash() {
    let dir = Dir::new("deep");
    let deep = format!(
        ".if {}1{}\n.endif\n",
        "(".repeat(50_000),
        ")".repeat(50_000)
    );
    let file = dir.write("haproxy.cfg", &format!("{HEAD}{deep}"));
    let (code, out, err) = lint(&[file.as_os_str()]);
    let want = format!(
        "{}:14: error: haproxy refuses this line: unparsable conditional sub-expression: nested deeper than haproxy's parser allows (MAX_CFG_RECURSION 1024, about 340 parentheses)\n\
         no server with agent-check here: the agent is asked by none of these servers (add agent-check, agent-port and agent-send to those it drives)\n\
         0 servers with agent-check, 1 error, 0 warnings\n",
        file.display()
    );
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(1), want.as_str(), "")
    );
}

#[test]
fn no_file_is_a_usage_error_on_one_line() {
    let (code, out, err) = lint(&[]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert_eq!(
        err,
        "gitlab-haproxy-agent lint-haproxy: no configuration file given (-h for help)\n"
    );
}

/// A backend whose agent-checked servers load no server state gets one
/// warning (a reload would start its drained servers ready), on its first
/// agent-checked server; the same configuration with the two lines gets
/// none.
#[test]
fn a_backend_without_server_state_is_warned_once_at_its_first_server() {
    let dir = Dir::new("server-state");
    let backend = "backend be_web
    default-server check inter 1s weight 100 slowstart 10s agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s
    server plain 127.0.0.1:8080 no-agent-check
    server srv1 127.0.0.1:8081 agent-send \"be_web/srv1\\n\"
    server srv2 127.0.0.1:8082 agent-send \"be_web/srv2\\n\"
";
    let without = HEAD
        .replace("    server-state-file /var/lib/haproxy/server-state\n", "")
        .replace("    load-server-state-from-file global\n", "");
    let file = dir.write("haproxy.cfg", &format!("{without}{backend}"));
    haproxy_accepts(&file);
    let (code, out, _) = lint(&[file.as_os_str()]);
    let lines: Vec<&str> = out.lines().collect();
    let f = file.display();
    assert_eq!(code, Some(0), "a warning: {out}");
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with(&format!(
            "{f}:15: be_web/srv1: warning: backend be_web loads no server state"
        )),
        "{out}"
    );
    assert!(lines[0].contains("save-server-state"), "{out}");
    assert_eq!(lines[1], "2 servers with agent-check, 0 errors, 1 warning");
    let file = dir.write("with.cfg", &format!("{HEAD}{backend}"));
    haproxy_accepts(&file);
    let (code, out, _) = lint(&[file.as_os_str()]);
    assert_eq!(
        (code, out.as_str()),
        (
            Some(0),
            "2 servers with agent-check, 0 errors, 0 warnings\n"
        )
    );
}
