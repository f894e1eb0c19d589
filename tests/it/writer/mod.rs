//! The writers (`set`, `unset`, `ramp`: SPEC §11) as an operator runs
//! them: the binary against the dev KV in a separate process (or a real
//! consul for the transaction conformance test), through the fault proxy
//! where a fault matters. Every wait polls with a deadline.

use crate::support;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::{http, unique_prefix, wait_for, Kv, Proc, BIN};
use standin::{Loss, Standin};

mod lost;
mod ramp;
mod records;
mod standin;
mod transactions;

const SEC: Duration = Duration::from_secs(1);

/// The writer command `args` against consul at `addr` under `prefix`.
fn writer(addr: SocketAddr, prefix: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .args([
            "-consul-addr",
            &format!("http://{addr}"),
            "-kv-prefix",
            prefix,
        ])
        .env_remove("CONSUL_HTTP_ADDR")
        .env_remove("CONSUL_HTTP_TOKEN");
    cmd
}

fn run(addr: SocketAddr, prefix: &str, args: &[&str]) -> (i32, String, String) {
    let out = writer(addr, prefix, args).output().expect("writer runs");
    triple(out)
}

fn triple(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A key's value and ModifyIndex, `None` when absent.
fn get(addr: SocketAddr, key: &str) -> Option<(String, u64)> {
    let (status, body) = http(addr, "GET", &format!("/v1/kv/{key}"), b"").expect("KV answers");
    if status == 404 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let e = &v[0];
    Some((value_of(e), e["ModifyIndex"].as_u64().unwrap()))
}

/// The value of one entry of a consul KV answer (base64 in `Value`).
fn value_of(e: &serde_json::Value) -> String {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(e["Value"].as_str().unwrap_or(""))
        .unwrap();
    String::from_utf8(raw).unwrap()
}

/// The records' prefix for a state prefix `p` (a single segment: `meta`
/// is a sibling only when there is a parent, so the tests' prefixes get
/// one).
fn meta(p: &str) -> String {
    match p.rsplit_once('/') {
        Some((parent, _)) => format!("{parent}/meta"),
        None => "meta".to_owned(),
    }
}

fn value(addr: SocketAddr, key: &str) -> Option<String> {
    get(addr, key).map(|(v, _)| v)
}

/// The index a recursive read of `prefix` reports.
fn prefix_index(addr: SocketAddr, prefix: &str) -> u64 {
    let target = format!("/v1/kv/{prefix}/?recurse");
    let (_, headers, _) = support::http_full(addr, "GET", &target, b"").expect("KV answers");
    let (_, v) = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("x-consul-index"))
        .expect("index header");
    String::from_utf8_lossy(v).trim().parse().unwrap()
}

#[test]
fn set_reads_prints_writes_in_one_transaction_and_prints_the_undo() {
    let kv = Kv::dev();
    let p = unique_prefix("set");
    kv.put(&format!("{p}/be/b"), "50%");
    kv.put(&format!("{p}/be/c"), "drain");
    let (code, out, err) = run(
        kv.addr,
        &p,
        &["set", "be/a=drain", "be/b=maint", "be/c=DRAIN"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("be/a: ready 100% (absent) -> drain 100%\n"),
        "{out}"
    );
    assert!(out.contains("be/b: ready 50% -> maint 100%\n"), "{out}");
    assert!(out.contains("be/c: drain 100% (unchanged)\n"), "{out}");
    assert!(out.contains("written: 2 keys in 1 transaction"), "{out}");
    let (a, b) = (
        get(kv.addr, &format!("{p}/be/a")).unwrap(),
        get(kv.addr, &format!("{p}/be/b")).unwrap(),
    );
    assert_eq!((a.0.as_str(), b.0.as_str()), ("drain", "maint"));
    assert_eq!(a.1, b.1, "one transaction, one index");
    let undo = out
        .lines()
        .find_map(|l| l.strip_prefix("undo: "))
        .expect("undo line");
    assert_eq!(
        undo,
        format!("gitlab-haproxy-agent set -consul-addr http://{} -kv-prefix {p} be/b=50% && gitlab-haproxy-agent unset -consul-addr http://{} -kv-prefix {p} be/a", kv.addr, kv.addr)
    );
    // The undo line does what it says.
    let status = Command::new("sh")
        .arg("-c")
        .arg(undo.replace("gitlab-haproxy-agent", BIN))
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(value(kv.addr, &format!("{p}/be/a")), None);
    assert_eq!(value(kv.addr, &format!("{p}/be/b")).as_deref(), Some("50%"));

    // Nothing to change: exit 0, nothing written.
    let before = prefix_index(kv.addr, &p);
    let (code, out, _) = run(kv.addr, &p, &["set", "be/c=drain", "-json"]);
    assert_eq!(code, 0);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["changes"][0]["unchanged"], true);
    assert_eq!(doc["undo"], serde_json::Value::Null);
    assert_eq!(prefix_index(kv.addr, &p), before);
}

#[test]
fn a_bad_value_or_identity_is_exit_2_every_one_named_and_nothing_written() {
    let kv = Kv::dev();
    let p = unique_prefix("bad");
    let before = prefix_index(kv.addr, &p);
    let (code, out, err) = run(
        kv.addr,
        &p,
        &["set", "be/a=drain", "be/b=drian", "be/c=up", "be/=maint"],
    );
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for named in [
        "be/b: value \"drian\"",
        "be/c: value \"up\"",
        "identity \"be/\"",
    ] {
        assert!(err.contains(named), "{named} in {err}");
    }
    assert_eq!(value(kv.addr, &format!("{p}/be/a")), None);
    assert_eq!(prefix_index(kv.addr, &p), before);
    let (code, _, err) = run(
        kv.addr,
        &p,
        &["ramp", "be/a", "-to", "100%", "-over", "5s", "-steps", "10"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("use -over 10s or more"), "{err}");
    kv.put(&format!("{p}/be/m"), "maint");
    let (code, _, err) = run(
        kv.addr,
        &p,
        &["ramp", "be/m", "-to", "100%", "-over", "10s"],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("be/m is in maint, which has no weight: give -from"),
        "{err}"
    );
}

#[test]
fn dry_run_writes_nothing_the_index_is_unchanged() {
    let kv = Kv::dev();
    let p = unique_prefix("dry");
    kv.put(&format!("{p}/be/a"), "drain");
    let before = prefix_index(kv.addr, &p);
    let (code, out, _) = run(kv.addr, &p, &["set", "be/a=50%", "be/b=maint", "-dry-run"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("be/a: drain 100% -> ready 50%") && out.contains("dry run: nothing written"),
        "{out}"
    );
    let (code, out, _) = run(kv.addr, &p, &["unset", "be/a", "-dry-run"]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = run(
        kv.addr,
        &p,
        &[
            "ramp", "be/a", "-to", "100%", "-over", "3s", "-steps", "3", "-dry-run",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(out, "+0s step 1 of 3: ready 33%\n+1s step 2 of 3: ready 67%\n+2s step 3 of 3: ready 100% (absent)\ndry run: nothing written\n");
    assert_eq!(prefix_index(kv.addr, &p), before);
    assert_eq!(
        value(kv.addr, &format!("{p}/be/a")).as_deref(),
        Some("drain")
    );
}

/// A write made between the read and the write: 409, nothing of the
/// transaction written, the key named with its new value and index.
#[test]
fn a_conflict_between_the_read_and_the_write_writes_nothing_and_names_the_key() {
    let kv = Kv::dev();
    let proxy = Proxy::start(kv.addr);
    let p = unique_prefix("conflict");
    kv.put(&format!("{p}/be/b"), "50%");
    proxy.set_mode(Mode::HoldPuts);
    let child = spawn_piped(writer(proxy.addr, &p, &["set", "be/a=drain", "be/b=drain"]));
    wait_for(10 * SEC, "the writer's PUT", || {
        proxy
            .request_heads()
            .iter()
            .any(|h| h.starts_with("PUT /v1/txn"))
            .then_some(())
    });
    kv.put(&format!("{p}/be/b"), "maint");
    let index = get(kv.addr, &format!("{p}/be/b")).unwrap().1;
    proxy.set_mode(Mode::Pass);
    let (code, out, err) = triple(child.wait_with_output().unwrap());
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("conflict: be/b was changed by someone else since it was read: it is now maint 100% (index {index})")),
        "{err}"
    );
    assert!(err.contains("not written: be/a be/b"), "{err}");
    assert!(!out.contains("undo:"), "{out}");
    assert_eq!(
        value(kv.addr, &format!("{p}/be/a")),
        None,
        "nothing of the transaction written"
    );
    assert_eq!(
        value(kv.addr, &format!("{p}/be/b")).as_deref(),
        Some("maint")
    );
    let puts = proxy
        .request_heads()
        .iter()
        .filter(|h| h.starts_with("PUT"))
        .count();
    assert_eq!(puts, 1, "never retried");
}

/// 130 keys: transactions of at most 32 keys (64 operations with their
/// records), in order; timed.
#[test]
fn one_hundred_thirty_keys_go_in_three_transactions() {
    let kv = Kv::dev();
    let proxy = Proxy::start(kv.addr);
    let p = unique_prefix("batches");
    let mut file = tempfile_in(&p);
    for i in 0..130 {
        writeln!(file.1, "be/s{i} drain # canary").unwrap();
    }
    drop(file.1);
    let path = file.0.to_str().unwrap().to_owned();
    // A key and its record go in the same transaction: 64 operations are
    // 32 keys.
    for n in [1usize, 32, 130] {
        kv.delete_tree(&p);
        let ids: Vec<String> = (0..n).map(|i| format!("be/s{i}=maint")).collect();
        let mut args = vec!["set"];
        args.extend(ids.iter().map(String::as_str));
        let t = Instant::now();
        let (code, out, err) = run(kv.addr, &p, &args);
        eprintln!("set of {n} keys: {:?}", t.elapsed());
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains(&format!(
                "written: {n} {} in {} {}",
                if n == 1 { "key" } else { "keys" },
                n.div_ceil(32),
                if n <= 32 {
                    "transaction"
                } else {
                    "transactions"
                }
            )),
            "{out}"
        );
    }
    kv.delete_tree(&p);
    let puts_before = proxy.request_heads().len();
    let (code, out, err) = run(proxy.addr, &p, &["set", "-f", &path]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("written: 130 keys in 5 transactions"), "{out}");
    let puts: Vec<String> = proxy
        .request_heads_since(puts_before)
        .into_iter()
        .filter(|h| h.starts_with("PUT /v1/txn"))
        .collect();
    assert_eq!(puts.len(), 5);
    let indexes: std::collections::BTreeSet<u64> = (0..130)
        .map(|i| {
            let (_, index) = get(kv.addr, &format!("{p}/be/s{i}")).unwrap();
            let record = get(kv.addr, &format!("{}/be/s{i}", meta(&p))).expect("a record");
            assert_eq!(record.1, index, "be/s{i} and its record: one transaction");
            index
        })
        .collect();
    assert_eq!(indexes.len(), 5, "five transactions, five indexes");
}

/// A file under the target dir for `-f`.
fn tempfile_in(name: &str) -> (std::path::PathBuf, std::fs::File) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("{name}.txt"));
    let f = std::fs::File::create(&path).unwrap();
    (path, f)
}

/// Every key holds the same step: the ramp's writes are whole.
///
/// One recursive read, so one index: reading the keys one by one could
/// straddle a step's transaction and see two steps that were never held
/// together.
fn one_step(addr: SocketAddr, p: &str, n: usize) -> Option<String> {
    let target = format!("/v1/kv/{p}/be/?recurse");
    let (status, _, body) = support::http_full(addr, "GET", &target, b"").expect("KV answers");
    let listed: Vec<serde_json::Value> = match status {
        404 => Vec::new(),
        _ => serde_json::from_slice(&body).unwrap(),
    };
    let held = |key: &str| listed.iter().find(|e| e["Key"] == key).map(value_of);
    let values: std::collections::BTreeSet<Option<String>> =
        (0..n).map(|i| held(&format!("{p}/be/s{i}"))).collect();
    assert_eq!(values.len(), 1, "keys hold different steps: {values:?}");
    values.into_iter().next().unwrap()
}

/// `ramp be/s0 ... be/s{n-1}` with `schedule`.
fn ramp(addr: SocketAddr, p: &str, n: usize, schedule: &[&str]) -> Command {
    let ids: Vec<String> = (0..n).map(|i| format!("be/s{i}")).collect();
    let mut args: Vec<&str> = vec!["ramp"];
    args.extend(ids.iter().map(String::as_str));
    args.extend(schedule);
    writer(addr, p, &args)
}

fn spawn_piped(mut cmd: Command) -> std::process::Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The line after `prefix` in `text`.
fn line_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in {text}"))
}

/// Runs a printed command line (undo, resume) through `sh -c`, as an
/// operator pastes it.
fn sh(line: &str) -> (i32, String, String) {
    triple(
        Command::new("sh")
            .arg("-c")
            .arg(line.replace("gitlab-haproxy-agent", BIN))
            .env_remove("CONSUL_HTTP_ADDR")
            .env_remove("CONSUL_HTTP_TOKEN")
            .output()
            .unwrap(),
    )
}

/// A key's raw entry as consul lists it (`Flags`, `ModifyIndex`, the
/// value decoded).
fn entry(addr: SocketAddr, key: &str) -> Option<serde_json::Value> {
    let (status, body) = http(addr, "GET", &format!("/v1/kv/{key}"), b"").expect("KV answers");
    (status == 200).then(|| serde_json::from_slice::<serde_json::Value>(&body).unwrap()[0].clone())
}

/// A record as KV holds it.
fn record(addr: SocketAddr, key: &str) -> Option<(serde_json::Value, u64)> {
    let (text, index) = get(addr, key)?;
    Some((
        serde_json::from_str(&text).expect("a record is JSON"),
        index,
    ))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A `-f` file saved with a UTF-8 byte-order mark: the mark is not part of
/// the first identity (it would write a key no haproxy asks for).
#[test]
fn a_byte_order_mark_is_not_part_of_the_first_identity() {
    let kv = Kv::dev();
    let p = unique_prefix("bom");
    let (path, mut file) = tempfile_in(&p);
    file.write_all("\u{feff}be/a drain\nbe/b=maint\n".as_bytes())
        .unwrap();
    drop(file);
    let (code, out, err) = run(kv.addr, &p, &["set", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        value(kv.addr, &format!("{p}/be/a")).as_deref(),
        Some("drain")
    );
    assert_eq!(
        value(kv.addr, &format!("{p}/be/b")).as_deref(),
        Some("maint")
    );
}
