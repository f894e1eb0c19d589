//! `status`: the running agent's diverted keys, for humans (a table) or
//! scripts (`-json`), read from its `/debug/state`.
//!
//! In: the pprof address. Out: one row per diverted key (value, reply,
//! when this haproxy last asked, unasked ones marked with the identity
//! probably meant); exit 1 when a key is unasked or the agent does not
//! answer from consul's state. The rendering is pure over the document.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::fetch::http_get;
use super::{begin, target, usage_error, Io, FINDING, OK};

/// The whole request, connect to last byte.
const DEADLINE: Duration = Duration::from_secs(30);
/// `/debug/state` of 100,000 keys is about 20 MB.
const MAX_BODY: usize = 256 << 20;

const HELP: &str = "\
usage: gitlab-haproxy-agent status [-pprof-addr ADDR] [-json]

Lists every diverted key (reply not ready 100%) of the running agent: value,
reply, when this haproxy last asked for it, and the unasked ones (no check
asked within -unasked-after) with the identity probably meant. Reads
/debug/state on ADDR (default GITLAB_HAPROXY_AGENT_PPROF_ADDR, else
127.0.0.1:9779). -json prints the same for scripts. Exits 1 when a key is
unasked or the agent is not answering from consul's state.
";

pub(super) fn run(args: &[std::ffi::OsString], io: &mut Io<'_>) -> u8 {
    let a = match begin(io, "status", HELP, args, (&["pprof-addr"], &["json"])) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if !a.positional.is_empty() {
        return usage_error(io, "status", "takes no arguments");
    }
    let addr = match target(&a, io, "pprof-addr", "127.0.0.1:9779") {
        Ok(addr) => addr,
        Err(e) => return usage_error(io, "status", &e),
    };
    let report = fetch(addr).and_then(|body| {
        let doc = serde_json::from_slice::<Value>(&body);
        Report::of(&doc.map_err(|e| format!("/debug/state is not JSON: {e}"))?)
    });
    let report = match report {
        Ok(report) => report,
        Err(e) => {
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
    let _ = io.out.write_all(text.as_bytes());
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
    rows: Vec<Row>,
}

impl Report {
    /// `Err` when the document is not the agent's `/debug/state`.
    fn of(doc: &Value) -> Result<Report, String> {
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
            .map(|(id, e)| Row::of(id, e, &unasked, after))
            .collect();
        Ok(Report {
            source: doc["source"].as_str().map(str::to_owned),
            index: doc["state"]["index"].as_u64().unwrap_or(0),
            age_seconds: doc["age_seconds"].as_f64(),
            unasked_after: asking["unasked_after_seconds"].as_u64().unwrap_or(0),
            keys: doc["state"]["keys"].as_u64().unwrap_or(0),
            failures: doc["watcher"]["consecutive_failures"].as_u64().unwrap_or(0),
            last_error: doc["watcher"]["last_error"].as_str().map(str::to_owned),
            unknown_identities: asking["unknown_identities_count"].as_u64().unwrap_or(0),
            rows,
        })
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
                format!("answering from consul: index {}, last read {age} ago", self.index)
            }
            Some("state_file") => format!(
                "answering from the state file (index {}): consul not read since the start; KV writes are not seen yet",
                self.index
            ),
            _ => "NOT ANSWERING: no complete consul read and no state file answered yet; every check closes without a reply".into(),
        }
    }

    fn table(&self) -> String {
        let mut lines = vec![self.headline()];
        let header = ["IDENTITY", "VALUE", "REPLY", "LAST ASKED", ""].map(str::to_owned);
        let mut cells: Vec<[String; 5]> = vec![header];
        for r in &self.rows {
            let asked = r
                .last_asked
                .map_or("never".into(), |(_, ago)| format!("{ago}s ago"));
            let note = match (r.standing, &r.did_you_mean) {
                (Standing::Asked, _) => String::new(),
                (Standing::Waiting, _) => "WAITING: not asked since its write yet".into(),
                (Standing::Unasked, Some(id)) => format!("UNASKED: did you mean {id}?"),
                (Standing::Unasked, None) => "UNASKED: no close identity is asked for".into(),
            };
            cells.push([
                r.identity.clone(),
                r.value.clone(),
                r.reply.clone(),
                asked,
                note,
            ]);
        }
        if !self.rows.is_empty() {
            lines.push(crate::columns::aligned(&cells).trim_end().to_owned());
        }
        let plural =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        lines.push(format!(
            "{} diverted of {}; {} (no check within {}s), {} for a first check since the write; {} asked without a key",
            self.rows.len(),
            plural(self.keys, "key", "keys"),
            plural(self.count(Standing::Unasked) as u64, "unasked", "unasked"),
            self.unasked_after,
            plural(self.count(Standing::Waiting) as u64, "waiting", "waiting"),
            plural(self.unknown_identities, "identity", "identities"),
        ));
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
            "unknown_identities": self.unknown_identities,
        })
    }
}

impl Row {
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

    #[test]
    fn the_table_shows_diverted_keys_and_marks_the_unasked_with_the_identity_meant() {
        let r = Report::of(&doc()).unwrap();
        assert!(!r.ok());
        assert_eq!(
            r.table(),
            "answering from consul: index 42, last read 2s ago\n\
             IDENTITY      VALUE  REPLY       LAST ASKED\n\
             be_web/srv01  drain  drain 100%  never       UNASKED: did you mean be_web/srv1?\n\
             be_web/srv2   50%    ready 50%   1s ago\n\
             be_web/srv4   maint  maint 100%  1s ago      WAITING: not asked since its write yet\n\
             3 diverted of 4 keys; 1 unasked (no check within 60s), 1 waiting for a first check since the write; 1 identity asked without a key\n"
        );
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

    #[test]
    fn all_asked_is_ok_and_no_state_or_the_file_is_a_finding() {
        let mut d = doc();
        d["asking"]["unasked"] = json!([]);
        d["state"]["identities"]["be_web/srv01"]["last_asked"] =
            json!({"unix_seconds": 1000, "seconds_ago": 1});
        d["state"]["identities"]["be_web/srv4"]["last_asked"] =
            json!({"unix_seconds": 1001, "seconds_ago": 0});
        assert!(Report::of(&d).unwrap().ok());
        d["source"] = json!("state_file");
        let r = Report::of(&d).unwrap();
        assert!(!r.ok());
        assert!(r.table().starts_with("answering from the state file"));
        let r = Report::of(&json!({"source": null, "state": null, "watcher": {}})).unwrap();
        assert!(!r.ok());
        assert!(r.table().starts_with("NOT ANSWERING"), "{}", r.table());
        assert!(
            Report::of(&json!({"hello": 1})).is_err(),
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
        assert!(Report::of(&d).unwrap().ok());
        d["watcher"]["consecutive_failures"] = json!(3);
        d["watcher"]["last_error"] = json!("connection refused");
        let r = Report::of(&d).unwrap();
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
        assert_eq!(Report::of(&d).unwrap().rows[2].standing, Standing::Asked);
        d["state"]["identities"]["be_web/srv4"]["asked_since_write"] = json!(false);
        assert_eq!(Report::of(&d).unwrap().rows[2].standing, Standing::Waiting);
    }

    #[test]
    fn a_key_asked_since_the_last_sweep_is_asked_not_unasked() {
        let mut d = doc();
        // The sweep said unasked; a check asked since, after the write.
        d["state"]["identities"]["be_web/srv01"]["last_asked"] =
            json!({"unix_seconds": 1001, "seconds_ago": 0});
        let r = Report::of(&d).unwrap();
        assert_eq!(r.rows[0].standing, Standing::Asked);
        assert_eq!(r.rows[0].did_you_mean, None);
    }
}
