//! The writers, `set`, `unset` ([`set`]) and `ramp` ([`ramp`]), and what
//! they share: their words (their own flags, the daemon's consul flags,
//! the identities), and consul, reached with the daemon's settings through
//! the watch's transport ([`crate::consul::exchange`]).
//!
//! The daemon's flags are handed to the daemon's own parser
//! ([`crate::config::parse`]), so the address, token, token file, TLS
//! settings and `-kv-prefix` come from the same flags and variables with
//! the same precedence. Pure parts: [`plan`] (checks, changes, the
//! transaction, the undo line) and [`schedule`] (the ramp's arithmetic).

pub mod plan;
mod ramp;
pub mod schedule;
mod set;

use std::collections::HashMap;
use std::ffi::OsString;

use crate::config::Command;
use crate::consul::exchange::Exchange;
use crate::consul::kv::decode_list;
use crate::http::{percent_encode, EncodeSet};
use plan::{Held, TxnAnswer};

pub use ramp::run as ramp;
pub use set::{run_set as set, run_unset as unset};

/// Consul, as the daemon would reach it, and the KV prefix.
struct Kv {
    exchange: Exchange,
    prefix: String,
}

impl Kv {
    /// From the daemon's flags and the environment, with the daemon's
    /// precedence.
    fn open(daemon: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Kv, String> {
        let args: Vec<OsString> = daemon.iter().map(OsString::from).collect();
        let config = match crate::config::parse(args, env).map_err(|e| e.0)? {
            Command::Run(c) => c,
            Command::Help(_) | Command::Version(_) => {
                return Err("-version takes no command".into())
            }
        };
        let exchange = Exchange::new(&config.consul).map_err(|e| format!("cannot poll: {e}"))?;
        Ok(Kv {
            exchange,
            prefix: config.kv_prefix,
        })
    }

    fn key(&self, identity: &str) -> String {
        match self.prefix.is_empty() {
            true => identity.to_owned(),
            false => format!("{}/{identity}", self.prefix),
        }
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
                let text = crate::logging::escape(r.body.trim_ascii(), 200);
                Err(format!(
                    "{method} {shown}: consul answered HTTP {}: {text}",
                    r.head.status
                ))
            }
        }
    }

    /// The keys of `identities` as held now (one listing of the prefix).
    fn read(&mut self, identities: &[String]) -> Result<Vec<Held>, String> {
        let path = format!(
            "/v1/kv/{}",
            percent_encode(&format!("{}/", self.prefix), EncodeSet::KV_PATH)
        );
        let path = if self.prefix.is_empty() {
            "/v1/kv/".to_owned()
        } else {
            path
        };
        let target = self.target(&path, "recurse=");
        let (status, body) = self.request("GET", &target, b"", &[200, 404])?;
        let pairs = match status {
            404 => Vec::new(),
            _ => decode_list(&body).map_err(|e| format!("GET {path}: {e}"))?,
        };
        let held: HashMap<&str, (&[u8], u64)> = pairs
            .iter()
            .map(|p| (p.key.as_str(), (p.value.as_slice(), p.modify_index)))
            .collect();
        Ok(identities
            .iter()
            .map(|i| Held::of(held.get(self.key(i).as_str()).copied()))
            .collect())
    }

    /// One key as held now (after a conflict, to say what is there).
    fn read_one(&mut self, identity: &str) -> Result<Held, String> {
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
    /// prefix).
    fn txn(&mut self, ops: &[serde_json::Value]) -> Result<TxnAnswer, String> {
        let target = self.target("/v1/txn", "");
        let body = serde_json::to_vec(ops).map_err(|e| e.to_string())?;
        let (status, answer) = self.request("PUT", &target, &body, &[200, 409])?;
        plan::parse_answer(status, &answer).map_err(|e| format!("PUT /v1/txn: {e}"))
    }
}

/// Says who else wrote, once a guarded write met a conflict on `identity`.
fn conflict_line(kv: &mut Kv, identity: &str) -> String {
    match kv.read_one(identity) {
        Ok(Held::Absent) => format!("{identity} was changed by someone else since it was read: it is now absent (ready 100%)"),
        Ok(held) => format!(
            "{identity} was changed by someone else since it was read: it is now {} (index {})",
            held.render(),
            held.index()
        ),
        Err(e) => format!("{identity} was changed by someone else since it was read ({e})"),
    }
}
