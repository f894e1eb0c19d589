//! Unasked diverted keys: a key whose reply is not `ready 100%` and that
//! no check asked for within `-unasked-after` (counted from the later of
//! its write, as this agent saw it, and the agent's start). Almost always a
//! key written for an identity haproxy does not send (`be_web/srv01` while
//! `agent-send` says `be_web/srv1`): the write changed nothing.
//!
//! In: the state and its asks ([`Swapper`]), swept every few seconds.
//! Out: the keys unasked now, each with the closest identity this haproxy
//! does ask for (when one is close), and one warning per key when it
//! becomes unasked. Always holds: a sweep looks at the diverted entries
//! only, and spends at most [`SUGGEST_BUDGET`] identity comparisons on
//! suggestions (past one key's worth); keys left over get theirs, and their
//! warning, at the next sweep; a key stops being unasked when it is asked,
//! rewritten, deleted or made `ready 100%`, and is warned about again only
//! if it becomes unasked again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use log::{info, warn};

use super::{Clock, Entry, Strangers, Swapper, Tick};
use crate::logging::escape;

/// Identity comparisons one sweep may spend on suggestions (a bounded
/// edit distance over a short identity is well under a microsecond).
pub const SUGGEST_BUDGET: usize = 200_000;
/// Asked identities without a key are forgotten after this long without
/// an ask (or `-unasked-after`, if longer), at most once a minute.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// What the monitoring shows of the asks (borrowed from the loop).
#[derive(Debug, Clone, Copy)]
pub struct Asking<'a> {
    pub clock: &'a Clock,
    pub strangers: &'a Strangers,
    pub unasked: &'a Unasked,
    /// The state whose asks are still being carried over to the current
    /// one (see [`crate::state::Snapshot::asks`]).
    pub previous: Option<&'a crate::state::Snapshot>,
}

/// One unasked key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub entry: Entry,
    pub last_asked: Tick,
    pub since: Tick,
    /// `None` until a sweep had the budget to look; then the closest asked
    /// identity, if one is close.
    pub suggestion: Option<Option<String>>,
    /// The sweep that last found it unasked.
    seen: u64,
}

/// What one sweep did, for tests and metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Keys that became unasked and were warned about.
    pub warned: usize,
    /// Keys no longer unasked.
    pub cleared: usize,
}

/// The unasked keys and when to look again.
#[derive(Debug)]
pub struct Unasked {
    after_secs: u32,
    period: Duration,
    next: Instant,
    last_forget: Instant,
    keys: HashMap<Box<str>, Finding>,
    sweeps: u64,
}

impl Unasked {
    pub fn new(after: Duration, now: Instant) -> Unasked {
        let period = (after / 4).clamp(Duration::from_secs(1), Duration::from_secs(5));
        Unasked {
            after_secs: u32::try_from(after.as_secs()).unwrap_or(u32::MAX).max(1),
            period,
            next: now + period,
            last_forget: now,
            keys: HashMap::new(),
            sweeps: 0,
        }
    }

    /// When the next sweep is due.
    pub fn due(&self) -> Instant {
        self.next
    }

    pub fn after(&self) -> Duration {
        Duration::from_secs(u64::from(self.after_secs))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn get(&self, identity: &str) -> Option<&Finding> {
        self.keys.get(identity)
    }

    /// The unasked keys, sorted by identity.
    pub fn sorted(&self) -> Vec<(&str, &Finding)> {
        let mut v: Vec<_> = self.keys.iter().map(|(k, f)| (&**k, f)).collect();
        v.sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// Sweeps as soon as the state allows (after a swap: the unasked keys
    /// it changed are seen at once, not a period later).
    pub fn soon(&mut self, now: Instant) {
        self.next = self.next.min(now);
    }

    /// Looks at every diverted entry, warns about the newly unasked ones
    /// (within the suggestion budget), forgets old strangers. Waits while
    /// a swap's asks are still being carried over (the loop is busy then,
    /// so it comes back at once).
    pub fn sweep(&mut self, state: &mut Swapper, now: Instant) -> Swept {
        if state.carrying_from().is_some() {
            self.next = now;
            return Swept::default();
        }
        self.next = now + self.period;
        self.sweeps += 1;
        let tick = state.clock().tick(now);
        self.mark(state, tick);
        let mut swept = Swept::default();
        let sweep = self.sweeps;
        self.keys.retain(|identity, f| {
            let keep = f.seen == sweep;
            if !keep && f.suggestion.is_some() {
                swept.cleared += 1;
                info!(identity = escape(identity.as_bytes(), 256); "a key reported unasked no longer is (asked, rewritten, deleted or made ready)");
            }
            keep
        });
        swept.warned = self.suggest_and_warn(state, tick);
        if now.saturating_duration_since(self.last_forget) >= Duration::from_secs(60) {
            self.last_forget = now;
            let keep = FORGET_AFTER.max(self.after()).as_secs();
            state
                .strangers_mut()
                .forget_older_than(tick.earlier_by(keep));
        }
        swept
    }

    /// Marks every diverted entry that is unasked at `now` as seen.
    fn mark(&mut self, state: &Swapper, now: Tick) {
        let Some(snapshot) = state.current() else {
            return;
        };
        for d in snapshot.diverted() {
            // Whole-second ticks: an ask in tick T may have come up to a
            // second before tick T + after, so only more than `after` ticks
            // is surely `after` seconds (never too early; up to 2 s late).
            if d.last_asked.max(d.since).secs_until(now) <= self.after_secs {
                continue;
            }
            if let Some(f) = self.keys.get_mut(d.identity) {
                f.last_asked = d.last_asked;
                f.seen = self.sweeps;
                continue;
            }
            let finding = Finding {
                entry: d.entry,
                last_asked: d.last_asked,
                since: d.since,
                suggestion: None,
                seen: self.sweeps,
            };
            self.keys.insert(d.identity.into(), finding);
        }
    }

    /// Finds suggestions for keys without one yet, and warns about each.
    fn suggest_and_warn(&mut self, state: &Swapper, now: Tick) -> usize {
        let mut pending: Vec<(&str, &mut Finding)> = self
            .keys
            .iter_mut()
            .filter(|(_, f)| f.suggestion.is_none())
            .map(|(k, f)| (&**k, f))
            .collect();
        if pending.is_empty() {
            return 0;
        }
        pending.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let recent = now.earlier_by(u64::from(self.after_secs));
        let candidates = candidates(state, recent);
        let mut spent = 0;
        let mut warned = 0;
        for (identity, finding) in pending {
            if spent > 0 && spent + candidates.len() > SUGGEST_BUDGET {
                break;
            }
            spent += candidates.len().max(1);
            let suggestion = closest(identity.as_bytes(), &candidates);
            let last_asked = match finding.last_asked {
                Tick::NEVER => "never".to_owned(),
                t => format!("{}s ago", t.secs_until(now)),
            };
            warn!(
                identity = escape(identity.as_bytes(), 256),
                value = finding.entry.desired.to_string(),
                modify_index = finding.entry.modify_index,
                last_asked = last_asked,
                unasked_after_seconds = self.after_secs,
                did_you_mean = suggestion.as_deref().unwrap_or("none close");
                "diverted key unasked: no check asked for this identity, so the write changes nothing; is it the identity haproxy's agent-send sends?"
            );
            finding.suggestion = Some(suggestion);
            warned += 1;
        }
        warned
    }
}

/// An identity a check asked for recently, and whether it has a key.
struct Candidate<'a> {
    identity: &'a [u8],
    keyed: bool,
}

/// Every identity asked for since `recent`: keyed or not.
fn candidates(state: &Swapper, recent: Tick) -> Vec<Candidate<'_>> {
    let strangers = state
        .strangers()
        .iter()
        .filter(|(_, last)| *last >= recent)
        .map(|(identity, _)| Candidate {
            identity,
            keyed: false,
        });
    let keyed = state.current().into_iter().flat_map(move |s| {
        s.asked_since(recent).map(|(identity, _)| Candidate {
            identity: identity.as_bytes(),
            keyed: true,
        })
    });
    strangers.chain(keyed).collect()
}

/// The closest candidate within a small edit distance (a fifth of the
/// identity's length, 1 to 3): fewest edits first, then one without a key
/// (the server the key was meant for usually has none), then by name.
fn closest(identity: &[u8], candidates: &[Candidate<'_>]) -> Option<String> {
    let max = (identity.len() / 5).clamp(1, 3);
    let mut row = Vec::new();
    candidates
        .iter()
        .filter(|c| c.identity != identity)
        .filter_map(|c| {
            let d = edit_distance(identity, c.identity, max, &mut row)?;
            Some((d, c.keyed, c.identity))
        })
        .min()
        .map(|(_, _, id)| super::shown_identity(id))
}

/// Levenshtein distance between `a` and `b` if it is at most `max`
/// (bytes; insert, delete and substitute cost 1), computed in one row and
/// given up as soon as every cell of a row is past `max`. `row` is
/// scratch space, reused across calls.
pub fn edit_distance(a: &[u8], b: &[u8], max: usize, row: &mut Vec<usize>) -> Option<usize> {
    if a.len().abs_diff(b.len()) > max {
        return None;
    }
    row.clear();
    row.extend(0..=b.len());
    for (i, &ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        let mut best = row[0];
        for (j, &cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            let next = (diagonal + cost).min(row[j] + 1).min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
            best = best.min(next);
        }
        if best > max {
            return None;
        }
    }
    Some(row[b.len()]).filter(|&d| d <= max)
}

#[cfg(test)]
mod tests;
