//! `status`: the running agent's diverted keys, for humans (a table) or
//! scripts (`-json`), read from its `/debug/state`, joined with the
//! writers' records (SPEC §13) read from consul with the daemon's flags.
//!
//! In: the pprof address, the consul flags. Out: one row per diverted key
//! (value, reply, when this haproxy last asked, unasked ones marked with
//! the identity probably meant; who, since when, why and until when, from
//! its record and its Flags); exit 1 when a key is unasked or past its
//! expiry, or the agent does not answer from consul's state. The
//! rendering is pure over the document and the records.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::fetch::http_get;
use super::write::{Kv, RECORD_PREFIX};
use super::{target, usage_error, Args, Io, FINDING, OK};
use crate::consul::kv::KvPair;
use crate::contract::record::{self, Record};

/// The whole request, connect to last byte.
const DEADLINE: Duration = Duration::from_secs(30);
/// `/debug/state` of 100,000 keys is about 20 MB.
const MAX_BODY: usize = 256 << 20;

const HELP: &str = "\
usage: gitlab-haproxy-agent status [-pprof-addr ADDR] [-json]
       [-record-prefix PREFIX] [consul flags]

Lists every diverted key (reply not ready 100%) of the running agent: value,
reply, when this haproxy last asked for it, and the unasked ones (no check
asked within -unasked-after) with the identity probably meant; and from the
writers' records (read from consul with the daemon's flags and variables, as
set does), who wrote it, since when, why, and until when (the expiry in its
Flags, as the agent reads it: EXPIRED 20m ago once past). A key written
without a record says no record; one written after its record (consul kv
put) says changed outside the writers. Reads /debug/state on ADDR (default
GITLAB_HAPROXY_AGENT_PPROF_ADDR, else 127.0.0.1:9779). -json prints the same
for scripts. Exits 1 when a key is unasked or past its expiry, or the agent
is not answering from consul's state.
";

pub(super) fn run(args: &[std::ffi::OsString], io: &mut Io<'_>) -> u8 {
    let parsed = Args::parse_with(
        args,
        &["pprof-addr", RECORD_PREFIX],
        &["json"],
        crate::config::daemon_flag,
    );
    let a = match parsed {
        Ok(a) if a.help => {
            let _ = io.out.write_all(HELP.as_bytes());
            return OK;
        }
        Ok(a) => a,
        Err(e) => return usage_error(io, "status", &e),
    };
    if !a.positional.is_empty() {
        return usage_error(io, "status", "takes no arguments");
    }
    let addr = match target(&a, io, "pprof-addr", "127.0.0.1:9779") {
        Ok(addr) => addr,
        Err(e) => return usage_error(io, "status", &e),
    };
    let mut kv = match Kv::open(&a.daemon, io.env, a.value(RECORD_PREFIX)) {
        Ok(kv) => kv,
        Err(e) => return usage_error(io, "status", &e),
    };
    let report = fetch(addr).and_then(|body| {
        let doc = serde_json::from_slice::<Value>(&body);
        let doc = doc.map_err(|e| format!("/debug/state is not JSON: {e}"))?;
        let records = kv
            .records()
            .map_err(|e| format!("the records under {}/: {e}", kv.meta()));
        Report::of(&doc, records)
    });
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            let e = crate::safe::text(&e);
            let _ = writeln!(io.err, "cannot read the agent's state at http://{addr}/debug/state: {e} (is the agent running with this -pprof-addr?)");
            return FINDING;
        }
    };
    let text = if a.flag("json") {
        let mut s = serde_json::to_string_pretty(&report.json()).unwrap_or_default();
        s.push('\n');
        s
    } else {
        report.table()
    };
    // -json too: its escapes are JSON's, so it stays JSON.
    let _ = io.out.write_all(crate::safe::output(&text).as_bytes());
    if report.ok() {
        OK
    } else {
        FINDING
    }
}

/// GET /debug/state, the body, within [`DEADLINE`] in all.
fn fetch(addr: SocketAddr) -> Result<Vec<u8>, String> {
    // Only the diverted identities: the whole state of a large KV is
    // seconds of JSON on the agent's one thread.
    let deadline = Instant::now() + DEADLINE;
    let host = addr.to_string();
    match http_get(addr, &host, "/debug/state?diverted", deadline, MAX_BODY) {
        Ok((200, body)) => Ok(body),
        Ok((status, _)) => Err(format!("HTTP status {status}")),
        Err(e) if e.starts_with("no complete answer") => {
            Err(format!("no complete answer within {}s", DEADLINE.as_secs()))
        }
        Err(e) => Err(e),
    }
}

/// Where a diverted key stands with this haproxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// A check asked for it since it was written: the write reached a server.
    Asked,
    /// Not asked since its write yet, and younger than `-unasked-after`.
    Waiting,
    Unasked,
}

impl Standing {
    fn label(self) -> &'static str {
        match self {
            Standing::Asked => "asked",
            Standing::Waiting => "waiting",
            Standing::Unasked => "unasked",
        }
    }
}

/// One diverted key, as shown.
struct Row {
    identity: String,
    value: String,
    reply: String,
    modify_index: u64,
    /// Unix seconds and seconds ago.
    last_asked: Option<(u64, u64)>,
    standing: Standing,
    did_you_mean: Option<String>,
    /// The expiry its Flags carry, as the agent read it (Unix seconds).
    expires: Option<u64>,
    record: Written,
}

/// What the records say of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Written {
    /// Its record, written with it (the key's ModifyIndex is the record's).
    Record(Record),
    /// Its record, and the key was written after it (its ModifyIndex is
    /// above the record's): `consul kv put` since.
    Outside(Record),
    /// Its record was written after the key (its ModifyIndex is above the
    /// key's): not by the writers, which write both at one index.
    Rewritten(Record),
    /// No record: written without the writers.
    None,
    /// A record that is not one (a raw write).
    Unreadable(String),
    /// The records could not be read (said once, under the table).
    NotRead,
}

impl Written {
    /// The record `pair` of the key `row`. The writers write both at one
    /// index; but consul keeps an entry's ModifyIndex when a write leaves
    /// it as it was (`kvsSetTxn`, `existing.Equal(entry)`), so a ramp step
    /// repeating a weight moves only the record, and a record rewritten
    /// byte for byte moves only the key. The indexes are read only when
    /// the record does not say what the key holds (its value and expiry).
    fn of(row: &Row, pair: Option<&KvPair>) -> Written {
        let Some(pair) = pair else {
            return Written::None;
        };
        let says_the_key = |r: &Record| {
            let desired = |v: &str| crate::contract::parse_value(v.as_bytes()).ok();
            desired(&r.value).is_some()
                && desired(&r.value) == desired(&row.value)
                && r.until == row.expires
        };
        match record::decode(&pair.value) {
            Ok(r) if says_the_key(&r) => Written::Record(r),
            Ok(r) if row.modify_index > pair.modify_index => Written::Outside(r),
            Ok(r) if row.modify_index < pair.modify_index => Written::Rewritten(r),
            Ok(r) => Written::Record(r),
            Err(e) => Written::Unreadable(format!("record unreadable: {e}")),
        }
    }

    fn record(&self) -> Option<&Record> {
        match self {
            Written::Record(r) | Written::Outside(r) | Written::Rewritten(r) => Some(r),
            Written::None | Written::Unreadable(_) | Written::NotRead => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Written::Record(_) => "written",
            Written::Outside(_) => "changed_outside",
            Written::Rewritten(_) => "record_changed_outside",
            Written::None => "none",
            Written::Unreadable(_) => "unreadable",
            Written::NotRead => "not_read",
        }
    }
}

/// `45s`, `20m`, `2h10m`, `3d4h`.
fn span(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h{}m", s / 3600, s / 60 % 60),
        s => format!("{}d{}h", s / 86_400, s / 3600 % 24),
    }
}

/// A record's `when` against the agent's clock: `2h10m ago`, or how far
/// ahead the writer's clock was.
fn since(when: u64, now: u64) -> String {
    match when <= now {
        true => format!("{} ago", span(now - when)),
        false => format!("{} ahead (writer's clock)", span(when - now)),
    }
}

/// Text from a record as a terminal may show it ([`crate::safe::text`]),
/// cut to `max` bytes.
fn shown(text: &str, max: usize) -> String {
    crate::contract::record::cut(&crate::safe::text(text), max)
}

/// What `/debug/state` says, reduced to what an operator checks.
struct Report {
    source: Option<String>,
    index: u64,
    age_seconds: Option<f64>,
    unasked_after: u64,
    keys: u64,
    unknown_identities: u64,
    /// Consul requests failed in a row, and the last error.
    failures: u64,
    last_error: Option<String>,
    /// The watch holds a blocking query open (consul answers it at the
    /// next change, or at -consul-wait): a read that is old is not stale.
    holding: bool,
    rows: Vec<Row>,
    /// The agent's clock, Unix seconds (expiries are counted on it).
    now: u64,
    /// Why the records could not be read.
    records_error: Option<String>,
}

impl Report {
    /// `Err` when the document is not the agent's `/debug/state`;
    /// `records`: the writers' records by identity, or why they could not
    /// be read.
    fn of(doc: &Value, records: Result<HashMap<String, KvPair>, String>) -> Result<Report, String> {
        if !doc["watcher"].is_object()
            || !doc
                .get("state")
                .is_some_and(|s| s.is_null() || s.is_object())
        {
            return Err("/debug/state is not the agent's (no watcher or state)".into());
        }
        let asking = &doc["asking"];
        let unasked: HashMap<&str, Option<String>> = asking["unasked"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| {
                let meant = u["did_you_mean"].as_str().map(str::to_owned);
                Some((u["identity"].as_str()?, meant))
            })
            .collect();
        let identities = doc["state"]["identities"].as_object();
        let after = asking["unasked_after_seconds"].as_u64().unwrap_or(0);
        let rows = identities
            .into_iter()
            .flatten()
            .filter(|(_, e)| e["reply"] != "ready 100%")
            .map(|(id, e)| {
                let mut row = Row::of(id, e, &unasked, after);
                row.record = match &records {
                    Ok(r) => Written::of(&row, r.get(id)),
                    Err(_) => Written::NotRead,
                };
                row
            })
            .collect();
        let now = doc["expiry"]["now_unix_seconds"]
            .as_u64()
            .unwrap_or_else(crate::cli::write::unix_now);
        Ok(Report {
            source: doc["source"].as_str().map(str::to_owned),
            index: doc["state"]["index"].as_u64().unwrap_or(0),
            age_seconds: doc["age_seconds"].as_f64(),
            unasked_after: asking["unasked_after_seconds"].as_u64().unwrap_or(0),
            keys: doc["state"]["keys"].as_u64().unwrap_or(0),
            failures: doc["watcher"]["consecutive_failures"].as_u64().unwrap_or(0),
            last_error: doc["watcher"]["last_error"].as_str().map(str::to_owned),
            holding: doc["watcher"]["phase"] == "awaiting_head",
            unknown_identities: asking["unknown_identities_count"].as_u64().unwrap_or(0),
            rows,
            now,
            records_error: records.err(),
        })
    }

    /// Diverted keys past their expiry.
    fn expired(&self) -> usize {
        self.rows.iter().filter(|r| r.expired(self.now)).count()
    }

    fn count(&self, standing: Standing) -> usize {
        self.rows.iter().filter(|r| r.standing == standing).count()
    }

    /// Answering consul's state, and every diverted key asked for since
    /// its write.
    fn ok(&self) -> bool {
        self.source.as_deref() == Some("consul")
            && self.failures == 0
            && self.rows.iter().all(|r| r.standing == Standing::Asked)
            && self.expired() == 0
    }

    fn headline(&self) -> String {
        match self.source.as_deref() {
            Some("consul") if self.failures > 0 => format!(
                "CONSUL FAILING ({} requests in a row, last: {}): answering from its last read (index {}, {} ago); KV writes are not seen until it answers",
                self.failures,
                self.last_error.as_deref().unwrap_or("?"),
                self.index,
                self.age_seconds.map_or("?".into(), |a| format!("{a:.0}s")),
            ),
            Some("consul") => {
                let age = self.age_seconds.map_or("?".into(), |a| format!("{a:.0}s"));
                match self.holding {
                    true => format!("answering from consul: index {}, watching: a blocking query is held open and consul answers it at the next change (last answer {age} ago)", self.index),
                    false => format!("answering from consul: index {}, last read {age} ago (the watch is between reads)", self.index),
                }
            }
            Some("state_file") => format!(
                "answering from the state file (index {}): consul not read since the start; KV writes are not seen yet",
                self.index
            ),
            _ => "NOT ANSWERING: no complete consul read and no state file answered yet; every check closes without a reply".into(),
        }
    }

    fn table(&self) -> String {
        let mut lines = vec![crate::safe::text(&self.headline()).into_owned()];
        let header = [
            "IDENTITY",
            "VALUE",
            "REPLY",
            "LAST ASKED",
            "BY",
            "SINCE",
            "REASON",
            "UNTIL",
            "",
        ];
        let mut cells: Vec<[String; 9]> = vec![header.map(str::to_owned)];
        for r in &self.rows {
            let asked = r
                .last_asked
                .map_or("never".into(), |(_, ago)| format!("{ago}s ago"));
            let rec = r.record.record();
            cells.push(
                [
                    r.identity.clone(),
                    r.value.clone(),
                    r.reply.clone(),
                    asked,
                    rec.map_or("-".into(), |x| shown(&x.by, 40)),
                    rec.map_or("-".into(), |x| since(x.when, self.now)),
                    rec.and_then(|x| x.reason.as_deref())
                        .map_or("-".into(), |x| shown(x, 60)),
                    r.until(self.now),
                    r.notes().join("; "),
                ]
                .map(|cell| crate::safe::text(&cell).into_owned()),
            );
        }
        if !self.rows.is_empty() {
            lines.push(crate::columns::aligned(&cells).trim_end().to_owned());
        }
        let plural = |n: u64, one: &str, many: &str| crate::columns::counted(n as usize, one, many);
        lines.push(format!(
            "{} diverted of {}; {} (no check within {}s), {} for a first check since the write; {} past its expiry; {} asked without a key",
            self.rows.len(),
            plural(self.keys, "key", "keys"),
            plural(self.count(Standing::Unasked) as u64, "unasked", "unasked"),
            self.unasked_after,
            plural(self.count(Standing::Waiting) as u64, "waiting", "waiting"),
            self.expired(),
            plural(self.unknown_identities, "identity", "identities"),
        ));
        if let Some(e) = &self.records_error {
            lines.push(format!("records not read: {}", crate::safe::text(e)));
        }
        lines.join("\n") + "\n"
    }

    fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "identity": r.identity,
                    "value": r.value,
                    "reply": r.reply,
                    "modify_index": r.modify_index,
                    "last_asked_unix_seconds": r.last_asked.map(|(t, _)| t),
                    "last_asked_seconds_ago": r.last_asked.map(|(_, ago)| ago),
                    "standing": r.standing.label(),
                    "did_you_mean": r.did_you_mean,
                    "until_unix_seconds": r.expires,
                    "expired": r.expired(self.now),
                    "record": r.record.label(),
                    "by": r.record.record().map(|x| &x.by),
                    "since_unix_seconds": r.record.record().map(|x| x.when),
                    "reason": r.record.record().and_then(|x| x.reason.as_ref()),
                    "record_until_unix_seconds": r.record.record().and_then(|x| x.until),
                    "notes": r.notes(),
                })
            })
            .collect();
        json!({
            "ok": self.ok(),
            "source": self.source,
            "index": self.index,
            "unasked_after_seconds": self.unasked_after,
            "keys": self.keys,
            "diverted": rows,
            "unasked": self.count(Standing::Unasked),
            "waiting": self.count(Standing::Waiting),
            "expired": self.expired(),
            "records_error": self.records_error,
            "unknown_identities": self.unknown_identities,
        })
    }
}

impl Row {
    fn expired(&self, now: u64) -> bool {
        self.expires.is_some_and(|t| t <= now)
    }

    /// `EXPIRED 20m ago`, `in 1h40m`, or `-`.
    fn until(&self, now: u64) -> String {
        match self.expires {
            None => "-".into(),
            Some(t) if t <= now => format!("EXPIRED {} ago", span(now - t)),
            Some(t) => format!("in {}", span(t - now)),
        }
    }

    /// What the operator should know beyond the columns.
    fn notes(&self) -> Vec<String> {
        let mut notes = match (self.standing, &self.did_you_mean) {
            (Standing::Asked, _) => vec![],
            (Standing::Waiting, _) => vec!["WAITING: not asked since its write yet".to_owned()],
            (Standing::Unasked, Some(id)) => vec![format!("UNASKED: did you mean {id}?")],
            (Standing::Unasked, None) => vec!["UNASKED: no close identity is asked for".to_owned()],
        };
        match &self.record {
            Written::None => notes.push("no record".into()),
            Written::Outside(_) => {
                notes.push("changed outside the writers (after its record)".into())
            }
            Written::Rewritten(_) => notes.push(
                "record changed outside the writers (after its key): not to be trusted".into(),
            ),
            Written::Unreadable(e) => notes.push(e.clone()),
            Written::Record(_) | Written::NotRead => {}
        }
        let said = self.record.record().and_then(|r| r.until);
        if self.record.record().is_some() && said != self.expires {
            let said = said.map_or("none".into(), crate::logging::utc_seconds);
            notes.push(format!("the record says until {said}"));
        }
        notes
    }

    /// `after`: `-unasked-after` in seconds (a key asked within it is
    /// asked, even if the agent's last sweep, up to 5 s ago, said unasked).
    fn of(id: &str, e: &Value, unasked: &HashMap<&str, Option<String>>, after: u64) -> Row {
        let last_asked = e["last_asked"]["unix_seconds"]
            .as_u64()
            .zip(e["last_asked"]["seconds_ago"].as_u64());
        let since = e["unchanged_since_unix_seconds"]
            .as_u64()
            .unwrap_or(u64::MAX);
        // The agent orders an ask and the write by the swap that applied
        // it, which whole seconds cannot (an agent before that field: only
        // an ask in a later second surely came after the write).
        let asked_since = |t: u64| e["asked_since_write"].as_bool().unwrap_or(t > since);
        let standing = match (unasked.contains_key(id), last_asked) {
            (_, Some((t, ago))) if asked_since(t) && ago < after.max(1) => Standing::Asked,
            (true, _) => Standing::Unasked,
            (false, Some((t, _))) if asked_since(t) => Standing::Asked,
            (false, _) => Standing::Waiting,
        };
        Row {
            identity: id.to_owned(),
            value: e["value"].as_str().unwrap_or("").to_owned(),
            reply: e["reply"].as_str().unwrap_or("").to_owned(),
            modify_index: e["modify_index"].as_u64().unwrap_or(0),
            last_asked,
            standing,
            did_you_mean: match standing {
                Standing::Unasked => unasked.get(id).cloned().flatten(),
                _ => None,
            },
            expires: e["expires_unix_seconds"].as_u64(),
            record: Written::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        json!({
            "source": "consul",
            "age_seconds": 2.4,
            "watcher": {"phase": "awaiting_head"},
            "state": {"index": 42, "keys": 4, "identities": {
                "be_web/srv01": {"value": "drain", "reply": "drain 100%", "modify_index": 40, "last_asked": null, "unchanged_since_unix_seconds": 900, "unasked": true},
                "be_web/srv2": {"value": "50%", "reply": "ready 50%", "modify_index": 41, "last_asked": {"unix_seconds": 1000, "seconds_ago": 1}, "unchanged_since_unix_seconds": 900, "unasked": false},
                "be_web/srv3": {"value": "ready", "reply": "ready 100%", "modify_index": 42, "last_asked": {"unix_seconds": 1000, "seconds_ago": 1}, "unchanged_since_unix_seconds": 900, "unasked": false},
                "be_web/srv4": {"value": "maint", "reply": "maint 100%", "modify_index": 43, "last_asked": {"unix_seconds": 1000, "seconds_ago": 1}, "unchanged_since_unix_seconds": 1000, "unasked": false},
            }},
            "asking": {"unasked_after_seconds": 60, "unasked": [
                {"identity": "be_web/srv01", "did_you_mean": "be_web/srv1"}
            ], "unknown_identities": {"be_web/srv1": {"unix_seconds": 1000, "seconds_ago": 1}}, "unknown_identities_count": 1},
        })
    }

    /// be_web/srv2 written by `set` with its record (same index), past
    /// its expiry; be_web/srv4 written with one, then by `consul kv put`.
    fn records() -> HashMap<String, KvPair> {
        let rec = |id: &str, index: u64, until: Option<u64>| {
            let r = Record {
                by: "alice@lb1".into(),
                when: 10_000 - 7_800,
                reason: Some("INC-123 db failover".into()),
                until,
                value: "50%".into(),
                command: "gitlab-haproxy-agent set be_web/srv2=50%".into(),
            };
            let pair = KvPair {
                key: format!("m/{id}"),
                value: r.encode().into_bytes(),
                modify_index: index,
                flags: 0,
            };
            (id.to_owned(), pair)
        };
        HashMap::from([
            rec("be_web/srv2", 41, Some(8_800)),
            rec("be_web/srv4", 40, None),
        ])
    }

    /// An old read under a held blocking query is a healthy watch, not a
    /// stale one: the headline tells them apart.
    #[test]
    fn the_headline_tells_a_held_blocking_query_from_a_read_between_polls() {
        let mut d = doc();
        d["age_seconds"] = json!(77.0);
        let held = Report::of(&d, Ok(records())).unwrap().headline();
        assert!(
            held.contains("watching: a blocking query is held open")
                && held.contains("last answer 77s ago"),
            "{held}"
        );
        d["watcher"]["phase"] = json!("idle");
        let idle = Report::of(&d, Ok(records())).unwrap().headline();
        assert_eq!(
            idle,
            "answering from consul: index 42, last read 77s ago (the watch is between reads)"
        );
    }

    #[test]
    fn the_table_shows_diverted_keys_and_marks_the_unasked_with_the_identity_meant() {
        let mut d = doc();
        d["expiry"] = json!({"expired_keys": 1, "now_unix_seconds": 10_000});
        d["state"]["identities"]["be_web/srv2"]["expires_unix_seconds"] = json!(8_800);
        let r = Report::of(&d, Ok(records())).unwrap();
        assert!(!r.ok());
        assert_eq!(
            r.table(),
            "answering from consul: index 42, watching: a blocking query is held open and consul answers it at the next change (last answer 2s ago)\n\
             IDENTITY      VALUE  REPLY       LAST ASKED  BY         SINCE      REASON               UNTIL\n\
             be_web/srv01  drain  drain 100%  never       -          -          -                    -                UNASKED: did you mean be_web/srv1?; no record\n\
             be_web/srv2   50%    ready 50%   1s ago      alice@lb1  2h10m ago  INC-123 db failover  EXPIRED 20m ago\n\
             be_web/srv4   maint  maint 100%  1s ago      alice@lb1  2h10m ago  INC-123 db failover  -                WAITING: not asked since its write yet; changed outside the writers (after its record)\n\
             3 diverted of 4 keys; 1 unasked (no check within 60s), 1 waiting for a first check since the write; 1 past its expiry; 1 identity asked without a key\n"
        );
        let j = r.json();
        assert_eq!(j["expired"], 1);
        assert_eq!(j["diverted"][1]["expired"], true);
        assert_eq!(j["diverted"][1]["until_unix_seconds"], 8_800);
        assert_eq!(j["diverted"][1]["by"], "alice@lb1");
        assert_eq!(j["diverted"][1]["reason"], "INC-123 db failover");
        assert_eq!(j["diverted"][0]["record"], "none");
        assert_eq!(j["diverted"][2]["record"], "changed_outside");
        let j = r.json();
        assert_eq!(
            (j["unasked"].as_u64(), j["waiting"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(j["diverted"][2]["standing"], "waiting");
        assert_eq!(j["diverted"][1]["standing"], "asked");
        assert_eq!(j["diverted"][0]["did_you_mean"], "be_web/srv1");
        assert!(j["diverted"][0]["last_asked_unix_seconds"].is_null());
        assert_eq!(j["diverted"][1]["last_asked_seconds_ago"], 1);
    }

    /// Issue 39: KV key names with C1 controls, bidi overrides and
    /// zero-width characters, a record's `by` with ESC sequences (clear
    /// screen, OSC 52 clipboard write) and an identity asked on the agent
    /// port reached the terminal raw.
    #[test]
    fn hostile_keys_records_and_asked_identities_are_shown_escaped_one_line_each() {
        let mut d = doc();
        let keys = ["be\u{9b}2J/a", "be\u{202e}x/b\u{200b}", "be\n/c\u{85}"];
        let ids = d["state"]["identities"].as_object_mut().unwrap();
        let srv2 = ids["be_web/srv2"].clone();
        for k in keys {
            ids.insert(k.to_owned(), srv2.clone());
        }
        ids[keys[0]]["unasked"] = json!(true);
        ids[keys[0]]["last_asked"] = json!(null);
        d["asking"]["unasked"] =
            json!([{"identity": keys[0], "did_you_mean": "x\u{1b}]52;c;eA==\u{7}"}]);
        let mut recs = records();
        let mut pair = recs["be_web/srv2"].clone();
        let mut rec = record::decode(&pair.value).unwrap();
        rec.by = "mallory\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}".into();
        rec.reason = Some("\u{9d}ok\u{2028}".into());
        pair.value = rec.encode().into_bytes();
        recs.insert(keys[1].to_owned(), pair);
        let r = Report::of(&d, Ok(recs)).unwrap();
        let table = r.table();
        assert!(
            !table.chars().any(|c| c != '\n' && crate::safe::hidden(c)),
            "{table:?}"
        );
        for k in keys {
            let shown = crate::safe::text(k);
            assert_eq!(
                table.lines().filter(|l| l.starts_with(&*shown)).count(),
                1,
                "{k:?} on one line: {table}"
            );
        }
        assert!(table.contains("mallory\\u001b[2J\\u001b]52;c;"), "{table}");
        assert!(table.contains("did you mean x\\u001b]52"), "{table}");
        let json =
            crate::safe::output(&serde_json::to_string_pretty(&r.json()).unwrap()).into_owned();
        assert!(!json.chars().any(|c| c != '\n' && crate::safe::hidden(c)));
        let back: Value = serde_json::from_str(&json).expect("-json stays JSON");
        assert_eq!(back, r.json());
    }

    #[test]
    fn a_record_whose_until_differs_from_the_flags_says_so_and_an_expiry_ahead_is_ok() {
        let mut d = doc();
        d["asking"]["unasked"] = json!([]);
        for id in ["be_web/srv01", "be_web/srv4"] {
            d["state"]["identities"][id]["last_asked"] =
                json!({"unix_seconds": 1001, "seconds_ago": 0});
        }
        d["expiry"] = json!({"now_unix_seconds": 10_000});
        d["state"]["identities"]["be_web/srv2"]["expires_unix_seconds"] = json!(16_000);
        let r = Report::of(&d, Ok(records())).unwrap();
        assert!(r.ok(), "an expiry ahead is no finding");
        assert_eq!(r.rows[1].until(r.now), "in 1h40m");
        let notes = r.rows[1].notes();
        assert_eq!(
            notes,
            ["the record says until 1970-01-01T02:26:40Z"],
            "{notes:?}"
        );
        let r = Report::of(&d, Err("GET /v1/kv/m/: consul unreachable".into())).unwrap();
        assert!(r
            .table()
            .ends_with("records not read: GET /v1/kv/m/: consul unreachable\n"));
        assert!(r.ok(), "records not read: the agent's own state still says");
    }

    /// The writers write a key and its record at one index: a record
    /// rewritten after its key (a raw put, a forgery) is not trusted, and a
    /// writer's clock ahead of the agent's is said, not shown as 0s ago.
    #[test]
    fn a_record_written_after_its_key_or_from_a_clock_ahead_is_said_so() {
        let mut d = doc();
        d["expiry"] = json!({"now_unix_seconds": 10_000});
        let mut recs = records();
        recs.get_mut("be_web/srv2").unwrap().modify_index = 99;
        let r = Report::of(&d, Ok(recs)).unwrap();
        assert_eq!(r.rows[1].record.label(), "record_changed_outside");
        assert!(
            r.rows[1].notes()[0].contains("not to be trusted"),
            "{:?}",
            r.rows[1].notes()
        );
        assert_eq!(since(10_300, 10_000), "5m ahead (writer's clock)");
        assert_eq!(since(9_940, 10_000), "1m ago");
    }

    /// Consul keeps a ModifyIndex when a write leaves the entry as it was:
    /// a ramp step repeating a weight moves only the record, a record
    /// rewritten byte for byte only the key. A record that says what the
    /// key holds (value and expiry) is the writers', whatever the indexes.
    #[test]
    fn a_record_saying_what_the_key_holds_is_trusted_whatever_the_indexes() {
        let mut d = doc();
        d["expiry"] = json!({"now_unix_seconds": 10_000});
        d["state"]["identities"]["be_web/srv2"]["expires_unix_seconds"] = json!(8_800);
        for index in [99, 3] {
            let mut recs = records();
            recs.get_mut("be_web/srv2").unwrap().modify_index = index;
            let r = Report::of(&d, Ok(recs)).unwrap();
            assert_eq!(r.rows[1].record.label(), "written", "record index {index}");
        }
    }

    /// A record's `until` is outside bytes: one no clock can hold is shown
    /// as a number, never a panic.
    #[test]
    fn an_until_no_clock_can_hold_is_shown_as_a_number() {
        let mut d = doc();
        d["expiry"] = json!({"now_unix_seconds": 10_000});
        let mut recs = records();
        let pair = recs.get_mut("be_web/srv2").unwrap();
        let mut r = record::decode(&pair.value).unwrap();
        r.until = Some(u64::MAX);
        pair.value = r.encode().into_bytes();
        let r = Report::of(&d, Ok(recs)).unwrap();
        let notes = r.rows[1].notes().join("; ");
        assert!(
            notes.contains("18446744073709551615 (Unix seconds)"),
            "{notes}"
        );
        assert!(r.table().contains("18446744073709551615"), "{}", r.table());
        let _ = r.json();
    }

    #[test]
    fn all_asked_is_ok_and_no_state_or_the_file_is_a_finding() {
        let mut d = doc();
        d["asking"]["unasked"] = json!([]);
        d["state"]["identities"]["be_web/srv01"]["last_asked"] =
            json!({"unix_seconds": 1000, "seconds_ago": 1});
        d["state"]["identities"]["be_web/srv4"]["last_asked"] =
            json!({"unix_seconds": 1001, "seconds_ago": 0});
        assert!(Report::of(&d, Ok(HashMap::new())).unwrap().ok());
        d["source"] = json!("state_file");
        let r = Report::of(&d, Ok(HashMap::new())).unwrap();
        assert!(!r.ok());
        assert!(r.table().starts_with("answering from the state file"));
        let r = Report::of(
            &json!({"source": null, "state": null, "watcher": {}}),
            Ok(HashMap::new()),
        )
        .unwrap();
        assert!(!r.ok());
        assert!(r.table().starts_with("NOT ANSWERING"), "{}", r.table());
        assert!(
            Report::of(&json!({"hello": 1}), Ok(HashMap::new())).is_err(),
            "not the agent's document"
        );
    }

    #[test]
    fn consul_failing_is_a_finding_even_when_every_key_is_asked() {
        let mut d = doc();
        d["asking"]["unasked"] = json!([]);
        for id in ["be_web/srv01", "be_web/srv4"] {
            d["state"]["identities"][id]["last_asked"] =
                json!({"unix_seconds": 1001, "seconds_ago": 0});
        }
        assert!(Report::of(&d, Ok(HashMap::new())).unwrap().ok());
        d["watcher"]["consecutive_failures"] = json!(3);
        d["watcher"]["last_error"] = json!("connection refused");
        let r = Report::of(&d, Ok(HashMap::new())).unwrap();
        assert!(!r.ok());
        assert!(
            r.table()
                .starts_with("CONSUL FAILING (3 requests in a row, last: connection refused)"),
            "{}",
            r.table()
        );
    }

    #[test]
    fn an_ask_in_the_second_of_the_write_is_asked_when_the_agent_says_it_came_after() {
        let mut d = doc();
        // be_web/srv4: written and asked in second 1000.
        d["state"]["identities"]["be_web/srv4"]["asked_since_write"] = json!(true);
        assert_eq!(
            Report::of(&d, Ok(HashMap::new())).unwrap().rows[2].standing,
            Standing::Asked
        );
        d["state"]["identities"]["be_web/srv4"]["asked_since_write"] = json!(false);
        assert_eq!(
            Report::of(&d, Ok(HashMap::new())).unwrap().rows[2].standing,
            Standing::Waiting
        );
    }

    #[test]
    fn a_key_asked_since_the_last_sweep_is_asked_not_unasked() {
        let mut d = doc();
        // The sweep said unasked; a check asked since, after the write.
        d["state"]["identities"]["be_web/srv01"]["last_asked"] =
            json!({"unix_seconds": 1001, "seconds_ago": 0});
        let r = Report::of(&d, Ok(HashMap::new())).unwrap();
        assert_eq!(r.rows[0].standing, Standing::Asked);
        assert_eq!(r.rows[0].did_you_mean, None);
    }
}
