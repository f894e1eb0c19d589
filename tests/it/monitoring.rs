//! Observability end to end (issue 3): the exposition after real
//! traffic passes `promtool check metrics`, counters move with the fixed
//! label values, readiness follows the first consul read, staleness grows
//! during an outage, `/debug/state` shows the new state and never the
//! token, logs stay one JSON object per line.
//!
//! The rules and dashboard of monitoring/ pass promtool and name real
//! metrics (tests/it/prometheus.rs runs them on a real Prometheus).
//!
//! Every test starts its own agent and dev KV on ports the OS picks, so they
//! run in parallel.

use crate::support;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{
    free_port, http, http_full, metric_value, unique_prefix, wait_for, Agent, Kv,
};

const P: &str = "gitlab_haproxy_agent_";

fn promtool() -> std::path::PathBuf {
    support::prometheus::tool("promtool")
}

/// `promtool check metrics` on `text`: (success, everything it printed).
fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn scrape(agent: &Agent) -> String {
    let (st, text) = agent.monitoring_get("/-/metrics");
    assert_eq!(st, 200);
    text
}

fn value(text: &str, series: &str) -> f64 {
    metric_value(text, series).unwrap_or_else(|| panic!("{series} not in the exposition:\n{text}"))
}

fn outcome(text: &str, label: &str) -> f64 {
    value(text, &format!("{P}requests_total{{outcome=\"{label}\"}}"))
}

fn consul_errors(text: &str) -> f64 {
    [
        "connect",
        "timeout",
        "reset",
        "http_4xx",
        "http_5xx",
        "bad_index",
        "bad_body",
        "too_large",
        "tls",
    ]
    .iter()
    .map(|r| value(text, &format!("{P}consul_errors_total{{reason=\"{r}\"}}")))
    .sum()
}

/// Connects, sends `bytes`, optionally half-closes, reads to EOF: the reply.
fn raw(addr: SocketAddr, bytes: &[u8], half_close: bool) -> Vec<u8> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    if half_close {
        s.shutdown(Shutdown::Write).unwrap();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

fn debug_state(agent: &Agent) -> (String, serde_json::Value) {
    let (st, body) = http(
        agent.pprof.expect("pprof enabled"),
        "GET",
        "/debug/state",
        b"",
    )
    .expect("pprof answers");
    assert_eq!(st, 200);
    let body = String::from_utf8(body).unwrap();
    let doc = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("/debug/state is not JSON ({e}):\n{body}"));
    (body, doc)
}

#[test]
fn scrape_after_real_traffic_passes_promtool_and_counts_each_outcome() {
    let kv = Kv::dev();
    let prefix = unique_prefix("promtool");
    kv.put(&format!("{prefix}/be/drain"), "drain");
    kv.put(&format!("{prefix}/be/maint"), "maint");
    kv.put(&format!("{prefix}/be/bad"), "up");
    let agent = Agent::with_consul(kv.addr, &prefix, &["-read-timeout", "200ms"]);
    agent.wait_reply("be/drain", "drain 100%", Duration::from_secs(10));
    agent.wait_reply("be/maint", "maint 100%", Duration::from_secs(5));
    let before = scrape(&agent);

    let addr = agent.listen();
    assert_eq!(agent.check("be/other\n").as_deref(), Some("ready 100%"));
    assert_eq!(agent.check("be/drain\n").as_deref(), Some("drain 100%"));
    assert_eq!(agent.check("be/maint\r\n").as_deref(), Some("maint 100%"));
    let long = format!("{}\n", "a".repeat(300));
    assert_eq!(agent.check(&long), None, "too long");
    assert_eq!(agent.check("be/\x01x\n"), None, "control byte");
    assert_eq!(agent.check("  \n"), None, "empty");
    assert!(raw(addr, b"", false).is_empty(), "timeout: nothing sent");
    assert!(
        raw(addr, b"be/drain", false).is_empty(),
        "no newline, then timeout"
    );
    assert!(
        raw(addr, b"", true).is_empty(),
        "peer closed without a byte"
    );
    let after = scrape(&agent);

    let delta = |label: &str| outcome(&after, label) - outcome(&before, label);
    for label in [
        "ready",
        "drain",
        "maint",
        "too_long",
        "control_byte",
        "empty",
        "timeout",
        "no_newline",
        "peer_closed",
    ] {
        assert_eq!(delta(label), 1.0, "outcome {label}");
    }
    assert_eq!(delta("not_synced"), 0.0);
    assert_eq!(delta("io_error"), 0.0);
    let hist = |t: &str, s: &str| value(t, &format!("{P}request_duration_seconds{s}"));
    assert_eq!(
        hist(&after, "_count") - hist(&before, "_count"),
        3.0,
        "replies only are timed"
    );
    assert_eq!(hist(&after, "_bucket{le=\"+Inf\"}"), hist(&after, "_count"));
    assert!(hist(&after, "_sum") > hist(&before, "_sum"));
    assert_eq!(value(&after, &format!("{P}state_keys")), 2.0);
    assert_eq!(
        value(
            &after,
            &format!("{P}state_invalid_keys{{reason=\"health_word\"}}")
        ),
        1.0
    );
    assert!(
        value(
            &after,
            &format!("{P}invalid_values_total{{reason=\"health_word\"}}")
        ) >= 1.0
    );
    assert_eq!(value(&after, &format!("{P}synced")), 1.0);
    assert_eq!(value(&after, &format!("{P}open_connections")), 0.0);
    assert!(value(&after, &format!("{P}consul_index")) > 0.0);
    assert!(value(&after, &format!("{P}consul_requests_total")) >= 1.0);
    // The dev KV answers as a leader does.
    assert!(value(&after, &format!("{P}consul_received_bytes_total")) > 100.0);
    assert_eq!(
        value(&after, &format!("{P}consul_last_contact_seconds")),
        0.0
    );
    assert_eq!(value(&after, &format!("{P}consul_known_leader")), 1.0);
    assert_eq!(
        value(&after, &format!("{P}consul_stale_reasked_total")),
        0.0
    );
    assert!(value(&after, &format!("{P}state_swaps_total")) >= 1.0);
    assert!(value(&after, &format!("{P}state_last_change_timestamp_seconds")) > 1.6e9);
    assert_eq!(value(&after, &format!("{P}poll_errors_total")), 0.0);
    for m in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(value(&after, m) >= 0.0, "{m}");
    }
    assert!(after
        .lines()
        .any(|l| l.starts_with(&format!("{P}build_info{{version=\"")) && l.ends_with("} 1")));

    let (ok, said) = promtool_check(&after);
    assert!(
        ok && said.trim().is_empty(),
        "promtool check metrics:\n{said}\non:\n{after}"
    );

    // HELP and TYPE once per family, HELP first.
    let mut types = HashSet::new();
    let mut helps = HashSet::new();
    for l in after.lines() {
        if let Some(name) = l.strip_prefix("# HELP ").and_then(|r| r.split(' ').next()) {
            assert!(helps.insert(name.to_owned()), "HELP {name} twice");
        }
        if let Some(name) = l.strip_prefix("# TYPE ").and_then(|r| r.split(' ').next()) {
            assert!(helps.contains(name), "TYPE {name} before its HELP");
            assert!(types.insert(name.to_owned()), "TYPE {name} twice");
        }
    }
    assert_eq!(helps, types);

    // The missing-newline hint names the bytes, and every log line is one
    // JSON object with time, level and msg first.
    agent
        .proc
        .wait_log("\"received\":\"be/drain\"", Duration::from_secs(2));
    for line in agent.proc.log() {
        assert!(line.starts_with("{\"time\":\""), "{line}");
        let doc: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let time = doc["time"].as_str().unwrap();
        assert!(
            time.len() == 24 && time.ends_with('Z') && &time[10..11] == "T" && &time[19..20] == ".",
            "{time}"
        );
        assert!(
            ["trace", "debug", "info", "warn", "error"].contains(&doc["level"].as_str().unwrap()),
            "{line}"
        );
        assert!(doc["msg"].is_string(), "{line}");
    }
}

#[test]
fn readiness_is_503_before_the_first_read_and_200_after() {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let prefix = unique_prefix("ready");
    let agent = Agent::with_consul(addr, &prefix, &[]);
    let (st, body) = agent.monitoring_get("/-/readiness");
    assert_eq!(st, 503, "{body}");
    assert_eq!(agent.monitoring_get("/-/liveness").0, 200);
    assert_eq!(agent.check("be/a\n"), None, "no answer before a first read");
    wait_for(Duration::from_secs(10), "a counted connect error", || {
        let t = scrape(&agent);
        (value(&t, &format!("{P}consul_errors_total{{reason=\"connect\"}}")) >= 1.0).then_some(())
    });
    let t = scrape(&agent);
    assert_eq!(value(&t, &format!("{P}synced")), 0.0);
    assert_eq!(outcome(&t, "not_synced"), 1.0);
    assert_eq!(
        value(&t, &format!("{P}consul_last_success_age_seconds")),
        -1.0
    );
    assert!(value(&t, &format!("{P}consul_consecutive_failures")) >= 1.0);
    let (promtool_ok, said) = promtool_check(&t);
    assert!(promtool_ok && said.trim().is_empty(), "{said}");

    // Consul comes up on that address: the next retry completes a read.
    let kv = Kv::dev_at(addr);
    kv.put(&format!("{prefix}/be/a"), "maint");
    wait_for(Duration::from_secs(20), "readiness 200", || {
        (agent.monitoring_get("/-/readiness").0 == 200).then_some(())
    });
    agent.wait_reply("be/a", "maint 100%", Duration::from_secs(5));
    let t = scrape(&agent);
    assert_eq!(value(&t, &format!("{P}synced")), 1.0);
    assert_eq!(value(&t, &format!("{P}consul_consecutive_failures")), 0.0);
}

#[test]
fn staleness_grows_during_a_consul_outage_while_readiness_stays_200() {
    let mut kv = Kv::dev();
    let prefix = unique_prefix("stale");
    kv.put(&format!("{prefix}/be/a"), "drain");
    let agent = Agent::with_consul(kv.addr, &prefix, &["-consul-wait", "1s"]);
    agent.wait_reply("be/a", "drain 100%", Duration::from_secs(10));
    assert_eq!(agent.monitoring_get("/-/readiness").0, 200);

    drop(kv.proc.take()); // consul down
    wait_for(Duration::from_secs(10), "a counted consul error", || {
        (consul_errors(&scrape(&agent)) >= 1.0).then_some(())
    });
    let age = |t: &str| value(t, &format!("{P}consul_last_success_age_seconds"));
    let a1 = age(&scrape(&agent));
    std::thread::sleep(Duration::from_millis(1500));
    let t = scrape(&agent);
    let a2 = age(&t);
    assert!(a2 >= a1 + 1.0, "staleness grew from {a1} to {a2}");
    assert!(value(&t, &format!("{P}consul_consecutive_failures")) >= 1.0);
    assert_eq!(value(&t, &format!("{P}synced")), 1.0);
    assert_eq!(
        agent.monitoring_get("/-/readiness").0,
        200,
        "readiness stays 200 on the last known state"
    );
    assert_eq!(
        agent.check("be/a\n").as_deref(),
        Some("drain 100%"),
        "answers from the last known state"
    );

    let (_, doc) = debug_state(&agent);
    assert!(doc["age_seconds"].as_f64().unwrap() >= 1.5, "{doc}");
    assert!(
        doc["watcher"]["consecutive_failures"].as_u64().unwrap() >= 1,
        "{doc}"
    );
    assert!(doc["watcher"]["last_error"].is_string(), "{doc}");
    assert_eq!(doc["state"]["identities"]["be/a"]["reply"], "drain 100%");
    // One warning when the outage starts, not one per retry.
    let warnings = agent
        .proc
        .log()
        .iter()
        .filter(|l| l.contains("\"msg\":\"consul read failed: answering from the last known state"))
        .count();
    assert_eq!(warnings, 1);
}

#[test]
fn debug_state_after_a_kv_change_shows_values_replies_and_invalid_keys_never_the_token() {
    let kv = Kv::dev();
    let prefix = unique_prefix("debug");
    kv.put(&format!("{prefix}/be/a"), "ready");
    let consul = kv.addr.to_string();
    let agent = Agent::start(
        &["-consul-addr", &consul, "-kv-prefix", &prefix],
        &[("CONSUL_HTTP_TOKEN", "secret-token-123")],
    );
    agent.wait_reply("be/a", "ready 100%", Duration::from_secs(10));

    kv.put(&format!("{prefix}/be/a"), "drain");
    kv.put(&format!("{prefix}/be/b"), "50%");
    kv.put(&format!("{prefix}/be/c"), "down");
    kv.put(&format!("{prefix}/be/d"), "300%");
    kv.put(&format!("{prefix}/be/e"), "dr\nain\u{1b}[0m");
    // consul refuses control bytes in keys; a trailing space is a bad key.
    kv.put(&format!("{prefix}/be/f%20"), "drain");
    agent.wait_reply("be/a", "drain 100%", Duration::from_secs(5));
    agent.wait_reply("be/b", "ready 50%", Duration::from_secs(5));
    let doc = wait_for(
        Duration::from_secs(5),
        "four invalid keys in /debug/state",
        || {
            let (_, doc) = debug_state(&agent);
            (doc["state"]["invalid"].as_array().map_or(0, Vec::len) == 4).then_some(doc)
        },
    );

    assert_eq!(doc["synced"], true);
    let state = &doc["state"];
    assert!(state["index"].as_u64().unwrap() > 0);
    assert_eq!(state["keys"], 2);
    assert_eq!(state["identities"]["be/a"]["value"], "drain");
    assert_eq!(state["identities"]["be/a"]["reply"], "drain 100%");
    assert_eq!(state["identities"]["be/b"]["reply"], "ready 50%");
    assert!(
        state["identities"]["be/a"]["modify_index"]
            .as_u64()
            .unwrap()
            > 0
    );
    let reasons: Vec<(String, String)> = state["invalid"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap().to_owned(),
                k["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (key, reason) in [
        ("be/c", "health_word"),
        ("be/d", "out_of_range"),
        ("be/e", "syntax"),
        ("be/f ", "bad_key"),
    ] {
        let full = format!("{prefix}/{key}");
        assert!(
            reasons.contains(&(full.clone(), reason.to_owned())),
            "{full:?} {reason} in {reasons:?}"
        );
    }
    assert!(doc["age_seconds"].as_f64().unwrap() >= 0.0);
    assert!(doc["last_change_unix_seconds"].as_f64().unwrap() > 1.6e9);
    assert_eq!(doc["kv_prefix"], prefix.as_str());

    // While the blocking query is held, the watcher shows its deadline, not
    // a next request time.
    let w = wait_for(Duration::from_secs(5), "a request in flight", || {
        let (_, doc) = debug_state(&agent);
        (doc["watcher"]["phase"] != "idle").then(|| doc["watcher"].clone())
    });
    assert!(w["next_request_in_seconds"].is_null(), "{w}");
    assert!(
        w["request_deadline_in_seconds"].as_f64().unwrap() > 1.0,
        "{w}"
    );
    assert_eq!(w["consecutive_failures"], 0);
    assert!(w["last_error"].is_null());

    // The token appears nowhere.
    let (body, _) = debug_state(&agent);
    assert!(!body.contains("secret-token-123"));
    assert!(!scrape(&agent).contains("secret-token-123"));
    assert!(agent
        .proc
        .log()
        .iter()
        .all(|l| !l.contains("secret-token-123")));

    // The value with a line feed and an escape sequence is logged escaped,
    // on one JSON line.
    let line = agent.proc.wait_log("dr\\\\nain", Duration::from_secs(2));
    let logged: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(logged["reason"], "syntax");
    assert_eq!(logged["key"], format!("{prefix}/be/e"));
    assert_eq!(logged["value"], "dr\\nain\\x1b[0m");
    assert!(agent
        .proc
        .log()
        .iter()
        .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
    // Real changes are logged per key, old -> new.
    let change = agent.proc.wait_log(
        "\"msg\":\"state change\",\"identity\":\"be/a\"",
        Duration::from_secs(2),
    );
    let change: serde_json::Value = serde_json::from_str(&change).unwrap();
    assert_eq!(
        (change["old"].as_str(), change["new"].as_str()),
        (Some("ready"), Some("drain"))
    );
}

#[test]
fn routes_liveness_unknown_paths_methods_and_pprof() {
    let kv = Kv::dev();
    let agent = Agent::with_consul(kv.addr, &unique_prefix("routes"), &[]);
    let mon = agent.monitoring.unwrap();
    let pprof = agent.pprof.unwrap();
    // Synced first: the check at the end must not be the one before the
    // first read (it would count as not_synced, rightly).
    wait_for(Duration::from_secs(10), "readiness 200", || {
        (agent.monitoring_get("/-/readiness").0 == 200).then_some(())
    });
    assert_eq!(
        agent.monitoring_get("/-/liveness"),
        (200, "ok\n".to_owned())
    );
    assert_eq!(agent.monitoring_get("/nope").0, 404);
    assert_eq!(http(pprof, "GET", "/nope", b"").unwrap().0, 404);
    assert_eq!(
        http(pprof, "GET", "/-/metrics", b"").unwrap().0,
        404,
        "metrics only on the monitoring listener"
    );
    for (addr, path) in [
        (mon, "/-/metrics"),
        (mon, "/-/liveness"),
        (pprof, "/debug/state"),
    ] {
        let (st, headers, _) = http_full(addr, "POST", path, b"x").unwrap();
        assert_eq!(st, 405, "POST {path}");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "allow" && v == b"GET, HEAD"),
            "POST {path}: {headers:?}"
        );
    }
    // HEAD: the head only (read raw: a body-framing client would wait).
    let head = String::from_utf8(raw(
        mon,
        b"HEAD /-/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        false,
    ))
    .unwrap();
    assert!(
        head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    let (_, headers, _) = http_full(mon, "GET", "/-/metrics", b"").unwrap();
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == b"text/plain; version=0.0.4; charset=utf-8"),
        "{headers:?}"
    );
    let (st, body) = http(pprof, "GET", "/debug/pprof/profile?seconds=1", b"").unwrap();
    let body = String::from_utf8(body).unwrap();
    assert_eq!(st, 404);
    assert!(
        body.contains("perf record") && body.contains("-p <pid>"),
        "{body}"
    );
    // Still answering after all that.
    agent.wait_reply("be/x", "ready 100%", Duration::from_secs(5));
    assert_eq!(outcome(&scrape(&agent), "not_synced"), 0.0);
}

/// The rules of monitoring/ pass `promtool check rules` and their unit
/// tests; every alert has a runbook naming the agent's own commands and a
/// firing and a quiet case in the unit tests; every metric the rules and the
/// dashboard name is one the agent exposes, every recorded one is recorded.
#[test]
fn monitoring_rules_pass_promtool_and_name_real_metrics() {
    let dir = support::prometheus::monitoring_dir();
    let run = |args: &[&str]| {
        let out = Command::new(promtool())
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {args:?}:\n{said}");
        said
    };
    let checked = run(&["check", "rules", "rules.yml", "alerts.yml"]);
    assert!(!checked.contains("WARNING"), "{checked}");
    run(&["test", "rules", "tests/alerts_test.yml"]);

    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let (rules, alerts, tests) = (
        read("rules.yml"),
        read("alerts.yml"),
        read("tests/alerts_test.yml"),
    );
    let names: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(names.len() >= 8, "{names:?}");
    let runbooks: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook: "))
        .collect();
    assert_eq!(runbooks.len(), names.len(), "one runbook per alert");
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/observability.md"
    ))
    .unwrap();
    for (name, runbook) in names.iter().zip(&runbooks) {
        assert!(
            readme.contains(&format!("- **`{name}`**")),
            "{name} is not listed in docs/observability.md"
        );
        assert!(
            runbook.contains("Check:")
                && runbook.contains("Fix:")
                && (runbook.contains("gitlab-haproxy-agent status")
                    || runbook.contains("gitlab-haproxy-agent ask")),
            "{name}: {runbook}"
        );
        // The cases of this alert: what follows each `alertname: NAME`.
        let cases: Vec<&str> = tests
            .split(&format!("alertname: {name}\n"))
            .skip(1)
            .map(|c| c.split("- eval_time").next().unwrap())
            .collect();
        assert!(
            cases.iter().any(|c| c.trim() == "exp_alerts: []"),
            "{name}: no case where it must not fire"
        );
        assert!(
            cases.iter().any(|c| c.contains("exp_labels")),
            "{name}: no case where it fires"
        );
    }

    let dashboard = read("dashboard.json");
    let recorded: HashSet<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .collect();
    let a = Agent::dev(&[]);
    let (_, exposition) = a.monitoring_get("/-/metrics");
    let text = [rules.as_str(), alerts.as_str(), dashboard.as_str()].concat();
    let words = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
    for word in words {
        if word.contains(':') && word.contains("gitlab_haproxy_agent_") {
            assert!(
                recorded.contains(word),
                "{word} is not recorded in rules.yml"
            );
        } else if word.starts_with(P) || word.starts_with("process_") {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(word);
            assert!(
                exposition.contains(&format!("# TYPE {family} ")),
                "{word} is not exposed"
            );
        }
    }
}

/// The dashboard imports into any Grafana: a datasource variable that every
/// query uses (no datasource UID written in), `job` and `instance`
/// variables, and a unit on every panel.
#[test]
fn dashboard_has_variables_units_and_no_datasource_uid() {
    let dashboard = support::prometheus::dashboard();
    let vars = dashboard["templating"]["list"].as_array().unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no ${name} variable"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for name in ["job", "instance"] {
        assert_eq!(var(name)["type"], "query", "{name}");
        assert_eq!(var(name)["datasource"]["uid"], "${datasource}", "{name}");
    }
    let panels = dashboard["panels"].as_array().unwrap();
    let mut seen = 0;
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = &panel["title"];
        let unit = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or("");
        assert!(!unit.is_empty(), "panel {title} has no unit");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "panel {title}");
            let expr = t["expr"].as_str().unwrap();
            assert!(
                expr.contains("$instance") || expr.contains("identity:"),
                "panel {title} ignores $instance: {expr}"
            );
        }
        seen += 1;
    }
    assert!(seen >= 20, "{seen} panels");
    // No datasource UID anywhere but the variable (Grafana's own built-in
    // annotation source aside).
    let text = serde_json::to_string(&dashboard).unwrap();
    for (i, _) in text.match_indices("\"uid\":") {
        let value = &text[i + 6..];
        assert!(
            value.starts_with("\"${datasource}\"")
                || value.starts_with("\"-- Grafana --\"")
                || value.starts_with("\"gitlab-haproxy-agent\""),
            "a hard-coded uid: {}",
            &text[i..(i + 60).min(text.len())]
        );
    }
}

/// Every machine's phase changes are traced at one place each
/// (`GITLAB_LOG_LEVEL=trace`): the consul client's from its first
/// request, an HTTP connection's through one request, the unasked
/// sweep's through a sweep that finds a key no check asks for.
#[test]
fn trace_level_logs_each_machines_phase_changes() {
    let args = [
        "-dev",
        "-dev-kv-addr",
        "127.0.0.1:0",
        "-unasked-after",
        "4s",
    ];
    let agent = Agent::start(&args, &[("GITLAB_LOG_LEVEL", "trace")]);
    agent
        .kv()
        .put("gitlab-haproxy-agent/state/be/never", "drain");
    agent.wait_reply("be/asked", "ready 100%", Duration::from_secs(10));
    let (status, _) = agent.monitoring_get("/-/metrics");
    assert_eq!(status, 200);
    for (msg, from, to) in [
        ("consul client phase", "idle", "connecting"),
        ("consul client phase", "sending", "awaiting_head"),
        ("http connection phase", "expect_head", "expect_body"),
        ("http connection phase", "expect_body", "handling"),
        ("http connection phase", "handling", "writing"),
        ("http connection phase", "writing", "expect_head"),
        ("unasked sweep phase", "mark", "clear"),
        ("unasked sweep phase", "gather", "suggest"),
    ] {
        let line = format!(r#""msg":"{msg}","from":"{from}","to":"{to}""#);
        agent.proc.wait_log(&line, Duration::from_secs(15));
    }
}
