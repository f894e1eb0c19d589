//! The agent against a real haproxy (issue 4): agent-checked
//! servers at `agent-inter 100ms`, the agent binary, and consul (the dev KV,
//! or a real `consul agent -dev` through `Kv::any`). Every assertion reads
//! haproxy's stats socket (`show stat`, `show servers state`, `get weight`);
//! the agent's own metrics are read only to prove no check went unanswered.
//!
//! Every wait polls with a deadline; the only fixed waits are the "state
//! holds for a while" windows of the freeze tests.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::haproxy::{csv_records, haproxy_version, parse_csv, servers, Haproxy, Row, Server};
use support::{free_port, unique_prefix, wait_for, Agent, Kv};

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

#[test]
fn responder_down_freezes_state_and_restart_converges() {
    let kv = Kv::dev();
    let prefix = unique_prefix("responder");
    let first = agent(&kv, &prefix, &[]);
    let port = first.listen().port();
    let hap = Haproxy::start("responder", port, &servers("be_web", 3));
    kv.put(&key(&prefix, "be_web/srv1"), "drain");
    kv.put(&key(&prefix, "be_web/srv2"), "50%");
    let frozen = |id: &str, r: &Row| match id {
        "be_web/srv1" => is_drain(r) && r.weight() == 100,
        "be_web/srv2" => up_at(r, 50),
        _ => up_at(r, 100),
    };
    hap.wait_all("drain / 50 / 100", 5 * SEC, |id, r| {
        frozen(id, r) && agent_answered(r)
    });

    drop(first); // SIGKILL by PID
    hap.wait_all("haproxy to see the agent refused", 3 * SEC, |_, r| {
        r.agent_status() == "L4CON"
    });
    // Meanwhile the KV changes: nobody can tell haproxy, so nothing moves.
    kv.delete(&key(&prefix, "be_web/srv1"));
    kv.put(&key(&prefix, "be_web/srv2"), "maint");
    kv.put(&key(&prefix, "be_web/srv3"), "25%");
    let end = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < end {
        for (id, r) in hap.stat() {
            assert!(
                frozen(&id, &r) && r.agent_status() == "L4CON",
                "{id} moved while the agent was down: {}",
                r.summary()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let listen = format!("127.0.0.1:{port}");
    let _second = agent(&kv, &prefix, &["-listen-addr", &listen]);
    hap.wait_all("the new KV state after restart", 3 * SEC, |id, r| {
        agent_answered(r)
            && match id {
                "be_web/srv1" => up_at(r, 100),
                "be_web/srv2" => is_maint(r),
                _ => up_at(r, 25),
            }
    });
}

#[test]
fn consul_down_after_sync_keeps_answering_and_recovers() {
    let mut kv = Kv::dev();
    let prefix = unique_prefix("consul-down");
    let agent = agent(&kv, &prefix, &[]);
    let hap = Haproxy::start("consul-down", agent.listen().port(), &servers("be_web", 3));
    kv.put(&key(&prefix, "be_web/srv1"), "drain");
    kv.put(&key(&prefix, "be_web/srv2"), "50%");
    let synced = |id: &str, r: &Row| match id {
        "be_web/srv1" => is_drain(r),
        "be_web/srv2" => up_at(r, 50),
        _ => up_at(r, 100),
    };
    hap.wait_all("drain / 50 / 100", 5 * SEC, |id, r| {
        synced(id, r) && agent_answered(r)
    });

    let addr = kv.addr;
    drop(kv.proc.take()); // "consul" killed by PID
    let drains_before = agent.metric("gitlab_haproxy_agent_requests_total{outcome=\"drain\"}");
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end {
        for (id, r) in hap.stat() {
            assert!(
                synced(&id, &r) && agent_answered(&r),
                "{id} moved with consul down: {}",
                r.summary()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Still answering from the last state, not merely frozen in haproxy.
    let drains_after = agent.metric("gitlab_haproxy_agent_requests_total{outcome=\"drain\"}");
    assert!(
        drains_after >= drains_before + 5.0,
        "drain replies during the outage: {drains_before} -> {drains_after}"
    );
    assert_eq!(
        agent.monitoring_get("/-/readiness").0,
        200,
        "readiness stays 200 after a first read"
    );

    // The restarted dev KV is empty: write the state again, plus a change.
    // Two writes bring it back to the very index the agent holds, with other
    // data (the regression `consul_restarted_empty_at_the_same_index_is_swapped_in`
    // in src/consul/watch.rs).
    let kv = Kv::dev_at(addr);
    kv.put(&key(&prefix, "be_web/srv1"), "drain");
    kv.put(&key(&prefix, "be_web/srv2"), "maint");
    hap.wait_all("the change written after recovery", 10 * SEC, |id, r| {
        agent_answered(r)
            && match id {
                "be_web/srv1" => is_drain(r),
                "be_web/srv2" => is_maint(r),
                _ => up_at(r, 100),
            }
    });
}

/// What differs between haproxy versions as the agent sees it, pinned for
/// every LTS line (2.6.12 from Debian, upstream 2.8.0, 3.0.11, 3.2.0,
/// 3.4.0): 2.6 logs "remains in forced drain mode" on every check of a
/// drained server, 2.8 and later only log the transitions; 2.8's `show
/// stat` adds `h1sess` and friends, 3.0 and later `proto` too (the suite
/// reads columns by name). The admin states, weights and agent columns are
/// the same.
#[test]
fn drain_logging_and_stat_columns_by_version() {
    let ((major, minor), line) = haproxy_version();
    eprintln!("testing {line}");
    let kv = Kv::dev();
    let prefix = unique_prefix("versions");
    let agent = agent(&kv, &prefix, &[]);
    let hap = Haproxy::start("versions", agent.listen().port(), &servers("be_web", 1));
    let id = "be_web/srv1";
    hap.wait_server(id, "UP 100, answered", 5 * SEC, |r| {
        up_at(r, 100) && agent_answered(r)
    });
    let header = hap.command("show stat");
    let header = header.lines().next().unwrap_or("");
    let has_column = |c: &str| header.split(',').any(|h| h.trim_start_matches("# ") == c);

    kv.put(&key(&prefix, id), "drain");
    let r = hap.wait_server(id, "DRAIN", 3 * SEC, is_drain);
    assert_eq!((r.status(), r.weight()), ("DRAIN (agent)", 100));
    // About ten checks at agent-inter 100ms while drained.
    hap.hold(id, "DRAIN", SEC, is_drain);
    let count = |needle: &str| hap.log().iter().filter(|l| l.contains(needle)).count();
    let entered = count("enters drain state");
    let remains = count("remains in forced drain mode");
    eprintln!(
        "haproxy {major}.{minor}: drain logged 'enters drain state' x{entered}, \
         'remains in forced drain mode' x{remains} over ~10 checks; \
         show stat has proto: {}, h1sess: {}",
        has_column("proto"),
        has_column("h1sess")
    );
    assert_eq!(entered, 1, "one transition: {:#?}", hap.log());
    match (major, minor) {
        (2, 6) => {
            assert!(remains >= 5, "2.6 logs every drained check: {remains}");
            assert!(!has_column("proto") && !has_column("h1sess"), "{header}");
        }
        (2, 8) => {
            assert_eq!(remains, 0, "2.8 logs transitions only");
            assert!(!has_column("proto") && has_column("h1sess"), "{header}");
        }
        (3, _) => {
            assert_eq!(remains, 0, "3.x logs transitions only");
            assert!(has_column("proto") && has_column("h1sess"), "{header}");
        }
        _ => panic!("haproxy {major}.{minor}: not a line this suite knows; pin what it shows here"),
    }
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

#[test]
fn two_hundred_servers_converge_and_every_check_is_answered() {
    let kv = Kv::dev();
    let prefix = unique_prefix("many");
    let consul = kv.addr.to_string();
    // Info level: debug would log every consul swap of the 200 writes.
    let agent = Agent::start(
        &["-consul-addr", &consul, "-kv-prefix", &prefix],
        &[("GITLAB_LOG_LEVEL", "info")],
    );
    wait_ready(&agent);
    let all: Vec<Server> = (0..10)
        .flat_map(|b| servers(&format!("be_{b}"), 20))
        .collect();
    let hap = Haproxy::start("many", agent.listen().port(), &all);

    let mut agent_errors: HashMap<String, String> = HashMap::new();
    let mut note_errors = |id: &str, r: &Row| {
        if matches!(
            r.agent_status(),
            "L4CON" | "L4TOUT" | "L7TOUT" | "L7RSP" | "L7STS" | "L6TOUT" | "L6RSP"
        ) {
            agent_errors
                .entry(id.to_owned())
                .or_insert_with(|| r.summary());
        }
    };
    hap.wait_all("200 servers UP 100, answered", 10 * SEC, |id, r| {
        note_errors(id, r);
        up_at(r, 100) && agent_answered(r)
    });

    let expect: HashMap<String, Shows> = all
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (value, ok) = many_value(i);
            kv.put(&key(&prefix, &s.id()), &value);
            (s.id(), ok)
        })
        .collect();
    let t0 = Instant::now();
    hap.wait_all("200 servers at their KV state", 10 * SEC, |id, r| {
        note_errors(id, r);
        agent_answered(r) && expect[id](r)
    });
    eprintln!(
        "200 servers converged {:?} after the last write",
        t0.elapsed()
    );
    // A little more traffic at the converged state, still error-free.
    hap.hold("be_0/srv1", "drain", SEC / 2, is_drain);
    for (id, r) in hap.stat() {
        note_errors(&id, &r);
        assert!(expect[&id](&r), "{id} moved: {}", r.summary());
    }
    assert!(
        agent_errors.is_empty(),
        "agent check errors seen in haproxy: {agent_errors:#?}"
    );

    let outcome = |o: &str| {
        agent.metric(&format!(
            "gitlab_haproxy_agent_requests_total{{outcome=\"{o}\"}}"
        ))
    };
    let replies: f64 = ["ready", "drain", "maint"].into_iter().map(outcome).sum();
    let unanswered: Vec<(&str, f64)> = [
        "not_synced",
        "too_long",
        "control_byte",
        "empty",
        "no_newline",
        "timeout",
        "peer_closed",
        "io_error",
    ]
    .into_iter()
    .map(|o| (o, outcome(o)))
    .collect();
    eprintln!("{replies} replies; no-reply outcomes: {unanswered:?}");
    assert!(
        replies >= 2000.0,
        "only {replies} replies for 200 servers at 100ms"
    );
    for (o, n) in unanswered {
        assert_eq!(n, 0.0, "{n} checks ended with {o}");
    }
}

/// The hazard `-state-file` removes (issue 15): a host reboots in an
/// incident, consul is unreachable, haproxy (without a `server-state-file`)
/// and the agent restart. haproxy starts every server as its configuration
/// says, ready; only an agent that kept the state on disk can put the
/// drained and maintenance servers back, and it does within an agent
/// interval or two. Without the file they stay ready, taking traffic.
#[test]
fn a_reboot_with_consul_down_keeps_drains_only_with_a_state_file() {
    let dir = std::env::temp_dir().join(format!("gha-reboot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    let path = path.to_str().unwrap();
    for with_file in [true, false] {
        let mut kv = Kv::dev();
        let prefix = unique_prefix("reboot");
        kv.put(&key(&prefix, "be_web/srv1"), "drain");
        kv.put(&key(&prefix, "be_web/srv2"), "maint");
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["-listen-addr", listen.as_str(), "-consul-wait", "1s"];
        if with_file {
            args.extend(["-state-file", path]);
        }
        let a = agent(&kv, &prefix, &args);
        let hap = Haproxy::start("reboot", port, &servers("be_web", 3));
        let incident = |id: &str, r: &Row| match id {
            "be_web/srv1" => is_drain(r),
            "be_web/srv2" => is_maint(r),
            _ => up_at(r, 100),
        };
        hap.wait_all("drain / maint / ready", 5 * SEC, |id, r| {
            incident(id, r) && agent_answered(r)
        });
        if with_file {
            wait_for(5 * SEC, "the state file written", || {
                (a.metric("gitlab_haproxy_agent_state_file_writes_total") >= 1.0).then_some(())
            });
        }

        // The reboot: consul unreachable, haproxy and the agent restarted.
        let consul = kv.addr;
        drop(kv.proc.take());
        drop(hap);
        drop(a);
        let a = Agent::with_consul(consul, &prefix, &args);
        let hap = Haproxy::start("reboot-2", port, &servers("be_web", 3));
        let t0 = Instant::now();
        if with_file {
            hap.wait_all(
                "drain / maint again, from the state file",
                2 * SEC,
                |id, r| incident(id, r) && agent_answered(r),
            );
            eprintln!(
                "with the state file: drain / maint {:?} after haproxy listed its servers",
                t0.elapsed()
            );
            assert_eq!(
                a.metric("gitlab_haproxy_agent_synced"),
                0.0,
                "consul is still down"
            );
        } else {
            // Every server as the configuration says, and it stays so.
            for id in ["be_web/srv1", "be_web/srv2"] {
                hap.hold(id, "ready, taking traffic (the hazard)", SEC, |r| {
                    up_at(r, 100)
                });
            }
            assert_eq!(a.check("be_web/srv1\n"), None, "no answer without consul");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
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

/// The operator's loop against a real haproxy whose config has the three
/// mistakes the README warns about: a key written under a typo'd identity,
/// a server without `weight`, and a single-quoted `agent-send`. The agent
/// names the typo (with the identity meant), `status` shows it, `ask`
/// answers as haproxy is answered, and `haproxy -c` accepts the file that
/// `lint-haproxy` finds the other two mistakes in.
#[test]
fn the_operator_finds_a_typod_key_and_fixes_it() {
    let kv = Kv::dev();
    let prefix = unique_prefix("operator");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let a = agent(
        &kv,
        &prefix,
        &["-listen-addr", &listen, "-unasked-after", "2s"],
    );
    let pprof = a.pprof.unwrap().to_string();
    let common = format!("check inter 1s slowstart 10s agent-check agent-addr 127.0.0.1 agent-port {port} agent-inter 100ms");
    let hap = Haproxy::start_with("operator", 3, |real| {
        format!(
            "\nbackend be_web\n    balance roundrobin\n\
             \x20   server srv1 {real} weight 100 {common} agent-send \"be_web/srv1\\n\"\n\
             \x20   server srv2 {real} {common} agent-send \"be_web/srv2\\n\"\n\
             \x20   server srv3 {real} weight 100 {common} agent-send 'be_web/srv3\\n'\n"
        )
    });
    // haproxy -c accepts every mistake.
    let checked = std::process::Command::new(support::haproxy::haproxy_bin())
        .args(["-c", "-f"])
        .arg(hap.config_path())
        .output()
        .unwrap();
    assert!(checked.status.success(), "haproxy -c: {checked:?}");
    // lint-haproxy finds exactly the two mistakes of haproxy's side.
    let cfg = hap.config_path();
    let cfg = cfg.to_str().unwrap();
    let (code, out, _) = operator(&["lint-haproxy", cfg, "-listen-addr", &listen]);
    let lines: Vec<&str> = out.lines().collect();
    let line_of = |server: &str| 1 + hap.config.lines().position(|l| l.contains(server)).unwrap();
    let (srv2, srv3) = (line_of("server srv2 "), line_of("server srv3 "));
    assert_eq!(code, 1, "{out}");
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with(&format!("{cfg}:{srv2}: be_web/srv2: error: no weight")),
        "{out}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "{cfg}:{srv3}: be_web/srv3: error: agent-send 'be_web/srv3\\n' is single-quoted"
        )),
        "{out}"
    );
    assert_eq!(lines[2], "3 servers with agent-check, 2 errors, 0 warnings");

    // The typo: srv01 for srv1. Nothing happens to srv1, and the agent says so.
    kv.put(&key(&prefix, "be_web/srv01"), "drain");
    let warning = a.proc.wait_log("diverted key unasked", 10 * SEC);
    assert!(
        warning.contains(r#""identity":"be_web/srv01""#),
        "{warning}"
    );
    assert!(
        warning.contains(r#""did_you_mean":"be_web/srv1""#),
        "{warning}"
    );
    assert!(
        hap.server("be_web/srv1").is_up(),
        "the typo changed nothing"
    );
    assert_eq!(a.metric("gitlab_haproxy_agent_state_unasked_keys"), 1.0);
    // Every operator command gets the test's own addresses: never the
    // machine's 127.0.0.1:8500 (a README try's dev KV may listen there).
    let consul = format!("http://{}", kv.addr);
    let status = [
        "status",
        "-pprof-addr",
        &pprof,
        "-consul-addr",
        &consul,
        "-kv-prefix",
        &prefix,
    ];
    let (code, out, _) = operator(&status);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("be_web/srv01")
            && l.ends_with("UNASKED: did you mean be_web/srv1?; no record")),
        "{out}"
    );
    // The single-quoted agent-send never ends its line: every check of
    // srv3 closes without a reply, counted as no_newline.
    wait_for(5 * SEC, "srv3's checks counted as no_newline", || {
        (a.metric(r#"gitlab_haproxy_agent_requests_total{outcome="no_newline"}"#) >= 1.0)
            .then_some(())
    });

    // The fix: the right key, checked before it is written and asked after.
    let (code, out, _) = operator(&["check-value", "drain"]);
    assert_eq!((code, out.as_str()), (0, "drain 100%\n"));
    kv.put(&key(&prefix, "be_web/srv1"), "drain");
    kv.delete(&key(&prefix, "be_web/srv01"));
    hap.wait_server("be_web/srv1", "drained", 5 * SEC, is_drain);
    let (code, out, _) = operator(&["ask", "be_web/srv1", "-listen-addr", &listen]);
    assert_eq!((code, out.as_str()), (0, "drain 100%\n"));
    let doc = wait_for(5 * SEC, "status 0: srv1 asked since its write", || {
        let (code, out, _) = operator(&[&status[..], &["-json"]].concat());
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        (code == 0).then_some(doc)
    });
    assert_eq!(
        (doc["unasked"].as_u64(), doc["waiting"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(doc["diverted"][0]["standing"], "asked");
    assert_eq!(doc["diverted"][0]["identity"], "be_web/srv1");
    assert!(
        doc["diverted"][0]["last_asked_seconds_ago"]
            .as_u64()
            .unwrap()
            <= 2
    );
    wait_for(2 * SEC, "the unasked gauge back to 0", || {
        (a.metric("gitlab_haproxy_agent_state_unasked_keys") == 0.0).then_some(())
    });
}

/// Regression (issue 27): the per-key last-ask series were capped at 1,000
/// with unasked keys first, so an agent with 1,000 or more unasked keys
/// exported none of the keys its haproxy asks for. Another agent exported
/// 0 (or nothing) for those, so the fleet's max read 0, and the README's
/// alert fired for keys that are asked. Two agents share 1,501 diverted
/// keys; a real haproxy asks one of them for the last key by identity.
#[test]
fn two_agents_sharing_1501_diverted_keys_export_the_asked_ones_last_ask() {
    let kv = Kv::dev();
    let prefix = unique_prefix("fleet_cap");
    let unasked = (0..1500).map(|i| (key(&prefix, &format!("be_gone/s{i:04}")), "drain"));
    let keys = unasked.chain([(key(&prefix, "be_web/srv1"), "drain")]);
    assert_eq!(support::put_many(kv.addr, keys), 1501);
    let extra = ["-unasked-after", "1s"];
    let asking = agent(&kv, &prefix, &extra);
    let idle = agent(&kv, &prefix, &extra);
    let hap = Haproxy::start(
        "fleet_cap",
        asking.listen().port(),
        &[Server::new("be_web", "srv1")],
    );
    hap.wait_server("be_web/srv1", "DRAIN", 5 * SEC, is_drain);
    let series =
        r#"gitlab_haproxy_agent_diverted_key_last_asked_timestamp_seconds{identity="be_web/srv1"}"#;
    for (a, n) in [(&asking, 1500.0), (&idle, 1501.0)] {
        wait_for(10 * SEC, "every key but the asked one unasked", || {
            (a.metric("gitlab_haproxy_agent_state_unasked_keys") == n).then_some(())
        });
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let text = |a: &Agent| a.monitoring_get("/-/metrics").1;
    let (asking_text, idle_text) = (text(&asking), text(&idle));
    let over = "gitlab_haproxy_agent_diverted_keys_over_series_limit";
    assert_eq!(support::metric_value(&asking_text, over), Some(501.0));
    let last = support::metric_value(&asking_text, series)
        .unwrap_or_else(|| panic!("the asked key is left out of the series"));
    assert!(last >= now - 10.0, "a recent last ask: {last} at {now}");
    // The fleet's max (the alert's expression) is the asking agent's.
    let fleet_max = [asking_text, idle_text]
        .iter()
        .filter_map(|t| support::metric_value(t, series))
        .fold(f64::MIN, f64::max);
    assert!(
        fleet_max >= now - 300.0,
        "the alert would fire: {fleet_max}"
    );
    drop(hap);
}

/// A writer command against `kv` under `prefix`.
fn write_state(kv: &Kv, prefix: &str, args: &[&str]) -> (i32, String, String) {
    let consul = format!("http://{}", kv.addr);
    let mut all = args.to_vec();
    all.extend(["-consul-addr", &consul, "-kv-prefix", prefix]);
    operator(&all)
}

/// `ramp` (SPEC §11) on a real haproxy: the weight goes 25, 50, 100 on
/// schedule, and the ramp ends with the key deleted (`ready 100%`).
#[test]
fn ramp_steps_the_weight_and_ends_with_the_key_deleted() {
    let kv = Kv::any();
    let prefix = unique_prefix("ramp");
    let agent = agent(&kv, &prefix, &[]);
    let hap = Haproxy::start("ramp", agent.listen().port(), &servers("be_web", 1));
    let id = "be_web/srv1";
    hap.wait_server(id, "UP 100, answered", 5 * SEC, |r| {
        up_at(r, 100) && agent_answered(r)
    });
    let args = [
        "ramp",
        id,
        "-from",
        "0%",
        "-to",
        "100%",
        "-over",
        "3s",
        "-steps",
        "25,50,100",
    ];
    let consul = format!("http://{}", kv.addr);
    let mut cmd = std::process::Command::new(support::BIN);
    cmd.args(args)
        .args(["-consul-addr", &consul, "-kv-prefix", &prefix]);
    let mut ramp = support::Proc::spawn(cmd);
    for want in [25, 50] {
        hap.wait_server(id, &format!("weight {want}"), 3 * SEC, |r| {
            r.weight() == want
        });
        assert_eq!(hap.get_weight(id), (want as u32, 100));
    }
    let status = ramp.wait_exit(5 * SEC).expect("the ramp ends");
    assert!(status.success(), "{:?}", ramp.log());
    hap.wait_server(id, "weight 100", 3 * SEC, |r| up_at(r, 100));
    let (st, _) =
        support::http(kv.addr, "GET", &format!("/v1/kv/{}", key(&prefix, id)), b"").unwrap();
    assert_eq!(st, 404, "the ramp ends with the key deleted");
    assert_eq!(
        agent.check(&format!("{id}\n")).as_deref(),
        Some("ready 100%")
    );
}

/// `set` of three servers: one transaction, so haproxy sees all three
/// change within one agent interval (100 ms) of each other.
#[test]
fn set_of_three_servers_changes_them_in_the_same_interval() {
    let kv = Kv::any();
    let prefix = unique_prefix("set3");
    let agent = agent(&kv, &prefix, &[]);
    let srv = servers("be_web", 3);
    let hap = Haproxy::start("set3", agent.listen().port(), &srv);
    hap.wait_all("UP 100, answered", 5 * SEC, |_, r| {
        up_at(r, 100) && agent_answered(r)
    });
    let (code, out, err) = write_state(
        &kv,
        &prefix,
        &[
            "set",
            "be_web/srv1=drain",
            "be_web/srv2=drain",
            "be_web/srv3=drain",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("written: 3 keys in 1 transaction"), "{out}");
    let first = wait_for(3 * SEC, "a server drained", || {
        let st = hap.stat();
        srv.iter()
            .any(|s| is_drain(&st[&s.id()]))
            .then(Instant::now)
    });
    hap.wait_all("all three drained", 3 * SEC, |_, r| is_drain(r));
    let spread = first.elapsed();
    eprintln!("three servers drained within {spread:?} of the first");
    assert!(
        spread < Duration::from_secs(1),
        "{spread:?}: not about one interval (100 ms, polled every 20 ms)"
    );
    // One transaction, seen from the KV: the three keys share one index.
    let listing = format!("/v1/kv/{}?recurse", key(&prefix, "be_web/"));
    let (st, body) = support::http(kv.addr, "GET", &listing, b"").unwrap();
    assert_eq!(st, 200);
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    let indexes: std::collections::BTreeSet<u64> = entries
        .iter()
        .map(|e| e["ModifyIndex"].as_u64().unwrap())
        .collect();
    assert_eq!((entries.len(), indexes.len()), (3, 1), "{entries:?}");
}

/// docs/incident.md's tutorial, run as a user pastes it (issue 38: as
/// written, haproxy started before python listened, the server was DOWN
/// when the session was opened, haproxy closed it, and `wait-drained`
/// said `drained after 0s` where the page promises `1 session ... not
/// drained`). Its three shell blocks run in one bash, in order; the only
/// changes make it this test's: its own directory, ports, binary, haproxy
/// and agent (in `-dev`, its KV given to the writers as CONSUL_HTTP_ADDR).
#[test]
fn the_incident_tutorial_runs_as_written() {
    use std::os::unix::process::CommandExt;
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/incident.md")).unwrap();
    let section = page
        .split("## Try it with a real haproxy")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the tutorial section");
    let blocks: Vec<&str> = section
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    assert_eq!(blocks.len(), 3, "{section}");
    let a = Agent::start(&["-dev", "-dev-kv-addr", "127.0.0.1:0"], &[]);
    let dir = std::env::temp_dir().join(format!("gha-tut-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (backend, front, agent) = (free_port(), free_port(), a.listen().port());
    let haproxy = support::haproxy::haproxy_bin();
    let script = blocks
        .join("\n")
        .replace("/tmp/hap", dir.to_str().unwrap())
        .replace("$PWD/target/release/gitlab-haproxy-agent", support::BIN)
        .replace("/usr/sbin/haproxy", haproxy.to_str().unwrap())
        .replace("8080", &backend.to_string())
        .replace("8000", &front.to_string())
        .replace("9777", &agent.to_string());
    let listen = format!("127.0.0.1:{agent}");
    let consul = format!("http://{}", a.dev_kv.unwrap());
    let mut bash = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("trap 'kill $PY $HAP 2>/dev/null' EXIT\n{script}"))
        .env("CONSUL_HTTP_ADDR", &consul)
        .env("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", &listen)
        .env_remove("CONSUL_HTTP_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = bash.id() as i32;
    let exited = wait_for(60 * SEC, "the tutorial to end", || bash.try_wait().unwrap());
    // Whatever it left (a failed run), by its process group.
    // SAFETY: kill(2) on the group this test started.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let _ = std::fs::remove_dir_all(&dir);
    let out = bash.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(exited.success(), "{text}");
    let at = |needle: &str, from: usize| {
        text[from..]
            .find(needle)
            .map(|i| from + i + needle.len())
            .unwrap_or_else(|| panic!("no {needle:?} after byte {from} in:\n{text}"))
    };
    let mut i = at("1 server with agent-check, 0 errors, 0 warnings", 0);
    i = at("1 session, 0 queued, DRAIN (agent)", i);
    i = at("not drained after 3s", i);
    // After the reload: the master sees the session at the old worker.
    i = at("old", i);
    i = at("not drained after 3s", i);
    // The new worker's socket alone: 0 sessions, and its blind spot said.
    i = at("drained after", i);
    i = at("give -haproxy-master-socket", i);
    // The session closed: drained.
    i = at("drained after", i);
    at(": be_web/srv1 (0 sessions, 0 queued at every source)", i);
}
