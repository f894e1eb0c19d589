//! The agent against a real haproxy (issue 4): agent-checked
//! servers at `agent-inter 100ms`, the agent binary, and consul (the dev KV,
//! or a real `consul agent -dev` through `Kv::any`). Every assertion reads
//! haproxy's stats socket (`show stat`, `show servers state`, `get weight`);
//! the agent's own metrics are read only to prove no check went unanswered.
//!
//! Every wait polls with a deadline; the only fixed waits are the "state
//! holds for a while" windows of the freeze tests.

use crate::support;
use crate::support::metrics;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::haproxy::{
    csv_records, haproxy_version, parse_csv, servers, Haproxy, Row, Server,
};
use crate::support::{free_port, unique_prefix, wait_for, Agent, Kv};

mod operator;
mod outages;

const SEC: Duration = Duration::from_secs(1);

/// The agent under test, watching `prefix` on `kv`, once it has read
/// consul (so no haproxy check ever meets a `not_synced` close).
fn agent(kv: &Kv, prefix: &str, extra: &[&str]) -> Agent {
    let a = Agent::with_consul(kv.addr, prefix, extra);
    wait_ready(&a);
    a
}

fn wait_ready(a: &Agent) {
    wait_for(10 * SEC, "agent readiness 200", || {
        (a.monitoring_get("/-/readiness").0 == 200).then_some(())
    });
}

fn key(prefix: &str, id: &str) -> String {
    format!("{prefix}/{id}")
}

fn is_drain(r: &Row) -> bool {
    r.status().starts_with("DRAIN")
}

fn is_maint(r: &Row) -> bool {
    r.status() == "MAINT"
}

/// Answered by the agent with no health word: haproxy reports `CHECKED`
/// ("No status change"); `L7OK` would mean an `up`.
fn agent_answered(r: &Row) -> bool {
    matches!(r.agent_status(), "CHECKED" | "L7OK")
}

fn up_at(r: &Row, weight: i64) -> bool {
    r.is_up() && r.weight() == weight
}

#[test]
fn csv_parser_handles_quotes_and_newlines() {
    let text = "# a,b,c\n1,\"x,\ny\",\"say \"\"hi\"\"\"\n2,,\n\n";
    let rows = parse_csv(text);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].get("a"), "1");
    assert_eq!(rows[0].get("b"), "x,\ny");
    assert_eq!(rows[0].get("c"), "say \"hi\"");
    assert_eq!((rows[1].get("a"), rows[1].get("c")), ("2", ""));
    assert_eq!(
        csv_records("a,b"),
        vec![vec!["a".to_owned(), "b".to_owned()]]
    );
}

#[test]
fn startup_converges_to_the_kv_state_already_written() {
    let kv = Kv::dev();
    let prefix = unique_prefix("startup");
    kv.put(&key(&prefix, "be_web/srv1"), "drain");
    kv.put(&key(&prefix, "be_web/srv2"), "maint");
    kv.put(&key(&prefix, "be_web/srv3"), "50%");

    // haproxy first: servers start from their config state, agent refused.
    let port = free_port();
    let hap = Haproxy::start("startup", port, &servers("be_web", 4));
    hap.wait_all(
        "config state (UP 100) with the agent refused",
        5 * SEC,
        |_, r| up_at(r, 100) && r.agent_status() == "L4CON",
    );

    let listen = format!("127.0.0.1:{port}");
    let _agent = agent(&kv, &prefix, &["-listen-addr", &listen]);
    let t0 = Instant::now();
    hap.wait_all("the KV state", 3 * SEC, |id, r| {
        agent_answered(r)
            && match id {
                "be_web/srv1" => is_drain(r),
                "be_web/srv2" => is_maint(r),
                "be_web/srv3" => up_at(r, 50),
                _ => up_at(r, 100),
            }
    });
    eprintln!("startup convergence took {:?}", t0.elapsed());
    let st = hap.servers_state();
    assert_eq!(st["be_web/srv1"].get("srv_admin_state"), "8", "FDRAIN");
    assert_eq!(st["be_web/srv2"].get("srv_admin_state"), "1", "FMAINT");
    assert_eq!(st["be_web/srv2"].get("srv_op_state"), "0", "STOPPED");
    assert_eq!(hap.get_weight("be_web/srv3"), (50, 100));
    assert_eq!(hap.get_weight("be_web/srv4"), (100, 100));
}

#[test]
fn drain_and_back_is_full_weight_at_once() {
    let kv = Kv::any();
    let prefix = unique_prefix("drain");
    let agent = agent(&kv, &prefix, &[]);
    let hap = Haproxy::start("drain", agent.listen().port(), &servers("be_web", 2));
    hap.wait_all("UP 100, answered", 5 * SEC, |_, r| {
        up_at(r, 100) && agent_answered(r)
    });

    kv.put(&key(&prefix, "be_web/srv1"), "drain");
    let r = hap.wait_server("be_web/srv1", "DRAIN", 3 * SEC, is_drain);
    assert_eq!(r.status(), "DRAIN (agent)");
    assert_eq!(
        hap.servers_state()["be_web/srv1"].get("srv_admin_state"),
        "8"
    );
    assert!(up_at(&hap.server("be_web/srv2"), 100), "srv2 untouched");

    kv.delete(&key(&prefix, "be_web/srv1"));
    // The first sample out of drain is already at full weight: no ramp.
    let r = hap.wait_server("be_web/srv1", "leaving DRAIN", 3 * SEC, |r| !is_drain(r));
    assert!(
        up_at(&r, 100) && r.get("throttle").is_empty(),
        "left drain with a ramp: {}",
        r.summary()
    );
    assert_eq!(
        hap.servers_state()["be_web/srv1"].get("srv_op_state"),
        "2",
        "RUNNING, not STARTING"
    );
    hap.hold("be_web/srv1", "UP 100 unthrottled", SEC, |r| {
        up_at(r, 100) && r.get("throttle").is_empty()
    });
}

#[test]
fn leaving_maint_ramps_with_slowstart() {
    let kv = Kv::dev();
    let prefix = unique_prefix("maint");
    let agent = agent(&kv, &prefix, &[]);
    let srv = Server::new("be_web", "srv1").slowstart("4s");
    let id = srv.id();
    let hap = Haproxy::start("maint", agent.listen().port(), &[srv]);
    hap.wait_server(&id, "UP 100, answered", 5 * SEC, |r| {
        up_at(r, 100) && agent_answered(r)
    });

    kv.put(&key(&prefix, &id), "maint");
    hap.wait_server(&id, "MAINT", 3 * SEC, is_maint);
    let st = &hap.servers_state()[&id];
    assert_eq!(
        (st.get("srv_admin_state"), st.get("srv_op_state")),
        ("1", "0")
    );

    kv.delete(&key(&prefix, &id));
    let t0 = Instant::now();
    let r = hap.wait_server(
        &id,
        "a ramp sample (UP, 0 < weight < 100, throttled)",
        3 * SEC,
        |r| r.is_up() && r.weight() > 0 && r.weight() < 100 && !r.get("throttle").is_empty(),
    );
    eprintln!("ramp sample after {:?}: {}", t0.elapsed(), r.summary());
    let mut last = r.weight();
    let r = hap.wait_server(&id, "full weight after the ramp", 8 * SEC, |r| {
        assert!(r.is_up(), "fell out of UP during the ramp: {}", r.summary());
        assert!(
            r.weight() >= last,
            "weight went down during the ramp: {last} -> {}",
            r.summary()
        );
        last = r.weight();
        r.weight() == 100 && r.get("throttle").is_empty()
    });
    eprintln!("ramp done after {:?}: {}", t0.elapsed(), r.summary());
    assert!(
        t0.elapsed() >= 2 * SEC,
        "a 4s slowstart finished in {:?}",
        t0.elapsed()
    );
    assert_eq!(hap.servers_state()[&id].get("srv_op_state"), "2");
}

#[test]
fn weight_percentages_and_back_to_full() {
    let kv = Kv::any();
    let prefix = unique_prefix("weights");
    let agent = agent(&kv, &prefix, &[]);
    let hap = Haproxy::start("weights", agent.listen().port(), &servers("be_web", 1));
    let id = "be_web/srv1";
    hap.wait_server(id, "UP 100, answered", 5 * SEC, |r| {
        up_at(r, 100) && agent_answered(r)
    });

    for (value, want) in [
        ("0%", 0),
        ("50%", 50),
        ("100%", 100),
        ("256%", 256),
        ("050%", 50),
    ] {
        kv.put(&key(&prefix, id), value);
        let r = hap.wait_server(
            id,
            &format!("UP weight {want} for {value:?}"),
            3 * SEC,
            |r| r.weight() == want,
        );
        // 0% is still UP in the CSV (only the HTML page paints it as drain);
        // haproxy 3.4 reads `UP 0/3` while its health check is still rising
        // after start, in a proxy without a default-server line.
        assert!(r.status().starts_with("UP"), "{value}: {}", r.summary());
        assert_eq!(hap.get_weight(id), (want as u32, 100), "{value}");
    }
    // The case a bare `ready` gets wrong: 50% must go back to 100%.
    kv.delete(&key(&prefix, id));
    hap.wait_server(id, "UP 100 after the key is gone", 3 * SEC, |r| {
        up_at(r, 100)
    });
    assert_eq!(hap.get_weight(id), (100, 100));
}

#[test]
fn garbage_values_count_as_absent_and_health_words_never_pass() {
    let kv = Kv::dev();
    let prefix = unique_prefix("garbage");
    let agent = agent(&kv, &prefix, &[]);
    let hap = Haproxy::start("garbage", agent.listen().port(), &servers("be_web", 1));
    let id = "be_web/srv1";
    // On every sample: never DOWN (agent), never a health word or maxconn
    // in haproxy's view of the agent.
    let sane = |r: &Row| {
        let agt = r.get("last_agt").to_ascii_lowercase();
        let words: Vec<&str> = agt.split(|c: char| !c.is_ascii_alphanumeric()).collect();
        assert!(
            !r.status().contains("DOWN"),
            "health passed on: {}",
            r.summary()
        );
        assert!(
            !words
                .iter()
                .any(|w| matches!(*w, "up" | "down" | "stopped" | "fail")),
            "health word reached haproxy: {}",
            r.summary()
        );
        assert!(
            r.get("slim").is_empty(),
            "maxconn reached haproxy: {}",
            r.summary()
        );
        assert!(
            !is_drain(r) && !is_maint(r),
            "admin state from garbage: {}",
            r.summary()
        );
    };
    hap.wait_server(id, "UP 100, answered", 5 * SEC, |r| {
        up_at(r, 100) && agent_answered(r)
    });

    for garbage in [
        "banana",
        "up",
        "down",
        "maxconn:5",
        "-5%",
        "257%",
        "50% drain",
    ] {
        kv.put(&key(&prefix, id), "50%");
        hap.wait_server(id, "UP 50", 3 * SEC, |r| {
            sane(r);
            up_at(r, 50)
        });
        kv.put(&key(&prefix, id), garbage);
        hap.wait_server(
            id,
            &format!("UP 100 for invalid {garbage:?}"),
            3 * SEC,
            |r| {
                sane(r);
                up_at(r, 100) && agent_answered(r)
            },
        );
    }
    hap.hold(id, "UP 100", SEC / 2, |r| {
        sane(r);
        up_at(r, 100)
    });
}

/// How haproxy shows a server at its desired state.
type Shows = Box<dyn Fn(&Row) -> bool>;

/// What server `i` of the many-servers test is set to, and how haproxy
/// shows it.
fn many_value(i: usize) -> (String, Shows) {
    match i % 3 {
        0 => ("drain".into(), Box::new(is_drain)),
        1 => ("maint".into(), Box::new(is_maint)),
        _ => {
            let n = (i * 3) % 257;
            (format!("{n}%"), Box::new(move |r: &Row| up_at(r, n as i64)))
        }
    }
}

/// Runs an operator command of the agent binary: (exit code, stdout, stderr).
fn operator(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(support::BIN)
        .args(args)
        .env_remove("CONSUL_HTTP_ADDR")
        .env_remove("CONSUL_HTTP_TOKEN")
        .output()
        .expect("run an operator command");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(out.stdout),
        text(out.stderr),
    )
}

/// A writer command against `kv` under `prefix`.
fn write_state(kv: &Kv, prefix: &str, args: &[&str]) -> (i32, String, String) {
    let consul = format!("http://{}", kv.addr);
    let mut all = args.to_vec();
    all.extend(["-consul-addr", &consul, "-kv-prefix", prefix]);
    operator(&all)
}
