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

use serde::Serialize;

use super::fetch::http_get;
use super::write::{Kv, RECORD_PREFIX};
use super::{target, usage_error, Args, Io, FINDING, OK};
use crate::contract::record::{self, Record};
use crate::debug_doc::{Document, IdentityRow, Source};
use crate::kv::KvPair;

/// The whole request, connect to last byte.
const DEADLINE: Duration = Duration::from_secs(30);
/// `/debug/state` of 100,000 keys is about 20 MB.
const MAX_BODY: usize = 256 << 20;

pub(super) const HELP: &str = "\
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

/// Its own flags.
pub(super) const PPROF_ADDR: &str = "pprof-addr";
pub(super) const JSON: &str = "json";

pub(super) fn run(a: &Args, io: &mut Io<'_>) -> u8 {
    if !a.positional.is_empty() {
        return usage_error(io, "status", "takes no arguments");
    }
    let addr = match target(a, io, PPROF_ADDR, "127.0.0.1:9779") {
        Ok(addr) => addr,
        Err(e) => return usage_error(io, "status", &e),
    };
    let mut kv = match Kv::open(&a.daemon, io.env, a.value(RECORD_PREFIX)) {
        Ok(kv) => kv,
        Err(e) => return usage_error(io, "status", &e),
    };
    let printed = fetch(addr).and_then(|body| {
        let doc = read(&body)?;
        let records = kv
            .records()
            .map_err(|e| format!("the records under {}/: {e}", kv.meta()));
        Ok(printed(&doc, records, a.flag(JSON)))
    });
    match printed {
        Ok((text, code)) => {
            let _ = io.out.write_all(text.as_bytes());
            code
        }
        Err(e) => {
            let e = crate::safe::text(&e);
            let _ = writeln!(io.err, "cannot read the agent's state at http://{addr}/debug/state: {e} (is the agent running with this -pprof-addr?)");
            FINDING
        }
    }
}

/// `/debug/state`'s body as the agent's document: a field missing or of
/// another type is an error naming it.
pub(crate) fn read(body: &[u8]) -> Result<Document, String> {
    serde_json::from_slice(body).map_err(|e| format!("/debug/state is not the agent's: {e}"))
}

/// What `status` prints of a document and the records (the table, or
/// `-json`), escaped for a terminal, and its exit code.
pub(crate) fn printed(
    doc: &Document,
    records: Result<HashMap<String, KvPair>, String>,
    json: bool,
) -> (String, u8) {
    let report = Report::of(doc, records);
    let text = match json {
        true => {
            let mut s = serde_json::to_string_pretty(&report.json()).unwrap_or_default();
            s.push('\n');
            s
        }
        false => report.table(),
    };
    // -json too: its escapes are JSON's, so it stays JSON.
    let text = crate::safe::output(&text).into_owned();
    (text, if report.ok() { OK } else { FINDING })
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
    source: Option<Source>,
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
    /// `records`: the writers' records by identity, or why they could
    /// not be read.
    fn of(doc: &Document, records: Result<HashMap<String, KvPair>, String>) -> Report {
        let asking = doc.asking.as_ref();
        let unasked: HashMap<&str, Option<String>> = asking
            .into_iter()
            .flat_map(|a| &a.unasked)
            .map(|u| (u.identity.as_str(), u.did_you_mean.clone()))
            .collect();
        let after = asking.map_or(0, |a| a.unasked_after_seconds);
        let state = doc.state.as_ref();
        let rows = state
            .into_iter()
            .flat_map(|s| &s.identities)
            .filter(|(_, e)| e.reply != "ready 100%")
            .map(|(id, e)| {
                let mut row = Row::of(id, e, &unasked, after);
                row.record = match &records {
                    Ok(r) => Written::of(&row, r.get(id)),
                    Err(_) => Written::NotRead,
                };
                row
            })
            .collect();
        let watcher = &doc.head.watcher;
        Report {
            source: doc.head.source,
            index: state.map_or(0, |s| s.index),
            age_seconds: doc.head.age_seconds,
            unasked_after: after,
            keys: state.map_or(0, |s| s.keys),
            failures: watcher.consecutive_failures,
            last_error: watcher.last_error.clone(),
            holding: watcher.phase == "awaiting_head",
            unknown_identities: asking.map_or(0, |a| a.unknown_identities_count),
            rows,
            now: doc.head.expiry.now_unix_seconds,
            records_error: records.err(),
        }
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
        self.source == Some(Source::Consul)
            && self.failures == 0
            && self.rows.iter().all(|r| r.standing == Standing::Asked)
            && self.expired() == 0
    }

    fn headline(&self) -> String {
        match self.source {
            Some(Source::Consul) if self.failures > 0 => format!(
                "CONSUL FAILING ({} requests in a row, last: {}): answering from its last read (index {}, {} ago); KV writes are not seen until it answers",
                self.failures,
                self.last_error.as_deref().unwrap_or("?"),
                self.index,
                self.age_seconds.map_or("?".into(), |a| format!("{a:.0}s")),
            ),
            Some(Source::Consul) => {
                let age = self.age_seconds.map_or("?".into(), |a| format!("{a:.0}s"));
                match self.holding {
                    true => format!("answering from consul: index {}, watching: a blocking query is held open and consul answers it at the next change (last answer {age} ago)", self.index),
                    false => format!("answering from consul: index {}, last read {age} ago (the watch is between reads)", self.index),
                }
            }
            Some(Source::StateFile) => format!(
                "answering from the state file (index {}): consul not read since the start; KV writes are not seen yet",
                self.index
            ),
            None => "NOT ANSWERING: no complete consul read and no state file answered yet; every check closes without a reply".into(),
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

    fn json(&self) -> Summary<'_> {
        let diverted = self
            .rows
            .iter()
            .map(|r| {
                let rec = r.record.record();
                Diverted {
                    by: rec.map(|x| x.by.as_str()),
                    did_you_mean: r.did_you_mean.as_deref(),
                    expired: r.expired(self.now),
                    identity: &r.identity,
                    last_asked_seconds_ago: r.last_asked.map(|(_, ago)| ago),
                    last_asked_unix_seconds: r.last_asked.map(|(t, _)| t),
                    modify_index: r.modify_index,
                    notes: r.notes(),
                    reason: rec.and_then(|x| x.reason.as_deref()),
                    record: r.record.label(),
                    record_until_unix_seconds: rec.and_then(|x| x.until),
                    reply: &r.reply,
                    since_unix_seconds: rec.map(|x| x.when),
                    standing: r.standing.label(),
                    until_unix_seconds: r.expires,
                    value: &r.value,
                }
            })
            .collect();
        Summary {
            diverted,
            expired: self.expired(),
            index: self.index,
            keys: self.keys,
            ok: self.ok(),
            records_error: self.records_error.as_deref(),
            source: self.source,
            unasked: self.count(Standing::Unasked),
            unasked_after_seconds: self.unasked_after,
            unknown_identities: self.unknown_identities,
            waiting: self.count(Standing::Waiting),
        }
    }
}

/// `status -json` (members in alphabetical order, as it always printed
/// them).
#[derive(Serialize, Debug)]
struct Summary<'a> {
    diverted: Vec<Diverted<'a>>,
    expired: usize,
    index: u64,
    keys: u64,
    ok: bool,
    records_error: Option<&'a str>,
    source: Option<Source>,
    unasked: usize,
    unasked_after_seconds: u64,
    unknown_identities: u64,
    waiting: usize,
}

/// One diverted key of `status -json`.
#[derive(Serialize, Debug)]
struct Diverted<'a> {
    by: Option<&'a str>,
    did_you_mean: Option<&'a str>,
    expired: bool,
    identity: &'a str,
    last_asked_seconds_ago: Option<u64>,
    last_asked_unix_seconds: Option<u64>,
    modify_index: u64,
    notes: Vec<String>,
    reason: Option<&'a str>,
    record: &'static str,
    record_until_unix_seconds: Option<u64>,
    reply: &'a str,
    since_unix_seconds: Option<u64>,
    standing: &'static str,
    until_unix_seconds: Option<u64>,
    value: &'a str,
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
            (Standing::Waiting, _) => vec![String::from("WAITING: not asked since its write yet")],
            (Standing::Unasked, Some(id)) => vec![format!("UNASKED: did you mean {id}?")],
            (Standing::Unasked, None) => {
                vec![String::from("UNASKED: no close identity is asked for")]
            }
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
    fn of(id: &str, e: &IdentityRow, unasked: &HashMap<&str, Option<String>>, after: u64) -> Row {
        let last_asked = e.last_asked.map(|a| (a.unix_seconds, a.seconds_ago));
        // The agent orders an ask and the write by the swap that applied
        // it, which whole seconds cannot.
        let asked_since = e.asked_since_write == Some(true);
        let standing = match (unasked.contains_key(id), last_asked) {
            (_, Some((_, ago))) if asked_since && ago < after.max(1) => Standing::Asked,
            (true, _) => Standing::Unasked,
            (false, Some(_)) if asked_since => Standing::Asked,
            (false, _) => Standing::Waiting,
        };
        Row {
            identity: id.to_owned(),
            value: e.value.clone(),
            reply: e.reply.clone(),
            modify_index: e.modify_index,
            last_asked,
            standing,
            did_you_mean: match standing {
                Standing::Unasked => unasked.get(id).cloned().flatten(),
                _ => None,
            },
            expires: e.expires_unix_seconds.map(u64::from),
            record: Written::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::debug_doc::Asked;
    use serde_json::{json, Value};

    /// The agent's document, as `status` reads it.
    fn doc() -> Document {
        let asked = json!({"unix_seconds": 1000, "seconds_ago": 1});
        let row = |value: &str,
                   reply: &str,
                   index: u64,
                   (asked, since, after): (&Value, u64, bool)| {
            json!({"value": value, "reply": reply, "modify_index": index, "expires_unix_seconds": null, "last_asked": asked, "unchanged_since_unix_seconds": since, "asked_since_write": after, "unasked": asked.is_null()})
        };
        let doc = json!({
            "version": "gitlab-haproxy-agent 1", "synced": true, "source": "consul", "state_file": null,
            "kv_prefix": "p", "age_seconds": 2.4, "last_change_unix_seconds": null, "absent_reply": "ready 100%",
            "expiry": {"expired_keys": 0, "next_unix_seconds": null, "now_unix_seconds": 10_000},
            "watcher": {"phase": "awaiting_head", "index": 42, "consecutive_failures": 0, "last_error": null,
                "backing_off": false, "next_request_in_seconds": null, "request_deadline_in_seconds": 300.0},
            "state": {"index": 42, "keys": 4, "identities_shown": "diverted", "invalid": [], "identities": {
                "be_web/srv01": row("drain", "drain 100%", 40, (&Value::Null, 900, false)),
                "be_web/srv2": row("50%", "ready 50%", 41, (&asked, 900, true)),
                "be_web/srv3": row("ready", "ready 100%", 42, (&asked, 900, true)),
                // Written and asked in second 1000, the ask before the write.
                "be_web/srv4": row("maint", "maint 100%", 43, (&asked, 1000, false)),
            }},
            "asking": {"unasked_after_seconds": 60, "unasked": [
                {"identity": "be_web/srv01", "did_you_mean": "be_web/srv1", "value": "drain", "reply": "drain 100%",
                 "modify_index": 40, "last_asked": null, "unchanged_since_unix_seconds": 900}
            ], "unknown_identities": {"be_web/srv1": asked}, "unknown_identities_count": 1, "unknown_identities_overflow": 0},
        });
        serde_json::from_value(doc).expect("the fixture is a document")
    }

    /// An identity of the fixture's state.
    fn id<'a>(d: &'a mut Document, id: &str) -> &'a mut IdentityRow {
        let s = d.state.as_mut().expect("a state");
        s.identities.get_mut(id).expect("in the fixture")
    }

    fn asked(unix_seconds: u64, seconds_ago: u64) -> Option<Asked> {
        Some(Asked {
            unix_seconds,
            seconds_ago,
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
        d.head.age_seconds = Some(77.0);
        let held = Report::of(&d, Ok(records())).headline();
        assert!(
            held.contains("watching: a blocking query is held open")
                && held.contains("last answer 77s ago"),
            "{held}"
        );
        d.head.watcher.phase = "idle".into();
        let idle = Report::of(&d, Ok(records())).headline();
        assert_eq!(
            idle,
            "answering from consul: index 42, last read 77s ago (the watch is between reads)"
        );
    }

    #[test]
    fn the_table_shows_diverted_keys_and_marks_the_unasked_with_the_identity_meant() {
        let mut d = doc();
        id(&mut d, "be_web/srv2").expires_unix_seconds = Some(8_800);
        let r = Report::of(&d, Ok(records()));
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
        assert_eq!(j.expired, 1);
        let (srv01, srv2, srv4) = (&j.diverted[0], &j.diverted[1], &j.diverted[2]);
        assert!(srv2.expired);
        assert_eq!(srv2.until_unix_seconds, Some(8_800));
        assert_eq!(srv2.by, Some("alice@lb1"));
        assert_eq!(srv2.reason, Some("INC-123 db failover"));
        assert_eq!(srv01.record, "none");
        assert_eq!(srv4.record, "changed_outside");
        assert_eq!((j.unasked, j.waiting), (1, 1));
        assert_eq!(srv4.standing, "waiting");
        assert_eq!(srv2.standing, "asked");
        assert_eq!(srv01.did_you_mean, Some("be_web/srv1"));
        assert_eq!(srv01.last_asked_unix_seconds, None);
        assert_eq!(srv2.last_asked_seconds_ago, Some(1));
    }

    /// Issue 39: KV key names with C1 controls, bidi overrides and
    /// zero-width characters, a record's `by` with ESC sequences (clear
    /// screen, OSC 52 clipboard write) and an identity asked on the agent
    /// port reached the terminal raw.
    #[test]
    fn hostile_keys_records_and_asked_identities_are_shown_escaped_one_line_each() {
        let mut d = doc();
        let keys: Vec<&str> = "be\u{9b}2J/a be\u{202e}x/b\u{200b} be\n/c\u{85}"
            .split(' ')
            .collect();
        let srv2 = id(&mut d, "be_web/srv2").clone();
        for &k in &keys {
            let s = d.state.as_mut().unwrap();
            s.identities.insert(k.to_owned(), srv2.clone());
        }
        id(&mut d, keys[0]).unasked = true;
        id(&mut d, keys[0]).last_asked = None;
        let asking = d.asking.as_mut().unwrap();
        asking.unasked[0].identity = keys[0].to_owned();
        asking.unasked[0].did_you_mean = Some("x\u{1b}]52;c;eA==\u{7}".into());
        let mut recs = records();
        let mut pair = recs.get("be_web/srv2").unwrap().clone();
        let mut rec = record::decode(&pair.value).unwrap();
        rec.by = "mallory\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}".into();
        rec.reason = Some("\u{9d}ok\u{2028}".into());
        pair.value = rec.encode().into_bytes();
        recs.insert(keys[1].to_owned(), pair);
        let r = Report::of(&d, Ok(recs));
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
        assert_eq!(back, serde_json::to_value(r.json()).unwrap());
    }

    #[test]
    fn a_record_whose_until_differs_from_the_flags_says_so_and_an_expiry_ahead_is_ok() {
        let mut d = all_asked();
        id(&mut d, "be_web/srv2").expires_unix_seconds = Some(16_000);
        let r = Report::of(&d, Ok(records()));
        assert!(r.ok(), "an expiry ahead is no finding");
        assert_eq!(r.rows[1].until(r.now), "in 1h40m");
        let notes = r.rows[1].notes();
        assert_eq!(
            notes,
            vec![String::from("the record says until 1970-01-01T02:26:40Z")],
            "{notes:?}"
        );
        let r = Report::of(&d, Err("GET /v1/kv/m/: consul unreachable".into()));
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
        let d = doc();
        let mut recs = records();
        recs.get_mut("be_web/srv2").unwrap().modify_index = 99;
        let r = Report::of(&d, Ok(recs));
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
        id(&mut d, "be_web/srv2").expires_unix_seconds = Some(8_800);
        for index in [99, 3] {
            let mut recs = records();
            recs.get_mut("be_web/srv2").unwrap().modify_index = index;
            let r = Report::of(&d, Ok(recs));
            assert_eq!(r.rows[1].record.label(), "written", "record index {index}");
        }
    }

    /// A record's `until` is outside bytes: one no clock can hold is shown
    /// as a number, never a panic.
    #[test]
    fn an_until_no_clock_can_hold_is_shown_as_a_number() {
        let d = doc();
        let mut recs = records();
        let pair = recs.get_mut("be_web/srv2").unwrap();
        let mut r = record::decode(&pair.value).unwrap();
        r.until = Some(u64::MAX);
        pair.value = r.encode().into_bytes();
        let r = Report::of(&d, Ok(recs));
        let notes = r.rows[1].notes().join("; ");
        assert!(
            notes.contains("18446744073709551615 (Unix seconds)"),
            "{notes}"
        );
        assert!(r.table().contains("18446744073709551615"), "{}", r.table());
        let _ = r.json();
    }

    /// The fixture with every diverted key asked since its write.
    fn all_asked() -> Document {
        let mut d = doc();
        d.asking.as_mut().unwrap().unasked.clear();
        for i in "be_web/srv01 be_web/srv4".split(' ') {
            let row = id(&mut d, i);
            (row.last_asked, row.asked_since_write, row.unasked) =
                (asked(1001, 0), Some(true), false);
        }
        d
    }

    #[test]
    fn all_asked_is_ok_and_no_state_or_the_file_is_a_finding() {
        let mut d = all_asked();
        assert!(Report::of(&d, Ok(HashMap::new())).ok());
        d.head.source = Some(Source::StateFile);
        let r = Report::of(&d, Ok(HashMap::new()));
        assert!(!r.ok());
        assert!(r.table().starts_with("answering from the state file"));
        (d.head.source, d.state, d.asking) = (None, None, None);
        let r = Report::of(&d, Ok(HashMap::new()));
        assert!(!r.ok());
        assert!(r.table().starts_with("NOT ANSWERING"), "{}", r.table());
    }

    #[test]
    fn consul_failing_is_a_finding_even_when_every_key_is_asked() {
        let mut d = all_asked();
        assert!(Report::of(&d, Ok(HashMap::new())).ok());
        d.head.watcher.consecutive_failures = 3;
        d.head.watcher.last_error = Some("connection refused".into());
        let r = Report::of(&d, Ok(HashMap::new()));
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
        id(&mut d, "be_web/srv4").asked_since_write = Some(true);
        assert_eq!(
            Report::of(&d, Ok(HashMap::new())).rows[2].standing,
            Standing::Asked
        );
        id(&mut d, "be_web/srv4").asked_since_write = Some(false);
        assert_eq!(
            Report::of(&d, Ok(HashMap::new())).rows[2].standing,
            Standing::Waiting
        );
    }

    #[test]
    fn a_key_asked_since_the_last_sweep_is_asked_not_unasked() {
        let mut d = doc();
        // The sweep said unasked; a check asked since, after the write.
        let row = id(&mut d, "be_web/srv01");
        (row.last_asked, row.asked_since_write) = (asked(1001, 0), Some(true));
        let r = Report::of(&d, Ok(HashMap::new()));
        assert_eq!(r.rows[0].standing, Standing::Asked);
        assert_eq!(r.rows[0].did_you_mean, None);
    }

    /// A field renamed or dropped by the agent, or of another type, is an
    /// error naming it, never a zero; a document that is not the agent's
    /// too.
    #[test]
    fn a_missing_or_mistyped_field_is_an_error_naming_it() {
        let body = serde_json::to_string(&json!({
            "version": "1", "synced": true, "source": null, "state_file": null, "kv_prefix": "p",
            "age_seconds": null, "last_change_unix_seconds": null, "absent_reply": "ready 100%",
            "expiry": {"expired_keys": 0, "next_unix_seconds": null, "now_unix_seconds": 1},
            "watcher": {"phase": "idle", "index": 0, "last_error": null, "backing_off": false,
                "next_request_in_seconds": null, "request_deadline_in_seconds": null},
            "state": null, "asking": null,
        }))
        .unwrap();
        let e = read(body.as_bytes()).unwrap_err();
        assert!(e.contains("missing field `consecutive_failures`"), "{e}");
        let typo = body.replace("\"index\":0", "\"consecutive_failures\":\"0\",\"index\":0");
        let e = read(typo.as_bytes()).unwrap_err();
        assert!(e.contains("invalid type: string \"0\""), "{e}");
        let full = body.replace("\"index\":0", "\"consecutive_failures\":0,\"index\":0");
        assert!(read(full.as_bytes()).is_ok());
        let no_state = full.replace("\"state\":null,", "");
        assert!(read(no_state.as_bytes())
            .unwrap_err()
            .contains("missing field `state`"));
        assert!(read(b"{\"hello\": 1}").is_err(), "not the agent's document");
    }
}
