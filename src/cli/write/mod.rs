//! The writers, `set`, `unset` ([`set()`]) and `ramp` ([`ramp()`]), and what
//! they share: their words (their own flags, the daemon's consul flags,
//! the identities), and consul, reached with the daemon's settings through
//! the watch's transport ([`crate::consul::exchange`]).
//!
//! The daemon's flags are handed to the daemon's own parser
//! ([`crate::config::parse`]), so the address, token, token file, TLS
//! settings and `-kv-prefix` come from the same flags and variables with
//! the same precedence. Pure parts: [`plan`] (checks, changes, the
//! transaction, the undo line) and [`schedule`] (the ramp's arithmetic).

mod machine;
pub mod plan;
mod ramp;
pub mod record;
pub mod schedule;
mod set;

use std::collections::HashMap;
use std::ffi::OsString;

use crate::cli::{Args, Io};
use crate::config::Command;
use crate::consul::error::ErrorReason;
use crate::consul::exchange::Exchange;
use crate::consul::kv::{decode_list, KvPair};
use crate::http::{percent_encode, EncodeSet};
use plan::{Held, Target, TxnAnswer};

pub use ramp::run as ramp;
pub use set::{run_set as set, run_unset as unset};

/// The flag naming the records' prefix (default: [`meta_prefix`]).
pub const RECORD_PREFIX: &str = "record-prefix";

/// Consul, as the daemon would reach it, the KV prefix, the records'
/// prefix, and the longest request line the daemon reads
/// (`-max-line-bytes`: longer identities can never be asked for).
pub(crate) struct Kv {
    exchange: Exchange,
    prefix: String,
    /// Where the records are ([`meta_prefix`]).
    meta: String,
    max_line: usize,
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

/// The writer's words for its records: `-by`, `-reason`, `-for` or
/// `-until`, and the command line, checked (exit 2 otherwise).
pub(crate) struct Recorder {
    by: String,
    /// `-reason`: `None` keeps the reason recorded, `Some(None)` (`-reason
    /// ''`) clears it.
    reason: Option<Option<String>>,
    /// `-for` or `-until`.
    pub(crate) until: Until,
    command: String,
}

/// What a write does to a key's expiry (its consul Flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Neither `-for` nor `-until`: the expiry the key holds stays.
    Keep,
    /// `-for none`.
    Clear,
    /// `-for DURATION`, from the write.
    For(std::time::Duration),
    /// `-until TIME` (Unix seconds, within the window of [`crate::state::expiry::of_flags`]).
    At(u32),
}

impl Until {
    /// A new expiry is given (`-for DURATION` or `-until`).
    pub(crate) fn sets(self) -> bool {
        matches!(self, Until::For(_) | Until::At(_))
    }
}

/// The writers' flags for the records.
pub(crate) const RECORD_FLAGS: [&str; 5] = ["by", "reason", "for", "until", RECORD_PREFIX];

impl Recorder {
    pub(crate) fn of(
        w: &Args,
        env: &dyn Fn(&str) -> Option<String>,
        verb: &str,
        args: &[OsString],
    ) -> Result<Recorder, String> {
        for flag in ["by", "reason"] {
            if let Some(text) = w.value(flag) {
                record::check_text(flag, text)?;
            }
        }
        let until = match (w.value("for"), w.value("until")) {
            (Some(_), Some(_)) => return Err("give -for or -until, not both".into()),
            (None, None) => Until::Keep,
            (Some("none"), None) => Until::Clear,
            (Some(text), None) => match crate::gocompat::parse_go_duration(text) {
                Some(Some(d)) if d.as_secs() > 0 => Until::For(d),
                _ => {
                    return Err(format!(
                    "-for {text:?} is not a positive duration of a second or more (2h, 30m, 1h30m), nor none"
                ))
                }
            },
            (None, Some(text)) => Until::At(record::parse_until(text)?),
        };
        let mut words = vec!["gitlab-haproxy-agent".to_owned(), verb.to_owned()];
        words.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
        let login = login_name();
        Ok(Recorder {
            by: record::who(w.value("by"), env, login.as_deref(), &host_name()),
            reason: w
                .value("reason")
                .map(|r| (!r.is_empty()).then(|| r.to_owned())),
            until,
            command: record::command_line(&words),
        })
    }

    /// The expiry a write at `now` gives: `None` keeps the key's, `Some(0)`
    /// clears it; refused when it is not one the daemon would read as such
    /// (2020..2100).
    pub(crate) fn expiry(&self, now: u64) -> Result<Option<u32>, String> {
        match self.until {
            Until::Keep => Ok(None),
            Until::Clear => Ok(Some(0)),
            Until::At(at) => Ok(Some(at)),
            Until::For(d) => {
                match crate::state::expiry::of_flags(now.saturating_add(d.as_secs())) {
                    0 => Err(format!(
                    "-for {}s from now ends past 2100-01-01, which consul Flags cannot say here",
                    d.as_secs()
                )),
                    e => Ok(Some(e)),
                }
            }
        }
    }

    /// What a write of `target` carries over from the key it replaces (its
    /// recorded reason, its expiry `was`), given the expiry asked for
    /// (`new`, from [`Recorder::expiry`]).
    pub(crate) fn carry(
        &self,
        target: plan::Target,
        reason: Option<String>,
        was: u32,
        new: Option<u32>,
    ) -> plan::Carried {
        let Target::Set(d) = target else {
            return plan::Carried::default();
        };
        let kept_reason = self.reason.is_none() && reason.is_some();
        let reason = match &self.reason {
            None => reason,
            Some(given) => given.clone(),
        };
        // A key answering ready 100% has nothing to expire.
        let diverted = d.reply() != crate::contract::Desired::READY.reply();
        let (until, kept_until) = match new {
            _ if !diverted => (0, false),
            Some(e) => (e, false),
            None => (was, was != 0),
        };
        plan::Carried {
            reason,
            until,
            kept_reason,
            kept_until,
        }
    }

    /// The record of writing `value` at `now` with what it carries.
    pub(crate) fn record(
        &self,
        value: &crate::contract::Desired,
        now: u64,
        carried: &plan::Carried,
    ) -> String {
        record::Record {
            by: self.by.clone(),
            when: now,
            reason: carried.reason.clone(),
            until: (carried.until != 0).then_some(u64::from(carried.until)),
            value: value.to_string(),
            command: self.command.clone(),
        }
        .encode()
    }
}

/// The reason recorded for a key held as `held` (none for an absent key:
/// its record, if any, is an orphan).
pub(crate) fn recorded_reason(
    records: &HashMap<String, KvPair>,
    identity: &str,
    held: &Held,
) -> Option<String> {
    if *held == Held::Absent {
        return None;
    }
    let pair = records.get(identity)?;
    record::decode(&pair.value).ok()?.reason
}

/// Now, in Unix seconds, on this host's clock.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The login name of this process's uid, for the records' `by` when
/// neither `$SUDO_USER` nor `$USER` is set.
fn login_name() -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: an all-zero passwd is a valid value for getpwuid_r to fill.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; buf outlives pwd's use.
    let rc = unsafe {
        libc::getpwuid_r(
            libc::getuid(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded: pw_name is a C string inside buf.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned()).filter(|n| !n.is_empty())
}

/// This host's name, for the records' `by`.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match rc {
        0 => String::from_utf8_lossy(&buf[..end]).into_owned(),
        _ => String::new(),
    }
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

    fn key(&self, identity: &str) -> String {
        match self.prefix.is_empty() {
            true => identity.to_owned(),
            false => format!("{}/{identity}", self.prefix),
        }
    }

    /// The key of `identity`'s record.
    fn record_key(&self, identity: &str) -> String {
        format!("{}/{identity}", self.meta)
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
    fn read(&mut self, identities: &[String]) -> Result<Vec<Held>, String> {
        Ok(self
            .read_expiring(identities)?
            .into_iter()
            .map(|(h, _)| h)
            .collect())
    }

    /// The keys of `identities` as held now, each with the expiry its
    /// Flags carry (0: none).
    fn read_expiring(&mut self, identities: &[String]) -> Result<Vec<(Held, u32)>, String> {
        let prefix = self.prefix.clone();
        let pairs = self.list(&prefix)?;
        let held: HashMap<&str, &KvPair> = pairs.iter().map(|p| (p.key.as_str(), p)).collect();
        Ok(identities
            .iter()
            .map(|i| {
                let p = held.get(self.key(i).as_str());
                let expiry = p.map_or(0, |p| crate::state::expiry::of_flags(p.flags));
                (
                    Held::of(p.map(|p| (p.value.as_slice(), p.modify_index))),
                    expiry,
                )
            })
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
    /// prefix), and what became of it.
    fn txn(&mut self, ops: &[serde_json::Value]) -> Delivery {
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
                    200 | 409 => match plan::parse_answer(status, &r.body) {
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
enum Delivery {
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

/// An operation of a guarded transaction: its key's identity and the
/// ModifyIndex the write was guarded by (0: it was absent, or unseen), and
/// for the operation on its record, the record's key.
struct Guarded<'a> {
    identity: &'a str,
    guard: u64,
    record: Option<String>,
}

impl<'a> Guarded<'a> {
    /// The two operations of a key's write: its state key's, its record's.
    fn pair(kv: &Kv, identity: &'a str, guard: u64) -> [Guarded<'a>; 2] {
        let record = Some(kv.record_key(identity));
        [
            Guarded {
                identity,
                guard,
                record: None,
            },
            Guarded {
                identity,
                guard,
                record,
            },
        ]
    }
}

/// Why consul answered 409 to a transaction (nothing of it applied).
#[derive(Debug)]
enum Refusal {
    /// The token may not write these keys: one line each.
    Denied(Vec<String>),
    /// Someone else changed a key since it was read (its ModifyIndex
    /// moved).
    Conflict(String),
    /// Anything else (a key unchanged since it was read, yet refused).
    Other(String),
}

impl Refusal {
    fn lines(&self) -> Vec<String> {
        match self {
            Refusal::Denied(lines) => lines.clone(),
            Refusal::Conflict(line) => vec![format!("conflict: {line}")],
            Refusal::Other(line) => vec![line.clone()],
        }
    }
}

/// Reads a 409: a denial is matched on consul's `What` prefix (consul
/// answers it with the same 409 as a failed check-and-set); anything else
/// is a conflict only if the key's ModifyIndex moved since the guard.
fn refusal(kv: &mut Kv, keys: &[Guarded<'_>], errors: &[(usize, String)]) -> Refusal {
    let name = |at: usize| keys.get(at).map_or("?", |k| k.identity);
    let unseen = |at: usize| {
        match keys.get(at).is_some_and(|k| k.guard == 0) {
        true => " (it read as absent, and consul hides from a listing the keys a token cannot read: it may exist unseen)",
        false => "",
    }
    };
    let denied: Vec<String> = errors
        .iter()
        .filter(|(_, what)| what.starts_with(plan::PERMISSION_DENIED))
        .map(|(at, what)| match keys.get(*at).and_then(|k| k.record.as_deref()) {
            Some(record) => format!(
                "consul refused: permission denied for the record {record}: the token cannot write the records of the keys it writes (nothing of that transaction was written); give it the README's policy: {} (consul: {what})",
                plan::policy_line(&kv.prefix, &kv.meta)
            ),
            None => format!(
                "consul refused: permission denied for {}: the token cannot write it{} (consul: {what})",
                name(*at),
                unseen(*at)
            ),
        })
        .collect();
    if !denied.is_empty() {
        return Refusal::Denied(denied);
    }
    let Some((at, what)) = errors.first() else {
        return Refusal::Other("consul refused the transaction without saying why".into());
    };
    let identity = name(*at);
    let guard = keys.get(*at).map_or(0, |k| k.guard);
    match kv.read_one(identity) {
        Ok(Held::Absent) if guard != 0 => Refusal::Conflict(format!(
            "{identity} was changed by someone else since it was read: it is now absent (ready 100%) (consul: {what})"
        )),
        Ok(held) if held.index() != guard => Refusal::Conflict(format!(
            "{identity} was changed by someone else since it was read: it is now {} (index {}) (consul: {what})",
            held.render(),
            held.index()
        )),
        Ok(held) => Refusal::Other(format!(
            "consul refused the write of {identity}, unchanged since it was read ({}, index {}): {what}",
            held.render(),
            held.index()
        )),
        Err(e) => Refusal::Other(format!(
            "consul refused the write of {identity}: {what} (and re-reading it failed: {e}){}",
            unseen(*at)
        )),
    }
}

/// The flag naming the haproxy configuration that [`static_weights`]
/// checks (repeatable).
pub(super) const HAPROXY_CONFIG: &str = "haproxy-config";

/// The variable giving it when the flag is not given.
pub const HAPROXY_CONFIG_ENV: &str = "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG";

/// The configuration read when neither gives one, if it exists.
pub const DEFAULT_HAPROXY_CONFIG: &str = "/etc/haproxy/haproxy.cfg";

/// Weights other than 0% and 100% for `weighted` identities: refused for
/// a server of a static-algorithm backend (haproxy ignores them: "Backend
/// is using a static LB algorithm"), each named with its backend and
/// `balance`, as the configuration shows it: `-haproxy-config` (an
/// unreadable one is an error), else [`HAPROXY_CONFIG_ENV`], else
/// [`DEFAULT_HAPROXY_CONFIG`]; when neither of these can be read, one
/// warning naming the path tried.
pub(super) fn static_weights(
    w: &Args,
    io: &mut Io<'_>,
    command: &str,
    weighted: &[&str],
) -> Result<(), String> {
    if weighted.is_empty() {
        return Ok(());
    }
    let mut configs: Vec<String> = w
        .values(HAPROXY_CONFIG)
        .into_iter()
        .map(str::to_owned)
        .collect();
    if configs.is_empty() {
        let (path, from) = match (io.env)(HAPROXY_CONFIG_ENV).filter(|p| !p.is_empty()) {
            Some(p) => (p, HAPROXY_CONFIG_ENV),
            None => (DEFAULT_HAPROXY_CONFIG.to_owned(), "the default"),
        };
        let mut files = Vec::new();
        if let Err(e) = crate::cli::lint::read_config(&path, &mut files) {
            let _ = writeln!(
                io.err,
                "gitlab-haproxy-agent {command}: warning: no haproxy configuration read ({from}: {e}), so a backend with a static algorithm (balance static-rr, or hashing with hash-type map-based), which ignores weights other than 0% and 100%, cannot be checked; give -haproxy-config FILE"
            );
            return Ok(());
        }
        configs.push(path);
    }
    let mut files = Vec::new();
    for name in &configs {
        crate::cli::lint::read_config(name, &mut files)?;
    }
    let env = crate::cli::lint::config_env(io.env);
    let refused: Vec<String> = crate::lint::static_senders(&files, &env)
        .into_iter()
        .filter(|(identity, _)| weighted.iter().any(|w| w.as_bytes() == identity.as_slice()))
        .map(|(identity, what)| format!("{} ({what})", String::from_utf8_lossy(&identity)))
        .collect();
    match refused.as_slice() {
        [] => Ok(()),
        _ => Err(format!(
            "a static algorithm ignores weights other than 0% and 100%, so no ramp or N% reaches {}: give drain, maint, ready, 0% or 100%, or change the backend's balance (roundrobin, leastconn, or hash-type consistent)",
            refused.join(", ")
        )),
    }
}
