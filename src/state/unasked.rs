//! Unasked diverted keys: a key whose reply is not `ready 100%` and that
//! no check asked for within `-unasked-after` (counted from the later of
//! its write, as this agent saw it, and the agent's start). Almost always a
//! key written for an identity haproxy does not send (`be_web/srv01` while
//! `agent-send` says `be_web/srv1`): the write changed nothing. A sweep is a
//! resumable machine (`Mark`, `Clear`, `Gather`, `Suggest`: `docs/LIFECYCLE.md`,
//! "Unasked sweep"), a [`Slice`] of the loop's time per turn, its phase
//! changes traced in `Unasked::advance`.
//!
//! - In: the state and its asks ([`Swapper`]), swept every few seconds.
//!   Out: the keys unasked now, each with the closest identity this
//!   haproxy asks for (when one is close), and one warning per key when it
//!   becomes unasked.
//! - A sweep looks at the diverted entries only; 20,000 unasked keys and
//!   20,000 asked identities never stall an answer.
//! - A key keeps its suggestion while it stays unasked (a swap never redoes
//!   it); it stops being unasked when it is asked, rewritten, deleted or
//!   made `ready 100%`, and is warned about again only if it becomes
//!   unasked again.
//! - Suggestions look only at candidates of a close length whose byte sets
//!   differ by at most two bytes an edit (a 128-bit mask, one XOR and a
//!   popcount): most candidates cost a few nanoseconds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};

use super::{Clock, Entry, Snapshot, Strangers, Swapper, Tick};
use crate::safe::escape;
use crate::slice::Slice;

/// Asked identities without a key are forgotten after this long without
/// an ask (or `-unasked-after`, if longer), at most once a minute.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// The slice cost counted for a log line.
const LINE_COST: usize = 512;

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
    /// `None` until a sweep had the time to look; then the closest asked
    /// identity, if one is close.
    pub suggestion: Option<Option<String>>,
    /// The sweep that last found it unasked.
    seen: u64,
}

/// What one step of a sweep did, for tests and metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Keys that became unasked and were warned about.
    pub warned: usize,
    /// Keys no longer unasked.
    pub cleared: usize,
}

/// The unasked keys, the sweep in progress, and when to sweep again.
#[derive(Debug)]
pub struct Unasked {
    after_secs: u32,
    period: Duration,
    next: Instant,
    /// A swap asked for a sweep while one was in progress: sweep again at
    /// once after it.
    again: bool,
    last_forget: Instant,
    keys: HashMap<Box<str>, Finding>,
    sweeps: u64,
    work: Option<Sweep>,
}

/// A sweep in progress (see the module's table).
#[derive(Debug)]
enum Sweep {
    Mark {
        state: Arc<Snapshot>,
        tick: Tick,
        pos: usize,
        /// Keys found unasked that have no suggestion yet.
        pending: Vec<Box<str>>,
    },
    Clear {
        tick: Tick,
        stale: Vec<Box<str>>,
        pending: Vec<Box<str>>,
    },
    Gather(Gather),
    Suggest {
        tick: Tick,
        index: Index,
        pending: Vec<Box<str>>,
        search: Search,
    },
}

impl Sweep {
    fn name(&self) -> &'static str {
        match self {
            Sweep::Mark { .. } => "mark",
            Sweep::Clear { .. } => "clear",
            Sweep::Gather(_) => "gather",
            Sweep::Suggest { .. } => "suggest",
        }
    }
}

/// The `Gather` phase's progress.
#[derive(Debug)]
struct Gather {
    state: Arc<Snapshot>,
    tick: Tick,
    /// Past the state's entries, now in the strangers.
    in_strangers: bool,
    pos: usize,
    index: Index,
    pending: Vec<Box<str>>,
}

impl Unasked {
    pub fn new(after: Duration, now: Instant) -> Unasked {
        let period = (after / 4).clamp(Duration::from_secs(1), Duration::from_secs(5));
        Unasked {
            after_secs: u32::try_from(after.as_secs()).unwrap_or(u32::MAX).max(1),
            period,
            next: now + period,
            again: false,
            last_forget: now,
            keys: HashMap::new(),
            sweeps: 0,
            work: None,
        }
    }

    /// When the next step is due (at once while a sweep is in progress).
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

    /// The unasked keys, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Finding)> {
        self.keys.iter().map(|(k, f)| (&**k, f))
    }

    /// Sweeps as soon as the state allows (after a swap: the unasked keys
    /// it changed are seen at once, not a period later).
    pub fn soon(&mut self, now: Instant) {
        if self.work.is_some() {
            self.again = true;
        } else {
            self.next = self.next.min(now);
        }
    }

    /// One slice of sweeping: starts a sweep when due (it waits while a
    /// swap's asks are still being carried over: the loop is busy then,
    /// so it comes back at once), and goes on until the slice is spent.
    pub fn step(&mut self, state: &mut Swapper, now: Instant, slice: &mut Slice) -> Swept {
        let mut swept = Swept::default();
        loop {
            let work = match self.work.take() {
                Some(work) => work,
                None => match self.start(state, now) {
                    Some(work) => work,
                    None => return swept,
                },
            };
            self.work = self.advance(work, state, slice, &mut swept);
            if self.work.is_none() {
                self.finish(state, now);
                return swept;
            }
            if slice.is_over() {
                self.next = now;
                return swept;
            }
        }
    }

    /// A new sweep of the current state, unless its asks are still being
    /// carried over.
    fn start(&mut self, state: &Swapper, now: Instant) -> Option<Sweep> {
        let current = state.shared()?;
        if state.carrying_from().is_some() {
            self.next = now;
            return None;
        }
        self.sweeps += 1;
        Some(Sweep::Mark {
            state: current,
            tick: state.clock().tick(now),
            pos: 0,
            pending: Vec::new(),
        })
    }

    /// A sweep ended: forget old strangers (at most once a minute), and
    /// plan the next.
    fn finish(&mut self, state: &mut Swapper, now: Instant) {
        self.next = if std::mem::take(&mut self.again) {
            now
        } else {
            now + self.period
        };
        if now.saturating_duration_since(self.last_forget) >= Duration::from_secs(60) {
            self.last_forget = now;
            let keep = FORGET_AFTER.max(self.after()).as_secs();
            let tick = state.clock().tick(now);
            state
                .strangers_mut()
                .forget_older_than(tick.earlier_by(keep));
        }
    }

    /// Works on a sweep until the slice is spent or the phase ends; the
    /// sweep left, `None` once done. Each phase is its own function (the
    /// module's table), which returns the sweep to resume with.
    fn advance(
        &mut self,
        work: Sweep,
        state: &Swapper,
        slice: &mut Slice,
        swept: &mut Swept,
    ) -> Option<Sweep> {
        let from = work.name();
        let next = match work {
            Sweep::Mark {
                state: marking,
                tick,
                pos,
                pending,
            } => self.marking(marking, tick, pos, pending, state, slice),
            Sweep::Clear {
                tick,
                stale,
                pending,
            } => self.clearing(tick, stale, pending, state, slice, swept),
            Sweep::Gather(g) => Some(g.gathering(state.strangers(), self.after_secs, slice)),
            Sweep::Suggest {
                tick,
                index,
                pending,
                search,
            } => self.suggesting(tick, index, pending, search, slice, swept),
        };
        // The one place a sweep's phase changes, traced.
        let to = next.as_ref().map_or("done", Sweep::name);
        if to != from {
            log::trace!(from, to; "unasked sweep phase");
        }
        next
    }

    /// `Mark`: marks the diverted entries of `marking` (while it is still
    /// the current state), then lists the keys not seen for `Clear`.
    fn marking(
        &mut self,
        marking: Arc<Snapshot>,
        tick: Tick,
        mut pos: usize,
        mut pending: Vec<Box<str>>,
        state: &Swapper,
        slice: &mut Slice,
    ) -> Option<Sweep> {
        if !state.shared().is_some_and(|s| Arc::ptr_eq(&s, &marking)) {
            // A swap replaced the state being marked: sweep anew,
            // once its asks are carried over.
            self.again = true;
            return None;
        }
        if !self.mark(&marking, tick, &mut pos, &mut pending, slice) {
            return Some(Sweep::Mark {
                state: marking,
                tick,
                pos,
                pending,
            });
        }
        let sweep = self.sweeps;
        let stale = self
            .keys
            .iter()
            .filter(|(_, f)| f.seen != sweep)
            .map(|(k, _)| k.clone())
            .collect();
        Some(Sweep::Clear {
            tick,
            stale,
            pending,
        })
    }

    /// `Clear`: forgets (and logs) the keys not seen; then `Gather` when a
    /// key waits for a suggestion.
    fn clearing(
        &mut self,
        tick: Tick,
        mut stale: Vec<Box<str>>,
        pending: Vec<Box<str>>,
        state: &Swapper,
        slice: &mut Slice,
        swept: &mut Swept,
    ) -> Option<Sweep> {
        while let Some(identity) = stale.pop() {
            if self
                .keys
                .remove(&identity)
                .is_some_and(|f| f.suggestion.is_some())
            {
                swept.cleared += 1;
                info!(identity = escape(identity.as_bytes(), 256); "a key reported unasked no longer is (asked, rewritten, deleted or made ready)");
            }
            if slice.spent(LINE_COST) {
                break;
            }
        }
        match (stale.is_empty(), pending.is_empty()) {
            (false, _) => Some(Sweep::Clear {
                tick,
                stale,
                pending,
            }),
            (true, true) => None,
            (true, false) => Some(Sweep::Gather(Gather {
                state: state.shared()?,
                tick,
                in_strangers: false,
                pos: 0,
                index: Index::default(),
                pending,
            })),
        }
    }

    /// `Suggest`: the closest candidate for each key waiting, then its
    /// warning; done once none waits.
    fn suggesting(
        &mut self,
        tick: Tick,
        index: Index,
        mut pending: Vec<Box<str>>,
        mut search: Search,
        slice: &mut Slice,
        swept: &mut Swept,
    ) -> Option<Sweep> {
        while let Some(identity) = pending.last() {
            let Some(suggestion) = search.run(identity.as_bytes(), &index, slice) else {
                break;
            };
            let identity = pending.pop().unwrap_or_default();
            if self.suggest(&identity, suggestion, tick) {
                swept.warned += 1;
            }
            search = Search::default();
            if slice.spent(LINE_COST) {
                break;
            }
        }
        (!pending.is_empty()).then_some(Sweep::Suggest {
            tick,
            index,
            pending,
            search,
        })
    }

    /// Marks diverted entries unasked at `now` as seen, from `pos`, until
    /// the slice is spent; `true` once all are marked.
    fn mark(
        &mut self,
        snapshot: &Snapshot,
        now: Tick,
        pos: &mut usize,
        pending: &mut Vec<Box<str>>,
        slice: &mut Slice,
    ) -> bool {
        for d in snapshot.diverted_from(pos) {
            // Whole-second ticks: an ask in tick T may have come up to a
            // second before tick T + after, so only more than `after` ticks
            // is surely `after` seconds (never too early; up to 2 s late).
            if d.last_asked.max(d.since).secs_until(now) > self.after_secs {
                let finding = self.keys.entry(d.identity.into()).or_insert(Finding {
                    entry: d.entry,
                    last_asked: d.last_asked,
                    since: d.since,
                    suggestion: None,
                    seen: 0,
                });
                finding.last_asked = d.last_asked;
                finding.seen = self.sweeps;
                if finding.suggestion.is_none() {
                    pending.push(d.identity.into());
                }
            }
            if slice.spent(d.identity.len()) {
                break;
            }
        }
        *pos >= snapshot.len()
    }

    /// Gives a key its suggestion and warns about it, once; `false` if
    /// the key is gone (cleared meanwhile) or had one already.
    fn suggest(&mut self, identity: &str, suggestion: Option<String>, now: Tick) -> bool {
        let Some(finding) = self.keys.get_mut(identity) else {
            return false;
        };
        if finding.suggestion.is_some() {
            return false;
        }
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
        true
    }
}

impl Gather {
    /// `Gather`: indexes the identities asked within the window
    /// (`after_secs`), then `Suggest`.
    fn gathering(mut self, strangers: &Strangers, after_secs: u32, slice: &mut Slice) -> Sweep {
        let recent = self.tick.earlier_by(u64::from(after_secs));
        if !gather(
            &self.state,
            strangers,
            recent,
            (&mut self.in_strangers, &mut self.pos),
            &mut self.index,
            slice,
        ) {
            return Sweep::Gather(self);
        }
        Sweep::Suggest {
            tick: self.tick,
            index: self.index,
            pending: self.pending,
            search: Search::default(),
        }
    }
}

/// Copies the identities asked since `recent` (the state's keyed ones,
/// then the strangers) into `index`, from `at`, until the slice is spent;
/// `true` once all are in. The strangers may change between slices (new
/// asks): a candidate then missed or seen twice only shifts a suggestion.
fn gather(
    state: &Snapshot,
    strangers: &Strangers,
    recent: Tick,
    (in_strangers, pos): (&mut bool, &mut usize),
    index: &mut Index,
    slice: &mut Slice,
) -> bool {
    if !*in_strangers {
        for (identity, last) in state.asks_from(pos) {
            if last >= recent && !last.is_never() {
                index.add(identity.as_bytes(), true);
            }
            if slice.spent(identity.len()) {
                return false;
            }
        }
        *in_strangers = true;
        *pos = 0;
    }
    for (identity, last) in strangers.iter().skip(*pos) {
        *pos += 1;
        if last >= recent && Strangers::is_whole(identity) {
            index.add(identity, false);
        }
        if slice.spent(identity.len()) {
            return *pos >= strangers.len();
        }
    }
    true
}

/// The candidates for suggestions, by length.
#[derive(Debug, Default)]
struct Index {
    candidates: Vec<Candidate>,
    /// Candidate numbers by identity length.
    by_len: HashMap<usize, Vec<u32>>,
}

/// An identity a check asked for recently, and whether it has a key.
#[derive(Debug)]
struct Candidate {
    identity: Box<[u8]>,
    keyed: bool,
    /// Which bytes (mod 128) it holds.
    bytes: u128,
}

impl Index {
    fn add(&mut self, identity: &[u8], keyed: bool) {
        let Ok(n) = u32::try_from(self.candidates.len()) else {
            return;
        };
        self.by_len.entry(identity.len()).or_default().push(n);
        self.candidates.push(Candidate {
            identity: identity.into(),
            keyed,
            bytes: byte_set(identity),
        });
    }
}

/// The bytes (mod 128) an identity holds: an edit changes at most two of
/// them, so two identities whose sets differ by more than `2 × max` are
/// more than `max` edits apart.
fn byte_set(identity: &[u8]) -> u128 {
    identity.iter().fold(0, |set, b| set | 1 << (b & 127))
}

/// The search for one key's closest candidate, resumable: the length
/// being looked at (as an offset from the shortest), the position in it,
/// and the best so far: (edits, keyed, candidate).
#[derive(Debug, Default)]
struct Search {
    len_step: usize,
    pos: usize,
    best: Option<(usize, bool, u32)>,
    row: Vec<usize>,
}

impl Search {
    /// Looks on until the slice is spent (`None`: more to do) or every
    /// candidate of a close length was looked at (`Some`: the closest
    /// within a fifth of the identity's length, 1 to 3 edits: fewest edits
    /// first, then one without a key (the server the key was meant for
    /// usually has none), then by name).
    fn run(&mut self, identity: &[u8], index: &Index, slice: &mut Slice) -> Option<Option<String>> {
        let max = (identity.len() / 5).clamp(1, 3);
        let set = byte_set(identity);
        let shortest = identity.len().saturating_sub(max);
        while shortest + self.len_step <= identity.len() + max {
            let bucket = index
                .by_len
                .get(&(shortest + self.len_step))
                .map_or(&[][..], |b| &b[..]);
            while let Some(&n) = bucket.get(self.pos) {
                self.pos += 1;
                let c = &index.candidates[n as usize];
                let mut cost = 1;
                if (c.bytes ^ set).count_ones() as usize <= 2 * max && *c.identity != *identity {
                    cost = identity.len() * c.identity.len() / 8 + 1;
                    if let Some(d) = edit_distance(identity, &c.identity, max, &mut self.row) {
                        let closer = self.best.is_none_or(|(bd, bk, bn)| {
                            let best = &index.candidates[bn as usize].identity;
                            (d, c.keyed, &c.identity) < (bd, bk, best)
                        });
                        if closer {
                            self.best = Some((d, c.keyed, n));
                        }
                    }
                }
                if slice.spent(cost) {
                    return None;
                }
            }
            self.len_step += 1;
            self.pos = 0;
        }
        let best = self
            .best
            .map(|(_, _, n)| &index.candidates[n as usize].identity);
        Some(best.map(|id| super::shown_identity(id)))
    }
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
