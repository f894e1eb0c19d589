//! Decoding the body of `GET /v1/kv/<prefix>/?recurse` (pure).
//!
//! In: the complete response body (a JSON array of consul `DirEntry`
//! objects; compact or pretty; unknown fields ignored). Out: the entries with
//! their values base64-decoded (`Value: null` is an empty value). Always
//! holds: any byte input returns `Ok` or `Err`, never panics; the work is
//! linear in the input.
//!
//! Fields: `Key` is required; a missing `Value` is an empty value like
//! `null`; a missing `ModifyIndex` is 0 (consul always sends it; it only feeds
//! logs and change detection); a missing `Flags` is 0 (the application's
//! opaque integer: the writers' expiry, see [`crate::state::expiry`]). Every other
//! field is skipped without being decoded. Entries are decoded straight into [`KvPair`]s as the array is
//! read, with no intermediate document.

use std::fmt;

use base64::Engine as _;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::slice::Slice;

/// One KV entry as consul sends it, value decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPair {
    pub key: String,
    /// The decoded value; empty for `Value: null`.
    pub value: Vec<u8>,
    pub modify_index: u64,
    /// consul's `Flags`, as sent (0 when absent).
    pub flags: u64,
}

/// Why a body could not be decoded (metric reason `bad_body`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Decodes a recurse listing. An empty body is an error here: the caller
/// handles the 404 (empty prefix) before decoding.
pub fn decode_list(body: &[u8]) -> Result<Vec<KvPair>, DecodeError> {
    let mut decoder = ListDecoder::new();
    let mut pairs = Vec::new();
    while !decoder.step(body, &mut Slice::unlimited(), &mut pairs)? {}
    Ok(pairs)
}

/// Decodes a listing a [`Slice`] of time at a time (each entry counted
/// with its bytes, so forty 500 KB values end a slice as surely as 4,096
/// small ones), so a snapshot of 100,000 keys never stalls the loop for
/// long: the caller keeps the body and calls [`ListDecoder::step`] once
/// per loop turn. The result is the
/// same as [`decode_list`]'s, whatever the slice size.
#[derive(Debug, Clone, Default)]
pub struct ListDecoder {
    /// Offset of the next byte to look at.
    pos: usize,
    /// Past the opening `[`.
    opened: bool,
    /// At least one entry seen (so a `,` must come before the next).
    any: bool,
}

impl ListDecoder {
    pub fn new() -> ListDecoder {
        ListDecoder::default()
    }

    /// Decodes more entries of `body` (always the same body) into `out`,
    /// until the slice is spent. `Ok(true)` once the whole listing is
    /// decoded.
    pub fn step(
        &mut self,
        body: &[u8],
        slice: &mut Slice,
        out: &mut Vec<KvPair>,
    ) -> Result<bool, DecodeError> {
        let err = |msg: &str| Err(DecodeError(format!("kv listing: {msg}")));
        if !self.opened {
            self.pos = skip_ws(body, 0);
            match body.get(self.pos) {
                None => return err("empty body"),
                Some(b'[') => {
                    self.opened = true;
                    self.pos += 1;
                }
                Some(_) => return err("not a JSON array of KV entries"),
            }
        }
        loop {
            self.pos = skip_ws(body, self.pos);
            match body.get(self.pos) {
                None => return err("truncated array"),
                Some(b']') => {
                    if skip_ws(body, self.pos + 1) != body.len() {
                        return err("trailing data after the array");
                    }
                    return Ok(true);
                }
                Some(b',') if self.any => {
                    self.pos = skip_ws(body, self.pos + 1);
                    if body.get(self.pos) == Some(&b']') {
                        return err("trailing comma");
                    }
                }
                Some(_) if self.any => return err("expected , or ] between entries"),
                Some(_) => {}
            }
            let start = self.pos;
            let end = value_end(body, start).ok_or_else(|| {
                DecodeError(format!("kv listing: malformed entry at byte {start}"))
            })?;
            let entry: Entry = serde_json::from_slice(&body[start..end])
                .map_err(|e| DecodeError(format!("kv listing: entry at byte {start}: {e}")))?;
            out.push(KvPair {
                key: entry.key,
                value: entry.value.0,
                modify_index: entry.modify_index,
                flags: entry.flags,
            });
            self.any = true;
            self.pos = end;
            if slice.spent(end - start) {
                return Ok(false);
            }
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end of the JSON value starting at `start`: strings and nesting are
/// tracked just enough to find it (serde_json then checks the value
/// itself). `None` when the body ends first. No recursion: any depth is a
/// counter.
fn value_end(b: &[u8], start: usize) -> Option<usize> {
    let mut depth: usize = 0;
    let mut i = start;
    loop {
        match *b.get(i)? {
            b'"' => {
                i += 1;
                loop {
                    match *b.get(i)? {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth == 0 => return Some(i),
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b',' if depth == 0 => return Some(i),
            _ => {}
        }
        i += 1;
    }
}

#[derive(Deserialize)]
struct Entry {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value", default)]
    value: Base64Value,
    #[serde(rename = "ModifyIndex", default)]
    modify_index: u64,
    #[serde(rename = "Flags", default)]
    flags: u64,
}

/// A `Value` field: standard base64 with padding, or `null` for empty.
/// Decoded straight from the input slice, no intermediate string.
#[derive(Default)]
struct Base64Value(Vec<u8>);

impl<'de> Deserialize<'de> for Base64Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_option(Base64Visitor)
    }
}

struct Base64Visitor;

impl<'de> Visitor<'de> for Base64Visitor {
    type Value = Base64Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a base64 string or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Base64Value, E> {
        Ok(Base64Value::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Base64Value, E> {
        Ok(Base64Value::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Base64Value, D::Error> {
        d.deserialize_str(self)
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Base64Value, E> {
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map(Base64Value)
            .map_err(|e| E::custom(format_args!("Value is not base64 ({e})")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: &str, value: &[u8], modify_index: u64) -> KvPair {
        KvPair {
            key: key.to_owned(),
            value: value.to_vec(),
            modify_index,
            flags: 0,
        }
    }

    #[track_caller]
    fn decode(body: &str) -> Vec<KvPair> {
        decode_list(body.as_bytes()).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    #[track_caller]
    fn error(body: &[u8]) -> String {
        match decode_list(body) {
            Ok(pairs) => panic!("decoded {pairs:?} from {:?}", String::from_utf8_lossy(body)),
            Err(DecodeError(msg)) => msg,
        }
    }

    #[test]
    fn big_values_end_a_timed_slice_by_their_bytes() {
        let value = "YWFh".repeat(128 * 1024); // 512 KiB of base64
        let entries: Vec<String> = (0..4)
            .map(|i| format!(r#"{{"Key":"k{i}","Value":"{value}","ModifyIndex":1}}"#))
            .collect();
        let body = format!("[{}]", entries.join(",")).into_bytes();
        let (mut d, mut out) = (ListDecoder::new(), Vec::new());
        // A slice already past its end: one entry, however big, then stop
        // (16 small ones would not have read the clock yet).
        let past = std::time::Instant::now() - std::time::Duration::from_secs(1);
        assert!(!d.step(&body, &mut Slice::until(past), &mut out).unwrap());
        assert_eq!(out.len(), 1);
        while !d.step(&body, &mut Slice::until(past), &mut out).unwrap() {}
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn slices_of_any_size_decode_the_same_as_one_shot() {
        let body = br#" [ {"Key":"a","Value":"YQ==","ModifyIndex":1} , {"Key":"b","Value":null,"Session":"x","ModifyIndex":2},
            {"Key":"c\"]","Value":"Yw==","ModifyIndex":3,"Extra":[1,{"x":"]"}]} ] "#;
        let whole = decode_list(body).unwrap();
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[2].key, "c\"]");
        for slice in 1..4 {
            let mut d = ListDecoder::new();
            let mut out = Vec::new();
            let mut steps = 0;
            while !d.step(body, &mut Slice::items(slice), &mut out).unwrap() {
                steps += 1;
                assert!(steps < 10);
            }
            assert_eq!(out, whole, "slice {slice}");
        }
    }

    #[test]
    fn framing_errors_between_entries() {
        for body in [
            &b"[{\"Key\":\"a\"},]"[..],
            b"[{\"Key\":\"a\"} {\"Key\":\"b\"}]",
            b"[{\"Key\":\"a\"}",
            b"[{\"Key\":\"a\"}] x",
            b"[1]",
            b"[\"a\"]",
        ] {
            assert!(
                decode_list(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(decode_list(b" [ ] ").unwrap(), vec![]);
    }

    #[test]
    fn consul_ce_shape() {
        let body = r#"[{"LockIndex":0,"Key":"a/b","Flags":0,"Value":"YmFy","CreateIndex":10,"ModifyIndex":12}]"#;
        assert_eq!(decode(body), vec![pair("a/b", b"bar", 12)]);
    }

    #[test]
    fn null_and_missing_value_are_empty() {
        let body = r#"[{"Key":"a/","Value":null,"ModifyIndex":3},{"Key":"a/c","ModifyIndex":4}]"#;
        assert_eq!(decode(body), vec![pair("a/", b"", 3), pair("a/c", b"", 4)]);
    }

    #[test]
    fn empty_string_value_is_empty() {
        assert_eq!(
            decode(r#"[{"Key":"k","Value":"","ModifyIndex":1}]"#),
            vec![pair("k", b"", 1)]
        );
    }

    #[test]
    fn missing_modify_index_is_zero() {
        assert_eq!(
            decode(r#"[{"Key":"k","Value":"YmFy"}]"#),
            vec![pair("k", b"bar", 0)]
        );
    }

    #[test]
    fn empty_array() {
        assert_eq!(decode("[]"), vec![]);
        assert_eq!(decode(" [ ]\n"), vec![]);
    }

    /// consul sends `Flags` as a uint64 in every `DirEntry`
    /// (`api/kv.go` `KVPair.Flags`); a lock or semaphore key carries its
    /// magic value there (`api/lock.go` `LockFlagValue`,
    /// `api/semaphore.go` `SemaphoreFlagValue`).
    #[test]
    fn flags_are_read_as_sent() {
        let body = r#"[{"Key":"a","Flags":1767225600,"Value":null},{"Key":"b","Flags":16210313421097356768},{"Key":"c"}]"#;
        let flags: Vec<u64> = decode(body).iter().map(|p| p.flags).collect();
        assert_eq!(flags, [1_767_225_600, 0xe0f6_9a2b_aa41_4de0, 0]);
        error(br#"[{"Key":"k","Flags":-1}]"#);
        error(br#"[{"Key":"k","Flags":"1"}]"#);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let body = r#"[{"LockIndex":2,"Key":"s/x","Flags":18446744073709551615,"Value":"ZHJhaW4=",
            "Session":"adf4238a-882b-9ddc-4a9d-5b6758e4159e","Namespace":"default","Partition":"default",
            "Nested":{"a":[1,2,{"b":null}]},"CreateIndex":10,"ModifyIndex":99}]"#;
        let flags = u64::MAX;
        assert_eq!(
            decode(body),
            vec![KvPair {
                flags,
                ..pair("s/x", b"drain", 99)
            }]
        );
    }

    #[test]
    fn pretty_printed_dev_agent_body() {
        let body = "[\n    {\n        \"LockIndex\": 0,\n        \"Key\": \"gitlab-haproxy-agent/state/be_web/srv1\",\n        \"Flags\": 0,\n        \"Value\": \"bWFpbnQ=\",\n        \"CreateIndex\": 21,\n        \"ModifyIndex\": 25\n    },\n    {\n        \"LockIndex\": 0,\n        \"Key\": \"gitlab-haproxy-agent/state/be_web/srv2\",\n        \"Flags\": 0,\n        \"Value\": \"NTAlCg==\",\n        \"CreateIndex\": 22,\n        \"ModifyIndex\": 22\n    }\n]\n";
        assert_eq!(
            decode(body),
            vec![
                pair("gitlab-haproxy-agent/state/be_web/srv1", b"maint", 25),
                pair("gitlab-haproxy-agent/state/be_web/srv2", b"50%\n", 22),
            ]
        );
    }

    #[test]
    fn realistic_consul_body() {
        // Sorted by key, a folder entry with a null value, a binary value, and
        // Go's HTML-safe escaping of `&` in a key.
        let body = concat!(
            r#"[{"LockIndex":0,"Key":"gitlab-haproxy-agent/state/","Flags":0,"Value":null,"CreateIndex":5,"ModifyIndex":5},"#,
            r#"{"LockIndex":0,"Key":"gitlab-haproxy-agent/state/be_api/api-01","Flags":0,"Value":"cmVhZHk=","CreateIndex":6,"ModifyIndex":6},"#,
            r#"{"LockIndex":0,"Key":"gitlab-haproxy-agent/state/be_r&d/x","Flags":0,"Value":"/wA=","CreateIndex":7,"ModifyIndex":30},"#,
            r#"{"LockIndex":0,"Key":"gitlab-haproxy-agent/state/be_web/web-01","Flags":0,"Value":"MjAwJQ==","CreateIndex":8,"ModifyIndex":1234567890123}]"#,
        );
        assert_eq!(
            decode(body),
            vec![
                pair("gitlab-haproxy-agent/state/", b"", 5),
                pair("gitlab-haproxy-agent/state/be_api/api-01", b"ready", 6),
                pair("gitlab-haproxy-agent/state/be_r&d/x", b"\xff\0", 30),
                pair(
                    "gitlab-haproxy-agent/state/be_web/web-01",
                    b"200%",
                    1234567890123
                ),
            ]
        );
    }

    #[test]
    fn escaped_value_string_still_decodes() {
        // Legal JSON even if consul never writes it this way.
        assert_eq!(
            decode(r#"[{"Key":"k","Value":"YmF\u0079"}]"#),
            vec![pair("k", b"bar", 0)]
        );
        assert_eq!(
            decode(r#"[{"Key":"k","Value":"\/wA="}]"#),
            vec![pair("k", b"\xff\0", 0)]
        );
    }

    #[test]
    fn not_an_array() {
        error(br#"{"Key":"k"}"#);
        error(b"null");
        error(b"42");
        error(br#""[]""#);
        error(b"[1]");
        error(b"[null]");
        error(b"[[]]");
    }

    #[test]
    fn empty_body_is_an_error() {
        assert!(error(b"").contains("empty"));
        assert!(error(b" \n").contains("empty"));
    }

    #[test]
    fn garbage() {
        error(b"garbage");
        error(b"<html>502 Bad Gateway</html>");
        error(b"\xff\xfe\0");
        error(b"[");
        error(br#"[{"Key":"k","Value":"YmFy"}"#);
        error(br#"[{"Key":"k","Value":"YmFy"}]]"#);
        error(br#"[{"Key":"k","Value":"YmFy"}] trailing"#);
        error(br#"[{"Key":"k","Value":"YmFy","#);
    }

    #[test]
    fn truncated_bodies_never_decode() {
        let body = br#"[{"LockIndex":0,"Key":"a/b","Flags":0,"Value":"YmFy","CreateIndex":10,"ModifyIndex":12}]"#;
        for cut in 0..body.len() {
            assert!(decode_list(&body[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn missing_or_wrong_key() {
        assert!(error(br#"[{"Value":"YmFy","ModifyIndex":1}]"#).contains("Key"));
        error(br#"[{"Key":null}]"#);
        error(br#"[{"Key":7}]"#);
        error(br#"[{"Key":"k","Key":"k2"}]"#);
    }

    #[test]
    fn bad_base64() {
        assert!(error(br#"[{"Key":"k","Value":"YmFy!"}]"#).contains("base64"));
        error(br#"[{"Key":"k","Value":"YmF"}]"#); // missing padding
        error(br#"[{"Key":"k","Value":"YmFy===="}]"#);
        error(br#"[{"Key":"k","Value":"Ym-y"}]"#); // URL-safe alphabet
        error(br#"[{"Key":"k","Value":42}]"#);
        error(br#"[{"Key":"k","Value":["YmFy"]}]"#);
    }

    #[test]
    fn bad_modify_index() {
        error(br#"[{"Key":"k","ModifyIndex":-1}]"#);
        error(br#"[{"Key":"k","ModifyIndex":"12"}]"#);
        error(br#"[{"Key":"k","ModifyIndex":1.5}]"#);
        error(br#"[{"Key":"k","ModifyIndex":18446744073709551616}]"#);
    }

    #[test]
    fn invalid_utf8_in_key_is_an_error() {
        error(b"[{\"Key\":\"\xff\"}]");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let mut body = b"[{\"Key\":\"k\",\"X\":".to_vec();
        body.extend(std::iter::repeat_n(b'[', 100_000));
        error(&body);
    }

    #[test]
    fn many_entries() {
        let n = 10_000;
        let body = format!(
            "[{}]",
            (0..n)
                .map(|i| format!(r#"{{"LockIndex":0,"Key":"p/be/srv{i}","Flags":0,"Value":"ZHJhaW4=","CreateIndex":{i},"ModifyIndex":{i}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        let pairs = decode(&body);
        assert_eq!(pairs.len(), n);
        assert_eq!(
            pairs[n - 1],
            pair(&format!("p/be/srv{}", n - 1), b"drain", n as u64 - 1)
        );
    }
}
