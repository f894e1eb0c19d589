//! Answers refused or lost on the way back (the consul stand-in), and the
//! undo and resume lines the writers print.

use super::*;

/// `ramp r/b r/b` is refused before anything is sent, as `set` refuses it.
#[test]
fn ramp_refuses_a_repeated_identity() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("ramp_twice");
    let (code, _, err) = run(
        consul.addr,
        &p,
        &[
            "ramp", "r/b", "r/b", "-to", "0%", "-over", "2s", "-steps", "2",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("r/b: named twice"), "{err}");
    assert_eq!(consul.rules.lock().unwrap().txns, 0);
}

/// Consul applies the transaction, then the answer never comes (a reset,
/// or a 500 after the raft entry was enqueued: it may commit): the writer
/// re-reads, says each key is applied, and prints the undo that restores
/// the earlier values. The undo runs.
#[test]
fn an_answer_lost_after_apply_is_reported_applied_with_its_undo() {
    for loss in [Loss::Dropped, Loss::Status500] {
        let kv = Kv::dev();
        let consul = Standin::start(kv.addr);
        let p = unique_prefix("lost_applied");
        kv.put(&format!("{p}/be/a"), "50%");
        consul.with(|r| r.losses.push_back(loss));
        let (code, out, err) = run(consul.addr, &p, &["set", "be/a=drain", "be/b=drain"]);
        assert_eq!(code, 1, "{loss:?}: {out}{err}");
        assert!(
            err.contains("be/a: applied: it now holds drain 100%"),
            "{loss:?}: {err}"
        );
        assert!(
            err.contains("be/b: applied: it now holds drain 100%"),
            "{loss:?}: {err}"
        );
        assert!(!err.contains("not written"), "{loss:?}: {err}");
        let undo = line_after(&out, "undo: ");
        assert!(
            undo.contains("be/a=50%") && undo.contains("unset"),
            "{undo}"
        );
        let (code, _, e) = sh(undo);
        assert_eq!(code, 0, "{e}");
        assert_eq!(value(kv.addr, &format!("{p}/be/a")).as_deref(), Some("50%"));
        assert_eq!(value(kv.addr, &format!("{p}/be/b")), None);
    }
}

/// The answer lost before consul applied it: the re-read finds the old
/// values, and the writer says "unknown" (consul may still commit it),
/// never "not written".
#[test]
fn an_answer_lost_before_apply_is_unknown_never_not_written() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("lost_unknown");
    consul.with(|r| r.losses.push_back(Loss::Unsent));
    let (code, out, err) = run(consul.addr, &p, &["set", "be/a=drain", "-json"]);
    assert_eq!(code, 1, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["changes"][0]["unknown"], true);
    assert_eq!(doc["changes"][0]["written"], false);
    let (code, out, err) = {
        consul.with(|r| r.losses.push_back(Loss::Unsent));
        run(consul.addr, &p, &["set", "be/a=drain"])
    };
    assert_eq!(code, 1);
    assert!(
        err.contains("be/a: unknown: it still holds ready 100% (absent)"),
        "{err}"
    );
    assert!(err.contains("consul may still commit"), "{err}");
    assert!(!err.contains("not written"), "{err}");
    assert!(!out.contains("undo:"), "{out}");
}

/// A transaction applies whole or not at all (consul's `TxnRW` commits
/// only without errors): a lost answer while another writer changed one of
/// its keys is "not written" for every key of it, never "applied" for the
/// keys that happen to hold their targets.
#[test]
fn a_lost_answer_over_another_writer_is_not_written_for_every_key() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("lost_race");
    kv.put(&format!("{p}/be/b"), "50%");
    let (addr, key) = (kv.addr, format!("{p}/be/a"));
    consul.with(|r| {
        r.losses.push_back(Loss::Unsent);
        r.before_loss = Some(Box::new(move || {
            support::http(addr, "PUT", &format!("/v1/kv/{key}"), b"drain").unwrap();
        }));
    });
    let (code, out, err) = run(
        consul.addr,
        &p,
        &["set", "be/a=maint", "be/b=25%", "be/c=drain", "-json"],
    );
    assert_eq!(code, 1, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    for change in doc["changes"].as_array().unwrap() {
        assert_eq!(change["written"], false, "{out}");
        assert_eq!(change["unknown"], false, "{out}");
    }
    assert!(
        err.contains("be/a was changed by someone else meanwhile"),
        "{err}"
    );
    assert_eq!(
        value(kv.addr, &format!("{p}/be/c")),
        None,
        "nothing of it written"
    );
    assert_eq!(value(kv.addr, &format!("{p}/be/b")).as_deref(), Some("50%"));
}

/// A ramp whose step's answer is lost after consul applied it stops (exit
/// 1), says the keys hold that step (not the one before), and resumes
/// from there.
#[test]
fn a_ramp_that_loses_a_steps_answer_stops_at_what_the_keys_hold() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("ramp_lost");
    let schedule = ["-from", "0%", "-to", "100%", "-over", "3s", "-steps", "3"];
    let child = spawn_piped(ramp(consul.addr, &p, 2, &schedule));
    wait_for(5 * SEC, "step 1", || {
        (one_step(kv.addr, &p, 2).as_deref() == Some("33%")).then_some(())
    });
    consul.with(|r| r.losses.push_back(Loss::Dropped));
    let (code, out, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("step 2 of 3 was applied; the keys hold ready 67%"),
        "{err}"
    );
    let resume = line_after(&out, "resume: ");
    // One step left: a weight, not a count of steps (`-steps 100` would
    // ask for a hundred writes over 1 s and be refused).
    assert!(
        resume.contains("-over 1s -steps 100% be/s0 be/s1"),
        "{resume}"
    );
    assert_eq!(one_step(kv.addr, &p, 2).as_deref(), Some("67%"));
    let (code, out, err) = sh(resume);
    assert_eq!(code, 0, "{resume}: {out}{err}");
    assert_eq!(one_step(kv.addr, &p, 2), None, "ended at 100%: deleted");
}

/// A step's answer lost while an operator changed a key: the step's
/// check-and-set can never commit (consul's `kvsSetCASTxn` refuses a moved
/// index), so it is a conflict (exit 1, no resume line: a ramp never
/// fights an operator), not an unknown.
#[test]
fn a_lost_answer_over_an_operators_write_is_a_conflict() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("ramp_lost_race");
    let schedule = ["-from", "0%", "-to", "100%", "-over", "3s", "-steps", "3"];
    let child = spawn_piped(ramp(consul.addr, &p, 2, &schedule));
    wait_for(5 * SEC, "step 1", || {
        (one_step(kv.addr, &p, 2).as_deref() == Some("33%")).then_some(())
    });
    consul.with(|r| r.losses.push_back(Loss::Unsent));
    kv.put(&format!("{p}/be/s0"), "drain");
    let (code, out, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("be/s0: changed by someone else while the answer was lost"),
        "{err}"
    );
    assert!(!out.contains("resume: "), "{out}");
    assert!(!err.contains("may still commit"), "{err}");
}

/// Consul refuses a transaction body over 512 KiB (`txn_max_req_len`,
/// `agent/txn_endpoint.go` `convertOps`) with 413: 60 identities of 10,000
/// bytes (allowed by `-max-line-bytes 65536`) go in two transactions,
/// each under it, in order.
#[test]
fn transactions_are_cut_by_bytes_as_well_as_operations() {
    let kv = Kv::dev();
    let proxy = Proxy::start(kv.addr);
    let p = unique_prefix("bytes");
    let (path, mut file) = tempfile_in(&p);
    for i in 0..60 {
        writeln!(file, "be/{i:02}{} drain", "x".repeat(9_995)).unwrap();
    }
    drop(file);
    let (code, out, err) = run(
        proxy.addr,
        &p,
        &[
            "set",
            "-max-line-bytes",
            "65536",
            "-f",
            path.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    // Each key is about 20 KB with its record's key: 25 fit in 512 KiB.
    assert!(
        out.contains("written: 60 keys in 3 transactions"),
        "{}",
        &out[out.len().saturating_sub(300)..]
    );
    let puts: Vec<String> = proxy
        .request_heads()
        .into_iter()
        .filter(|h| h.starts_with("PUT /v1/txn"))
        .collect();
    assert_eq!(puts.len(), 3);
    for h in &puts {
        let len: usize = h
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .expect("Content-Length")
            .trim()
            .parse()
            .unwrap();
        assert!(len <= 512 * 1024, "{len}");
    }
}

/// An identity longer than `-max-line-bytes` (256) can never be asked for:
/// `set` and `ramp` refuse it before sending anything (exit 2); `unset` may
/// still delete it.
#[test]
fn identities_the_daemon_cannot_answer_are_refused_before_writing() {
    let kv = Kv::dev();
    let consul = Standin::start(kv.addr);
    let p = unique_prefix("long");
    let long = format!("be/{}", "l".repeat(260));
    let (code, _, err) = run(consul.addr, &p, &["set", &format!("{long}=drain")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("longer than -max-line-bytes (256)"), "{err}");
    let (code, _, err) = run(
        consul.addr,
        &p,
        &["ramp", &long, "-to", "0%", "-over", "2s", "-steps", "2"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("longer than -max-line-bytes (256)"), "{err}");
    assert_eq!(consul.rules.lock().unwrap().txns, 0, "nothing sent");
    kv.put(&format!("{p}/{long}"), "drain");
    let (code, _, err) = run(consul.addr, &p, &["unset", &long]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(value(kv.addr, &format!("{p}/{long}")), None);
}

/// `ready` over an absent key answers as it does already: unchanged, not
/// written. Over an invalid value it is written (it fixes the key), and
/// a 500 KiB invalid value is shown cut to 80 bytes; the undo says it
/// cannot write it back.
#[test]
fn unchanged_is_by_reply_and_an_invalid_value_is_shown_cut_and_not_restorable() {
    let kv = Kv::dev();
    let p = unique_prefix("unchanged");
    let before = prefix_index(kv.addr, &p);
    let (code, out, _) = run(kv.addr, &p, &["set", "be/x=ready"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("be/x: ready 100% (absent) (unchanged)") && out.contains("nothing to change"),
        "{out}"
    );
    assert_eq!(prefix_index(kv.addr, &p), before);
    kv.put(&format!("{p}/be/y"), &"z".repeat(500 * 1024));
    let (code, out, err) = run(kv.addr, &p, &["set", "be/y=ready"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.len() < 1_000, "values are cut: {} bytes", out.len());
    assert!(
        out.contains(&format!(
            "(invalid value \"{}…\") -> ready 100%",
            "z".repeat(80)
        )),
        "{out}"
    );
    assert_eq!(
        value(kv.addr, &format!("{p}/be/y")).as_deref(),
        Some("ready")
    );
    assert!(out.contains("undo cannot restore: be/y held"), "{out}");
}
