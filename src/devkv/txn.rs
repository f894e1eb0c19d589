//! `PUT /v1/txn` over the store, for the KV verbs `set`, `cas`, `get`,
//! `get-or-empty`, `get-tree`, `delete`, `delete-cas`, `delete-tree`,
//! `check-index` and `check-not-exists`, as consul answers them
//! (`agent/txn_endpoint.go`, `agent/consul/state/txn.go`).
//!
//! - In: the query, the body (consul's API shape, `[{"KV": {"Verb", "Key",
//!   "Value" (base64), "Flags", "Index", "Session"}}]`, decoded as Go's
//!   `encoding/json` does) and `now`. Out: the response.
//! - Every operation runs in order on one copy of the store and every
//!   write takes the same new index; if any fails, nothing is applied and
//!   the answer is 409 with every failure (`OpIndex`, `What`).
//! - Deliberate differences: only KV operations (a `Node`, `Service` or
//!   `Check` operation fails in `Errors`, its fields unchecked); no
//!   sessions, so `lock`, `unlock` and `check-session` fail as unknown
//!   verbs. A body Go's decoder refuses gets Go's words (`go_json`,
//!   which names what it approximates).

use std::time::Instant;

use serde::Serialize;

use super::go_json::decode_first;
use super::store::{Entry, Store};
use super::wire::{
    dir_entry, error, forward, json_bytes, leader_headers, parse_query_options, wrapped, DirEntry,
    Params, MAX_VALUE_SIZE,
};
use crate::gocompat::{go_base64_decode, go_json_field_is, go_quote, GoJson};
use crate::http::{Framing, Response};

/// consul 1.14+'s `maxTxnOps`: more operations are refused with 413.
pub const MAX_TXN_OPS: usize = 128;

/// One operation as consul's `convertOps` keeps it.
enum TxnOp {
    Kv(KvOp),
    /// A `Node`, `Service` or `Check` operation; `read`: its verb is `get`.
    Catalog {
        read: bool,
    },
}

/// `api.KVTxnOp` (`Namespace` and `Partition` are read and, as in CE,
/// ignored).
#[derive(Default)]
struct KvOp {
    verb: String,
    key: String,
    value: Vec<u8>,
    flags: u64,
    index: u64,
    session: String,
}

impl TxnOp {
    /// `agent/txn_endpoint.go` `isWrite` for a KV verb (an unknown verb
    /// reads); any other operation writes unless its verb is `get`.
    fn is_write(&self) -> bool {
        match self {
            TxnOp::Kv(kv) => matches!(
                kv.verb.as_str(),
                "set" | "delete" | "delete-cas" | "delete-tree" | "cas" | "lock" | "unlock"
            ),
            TxnOp::Catalog { read } => !read,
        }
    }
}

/// One result: a stored entry (its value kept only by the reads), or the
/// operation's own entry (`get-or-empty` of a missing key).
enum Done<'a> {
    Stored(String, Entry),
    Echo(&'a KvOp),
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Answer<'a> {
    results: Option<Vec<TxnResult<'a>>>,
    errors: Option<&'a [TxnError]>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    meta: Option<QueryMeta>,
}

/// `structs.QueryMeta`, embedded in `structs.TxnReadResponse` (so in the
/// JSON of a read-only transaction) as `Txn.Read` leaves it on a leader:
/// only `setQueryMeta`'s `KnownLeader` set.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct QueryMeta {
    index: u64,
    last_contact: u64,
    known_leader: bool,
    consistency_level: &'static str,
    not_modified: bool,
    backend: u8,
    #[serde(rename = "ResultsFilteredByACLs")]
    results_filtered_by_acls: bool,
}

const LEADER_META: QueryMeta = QueryMeta {
    index: 0,
    last_contact: 0,
    known_leader: true,
    consistency_level: "",
    not_modified: false,
    backend: 0,
    results_filtered_by_acls: false,
};

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

/// Answers `PUT /v1/txn?query` with `body` (sent with `framing`).
/// consul's `Txn`: the body is checked first (`convertOps`); a transaction
/// with no write then goes through `parse` (consistency, `wait`, `index`)
/// to `Txn.Read`, one with a write to `Txn.Apply` with only its datacenter
/// read (`parseDC`); either RPC is routed to `?dc=` before it runs
/// (`forward`).
pub fn handle(
    store: &mut Store,
    query: &str,
    framing: Framing,
    body: &[u8],
    now: Instant,
) -> Response {
    let ops = match decode(framing, body) {
        Ok(ops) => ops,
        Err(refused) => return refused,
    };
    let params = Params::parse(query);
    let read_only = !ops.iter().any(TxnOp::is_write);
    let routed = match read_only {
        true => parse_query_options(&params).map(drop),
        false => Ok(()),
    }
    .and_then(|()| forward(&params));
    match routed {
        Ok(()) => apply(store, &ops, read_only, now),
        Err(refused) => refused,
    }
}

/// The body as consul's `convertOps` reads it, with its refusals in its
/// order: the body's size (413), its decoding (400), the operation count
/// (413), each value's size (413).
fn decode(framing: Framing, body: &[u8]) -> Result<Vec<TxnOp>, Response> {
    // `convertOps`: `txn_max_req_len` (its default, the same 512 KiB as
    // `kv_max_value_size`), checked on `req.ContentLength` before reading
    // ("Request body(%d bytes) too large, ..."); a chunked body (Go's
    // ContentLength -1) is cut by `http.MaxBytesReader` while decoding,
    // whence the text without the size.
    const SEE: &str = "https://www.consul.io/docs/agent/config/config-files#txn_max_req_len";
    if body.len() > MAX_VALUE_SIZE {
        let sent = match framing {
            Framing::Length(n) => format!("({n} bytes)"),
            Framing::Chunked | Framing::Close => String::new(),
        };
        return Err(error(
            413,
            &format!("Request body{sent} too large, max size: {MAX_VALUE_SIZE} bytes. See {SEE}."),
        ));
    }
    let unparsed = |e: String| error(400, &format!("Failed to parse body: {e}"));
    let doc = decode_first(body).map_err(unparsed)?;
    let (count, ops) = decode_ops(&doc).map_err(unparsed)?;
    if count > MAX_TXN_OPS {
        return Err(error(
            413,
            &format!("Transaction contains too many operations ({count} > {MAX_TXN_OPS})"),
        ));
    }
    for op in &ops {
        if let TxnOp::Kv(kv) = op {
            if kv.value.len() > MAX_VALUE_SIZE {
                return Err(error(
                    413,
                    &format!(
                        "Value for key {} is too large ({} > {MAX_VALUE_SIZE} bytes)",
                        go_quote(&kv.key),
                        kv.value.len()
                    ),
                ));
            }
        }
    }
    Ok(ops)
}

/// `decodeBody` into `api.TxnOps`: consul's `lib.DecodeJSON`, Go's decoder
/// with `DisallowUnknownFields`, so a member that names no field is
/// refused ("json: unknown field") while names match fields
/// case-insensitively ([`go_json_field_is`]); the first refusal in the
/// document is the one reported. Returns the number of elements and the
/// operations `convertOps` keeps (one with no `KV`, `Node`, `Service` or
/// `Check` is dropped).
fn decode_ops(doc: &GoJson) -> Result<(usize, Vec<TxnOp>), String> {
    let items = match doc {
        GoJson::Null => return Ok((0, Vec::new())),
        GoJson::Array(items) => items,
        other => return Err(not_a(other, "Go value of type api.TxnOps", false)),
    };
    let mut ops = Vec::new();
    for item in items {
        let members = match item {
            GoJson::Object(members) => members,
            // A null operation is a nil pointer, which `convertOps` skips.
            GoJson::Null => continue,
            other => return Err(not_a(other, "Go value of type api.TxnOp", false)),
        };
        ops.extend(decode_op(members)?);
    }
    Ok((items.len(), ops))
}

/// One `api.TxnOp`: its `KV` if set, else the first of `Node`, `Service`,
/// `Check` (`convertOps`' order).
fn decode_op(members: &[(String, GoJson)]) -> Result<Option<TxnOp>, String> {
    const CATALOG: [(&str, &str); 3] = [
        ("Node", "api.NodeTxnOp"),
        ("Service", "api.ServiceTxnOp"),
        ("Check", "api.CheckTxnOp"),
    ];
    let mut kv: Option<KvOp> = None;
    let mut catalog: [Option<bool>; 3] = [None; 3];
    for (name, value) in members {
        if go_json_field_is(name, "KV") {
            kv = match value {
                GoJson::Null => None,
                GoJson::Object(fields) => Some(decode_kv(fields, kv.take().unwrap_or_default())?),
                other => {
                    return Err(not_a(
                        other,
                        "Go struct field TxnOp.KV of type api.KVTxnOp",
                        false,
                    ))
                }
            };
            continue;
        }
        let Some(at) = CATALOG.iter().position(|(f, _)| go_json_field_is(name, f)) else {
            return Err(format!("json: unknown field {}", go_quote(name)));
        };
        catalog[at] =
            match value {
                GoJson::Null => None,
                // Only the verb is read: the dev KV runs none of these.
                GoJson::Object(fields) => Some(fields.iter().rev().any(|(f, v)| {
                    go_json_field_is(f, "Verb") && *v == GoJson::String("get".into())
                })),
                other => {
                    let (field, ty) = CATALOG[at];
                    let target = format!("Go struct field TxnOp.{field} of type {ty}");
                    return Err(not_a(other, &target, false));
                }
            };
    }
    Ok(match kv {
        Some(kv) => Some(TxnOp::Kv(kv)),
        None => catalog
            .into_iter()
            .flatten()
            .next()
            .map(|read| TxnOp::Catalog { read }),
    })
}

/// The members of one `api.KVTxnOp` over `op` (a later `KV` member
/// decodes into the same operation, as Go does into a set pointer). A
/// `null` leaves a field as it was, but empties `Value` (a slice).
fn decode_kv(fields: &[(String, GoJson)], mut op: KvOp) -> Result<KvOp, String> {
    const STRINGS: [&str; 5] = ["Verb", "Key", "Session", "Namespace", "Partition"];
    for (name, value) in fields {
        let field = |f: &str| go_json_field_is(name, f);
        let target = |f: &str, ty: &str| format!("Go struct field KVTxnOp.KV.{f} of type {ty}");
        if field("Value") {
            op.value = match value {
                GoJson::Null => Vec::new(),
                GoJson::String(s) => go_base64_decode(s)?,
                // Go decodes a []byte from an array of bytes too.
                GoJson::Array(items) => items
                    .iter()
                    .map(|b| {
                        match b {
                            GoJson::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
                            _ => None,
                        }
                        .ok_or_else(|| not_a(b, &target("Value", "uint8"), true))
                    })
                    .collect::<Result<_, _>>()?,
                other => return Err(not_a(other, &target("Value", "[]uint8"), false)),
            };
        } else if let Some(f) = ["Flags", "Index"].into_iter().find(|f| field(f)) {
            let n = match value {
                GoJson::Null => continue,
                GoJson::Number(n) => n.as_u64(),
                _ => None,
            }
            .ok_or_else(|| not_a(value, &target(f, "uint64"), true))?;
            match f {
                "Flags" => op.flags = n,
                _ => op.index = n,
            }
        } else if let Some(f) = STRINGS.into_iter().find(|f| field(f)) {
            let s = match value {
                GoJson::Null => continue,
                GoJson::String(s) => s.clone(),
                other => {
                    let ty = if f == "Verb" { "api.KVOp" } else { "string" };
                    return Err(not_a(other, &target(f, ty), false));
                }
            };
            match f {
                "Verb" => op.verb = s,
                "Key" => op.key = s,
                "Session" => op.session = s,
                _ => {} // Namespace, Partition: an Enterprise feature CE drops.
            }
        } else {
            return Err(format!("json: unknown field {}", go_quote(name)));
        }
    }
    Ok(op)
}

/// Go's `UnmarshalTypeError` text for `value` that cannot go into `target`.
fn not_a(value: &GoJson, target: &str, int_field: bool) -> String {
    format!(
        "json: cannot unmarshal {} into {target}",
        value.go_kind(int_field)
    )
}

/// Runs every operation on one copy of the store (consul's `TxnRW` or
/// `TxnRO` over `txnDispatch`): all applied at one index and 200 with
/// `Results`, or none and 409 with every failure in `Errors`. A read-only
/// transaction's answer also carries the leader's headers and its
/// `QueryMeta` (`agent/txn_endpoint.go` `Txn`: `setLastContact`,
/// `setKnownLeader`, before the conflict check).
fn apply(store: &mut Store, ops: &[TxnOp], read_only: bool, now: Instant) -> Response {
    let applied = store.transaction(|store| {
        let mut results = Vec::new();
        let mut errors = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let done = match op {
                TxnOp::Kv(kv) => run(store, kv, now),
                TxnOp::Catalog { .. } => {
                    Err("no operation specified (the dev KV has KV operations only)".into())
                }
            };
            match done {
                Ok(d) => results.extend(d),
                Err(what) => errors.push(TxnError { op_index: i, what }),
            }
        }
        match errors.is_empty() {
            true => Ok(results),
            false => Err(errors),
        }
    });
    let meta = read_only.then_some(LEADER_META);
    let (status, answer) = match &applied {
        Ok(done) => (
            200,
            Answer {
                results: Some(done.iter().map(result).collect()),
                errors: None,
                meta,
            },
        ),
        Err(errors) => (
            409,
            Answer {
                results: None,
                errors: Some(errors.as_slice()),
                meta,
            },
        ),
    };
    let mut headers = vec![("Content-Type", "application/json".to_owned())];
    if read_only {
        headers.extend(leader_headers());
    }
    wrapped(status, headers, json_bytes(&answer, false))
}

fn result<'a>(done: &'a Done) -> TxnResult<'a> {
    let kv = match done {
        Done::Stored(key, entry) => dir_entry(key, entry),
        Done::Echo(op) => DirEntry::echo(&op.key, op.flags, op.index, &op.session),
    };
    TxnResult { kv }
}

/// One KV operation (`agent/consul/state/txn.go` `txnKVS`): its results
/// (none for a delete or `check-not-exists`), or its failure.
fn run<'a>(store: &mut Store, op: &'a KvOp, now: Instant) -> Result<Vec<Done<'a>>, String> {
    let key = op.key.as_str();
    // Every verb but the reads answers with the entry's value blanked.
    let blank = |store: &Store| {
        let entry = store.get(key).map(|e| Entry {
            value: Vec::new(),
            ..e.clone()
        });
        entry
            .map(|e| Done::Stored(key.to_owned(), e))
            .into_iter()
            .collect()
    };
    match op.verb.as_str() {
        "set" => {
            store.put(key, &op.value, op.flags, None);
            Ok(blank(store))
        }
        "cas" => match store.put(key, &op.value, op.flags, Some(op.index)) {
            true => Ok(blank(store)),
            false => Err(format!(
                "failed to set key {}, index is stale",
                go_quote(key)
            )),
        },
        "delete" => {
            store.delete(key, None, now);
            Ok(Vec::new())
        }
        "delete-cas" => match store.delete(key, Some(op.index), now) {
            true => Ok(Vec::new()),
            false => Err(format!(
                "failed to delete key {}, index is stale",
                go_quote(key)
            )),
        },
        // `api.KVDeleteTree`: `kvsDeleteTreeTxn` over the prefix, no result.
        "delete-tree" => {
            store.delete_tree(key, now);
            Ok(Vec::new())
        }
        "get" => match store.get(key) {
            Some(e) => Ok(vec![Done::Stored(key.to_owned(), e.clone())]),
            None => Err(format!("key {} doesn't exist", go_quote(key))),
        },
        // `api.KVGetOrEmpty`: the entry with its value, or the operation's
        // own entry with its value cut (`entry = &op.DirEnt; entry.Value =
        // nil`), never an error.
        "get-or-empty" => Ok(vec![match store.get(key) {
            Some(e) => Done::Stored(key.to_owned(), e.clone()),
            None => Done::Echo(op),
        }]),
        // `api.KVGetTree`: `kvsListTxn` over the prefix, one result per
        // entry with its value (returned before the blanking), none when
        // nothing is under it.
        "get-tree" => Ok(store
            .list(key)
            .map(|(k, e)| Done::Stored(k.to_owned(), e.clone()))
            .collect()),
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
            None => Ok(Vec::new()),
        },
        verb => Err(format!("unknown KV verb {}", go_quote(verb))),
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use serde_json::{json, Value};

    use super::*;

    /// A store and its clock: `handle` driven in memory.
    struct T {
        store: Store,
        now: Instant,
    }

    /// An answer: status, body as JSON (or as text when it is not JSON),
    /// headers.
    struct Answered {
        status: u16,
        body: Value,
        headers: Vec<(&'static str, String)>,
    }

    impl Answered {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
    }

    impl T {
        fn new() -> T {
            T {
                store: Store::new(),
                now: Instant::now(),
            }
        }

        fn raw(&mut self, query: &str, body: &[u8]) -> Answered {
            self.sent(query, Framing::Length(body.len() as u64), body)
        }

        fn sent(&mut self, query: &str, framing: Framing, body: &[u8]) -> Answered {
            let r = handle(&mut self.store, query, framing, body, self.now);
            let body = serde_json::from_slice(&r.body)
                .unwrap_or_else(|_| Value::String(String::from_utf8(r.body).unwrap()));
            Answered {
                status: r.status,
                body,
                headers: r.headers,
            }
        }

        fn txn(&mut self, ops: Value) -> (u16, Value) {
            let a = self.raw("", ops.to_string().as_bytes());
            (a.status, a.body)
        }

        fn put(&mut self, key: &str, value: &str) -> u64 {
            self.store.put(key, value.as_bytes(), 0, None);
            self.store.get(key).unwrap().modify_index
        }

        /// `p/a` (drain), `p/b/c` (50%) and `q` (maint); the last index.
        fn tree(&mut self) -> u64 {
            self.put("p/a", "drain");
            self.put("p/b/c", "50%");
            self.put("q", "maint")
        }

        fn value(&self, key: &str) -> Option<Vec<u8>> {
            self.store.get(key).map(|e| e.value.clone())
        }
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn op(verb: &str, key: &str, value: Option<&str>, index: u64) -> Value {
        json!({"KV": {"Verb": verb, "Key": key, "Value": value.map(b64), "Index": index}})
    }

    fn keys(body: &Value) -> Vec<&str> {
        body["Results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["KV"]["Key"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_transaction_applies_every_write_at_one_index_and_wakes_a_watch_once() {
        let mut t = T::new();
        let a = t.put("p/a", "drain");
        let before = t.store.last_index();
        let (status, body) = t.txn(json!([
            op("cas", "p/a", Some("50%"), a),
            op("cas", "p/b", Some("drain"), 0),
            op("set", "p/c", Some("maint"), 0)
        ]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            t.store.last_index(),
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
                Value::Null,
                "writes answer without the value"
            );
        }
        assert_eq!(results[0]["KV"]["CreateIndex"], a);
        assert_eq!(body["Errors"], Value::Null);
        assert_eq!(body.get("KnownLeader"), None, "a write has no QueryMeta");
        assert_eq!(t.value("p/a").unwrap(), b"50%");
        assert!(t.store.prefix_index("p/") > a, "a watch of p/ wakes");
    }

    /// Every failed operation is in `Errors` and nothing is applied:
    /// consul's `agent/consul/state/txn.go` `txnDispatch` runs every
    /// operation and appends each error with its `OpIndex`; `TxnRW`
    /// commits only when there is none.
    #[test]
    fn a_stale_index_fails_the_whole_transaction_with_every_error_and_nothing_applied() {
        let mut t = T::new();
        let a = t.put("p/a", "drain");
        let b = t.put("p/b", "maint");
        let before = t.store.last_index();
        let (status, body) = t.txn(json!([
            op("set", "p/x", Some("drain"), 0),
            op("cas", "p/a", Some("50%"), a + 100),
            op("cas", "p/b", Some("50%"), 0),
            op("delete-cas", "p/a", None, a + 1),
            op("check-index", "p/b", None, 3),
            op("check-not-exists", "p/a", None, 0),
            op("get", "p/none", None, 0),
            op("lock", "p/a", None, 0),
        ]));
        assert_eq!(status, 409);
        assert_eq!(body["Results"], Value::Null);
        let expected = json!([
            {"OpIndex": 1, "What": "failed to set key \"p/a\", index is stale"},
            {"OpIndex": 2, "What": "failed to set key \"p/b\", index is stale"},
            {"OpIndex": 3, "What": "failed to delete key \"p/a\", index is stale"},
            {"OpIndex": 4, "What": format!("failed index check for key \"p/b\", current modify index {b} != 3")},
            {"OpIndex": 5, "What": "key \"p/a\" exists"},
            {"OpIndex": 6, "What": "key \"p/none\" doesn't exist"},
            {"OpIndex": 7, "What": "unknown KV verb \"lock\""},
        ]);
        assert_eq!(body["Errors"], expected);
        assert_eq!(t.store.last_index(), before, "nothing applied");
        assert_eq!(t.value("p/x"), None);
        assert_eq!(t.value("p/a").unwrap(), b"drain");
    }

    #[test]
    fn reads_checks_and_deletes_answer_as_consul_does() {
        let mut t = T::new();
        let a = t.put("p/a", "drain");
        let b = t.put("p/b", "maint");
        let (status, body) = t.txn(json!([
            op("get", "p/a", None, 0),
            op("check-index", "p/b", None, b),
            op("check-not-exists", "p/c", None, 0),
            op("delete-cas", "p/a", None, a),
            op("delete", "p/b", None, 0),
        ]));
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
        assert_eq!(results[1]["KV"]["Value"], Value::Null);
        assert_eq!((t.value("p/a"), t.value("p/b")), (None, None));
    }

    /// `agent/consul/state/txn.go` `txnKVS`, `api.KVGetTree`: every entry
    /// under the prefix (a byte prefix, `kvsListTxn`) with its value, in
    /// key order; none (and no error) when nothing is under it.
    #[test]
    fn get_tree_answers_every_entry_under_the_prefix_with_its_value() {
        let mut t = T::new();
        let before = t.tree();
        let (status, body) = t.txn(json!([
            op("get-tree", "p/", None, 0),
            op("get-tree", "none/", None, 0),
            op("get", "q", None, 0),
        ]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(keys(&body), ["p/a", "p/b/c", "q"]);
        assert_eq!(body["Results"][0]["KV"]["Value"], b64("drain"));
        assert_eq!(body["Results"][1]["KV"]["Value"], b64("50%"));
        assert_eq!(t.store.last_index(), before);
        let (_, all) = t.txn(json!([op("get-tree", "", None, 0)]));
        assert_eq!(keys(&all), ["p/a", "p/b/c", "q"], "the empty prefix is all");
    }

    /// `api.KVGetOrEmpty`: the entry with its value, or, for a missing
    /// key, the operation's own `DirEnt` with `Value = nil` (its `Flags`,
    /// its `Index` as ModifyIndex, its `Session`), never an error.
    #[test]
    fn get_or_empty_answers_the_entry_or_the_operation_itself() {
        let mut t = T::new();
        let a = t.put("p/a", "drain");
        let (status, body) = t.txn(json!([
            {"KV": {"Verb": "get-or-empty", "Key": "p/a"}},
            {"KV": {"Verb": "get-or-empty", "Key": "p/none", "Value": b64("x"), "Flags": 7, "Index": 42, "Session": "s1"}},
        ]));
        assert_eq!(status, 200, "{body}");
        let found = &body["Results"][0]["KV"];
        assert_eq!(
            (found["Value"].as_str(), found["ModifyIndex"].as_u64()),
            (Some(b64("drain").as_str()), Some(a))
        );
        assert_eq!(
            body["Results"][1]["KV"],
            json!({"LockIndex": 0, "Key": "p/none", "Flags": 7, "Value": null, "Session": "s1", "CreateIndex": 0, "ModifyIndex": 42})
        );
        assert_eq!(found.get("Session"), None, "an empty session is omitted");
    }

    /// `api.KVDeleteTree`: `kvsDeleteTreeTxn` deletes every key under the
    /// prefix at the transaction's index, with no result; it is a write
    /// (`isWrite`), so the answer has no `QueryMeta`.
    #[test]
    fn delete_tree_deletes_the_prefix_at_one_index_with_no_result() {
        let mut t = T::new();
        let before = t.tree();
        let (status, body) = t.txn(json!([
            op("delete-tree", "p/", None, 0),
            op("set", "r", Some("drain"), 0),
        ]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(keys(&body), ["r"]);
        assert_eq!(body.get("KnownLeader"), None);
        assert_eq!(t.store.list("p/").count(), 0);
        assert!(t.value("q").is_some());
        assert_eq!(t.store.last_index(), before + 1);
        assert_eq!(
            t.store.prefix_index("p/"),
            before + 1,
            "a watch of p/ wakes"
        );
    }

    /// `agent/txn_endpoint.go` `Txn` with `?dc=` naming another
    /// datacenter: the RPC (`Txn.Apply` or `Txn.Read`) has no route, 500
    /// "No path to datacenter" (`agent/consul/rpc.go` `forwardDC`), and
    /// nothing is applied. The body's checks come first; a read's `parse`
    /// checks too, a write's none.
    #[test]
    fn another_datacenter_is_500_no_path_after_the_requests_own_checks() {
        let mut t = T::new();
        t.put("p/a", "drain");
        let before = t.store.last_index();
        let write = json!([op("set", "p/b", Some("drain"), 0)]).to_string();
        let read = json!([op("get", "p/a", None, 0)]).to_string();
        for (query, body) in [("dc=dc2", &write), ("dc=dc2", &read), ("stale&dc=x", &read)] {
            let a = t.raw(query, body.as_bytes());
            assert_eq!(
                (a.status, a.body.as_str()),
                (500, Some("No path to datacenter")),
                "{query} {body}"
            );
        }
        assert_eq!(t.store.last_index(), before, "nothing applied");
        let a = t.raw(
            "dc=dc2",
            b"[{\"KV\":{\"Verb\":\"set\",\"Key\":\"k\",\"Nope\":1}}]",
        );
        assert_eq!(a.status, 400, "the body is checked first");
        let a = t.raw("dc=dc2&index=x", read.as_bytes());
        assert_eq!(
            (a.status, a.body.as_str()),
            (400, Some("Invalid index")),
            "a read is parsed first"
        );
        // A write reads no consistency or wait parameter.
        let a = t.raw("dc=dc1&stale&consistent&index=x", write.as_bytes());
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(t.value("p/b").unwrap(), b"drain");
        let a = t.raw("stale&consistent", read.as_bytes());
        assert_eq!(a.status, 400, "a read's consistency is checked");
    }

    /// `agent/txn_endpoint.go` `Txn`, read-only branch: `setLastContact`
    /// and `setKnownLeader` before the conflict check, so a 409 has them
    /// too, and the reply (`structs.TxnReadResponse`, which embeds
    /// `QueryMeta`) carries the meta in its JSON. A write has neither.
    #[test]
    fn a_read_only_transaction_answers_with_the_leader_headers_and_query_meta() {
        let mut t = T::new();
        t.put("p/a", "drain");
        let read = json!([op("get", "p/a", None, 0)]).to_string();
        let a = t.raw("", read.as_bytes());
        assert_eq!(a.status, 200);
        assert_eq!(a.header("X-Consul-KnownLeader"), Some("true"));
        assert_eq!(a.header("X-Consul-LastContact"), Some("0"));
        assert_eq!(a.header("X-Consul-Index"), None, "no setMeta");
        let r = handle(&mut t.store, "", Framing::Chunked, read.as_bytes(), t.now);
        let text = String::from_utf8(r.body).unwrap();
        assert!(
            text.ends_with(r#""Errors":null,"Index":0,"LastContact":0,"KnownLeader":true,"ConsistencyLevel":"","NotModified":false,"Backend":0,"ResultsFilteredByACLs":false}"#),
            "{text}"
        );
        let missing = t.raw(
            "",
            json!([op("get", "p/none", None, 0)]).to_string().as_bytes(),
        );
        assert_eq!(missing.status, 409);
        assert_eq!(missing.header("X-Consul-KnownLeader"), Some("true"));
        assert_eq!(missing.body["KnownLeader"], true);
        let write = t.raw(
            "",
            json!([op("set", "p/b", Some("x"), 0)])
                .to_string()
                .as_bytes(),
        );
        assert_eq!(
            (write.status, write.header("X-Consul-KnownLeader")),
            (200, None)
        );
    }

    /// `lib.DecodeJSON` (consul's `decodeBody`): Go's decoder with
    /// `DisallowUnknownFields`; field names match case-insensitively, the
    /// last of two spellings wins, and the first refusal in the document
    /// is the 400's text ("Failed to parse body: %v", `convertOps`).
    #[test]
    fn the_body_decodes_as_gos_encoding_json_with_unknown_fields_refused() {
        let mut t = T::new();
        let (status, body) = t.txn(json!([
            {"kv": {"verb": "set", "key": "p/a", "value": b64("drain"), "flags": 3}},
            {"Kv": {"VERB": "get", "Verb": "set", "kEy": "p/b", "Value": b64("maint"), "namespace": "", "Partition": ""}},
        ]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(t.store.get("p/a").unwrap().flags, 3);
        assert_eq!(t.value("p/b").unwrap(), b"maint", "the later Verb wins");
        let before = t.store.last_index();
        let cases: [(Value, &str); 9] = [
            (json!([{"KV": {"Verb": "set", "Key": "k", "Foo": 1}}]), "json: unknown field \"Foo\""),
            (json!([{"KV": {"Verb": "set", "Key": "k"}, "Extra": {}}]), "json: unknown field \"Extra\""),
            (json!([{"KV": {"Verb": 1}}]), "json: cannot unmarshal number into Go struct field KVTxnOp.KV.Verb of type api.KVOp"),
            (json!([{"KV": {"Flags": "1"}}]), "json: cannot unmarshal string into Go struct field KVTxnOp.KV.Flags of type uint64"),
            (json!([{"KV": {"Index": -1}}]), "json: cannot unmarshal number -1 into Go struct field KVTxnOp.KV.Index of type uint64"),
            (json!([{"KV": {"Value": "!!"}}]), "illegal base64 data at input byte 0"),
            (json!([{"KV": 5}]), "json: cannot unmarshal number into Go struct field TxnOp.KV of type api.KVTxnOp"),
            (json!([7]), "json: cannot unmarshal number into Go value of type api.TxnOp"),
            (json!({"KV": {}}), "json: cannot unmarshal object into Go value of type api.TxnOps"),
        ];
        for (ops, why) in cases {
            let (status, body) = t.txn(ops.clone());
            assert_eq!(
                (status, body.as_str()),
                (400, Some(format!("Failed to parse body: {why}").as_str())),
                "{ops}"
            );
        }
        // The first refusal in the document is reported.
        // (A literal body: `json!` would sort the members.)
        let a = t.raw("", br#"[{"KV": {"Zed": 1, "Flags": "x"}}]"#);
        assert_eq!(a.body, "Failed to parse body: json: unknown field \"Zed\"");
        let a = t.raw("", br#"[{"KV": {"Flags": "x", "Zed": 1}}]"#);
        assert!(a
            .body
            .as_str()
            .unwrap()
            .ends_with("KVTxnOp.KV.Flags of type uint64"));
        assert_eq!(t.store.last_index(), before, "nothing applied");
        let (status, body) =
            t.txn(json!([{"KV": {"Verb": "set", "Key": "p/c", "Value": [100, 114]}}]));
        assert_eq!(status, 200, "a []byte also decodes from an array: {body}");
        assert_eq!(t.value("p/c").unwrap(), b"dr");
    }

    /// `convertOps` keeps only operations with a `KV`, `Node`, `Service`
    /// or `Check`: an empty one (or a null body) is no operation at all,
    /// so the transaction reads nothing and answers 200; a `Node`
    /// operation fails in `Errors` (the dev KV has no catalog).
    #[test]
    fn empty_operations_are_dropped_and_catalog_ones_fail() {
        let mut t = T::new();
        let (status, body) = t.txn(json!([{}, {"KV": null}, op("set", "p/a", Some("drain"), 0)]));
        assert_eq!((status, keys(&body)), (200, vec!["p/a"]), "{body}");
        let a = t.raw("", b"null");
        assert_eq!((a.status, &a.body["Results"]), (200, &json!([])));
        let (status, body) = t.txn(
            json!([{"Node": {"Verb": "get", "Node": {"Node": "n1"}}}, op("get", "p/a", None, 0)]),
        );
        assert_eq!(status, 409);
        assert_eq!(body["Errors"][0]["OpIndex"], 0);
        assert_eq!(body["KnownLeader"], true, "a Node get reads");
    }

    /// `agent/txn_endpoint.go` `convertOps`: more than `maxTxnOps` (128
    /// since 1.14) is 413.
    #[test]
    fn past_128_operations_is_413_and_128_is_applied() {
        let mut t = T::new();
        let ops = |n: usize| {
            Value::Array(
                (0..n)
                    .map(|i| op("set", &format!("k{i}"), Some("drain"), 0))
                    .collect(),
            )
        };
        let (status, body) = t.txn(ops(129));
        assert_eq!(
            (status, body.as_str().unwrap()),
            (413, "Transaction contains too many operations (129 > 128)")
        );
        assert_eq!(t.value("k0"), None);
        let (status, _) = t.txn(ops(128));
        assert_eq!(status, 200);
        assert_eq!(t.store.list("k").count(), 128);
    }

    /// A body Go's decoder refuses is 400 with Go's text after
    /// `convertOps`' "Failed to parse body: " (`lib.DecodeJSON`: one
    /// `json.Decoder.Decode`, so what follows the first value is not read).
    #[test]
    fn a_body_that_is_not_json_is_400_in_gos_words() {
        let mut t = T::new();
        let cases: [(&[u8], &str); 5] = [
            (b"", "EOF"),
            (
                b"{not json",
                "invalid character 'n' looking for beginning of object key string",
            ),
            (br#"[{"KV": {"Verb": "set", "Key": "p/a""#, "unexpected EOF"),
            (
                br#""set p/a""#,
                "json: cannot unmarshal string into Go value of type api.TxnOps",
            ),
            (
                b"12 not json",
                "json: cannot unmarshal number into Go value of type api.TxnOps",
            ),
        ];
        for (body, why) in cases {
            let a = t.raw("", body);
            assert_eq!(
                (a.status, a.body.as_str()),
                (400, Some(format!("Failed to parse body: {why}").as_str())),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let (status, _) = t.txn(json!([op("set", "p/a", Some("drain"), 0)]));
        assert_eq!(status, 200);
        let a = t.raw("", br#"[{"KV": {"Verb": "get", "Key": "p/a"}}] trailing"#);
        assert_eq!((a.status, keys(&a.body)), (200, vec!["p/a"]));
    }

    /// Writing a key's value again keeps its ModifyIndex and wakes no
    /// watcher: `agent/consul/state/kvs.go` `kvsSetTxn`, "Skip further
    /// writing in the state store if the entry is not actually changed"
    /// (`existing.Equal(entry)`: `entry.ModifyIndex =
    /// existing.ModifyIndex; return nil`, no insert, no index bump). The
    /// result still names the key, at its old index.
    #[test]
    fn a_same_value_write_keeps_the_modify_index_and_wakes_no_watcher() {
        let mut t = T::new();
        let a = t.put("p/a", "drain");
        let before = t.store.last_index();
        let (status, body) = t.txn(json!([
            op("cas", "p/a", Some("drain"), a),
            op("set", "p/a", Some("drain"), 0)
        ]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["Results"][0]["KV"]["ModifyIndex"], a);
        assert_eq!(body["Results"][1]["KV"]["ModifyIndex"], a);
        assert_eq!(t.store.last_index(), before, "no new index");
        assert_eq!(t.store.prefix_index("p/"), a, "no watcher woken");
    }

    /// `delete-cas` of a missing key succeeds whatever the index:
    /// `agent/consul/state/kvs.go` `kvsDeleteCASTxn` returns `entry ==
    /// nil` when the index does not match, so a missing key is `true`.
    #[test]
    fn delete_cas_of_a_missing_key_succeeds_whatever_the_index() {
        let mut t = T::new();
        let before = t.store.last_index();
        let (status, body) = t.txn(json!([
            op("delete-cas", "p/none", None, 0),
            op("delete-cas", "p/gone", None, 12345)
        ]));
        assert_eq!((status, &body["Errors"]), (200, &Value::Null), "{body}");
        assert_eq!(t.store.last_index(), before, "nothing changed");
    }

    /// `Results` has no entry for a delete: `agent/consul/state/txn.go`
    /// `txnKVS` returns `nil, nil` when `entry` is nil (`delete`,
    /// `delete-cas`, `delete-tree`, `check-not-exists`), so results are
    /// positions in the results, not in the operations.
    #[test]
    fn results_have_no_entry_for_a_delete() {
        let mut t = T::new();
        let a = t.put("p/a", "drain");
        let (status, body) = t.txn(json!([
            op("delete-cas", "p/a", None, a),
            op("cas", "p/b", Some("maint"), 0),
            op("delete", "p/c", None, 0),
            op("cas", "p/d", Some("50%"), 0),
        ]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(keys(&body), ["p/b", "p/d"]);
    }

    /// A body over `txn_max_req_len` (512 KiB) is 413 before it is read,
    /// and so is a value over `kv_max_value_size`: `agent/txn_endpoint.go`
    /// `convertOps` ("Request body(%d bytes) too large" on the
    /// Content-Length, "Request body too large" for a chunked body,
    /// "Value for key %q is too large").
    #[test]
    fn past_512_kib_a_body_or_a_value_is_413_and_nothing_applied() {
        let mut t = T::new();
        let over = vec![b' '; MAX_VALUE_SIZE + 1];
        let see = "See https://www.consul.io/docs/agent/config/config-files#txn_max_req_len.";
        let a = t.raw("", &over);
        assert_eq!(
            (a.status, a.body.as_str().unwrap()),
            (
                413,
                format!("Request body(524289 bytes) too large, max size: 524288 bytes. {see}")
                    .as_str()
            )
        );
        let a = t.sent("", Framing::Chunked, &over);
        assert_eq!(
            (a.status, a.body.as_str().unwrap()),
            (
                413,
                format!("Request body too large, max size: 524288 bytes. {see}").as_str()
            )
        );
        let mut fits = json!([op("set", "p/a", Some(""), 0)])
            .to_string()
            .into_bytes();
        fits.resize(MAX_VALUE_SIZE, b' ');
        assert_eq!(t.raw("", &fits).status, 200, "the limit itself fits");
        // A value of 512 KiB + 1 in a body under the limit cannot be built
        // (base64 grows it by a third): a smaller limit than the body's
        // is checked on the decoded value.
        let (status, body) = t.txn(json!([op(
            "set",
            "p/big",
            Some(&"x".repeat(MAX_VALUE_SIZE / 2)),
            0
        )]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(t.value("p/big").map(|v| v.len()), Some(MAX_VALUE_SIZE / 2));
    }
}
