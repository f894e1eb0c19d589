//! `ramp IDENTITY... -to PCT -over DURATION [-from PCT] [-steps N|P1,P2,...]
//! [-then drain|maint|unset]`: intermediate weights on a schedule
//! ([`super::schedule`]), every named key in one transaction per step,
//! each guarded by the index of the ramp's own previous write.
//!
//! Stops at once, writing nothing more, when anyone else changes a key
//! (exit 1); on SIGINT or SIGTERM stops after the write in flight and
//! prints the command that resumes it (exit 130 or 143).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::plan::{self, shell_word, Held, Target, TxnAnswer};
use super::schedule::{check_rate, offset, parse_pct, secs, Steps};
use super::{conflict_line, Kv};
use crate::cli::Args;
use crate::cli::{usage_error, Io, FINDING, OK};
use crate::config::daemon_flag;
use crate::contract::Desired;

const HELP: &str = "\
usage: gitlab-haproxy-agent ramp IDENTITY... -to PCT -over DURATION [-from PCT]
       [-steps N | -steps P1,P2,...] [-then drain|maint|unset] [-dry-run] [consul flags]

Writes intermediate weights (N% values) on a schedule, every named key in one
transaction per step. -from defaults to each key's current weight (absent or
ready 100%, drain 0%, N% N; maint has none: give -from). -steps N (default 10)
spaces the weights evenly, a list gives them exactly (canary: 1,5,25,50,100).
Step k of n is written at (k-1)/n of -over, the first at once; at most one
write a second. A ramp to 100% ends by deleting the keys (ready 100%) unless
-then says otherwise; -then drain|maint|unset is written at -over.
Each step is guarded by the ramp's own previous write: if anyone else changes a
key, the ramp stops, writes nothing more, and exits 1. SIGINT or SIGTERM stop
it after the write in flight and print the command that resumes it (exit 130,
143). -dry-run prints the schedule and writes nothing.
";

/// One write of the ramp: when, and what each key becomes.
struct Write1 {
    at: Duration,
    targets: Vec<Target>,
}

pub fn run(args: &[OsString], io: &mut Io<'_>) -> u8 {
    let w = match Args::parse_with(
        args,
        &["to", "over", "from", "steps", "then"],
        &["dry-run"],
        daemon_flag,
    ) {
        Ok(w) if w.help => {
            let _ = io.out.write_all(HELP.as_bytes());
            return OK;
        }
        Ok(w) => w,
        Err(e) => return usage_error(io, "ramp", &e),
    };
    let ramp = match Ramp::of(&w) {
        Ok(r) => r,
        Err(e) => return usage_error(io, "ramp", &e),
    };
    let mut kv = match Kv::open(&w.daemon, io.env) {
        Ok(kv) => kv,
        Err(e) => return usage_error(io, "ramp", &e),
    };
    let held = match kv.read(&w.positional) {
        Ok(h) => h,
        Err(e) => {
            let _ = writeln!(io.err, "gitlab-haproxy-agent ramp: nothing written: {e}");
            return FINDING;
        }
    };
    let writes = match ramp.writes(&w.positional, &held) {
        Ok(writes) => writes,
        Err(e) => return usage_error(io, "ramp", &e),
    };
    if w.flag("dry-run") {
        for (k, write) in writes.iter().enumerate() {
            let _ = writeln!(
                io.out,
                "+{} {}: {}",
                secs(write.at),
                label(k, &ramp),
                targets(&w.positional, &write.targets)
            );
        }
        let _ = writeln!(io.out, "dry run: nothing written");
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
    let live = std::io::stdout().is_terminal();
    execute(io, &mut kv, &w, &ramp, &held, &writes, &signal, live)
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
        for i in &w.positional {
            plan::check_identity(i)?;
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

#[allow(clippy::too_many_arguments)]
fn execute(
    io: &mut Io<'_>,
    kv: &mut Kv,
    w: &Args,
    ramp: &Ramp,
    held: &[Held],
    writes: &[Write1],
    signal: &AtomicUsize,
    live: bool,
) -> u8 {
    let ids = &w.positional;
    let mut index: Vec<u64> = held.iter().map(Held::index).collect();
    let start = Instant::now();
    let wall = SystemTime::now();
    let end = wall + writes.last().map_or(Duration::ZERO, |x| x.at);
    let mut shown = String::new();
    for (k, write) in writes.iter().enumerate() {
        // Wait for the step's time, watching for a signal.
        loop {
            if let Some(code) = stopped(signal) {
                return resume(io, w, ramp, writes, k, code, live);
            }
            let due = start + write.at;
            let now = Instant::now();
            if now >= due {
                break;
            }
            let line = format!(
                "step {k} of {}, {}, next write in {}s, ends {}",
                writes.len(),
                current(ids, writes, k),
                (due - now).as_secs() + 1,
                clock(end)
            );
            // Redrawn when it reads differently, not every wake-up.
            if live && line != shown {
                let _ = write!(io.out, "\r\x1b[K{line}");
                let _ = io.out.flush();
                shown = line;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(100)));
        }
        let ops: Vec<serde_json::Value> = ids
            .iter()
            .zip(&write.targets)
            .zip(&index)
            .map(|((i, t), &x)| plan::op(&kv.key(i), *t, x))
            .collect();
        let written_at = start.elapsed();
        match kv.txn(&ops) {
            Ok(TxnAnswer::Applied(results)) => {
                for (i, t) in write.targets.iter().enumerate() {
                    let key = kv.key(&ids[i]);
                    index[i] = match t {
                        Target::Unset => 0,
                        Target::Set(_) => {
                            results.iter().find(|(k, _)| *k == key).map_or(0, |r| r.1)
                        }
                    };
                }
            }
            Ok(TxnAnswer::Conflict(at, what)) => {
                let line = conflict_line(kv, ids.get(at).map_or("?", String::as_str));
                let reached = if k == 0 {
                    "before the first step".to_owned()
                } else {
                    format!("after {}", label(k - 1, ramp))
                };
                let _ = writeln!(io.out);
                let _ = writeln!(
                    io.err,
                    "ramp stopped {reached}: {line}; nothing more written (consul: {what})"
                );
                return FINDING;
            }
            Err(e) => {
                let _ = writeln!(io.err, "ramp stopped at {}: {e}", label(k, ramp));
                return resume(io, w, ramp, writes, k, FINDING, live);
            }
        }
        let late = written_at.saturating_sub(write.at);
        match live {
            true => {
                let _ = write!(
                    io.out,
                    "\r\x1b[K{}: {}",
                    label(k, ramp),
                    targets(ids, &write.targets)
                );
            }
            false => {
                let _ = writeln!(
                    io.out,
                    "{}: {} (written at +{}, late {}ms)",
                    label(k, ramp),
                    targets(ids, &write.targets),
                    secs(written_at),
                    late.as_millis()
                );
            }
        }
        let _ = io.out.flush();
    }
    if live {
        let _ = writeln!(io.out);
    }
    let _ = writeln!(
        io.out,
        "ramp done: {}",
        targets(
            ids,
            &writes.last().map_or(Vec::new(), |x| x.targets.clone())
        )
    );
    OK
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
        0 => "not started".to_owned(),
        _ => targets(ids, &writes[k - 1].targets),
    }
}

/// Stops before write `k`: prints the command that does the rest.
fn resume(
    io: &mut Io<'_>,
    w: &Args,
    ramp: &Ramp,
    writes: &[Write1],
    k: usize,
    code: u8,
    live: bool,
) -> u8 {
    if live {
        let _ = writeln!(io.out);
    }
    let ids = &w.positional;
    let n = ramp.steps.count();
    let common: String = w
        .daemon
        .iter()
        .map(|x| format!(" {}", shell_word(x)))
        .collect();
    let mut lines = Vec::new();
    if k < n {
        // Keys whose remaining weights agree resume together.
        let mut groups: Vec<(Vec<u16>, Vec<&str>)> = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let rest: Vec<u16> = writes[k..n]
                .iter()
                .map(|x| match x.targets[i] {
                    Target::Set(d) => d.weight_pct(),
                    Target::Unset => 100,
                })
                .collect();
            match groups.iter_mut().find(|(r, _)| *r == rest) {
                Some((_, g)) => g.push(id),
                None => groups.push((rest, vec![id])),
            }
        }
        let interval = ramp.over / n as u32;
        for (rest, group) in groups {
            let list: Vec<String> = rest.iter().map(u16::to_string).collect();
            let then = match ramp.then {
                Some(Target::Set(d)) => format!(" -then {d}"),
                Some(Target::Unset) => " -then unset".to_owned(),
                None => String::new(),
            };
            let group: Vec<String> = group.iter().map(|g| shell_word(g)).collect();
            lines.push(format!(
                "gitlab-haproxy-agent ramp{common} {} -to {}% -over {} -steps {}{then}",
                group.join(" "),
                ramp.to,
                secs(interval * rest.len() as u32),
                list.join(",")
            ));
        }
    } else if let Some(then) = ramp.then {
        let verb = match then {
            Target::Set(d) => format!(
                "set{common} {}",
                ids.iter()
                    .map(|i| shell_word(&format!("{i}={d}")))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Target::Unset => format!(
                "unset{common} {}",
                ids.iter()
                    .map(|i| shell_word(i))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        };
        lines.push(format!("gitlab-haproxy-agent {verb}"));
    }
    let done = if k == 0 {
        "before the first step".to_owned()
    } else {
        format!("after {}", label(k - 1, ramp))
    };
    let _ = writeln!(
        io.err,
        "ramp stopped {done}; the keys hold {}",
        current(ids, writes, k)
    );
    for line in lines {
        let _ = writeln!(io.out, "resume: {line}");
    }
    code
}
