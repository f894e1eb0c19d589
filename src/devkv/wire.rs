//! What `/v1/kv/` ([`super::api`]) and `/v1/txn` ([`super::txn`]) share of
//! consul's HTTP layer: the `DirEntry` shape, query parameters and
//! `parse`, the datacenter check an RPC makes, and the error and header
//! conventions of consul's `wrap`.
//!
//! - In: decoded query pairs, store entries. Out: [`Response`]s and their
//!   parts, as consul's `agent/http.go` writes them.
//! - A leaf: it imports neither `api` nor `txn`.

use std::time::Duration;

use base64::Engine as _;
use serde::Serialize;

use super::store::Entry;
use crate::gocompat::{go_html_escape, go_quote, parse_go_duration};
use crate::http::{query_pairs, Response};

/// consul's `kv_max_value_size` default: larger PUT bodies get 413. The
/// loop's request body bound must be above this for the 413 to be seen.
pub const MAX_VALUE_SIZE: usize = 512 * 1024;

/// The datacenter a dev agent is in.
const DATACENTER: &str = "dc1";
pub(super) const TEXT: &str = "text/plain; charset=utf-8";

/// consul's `structs.DirEntry` as the CE server encodes it, in its field
/// order (`Session` is `omitempty`; CE's `EnterpriseMeta` adds nothing).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct DirEntry<'a> {
    lock_index: u64,
    key: &'a str,
    flags: u64,
    value: Option<String>,
    #[serde(skip_serializing_if = "str::is_empty")]
    session: &'a str,
    create_index: u64,
    modify_index: u64,
}

impl<'a> DirEntry<'a> {
    /// A transaction operation's own entry, answered as it came (consul's
    /// `get-or-empty` of a missing key): no value, no lock, not created;
    /// its `Index` as the ModifyIndex.
    pub(super) fn echo(key: &'a str, flags: u64, index: u64, session: &'a str) -> DirEntry<'a> {
        DirEntry {
            lock_index: 0,
            key,
            flags,
            value: None,
            session,
            create_index: 0,
            modify_index: index,
        }
    }
}

pub(super) fn dir_entry<'a>(key: &'a str, e: &Entry) -> DirEntry<'a> {
    DirEntry {
        lock_index: e.lock_index,
        key,
        flags: e.flags,
        value: (!e.value.is_empty())
            .then(|| base64::engine::general_purpose::STANDARD.encode(&e.value)),
        session: "",
        create_index: e.create_index,
        modify_index: e.modify_index,
    }
}

/// Query parameters as Go's `url.Values` sees them: presence, and the
/// first value.
pub(super) struct Params(pub(super) Vec<(String, String)>);

impl Params {
    pub(super) fn parse(query: &str) -> Params {
        Params(query_pairs(query).collect())
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    /// Go's `Values.Get`: the first value, `""` when absent.
    pub(super) fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// consul's `parse`: consistency, then `wait` and `index` (`agent/http.go`
/// `parseConsistency`, `parseWait`; `parseDC` only records the datacenter,
/// see [`forward`]). Returns the min index (0: not blocking) and the raw
/// wait.
pub(super) fn parse_query_options(params: &Params) -> Result<(u64, Option<Duration>), Response> {
    let mut stale = params.has("stale");
    let consistent = params.has("consistent");
    let max_stale = params.get("max_stale");
    if !max_stale.is_empty() {
        match parse_go_duration(max_stale) {
            None => {
                return Err(error(
                    400,
                    &format!("Invalid max_stale value {}", go_quote(max_stale)),
                ))
            }
            Some(d) => stale |= d.is_some_and(|d| !d.is_zero()),
        }
    }
    if stale && consistent {
        return Err(error(
            400,
            "Cannot specify ?stale with ?consistent, conflicting semantics.",
        ));
    }
    let mut wait = None;
    let w = params.get("wait");
    if !w.is_empty() {
        // A negative wait is kept as zero: both mean the default.
        wait = Some(
            parse_go_duration(w)
                .ok_or_else(|| error(400, "Invalid wait time"))?
                .unwrap_or(Duration::ZERO),
        );
    }
    let mut index = 0;
    let i = params.get("index");
    if !i.is_empty() {
        index =
            crate::decimal::parse_uint(i.as_bytes()).map_err(|_| error(400, "Invalid index"))?;
    }
    Ok((index, wait))
}

/// The RPC's route to `?dc=`: another datacenter than the dev agent's has
/// none. consul checks it only when the handler makes its RPC, after every
/// check of the request itself (`agent/consul/rpc.go` `forwardDC`: no
/// route is `structs.ErrNoDCPath`, "No path to datacenter" in
/// `agent/structs/errors.go`), and `wrap` answers an RPC error 500 with
/// its text.
pub(super) fn forward(params: &Params) -> Result<(), Response> {
    match params.get("dc") {
        "" | DATACENTER => Ok(()),
        _ => Err(error(500, "No path to datacenter")),
    }
}

/// The headers of a read answered by the leader itself (`agent/http.go`
/// `setKnownLeader`, `setLastContact`, as Go's header map spells them).
pub(super) fn leader_headers() -> [(&'static str, String); 2] {
    [
        ("X-Consul-Knownleader", "true".to_owned()),
        ("X-Consul-Lastcontact", "0".to_owned()),
    ]
}

/// Go's `json.Marshal` (or `MarshalIndent` with 4 spaces plus `\n` for
/// `?pretty`), HTML-escaping included.
pub(super) fn json_bytes<T: Serialize + ?Sized>(v: &T, pretty: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let res = if pretty {
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        v.serialize(&mut serde_json::Serializer::with_formatter(&mut out, fmt))
    } else {
        v.serialize(&mut serde_json::Serializer::new(&mut out))
    };
    // Serializing these plain structs into a Vec cannot fail.
    res.expect("JSON into a Vec");
    if pretty {
        out.push(b'\n');
    }
    go_html_escape(out)
}

/// A plain-text error (Go sniffs such bodies as `text/plain; charset=utf-8`).
pub(super) fn error(status: u16, text: &str) -> Response {
    wrapped(
        status,
        vec![("Content-Type", TEXT.to_owned())],
        text.as_bytes().to_vec(),
    )
}

/// Adds the headers every response from consul's `wrap` + gzip handler
/// carries, and orders them as Go writes them (sorted by name).
pub(super) fn wrapped(
    status: u16,
    mut headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
) -> Response {
    headers.push(("Vary", "Accept-Encoding".to_owned()));
    headers.push(("X-Consul-Default-Acl-Policy", "allow".to_owned()));
    sort_headers(&mut headers);
    Response {
        status,
        headers,
        body,
    }
}

pub(super) fn sort_headers(headers: &mut [(&'static str, String)]) {
    headers.sort_by_key(|(name, _)| *name);
}
