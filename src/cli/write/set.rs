//! `set IDENTITY=VALUE... | -f FILE` and `unset IDENTITY...`: check every
//! word first, read the keys, print each change, write them in guarded
//! transactions of [`BATCH`] operations, print the undo line.

use std::ffi::OsString;
use std::io::Read;

use serde_json::json;

use super::plan::{self, Change, Target, TxnAnswer, BATCH};
use super::{conflict_line, Kv};
use crate::cli::Args;
use crate::cli::{usage_error, Io, FINDING, OK, USAGE};
use crate::config::daemon_flag;

const SET_HELP: &str = "\
usage: gitlab-haproxy-agent set [-f FILE|-] [-dry-run] [-json] [consul flags] IDENTITY=VALUE...

Writes the desired state of servers: VALUE is ready, drain, maint or N% (0 to
256), checked with the agent's own rules before anything is written. -f reads
one IDENTITY VALUE or IDENTITY=VALUE per line (# comments; - is stdin).
Reads the keys, prints each change in reply terms (IDENTITY: before -> after),
then writes them in one consul transaction guarded by the index it read, 64
keys per transaction. Someone else's write in between is a conflict: nothing
of that transaction is written, exit 1, never retried. Prints the command that
undoes the change. -dry-run prints the changes and writes nothing; -json prints
one JSON document. Consul is reached with the daemon's flags and variables
(-consul-addr, CONSUL_HTTP_ADDR, the token and TLS settings, -kv-prefix).
Exit 0 written or nothing to change, 1 conflict or consul refused/unreachable,
2 usage or a bad value.
";

const UNSET_HELP: &str = "\
usage: gitlab-haproxy-agent unset [-dry-run] [-json] [consul flags] IDENTITY...

Deletes the keys of servers: back to the default, ready 100%. As set: reads,
prints each change, deletes in guarded transactions (delete-cas), prints the
command that undoes it. Exit 0, 1 conflict or consul error, 2 usage.
";

/// The largest `-f` file read.
const MAX_FILE: u64 = 16 << 20;

pub fn run_set(args: &[OsString], io: &mut Io<'_>) -> u8 {
    run(args, io, "set")
}

pub fn run_unset(args: &[OsString], io: &mut Io<'_>) -> u8 {
    run(args, io, "unset")
}

fn run(args: &[OsString], io: &mut Io<'_>, command: &str) -> u8 {
    let (help, values): (&str, &[&'static str]) = match command {
        "set" => (SET_HELP, &["f"]),
        _ => (UNSET_HELP, &[]),
    };
    let w = match Args::parse_with(args, values, &["dry-run", "json"], daemon_flag) {
        Ok(w) if w.help => {
            let _ = io.out.write_all(help.as_bytes());
            return OK;
        }
        Ok(w) => w,
        Err(e) => return usage_error(io, command, &e),
    };
    let wanted = match command {
        "set" => set_words(&w, io),
        _ => plan::parse_unsets(&w.positional).map_err(|bad| bad.join("; ")),
    };
    let wanted = match wanted {
        Ok(wanted) => wanted,
        Err(e) => {
            let _ = writeln!(
                io.err,
                "gitlab-haproxy-agent {command}: nothing written: {e}"
            );
            return USAGE;
        }
    };
    let mut kv = match Kv::open(&w.daemon, io.env) {
        Ok(kv) => kv,
        Err(e) => return usage_error(io, command, &e),
    };
    let identities: Vec<String> = wanted.iter().map(|(i, _)| i.clone()).collect();
    let held = match kv.read(&identities) {
        Ok(held) => held,
        Err(e) => {
            let _ = writeln!(
                io.err,
                "gitlab-haproxy-agent {command}: nothing written: {e}"
            );
            return FINDING;
        }
    };
    let changes: Vec<Change> = wanted
        .into_iter()
        .zip(held)
        .map(|((identity, after), before)| Change {
            identity,
            before,
            after,
        })
        .collect();
    let outcome = match w.flag("dry-run") {
        true => Outcome::default(),
        false => write(&mut kv, &changes),
    };
    report(io, &w, &changes, &outcome)
}

/// `set`'s words, or the lines of `-f`.
fn set_words(w: &Args, io: &mut Io<'_>) -> Result<Vec<(String, Target)>, String> {
    let Some(file) = w.value("f") else {
        let words = w.positional.iter().enumerate();
        let items = words.map(|(i, t)| (format!("argument {}", i + 1), t.as_str()));
        return plan::parse_sets(items).map_err(|bad| bad.join("; "));
    };
    if !w.positional.is_empty() {
        return Err("give IDENTITY=VALUE words or -f, not both".into());
    }
    let mut text = Vec::new();
    let read = match file {
        "-" => io.stdin.take(MAX_FILE).read_to_end(&mut text),
        path => std::fs::File::open(path).and_then(|f| f.take(MAX_FILE).read_to_end(&mut text)),
    };
    read.map_err(|e| format!("cannot read {file}: {e}"))?;
    let text = String::from_utf8(text).map_err(|_| format!("{file} is not UTF-8"))?;
    let lines = text.lines().enumerate().filter_map(|(i, l)| {
        let l = l.split('#').next().unwrap_or("");
        (!l.trim().is_empty()).then(|| (format!("line {}", i + 1), l))
    });
    plan::parse_sets(lines).map_err(|bad| bad.join("; "))
}

/// How far the writing got.
#[derive(Debug, Default)]
struct Outcome {
    /// Changes written (positions in the change list).
    written: Vec<usize>,
    transactions: usize,
    /// Why it stopped, with the exit code.
    failed: Option<(u8, String)>,
}

/// Writes the changes that change something, [`BATCH`] to a transaction,
/// in order, stopping at the first that fails.
fn write(kv: &mut Kv, changes: &[Change]) -> Outcome {
    let todo: Vec<usize> = (0..changes.len())
        .filter(|&i| !changes[i].after.is_noop(&changes[i].before))
        .collect();
    let mut outcome = Outcome::default();
    for batch in todo.chunks(BATCH) {
        let ops: Vec<serde_json::Value> = batch
            .iter()
            .map(|&i| {
                let c = &changes[i];
                plan::op(&kv.key(&c.identity), c.after, c.before.index())
            })
            .collect();
        match kv.txn(&ops) {
            Ok(TxnAnswer::Applied(_)) => {
                outcome.written.extend_from_slice(batch);
                outcome.transactions += 1;
            }
            Ok(TxnAnswer::Conflict(at, what)) => {
                let identity = batch.get(at).map_or("?", |&i| changes[i].identity.as_str());
                let line = conflict_line(kv, identity);
                outcome.failed = Some((FINDING, format!("conflict: {line} (consul: {what})")));
                return outcome;
            }
            Err(e) => {
                outcome.failed = Some((FINDING, e));
                return outcome;
            }
        }
    }
    outcome
}

fn report(io: &mut Io<'_>, w: &Args, changes: &[Change], outcome: &Outcome) -> u8 {
    let dry_run = w.flag("dry-run");
    let written: Vec<&Change> = outcome.written.iter().map(|&i| &changes[i]).collect();
    let not_written: Vec<&Change> = changes
        .iter()
        .enumerate()
        .filter(|(i, c)| !c.after.is_noop(&c.before) && !outcome.written.contains(i))
        .map(|(_, c)| c)
        .collect();
    let undo = plan::undo_line(&written, &w.daemon);
    let code = outcome.failed.as_ref().map_or(OK, |(code, _)| *code);
    if w.flag("json") {
        let doc = json!({
            "dry_run": dry_run,
            "changes": changes.iter().enumerate().map(|(i, c)| json!({
                "identity": c.identity,
                "before": c.before.render(),
                "after": c.after.render(),
                "unchanged": c.after.is_noop(&c.before),
                "written": outcome.written.contains(&i),
            })).collect::<Vec<_>>(),
            "transactions": outcome.transactions,
            "error": outcome.failed.as_ref().map(|(_, e)| e),
            "undo": undo,
        });
        let _ = writeln!(
            io.out,
            "{}",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        );
        if let Some((_, e)) = &outcome.failed {
            let _ = writeln!(io.err, "{e}");
        }
        return code;
    }
    for c in changes {
        let _ = writeln!(io.out, "{}", c.line());
    }
    let ids = |cs: &[&Change]| {
        cs.iter()
            .map(|c| c.identity.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    if dry_run {
        let _ = writeln!(io.out, "dry run: nothing written");
    } else if !written.is_empty() {
        let _ = writeln!(
            io.out,
            "written: {} key(s) in {} transaction(s)",
            written.len(),
            outcome.transactions
        );
    } else if outcome.failed.is_none() {
        let _ = writeln!(io.out, "nothing to change");
    }
    if let Some((_, e)) = &outcome.failed {
        let _ = writeln!(io.err, "{e}");
        if !written.is_empty() {
            let _ = writeln!(io.err, "written before it: {}", ids(&written));
        }
        let _ = writeln!(io.err, "not written: {}", ids(&not_written));
    }
    if let Some(undo) = undo {
        let _ = writeln!(io.out, "undo: {undo}");
    }
    code
}
