//! `PUT /v1/txn` over the store, for the KV verbs `set`, `cas`, `get`,
//! `delete`, `delete-cas`, `check-index` and `check-not-exists`, as consul
//! answers them (`agent/txn_endpoint.go`, `agent/consul/state/txn.go`).
//!
//! In: the request body (consul's API shape, `[{"KV": {"Verb", "Key",
//! "Value" (base64), "Flags", "Index"}}]`) and `now`. Out: the response.
//! Always holds: every operation runs in order on one copy of the store and
//! every write takes the same new index, so a blocking watch sees one
//! change; if any operation fails, nothing is applied and the answer is 409
//! with every failure (`OpIndex`, `What`), as consul collects them.
//!
//! Deliberate differences: only KV operations (a `Node`, `Service`,
//! `Check` or `Session` operation fails like an unknown verb); no sessions,
//! so `lock`, `unlock` and `check-session` fail as unknown verbs; field
//! names are matched exactly as consul's API client writes them.

use std::time::Instant;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::api::{dir_entry, error, json_bytes, wrapped, DirEntry, MAX_VALUE_SIZE};
use super::store::{Entry, Store};
use crate::gocompat::go_quote;
use crate::http::Response;

/// consul 1.14+'s `maxTxnOps`: more operations are refused with 413.
pub const MAX_TXN_OPS: usize = 128;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Op {
    #[serde(rename = "KV")]
    kv: Option<KvOp>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct KvOp {
    verb: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    flags: u64,
    #[serde(default)]
    index: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Answer<'a> {
    results: Option<Vec<TxnResult<'a>>>,
    errors: Option<&'a [TxnError]>,
}

#[derive(Serialize)]
struct TxnResult<'a> {
    #[serde(rename = "KV")]
    kv: DirEntry<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct TxnError {
    op_index: usize,
    what: String,
}

/// One operation's result: the key and its entry after the operation, the
/// value kept only for a `get` (consul blanks it for the others).
type Done = (String, Entry);

/// Answers `PUT /v1/txn` with `body`.
pub fn handle(store: &mut Store, body: &[u8], now: Instant) -> Response {
    match decode(body) {
        Ok(ops) => apply(store, &ops, now),
        Err(refused) => refused,
    }
}

/// One decoded operation: a KV operation and its value, or `None` for an
/// operation the dev KV does not have (a `Node`, `Service`, ...).
type Decoded = Option<(KvOp, Vec<u8>)>;

/// The body as consul's `convertOps` reads it, with its refusals in its
/// order: the body's size (413), its JSON (400), the operation count
/// (413), each value's base64 (400) and size (413).
fn decode(body: &[u8]) -> Result<Vec<Decoded>, Response> {
    if body.len() > MAX_VALUE_SIZE {
        return Err(error(
            413,
            &format!("Request body too large, max size: {MAX_VALUE_SIZE} bytes. See https://www.consul.io/docs/agent/config/config-files#txn_max_req_len."),
        ));
    }
    let ops: Vec<Op> = serde_json::from_slice(body)
        .map_err(|e| error(400, &format!("Failed to parse body: {e}")))?;
    if ops.len() > MAX_TXN_OPS {
        return Err(error(
            413,
            &format!(
                "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
                ops.len()
            ),
        ));
    }
    ops.into_iter()
        .map(|op| op.kv.map(decode_value).transpose())
        .collect()
}

/// A KV operation's value, base64-decoded and within `kv_max_value_size`.
fn decode_value(kv: KvOp) -> Result<(KvOp, Vec<u8>), Response> {
    let value = match kv.value.as_deref() {
        None => Vec::new(),
        Some(v) => base64::engine::general_purpose::STANDARD
            .decode(v)
            .map_err(|e| error(400, &format!("Failed to parse body: {e}")))?,
    };
    if value.len() > MAX_VALUE_SIZE {
        return Err(error(
            413,
            &format!(
                "Value for key {} is too large ({} > {MAX_VALUE_SIZE} bytes)",
                go_quote(&kv.key),
                value.len()
            ),
        ));
    }
    Ok((kv, value))
}

/// Runs every operation on one copy of the store (consul's `TxnRW` over
/// `txnDispatch`): all applied at one index and 200 with `Results`, or
/// none and 409 with every failure in `Errors`.
fn apply(store: &mut Store, ops: &[Decoded], now: Instant) -> Response {
    let applied = store.transaction(|store| {
        let mut results = Vec::new();
        let mut errors = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let done = match op {
                Some((kv, value)) => run(store, kv, value, now),
                None => Err("no operation specified (the dev KV has KV operations only)".into()),
            };
            match done {
                Ok(Some(d)) => results.push(d),
                Ok(None) => {}
                Err(what) => errors.push(TxnError { op_index: i, what }),
            }
        }
        match errors.is_empty() {
            true => Ok(results),
            false => Err(errors),
        }
    });
    let (status, answer) = match &applied {
        Ok(done) => (
            200,
            Answer {
                results: Some(
                    done.iter()
                        .map(|(k, e)| TxnResult {
                            kv: dir_entry(k, e),
                        })
                        .collect(),
                ),
                errors: None,
            },
        ),
        Err(errors) => (
            409,
            Answer {
                results: None,
                errors: Some(errors.as_slice()),
            },
        ),
    };
    wrapped(
        status,
        vec![("Content-Type", "application/json".to_owned())],
        json_bytes(&answer, false),
    )
}

/// One KV operation (consul's `txnKVS`).
fn run(store: &mut Store, op: &KvOp, value: &[u8], now: Instant) -> Result<Option<Done>, String> {
    let key = op.key.as_str();
    let blank = |store: &Store| {
        store.get(key).map(|e| {
            let entry = Entry {
                value: Vec::new(),
                ..e.clone()
            };
            (key.to_owned(), entry)
        })
    };
    match op.verb.as_str() {
        "set" => {
            store.put(key, value, op.flags, None);
            Ok(blank(store))
        }
        "cas" => match store.put(key, value, op.flags, Some(op.index)) {
            true => Ok(blank(store)),
            false => Err(format!(
                "failed to set key {}, index is stale",
                go_quote(key)
            )),
        },
        "delete" => {
            store.delete(key, None, now);
            Ok(None)
        }
        "delete-cas" => match store.delete(key, Some(op.index), now) {
            true => Ok(None),
            false => Err(format!(
                "failed to delete key {}, index is stale",
                go_quote(key)
            )),
        },
        "get" => match store.get(key) {
            Some(e) => Ok(Some((key.to_owned(), e.clone()))),
            None => Err(format!("key {} doesn't exist", go_quote(key))),
        },
        "check-index" => match store.get(key) {
            None => Err(format!(
                "failed to check index, key {} doesn't exist",
                go_quote(key)
            )),
            Some(e) if e.modify_index != op.index => Err(format!(
                "failed index check for key {}, current modify index {} != {}",
                go_quote(key),
                e.modify_index,
                op.index
            )),
            Some(_) => Ok(blank(store)),
        },
        "check-not-exists" => match store.get(key) {
            Some(_) => Err(format!("key {} exists", go_quote(key))),
            None => Ok(None),
        },
        verb => Err(format!("unknown KV verb {}", go_quote(verb))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devkv::api::tests::req;
    use crate::devkv::{DevKv, Handled};

    fn call(kv: &mut DevKv, method: &str, path: &str, body: &[u8]) -> Response {
        match kv.handle(&req(method, path), body, Instant::now()) {
            Handled::Respond(r) => r,
            Handled::Wait(w) => panic!("{path} blocked: {w:?}"),
        }
    }

    fn txn(kv: &mut DevKv, ops: serde_json::Value) -> (u16, serde_json::Value) {
        let r = call(kv, "PUT", "/v1/txn", ops.to_string().as_bytes());
        let body = match r.status {
            200 | 409 => serde_json::from_slice(&r.body).unwrap(),
            _ => serde_json::Value::String(String::from_utf8(r.body).unwrap()),
        };
        (r.status, body)
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn op(verb: &str, key: &str, value: Option<&str>, index: u64) -> serde_json::Value {
        serde_json::json!({"KV": {"Verb": verb, "Key": key, "Value": value.map(b64), "Index": index}})
    }

    fn value(kv: &DevKv, key: &str) -> Option<Vec<u8>> {
        kv.store().get(key).map(|e| e.value.clone())
    }

    /// `p/a` holding `drain` (its index), and a blocking listing of `p/`
    /// parked at that index.
    fn drain_watched(kv: &mut DevKv) -> (u64, crate::devkv::Wait) {
        kv.store_mut().put("p/a", b"drain", 0, None);
        let a = kv.store().get("p/a").unwrap().modify_index;
        let target = format!("/v1/kv/p/?recurse&index={a}");
        match kv.handle(&req("GET", &target), b"", Instant::now()) {
            Handled::Wait(w) => (a, w),
            Handled::Respond(r) => panic!("answered: {}", r.status),
        }
    }

    #[test]
    fn a_transaction_applies_every_write_at_one_index_and_wakes_a_watch_once() {
        let mut kv = DevKv::new(false);
        let (a, parked) = drain_watched(&mut kv);
        let before = kv.generation();
        let (status, body) = txn(
            &mut kv,
            serde_json::json!([
                op("cas", "p/a", Some("50%"), a),
                op("cas", "p/b", Some("drain"), 0),
                op("set", "p/c", Some("maint"), 0)
            ]),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            kv.generation(),
            before + 1,
            "one index for the whole transaction"
        );
        let results = body["Results"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        for (r, key) in results.iter().zip(["p/a", "p/b", "p/c"]) {
            assert_eq!(r["KV"]["Key"], key);
            assert_eq!(r["KV"]["ModifyIndex"], before + 1);
            assert_eq!(
                r["KV"]["Value"],
                serde_json::Value::Null,
                "writes answer without the value"
            );
        }
        assert_eq!(results[0]["KV"]["CreateIndex"], a);
        assert_eq!(body["Errors"], serde_json::Value::Null);
        assert_eq!(value(&kv, "p/a").unwrap(), b"50%");
        assert!(kv.is_ready(&parked));
    }

    /// Every failed operation is in `Errors` and nothing is applied:
    /// consul's `agent/consul/state/txn.go` `txnDispatch` runs every
    /// operation and appends each error with its `OpIndex`; `TxnRW`
    /// commits only when there is none.
    #[test]
    fn a_stale_index_fails_the_whole_transaction_with_every_error_and_nothing_applied() {
        let mut kv = DevKv::new(false);
        kv.store_mut().put("p/a", b"drain", 0, None);
        kv.store_mut().put("p/b", b"maint", 0, None);
        let a = kv.store().get("p/a").unwrap().modify_index;
        let before = kv.generation();
        let (status, body) = txn(
            &mut kv,
            serde_json::json!([
                op("set", "p/x", Some("drain"), 0),
                op("cas", "p/a", Some("50%"), a + 100),
                op("cas", "p/b", Some("50%"), 0),
                op("delete-cas", "p/a", None, a + 1),
                op("check-index", "p/b", None, 3),
                op("check-not-exists", "p/a", None, 0),
                op("get", "p/none", None, 0),
                op("lock", "p/a", None, 0),
            ]),
        );
        assert_eq!(status, 409);
        assert_eq!(body["Results"], serde_json::Value::Null);
        let b = kv.store().get("p/b").unwrap().modify_index;
        let expected = serde_json::json!([
            {"OpIndex": 1, "What": "failed to set key \"p/a\", index is stale"},
            {"OpIndex": 2, "What": "failed to set key \"p/b\", index is stale"},
            {"OpIndex": 3, "What": "failed to delete key \"p/a\", index is stale"},
            {"OpIndex": 4, "What": format!("failed index check for key \"p/b\", current modify index {b} != 3")},
            {"OpIndex": 5, "What": "key \"p/a\" exists"},
            {"OpIndex": 6, "What": "key \"p/none\" doesn't exist"},
            {"OpIndex": 7, "What": "unknown KV verb \"lock\""},
        ]);
        assert_eq!(body["Errors"], expected);
        assert_eq!(kv.generation(), before, "nothing applied");
        assert_eq!(value(&kv, "p/x"), None);
        assert_eq!(value(&kv, "p/a").unwrap(), b"drain");
    }

    #[test]
    fn reads_checks_and_deletes_answer_as_consul_does() {
        let mut kv = DevKv::new(false);
        kv.store_mut().put("p/a", b"drain", 0, None);
        kv.store_mut().put("p/b", b"maint", 0, None);
        let (a, b) = (
            kv.store().get("p/a").unwrap().modify_index,
            kv.store().get("p/b").unwrap().modify_index,
        );
        let (status, body) = txn(
            &mut kv,
            serde_json::json!([
                op("get", "p/a", None, 0),
                op("check-index", "p/b", None, b),
                op("check-not-exists", "p/c", None, 0),
                op("delete-cas", "p/a", None, a),
                op("delete", "p/b", None, 0),
            ]),
        );
        assert_eq!(status, 200, "{body}");
        let results = body["Results"].as_array().unwrap();
        assert_eq!(
            results.len(),
            2,
            "deletes and check-not-exists have no result"
        );
        assert_eq!(
            results[0]["KV"]["Value"],
            b64("drain"),
            "get keeps the value"
        );
        assert_eq!(results[1]["KV"]["Key"], "p/b");
        assert_eq!(results[1]["KV"]["Value"], serde_json::Value::Null);
        assert_eq!((value(&kv, "p/a"), value(&kv, "p/b")), (None, None));
    }

    /// `agent/txn_endpoint.go` `convertOps`: more than `maxTxnOps` (128
    /// since 1.14) is 413.
    #[test]
    fn past_128_operations_is_413_and_128_is_applied() {
        let mut kv = DevKv::new(false);
        let ops = |n: usize| {
            serde_json::Value::Array(
                (0..n)
                    .map(|i| op("set", &format!("k{i}"), Some("drain"), 0))
                    .collect(),
            )
        };
        let (status, body) = txn(&mut kv, ops(129));
        assert_eq!(
            (status, body.as_str().unwrap()),
            (413, "Transaction contains too many operations (129 > 128)")
        );
        assert_eq!(value(&kv, "k0"), None);
        let (status, _) = txn(&mut kv, ops(128));
        assert_eq!(status, 200);
        assert_eq!(kv.store().list("k").count(), 128);
    }

    #[test]
    fn a_bad_body_is_400_and_other_methods_405() {
        let mut kv = DevKv::new(false);
        let r = call(&mut kv, "PUT", "/v1/txn", b"{not json");
        assert_eq!(r.status, 400);
        assert!(String::from_utf8_lossy(&r.body).starts_with("Failed to parse body: "));
        let r = call(
            &mut kv,
            "PUT",
            "/v1/txn",
            br#"[{"KV":{"Verb":"set","Key":"k","Value":"!!"}}]"#,
        );
        assert_eq!(r.status, 400);
        let r = call(&mut kv, "GET", "/v1/txn", b"");
        assert_eq!(
            (r.status, String::from_utf8_lossy(&r.body).as_ref()),
            (405, "method GET not allowed")
        );
    }

    /// Writing a key's value again keeps its ModifyIndex and wakes no
    /// watcher: `agent/consul/state/kvs.go` `kvsSetTxn`, "Skip further
    /// writing in the state store if the entry is not actually changed"
    /// (`existing.Equal(entry)`: `entry.ModifyIndex =
    /// existing.ModifyIndex; return nil`, no insert, no index bump). The
    /// result still names the key, at its old index.
    #[test]
    fn a_same_value_write_keeps_the_modify_index_and_wakes_no_watcher() {
        let mut kv = DevKv::new(false);
        let (a, parked) = drain_watched(&mut kv);
        let before = kv.generation();
        let (status, body) = txn(
            &mut kv,
            serde_json::json!([
                op("cas", "p/a", Some("drain"), a),
                op("set", "p/a", Some("drain"), 0)
            ]),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["Results"][0]["KV"]["ModifyIndex"], a);
        assert_eq!(body["Results"][1]["KV"]["ModifyIndex"], a);
        assert_eq!(kv.generation(), before, "no new index");
        assert_eq!(kv.store().get("p/a").unwrap().modify_index, a);
        assert!(!kv.is_ready(&parked), "no watcher woken");
        let r = call(&mut kv, "PUT", "/v1/kv/p/a", b"drain");
        assert_eq!((r.status, kv.generation()), (200, before), "nor by /v1/kv");
    }

    /// `delete-cas` of a missing key succeeds whatever the index:
    /// `agent/consul/state/kvs.go` `kvsDeleteCASTxn` returns `entry ==
    /// nil` when the index does not match, so a missing key is `true`.
    #[test]
    fn delete_cas_of_a_missing_key_succeeds_whatever_the_index() {
        let mut kv = DevKv::new(false);
        let before = kv.generation();
        let (status, body) = txn(
            &mut kv,
            serde_json::json!([
                op("delete-cas", "p/none", None, 0),
                op("delete-cas", "p/gone", None, 12345)
            ]),
        );
        assert_eq!(
            (status, &body["Errors"]),
            (200, &serde_json::Value::Null),
            "{body}"
        );
        assert_eq!(kv.generation(), before, "nothing changed");
    }

    /// `Results` has no entry for a delete: `agent/consul/state/txn.go`
    /// `txnKVS` returns `nil, nil` when `entry` is nil (`delete`,
    /// `delete-cas`, `delete-tree`, `check-not-exists`), so results are
    /// positions in the results, not in the operations.
    #[test]
    fn results_have_no_entry_for_a_delete() {
        let mut kv = DevKv::new(false);
        kv.store_mut().put("p/a", b"drain", 0, None);
        let a = kv.store().get("p/a").unwrap().modify_index;
        let (status, body) = txn(
            &mut kv,
            serde_json::json!([
                op("delete-cas", "p/a", None, a),
                op("cas", "p/b", Some("maint"), 0),
                op("delete", "p/c", None, 0),
                op("cas", "p/d", Some("50%"), 0),
            ]),
        );
        assert_eq!(status, 200, "{body}");
        let keys: Vec<&str> = body["Results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["KV"]["Key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["p/b", "p/d"]);
    }

    /// A body over `txn_max_req_len` (512 KiB) is 413 before it is read,
    /// and so is a value over `kv_max_value_size`: `agent/txn_endpoint.go`
    /// `convertOps` ("Request body too large", "Value for key %q is too
    /// large").
    #[test]
    fn past_512_kib_a_body_or_a_value_is_413_and_nothing_applied() {
        let mut kv = DevKv::new(false);
        let body = vec![b' '; MAX_VALUE_SIZE + 1];
        let r = call(&mut kv, "PUT", "/v1/txn", &body);
        assert_eq!(r.status, 413);
        assert!(String::from_utf8_lossy(&r.body)
            .starts_with("Request body too large, max size: 524288 bytes"));
        let mut fits = serde_json::json!([op("set", "p/a", Some(""), 0)])
            .to_string()
            .into_bytes();
        fits.resize(MAX_VALUE_SIZE, b' ');
        assert_eq!(
            call(&mut kv, "PUT", "/v1/txn", &fits).status,
            200,
            "the limit itself fits"
        );
        // A value of 512 KiB + 1 in a body under the limit cannot be built
        // (base64 grows it by a third): a smaller limit than the body's
        // is checked on the decoded value.
        let (status, body) = txn(
            &mut kv,
            serde_json::json!([op("set", "p/big", Some(&"x".repeat(MAX_VALUE_SIZE / 2)), 0)]),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            value(&kv, "p/big").map(|v| v.len()),
            Some(MAX_VALUE_SIZE / 2)
        );
    }
}
