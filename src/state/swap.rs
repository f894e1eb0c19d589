//! The state the agent answers from, swapped whole, and the old one
//! retired a slice at a time.
//!
//! In: each new [`Snapshot`] (from a complete consul read). Out: the
//! current snapshot, at once; the log lines of what changed (invalid keys
//! at the swap, per-key changes slice by slice) and, for the metrics, what
//! each step found.
//!
//! Always holds:
//! - the new state answers from the swap on;
//! - the old one is compared (for the change log) and then freed in slices
//!   of the loop's time ([`Slice`]), so a 100,000-key swap never stalls the
//!   loop;
//! - a swap arriving while the last is still being retired queues behind it
//!   (never finished in one turn), and the queue is worked in order, so
//!   every change is logged once and against the state it replaced.
//!
//! It also answers: [`Swapper::answer`] is the hot path, which records
//! when each identity was asked (in the current snapshot's slot, or in the
//! set of identities without a key), and the retirement carries those asks
//! over to the new state, so they survive every swap.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use log::{debug, info, warn};

use super::{
    Change, ChangeScan, Clock, Entry, Graveyard, InvalidKey, InvalidReason, Snapshot, Strangers,
};
use crate::contract::Desired;
use crate::safe::escape;
use crate::slice::Slice;

/// Where the current state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A complete consul read.
    Consul,
    /// The state file, written at that time (until consul answers).
    File { written: SystemTime },
}

/// The current state and the retirement of the ones before it.
///
/// States are shared (`Arc`) so that the state file's writer thread can
/// serialize one while the loop answers from it; a retired state the
/// writer still holds is freed by the writer, off the loop.
#[derive(Debug)]
pub struct Swapper {
    /// The KV prefix, to name identities in log lines.
    prefix: String,
    clock: Clock,
    /// Asked identities without a key in the current state.
    strangers: Strangers,
    current: Option<Arc<Snapshot>>,
    source: Option<Source>,
    /// States replaced and not yet compared with their successor, oldest
    /// first: (old, the state that replaced it, the scan).
    retiring: VecDeque<Retiring>,
    /// States compared, being freed, oldest first.
    graveyard: VecDeque<Graveyard>,
    /// New states whose invalid keys are being compared, oldest first.
    invalid: VecDeque<InvalidScan>,
}

/// A replaced state whose changes are being logged and whose asks are
/// being carried over to the state that replaced it.
#[derive(Debug)]
struct Retiring {
    old: Arc<Snapshot>,
    new: Arc<Snapshot>,
    scan: ChangeScan,
}

/// The invalid keys of a new state compared with those of the state
/// before it, a slice at a time: each new (or rewritten) one is warned
/// about once and its reason counted. The old keys' fingerprints are
/// hashed first, then the new keys looked up.
#[derive(Debug)]
struct InvalidScan {
    new: Arc<Snapshot>,
    old: Option<Arc<Snapshot>>,
    seen: HashSet<u64>,
    /// Past the old keys, now in the new ones.
    in_new: bool,
    pos: usize,
}

/// What a swap found, for the metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swapped {
    /// The first state from consul: answering starts now, or goes on
    /// from consul instead of the state file.
    pub first: bool,
}

/// What a slice of [`Swapper::step`] found, for the metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Retired {
    /// Entries that changed (each logged).
    pub changes: usize,
    /// Why each newly invalid key was dropped (one per key, each logged).
    pub invalid: Vec<InvalidReason>,
}

impl Retired {
    /// Whether the state visibly changed (the `last_change` metric).
    pub fn changed(&self) -> bool {
        self.changes > 0 || !self.invalid.is_empty()
    }
}

impl Swapper {
    /// `max_strangers` bounds the set of asked identities without a key.
    pub fn new(prefix: &str, clock: Clock, max_strangers: usize) -> Swapper {
        Swapper {
            prefix: prefix.to_owned(),
            clock,
            strangers: Strangers::new(max_strangers),
            current: None,
            source: None,
            retiring: VecDeque::new(),
            graveyard: VecDeque::new(),
            invalid: VecDeque::new(),
        }
    }

    /// The hot path: the desired state for a check of `identity` at `now`,
    /// and the ask recorded; `None` before there is a state to answer from.
    pub fn answer(&mut self, identity: &[u8], now: Instant) -> Option<Desired> {
        let snapshot = self.current.as_deref()?;
        let now = self.clock.tick(now);
        Some(snapshot.answer(identity, now).unwrap_or_else(|| {
            self.strangers.record(identity, now);
            Desired::READY
        }))
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Asked identities without a key.
    pub fn strangers(&self) -> &Strangers {
        &self.strangers
    }

    pub fn strangers_mut(&mut self) -> &mut Strangers {
        &mut self.strangers
    }

    /// The state answered from (`None` until a first complete read, or
    /// a state file, gave one).
    pub fn current(&self) -> Option<&Snapshot> {
        self.current.as_deref()
    }

    /// The state answered from, shared (for the state file's writer).
    pub fn shared(&self) -> Option<Arc<Snapshot>> {
        self.current.clone()
    }

    pub fn source(&self) -> Option<Source> {
        self.source
    }

    /// Answers from a state file's snapshot, before any consul read: the
    /// first complete read replaces it (with a change log, as any swap).
    pub fn load(&mut self, mut snapshot: Snapshot, written: SystemTime, now: Instant) {
        if self.current.is_none() {
            snapshot.set_born(self.clock.tick(now));
            self.current = Some(Arc::new(snapshot));
            self.source = Some(Source::File { written });
        }
    }

    /// Frees a state never answered from (the state file, when consul
    /// answered first) a slice per [`Swapper::step`], as a retired one.
    pub fn discard(&mut self, unused: Snapshot) {
        self.graveyard.push_back(unused.into_graveyard());
    }

    /// The state whose asks are still being carried over to the current
    /// one, while they are (a new entry's last ask and `since` are not
    /// final until then).
    pub fn carrying_from(&self) -> Option<&Snapshot> {
        self.retiring.back().map(|r| &*r.old)
    }

    /// Whether an old state is still being compared or freed: the loop
    /// calls [`Swapper::step`] every turn until it is not.
    pub fn busy(&self) -> bool {
        !self.retiring.is_empty() || !self.graveyard.is_empty() || !self.invalid.is_empty()
    }

    /// Answers from `new` at once (from `now`), logs the keys it newly
    /// drops, and queues the state it replaces for retirement (behind any
    /// still being retired: never finished here, in one turn).
    pub fn swap(&mut self, mut new: Snapshot, now: Instant) -> Swapped {
        debug!(index = new.index(), keys = new.len(); "state swapped");
        let (keys, invalid_keys, index) = (new.len(), new.invalid().len(), new.index());
        let from_file = matches!(self.source, Some(Source::File { .. }));
        self.source = Some(Source::Consul);
        new.set_born(self.clock.tick(now));
        let new = Arc::new(new);
        self.invalid.push_back(InvalidScan {
            new: Arc::clone(&new),
            old: self.current.clone(),
            seen: HashSet::new(),
            in_new: false,
            pos: 0,
        });
        let first = match self.current.replace(Arc::clone(&new)) {
            None => {
                info!(keys = keys, invalid = invalid_keys, index = index; "first consul read complete: answering");
                true
            }
            Some(old) => {
                if from_file {
                    info!(keys = keys, invalid = invalid_keys, index = index; "first consul read complete: replacing the state from the state file (its differences follow as state changes)");
                }
                self.retiring.push_back(Retiring {
                    old,
                    new,
                    scan: ChangeScan::default(),
                });
                from_file
            }
        };
        Swapped { first }
    }

    /// One slice of retiring the replaced states, oldest first: warn about
    /// new invalid keys, log the changes (carrying the asks over), then
    /// free the old states, until the slice is spent.
    pub fn step(&mut self, slice: &mut Slice) -> Retired {
        let mut retired = Retired::default();
        while let Some(scan) = self.invalid.front_mut() {
            if !scan.step(&self.prefix, slice, &mut retired.invalid) {
                return retired;
            }
            self.invalid.pop_front();
            if slice.is_over() {
                return retired;
            }
        }
        let logged = &mut retired.changes;
        while let Some(r) = self.retiring.front_mut() {
            let index = r.new.index();
            // Each change is logged as found, inside the slice's time.
            let mut emit = |c: Change<'_>| {
                let show = |e: Option<Entry>| {
                    e.map_or_else(|| "absent".to_owned(), |e| e.desired.to_string())
                };
                // A delete has no ModifyIndex of its own: the state's.
                let index = c.new.map_or(index, |e| e.modify_index);
                info!(identity = escape(c.identity.as_bytes(), 256), old = show(c.old), new = show(c.new), index = index; "state change");
                *logged += 1;
            };
            let done = r
                .scan
                .step(&r.new, &r.old, slice, &mut emit, Some(&mut self.strangers));
            if !done {
                return retired;
            }
            // Shared with the state file's writer: then it frees it.
            if let Some(Ok(old)) = self.retiring.pop_front().map(|r| Arc::try_unwrap(r.old)) {
                self.graveyard.push_back(old.into_graveyard());
            }
            if slice.is_over() {
                return retired;
            }
        }
        while let Some(g) = self.graveyard.front_mut() {
            if !g.free(slice) {
                break;
            }
            self.graveyard.pop_front();
        }
        retired
    }
}

impl InvalidScan {
    /// Until the slice is spent: `true` once every new invalid key is
    /// looked at (the new ones warned about, their reasons in `found`).
    fn step(&mut self, prefix: &str, slice: &mut Slice, found: &mut Vec<InvalidReason>) -> bool {
        let hash = |k: &InvalidKey| {
            let mut h = std::hash::DefaultHasher::new();
            k.fingerprint().hash(&mut h);
            h.finish()
        };
        if !self.in_new {
            let old = self.old.as_deref().map_or(&[][..], |o| o.invalid());
            while let Some(k) = old.get(self.pos) {
                self.pos += 1;
                self.seen.insert(hash(k));
                if slice.spent(k.key.len() + k.value.len()) {
                    return false;
                }
            }
            (self.in_new, self.pos) = (true, 0);
        }
        while let Some(k) = self.new.invalid().get(self.pos) {
            self.pos += 1;
            let mut cost = k.key.len();
            if !self.seen.contains(&hash(k)) {
                // The identity, as the change lines name it; the full key too.
                let identity = k
                    .key
                    .strip_prefix(prefix)
                    .and_then(|r| r.strip_prefix('/'))
                    .unwrap_or(&k.key);
                warn!(identity = escape(identity.as_bytes(), 256), key = escape(k.key.as_bytes(), 256), value = escape(k.value.as_bytes(), 128), reason = k.reason.label(), index = k.modify_index;
                    "invalid KV entry dropped: answered as if absent (ready 100%)");
                found.push(k.reason);
                cost += 512;
            }
            if slice.spent(cost) {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Desired;

    const PREFIX: &str = "p";

    fn swapper() -> Swapper {
        Swapper::new(PREFIX, Clock::new(Instant::now(), SystemTime::now()), 16)
    }

    fn snapshot(index: u64, pairs: &[(&str, &str)]) -> Snapshot {
        crate::state::test_snapshot(PREFIX, index, pairs)
    }

    fn reply(s: &Swapper, identity: &str) -> Option<&'static [u8]> {
        s.current().map(|c| c.reply(identity.as_bytes()))
    }

    #[test]
    fn nothing_to_answer_before_the_first_swap() {
        let mut s = swapper();
        assert!(s.current().is_none());
        assert!(!s.busy());
        assert_eq!(s.step(&mut Slice::items(10)), Retired::default());
        let swapped = s.swap(snapshot(1, &[("b/a", "drain")]), Instant::now());
        assert_eq!(swapped, Swapped { first: true });
        assert_eq!(reply(&s, "b/a"), Some(Desired::DRAIN.reply()));
        // Its invalid keys (none) are looked at; nothing to retire.
        assert_eq!(s.step(&mut Slice::unlimited()), Retired::default());
        assert!(!s.busy(), "a first state retires nothing");
    }

    #[test]
    fn the_new_state_answers_at_once_and_the_old_retires_in_slices() {
        let mut s = swapper();
        let old: Vec<(String, &str)> = (0..10).map(|i| (format!("b/s{i}"), "drain")).collect();
        let old: Vec<(&str, &str)> = old.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        s.swap(snapshot(1, &old), Instant::now());
        let drained = reply(&s, "b/s0").unwrap();
        // Everything becomes ready: ten changes (removals).
        let swapped = s.swap(snapshot(2, &[]), Instant::now());
        assert!(!swapped.first);
        assert_ne!(
            reply(&s, "b/s0").unwrap(),
            drained,
            "answers from the new state"
        );
        assert!(s.busy());
        let mut logged = 0;
        let mut steps = 0;
        while s.busy() {
            logged += s.step(&mut Slice::items(3)).changes;
            steps += 1;
            assert!(steps < 20, "retiring must end");
        }
        assert_eq!(logged, 10);
        assert!(steps >= 7, "3 entries a slice: 10 compared, then 10 freed");
    }

    /// Every step until idle, a few items a slice: the invalid reasons
    /// found, and the slices taken.
    fn retire(s: &mut Swapper, items: u64) -> (Vec<&'static str>, usize) {
        let (mut found, mut slices) = (Vec::new(), 0);
        while s.busy() {
            found.extend(s.step(&mut Slice::items(items)).invalid);
            slices += 1;
        }
        found.sort_by_key(|r| r.index());
        (found.iter().map(|r| r.label()).collect(), slices)
    }

    #[test]
    fn invalid_keys_are_reported_once_a_slice_at_a_time() {
        let mut s = swapper();
        s.swap(
            snapshot(1, &[("b/a", "up"), ("b/b", "999%")]),
            Instant::now(),
        );
        // Not at the swap (no unbounded work in its turn): in the slices.
        let (found, slices) = retire(&mut s, 1);
        assert_eq!(found, ["health_word", "out_of_range"]);
        assert!(slices >= 2, "{slices}");
        // The same invalid keys again: nothing new.
        s.swap(
            snapshot(1, &[("b/a", "up"), ("b/b", "999%")]),
            Instant::now(),
        );
        assert!(retire(&mut s, 1).0.is_empty());
        // One of them rewritten: reported again.
        s.swap(
            snapshot(1, &[("b/a", "down"), ("b/b", "999%")]),
            Instant::now(),
        );
        assert_eq!(retire(&mut s, 1).0, ["health_word"]);
        // 20,000 keys made invalid: found over many slices.
        let bad: Vec<(String, &str)> = (0..20_000).map(|i| (format!("b/k{i}"), "up")).collect();
        let bad: Vec<(&str, &str)> = bad.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        s.swap(snapshot(2, &bad), Instant::now());
        let (found, slices) = retire(&mut s, 1000);
        assert_eq!(found.len(), 20_000);
        assert!(slices > 20, "{slices}");
    }

    #[test]
    fn a_loaded_file_answers_until_the_first_consul_read_replaces_it() {
        let mut s = swapper();
        let written = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        s.load(
            snapshot(5, &[("b/a", "drain"), ("b/b", "maint")]),
            written,
            Instant::now(),
        );
        assert_eq!(s.source(), Some(Source::File { written }));
        assert_eq!(reply(&s, "b/a"), Some(Desired::DRAIN.reply()));
        let swapped = s.swap(snapshot(6, &[("b/a", "drain")]), Instant::now());
        assert!(swapped.first, "consul takes over");
        assert_eq!(s.source(), Some(Source::Consul));
        // b/b: maint -> absent; b/a: a new ModifyIndex.
        assert_eq!(
            s.step(&mut Slice::unlimited()).changes,
            2,
            "the difference is logged"
        );
        // A file never replaces a state that is already there.
        s.load(snapshot(1, &[]), written, Instant::now());
        assert_eq!(s.current().unwrap().index(), 6);
    }

    #[test]
    fn a_discarded_state_is_freed_in_slices_and_never_answered() {
        let mut s = swapper();
        s.swap(snapshot(7, &[("b/a", "maint")]), Instant::now());
        let file: Vec<(String, &str)> = (0..10).map(|i| (format!("b/s{i}"), "drain")).collect();
        let file: Vec<(&str, &str)> = file.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        s.discard(snapshot(5, &file));
        assert!(s.busy());
        assert_eq!(s.current().unwrap().index(), 7);
        assert_eq!(reply(&s, "b/s0"), Some(Desired::READY.reply()));
        let mut steps = 0;
        while s.busy() {
            assert_eq!(
                s.step(&mut Slice::items(3)).changes,
                0,
                "no change logged: never answered"
            );
            steps += 1;
        }
        assert_eq!(steps, 4, "10 entries, 3 a slice");
        assert_eq!(s.source(), Some(Source::Consul));
    }

    #[test]
    fn a_state_the_writer_still_holds_is_not_freed_here() {
        let mut s = swapper();
        s.swap(snapshot(1, &[("b/a", "drain")]), Instant::now());
        let held = s.shared().unwrap();
        s.swap(snapshot(2, &[]), Instant::now());
        while s.busy() {
            s.step(&mut Slice::unlimited());
        }
        assert_eq!(held.index(), 1, "still readable by its holder");
        assert_eq!(Arc::strong_count(&held), 1);
    }

    #[test]
    fn a_swap_while_retiring_logs_the_last_change_first() {
        let mut s = swapper();
        s.swap(snapshot(1, &[("b/a", "drain")]), Instant::now());
        s.swap(snapshot(2, &[("b/a", "maint")]), Instant::now());
        assert!(s.busy());
        // The next swap queues behind the previous retirement: the swap
        // itself retires nothing (no unbounded work in one turn).
        s.swap(snapshot(3, &[("b/a", "ready")]), Instant::now());
        assert_eq!(s.current().unwrap().index(), 3);
        assert_eq!(s.retiring.len(), 2);
        // Oldest first: drain -> maint against state 1, then maint ->
        // ready against state 2, each logged once.
        assert_eq!(s.step(&mut Slice::items(1)).changes, 1, "drain -> maint");
        assert_eq!(s.step(&mut Slice::unlimited()).changes, 1, "maint -> ready");
        assert!(!s.busy());
    }
}
