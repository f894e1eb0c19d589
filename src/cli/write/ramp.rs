//! `ramp IDENTITY... -to PCT -over DURATION [-from PCT] [-steps N|P1,P2,...]
//! [-then drain|maint|unset]`: intermediate weights on a schedule
//! ([`super::schedule`]), every named key in one transaction per step,
//! each guarded by the index of the ramp's own previous write.
//!
//! Stops at once, writing nothing more, when anyone else changes a key
//! (exit 1); on SIGINT or SIGTERM stops after the write in flight and
//! prints the command that resumes it (exit 130 or 143).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::deliver::{self, deliver, KeyWrite, Lost, Settled};
use super::haproxy::static_weights;
use super::key::{Held, Target};
use super::kv::{unix_now, Kv, RECORD_PREFIX};
use super::machine::{Answer, Idle, InFlight, Polled, Stop, Write1};
use super::recorder::{recorded_reason, Recorder, Until, RECORD_FLAGS};
use super::schedule::{check_rate, offset, parse_pct, secs, Steps};
use super::undo::command_line;
use super::words::{check_distinct, check_identity};
use crate::cli::Args;
use crate::cli::{usage_error, Io, FINDING, OK};
use crate::contract::txn::BATCH;
use crate::contract::Desired;

pub const HELP: &str = "\
usage: gitlab-haproxy-agent ramp IDENTITY... -to PCT -over DURATION [-from PCT]
       [-steps N | -steps P1,P2,...] [-then drain|maint|unset
       [-for DURATION | -until TIME]] [-for none] [-reason TEXT] [-by WHO] [-record-prefix PREFIX] [-dry-run]
       [-haproxy-config FILE]... [consul flags]

Writes intermediate weights (N% values) on a schedule, every named key in one
transaction per step. -from defaults to each key's current weight (absent or
ready 100%, drain 0%, N% N; maint has none: give -from). -steps N (default 10)
spaces the weights evenly, a list gives them exactly (canary: 1,5,25,50,100).
Step k of n is written at (k-1)/n of -over, the first at once; at most one
write a second. A ramp to 100% ends by deleting the keys (ready 100%) unless
-then says otherwise; -then drain|maint|unset is written at -over.
Each step is guarded by the ramp's own previous write: if anyone else changes a
key, the ramp stops, writes nothing more, and exits 1. A step consul refuses,
or whose answer never comes (the keys are then read again), stops it with the
command that resumes it from what the keys hold (exit 1); so do SIGINT and
SIGTERM, after the write in flight (exit 130, 143). Identities are checked as
set checks them, each named once. A server that the haproxy configuration
(-haproxy-config FILE, else $GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG, else
/etc/haproxy/haproxy.cfg when it exists) shows in a backend with a static
algorithm (static-rr, map-based hashing) cannot ramp: haproxy ignores weights
other than 0% and 100% there, so the ramp is refused (exit 2); when no
configuration can be read, a warning names the path tried. -dry-run prints the
schedule and writes nothing. Every write also writes each key's record in its
transaction (as set; at most 32 keys: 64 operations with their records), and
the last deletes it with the key. Every step keeps each key's recorded reason
(unless -reason; -reason '' clears it) and its expiry (unless -for none
clears it), and says so before the first; -for or -until (with -then
drain|maint only) puts a new expiry, counted from the -then write, in the keys'
Flags.
";

pub fn run(w: &Args, io: &mut Io<'_>) -> u8 {
    let (ramp, recorder, mut kv) = match open(w, io) {
        Ok(opened) => opened,
        Err(e) => return usage_error(io, "ramp", &e),
    };
    let (held, was) = match read(&mut kv, &w.positional) {
        Ok(read) => read,
        Err(e) => {
            let _ = writeln!(io.err, "gitlab-haproxy-agent ramp: nothing written: {e}");
            return FINDING;
        }
    };
    let writes = match ramp.writes(&w.positional, &held) {
        Ok(writes) => writes,
        Err(e) => return usage_error(io, "ramp", &e),
    };
    if let Err(e) = static_weights(w, io, "ramp", &weighted(&w.positional, &writes)) {
        return usage_error(io, "ramp", &format!("nothing written: {e}"));
    }
    let then_for = w.value("for").is_some();
    keeps_lines(io, &w.positional, &recorder, (&writes, &was), then_for);
    if w.flag("dry-run") {
        dry_run(io, &w.positional, &ramp, &writes);
        return OK;
    }
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize) {
            let _ = writeln!(
                io.err,
                "gitlab-haproxy-agent ramp: cannot catch signals: {e}"
            );
            return FINDING;
        }
    }
    let run = Run {
        ids: &w.positional,
        daemon: &w.daemon,
        records: record_words(w),
        ramp: &ramp,
        recorder: &recorder,
        was: &was,
        live: std::io::stdout().is_terminal(),
    };
    let stop = execute(io, &mut kv, &run, (&writes, &held), &signal);
    report(io, &run, &writes, &stop)
}

/// The identities that some write gives a weight other than 0% and 100%
/// (which a static-algorithm backend ignores).
fn weighted<'a>(ids: &'a [String], writes: &[Write1]) -> Vec<&'a str> {
    ids.iter()
        .enumerate()
        .filter(|&(k, _)| writes.iter().any(|w| w.targets[k].intermediate()))
        .map(|(_, i)| i.as_str())
        .collect()
}

/// The keys as held, and what each carries into the ramp's writes: its
/// recorded reason and its expiry.
fn read(kv: &mut Kv, ids: &[String]) -> Result<(Vec<Held>, Vec<Was>), String> {
    let held = kv.read_expiring(ids)?;
    let records = kv.records()?;
    Ok(ids
        .iter()
        .zip(held)
        .map(|(id, (h, expiry))| {
            let reason = recorded_reason(&records, id, &h);
            (h, (reason, expiry))
        })
        .unzip())
}

/// A key's recorded reason and expiry before the ramp.
type Was = (Option<String>, u32);

/// What the ramp keeps of each key's record, said once before it starts
/// (`be/a: keeps reason "INC-123", until ...`); with `then_for` (`-then
/// drain|maint -for D`), the kept expiry holds for the steps only.
fn keeps_lines(
    io: &mut Io<'_>,
    ids: &[String],
    recorder: &Recorder,
    (writes, was): (&[Write1], &[Was]),
    then_for: bool,
) {
    let Some(first) = writes.first() else { return };
    for ((id, t), (reason, expiry)) in ids.iter().zip(&first.targets).zip(was) {
        let carried = recorder.carry(*t, reason.clone(), *expiry, None);
        if let Some(keeps) = carried.keeps() {
            let steps = match then_for && carried.kept_until {
                true => " for the steps (the -then write sets its own -for)",
                false => "",
            };
            let _ = writeln!(io.out, "{id}: {keeps}{steps}");
        }
    }
}

/// The ramp as asked, the records' words, and consul; the identities
/// checked.
fn open(w: &Args, io: &Io<'_>) -> Result<(Ramp, Recorder, Kv), String> {
    let ramp = Ramp::of(w)?;
    let recorder = Recorder::of(w, io.env, "ramp")?;
    ramp.check_records(&w.positional, &recorder)?;
    let kv = Kv::open(&w.daemon, io.env, w.value(RECORD_PREFIX))?;
    w.positional
        .iter()
        .try_for_each(|i| check_identity(i, Some(kv.max_line)))?;
    check_distinct(&w.positional)?;
    Ok((ramp, recorder, kv))
}

/// `-dry-run`: the schedule, a line a write.
fn dry_run(io: &mut Io<'_>, ids: &[String], ramp: &Ramp, writes: &[Write1]) {
    for (k, write) in writes.iter().enumerate() {
        let _ = writeln!(
            io.out,
            "+{} {}: {}",
            secs(write.at),
            label(k, ramp),
            targets(ids, &write.targets)
        );
    }
    let _ = writeln!(io.out, "dry run: nothing written");
}

/// The ramp as asked.
struct Ramp {
    to: u16,
    over: Duration,
    from: Option<u16>,
    steps: Steps,
    then: Option<Target>,
}

impl Ramp {
    fn of(w: &Args) -> Result<Ramp, String> {
        if w.positional.is_empty() {
            return Err("give at least one IDENTITY".into());
        }
        let to =
            parse_pct(w.value("to").ok_or("-to is required")?).map_err(|e| format!("-to: {e}"))?;
        let over_text = w.value("over").ok_or("-over is required")?;
        let over = match crate::gocompat::parse_go_duration(over_text) {
            Some(Some(d)) if !d.is_zero() => d,
            _ => {
                return Err(format!(
                    "-over {over_text:?} is not a positive duration (10m, 90s, 1h30m)"
                ))
            }
        };
        let from = w
            .value("from")
            .map(parse_pct)
            .transpose()
            .map_err(|e| format!("-from: {e}"))?;
        let steps = Steps::parse(w.value("steps").unwrap_or("10"))?;
        if let Steps::List(l) = &steps {
            if l.last() != Some(&to) {
                return Err(format!("the last of -steps must be -to ({to}%)"));
            }
        }
        let then = match w.value("then") {
            None => None,
            Some("drain") => Some(Target::Set(Desired::DRAIN)),
            Some("maint") => Some(Target::Set(Desired::MAINT)),
            Some("unset") => Some(Target::Unset),
            Some(t) => return Err(format!("-then {t:?}: give drain, maint or unset")),
        };
        check_rate(over, steps.count(), then.is_some())?;
        Ok(Ramp {
            to,
            over,
            from,
            steps,
            then,
        })
    }

    /// What the records ask of the ramp: `-for` only with `-then drain` or
    /// `maint` (the divert that expires), and a transaction per step: at
    /// most [`BATCH`] operations, two per key (its record).
    fn check_records(&self, ids: &[String], recorder: &Recorder) -> Result<(), String> {
        if recorder.until.sets() && !matches!(self.then, Some(Target::Set(_))) {
            return Err(
                "-for and -until need -then drain or -then maint: they are the expiry of that divert (-for none clears the keys' expiry)".into(),
            );
        }
        if ids.len() > BATCH / 2 {
            return Err(format!(
                "{} identities: a ramp writes every key and its record in one transaction per step, at most {} keys ({} operations); ramp them in groups",
                ids.len(),
                BATCH / 2,
                BATCH
            ));
        }
        recorder
            .expiry(unix_now() + self.over.as_secs())
            .map(|_| ())
    }

    /// Every write, each key's value at each.
    fn writes(&self, identities: &[String], held: &[Held]) -> Result<Vec<Write1>, String> {
        let mut from = Vec::new();
        for (i, h) in identities.iter().zip(held) {
            match self.from.or(h.weight()) {
                Some(f) => from.push(f),
                None => return Err(format!("{i} is in maint, which has no weight: give -from")),
            }
        }
        let n = self.steps.count();
        let mut writes: Vec<Write1> = (1..=n)
            .map(|k| Write1 {
                at: offset(self.over, n, k),
                targets: from
                    .iter()
                    .map(|&f| match self.steps.weight(f, self.to, k) {
                        // The resting state is the key deleted.
                        100 if k == n && self.then.is_none() => Target::Unset,
                        pct => Target::Set(Desired::ready_pct(pct).unwrap_or(Desired::READY)),
                    })
                    .collect(),
            })
            .collect();
        if let Some(then) = self.then {
            writes.push(Write1 {
                at: self.over,
                targets: vec![then; identities.len()],
            });
        }
        Ok(writes)
    }
}

fn label(k: usize, ramp: &Ramp) -> String {
    match k < ramp.steps.count() {
        true => format!("step {} of {}", k + 1, ramp.steps.count()),
        false => "then".to_owned(),
    }
}

/// `be/a=25% be/b=30%`, or `all 25%` when every key gets the same.
fn targets(identities: &[String], t: &[Target]) -> String {
    if t.windows(2).all(|p| p[0] == p[1]) {
        return t.first().map_or(String::new(), |t| t.render());
    }
    identities
        .iter()
        .zip(t)
        .map(|(i, t)| format!("{i}: {}", t.render()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A wall-clock time, `HH:MM:SS UTC`.
fn clock(at: SystemTime) -> String {
    let s = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

/// What the command around the machine needs to draw and report.
struct Run<'a> {
    ids: &'a [String],
    /// The consul words the ramp was given, repeated in the resume line.
    daemon: &'a [String],
    /// The record words it was given (`-reason`, `-by`, ...), repeated too.
    records: Vec<String>,
    ramp: &'a Ramp,
    recorder: &'a Recorder,
    /// Each key's recorded reason and expiry before the ramp: every step
    /// keeps them unless told otherwise.
    was: &'a [Was],
    /// Standard output is a terminal: one live progress line.
    live: bool,
}

/// Drives the machine through `writes` from `held` (the keys before the
/// ramp): sleeps until a write is due, draws the progress, sends each
/// write and tells the machine its answer.
fn execute(
    io: &mut Io<'_>,
    kv: &mut Kv,
    run: &Run<'_>,
    (writes, held): (&[Write1], &[Held]),
    signal: &AtomicUsize,
) -> Stop {
    let start = Instant::now();
    let end = SystemTime::now() + writes.last().map_or(Duration::ZERO, |x| x.at);
    let mut shown = String::new();
    let due: Vec<Duration> = writes.iter().map(|w| w.at).collect();
    let mut idle = Idle::start(held.iter().map(Held::index).collect());
    loop {
        let done = idle.done();
        idle = match idle.poll(&due, start.elapsed(), stopped(signal)) {
            Polled::Stop(stop) => return stop,
            Polled::Wait(idle, left) => {
                let line = format!(
                    "step {done} of {}, {}, next write in {}s, ends {}",
                    writes.len(),
                    current(run.ids, writes, done),
                    left.as_secs() + 1,
                    clock(end)
                );
                // Redrawn when it reads differently, not every wake-up.
                if run.live && line != shown {
                    let _ = write!(io.out, "\r\x1b[K{line}");
                    let _ = io.out.flush();
                    shown = line;
                }
                std::thread::sleep(left.min(Duration::from_millis(100)));
                idle
            }
            Polled::Write(flight) => {
                let written_at = start.elapsed();
                let k = flight.at();
                let answer = send(kv, run, writes, &flight);
                match flight.answered(answer) {
                    Ok(idle) => {
                        step_line(io, run, k, &writes[k], written_at);
                        idle
                    }
                    Err(stop) => return stop,
                }
            }
        };
    }
}

/// One applied write, on the live line or a line of its own.
fn step_line(io: &mut Io<'_>, run: &Run<'_>, k: usize, write: &Write1, written_at: Duration) {
    let (label, values) = (label(k, run.ramp), targets(run.ids, &write.targets));
    let _ = match run.live {
        true => write!(io.out, "\r\x1b[K{label}: {values}"),
        false => writeln!(
            io.out,
            "{label}: {values} (written at +{}, late {}ms)",
            secs(written_at),
            written_at.saturating_sub(write.at).as_millis()
        ),
    };
    let _ = io.out.flush();
}

/// Sends the write in `flight` guarded by its indexes; its answer.
fn send(
    kv: &mut Kv,
    run: &Run<'_>,
    writes: &[Write1],
    flight: &InFlight<Vec<u64>>,
) -> Answer<Vec<u64>> {
    let k = flight.at();
    let write = &writes[k];
    let now = unix_now();
    // The -then write carries a new expiry, counted from it; every other
    // keeps the key's (or clears it: -for none).
    let expiry = match k + 1 == writes.len() && run.ramp.then.is_some() {
        true => run.recorder.expiry(now).unwrap_or(None),
        false => match run.recorder.until {
            Until::Clear => Some(0),
            _ => None,
        },
    };
    let keys: Vec<KeyWrite<'_>> = run
        .ids
        .iter()
        .zip(&write.targets)
        .zip(flight.guards())
        .zip(run.was)
        .map(|(((id, t), &guard), (reason, was))| KeyWrite {
            identity: id,
            target: Some(*t),
            guard,
            carried: run.recorder.carry(*t, reason.clone(), *was, expiry),
        })
        .collect();
    let ops: Vec<serde_json::Value> = keys
        .iter()
        .flat_map(|key| key.ops(kv, run.recorder, now))
        .collect();
    match deliver(kv, &keys, &ops) {
        deliver::Answer::Applied(after) => {
            if let Some(indexes) = after.into_iter().collect::<Option<Vec<u64>>>() {
                return Answer::Applied(indexes);
            }
            // A result withheld (a token that cannot read the key): read
            // the indexes.
            match kv.read(run.ids) {
                Ok(held) => Answer::Applied(held.iter().map(Held::index).collect()),
                Err(e) => Answer::Lost(Lost {
                    why: format!("applied, then reading it back failed: {e}"),
                    held: Err(e),
                    settled: Settled::Unknown,
                }),
            }
        }
        deliver::Answer::Conflict(line) => Answer::Conflict(line),
        deliver::Answer::Refused(lines) => Answer::Refused(lines),
        deliver::Answer::Lost(lost) => match (lost.settled, &lost.held) {
            // A key that moved elsewhere meanwhile: the write can never
            // commit, and someone else holds the key.
            (Settled::Moved(k), Ok(h)) => Answer::Conflict(format!(
                "{}: changed by someone else while the answer was lost ({}): it now holds {} (index {}); the step cannot commit",
                run.ids[k],
                lost.why,
                h[k].render(),
                h[k].index()
            )),
            _ => Answer::Lost(lost),
        },
    }
}

/// Says how the ramp ended (and how to resume it); the exit code.
fn report(io: &mut Io<'_>, run: &Run<'_>, writes: &[Write1], stop: &Stop) -> u8 {
    if run.live {
        let _ = writeln!(io.out);
    }
    let hold = |done: usize| current(run.ids, writes, done);
    let (code, done) = match stop {
        Stop::Done => {
            let last = writes.last().map_or(Vec::new(), |x| x.targets.clone());
            let _ = writeln!(io.out, "ramp done: {}", targets(run.ids, &last));
            return OK;
        }
        Stop::Signal { code, done } => {
            let _ = writeln!(
                io.err,
                "ramp stopped {}; the keys hold {}",
                after(*done, run.ramp),
                hold(*done)
            );
            (*code, *done)
        }
        Stop::Conflict { line, done } => {
            let _ = writeln!(
                io.err,
                "ramp stopped {}: {line}; nothing more written",
                after(*done, run.ramp)
            );
            return FINDING;
        }
        Stop::Refused { lines, done } => {
            for line in lines {
                let _ = writeln!(io.err, "{line}");
            }
            let _ = writeln!(
                io.err,
                "ramp stopped {}: {} not written; the keys hold {}",
                after(*done, run.ramp),
                label(*done, run.ramp),
                hold(*done)
            );
            (FINDING, *done)
        }
        Stop::Lost { lost: l, at, done } => {
            lost(
                io,
                run,
                (&l.why, *at, *done),
                l.held.as_deref().ok(),
                writes,
            );
            (FINDING, *done)
        }
    };
    for line in resume_lines(run, writes, done) {
        let _ = writeln!(io.out, "resume: {line}");
    }
    code
}

/// A write whose answer never came: what the re-read found.
fn lost(
    io: &mut Io<'_>,
    run: &Run<'_>,
    (why, at, done): (&str, usize, usize),
    held: Option<&[Held]>,
    writes: &[Write1],
) {
    let step = match at < run.ramp.steps.count() {
        true => label(at, run.ramp),
        false => "the -then write".to_owned(),
    };
    let _ = writeln!(
        io.err,
        "{why}: consul did not say whether it applied {step}; the keys were read again"
    );
    let found = match held {
        Some(held) => held_line(run.ids, held),
        None => format!(
            "(the re-read failed) either {} or {}",
            current(run.ids, writes, at),
            targets(run.ids, &writes[at].targets)
        ),
    };
    let _ = match (done > at, held.is_some()) {
        (true, _) => writeln!(io.err, "ramp stopped: {step} was applied; the keys hold {found}"),
        (false, true) => writeln!(io.err, "ramp stopped: {step} is unknown (consul may still commit it later); the keys hold {found}"),
        (false, false) => writeln!(io.err, "ramp stopped: {step} is unknown (consul may have committed it, or may still); the keys hold {found}"),
    };
}

/// The keys as read: one reply when they agree.
fn held_line(ids: &[String], held: &[Held]) -> String {
    let shown: Vec<String> = held.iter().map(Held::render).collect();
    if shown.windows(2).all(|p| p[0] == p[1]) {
        return shown.first().cloned().unwrap_or_default();
    }
    ids.iter()
        .zip(shown)
        .map(|(i, s)| format!("{i}: {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `before the first step` or `after step k of n`, with `done` writes in.
fn after(done: usize, ramp: &Ramp) -> String {
    match done {
        0 => "before the first step".to_owned(),
        _ => format!("after {}", label(done - 1, ramp)),
    }
}

/// The exit code of the signal that arrived, if one did.
fn stopped(signal: &AtomicUsize) -> Option<u8> {
    match signal.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(128 + sig as u8),
    }
}

/// What the keys hold once `k` writes are done.
fn current(ids: &[String], writes: &[Write1], k: usize) -> String {
    match k {
        0 => "what they held before it (nothing written)".to_owned(),
        _ => targets(ids, &writes[k - 1].targets),
    }
}

/// The commands that do the rest once `k` writes are in: keys whose
/// remaining weights agree resume together.
fn resume_lines(run: &Run<'_>, writes: &[Write1], k: usize) -> Vec<String> {
    let ramp = run.ramp;
    let n = ramp.steps.count();
    if k >= n {
        let ids: Vec<String> = run.ids.to_vec();
        return match ramp.then {
            Some(Target::Set(d)) if k == n => {
                let words: Vec<String> = ids.iter().map(|i| format!("{i}={d}")).collect();
                let common = [run.daemon, &run.records].concat();
                vec![command_line("set", &common, &words)]
            }
            Some(Target::Unset) if k == n => {
                // `unset` takes only where the records live: the record
                // goes with the key, so its words would be refused.
                let flag = format!("-{RECORD_PREFIX}");
                let prefix = run.records.chunks(2).filter(|w| w[0] == flag);
                let common = [run.daemon, &prefix.flatten().cloned().collect::<Vec<_>>()].concat();
                vec![command_line("unset", &common, &ids)]
            }
            _ => Vec::new(),
        };
    }
    let mut groups: Vec<(Vec<u16>, Vec<String>)> = Vec::new();
    for (i, id) in run.ids.iter().enumerate() {
        let rest: Vec<u16> = writes[k..n]
            .iter()
            .map(|x| match x.targets[i] {
                Target::Set(d) => d.weight_pct(),
                Target::Unset => 100,
            })
            .collect();
        match groups.iter_mut().find(|(r, _)| *r == rest) {
            Some((_, g)) => g.push(id.clone()),
            None => groups.push((rest, vec![id.clone()])),
        }
    }
    let interval = ramp.over / n as u32;
    let then: &[&str] = match ramp.then {
        Some(Target::Set(d)) if d == Desired::DRAIN => &["-then", "drain"],
        Some(Target::Set(_)) => &["-then", "maint"],
        Some(Target::Unset) => &["-then", "unset"],
        None => &[],
    };
    groups
        .into_iter()
        .map(|(rest, group)| {
            // With `%`: a bare number is a count of steps to -steps.
            let list: Vec<String> = rest.iter().map(|w| format!("{w}%")).collect();
            let mut words = [run.daemon, &run.records].concat();
            words.extend([
                "-to".to_owned(),
                format!("{}%", ramp.to),
                "-over".to_owned(),
                secs(interval * rest.len() as u32),
                "-steps".to_owned(),
                list.join(","),
            ]);
            words.extend(then.iter().map(|w| w.to_string()));
            command_line("ramp", &words, &group)
        })
        .collect()
}

/// The record words a ramp was given, to repeat in its resume lines.
fn record_words(w: &Args) -> Vec<String> {
    RECORD_FLAGS
        .iter()
        .filter_map(|f| Some([format!("-{f}"), w.value(f)?.to_owned()]))
        .flatten()
        .collect()
}
