//! A second consul client this project did not write, node-consul (npm
//! `consul`, pinned by `tests/it/node_consul/package-lock.json`, installed
//! there by `scripts/prepare-dev-env.sh` with `npm ci`), driven against the
//! dev KV (`-dev`) by `tests/it/node_consul/kv_transaction.test.js` under
//! node's own test runner: the cases of node-consul's KV and transaction
//! acceptance tests, every KV txn verb, `?dc=` elsewhere, a txn body's
//! field names, a read-only txn's headers (SPEC §11).
//!
//! Without node or the installed package the test is skipped with a
//! notice, except under `CI=true`, where it fails.

use std::path::Path;
use std::process::Command;

use crate::support::{unique_prefix, Kv};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/node_consul");

/// Whether node runs and node-consul is installed; why not otherwise.
fn node_consul() -> Result<(), String> {
    match Command::new("node").arg("--version").output() {
        Err(e) => return Err(format!("node cannot run: {e}")),
        Ok(o) if !o.status.success() => return Err("node --version failed".into()),
        Ok(_) => {}
    }
    let installed = Path::new(DIR).join("node_modules/consul/package.json");
    match installed.exists() {
        true => Ok(()),
        false => Err(format!(
            "node-consul is not installed in {DIR} (scripts/prepare-dev-env.sh, or npm ci there)"
        )),
    }
}

/// The counts node's TAP reporter ends with (`# pass N`, ...).
fn count(tap: &str, what: &str) -> Option<u32> {
    tap.lines()
        .find_map(|l| l.strip_prefix(&format!("# {what} ")))
        .and_then(|n| n.trim().parse().ok())
}

#[test]
fn node_consul_gets_consuls_answers_from_the_dev_kv() {
    if let Err(why) = node_consul() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("node-consul is required under CI=true: {why}");
        }
        eprintln!("SKIPPED node_consul_gets_consuls_answers_from_the_dev_kv: {why}");
        return;
    }
    let kv = Kv::dev();
    let out = Command::new("node")
        .args(["--test", "--test-reporter=tap", "kv_transaction.test.js"])
        .current_dir(DIR)
        .env("NODE_CONSUL_ADDR", kv.addr.to_string())
        .env("NODE_CONSUL_PREFIX", unique_prefix("node_consul"))
        .output()
        .expect("node runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let (tests, pass) = (count(&stdout, "tests"), count(&stdout, "pass"));
    assert!(
        out.status.success() && tests.is_some_and(|n| n >= 16) && pass == tests,
        "node-consul: {pass:?} of {tests:?} passed\n{stdout}{stderr}"
    );
}
