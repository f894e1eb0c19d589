//! A [`Poll`] for people and scripts: the live table (a terminal), one
//! line per row that changed (a log or a pipe), the closing summary, and
//! the `-json` document.
//!
//! In: a poll, the rules, the time spent and the timeout. Out: text or a
//! JSON value.
//!
//! Always holds:
//! - pure;
//! - a row that is not drained says why on every form (its problem, its
//!   sessions and where, or the status that `-require-drain` refuses).

use std::time::Duration;

use serde_json::{json, Value};

use super::{Poll, Row, Rules};

/// `1m30s`, `2.5s`, `0s`: whole seconds past a minute, tenths below.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        let hours = if h > 0 {
            format!("{h}h")
        } else {
            String::new()
        };
        return format!("{hours}{m}m{s}s");
    }
    let tenths = d.as_millis() / 100;
    match tenths % 10 {
        0 => format!("{}s", tenths / 10),
        t => format!("{}.{t}s", tenths / 10),
    }
}

pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `be/srv`, with the identity when it is not that.
fn server(row: &Row) -> String {
    if row.identity == row.server {
        row.server.clone()
    } else {
        format!("{} ({})", row.server, row.identity)
    }
}

/// Why a row is (not) drained, and its warning.
fn note(row: &Row, rules: &Rules) -> String {
    let warning = row.warning().map(|w| format!("WARNING: {w}"));
    let verdict = if let Some(problem) = &row.problem {
        format!("NOT DRAINED: {problem}")
    } else if row.sessions != Some(0) || row.queued != Some(0) {
        match row.holders.as_slice() {
            [] => "holding".to_owned(),
            holders => format!("holding: {}", holders.join("; ")),
        }
    } else if row.drained(rules) {
        "drained".to_owned()
    } else {
        return format!(
            "NOT DRAINED (-require-drain): {}",
            warning.unwrap_or_default().trim_start_matches("WARNING: ")
        );
    };
    match warning {
        Some(w) => format!("{verdict}; {w}"),
        None => verdict,
    }
}

fn count(n: Option<u64>) -> String {
    n.map_or("-".into(), |n| n.to_string())
}

/// The source, with a master's workers (`master.sock [1235, 1233 old]`).
fn source(row: &Row) -> String {
    if row.workers.is_empty() {
        return row.source.clone();
    }
    let workers: Vec<String> = row
        .workers
        .iter()
        .map(|w| format!("{}{}", w.pid, if w.old { " old" } else { "" }))
        .collect();
    format!("{} [{}]", row.source, workers.join(", "))
}

/// `be/s1 at SOURCE: 3 sessions, 0 queued, DRAIN: holding`.
pub fn line(row: &Row, rules: &Rules) -> String {
    let counts = match (row.sessions, row.queued) {
        (Some(s), Some(q)) => format!(
            "{}, {} queued, {}",
            plural(s, "session", "sessions"),
            q,
            row.status
        ),
        _ => "no counts".to_owned(),
    };
    format!(
        "{} at {}: {counts}: {}",
        server(row),
        source(row),
        note(row, rules)
    )
}

/// The live table's first line: how many are drained and the time left.
pub fn progress(poll: &Poll, rules: &Rules, elapsed: Duration, timeout: Duration) -> String {
    let drained = poll.rows.iter().filter(|r| r.drained(rules)).count();
    format!(
        "wait-drained: {drained} of {} drained; {} of {} left",
        poll.rows.len(),
        duration(timeout.saturating_sub(elapsed)),
        duration(timeout),
    )
}

/// The table: SERVER, SOURCE, SESSIONS, QUEUED, STATUS, NOTE.
pub fn table(poll: &Poll, rules: &Rules) -> String {
    let mut cells: Vec<[String; 6]> =
        vec![["SERVER", "SOURCE", "SESSIONS", "QUEUED", "STATUS", "NOTE"].map(str::to_owned)];
    for r in &poll.rows {
        cells.push([
            server(r),
            source(r),
            count(r.sessions),
            count(r.queued),
            r.status.clone(),
            note(r, rules),
        ]);
    }
    crate::columns::aligned(&cells)
}

/// The last words: every server drained (with the warnings), or at the
/// timeout each row not drained, where, and how many.
pub fn summary(poll: &Poll, rules: &Rules, elapsed: Duration) -> String {
    let mut text = String::new();
    if poll.drained(rules) {
        let mut servers: Vec<String> = poll.rows.iter().map(server).collect();
        servers.dedup();
        text += &format!(
            "drained after {}: {} (0 sessions, 0 queued at every source)\n",
            duration(elapsed),
            servers.join(", ")
        );
        for r in &poll.rows {
            if let Some(w) = r.warning() {
                text += &format!("warning: {} at {}: {w}\n", server(r), source(r));
            }
        }
        return text;
    }
    text += &format!("not drained after {}:\n", duration(elapsed));
    for s in poll.unlisted() {
        text += &format!("  no source lists {s}: is the backend/server name right? (waiting would not change it)\n");
    }
    for r in poll.rows.iter().filter(|r| !r.drained(rules)) {
        text += &format!("  {}\n", line(r, rules));
    }
    if poll.settled() {
        text += "  a reload this source cannot see behind settles it: waiting would not change it; ask the master with -haproxy-master-socket, which sees the old workers\n";
    }
    text
}

/// The `-json` document of the last poll.
pub fn json(poll: &Poll, rules: &Rules, elapsed: Duration, timeout: Duration) -> Value {
    let rows: Vec<Value> = poll
        .rows
        .iter()
        .map(|r| {
            json!({
                "identity": r.identity,
                "server": r.server,
                "source": r.source,
                "sessions": r.sessions,
                "queued": r.queued,
                "status": r.status,
                "admin_state": r.admin,
                "instances": r.instances,
                "workers": r.workers.iter().map(|w| json!({
                    "pid": w.pid,
                    "old": w.old,
                    "sessions": w.sessions,
                    "queued": w.queued,
                })).collect::<Vec<Value>>(),
                "holders": r.holders,
                "drained": r.drained(rules),
                "problem": r.problem,
                "warning": r.warning(),
            })
        })
        .collect();
    json!({
        "drained": poll.drained(rules),
        "elapsed_seconds": elapsed.as_secs_f64(),
        "timeout_seconds": timeout.as_secs_f64(),
        "require_drain": rules.require_drain,
        "servers": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(server: &str, source: &str, sessions: u64, status: &str) -> Row {
        let (b, s) = server.split_once('/').unwrap();
        Row {
            sessions: Some(sessions),
            queued: Some(0),
            status: status.into(),
            ..Row::new(server, &(b.into(), s.into()), source)
        }
    }

    const RULES: Rules = Rules {
        require_drain: false,
        expect_instances: 0,
        young_secs: 3600,
    };

    fn poll() -> Poll {
        let mut gone = row("app/s2", "ipv4@127.0.0.1:9999", 0, "?");
        gone.sessions = None;
        gone.queued = None;
        gone.problem = Some("cannot connect: Connection refused".into());
        Poll {
            rows: vec![
                row("app/s1", "/run/haproxy.sock", 1, "DRAIN"),
                row("app/s3", "/run/haproxy.sock", 0, "UP"),
                gone,
            ],
        }
    }

    #[test]
    fn durations_read_as_go_writes_them() {
        for (ms, want) in [
            (0, "0s"),
            (1500, "1.5s"),
            (59_990, "59.9s"),
            (60_000, "1m0s"),
            (600_000, "10m0s"),
            (3_723_000, "1h2m3s"),
        ] {
            assert_eq!(duration(Duration::from_millis(ms)), want);
        }
    }

    #[test]
    fn the_table_says_why_each_server_is_not_drained() {
        let want = "\
SERVER  SOURCE               SESSIONS  QUEUED  STATUS  NOTE
app/s1  /run/haproxy.sock    1         0       DRAIN   holding
app/s3  /run/haproxy.sock    0         0       UP      drained; WARNING: status UP is not DRAIN or MAINT: it may reach 0 sessions by chance while still taking new ones
app/s2  ipv4@127.0.0.1:9999  -         -       ?       NOT DRAINED: cannot connect: Connection refused
";
        assert_eq!(table(&poll(), &RULES), want);
        let strict = Rules {
            require_drain: true,
            ..RULES
        };
        assert!(table(&poll(), &strict)
            .contains("UP      NOT DRAINED (-require-drain): status UP is not DRAIN or MAINT"));
        assert_eq!(
            progress(
                &poll(),
                &RULES,
                Duration::from_secs(2),
                Duration::from_secs(600)
            ),
            "wait-drained: 1 of 3 drained; 9m58s of 10m0s left"
        );
    }

    #[test]
    fn the_summary_names_each_holder_where_and_how_many() {
        assert_eq!(
            summary(&poll(), &RULES, Duration::from_secs(2)),
            "not drained after 2s:\n  \
             app/s1 at /run/haproxy.sock: 1 session, 0 queued, DRAIN: holding\n  \
             app/s2 at ipv4@127.0.0.1:9999: no counts: NOT DRAINED: cannot connect: Connection refused\n"
        );
        let mut done = poll();
        done.rows.retain(|r| r.server == "app/s3");
        done.rows[0].identity = "web-3".into();
        assert_eq!(
            summary(&done, &RULES, Duration::from_millis(3200)),
            "drained after 3.2s: app/s3 (web-3) (0 sessions, 0 queued at every source)\n\
             warning: app/s3 (web-3) at /run/haproxy.sock: status UP is not DRAIN or MAINT: it may reach 0 sessions by chance while still taking new ones\n"
        );
    }

    #[test]
    fn the_json_document_has_every_row_and_the_verdict() {
        let j = json(
            &poll(),
            &RULES,
            Duration::from_secs(2),
            Duration::from_secs(10),
        );
        assert_eq!(j["drained"], false);
        assert_eq!(j["servers"].as_array().unwrap().len(), 3);
        assert_eq!(j["servers"][0]["sessions"], 1);
        assert_eq!(j["servers"][0]["drained"], false);
        assert_eq!(j["servers"][1]["drained"], true);
        assert!(j["servers"][1]["warning"]
            .as_str()
            .unwrap()
            .starts_with("status UP"));
        assert!(j["servers"][2]["sessions"].is_null());
        assert_eq!(
            j["servers"][2]["problem"],
            "cannot connect: Connection refused"
        );
    }
}
