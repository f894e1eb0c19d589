//! The config shapes fleets run, on the haproxy line under test (issue 31,
//! SPEC §2 and §14): the agent settings on the `server` line with no
//! `default-server` before it, on a `default-server` line, and inherited
//! from a `defaults` section's `default-server`; with and without
//! `-reply-up`; a static-algorithm backend; a server added at runtime.
//!
//! haproxy 3.3 and 3.4 (upstream 49a619aca, fixed by 7aec1e6d9) start a
//! server with no `default-server` line before it at agent health 0
//! (`srv_settings_init` leaves `agent.health` 0; only `srv_settings_cpy`
//! from a default-server sets it to `agent.rise`). An agent that never
//! replies `up` then leaves it `DOWN (agent)` for good after maint or a
//! failed health check. The tests show that on those lines, and both ways
//! around it (a `default-server` line, `-reply-up`), on every line; and
//! that `-reply-up` never keeps a server with a failing health check UP.
//!
//! CI runs this file against Debian's 2.6 and upstream 2.8, 3.0, 3.2 and
//! 3.4 (`HAPROXY_BIN`, see `.ci/run`).

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::haproxy::{haproxy_version, Haproxy, RealServer, Row};
use crate::support::{unique_prefix, wait_for, Agent, Kv, BIN};

const SEC: Duration = Duration::from_secs(1);

/// The line under test has the agent-health defect.
fn trap_line() -> bool {
    matches!(haproxy_version().0, (3, 3) | (3, 4))
}

/// The agent settings every shape gives its servers.
fn agent_settings(agent_port: u16) -> String {
    format!("check inter 200ms fall 2 rise 2 weight 100 agent-check agent-addr 127.0.0.1 agent-port {agent_port} agent-inter 100ms")
}

/// Three backends, one server each, agent-checked three ways: `be_line`
/// (settings on the server line, no default-server anywhere), `be_ds`
/// (a default-server line in the backend), `be_inh` (inherited from a
/// `defaults` section's default-server).
fn shapes(agent_port: u16, real: SocketAddr) -> String {
    let settings = agent_settings(agent_port);
    format!(
        "\nbackend be_line\n    server srv1 {real} {settings} agent-send \"be_line/srv1\\n\"\n\
         \nbackend be_ds\n    default-server {settings}\n    server srv1 {real} agent-send \"be_ds/srv1\\n\"\n\
         \ndefaults agentdefs\n    mode tcp\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n    timeout check 1s\n    default-server {settings}\n\
         \nbackend be_inh from agentdefs\n    server srv1 {real} agent-send \"be_inh/srv1\\n\"\n"
    )
}

const SHAPES: [&str; 3] = ["be_line/srv1", "be_ds/srv1", "be_inh/srv1"];

/// The server is left DOWN by the defect: this shape on this line,
/// without `-reply-up`.
fn trapped(id: &str, reply_up: bool) -> bool {
    id == "be_line/srv1" && trap_line() && !reply_up
}

fn agent(kv: &Kv, prefix: &str, reply_up: bool) -> Agent {
    let extra: &[&str] = if reply_up { &["-reply-up"] } else { &[] };
    let a = Agent::with_consul(kv.addr, prefix, extra);
    wait_for(10 * SEC, "agent readiness", || {
        (a.monitoring_get("/-/readiness").0 == 200).then_some(())
    });
    a
}

/// How haproxy shows the agent's answer: `CHECKED` ("No status change")
/// without a health word, `L7OK` ("via agent : up") with `-reply-up`.
fn answered(r: &Row, reply_up: bool) -> bool {
    r.agent_status() == if reply_up { "L7OK" } else { "CHECKED" }
}

/// Leaving maint, then a failed health check that recovers, for each
/// shape: back UP, unless [`trapped`], which stays `DOWN (agent)`.
fn maint_and_health_by_shape(reply_up: bool) {
    let ((major, minor), line) = haproxy_version();
    eprintln!("testing {line}, -reply-up {reply_up}");
    let kv = Kv::dev();
    let prefix = unique_prefix(&format!("shapes-{reply_up}"));
    let a = agent(&kv, &prefix, reply_up);
    let mut real = RealServer::start();
    let addr = real.addr;
    let port = a.listen().port();
    let hap = Haproxy::start_with("shapes", 3, |_| shapes(port, addr));
    for id in SHAPES {
        hap.wait_server(id, "UP, answered", 5 * SEC, |r| {
            r.is_up() && answered(r, reply_up)
        });
    }

    for id in SHAPES {
        kv.put(&format!("{prefix}/{id}"), "maint");
    }
    for id in SHAPES {
        hap.wait_server(id, "MAINT", 3 * SEC, |r| r.status().starts_with("MAINT"));
        kv.delete(&format!("{prefix}/{id}"));
    }
    let left_maint = settle(&hap, reply_up);
    eprintln!("haproxy {major}.{minor} -reply-up {reply_up}: after maint: {left_maint:?}");

    real.down();
    for id in SHAPES {
        // Even with the agent's `up`, a failing health check takes it DOWN.
        hap.wait_server(id, "DOWN (health check failed)", 5 * SEC, |r| {
            r.status().starts_with("DOWN")
        });
    }
    real.up();
    let recovered = settle(&hap, reply_up);
    eprintln!("haproxy {major}.{minor} -reply-up {reply_up}: after the health check recovered: {recovered:?}");
}

/// Waits for each shape's server to come back UP (or, when trapped, to
/// hold `DOWN (agent)` for two seconds); its statuses.
fn settle(hap: &Haproxy, reply_up: bool) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for id in SHAPES {
        if trapped(id, reply_up) {
            hap.wait_server(id, "DOWN (agent)", 5 * SEC, |r| {
                r.status() == "DOWN (agent)"
            });
            hap.hold(id, "DOWN (agent), for good", 2 * SEC, |r| {
                r.status() == "DOWN (agent)"
            });
        } else {
            hap.wait_server(id, "back UP, answered", 5 * SEC, |r| {
                r.status() == "UP" && answered(r, reply_up)
            });
        }
        seen.push((id.to_owned(), hap.server(id).status().to_owned()));
    }
    seen
}

#[test]
fn each_shape_leaves_maint_and_recovers_without_reply_up_except_the_3_4_trap() {
    maint_and_health_by_shape(false);
}

#[test]
fn with_reply_up_every_shape_leaves_maint_and_recovers_and_health_still_counts() {
    maint_and_health_by_shape(true);
}

/// The agent binary with `args`: (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env_remove("GITLAB_HAPROXY_AGENT_LISTEN_ADDR")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `lint-haproxy CONFIG EXTRA...`: (exit code, stdout).
fn lint(config: &std::path::Path, extra: &[&str]) -> (i32, String) {
    let config = config.to_str().unwrap();
    let (code, out, _) = run(&[&["lint-haproxy", config][..], extra].concat());
    (code, out)
}

/// A writer command (`set`, `ramp`, …) against `kv` under `prefix`.
fn write(kv: &Kv, prefix: &str, args: &[&str]) -> (i32, String, String) {
    let consul = format!("http://{}", kv.addr);
    run(&[args, &["-consul-addr", &consul, "-kv-prefix", prefix][..]].concat())
}

/// `lint-haproxy` pointed at the haproxy under test names the trap where
/// that line has it (an error, with both ways around it), nothing on the
/// others; with `-reply-up`, nothing.
#[test]
fn lint_names_the_agent_health_trap_for_the_line_under_test() {
    let dir = std::env::temp_dir().join(format!("gha-lines-lint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("shapes.cfg");
    let body = shapes(9777, "127.0.0.1:80".parse().unwrap());
    std::fs::write(&config, format!("defaults\n    mode tcp\n{body}")).unwrap();
    let bin = support::haproxy::haproxy_bin();
    let bin = bin.to_str().unwrap();
    let listen = ["-listen-addr", "127.0.0.1:9777"];
    let (code, out) = lint(&config, &[&listen[..], &["-haproxy-bin", bin]].concat());
    if trap_line() {
        assert_eq!(code, 1, "{out}");
        let finding: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("agent health 0"))
            .collect();
        assert_eq!(finding.len(), 1, "only the server-line shape: {out}");
        assert!(
            finding[0].contains("be_line/srv1: error:")
                && finding[0].contains("add a default-server line")
                && finding[0].contains("-reply-up"),
            "{out}"
        );
    } else {
        assert_eq!(code, 0, "{out}");
        assert!(!out.contains("agent health 0"), "{out}");
    }
    let (code, out) = lint(
        &config,
        &[&listen[..], &["-haproxy-bin", bin, "-reply-up"]].concat(),
    );
    assert_eq!((code, out.contains("agent health 0")), (0, false), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `balance static-rr` (and map-based hashing) accepts agent weights of
/// 0% and 100% only: `ready 25%` is refused with haproxy's warning and the
/// weight stays; `lint-haproxy` says so for the backend.
#[test]
fn a_static_algorithm_ignores_intermediate_weights_and_the_lint_says_so() {
    let kv = Kv::dev();
    let prefix = unique_prefix("static");
    let a = agent(&kv, &prefix, false);
    let port = a.listen().port();
    let hap = Haproxy::start_with("static", 2, |real| {
        let settings = agent_settings(port);
        format!(
            "\nbackend be_static\n    balance static-rr\n    default-server {settings}\n    server srv1 {real} agent-send \"be_static/srv1\\n\"\n\
             \nbackend be_source\n    balance source\n    default-server {settings}\n    server srv1 {real} agent-send \"be_source/srv1\\n\"\n"
        )
    });
    for be in ["be_static", "be_source"] {
        let id = format!("{be}/srv1");
        hap.wait_server(&id, "UP 100", 5 * SEC, |r| r.is_up() && r.weight() == 100);
        kv.put(&format!("{prefix}/{id}"), "25%");
        // haproxy keeps the agent's warning as the check's last text.
        hap.wait_server(&id, "haproxy's static-algorithm warning", 3 * SEC, |r| {
            r.get("last_agt")
                .contains("agent warns : Backend is using a static LB algorithm")
        });
        hap.hold(&id, "weight 100 (25% refused)", SEC, |r| r.weight() == 100);
        kv.put(&format!("{prefix}/{id}"), "0%");
        hap.wait_server(&id, "weight 0 (0% accepted)", 3 * SEC, |r| r.weight() == 0);
    }
    let (_, out) = lint(&hap.config_path(), &["-listen-addr", "127.0.0.1:9777"]);
    for (be, algorithm) in [
        ("be_static", "balance static-rr"),
        ("be_source", "balance source (hash-type map-based)"),
    ] {
        assert!(
            out.contains(&format!(
                "{be}/srv1: warning: backend {be} uses {algorithm}, a static algorithm"
            )),
            "{out}"
        );
    }

    // The writers given the config refuse what haproxy would ignore, and
    // write nothing; 0% and 100% pass; without the config, a warning.
    let config = hap.config_path();
    let config = config.to_str().unwrap();
    let key = format!("{prefix}/be_static/srv1");
    let set = |value: &str, extra: &[&str]| {
        let word = format!("be_static/srv1={value}");
        write(&kv, &prefix, &[&["set", word.as_str()][..], extra].concat())
    };
    let (code, _, err) = set("25%", &["-haproxy-config", config]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("be_static/srv1 (be_static/srv1 uses balance static-rr)")
            && err.contains("nothing written"),
        "{err}"
    );
    assert_eq!(kv.get(&key).as_deref(), Some("0%"), "nothing written");
    let ramp = [
        "ramp",
        "be_source/srv1",
        "-from",
        "0%",
        "-to",
        "100%",
        "-over",
        "2s",
        "-steps",
        "2",
        "-haproxy-config",
        config,
    ];
    let (code, _, err) = write(&kv, &prefix, &ramp);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("be_source/srv1 uses balance source (hash-type map-based)"),
        "{err}"
    );
    assert_eq!(
        kv.get(&format!("{prefix}/be_source/srv1")).as_deref(),
        Some("0%"),
        "nothing written"
    );
    let (code, _, err) = set("100%", &["-haproxy-config", config]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(
        kv.get(&key).as_deref(),
        Some("ready"),
        "100% is written as ready"
    );
    // Without the flag: GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG (else
    // /etc/haproxy/haproxy.cfg) is read, so the check runs by default; the
    // warning only when no configuration can be read, naming the path.
    let consul = format!("http://{}", kv.addr);
    let by_env = |path: &str| {
        let out = std::process::Command::new(BIN)
            .args(["set", "be_static/srv1=25%", "-consul-addr", &consul])
            .args(["-kv-prefix", &prefix])
            .env("GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG", path)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), err)
    };
    let (code, err) = by_env(config);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("be_static/srv1 uses balance static-rr"),
        "{err}"
    );
    let (code, err) = by_env("/nonexistent/haproxy.cfg");
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: no haproxy configuration read (GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG: cannot read /nonexistent/haproxy.cfg"),
        "{err}"
    );
}

/// A server added at runtime (`add server`) cannot reach this agent:
/// haproxy's CLI does not unescape `\n` in `agent-send`, so the agent gets
/// `...srv9n` with no line end, answers nothing, and names the string in
/// its missing-newline hint (SPEC §2; the README says so).
#[test]
fn a_server_added_at_runtime_sends_no_newline_and_gets_no_answer() {
    let kv = Kv::dev();
    let prefix = unique_prefix("runtime");
    let a = agent(&kv, &prefix, false);
    let port = a.listen().port();
    let hap = Haproxy::start_with("runtime", 1, |real| {
        format!(
            "\nbackend be_rt\n    balance roundrobin\n    default-server inter 1s\n    server srv1 {real} {} agent-send \"be_rt/srv1\\n\"\n",
            agent_settings(port)
        )
    });
    let add = format!(
        "add server be_rt/srv9 127.0.0.1:1 weight 100 agent-check agent-addr 127.0.0.1 agent-port {port} agent-inter 100ms agent-send \"be_rt/srv9\\n\""
    );
    let answer = hap.command(&add);
    assert!(answer.contains("New server registered"), "{answer}");
    let answer = hap.command("enable agent be_rt/srv9");
    assert!(answer.trim().is_empty(), "{answer}");
    // The agent names what it got: the `\n` arrived as a plain `n`.
    let log = a.proc.wait_log("be_rt/srv9n", 5 * SEC);
    assert!(log.contains("newline"), "{log}");
    hap.hold("be_rt/srv9", "no agent answer", SEC, |r| {
        !matches!(r.agent_status(), "CHECKED" | "L7OK")
    });
}
