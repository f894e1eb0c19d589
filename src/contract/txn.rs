//! A consul transaction on state keys and their records, pure: the
//! operations written (`PUT /v1/txn`), how they are cut, and consul's
//! answer read back.
//!
//! - A state key is written check-and-set on the ModifyIndex read
//!   ([`op`]); its record rides unguarded in the same transaction
//!   ([`record_op`]); an orphan record is deleted only while its key is
//!   absent ([`orphan_ops`]).
//! - Transactions hold at most [`BATCH`] operations and [`MAX_TXN_BYTES`]
//!   of body, a key and its record never split ([`batches`]).
//! - [`parse_answer`]: applied (each key's new index) or failed (each
//!   refused operation and consul's reason).

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use super::Desired;

/// consul before 1.14 refuses a transaction of more operations
/// (`agent/txn_endpoint.go` `maxTxnOps`, 128 since 1.14).
pub const BATCH: usize = 64;

/// consul refuses a transaction body over `txn_max_req_len` (512 KiB by
/// default) with 413 (`agent/txn_endpoint.go` `convertOps`).
pub const MAX_TXN_BYTES: usize = 512 * 1024;

/// The text consul's denial starts with (`acl/errors.go`
/// `errPermissionDenied`); since 1.12 the token and the permission follow.
pub const PERMISSION_DENIED: &str = "Permission denied";

/// One operation of a guarded transaction: `cas` of `value` (index 0 for
/// a key that must be absent) with `expires` in its Flags (0: cleared),
/// or `delete-cas` (`None`).
pub fn op(key: &str, value: Option<Desired>, index: u64, expires: u32) -> serde_json::Value {
    match value {
        Some(d) => {
            let value = base64::engine::general_purpose::STANDARD.encode(d.to_string());
            json!({"KV": {"Verb": "cas", "Key": key, "Value": value, "Flags": expires, "Index": index}})
        }
        None => json!({"KV": {"Verb": "delete-cas", "Key": key, "Index": index}}),
    }
}

/// The operation on a key's record, beside its state key's in the same
/// transaction: `set` the record (`Some`), or `delete` it. Unguarded: the
/// state key's check-and-set guards the whole transaction.
pub fn record_op(key: &str, record: Option<&str>) -> serde_json::Value {
    match record {
        Some(r) => {
            let value = base64::engine::general_purpose::STANDARD.encode(r);
            json!({"KV": {"Verb": "set", "Key": key, "Value": value}})
        }
        None => json!({"KV": {"Verb": "delete", "Key": key}}),
    }
}

/// Deletes an orphan record (its state key gone) only while the key is
/// still absent.
pub fn orphan_ops(key: &str, record_key: &str) -> [serde_json::Value; 2] {
    [
        json!({"KV": {"Verb": "check-not-exists", "Key": key}}),
        record_op(record_key, None),
    ]
}

/// Splits groups of operations (each a key's: its operation count and
/// serialized length, in order) into transactions of at most [`BATCH`]
/// operations and at most [`MAX_TXN_BYTES`] of body (`[`, the operations,
/// `,` between, `]`), in order, never splitting a group (a key and its
/// record land together or not at all). A group too large alone is a
/// transaction alone (consul answers it 413, which is reported).
pub fn batches(groups: &[(usize, usize)]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut ops, mut bytes) = (0, 0, 2);
    for (i, &(n, size)) in groups.iter().enumerate() {
        // Each operation after the transaction's first follows a `,`.
        let more = size + n - 1 + usize::from(i > start);
        if i > start && (ops + n > BATCH || bytes + more > MAX_TXN_BYTES) {
            out.push(start..i);
            (start, ops, bytes) = (i, n, 2 + size + n - 1);
        } else {
            ops += n;
            bytes += more;
        }
    }
    if start < groups.len() {
        out.push(start..groups.len());
    }
    out
}

/// What consul said to a transaction.
#[derive(Debug, PartialEq, Eq)]
pub enum TxnAnswer {
    /// Applied: each written key's new ModifyIndex (deleted keys have none:
    /// consul's `Results` has no entry for a delete, so results are
    /// matched by key, never by position).
    Applied(Vec<(String, u64)>),
    /// 409: nothing applied; every failed operation (position, consul's
    /// reason), in order.
    Failed(Vec<(usize, String)>),
}

impl TxnAnswer {
    /// The operations consul denied for want of a permission (a 409 that
    /// is not a conflict), if any.
    pub fn denied(&self) -> Vec<usize> {
        match self {
            TxnAnswer::Applied(_) => Vec::new(),
            TxnAnswer::Failed(errors) => errors
                .iter()
                .filter(|(_, what)| what.starts_with(PERMISSION_DENIED))
                .map(|(at, _)| *at)
                .collect(),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawAnswer {
    results: Option<Vec<RawResult>>,
    errors: Option<Vec<RawError>>,
}

#[derive(Deserialize)]
struct RawResult {
    #[serde(rename = "KV")]
    kv: Option<RawEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawEntry {
    key: String,
    modify_index: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawError {
    op_index: usize,
    what: String,
}

/// Reads consul's answer to `PUT /v1/txn` (status 200 or 409).
pub fn parse_answer(status: u16, body: &[u8]) -> Result<TxnAnswer, String> {
    let raw: RawAnswer =
        serde_json::from_slice(body).map_err(|e| format!("answer is not consul's: {e}"))?;
    match (status, raw.results, raw.errors) {
        (200, results, None) => Ok(TxnAnswer::Applied(
            results
                .unwrap_or_default()
                .into_iter()
                .filter_map(|r| r.kv)
                .map(|e| (e.key, e.modify_index))
                .collect(),
        )),
        (409, _, Some(mut errors)) if !errors.is_empty() => {
            errors.sort_by_key(|e| e.op_index);
            Ok(TxnAnswer::Failed(
                errors.into_iter().map(|e| (e.op_index, e.what)).collect(),
            ))
        }
        (409, _, _) => Err("409 without an error".to_owned()),
        _ => Err(format!("status {status} with an answer not matching it")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_are_guarded_and_answers_read() {
        assert_eq!(
            op("p/a", Desired::ready_pct(50), 0, 0),
            json!({"KV": {"Verb": "cas", "Key": "p/a", "Value": "NTAl", "Flags": 0, "Index": 0}})
        );
        assert_eq!(
            op("p/a", None, 9, 0),
            json!({"KV": {"Verb": "delete-cas", "Key": "p/a", "Index": 9}})
        );
        let ok = br#"{"Results":[{"KV":{"LockIndex":0,"Key":"p/a","Flags":0,"Value":null,"CreateIndex":5,"ModifyIndex":12}}],"Errors":null}"#;
        assert_eq!(
            parse_answer(200, ok),
            Ok(TxnAnswer::Applied(vec![("p/a".into(), 12)]))
        );
        let conflict =
            br#"{"Results":null,"Errors":[{"OpIndex":3,"What":"b"},{"OpIndex":1,"What":"a"}]}"#;
        assert_eq!(
            parse_answer(409, conflict),
            Ok(TxnAnswer::Failed(vec![(1, "a".into()), (3, "b".into())]))
        );
        assert!(parse_answer(200, conflict).is_err());
        assert!(parse_answer(409, b"nope").is_err());
    }

    /// consul answers an ACL denial inside a transaction with the same 409
    /// as a failed check-and-set: `agent/consul/txn_endpoint.go` `preCheck`
    /// puts `kvsPreApply`'s error in `Errors` (`What: err.Error()`), and
    /// `acl/errors.go` `PermissionDeniedError.Error` starts it with
    /// "Permission denied" (1.12+ names the token and permission after it).
    #[test]
    fn a_denial_is_told_from_a_conflict_by_consuls_what_prefix() {
        let body = br#"{"Results":null,"Errors":[{"OpIndex":0,"What":"Permission denied: token with AccessorID 'abc' lacks permission 'key:write' on \"p/a\""},{"OpIndex":1,"What":"Permission denied"}]}"#;
        let answer = parse_answer(409, body).unwrap();
        assert_eq!(answer.denied(), [0, 1]);
        let stale = br#"{"Results":null,"Errors":[{"OpIndex":0,"What":"failed to set key \"p/a\", index is stale"}]}"#;
        assert_eq!(parse_answer(409, stale).unwrap().denied(), [] as [usize; 0]);
    }

    /// consul refuses a body over `txn_max_req_len` (512 KiB) with 413
    /// (`agent/txn_endpoint.go` `convertOps`): transactions are cut by
    /// bytes as well as by count, in order.
    #[test]
    fn transactions_are_cut_by_operations_and_by_bytes_in_order() {
        let one = |sizes: &[usize]| batches(&sizes.iter().map(|&s| (1, s)).collect::<Vec<_>>());
        assert_eq!(one(&[10; 130]), [0..64, 64..128, 128..130]);
        assert_eq!(one(&[]), [] as [std::ops::Range<usize>; 0]);
        // Three operations of 200 KiB: two fit (with `[`, `,`, `]`), not three.
        let big = 200 * 1024;
        assert_eq!(one(&[big; 3]), [0..2, 2..3]);
        // `[`, a, `,`, b, `]`: exactly the limit fits, a byte more does not.
        let (a, b) = (262_142, 262_143);
        assert_eq!(a + b + 3, MAX_TXN_BYTES);
        assert_eq!(one(&[a, b, 1]), [0..2, 2..3], "the limit itself fits");
        assert_eq!(one(&[a, b + 1]), [0..1, 1..2]);
        // A key and its record: 64 operations are 32 keys, never split.
        assert_eq!(batches(&[(2, 10); 65]), [0..32, 32..64, 64..65]);
        assert_eq!(
            batches(&[(2, 10); 33])[0],
            0..32,
            "33 keys: 66 operations, not in one"
        );
        // Their bytes count with the `,` between them: `[`, a, `,`, b, `]`.
        let fits = batches(&[(2, MAX_TXN_BYTES - 5), (1, 1)]);
        assert_eq!(
            (fits.len(), fits[0].clone()),
            (1, 0..2),
            "the limit itself fits"
        );
        assert_eq!(batches(&[(2, MAX_TXN_BYTES - 4), (1, 1)]), [0..1, 1..2]);
        assert_eq!(one(&[MAX_TXN_BYTES * 2, 5]), [0..1, 1..2]);
    }

    #[test]
    fn records_ride_with_their_key() {
        assert_eq!(
            record_op("m/a", Some("{}")),
            json!({"KV": {"Verb": "set", "Key": "m/a", "Value": "e30="}})
        );
        assert_eq!(
            record_op("m/a", None),
            json!({"KV": {"Verb": "delete", "Key": "m/a"}})
        );
        assert_eq!(
            op("p/a", Some(Desired::DRAIN), 3, 1_800_000_000)["KV"]["Flags"],
            1_800_000_000
        );
        assert_eq!(
            orphan_ops("p/a", "m/a")[0]["KV"]["Verb"],
            "check-not-exists"
        );
    }
}
