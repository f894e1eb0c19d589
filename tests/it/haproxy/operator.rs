//! The operator's commands against a real haproxy: finding a typo'd key,
//! diverted keys, `ramp`, `set` on three servers, the incident tutorial.

use super::*;

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
    let a = Agent::dev(&[]);
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
