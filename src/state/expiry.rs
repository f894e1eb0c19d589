//! Expiries: when a divert's reason runs out. The writers' `-for` puts
//! the time in the state key's consul `Flags` (Unix seconds; what is an
//! expiry is the KV contract's, [`crate::contract::expiry`]); the agent
//! shows it and never acts on it (an expired `drain` is still answered
//! `drain`: KV stays the source of truth). Its phases: `docs/LIFECYCLE.md`,
//! "Expiry count".
//!
//! - In: each state swapped in, and the loop's clock. Out: the diverted
//!   keys past their expiry (`state_expired_keys`), the nearest expiry
//!   still ahead (the one deadline the loop keeps for it), one warning per
//!   key when it expires (or is found expired).
//! - Nothing here runs per check; a state with no expiry (the usual case)
//!   costs no scan ([`Snapshot::expiring`]).
//! - A count is a resumable scan, a [`Slice`] of the loop's time per turn;
//!   a swap during a count counts again after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;

use super::{Snapshot, Swapper};
use crate::contract::Desired;
use crate::safe::escape;
use crate::slice::Slice;

/// The slice cost counted for a log line.
const LINE_COST: usize = 512;

/// What the monitoring shows of the last count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// Diverted keys past their expiry.
    pub expired: usize,
    /// The nearest expiry still ahead (Unix seconds).
    pub next: Option<u32>,
}

/// The expired keys, the nearest expiry, and the count in progress.
#[derive(Debug, Default)]
pub struct Expiry {
    /// Diverted keys past their expiry, as of the last count.
    expired: usize,
    /// The nearest expiry still ahead at the last count.
    next: Option<u32>,
    /// When to count again.
    due: Option<Instant>,
    /// A swap arrived during a count: count again after it.
    again: bool,
    /// The last count's time (Unix seconds) and state index: a key whose
    /// expiry passed since, or that was written since and is already
    /// past it, is warned about.
    last: (u64, u64),
    work: Option<Count>,
}

/// A count in progress.
#[derive(Debug)]
struct Count {
    state: Arc<Snapshot>,
    /// The count's time, Unix seconds.
    at: u64,
    pos: usize,
    expired: usize,
    next: Option<u32>,
}

impl Expiry {
    /// Diverted keys past their expiry.
    pub fn expired(&self) -> usize {
        self.expired
    }

    /// The nearest expiry still ahead (Unix seconds).
    pub fn next(&self) -> Option<u32> {
        self.next
    }

    pub fn shown(&self) -> Shown {
        Shown {
            expired: self.expired,
            next: self.next,
        }
    }

    /// When [`Expiry::step`] is due (`None`: nothing will expire).
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// A new state: count at once (after the count in progress, if any).
    pub fn soon(&mut self, now: Instant) {
        match self.work {
            Some(_) => self.again = true,
            None => self.due = Some(now),
        }
    }

    /// One slice of counting at `now` (`unix`: the same instant in Unix
    /// seconds); `true` when a count finished.
    pub fn step(&mut self, state: &Swapper, now: Instant, unix: u64, slice: &mut Slice) -> bool {
        let mut work = match self.work.take() {
            Some(w) => w,
            None => match state.shared() {
                Some(s) => Count {
                    state: s,
                    at: unix,
                    pos: 0,
                    expired: 0,
                    next: None,
                },
                None => {
                    self.due = None;
                    return false;
                }
            },
        };
        if !self.scan(&mut work, slice) {
            self.work = Some(work);
            self.due = Some(now);
            return false;
        }
        self.expired = work.expired;
        self.next = work.next;
        self.last = (work.at, work.state.index());
        let ahead = work.next.map(|t| u64::from(t).saturating_sub(unix).max(1));
        self.due = match std::mem::take(&mut self.again) {
            true => Some(now),
            false => ahead.map(|s| now + Duration::from_secs(s)),
        };
        true
    }

    /// Counts entries until the slice is spent; `true` once done.
    fn scan(&self, w: &mut Count, slice: &mut Slice) -> bool {
        if w.state.expiring() == 0 {
            return true;
        }
        let total = w.state.len();
        let state = Arc::clone(&w.state);
        let mut pos = w.pos;
        for (identity, e) in state.entries_from(&mut pos) {
            let expires = u64::from(e.expires);
            let diverted = e.desired.reply() != Desired::READY.reply();
            let cost = match (diverted && expires != 0, expires > w.at) {
                (false, _) => 0,
                (true, true) => {
                    w.next = Some(w.next.map_or(e.expires, |n| n.min(e.expires)));
                    0
                }
                // Newly past it since the last count, or written since.
                (true, false) => {
                    w.expired += 1;
                    let new = expires > self.last.0 || e.modify_index > self.last.1;
                    if new {
                        warn_expired(identity, e.desired, expires, w.at, e.modify_index);
                    }
                    usize::from(new) * LINE_COST
                }
            };
            if slice.spent(identity.len() + cost) {
                break;
            }
        }
        w.pos = pos;
        w.pos >= total
    }
}

fn warn_expired(identity: &str, d: Desired, expires: u64, at: u64, modify_index: u64) {
    let reply = String::from_utf8_lossy(d.reply()).trim_end().to_owned();
    warn!(
        identity = escape(identity.as_bytes(), 200),
        reply = reply,
        expired_unix_seconds = expires,
        expired_seconds_ago = at.saturating_sub(expires),
        modify_index = modify_index;
        "a divert is past its expiry (-for): still answered as KV says; undo it (unset) or set it again with a new -for"
    );
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::kv::KvPair;
    use crate::state::Clock;

    const T: u64 = 1_800_000_000;

    fn pair(identity: &str, value: &str, index: u64, flags: u64) -> KvPair {
        KvPair {
            key: format!("p/{identity}"),
            value: value.as_bytes().to_vec(),
            modify_index: index,
            flags,
        }
    }

    fn swapped(index: u64, pairs: Vec<KvPair>) -> (Swapper, Instant) {
        let t0 = Instant::now();
        let mut s = Swapper::new("p", Clock::new(t0, SystemTime::now()), 10);
        s.swap(Snapshot::build("p", index, pairs), t0);
        (s, t0)
    }

    /// Counts until done on a virtual clock of `items` entries a slice.
    fn count(e: &mut Expiry, s: &Swapper, now: Instant, unix: u64, items: u64) -> usize {
        let mut slices = 1;
        while !e.step(s, now, unix, &mut Slice::items(items)) {
            slices += 1;
        }
        slices
    }

    #[test]
    fn the_one_deadline_is_the_nearest_expiry_ahead_and_the_count_moves_on_it() {
        let (s, t0) = swapped(
            9,
            vec![
                pair("a", "drain", 5, T + 60),
                pair("b", "maint", 6, T + 600),
                pair("c", "drain", 7, T - 30),
                // Not diverted, or no expiry: never counted.
                pair("d", "ready", 8, T - 30),
                pair("e", "drain", 8, 0),
                pair("f", "drain", 8, 0x2ddc_cbc0_58a5_0c18),
            ],
        );
        let mut e = Expiry::default();
        assert_eq!(e.due(), None);
        e.soon(t0);
        assert_eq!(e.due(), Some(t0));
        count(&mut e, &s, t0, T, 1000);
        assert_eq!((e.expired(), e.next()), (1, Some((T + 60) as u32)));
        assert_eq!(e.due(), Some(t0 + Duration::from_secs(60)));
        let later = t0 + Duration::from_secs(60);
        count(&mut e, &s, later, T + 60, 1000);
        assert_eq!((e.expired(), e.next()), (2, Some((T + 600) as u32)));
        let end = t0 + Duration::from_secs(600);
        count(&mut e, &s, end, T + 600, 1000);
        assert_eq!((e.expired(), e.next(), e.due()), (3, None, None));
    }

    #[test]
    fn a_count_is_sliced_and_a_swap_during_it_counts_again_after() {
        let pairs = (0..100)
            .map(|i| pair(&format!("k{i}"), "drain", 5, T - 1))
            .collect();
        let (mut s, t0) = swapped(9, pairs);
        let mut e = Expiry::default();
        e.soon(t0);
        assert!(!e.step(&s, t0, T, &mut Slice::items(10)));
        assert_eq!(e.due(), Some(t0), "more to do: due at once");
        s.swap(
            Snapshot::build("p", 10, vec![pair("k0", "drain", 10, T - 1)]),
            t0,
        );
        e.soon(t0);
        assert!(count(&mut e, &s, t0, T, 10) >= 9, "ten entries a slice");
        assert_eq!(e.expired(), 100, "the count in progress finishes first");
        assert_eq!(e.due(), Some(t0), "and the swap's count is due at once");
        count(&mut e, &s, t0, T, 10);
        assert_eq!((e.expired(), e.due()), (1, None));
    }

    #[test]
    fn a_state_without_expiries_costs_no_scan() {
        let pairs = (0..1000)
            .map(|i| pair(&format!("k{i}"), "drain", 5, 0))
            .collect();
        let (s, t0) = swapped(9, pairs);
        let mut e = Expiry::default();
        e.soon(t0);
        assert!(e.step(&s, t0, T, &mut Slice::items(1)), "done in one item");
        assert_eq!((e.expired(), e.due()), (0, None));
    }
}
