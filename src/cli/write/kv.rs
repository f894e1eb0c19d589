//! Consul as the writers reach it: the daemon's flags parsed by the
//! daemon's own parser ([`crate::config::parse`]), so the address, token,
//! token file, TLS settings and `-kv-prefix` come with the same precedence,
//! through the watch's transport ([`crate::consul::exchange`]).
//!
//! - [`Kv::open`]: consul, the KV prefix and the records' prefix
//!   ([`meta_prefix`]).
//! - Reads: the keys as held ([`Kv::read_expiring`]), the records.
//! - [`Kv::txn`]: one transaction sent, and what became of it
//!   ([`Delivery`]).

use std::collections::HashMap;
use std::ffi::OsString;

use super::key::Held;
use crate::config::Command;
use crate::consul::error::ErrorReason;
use crate::consul::exchange::Exchange;
use crate::contract::expiry::of_flags;
use crate::contract::identity::state_key;
use crate::contract::txn::{parse_answer, TxnAnswer};
use crate::http::{percent_encode, EncodeSet};
use crate::kv::{decode_list, KvPair};

/// The flag naming the records' prefix (default: `meta_prefix`).
pub const RECORD_PREFIX: &str = "record-prefix";

/// Consul, as the daemon would reach it, the KV prefix, the records'
/// prefix, and the longest request line the daemon reads
/// (`-max-line-bytes`: longer identities can never be asked for).
pub struct Kv {
    exchange: Exchange,
    prefix: String,
    /// Where the records are ([`meta_prefix`]).
    meta: String,
    pub(super) max_line: usize,
    /// Never shown in an error body.
    secrets: Vec<Vec<u8>>,
}

/// The records' prefix for a state prefix: its last segment replaced by
/// `meta` (`gitlab-haproxy-agent/state` -> `gitlab-haproxy-agent/meta`), so
/// one policy on the parent covers both; or `given`. Refused when the
/// records would be inside the watched listing, or the state inside the
/// records (a record's key could then be a state key).
pub fn meta_prefix(prefix: &str, given: Option<&str>) -> Result<String, String> {
    let meta = match given {
        Some(g) => g.trim_matches('/').to_owned(),
        None => match prefix.rsplit_once('/') {
            Some((parent, _)) => format!("{parent}/meta"),
            None if prefix.is_empty() => String::new(),
            None => "meta".to_owned(),
        },
    };
    let inside = |a: &str, b: &str| a == b || b.is_empty() || a.starts_with(&format!("{b}/"));
    if meta.is_empty() || inside(&meta, prefix) || inside(prefix, &meta) {
        return Err(format!(
            "the records' prefix {meta:?} must be outside -kv-prefix {prefix:?} (and not hold it): give -{RECORD_PREFIX}"
        ));
    }
    Ok(meta)
}

/// Now, in Unix seconds, on this host's clock.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Kv {
    /// From the daemon's flags and the environment, with the daemon's
    /// precedence; `records`: `-record-prefix`, if given.
    pub(crate) fn open(
        daemon: &[String],
        env: &dyn Fn(&str) -> Option<String>,
        records: Option<&str>,
    ) -> Result<Kv, String> {
        let args: Vec<OsString> = daemon.iter().map(OsString::from).collect();
        let config = match crate::config::parse(args, env).map_err(|e| e.0)? {
            Command::Run(c) => c,
            Command::Help(_) | Command::Version(_) => {
                return Err("-version takes no command".into())
            }
        };
        let meta = meta_prefix(&config.kv_prefix, records)?;
        let exchange = Exchange::new(&config.consul).map_err(|e| format!("cannot poll: {e}"))?;
        Ok(Kv {
            exchange,
            prefix: config.kv_prefix,
            meta,
            max_line: config.max_line_bytes,
            secrets: config.consul.secrets(),
        })
    }

    pub(super) fn key(&self, identity: &str) -> String {
        state_key(&self.prefix, identity)
    }

    /// The key of `identity`'s record.
    pub(super) fn record_key(&self, identity: &str) -> String {
        format!("{}/{identity}", self.meta)
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn meta(&self) -> &str {
        &self.meta
    }

    /// Every record, by identity (one listing of the records' prefix).
    pub(crate) fn records(&mut self) -> Result<HashMap<String, KvPair>, String> {
        let meta = self.meta.clone();
        let under = format!("{meta}/");
        let (pairs, filtered) = self.list_filtered(&meta)?;
        if filtered {
            return Err(format!("consul left out records this token may not read (X-Consul-Results-Filtered-By-ACLs): give it key:read on {under}"));
        }
        Ok(pairs
            .into_iter()
            .filter_map(|p| Some((p.key.strip_prefix(&under)?.to_owned(), p)))
            .collect())
    }

    /// `/v1/...` under the address's path prefix, with the namespace and
    /// partition as the watch sends them.
    fn target(&self, path: &str, query: &str) -> String {
        let spec = self.exchange.spec();
        let mut t = format!("{}{path}?{query}", spec.path_prefix);
        for (name, v) in [("ns", &spec.namespace), ("partition", &spec.partition)] {
            if let Some(v) = v {
                t.push_str(&format!(
                    "&{name}={}",
                    percent_encode(v, EncodeSet::KV_PATH)
                ));
            }
        }
        t
    }

    /// One request; a failure or a status other than `ok` names the
    /// request.
    fn request(
        &mut self,
        method: &str,
        target: &str,
        body: &[u8],
        ok: &[u16],
    ) -> Result<(u16, Vec<u8>), String> {
        let shown = target.split('?').next().unwrap_or(target);
        match self.exchange.send(method, target, body) {
            Err(f) => Err(format!(
                "{method} {shown}: consul unreachable: {} ({})",
                f.detail,
                f.reason.label()
            )),
            Ok(r) if ok.contains(&r.head.status) => Ok((r.head.status, r.body)),
            Ok(r) => {
                let text = crate::safe::error_body(&r.body, &self.secrets);
                Err(format!(
                    "{method} {shown}: consul answered HTTP {}: {text}",
                    r.head.status
                ))
            }
        }
    }

    /// Every key under `prefix/` (the whole store for an empty prefix).
    fn list(&mut self, prefix: &str) -> Result<Vec<KvPair>, String> {
        self.list_filtered(prefix).map(|(pairs, _)| pairs)
    }

    /// [`Kv::list`], and whether consul left out keys the token may not
    /// read: it says so (`agent/http.go` sets
    /// X-Consul-Results-Filtered-By-ACLs from
    /// `QueryMeta.ResultsFilteredByACLs`, `api/api.go` reads it), and an
    /// emptied listing is a 404 like an empty prefix.
    fn list_filtered(&mut self, prefix: &str) -> Result<(Vec<KvPair>, bool), String> {
        let path = match prefix.is_empty() {
            true => "/v1/kv/".to_owned(),
            false => format!(
                "/v1/kv/{}",
                percent_encode(&format!("{prefix}/"), EncodeSet::KV_PATH)
            ),
        };
        let target = self.target(&path, "recurse=");
        let shown = path.clone();
        let r = self.exchange.send("GET", &target, b"").map_err(|f| {
            format!(
                "GET {shown}: consul unreachable: {} ({})",
                f.detail,
                f.reason.label()
            )
        })?;
        let filtered = r
            .head
            .headers
            .iter()
            .any(|(k, v)| k == "x-consul-results-filtered-by-acls" && v == b"true");
        match r.head.status {
            404 => Ok((Vec::new(), filtered)),
            200 => decode_list(&r.body)
                .map(|pairs| (pairs, filtered))
                .map_err(|e| format!("GET {path}: {e}")),
            status => {
                let text = crate::safe::error_body(&r.body, &self.secrets);
                Err(format!(
                    "GET {shown}: consul answered HTTP {status}: {text}"
                ))
            }
        }
    }

    /// The keys of `identities` as held now (one listing of the prefix).
    pub(super) fn read(&mut self, identities: &[String]) -> Result<Vec<Held>, String> {
        Ok(self
            .read_expiring(identities)?
            .into_iter()
            .map(|(h, _)| h)
            .collect())
    }

    /// The keys of `identities` as held now, each with the expiry its
    /// Flags carry (0: none).
    pub(super) fn read_expiring(
        &mut self,
        identities: &[String],
    ) -> Result<Vec<(Held, u32)>, String> {
        let prefix = self.prefix.clone();
        let pairs = self.list(&prefix)?;
        let held: HashMap<&str, &KvPair> = pairs.iter().map(|p| (p.key.as_str(), p)).collect();
        Ok(identities
            .iter()
            .map(|i| {
                let p = held.get(self.key(i).as_str());
                let expiry = p.map_or(0, |p| of_flags(p.flags));
                (
                    Held::of(p.map(|p| (p.value.as_slice(), p.modify_index))),
                    expiry,
                )
            })
            .collect())
    }

    /// One key as held now (after a conflict, to say what is there).
    pub(super) fn read_one(&mut self, identity: &str) -> Result<Held, String> {
        let path = format!(
            "/v1/kv/{}",
            percent_encode(&self.key(identity), EncodeSet::KV_PATH)
        );
        let target = self.target(&path, "");
        let (status, body) = self.request("GET", &target, b"", &[200, 404])?;
        let pairs = match status {
            404 => Vec::new(),
            _ => decode_list(&body).map_err(|e| format!("GET {path}: {e}"))?,
        };
        let pair = pairs.first().map(|p| (p.value.as_slice(), p.modify_index));
        Ok(Held::of(pair))
    }

    /// One guarded transaction of `ops` (operations on keys under the
    /// prefix), and what became of it.
    pub(super) fn txn(&mut self, ops: &[serde_json::Value]) -> Delivery {
        let target = self.target("/v1/txn", "");
        let body = serde_json::Value::from(ops.to_vec()).to_string();
        match self.exchange.send("PUT", &target, body.as_bytes()) {
            Err(f) if matches!(f.reason, ErrorReason::Connect | ErrorReason::Tls) => {
                Delivery::NotSent(format!(
                    "PUT /v1/txn: consul unreachable: {} ({})",
                    f.detail,
                    f.reason.label()
                ))
            }
            Err(f) => Delivery::Lost(format!(
                "PUT /v1/txn: no answer: {} ({})",
                f.detail,
                f.reason.label()
            )),
            Ok(r) => {
                let status = r.head.status;
                let text = crate::safe::error_body(&r.body, &self.secrets);
                match status {
                    200 | 409 => match parse_answer(status, &r.body) {
                        Ok(answer) => Delivery::Answered(answer),
                        Err(e) => Delivery::Lost(format!("PUT /v1/txn: HTTP {status}: {e}")),
                    },
                    500..=599 => Delivery::Lost(format!(
                        "PUT /v1/txn: consul answered HTTP {status}: {text}"
                    )),
                    _ => Delivery::Refused(format!(
                        "PUT /v1/txn: consul answered HTTP {status}: {text}"
                    )),
                }
            }
        }
    }
}

/// What became of a transaction sent to consul.
#[derive(Debug)]
pub(super) enum Delivery {
    /// Consul answered 200 or 409 ([`TxnAnswer`]).
    Answered(TxnAnswer),
    /// Consul refused it before applying anything (403 for a token,
    /// 413, 400): nothing of it is written.
    Refused(String),
    /// It never left (no connection): nothing of it is written.
    NotSent(String),
    /// It was sent and no usable answer came (reset, timeout, 5xx, an
    /// unreadable answer): consul may have applied it, or may still.
    Lost(String),
}
