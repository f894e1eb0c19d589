//! Transactions as consul answers them: conformance, a conflict in a later
//! batch, the drain runbook, cuts by bytes.

use super::*;

/// A failure in the second of three transactions: the first stays written,
/// the rest is not, and the command says which keys are which.
#[test]
fn a_conflict_in_a_later_batch_says_which_keys_were_written() {
    let kv = Kv::dev();
    let proxy = Proxy::start(kv.addr);
    let p = unique_prefix("batch_conflict");
    let ids: Vec<String> = (0..130).map(|i| format!("be/s{i}=drain")).collect();
    let mut args = vec!["set"];
    args.extend(ids.iter().map(String::as_str));
    proxy.set_mode(Mode::HoldPuts);
    let child = spawn_piped(writer(proxy.addr, &p, &args));
    wait_for(10 * SEC, "the first PUT", || {
        let heads = proxy.request_heads();
        heads
            .iter()
            .any(|h| h.starts_with("PUT /v1/txn"))
            .then_some(())
    });
    kv.put(&format!("{p}/be/s100"), "maint");
    proxy.set_mode(Mode::Pass);
    let (code, out, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 1, "{out}{err}");
    // 32 keys and their records a transaction: be/s100 is in the fourth.
    let written: Vec<String> = (0..96).map(|i| format!("be/s{i}")).collect();
    let not: Vec<String> = (96..130).map(|i| format!("be/s{i}")).collect();
    assert!(
        err.contains(&format!("written before it: {}\n", written.join(" "))),
        "{err}"
    );
    assert!(
        err.contains(&format!("not written: {}\n", not.join(" "))),
        "{err}"
    );
    assert!(err.contains("be/s100 was changed by someone else"), "{err}");
    assert_eq!(
        value(kv.addr, &format!("{p}/be/s95")).as_deref(),
        Some("drain")
    );
    assert_eq!(value(kv.addr, &format!("{p}/be/s96")), None);
    assert_eq!(
        value(kv.addr, &format!("{}/be/s96", meta(&p))),
        None,
        "nor its record"
    );
    assert_eq!(value(kv.addr, &format!("{p}/be/s129")), None);
    // The undo line covers what was written, and only that.
    let undo = out
        .lines()
        .find_map(|l| l.strip_prefix("undo: "))
        .expect("undo");
    assert!(
        undo.ends_with(" be/s95") && !undo.contains("be/s96 "),
        "{undo}"
    );
}

/// `-then drain` after a drain-down, and `set -f -` from standard input.
#[test]
fn a_drain_down_then_drain_and_a_file_on_stdin() {
    let kv = Kv::dev();
    let p = unique_prefix("then");
    let mut cmd = writer(kv.addr, &p, &["set", "-f", "-"]);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = b"# the canary\nbe/s0 50%\nbe/s1=50%\n\n";
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(one_step(kv.addr, &p, 2).as_deref(), Some("50%"));
    let schedule = ["-to", "0%", "-over", "2s", "-steps", "2", "-then", "drain"];
    let (code, out, err) = triple(ramp(kv.addr, &p, 2, &schedule).output().unwrap());
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("step 1 of 2: ready 25%") && out.contains("then: drain 100%"),
        "{out}"
    );
    assert_eq!(one_step(kv.addr, &p, 2).as_deref(), Some("drain"));
}

/// SPEC §13: every write by `set`, `unset`, `ramp` writes its record in
/// the same transaction as its state key (one ModifyIndex for both, read
/// back from the KV), `-for` puts the expiry in the key's Flags (consul's
/// opaque application integer: `api/kv.go` `KVPair.Flags`, set by a txn
/// op's `Flags` as `agent/txn_endpoint.go` `convertOps` copies it), and
/// `unset` and a ramp ending by deleting delete the record with the key.
#[test]
fn every_write_carries_its_record_in_the_same_transaction() {
    let kv = Kv::dev();
    let p = format!("{}/state", unique_prefix("records"));
    let m = meta(&p);
    let before = unix_now();
    let (code, out, err) = run(
        kv.addr,
        &p,
        &[
            "set",
            "be/a=drain",
            "be/b=50%",
            "-reason",
            "INC-123 db failover",
            "-for",
            "2h",
            "-by",
            "alice",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("be/a: ready 100% (absent) -> drain 100% until "),
        "{out}"
    );
    let a = entry(kv.addr, &format!("{p}/be/a")).unwrap();
    let (rec, rec_index) = record(kv.addr, &format!("{m}/be/a")).expect("a record");
    assert_eq!(
        a["ModifyIndex"].as_u64(),
        Some(rec_index),
        "one transaction, one index"
    );
    let until = a["Flags"].as_u64().unwrap();
    assert!(
        (before + 7200..=unix_now() + 7200).contains(&until),
        "{until}"
    );
    assert_eq!(rec["until"].as_u64(), Some(until));
    assert!(rec["by"].as_str().unwrap().starts_with("alice@"), "{rec}");
    assert_eq!(rec["reason"], "INC-123 db failover");
    assert_eq!(rec["value"], "drain");
    assert!((before..=unix_now()).contains(&rec["when"].as_u64().unwrap()));
    let command = rec["command"].as_str().unwrap();
    assert!(
        command.starts_with("gitlab-haproxy-agent set be/a=drain be/b=50%"),
        "{command}"
    );
    assert!(rec.to_string().len() <= 4096);
    // The same value again without -for keeps the expiry (unchanged);
    // -for none and -reason '' clear them: written.
    let (code, out, _) = run(kv.addr, &p, &["set", "be/a=drain"]);
    assert_eq!(code, 0);
    assert!(out.contains("(unchanged)"), "{out}");
    assert_eq!(
        entry(kv.addr, &format!("{p}/be/a")).unwrap()["Flags"],
        until
    );
    let (code, out, _) = run(
        kv.addr,
        &p,
        &["set", "be/a=drain", "-for", "none", "-reason", ""],
    );
    assert_eq!(code, 0);
    assert!(
        out.contains("be/a: drain 100% until ") && out.contains("-> drain 100%\n"),
        "{out}"
    );
    assert_eq!(entry(kv.addr, &format!("{p}/be/a")).unwrap()["Flags"], 0);
    let (rec, _) = record(kv.addr, &format!("{m}/be/a")).unwrap();
    assert!(
        rec.get("until").is_none() && rec.get("reason").is_none(),
        "{rec}"
    );
    // unset deletes the key and its record together.
    let (code, _, err) = run(kv.addr, &p, &["unset", "be/a", "be/b"]);
    assert_eq!(code, 0, "{err}");
    for id in ["be/a", "be/b"] {
        assert_eq!(get(kv.addr, &format!("{p}/{id}")), None);
        assert_eq!(get(kv.addr, &format!("{m}/{id}")), None, "{id}'s record");
    }
}

/// Undo lines run as printed whatever the identities: one starting with
/// `-` (after `--`), one holding `=` (split at the last `=`), one needing
/// quotes.
#[test]
fn undo_lines_run_as_printed_whatever_the_identities() {
    let kv = Kv::dev();
    let p = unique_prefix("undo");
    kv.put(&format!("{p}/-x"), "50%");
    kv.put(&format!("{p}/be/a=b"), "maint");
    let addr = format!("http://{}", kv.addr);
    let words = [
        "set",
        "-consul-addr",
        &addr,
        "-kv-prefix",
        &p,
        "--",
        "-x=drain",
        "be/a=b=drain",
        "it's=drain",
    ];
    let (code, out, err) = triple(
        Command::new(BIN)
            .args(words)
            .env_remove("CONSUL_HTTP_ADDR")
            .env_remove("CONSUL_HTTP_TOKEN")
            .output()
            .unwrap(),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        value(kv.addr, &format!("{p}/be/a=b")).as_deref(),
        Some("drain")
    );
    let undo = line_after(&out, "undo: ");
    let (code, o, e) = sh(undo);
    assert_eq!(code, 0, "{undo}: {o}{e}");
    assert_eq!(value(kv.addr, &format!("{p}/-x")).as_deref(), Some("50%"));
    assert_eq!(
        value(kv.addr, &format!("{p}/be/a=b")).as_deref(),
        Some("maint")
    );
    assert_eq!(value(kv.addr, &format!("{p}/it's")), None);
}
