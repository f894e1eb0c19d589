//! `status`: the running agent's diverted keys, for humans (a table) or
//! scripts (`-json`), read from its `/debug/state`.
//!
//! In: the pprof address. Out: one row per diverted key (value, reply,
//! when this haproxy last asked, unasked ones marked with the identity
//! probably meant); exit 1 when a key is unasked or the agent does not
//! answer from consul's state. The rendering is pure over the document.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};

use super::{begin, target, usage_error, Io, FINDING, OK};
use crate::http::{parse_response_head, BodyDecoder, Parse};

const TIMEOUT: Duration = Duration::from_secs(10);
/// `/debug/state` of 100,000 keys is about 20 MB.
const MAX_BODY: usize = 512 << 20;

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
    let doc = match fetch(addr).and_then(|body| {
        serde_json::from_slice::<Value>(&body).map_err(|e| format!("/debug/state is not JSON: {e}"))
    }) {
        Ok(doc) => doc,
        Err(e) => {
            let _ = writeln!(io.err, "cannot read the agent's state at http://{addr}/debug/state: {e} (is the agent running with this -pprof-addr?)");
            return FINDING;
        }
    };
    let report = Report::of(&doc);
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

/// GET /debug/state, the body.
fn fetch(addr: SocketAddr) -> Result<Vec<u8>, String> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    let req = format!("GET /debug/state HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    let mut body = Vec::new();
    let mut decoder: Option<BodyDecoder> = None;
    loop {
        let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
        buf.extend_from_slice(&chunk[..n]);
        if decoder.is_none() {
            match parse_response_head(&buf, 64 * 1024) {
                Parse::Done(head, used) if head.status == 200 => {
                    decoder = Some(BodyDecoder::new(head.framing, MAX_BODY));
                    buf.drain(..used);
                }
                Parse::Done(head, _) => return Err(format!("HTTP status {}", head.status)),
                Parse::Invalid(why) => return Err(format!("not an HTTP response: {why}")),
                Parse::Partial if n == 0 => return Err("closed before a response".into()),
                Parse::Partial => continue,
            }
        }
        let Some(d) = decoder.as_mut() else { continue };
        let used = d.feed(&buf, &mut body).map_err(|e| format!("{e:?}"))?;
        buf.drain(..used);
        if d.is_done() {
            return Ok(body);
        }
        if n == 0 {
            d.eof().map_err(|e| format!("{e:?}"))?;
            return Ok(body);
        }
    }
}

/// One diverted key, as shown.
struct Row {
    identity: String,
    value: String,
    reply: String,
    modify_index: u64,
    last_asked: Option<(u64, u64)>,
    unasked: bool,
    did_you_mean: Option<String>,
}

/// What `/debug/state` says, reduced to what an operator checks.
struct Report {
    source: Option<String>,
    index: u64,
    age_seconds: Option<f64>,
    unasked_after: u64,
    keys: u64,
    unknown_identities: usize,
    rows: Vec<Row>,
}

impl Report {
    fn of(doc: &Value) -> Report {
        let asking = &doc["asking"];
        let unasked: std::collections::HashMap<&str, Option<String>> = asking["unasked"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| {
                Some((
                    u["identity"].as_str()?,
                    u["did_you_mean"].as_str().map(str::to_owned),
                ))
            })
            .collect();
        let identities = doc["state"]["identities"].as_object();
        let rows = identities
            .into_iter()
            .flatten()
            .filter(|(_, e)| e["reply"] != "ready 100%")
            .map(|(id, e)| Row {
                identity: id.clone(),
                value: e["value"].as_str().unwrap_or("").to_owned(),
                reply: e["reply"].as_str().unwrap_or("").to_owned(),
                modify_index: e["modify_index"].as_u64().unwrap_or(0),
                last_asked: e["last_asked"]["unix_seconds"]
                    .as_u64()
                    .zip(e["last_asked"]["seconds_ago"].as_u64()),
                unasked: unasked.contains_key(id.as_str()),
                did_you_mean: unasked.get(id.as_str()).cloned().flatten(),
            })
            .collect();
        Report {
            source: doc["source"].as_str().map(str::to_owned),
            index: doc["state"]["index"].as_u64().unwrap_or(0),
            age_seconds: doc["age_seconds"].as_f64(),
            unasked_after: asking["unasked_after_seconds"].as_u64().unwrap_or(0),
            keys: doc["state"]["keys"].as_u64().unwrap_or(0),
            unknown_identities: asking["unknown_identities"]
                .as_object()
                .map_or(0, |m| m.len()),
            rows,
        }
    }

    fn unasked(&self) -> usize {
        self.rows.iter().filter(|r| r.unasked).count()
    }

    /// Answering consul's state, and every diverted key asked for.
    fn ok(&self) -> bool {
        self.source.as_deref() == Some("consul") && self.unasked() == 0
    }

    fn headline(&self) -> String {
        match self.source.as_deref() {
            Some("consul") => {
                let age = self.age_seconds.map_or("?".into(), |a| format!("{a:.0}s"));
                format!("answering from consul: index {}, last read {age} ago", self.index)
            }
            Some("state_file") => format!(
                "answering from the state file (index {}): consul not read since the start; KV writes are not seen yet",
                self.index
            ),
            _ => "NOT ANSWERING: no complete consul read and no state file yet; every check closes without a reply".into(),
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
            let note = match (r.unasked, &r.did_you_mean) {
                (false, _) => String::new(),
                (true, Some(id)) => format!("UNASKED: did you mean {id}?"),
                (true, None) => "UNASKED: no close identity is asked for".into(),
            };
            cells.push([
                r.identity.clone(),
                r.value.clone(),
                r.reply.clone(),
                asked,
                note,
            ]);
        }
        let widths: Vec<usize> = (0..5)
            .map(|i| {
                cells
                    .iter()
                    .map(|c| c[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        if !self.rows.is_empty() {
            for c in &cells {
                let line: Vec<String> = c
                    .iter()
                    .zip(&widths)
                    .map(|(s, w)| format!("{s:w$}"))
                    .collect();
                lines.push(line.join("  ").trim_end().to_owned());
            }
        }
        lines.push(format!(
            "{} diverted of {} keys; {} unasked (no check within {}s); {} identities asked without a key",
            self.rows.len(),
            self.keys,
            self.unasked(),
            self.unasked_after,
            self.unknown_identities
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
                    "unasked": r.unasked,
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
            "unasked": self.unasked(),
            "unknown_identities": self.unknown_identities,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        json!({
            "source": "consul",
            "age_seconds": 2.4,
            "state": {"index": 42, "keys": 3, "identities": {
                "be_web/srv01": {"value": "drain", "reply": "drain 100%", "modify_index": 40, "last_asked": null, "unasked": true},
                "be_web/srv2": {"value": "50%", "reply": "ready 50%", "modify_index": 41, "last_asked": {"unix_seconds": 1000, "seconds_ago": 1}, "unasked": false},
                "be_web/srv3": {"value": "ready", "reply": "ready 100%", "modify_index": 42, "last_asked": {"unix_seconds": 1000, "seconds_ago": 1}, "unasked": false},
            }},
            "asking": {"unasked_after_seconds": 60, "unasked": [
                {"identity": "be_web/srv01", "did_you_mean": "be_web/srv1"}
            ], "unknown_identities": {"be_web/srv1": {"unix_seconds": 1000, "seconds_ago": 1}}},
        })
    }

    #[test]
    fn the_table_shows_diverted_keys_and_marks_the_unasked_with_the_identity_meant() {
        let r = Report::of(&doc());
        assert!(!r.ok());
        assert_eq!(
            r.table(),
            "answering from consul: index 42, last read 2s ago\n\
             IDENTITY      VALUE  REPLY       LAST ASKED\n\
             be_web/srv01  drain  drain 100%  never       UNASKED: did you mean be_web/srv1?\n\
             be_web/srv2   50%    ready 50%   1s ago\n\
             2 diverted of 3 keys; 1 unasked (no check within 60s); 1 identities asked without a key\n"
        );
        let j = r.json();
        assert_eq!(j["unasked"], 1);
        assert_eq!(j["diverted"][0]["did_you_mean"], "be_web/srv1");
        assert!(j["diverted"][0]["last_asked_unix_seconds"].is_null());
        assert_eq!(j["diverted"][1]["last_asked_seconds_ago"], 1);
    }

    #[test]
    fn all_asked_is_ok_and_no_state_or_the_file_is_a_finding() {
        let mut d = doc();
        d["asking"]["unasked"] = json!([]);
        assert!(Report::of(&d).ok());
        d["source"] = json!("state_file");
        let r = Report::of(&d);
        assert!(!r.ok());
        assert!(r.table().starts_with("answering from the state file"));
        let r = Report::of(&json!({"source": null, "state": null}));
        assert!(!r.ok());
        assert!(r.table().starts_with("NOT ANSWERING"), "{}", r.table());
    }
}
