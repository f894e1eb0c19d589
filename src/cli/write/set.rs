//! `set IDENTITY=VALUE... | -f FILE` and `unset IDENTITY...`: check every
//! word first, read the keys, print each change, write them in guarded
//! transactions of `BATCH` operations, print the undo line.

use std::collections::HashMap;
use std::io::Read;
use std::time::Duration;

use serde_json::json;

use super::change::Change;
use super::deliver::{self, deliver, KeyWrite, Lost, Settled};
use super::haproxy::static_weights;
use super::key::{Held, Target};
use super::kv::{unix_now, Kv, RECORD_PREFIX};
use super::machine::{Answer, Idle, Polled, Stop};
use super::recorder::{recorded_reason, Recorder};
use super::undo::{undo_line, unrestorable};
use super::words::{parse_sets, parse_unsets};
use crate::cli::Args;
use crate::cli::{usage_error, Io, FINDING, OK, USAGE};
use crate::columns::counted;
use crate::contract::txn::batches;
use crate::contract::Desired;
use crate::kv::KvPair;

pub const SET_HELP: &str = "\
usage: gitlab-haproxy-agent set [-f FILE|-] [-reason TEXT]
       [-for DURATION|none | -until TIME] [-by WHO]
       [-record-prefix PREFIX] [-dry-run] [-json] [-haproxy-config FILE]...
       [consul flags] IDENTITY=VALUE...

Writes the desired state of servers: VALUE is ready, drain, maint or N% (0 to
256), checked with the agent's own rules before anything is written, as is
IDENTITY (no longer than -max-line-bytes, nothing a terminal does not show;
split from VALUE at the last =). -f reads one IDENTITY VALUE or
IDENTITY=VALUE per line (# comments; - is stdin).
Reads the keys, prints each change in reply terms (IDENTITY: before -> after;
a value answering as the key already does is unchanged and not written), then
writes them in consul transactions guarded by the index read (32 keys with
their records, 64 operations, and under 512 KiB each). Someone else's write in between is a conflict, a token
that may not write is refused: nothing of that transaction is written, exit 1,
never retried. An answer that never comes is unknown: the keys are read again
and each said applied or unknown. Prints the command that undoes what was
written. -dry-run prints the changes and writes nothing; -json prints one JSON
document. N% other than 0% and 100% is refused (exit 2) for a server that
the haproxy configuration shows in a backend with a static algorithm
(static-rr, map-based hashing: haproxy ignores such weights): -haproxy-config
FILE (repeatable; a directory as haproxy reads it), else
$GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG, else /etc/haproxy/haproxy.cfg when it
exists; when none can be read, a warning names the path tried. Consul is reached with the daemon's flags and variables
(-consul-addr, CONSUL_HTTP_ADDR, the token and TLS settings, -kv-prefix).
Every key written gets a record in the same transaction (a JSON value under
-record-prefix, default -kv-prefix's last segment replaced by meta): who (-by,
default $SUDO_USER, $USER or the uid's login name, @host), when, why
(-reason), until when (-for, -until), the value and this command line; -reason
and -by are at most 512 bytes without control characters or bidi overrides.
-for DURATION (or -until TIME, RFC 3339: 2026-12-04T23:28:18Z) also puts the
expiry (Unix seconds) in the key's consul Flags: the agent counts and warns
about a divert past it, and never acts on it. A write without -reason keeps
the reason recorded for the key, without -for/-until its expiry, and says so
(keeps reason \"INC-123\", until ...); -reason '' clears the reason, -for none
the expiry. The undo line restores the reason and the expiry too. Exit 0
written or nothing to change, 1 conflict, refused, unknown or unreachable, 2
usage or a bad value or identity.
";

pub const UNSET_HELP: &str = "\
usage: gitlab-haproxy-agent unset [-record-prefix PREFIX] [-dry-run] [-json]
       [consul flags] IDENTITY...

Deletes the keys of servers: back to the default, ready 100% (any key under
the prefix, even one no haproxy can ask for), and their records in the same
transaction (an orphan record, its key already gone, is deleted too). As set:
reads, prints each change, deletes in guarded transactions (delete-cas),
prints the command that undoes it (with each key's reason and expiry).
-reason, -by, -for and -until are refused: the record goes with the key. Exit 0, 1 conflict,
refused, unknown or unreachable, 2 usage.
";

/// The largest `-f` file read.
const MAX_FILE: u64 = 16 << 20;

pub fn run_set(w: &Args, io: &mut Io<'_>) -> u8 {
    run(w, io, "set")
}

pub fn run_unset(w: &Args, io: &mut Io<'_>) -> u8 {
    run(w, io, "unset")
}

fn run(w: &Args, io: &mut Io<'_>, command: &str) -> u8 {
    let (recorder, mut kv, now, expiry) = match open(w, io, command) {
        Ok(opened) => opened,
        Err(e) => return usage_error(io, command, &e),
    };
    let wanted = match command {
        "set" => set_words(w, io, kv.max_line),
        _ => parse_unsets(&w.positional).map_err(|bad| bad.join("; ")),
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
    let weighted: Vec<&str> = wanted
        .iter()
        .filter(|(_, t)| t.intermediate())
        .map(|(i, _)| i.as_str())
        .collect();
    if let Err(e) = static_weights(w, io, command, &weighted)
        .map_err(|e| format!("nothing written: {e}"))
        .and_then(|()| check_expiring(&wanted, &recorder))
    {
        return usage_error(io, command, &e);
    }
    let (changes, records) = match read_changes(&mut kv, wanted, (&recorder, expiry)) {
        Ok(read) => read,
        Err(e) => {
            let _ = writeln!(
                io.err,
                "gitlab-haproxy-agent {command}: nothing written: {e}"
            );
            return FINDING;
        }
    };
    let plan = Plan {
        orphans: orphans(&changes, &records),
        changes: &changes,
        recorder: &recorder,
        now,
    };
    let outcome = match w.flag("dry-run") {
        true => Outcome::default(),
        false => write(&mut kv, &plan),
    };
    report(io, (w, kv.max_line), &changes, &outcome)
}

/// The records' words checked, consul opened, the time of the write and
/// the expiry `-for` or `-until` gives it (`None`: each key keeps its own).
fn open(w: &Args, io: &Io<'_>, command: &str) -> Result<(Recorder, Kv, u64, Option<u32>), String> {
    for (flag, why) in [
        ("for", "a deleted key has nothing to expire"),
        ("until", "a deleted key has nothing to expire"),
        ("reason", "the key's record is deleted with it"),
        ("by", "the key's record is deleted with it"),
    ] {
        if command == "unset" && w.value(flag).is_some() {
            return Err(format!("-{flag} is refused on unset: {why}"));
        }
    }
    let recorder = Recorder::of(w, io.env, command)?;
    let kv = Kv::open(&w.daemon, io.env, w.value(RECORD_PREFIX))?;
    let now = unix_now();
    let expiry = recorder.expiry(now)?;
    Ok((recorder, kv, now, expiry))
}

/// `-for` or `-until` on a key set to ready 100% expires nothing:
/// refused.
fn check_expiring(wanted: &[(String, Target)], recorder: &Recorder) -> Result<(), String> {
    let ready = |t: &Target| matches!(t, Target::Set(d) if d.reply() == Desired::READY.reply());
    match wanted.iter().find(|(_, t)| ready(t)) {
        Some((identity, _)) if recorder.until.sets() => Err(format!(
            "-for/-until: {identity} is set to ready 100%, which has nothing to expire"
        )),
        _ => Ok(()),
    }
}

/// The keys as held (with their expiries and recorded reasons) and the
/// change each makes, carrying what the write does not replace; and the
/// records, by identity.
fn read_changes(
    kv: &mut Kv,
    wanted: Vec<(String, Target)>,
    (recorder, expiry): (&Recorder, Option<u32>),
) -> Result<(Vec<Change>, HashMap<String, KvPair>), String> {
    let identities: Vec<String> = wanted.iter().map(|(i, _)| i.clone()).collect();
    let held = kv.read_expiring(&identities)?;
    let records = kv.records()?;
    let changes = wanted
        .into_iter()
        .zip(held)
        .map(|((identity, after), (before, was))| {
            let reason = recorded_reason(&records, &identity, &before);
            let carried = recorder.carry(after, reason.clone(), was, expiry);
            Change {
                identity,
                before,
                after,
                reason,
                expiry: was,
                carried,
            }
        })
        .collect();
    Ok((changes, records))
}

/// The unchanged keys that are absent while a record of theirs is not.
fn orphans(changes: &[Change], records: &HashMap<String, KvPair>) -> Vec<usize> {
    changes
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.is_noop() && c.before == Held::Absent && records.contains_key(&c.identity)
        })
        .map(|(i, _)| i)
        .collect()
}

/// What `write` writes: the changes, the orphan records to delete (their
/// keys are absent and stay so), and what goes in each record.
struct Plan<'a> {
    changes: &'a [Change],
    orphans: Vec<usize>,
    recorder: &'a Recorder,
    now: u64,
}

impl Plan<'_> {
    /// Each change's write (its state key's and its record's), then each
    /// orphan's record delete; with the change each is for.
    fn keys(&self) -> Vec<(usize, KeyWrite<'_>)> {
        let write = |i: usize, target: Option<Target>, carried| {
            let c = &self.changes[i];
            let guard = c.before.index();
            let identity = c.identity.as_str();
            (
                i,
                KeyWrite {
                    identity,
                    target,
                    guard,
                    carried,
                },
            )
        };
        let changed = self
            .changes
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.is_noop());
        let mut keys: Vec<_> = changed
            .map(|(i, c)| write(i, Some(c.after), c.carried.clone()))
            .collect();
        keys.extend(
            self.orphans
                .iter()
                .map(|&i| write(i, None, Default::default())),
        );
        keys
    }
}

/// `set`'s words, or the lines of `-f`.
fn set_words(w: &Args, io: &mut Io<'_>, max_line: usize) -> Result<Vec<(String, Target)>, String> {
    let Some(file) = w.value("f") else {
        let words = w.positional.iter().enumerate();
        let items = words.map(|(i, t)| (format!("argument {}", i + 1), t.as_str()));
        return parse_sets(items, max_line).map_err(|bad| bad.join("; "));
    };
    if !w.positional.is_empty() {
        return Err("give IDENTITY=VALUE words or -f, not both".into());
    }
    let text = match file {
        "-" => {
            let mut text = Vec::new();
            let read = io.stdin.take(MAX_FILE).read_to_end(&mut text);
            read.map_err(|e| format!("cannot read {file}: {e}"))?;
            text
        }
        path => crate::files::read_regular(path.as_ref(), MAX_FILE)
            .map_err(|e| format!("cannot read {path}: {e}"))?,
    };
    let text = String::from_utf8(text).map_err(|_| format!("{file} is not UTF-8"))?;
    // An editor's byte-order mark is not part of the first identity.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let lines = text.lines().enumerate().filter_map(|(i, l)| {
        let l = l.split('#').next().unwrap_or("");
        (!l.trim().is_empty()).then(|| (format!("line {}", i + 1), l))
    });
    parse_sets(lines, max_line).map_err(|bad| bad.join("; "))
}

/// How far the writing got.
#[derive(Debug, Default)]
struct Outcome {
    /// Changes written (positions in the change list), including those
    /// whose answer was lost and that the re-read found applied.
    written: Vec<usize>,
    /// Changes sent whose answer was lost and that the re-read did not
    /// find applied: consul may still commit them.
    unknown: Vec<usize>,
    transactions: usize,
    /// Orphan records deleted (their keys were already gone).
    orphans: usize,
    /// Why it stopped (exit 1), one line each.
    failed: Vec<String>,
}

/// Writes the changes that change something, each with its record, in
/// transactions of at most [`crate::contract::txn::BATCH`] operations and
/// [`crate::contract::txn::MAX_TXN_BYTES`], in order (a key and its record
/// never split), stopping at the first that fails; then the orphan
/// records.
fn write(kv: &mut Kv, plan: &Plan<'_>) -> Outcome {
    let (positions, keys): (Vec<usize>, Vec<KeyWrite<'_>>) = plan.keys().into_iter().unzip();
    let groups: Vec<[serde_json::Value; 2]> = keys
        .iter()
        .map(|k| k.ops(kv, plan.recorder, plan.now))
        .collect();
    let sizes: Vec<(usize, usize)> = groups
        .iter()
        .map(|ops| (ops.len(), ops.iter().map(|o| o.to_string().len()).sum()))
        .collect();
    let batches = batches(&sizes);
    // The changes each transaction writes (orphans come last in a batch:
    // the changes are the rest), and the orphan records it deletes.
    let batch = |range: &std::ops::Range<usize>| -> (Vec<usize>, usize) {
        let changes: Vec<usize> = keys[range.clone()]
            .iter()
            .zip(&positions[range.clone()])
            .filter(|(k, _)| k.target.is_some())
            .map(|(_, &i)| i)
            .collect();
        let orphans = range.len() - changes.len();
        (changes, orphans)
    };
    // A set is a ramp of one step: its transactions are all due at once,
    // run by the writers' one step machine, stopping at the first that is
    // not applied.
    let due = vec![Duration::ZERO; batches.len()];
    let mut outcome = Outcome::default();
    let mut idle = Idle::start(());
    let stop = loop {
        let flight = match idle.poll(&due, Duration::ZERO, None) {
            Polled::Write(flight) => flight,
            Polled::Stop(stop) => break stop,
            Polled::Wait(waiting, _) => {
                idle = waiting;
                continue;
            }
        };
        let range = batches[flight.at()].clone();
        let ops: Vec<serde_json::Value> = groups[range.clone()].concat();
        let answer = match deliver(kv, &keys[range.clone()], &ops) {
            deliver::Answer::Applied(_) => {
                let (changes, orphans) = batch(&range);
                outcome.written.extend_from_slice(&changes);
                outcome.orphans += orphans;
                outcome.transactions += 1;
                Answer::Applied(())
            }
            deliver::Answer::Conflict(line) => Answer::Conflict(line),
            deliver::Answer::Refused(lines) => Answer::Refused(lines),
            deliver::Answer::Lost(lost) => Answer::Lost(lost),
        };
        match flight.answered(answer) {
            Ok(next) => idle = next,
            Err(stop) => break stop,
        }
    };
    match stop {
        Stop::Done | Stop::Signal { .. } => {}
        Stop::Conflict { line, .. } => outcome.failed = vec![format!("conflict: {line}")],
        Stop::Refused { lines, .. } => outcome.failed = lines,
        Stop::Lost { lost, at, .. } => {
            let (changes, _) = batch(&batches[at]);
            settle_lost(plan.changes, &changes, lost, &mut outcome);
        }
    }
    outcome
}

/// A transaction whose answer never came, settled by reading the keys
/// again: each is applied (consul applies a transaction whole, so one such
/// key means all), not written (a key moved elsewhere: it cannot commit)
/// or unknown.
fn settle_lost(changes: &[Change], batch: &[usize], lost: Lost, outcome: &mut Outcome) {
    let Lost { why, held, settled } = lost;
    outcome.failed.push(match settled {
        Settled::Moved(k) => format!("{why}: the answer was lost, and {} was changed by someone else meanwhile: the transaction cannot commit (nothing of it is written)", changes[batch[k]].identity),
        _ => format!("{why}: consul did not say whether it applied the transaction; the keys were read again"),
    });
    for (n, &i) in batch.iter().enumerate() {
        let identity = &changes[i].identity;
        let line = match (&held, settled) {
            (Ok(held), Settled::Applied) => format!("{identity}: applied: it now holds {} (index {})", held[n].render(), held[n].index()),
            (Ok(held), Settled::Moved(_)) => format!("{identity}: not written: it holds {} (index {})", held[n].render(), held[n].index()),
            (Ok(held), Settled::Unknown) => format!("{identity}: unknown: it still holds {} (index {}), and consul may still commit the write later", held[n].render(), held[n].index()),
            (Err(e), _) => format!("{identity}: unknown: re-reading it failed ({e}), and consul may have committed the write or may still"),
        };
        outcome.failed.push(line);
    }
    match settled {
        Settled::Applied => {
            outcome.written.extend_from_slice(batch);
            outcome.transactions += 1;
        }
        Settled::Moved(_) => {}
        Settled::Unknown => outcome.unknown.extend_from_slice(batch),
    }
}

/// Prints what happened; `max_line` is the daemon's `-max-line-bytes`
/// (the undo's `set` refuses longer identities).
fn report(
    io: &mut Io<'_>,
    (w, max_line): (&Args, usize),
    changes: &[Change],
    outcome: &Outcome,
) -> u8 {
    let written: Vec<&Change> = outcome.written.iter().map(|&i| &changes[i]).collect();
    let undo = undo_line(&written, &w.daemon, max_line);
    let unrestorable = unrestorable(&written, max_line);
    let code = match outcome.failed.is_empty() {
        true => OK,
        false => FINDING,
    };
    if w.flag("json") {
        report_json(io, w, changes, outcome, (&undo, &unrestorable));
        return code;
    }
    for c in changes {
        let _ = writeln!(io.out, "{}", c.line());
    }
    let ids = |cs: &mut dyn Iterator<Item = &Change>| {
        cs.map(|c| c.identity.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    if w.flag("dry-run") {
        let _ = writeln!(io.out, "dry run: nothing written");
    } else if !written.is_empty() {
        let _ = writeln!(
            io.out,
            "written: {} in {}",
            counted(written.len(), "key", "keys"),
            counted(outcome.transactions, "transaction", "transactions")
        );
    } else if outcome.failed.is_empty() {
        let _ = writeln!(io.out, "nothing to change");
    }
    if outcome.orphans > 0 {
        let _ = writeln!(
            io.out,
            "deleted {}: their keys were already gone",
            counted(outcome.orphans, "orphan record", "orphan records")
        );
    }
    if !outcome.failed.is_empty() {
        for line in &outcome.failed {
            let _ = writeln!(io.err, "{line}");
        }
        if !written.is_empty() {
            let _ = writeln!(
                io.err,
                "written before it: {}",
                ids(&mut written.iter().copied())
            );
        }
        if !outcome.unknown.is_empty() {
            let mut unknown = outcome.unknown.iter().map(|&i| &changes[i]);
            let _ = writeln!(
                io.err,
                "unknown (consul may still commit them): {}",
                ids(&mut unknown)
            );
        }
        let not: Vec<&Change> = not_written(changes, outcome).collect();
        if !not.is_empty() {
            let _ = writeln!(io.err, "not written: {}", ids(&mut not.into_iter()));
        }
    }
    if let Some(undo) = undo {
        let _ = writeln!(io.out, "undo: {undo}");
    }
    for line in unrestorable {
        let _ = writeln!(io.out, "undo cannot restore: {line}");
    }
    code
}

/// The changes to make that were neither written nor sent with an
/// unknown outcome.
fn not_written<'a>(
    changes: &'a [Change],
    outcome: &'a Outcome,
) -> impl Iterator<Item = &'a Change> {
    changes.iter().enumerate().filter_map(move |(i, c)| {
        let left = !c.is_noop() && !outcome.written.contains(&i) && !outcome.unknown.contains(&i);
        left.then_some(c)
    })
}

fn report_json(
    io: &mut Io<'_>,
    w: &Args,
    changes: &[Change],
    outcome: &Outcome,
    (undo, unrestorable): (&Option<String>, &[String]),
) {
    let error = (!outcome.failed.is_empty()).then(|| outcome.failed.join("\n"));
    let doc = json!({
        "dry_run": w.flag("dry-run"),
        "changes": changes.iter().enumerate().map(|(i, c)| json!({
            "identity": c.identity,
            "before": c.before.render(),
            "after": c.after.render(),
            "unchanged": c.is_noop(),
            "expires_unix_seconds": (c.carried.until != 0).then_some(c.carried.until),
            "reason": c.carried.reason,
            "keeps": c.carried.keeps(),
            "written": outcome.written.contains(&i),
            "unknown": outcome.unknown.contains(&i),
        })).collect::<Vec<_>>(),
        "transactions": outcome.transactions,
        "error": error,
        "undo": undo,
        "undo_cannot_restore": unrestorable,
    });
    let _ = writeln!(
        io.out,
        "{}",
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    );
    if let Some(e) = &error {
        let _ = writeln!(io.err, "{e}");
    }
}
