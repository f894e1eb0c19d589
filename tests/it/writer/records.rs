//! The write records (who, why, until) carried in the same transaction, and
//! what a record cannot hold or a token cannot write.

use super::*;

/// SPEC §13, "a record survives the runbook": `set ID=drain -reason
/// INC-123 -for 2h`, then the runbook's `set ID=maint`, keeps the reason
/// and the expiry and says so; `ramp` keeps them on every step; the undo
/// line of a write that replaced them, run as printed, restores them.
#[test]
fn the_runbook_keeps_the_record_and_the_printed_undo_restores_it() {
    let kv = Kv::dev();
    let p = format!("{}/state", unique_prefix("runbook"));
    let m = meta(&p);
    let key = format!("{p}/be/a");
    let flags = || entry(kv.addr, &key).unwrap()["Flags"].as_u64().unwrap();
    let reason = || record(kv.addr, &format!("{m}/be/a")).unwrap().0["reason"].clone();
    let words = ["set", "be/a=drain", "-reason", "INC-123", "-for", "2h"];
    let (code, out, err) = run(kv.addr, &p, &words);
    assert_eq!(code, 0, "{out}{err}");
    let until = flags();
    let shown = format!(
        "keeps reason \"INC-123\", until {}",
        gitlab_haproxy_agent::logging::utc_seconds(until)
    );
    // Step 3 of the runbook.
    let (code, out, err) = run(kv.addr, &p, &["set", "be/a=maint"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("-> maint 100% ({shown})")), "{out}");
    assert_eq!((flags(), reason()), (until, "INC-123".into()));
    let (rec, _) = record(kv.addr, &format!("{m}/be/a")).unwrap();
    assert_eq!(rec["until"].as_u64(), Some(until), "{rec}");
    // Its undo puts drain back, the record as it was.
    let (code, o, e) = sh(line_after(&out, "undo: "));
    assert_eq!(code, 0, "{o}{e}");
    assert_eq!(value(kv.addr, &key).as_deref(), Some("drain"));
    assert_eq!((flags(), reason()), (until, "INC-123".into()));
    // A write that clears both: its undo restores both (-until, -reason).
    let words = ["set", "be/a=50%", "-reason", "", "-for", "none"];
    let (code, out, err) = run(kv.addr, &p, &words);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!((flags(), reason()), (0, serde_json::Value::Null));
    let undo = line_after(&out, "undo: ");
    assert!(undo.contains("-reason INC-123 -until 20"), "{undo}");
    let (code, o, e) = sh(undo);
    assert_eq!(code, 0, "{undo}: {o}{e}");
    assert_eq!(value(kv.addr, &key).as_deref(), Some("drain"));
    assert_eq!((flags(), reason()), (until, "INC-123".into()));
    // A ramp keeps them on every step, and says so.
    let ramp_words = [
        "ramp", "be/a", "-from", "0%", "-to", "50%", "-over", "2s", "-steps", "2",
    ];
    let (code, out, err) = run(kv.addr, &p, &ramp_words);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("be/a: {shown}")), "{out}");
    assert_eq!(value(kv.addr, &key).as_deref(), Some("50%"));
    assert_eq!((flags(), reason()), (until, "INC-123".into()));
    // A ramp's -then write keeps them too; -for none clears the expiry on
    // every step.
    let then = [
        "ramp", "be/a", "-from", "50%", "-to", "0%", "-over", "1s", "-steps", "1", "-then", "maint",
    ];
    let (code, out, err) = run(kv.addr, &p, &then);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(value(kv.addr, &key).as_deref(), Some("maint"));
    assert_eq!((flags(), reason()), (until, "INC-123".into()));
    // With -then's own -for, the kept expiry holds for the steps only, and
    // the line says so (the last write sets the new one).
    let (code, out, err) = run(kv.addr, &p, &[&then[..], &["-for", "1h"]].concat());
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("for the steps (the -then write sets its own -for)"),
        "{out}"
    );
    assert!(flags() >= unix_now() + 3590, "{}", flags());
    let (code, out, err) = run(kv.addr, &p, &[&then[..], &["-for", "none"]].concat());
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!((flags(), reason()), (0, "INC-123".into()));
    // -until sets an absolute expiry (an offset is read as such).
    let words = ["set", "be/a=drain", "-until", "2030-01-01T02:00:00+02:00"];
    let (code, out, err) = run(kv.addr, &p, &words);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(flags(), 1_893_456_000);
    let (code, _, err) = run(kv.addr, &p, &["set", "be/a=drain", "-until", "tomorrow"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("RFC 3339") && err.lines().count() == 1,
        "{err}"
    );
}

/// `ramp` writes a record with each step in the step's transaction,
/// deletes it with the key when it ends at 100%, and `-then drain -for`
/// puts the expiry (counted from the `-then` write) in Flags and record.
#[test]
fn a_ramp_carries_its_records_and_its_expiry_with_the_last_write() {
    let kv = Kv::dev();
    let p = format!("{}/state", unique_prefix("ramp_records"));
    let m = meta(&p);
    // A ramp writes a record each step, with the key; ending at 100% it
    // deletes both.
    let schedule = [
        "ramp", "be/r", "-from", "50%", "-to", "100%", "-over", "2s", "-steps", "2", "-reason",
        "canary",
    ];
    let (code, out, err) = run(kv.addr, &p, &schedule);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(get(kv.addr, &format!("{p}/be/r")), None);
    assert_eq!(
        get(kv.addr, &format!("{m}/be/r")),
        None,
        "deleted with the key"
    );
    // -then drain -for: the expiry comes with the last write.
    let schedule = [
        "ramp", "be/r", "-from", "100%", "-to", "50%", "-over", "1s", "-steps", "1", "-then",
        "drain", "-for", "30m",
    ];
    let (code, out, err) = run(kv.addr, &p, &schedule);
    assert_eq!(code, 0, "{out}{err}");
    let r = entry(kv.addr, &format!("{p}/be/r")).unwrap();
    let (rec, index) = record(kv.addr, &format!("{m}/be/r")).unwrap();
    assert_eq!(r["ModifyIndex"].as_u64(), Some(index));
    assert_eq!(rec["value"], "drain");
    let until = r["Flags"].as_u64().unwrap();
    assert!(
        until >= unix_now() + 1790 && rec["until"].as_u64() == Some(until),
        "{r} {rec}"
    );
}

/// What the records refuse (exit 2, nothing written): `-reason`/`-by`
/// over 512 bytes or with control characters or bidi overrides, `-for`
/// of 0 or negative, on `unset`, on a ramp without `-then drain|maint`,
/// on a key set to ready 100%; and a ramp of more than 32 keys (64
/// operations with their records).
#[test]
fn what_a_record_cannot_hold_is_exit_2_and_nothing_written() {
    let kv = Kv::dev();
    let p = format!("{}/state", unique_prefix("records_bad"));
    let long = "x".repeat(513);
    let many: Vec<String> = (0..33).map(|i| format!("be/s{i}")).collect();
    let mut ramp_many = vec!["ramp", "-to", "50%", "-over", "10s"];
    ramp_many.extend(many.iter().map(String::as_str));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["set", "be/a=drain", "-reason", &long], "513 bytes"),
        (
            vec!["set", "be/a=drain", "-reason", "INC\u{202E}321"],
            "U+202E",
        ),
        (vec!["set", "be/a=drain", "-by", "eve\x1b[2J"], "U+001B"),
        (vec!["set", "be/a=drain", "-reason", "a\u{85}b"], "U+0085"),
        (
            vec!["set", "be/a=drain", "-for", "0s"],
            "not a positive duration",
        ),
        (
            vec!["set", "be/a=drain", "-for", "-1h"],
            "not a positive duration",
        ),
        (vec!["set", "be/a=ready", "-for", "1h"], "nothing to expire"),
        (
            vec!["unset", "be/a", "-for", "1h"],
            "-for is refused on unset",
        ),
        (
            vec!["unset", "be/a", "-reason", "INC-9"],
            "-reason is refused on unset: the key's record is deleted with it",
        ),
        (
            vec!["ramp", "be/a", "-to", "50%", "-over", "10s", "-for", "1h"],
            "-then drain or -then maint",
        ),
        (ramp_many, "at most 32 keys"),
    ];
    for (args, why) in cases {
        let (code, out, err) = run(kv.addr, &p, &args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    assert_eq!(get(kv.addr, &format!("{p}/be/a")), None);
}

/// A token that may write the state keys but not the records: consul
/// denies the record's operation inside the transaction (409, `What`
/// "Permission denied": `agent/consul/txn_endpoint.go` `preCheck`), so
/// nothing is written, and the message names the record and the policy.
#[test]
fn a_token_that_cannot_write_the_records_is_told_so_and_nothing_is_written() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = format!("{}/state", unique_prefix("records_denied"));
    let m = meta(&p);
    consul.with(|r| r.deny_write = vec![format!("{m}/")]);
    let (code, out, err) = run(consul.addr, &p, &["set", "be/a=drain"]);
    assert_eq!(code, 1, "{out}{err}");
    let parent = p.rsplit_once('/').unwrap().0;
    assert!(
        err.contains(&format!("permission denied for the record {m}/be/a"))
            && err.contains(&format!(r#"key_prefix "{parent}/" {{ policy = "write" }}"#)),
        "{err}"
    );
    assert!(!err.contains("changed by someone else"), "{err}");
    assert_eq!(get(kv.addr, &format!("{p}/be/a")), None, "both or neither");
}

/// A record whose key is gone (a raw `consul kv delete`) is deleted when
/// a writer next writes that identity, even when the write itself is
/// unchanged; a raw put over a written key leaves the record older than
/// the key (status says so).
#[test]
fn an_orphan_record_is_deleted_on_the_next_write_of_its_identity() {
    let kv = Kv::dev();
    let p = format!("{}/state", unique_prefix("orphans"));
    let m = meta(&p);
    assert_eq!(run(kv.addr, &p, &["set", "be/a=drain", "be/b=maint"]).0, 0);
    kv.delete_tree(&format!("{p}/be/a"));
    kv.delete_tree(&format!("{p}/be/b"));
    let (code, out, err) = run(kv.addr, &p, &["unset", "be/a"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted 1 orphan record:"), "{out}");
    assert_eq!(get(kv.addr, &format!("{m}/be/a")), None);
    let (code, out, _) = run(kv.addr, &p, &["set", "be/b=ready"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("be/b: ready 100% (absent) (unchanged)") && out.contains("deleted 1 orphan"),
        "{out}"
    );
    assert_eq!(get(kv.addr, &format!("{m}/be/b")), None);
}

/// Consul answers an ACL denial inside a transaction with the same 409 as
/// a stale index, `What` starting "Permission denied" (consul issue #3090;
/// `agent/consul/txn_endpoint.go` `preCheck`, `acl/errors.go`
/// `PermissionDeniedError.Error`): `set`, `unset` and `-json` say the
/// token cannot write the key, never "changed by someone else"; a key the
/// token cannot read was absent from the listing: it may exist.
#[test]
fn a_denied_write_is_refused_not_a_conflict() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("denied");
    kv.put(&format!("{p}/be/a"), "drain");
    kv.put(&format!("{p}/be/h"), "maint");
    consul.with(|r| {
        r.deny_write = vec![format!("{p}/be/a"), format!("{p}/be/h")];
        r.deny_read = vec![format!("{p}/be/h")];
    });
    let (code, out, err) = run(consul.addr, &p, &["set", "be/a=50%", "be/b=maint"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("consul refused: permission denied for be/a: the token cannot write it"),
        "{err}"
    );
    assert!(!err.contains("changed by someone else"), "{err}");
    assert!(err.contains("not written: be/a be/b"), "{err}");
    assert!(!out.contains("undo:"), "{out}");
    assert_eq!(value(kv.addr, &format!("{p}/be/b")), None);
    let (code, out, err) = run(consul.addr, &p, &["set", "be/a=50%", "-json"]);
    assert_eq!(code, 1);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let error = doc["error"].as_str().unwrap();
    assert!(error.contains("permission denied for be/a"), "{error}{err}");
    let (code, _, err) = run(consul.addr, &p, &["unset", "be/a"]);
    assert_eq!(code, 1);
    assert!(err.contains("permission denied for be/a"), "{err}");
    // Hidden from the listing, so read as absent: the denial says so.
    let (code, out, err) = run(consul.addr, &p, &["set", "be/h=drain"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("be/h: ready 100% (absent) -> drain 100%"),
        "{out}"
    );
    assert!(
        err.contains("permission denied for be/h") && err.contains("it may exist unseen"),
        "{err}"
    );
    assert_eq!(
        value(kv.addr, &format!("{p}/be/h")).as_deref(),
        Some("maint")
    );
    // Writable but hidden: the guard (absent) is stale, yet no one else
    // changed it since the read: not a conflict, and it may exist.
    kv.put(&format!("{p}/be/r"), "maint");
    consul.with(|r| r.deny_read = vec![format!("{p}/be/r")]);
    let (code, _, err) = run(consul.addr, &p, &["set", "be/r=drain"]);
    assert_eq!(code, 1, "{err}");
    assert!(!err.contains("changed by someone else"), "{err}");
    assert!(
        err.contains("consul refused the write of be/r") && err.contains("it may exist unseen"),
        "{err}"
    );
}

/// A token losing write mid-ramp: the step is refused (not a conflict),
/// and the resume line is printed, starting at that step, and runs.
#[test]
fn a_ramp_refused_mid_way_prints_a_resume_line_that_runs() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("ramp_denied");
    let schedule = ["-from", "0%", "-to", "100%", "-over", "3s", "-steps", "3"];
    let child = spawn_piped(ramp(consul.addr, &p, 2, &schedule));
    wait_for(5 * SEC, "step 1", || {
        (one_step(kv.addr, &p, 2).as_deref() == Some("33%")).then_some(())
    });
    consul.with(|r| r.deny_write = vec![format!("{p}/be/s1")]);
    let (code, out, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("permission denied for be/s1: the token cannot write it"),
        "{err}"
    );
    assert!(!err.contains("changed by someone else"), "{err}");
    assert!(
        err.contains(
            "ramp stopped after step 1 of 3: step 2 of 3 not written; the keys hold ready 33%"
        ),
        "{err}"
    );
    let resume = line_after(&out, "resume: ");
    assert!(resume.contains("-steps 67%,100% be/s0 be/s1"), "{resume}");
    consul.with(|r| r.deny_write.clear());
    let (code, out, err) = sh(resume);
    assert_eq!(code, 0, "{resume}: {out}{err}");
    assert_eq!(one_step(kv.addr, &p, 2), None, "ended at 100%: deleted");
}

/// `status` reads the records with the token it is given: when consul
/// leaves them out (a token without `key:read` on the records' prefix:
/// `X-Consul-Results-Filtered-By-ACLs`), status says the records were not
/// read, once, and never that a key has "no record".
#[test]
fn records_hidden_by_acls_are_not_read_never_no_record() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let base = unique_prefix("acl_status");
    let prefix = format!("{base}/state");
    let agent = support::Agent::with_consul(kv.addr, &prefix, &[]);
    let (code, out, err) = run(
        consul.addr,
        &prefix,
        &["set", "be/a=drain", "-reason", "INC-1"],
    );
    assert_eq!(code, 0, "{out}{err}");
    agent.wait_reply("be/a", "drain 100%", 10 * Duration::from_secs(1));
    let pprof = agent.pprof.unwrap().to_string();
    let status = |consul: SocketAddr| run(consul, &prefix, &["status", "-pprof-addr", &pprof]);
    let (_, out, _) = status(consul.addr);
    assert!(out.contains("INC-1"), "the record is read: {out}");
    consul.with(|r| r.deny_read = vec![format!("{base}/meta/")]);
    let (_, out, err) = status(consul.addr);
    assert!(
        out.contains("records not read") && out.contains("X-Consul-Results-Filtered-By-ACLs"),
        "{out}{err}"
    );
    assert!(!out.contains("no record"), "{out}");
}
