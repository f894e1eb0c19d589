//! The dashboard and the rules of `monitoring/` against a real Prometheus
//! (Debian's package): two real agents (one in `-dev` mode, one watching the
//! consul stand-in, with a state file) scraped every second while checks and
//! KV writes run. Every dashboard panel's query returns a series (with the
//! labels its legend names), every recording rule records one, every rule
//! evaluates without error, and the "not answering from consul" alert goes
//! pending, then firing, when that agent's consul is killed, and resolves
//! when it is back.
//!
//! A missing `prometheus` binary fails the test with the line that installs
//! it (scripts/install-prometheus.sh), never skips it.
//!
//! `GHA_DASHBOARD_DUMP=FILE` also writes every panel's queries over the run
//! (one point a second) to FILE as JSON, which scripts/dashboard-png.py plots.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::prometheus::{dashboard_queries, monitoring_dir, Prometheus};
use crate::support::{check, http, unique_prefix, wait_for, Agent, Kv};

const ALERT: &str = "HaproxyAgentNotAnsweringFromConsul";

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Agent checks against `agents` every 20 ms until `stop`, at most 3,000
/// rounds: replies of each admin state, and checks closed without one.
fn traffic(agents: Vec<SocketAddr>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for round in 0..3000 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            for &a in &agents {
                for line in ["be/drained\n", "be/weighted\n", "be/maint\n", "be/other\n"] {
                    check(a, line.as_bytes());
                }
                if round % 10 == 0 {
                    no_newline(a);
                    check(a, b"be/\x01\n");
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// The labels a legend format names (`{{outcome}} {{instance}}`).
fn legend_labels(legend: &str) -> impl Iterator<Item = &str> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|rest| rest.split("}}").next())
        .map(str::trim)
}

/// A request without its newline, then the peer's close: `no_newline`.
fn no_newline(agent: SocketAddr) {
    let Ok(mut s) = TcpStream::connect(agent) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"be/drained");
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.read_to_end(&mut Vec::new());
}

fn put(kv: SocketAddr, key: &str, value: &str) {
    let (st, _) = http(kv, "PUT", &format!("/v1/kv/{key}"), value.as_bytes()).expect("KV answers");
    assert_eq!(st, 200, "PUT {key}");
}

fn put_state(kv: SocketAddr, prefix: &str) {
    for (key, value) in [
        ("be/drained", "drain"),
        ("be/maint", "maint"),
        ("be/weighted", "50%"),
        ("be/typo", "drain"),
        ("be/bad", "up"),
    ] {
        put(kv, &format!("{prefix}/{key}"), value);
    }
}

/// alerts.yml with the alert under test's `for: 2m` made 3s, so that the
/// test sees pending, then firing, in seconds (the promtool unit tests
/// cover the shipped duration).
fn alerts_with_short_for() -> String {
    let alerts = std::fs::read_to_string(monitoring_dir().join("alerts.yml")).unwrap();
    let at = alerts
        .find(&format!("- alert: {ALERT}\n"))
        .expect("the alert in alerts.yml");
    let rest = &alerts[at..];
    let f = at + rest.find("for: 2m\n").expect("its for: 2m");
    format!(
        "{}for: 3s\n{}",
        &alerts[..f],
        &alerts[f + "for: 2m\n".len()..]
    )
}

#[test]
fn dashboard_queries_recording_rules_and_the_consul_alert_work_on_a_real_prometheus() {
    let started = Instant::now();
    let from = unix_now();
    let mut kv = Kv::dev();
    let prefix = unique_prefix("prometheus");
    put_state(kv.addr, &prefix);
    let state_dir = std::env::temp_dir().join(format!("gha-prom-state-{}", std::process::id()));
    std::fs::create_dir_all(&state_dir).unwrap();
    let state_file = state_dir.join("state.json");
    let watcher = Agent::with_consul(
        kv.addr,
        &prefix,
        &[
            "-state-file",
            state_file.to_str().unwrap(),
            "-unasked-after",
            "2s",
            "-consul-wait",
            "5s",
        ],
    );
    let dev = Agent::dev(&[]);
    put_state(dev.dev_kv.unwrap(), "gitlab-haproxy-agent/state");
    for agent in [&watcher, &dev] {
        agent.wait_reply("be/drained", "drain 100%", Duration::from_secs(10));
    }
    let targets = [dev.monitoring.unwrap(), watcher.monitoring.unwrap()];
    let instance = targets[1].to_string();
    let rules = std::fs::read_to_string(monitoring_dir().join("rules.yml")).unwrap();
    let prometheus = Prometheus::start(
        &targets,
        &[
            ("rules.yml", rules),
            ("alerts.yml", alerts_with_short_for()),
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let checks = traffic(vec![dev.listen(), watcher.listen()], Arc::clone(&stop));

    // A few KV writes while Prometheus scrapes.
    for (i, weight) in ["60%", "70%", "80%"].iter().enumerate() {
        std::thread::sleep(Duration::from_millis(700));
        put(kv.addr, &format!("{prefix}/be/weighted"), weight);
        put(
            dev.dev_kv.unwrap(),
            &format!("gitlab-haproxy-agent/state/be/w{i}"),
            weight,
        );
    }

    // Every panel's query returns a series (rates need two scrapes, the
    // recorded ones a rule evaluation after that).
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{} dashboard queries", queries.len());
    let deadline = Instant::now() + Duration::from_secs(60);
    let empty = loop {
        let empty: Vec<String> = queries
            .iter()
            .filter_map(|q| {
                let series = prometheus.query(&q.expr);
                let missing = legend_labels(&q.legend)
                    .find(|l| series.iter().any(|s| s["metric"][l].is_null()));
                match (series.is_empty(), missing) {
                    (true, _) => Some(format!("panel {:?}: {} (no series)", q.panel, q.expr)),
                    (false, Some(l)) => Some(format!(
                        "panel {:?}: {} (a series without the legend's label {l})",
                        q.panel, q.expr
                    )),
                    (false, None) => None,
                }
            })
            .collect();
        if empty.is_empty() || Instant::now() >= deadline {
            break empty;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        empty.is_empty(),
        "dashboard queries not answered as the panel expects after 60 s:\n{}",
        empty.join("\n")
    );
    let panels_at = started.elapsed();

    // Every recording rule records a series; every rule evaluates cleanly.
    let groups = prometheus.api("/api/v1/rules")["groups"].clone();
    let rules: Vec<serde_json::Value> = groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect();
    assert!(rules.len() >= 15, "{} rules loaded", rules.len());
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    for rule in rules.iter().filter(|r| r["type"] == "recording") {
        let name = rule["name"].as_str().unwrap();
        let labels = rule["labels"].as_object().cloned().unwrap_or_default();
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let expr = format!("{name}{{{}}}", selector.join(","));
        assert!(
            !prometheus.query(&expr).is_empty(),
            "recording rule {expr} recorded no series"
        );
    }

    // The watcher's consul dies: pending, then firing.
    assert_eq!(prometheus.alert_state(ALERT, &instance), None);
    drop(kv.proc.take());
    let killed = Instant::now();
    wait_for(Duration::from_secs(30), "the alert pending", || {
        (prometheus.alert_state(ALERT, &instance).as_deref() == Some("pending")).then_some(())
    });
    let pending_at = killed.elapsed();
    wait_for(Duration::from_secs(30), "the alert firing", || {
        (prometheus.alert_state(ALERT, &instance).as_deref() == Some("firing")).then_some(())
    });
    let firing_at = killed.elapsed();
    assert!(
        firing_at >= pending_at + Duration::from_secs(2),
        "firing {firing_at:?} after pending {pending_at:?}: `for:` not honoured"
    );
    let dev_instance = targets[0].to_string();
    assert_eq!(
        prometheus.alert_state(ALERT, &dev_instance),
        None,
        "the -dev agent's own KV is up"
    );

    // Consul is back on the same address: resolved.
    let back = Kv::dev_at(kv.addr);
    put_state(back.addr, &prefix);
    let restored = Instant::now();
    wait_for(Duration::from_secs(60), "the alert resolved", || {
        prometheus
            .alert_state(ALERT, &instance)
            .is_none()
            .then_some(())
    });
    let resolved_at = restored.elapsed();
    let dump_to = std::env::var_os("GHA_DASHBOARD_DUMP");
    if dump_to.is_some() {
        std::thread::sleep(Duration::from_secs(15)); // the recovery, for the picture
    }
    stop.store(true, Ordering::Relaxed);
    checks.join().unwrap();
    eprintln!(
        "every panel answered {panels_at:?} after the start; alert pending {pending_at:?} and firing {firing_at:?} after the kill, resolved {resolved_at:?} after the restore; test took {:?}",
        started.elapsed()
    );

    if let Some(path) = dump_to {
        dump(&prometheus, from, &path);
    }
    let _ = std::fs::remove_dir_all(&state_dir);
}

/// Every panel's queries over `[from, now]`, for scripts/dashboard-png.py.
fn dump(prometheus: &Prometheus, from: f64, path: &std::ffi::OsStr) {
    let to = unix_now();
    let panels: Vec<serde_json::Value> = dashboard_queries()
        .into_iter()
        .map(|q| {
            serde_json::json!({
                "panel": q.panel,
                "unit": q.unit,
                "expr": q.expr,
                "legend": q.legend,
                "result": prometheus.query_range(&q.expr, from, to),
            })
        })
        .collect();
    let doc = serde_json::json!({"from": from, "to": to, "queries": panels});
    std::fs::write(path, serde_json::to_string(&doc).unwrap()).unwrap();
}
