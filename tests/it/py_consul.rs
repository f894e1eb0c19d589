//! A consul client this project did not write, `py-consul` from PyPI
//! (pinned in `ci/versions.yml`, installed by `.ci/run`), driven against
//! the dev KV (`-dev`): get/put (binary, empty, None), cas, flags, recurse,
//! delete (cas, recursive, a missing key), keys with a separator, blocking
//! gets, txn set/get/get-tree/get-or-empty/delete-tree, txn field names in
//! any case and an unknown one refused, `?dc=` elsewhere (500 "No path to
//! datacenter"), and consul's error shapes for sessions and ACLs (SPEC
//! §11). The calls are in `tests/it/py_consul/kv_calls.py`.
//!
//! Without python3 or the `consul` module the test is skipped with a
//! notice, except under `CI=true`, where it fails.

use std::process::Command;

use crate::support::{unique_prefix, Kv};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/it/py_consul/kv_calls.py"
);

/// Whether `python3 -c 'import consul'` works; why not otherwise.
fn py_consul() -> Result<(), String> {
    match Command::new("python3")
        .args(["-c", "import consul"])
        .output()
    {
        Err(e) => Err(format!("python3 cannot run: {e}")),
        Ok(o) if !o.status.success() => Err(format!(
            "python3 has no consul module (pip install py-consul): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

#[test]
fn py_consul_gets_consuls_answers_from_the_dev_kv() {
    if let Err(why) = py_consul() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("py-consul is required under CI=true: {why}");
        }
        eprintln!("SKIPPED py_consul_gets_consuls_answers_from_the_dev_kv: {why}");
        return;
    }
    let kv = Kv::dev();
    let p = unique_prefix("py_consul");
    let out = Command::new("python3")
        .arg(SCRIPT)
        .arg(kv.addr.to_string())
        .arg(&p)
        .output()
        .expect("python3 runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("every call answered as consul does"),
        "{stdout}"
    );
}
