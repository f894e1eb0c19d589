//! `ramp` and the writers' exits: consul down or refusing, a conflict or a
//! signal mid-ramp, a SIGKILL between steps, lateness.

use super::*;

#[test]
fn consul_down_or_refusing_is_exit_1_naming_the_request() {
    let kv = Kv::dev();
    let proxy = Proxy::start(kv.addr);
    let p = unique_prefix("down");
    proxy.set_mode(Mode::Refuse);
    let (code, _, err) = run(proxy.addr, &p, &["set", "be/a=drain"]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("GET /v1/kv/{p}/: consul unreachable")),
        "{err}"
    );
    proxy.set_mode(Mode::HoldPuts);
    wait_for(5 * SEC, "the proxy listening again", || {
        std::net::TcpStream::connect(proxy.addr).ok()
    });
    let child = writer(proxy.addr, &p, &["unset", "be/a"]).output();
    // Nothing to change for an absent key: no PUT at all.
    assert_eq!(child.unwrap().status.code(), Some(0));
    let child = writer(proxy.addr, &p, &["set", "be/a=drain"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(10 * SEC, "the PUT", || {
        proxy
            .request_heads()
            .iter()
            .any(|h| h.starts_with("PUT"))
            .then_some(())
    });
    proxy.set_mode(Mode::Status(403));
    let (code, _, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 1);
    assert!(
        err.contains("PUT /v1/txn: consul answered HTTP 403"),
        "{err}"
    );
    // (The proxy's status replaces consul's answer after forwarding: what
    // the writer says is what it was told.)
    assert!(err.contains("not written: be/a"), "{err}");
}

#[test]
fn a_conflict_mid_ramp_stops_it_and_nothing_more_is_written() {
    let kv = Kv::dev();
    let p = unique_prefix("ramp_conflict");
    let schedule = ["-from", "0%", "-to", "100%", "-over", "4s", "-steps", "4"];
    let child = spawn_piped(ramp(kv.addr, &p, 3, &schedule));
    wait_for(5 * SEC, "step 1", || {
        (value(kv.addr, &format!("{p}/be/s1")).as_deref() == Some("25%")).then_some(())
    });
    kv.put(&format!("{p}/be/s1"), "drain");
    let (code, out, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("ramp stopped after step 1 of 4: be/s1 was changed by someone else since it was read: it is now drain 100%"), "{err}");
    assert_eq!(
        value(kv.addr, &format!("{p}/be/s0")).as_deref(),
        Some("25%"),
        "the step that met the conflict wrote nothing"
    );
    std::thread::sleep(2 * SEC);
    assert_eq!(
        value(kv.addr, &format!("{p}/be/s1")).as_deref(),
        Some("drain")
    );
    assert_eq!(
        value(kv.addr, &format!("{p}/be/s2")).as_deref(),
        Some("25%")
    );
}

#[test]
fn sigint_and_sigterm_stop_a_ramp_after_a_whole_step_and_print_the_resume() {
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let kv = Kv::dev();
        let p = unique_prefix("ramp_signal");
        let schedule = ["-from", "0%", "-to", "100%", "-over", "20s", "-steps", "5"];
        let child = spawn_piped(ramp(kv.addr, &p, 2, &schedule));
        wait_for(5 * SEC, "step 1", || {
            (one_step(kv.addr, &p, 2).as_deref() == Some("20%")).then_some(())
        });
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(child.id() as i32, sig) };
        let t = Instant::now();
        let (got, out, err) = triple(child.wait_with_output().unwrap());
        assert!(
            t.elapsed() < 2 * SEC,
            "stopped between steps, not at the next one"
        );
        assert_eq!(got, code, "{out}{err}");
        assert!(
            err.contains("ramp stopped after step 1 of 5; the keys hold ready 20%"),
            "{err}"
        );
        let resume = out
            .lines()
            .find_map(|l| l.strip_prefix("resume: "))
            .expect("resume line");
        assert_eq!(
            resume,
            format!("gitlab-haproxy-agent ramp -consul-addr http://{} -kv-prefix {p} -to 100% -over 16s -steps 40%,60%,80%,100% be/s0 be/s1", kv.addr)
        );
        assert_eq!(one_step(kv.addr, &p, 2).as_deref(), Some("20%"));
    }
}

/// Stopped after its last step, before `-then unset`: the resume is the
/// `unset`, without the record's words (`unset` refuses them: the record
/// goes with the key), and it runs.
#[test]
fn a_ramp_stopped_before_then_unset_resumes_with_an_unset_that_runs() {
    let kv = Kv::dev();
    let p = unique_prefix("ramp_then_unset");
    let schedule = [
        "-from", "50%", "-to", "100%", "-over", "6s", "-steps", "2", "-then", "unset", "-reason",
        "ramp up", "-by", "ops",
    ];
    let child = spawn_piped(ramp(kv.addr, &p, 2, &schedule));
    wait_for(8 * SEC, "the last step (ready 100%, before -then)", || {
        (one_step(kv.addr, &p, 2).as_deref() == Some("ready")).then_some(())
    });
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let (code, out, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 130, "{out}{err}");
    let resume = line_after(&out, "resume: ");
    assert!(
        resume.starts_with("gitlab-haproxy-agent unset "),
        "{resume}"
    );
    assert!(
        !resume.contains("-reason") && !resume.contains("-by"),
        "{resume}"
    );
    let (code, out, err) = sh(resume);
    assert_eq!(code, 0, "{resume}: {out}{err}");
    assert_eq!(one_step(kv.addr, &p, 2), None, "deleted");
    assert_eq!(record(kv.addr, &format!("{}/be/s0", meta(&p))), None);
}

#[test]
fn sigkill_mid_ramp_leaves_one_whole_step_in_every_key() {
    let kv = Kv::dev();
    let p = unique_prefix("ramp_kill");
    let n = 32;
    let schedule = ["-from", "0%", "-to", "100%", "-over", "5s", "-steps", "5"];
    for kill_after in [1500u64, 2700] {
        kv.delete_tree(&p);
        let mut child = Proc::spawn(ramp(kv.addr, &p, n, &schedule));
        std::thread::sleep(Duration::from_millis(kill_after));
        child.signal(libc::SIGKILL);
        child.wait_exit(5 * SEC).expect("killed");
        let held = one_step(kv.addr, &p, n);
        assert!(
            matches!(held.as_deref(), Some("20%" | "40%" | "60%")),
            "{held:?}"
        );
    }
}

/// Lateness of each step against its schedule over a 60-step ramp (the
/// figure the issue asks for), and the one-write-a-second floor held.
#[test]
#[ignore = "a 60 s measurement: cargo test --test it -- writer::ramp --ignored"]
fn sixty_step_ramp_lateness() {
    let kv = Kv::dev();
    let p = unique_prefix("ramp60");
    let (code, out, err) = run(
        kv.addr,
        &p,
        &[
            "ramp", "be/a", "be/b", "-from", "0%", "-to", "60%", "-over", "60s", "-steps", "60",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let late: Vec<u64> = out
        .lines()
        .filter_map(|l| l.split("late ").nth(1)?.strip_suffix("ms)")?.parse().ok())
        .collect();
    assert_eq!(late.len(), 60, "{out}");
    eprintln!(
        "60-step ramp: max lateness {} ms, mean {} ms",
        late.iter().max().unwrap(),
        late.iter().sum::<u64>() / 60
    );
}

/// `PUT /v1/txn` on the dev KV, or on a real consul where one is
/// available: the answers the writers rely on agree.
#[test]
fn transactions_answer_as_consul_does() {
    let kv = Kv::any();
    let p = unique_prefix("txn");
    let put = |body: serde_json::Value| {
        let (status, answer) =
            http(kv.addr, "PUT", "/v1/txn", body.to_string().as_bytes()).expect("answers");
        (
            status,
            serde_json::from_slice::<serde_json::Value>(&answer).unwrap_or(serde_json::Value::Null),
        )
    };
    let op = |verb: &str, key: &str, v: Option<&str>, index: u64| {
        use base64::Engine as _;
        let v = v.map(|v| base64::engine::general_purpose::STANDARD.encode(v));
        serde_json::json!({"KV": {"Verb": verb, "Key": format!("{p}/{key}"), "Value": v, "Index": index}})
    };
    let (status, body) = put(serde_json::json!([
        op("cas", "a", Some("drain"), 0),
        op("cas", "b", Some("50%"), 0)
    ]));
    assert_eq!(status, 200, "{body}");
    let (ia, ib) = (
        body["Results"][0]["KV"]["ModifyIndex"].as_u64().unwrap(),
        body["Results"][1]["KV"]["ModifyIndex"].as_u64().unwrap(),
    );
    assert_eq!(ia, ib, "one index for the transaction");
    assert_eq!(body["Results"][0]["KV"]["Value"], serde_json::Value::Null);
    let (status, body) = put(serde_json::json!([
        op("cas", "a", Some("maint"), ia),
        op("cas", "b", Some("maint"), ib + 1000)
    ]));
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        body["Errors"],
        serde_json::json!([{"OpIndex": 1, "What": format!("failed to set key \"{p}/b\", index is stale")}])
    );
    assert_eq!(
        value(kv.addr, &format!("{p}/a")).as_deref(),
        Some("drain"),
        "nothing applied"
    );
    let (status, body) = put(serde_json::json!([
        op("delete-cas", "a", None, ia),
        op("check-not-exists", "c", None, 0)
    ]));
    assert_eq!((status, &body["Results"]), (200, &serde_json::json!([])));
    let many: Vec<serde_json::Value> = (0..129)
        .map(|i| op("set", &format!("k{i}"), Some("drain"), 0))
        .collect();
    let (status, answer) = http(
        kv.addr,
        "PUT",
        "/v1/txn",
        serde_json::Value::Array(many).to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 413);
    assert!(String::from_utf8_lossy(&answer)
        .contains("Transaction contains too many operations (129 > "));
}
