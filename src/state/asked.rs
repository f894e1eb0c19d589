//! Who asks for what: when a check last asked for each identity.
//!
//! In: every answered check (identity, time). Out: per identity with a key,
//! its last ask, in the snapshot slot ([`Asks`]); per identity without one,
//! its last ask in a bounded set ([`Strangers`]); the time arithmetic both
//! share ([`Clock`], [`Tick`]).
//!
//! Always holds:
//! - recording an ask for a keyed identity is one relaxed store into the
//!   slot the lookup already found, and allocates nothing;
//! - an identity without a key allocates once, the first time it is asked,
//!   and never past the set's bound (asks beyond it are counted, not
//!   recorded);
//! - the set's hasher is randomly seeded, because its keys come from
//!   whoever can reach the agent port.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// A whole second of the agent's life: seconds since its start, plus one,
/// so that `Tick::NEVER` (0) can mean "never asked". Good for 68 years (the
/// top bit of a slot's last ask is its `Asks::asked_since_write`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(u32);

impl Tick {
    pub const NEVER: Tick = Tick(0);

    pub fn is_never(self) -> bool {
        self == Tick::NEVER
    }

    /// `secs` seconds before `self`, or the start.
    pub fn earlier_by(self, secs: u64) -> Tick {
        let secs = u32::try_from(secs).unwrap_or(u32::MAX);
        Tick(self.0.saturating_sub(secs).max(1))
    }

    /// Whole seconds from `self` to `later` (0 if `later` is not later).
    pub fn secs_until(self, later: Tick) -> u32 {
        later.0.saturating_sub(self.0)
    }
}

/// Turns instants into [`Tick`]s and ticks back into wall-clock time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    wall: SystemTime,
}

impl Clock {
    /// A clock whose tick 1 is `start`, which was `wall` on the wall clock.
    pub fn new(start: Instant, wall: SystemTime) -> Clock {
        Clock { start, wall }
    }

    pub fn tick(&self, now: Instant) -> Tick {
        let secs = now.saturating_duration_since(self.start).as_secs();
        Tick(u32::try_from(secs).unwrap_or(u32::MAX).min(LAST_TICK - 1) + 1)
    }

    /// When `t` was, on the wall clock (`None` for never).
    pub fn wall(&self, t: Tick) -> Option<SystemTime> {
        (!t.is_never()).then(|| self.wall + Duration::from_secs(u64::from(t.0 - 1)))
    }

    /// `wall` as Unix seconds (0 for never: the metric's convention).
    pub fn unix_seconds(&self, t: Tick) -> u64 {
        self.wall(t)
            .and_then(|w| w.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs())
    }
}

/// The last tick a [`Clock`] gives; the bit above it is
/// [`ASKED_SINCE_WRITE`].
const LAST_TICK: u32 = ASKED_SINCE_WRITE - 1;

/// In a slot's last ask: a check asked for the entry since its write. Ticks
/// are whole seconds, so an ask in the second of the write cannot be put
/// after it by time; it can by the swap: an ask recorded in the snapshot
/// that brought the write (or a later one it was carried into unchanged)
/// came after the write applied.
const ASKED_SINCE_WRITE: u32 = 1 << 31;

/// What a keyed identity's slot knows of its asks. Atomic because the
/// snapshot is shared with the state file's writer thread; only the loop
/// thread writes, so every access is relaxed.
#[derive(Debug, Default)]
pub struct Asks {
    /// The last ask's tick, with [`ASKED_SINCE_WRITE`].
    last: AtomicU32,
    /// Since when the entry is as it is (the swap that brought its
    /// current ModifyIndex); `NEVER` means the snapshot's own swap.
    since: AtomicU32,
}

impl Asks {
    /// The hot path: one store. Its snapshot is answering, so the entry's
    /// write (this swap or an earlier one) has applied: asked since it.
    pub fn record(&self, now: Tick) {
        self.last
            .store(now.0 | ASKED_SINCE_WRITE, Ordering::Relaxed);
    }

    pub fn last(&self) -> Tick {
        Tick(self.last.load(Ordering::Relaxed) & LAST_TICK)
    }

    /// Whether a check asked for the entry since its write (see
    /// [`ASKED_SINCE_WRITE`]), even within the same second.
    pub fn asked_since_write(&self) -> bool {
        self.last.load(Ordering::Relaxed) & ASKED_SINCE_WRITE != 0
    }

    /// Since when the entry is as it is; `born` (its snapshot's swap) unless
    /// an earlier state carried it over.
    pub fn since(&self, born: Tick) -> Tick {
        match Tick(self.since.load(Ordering::Relaxed)) {
            Tick::NEVER => born,
            t => t,
        }
    }

    /// Carries over what the state before knew: the later last ask, and,
    /// when the entry did not change, since when it is as it is and whether
    /// a check asked since then. (Only the loop thread writes: a load and a
    /// store are not a race.)
    pub fn carry(&self, last: Tick, unchanged: Option<(Tick, bool)>) {
        let mine = self.last.load(Ordering::Relaxed);
        let mut asked = mine & ASKED_SINCE_WRITE;
        if let Some((since, asked_since)) = unchanged {
            self.since.store(since.0, Ordering::Relaxed);
            if asked_since {
                asked = ASKED_SINCE_WRITE;
            }
        }
        let later = (mine & LAST_TICK).max(last.0);
        self.last.store(later | asked, Ordering::Relaxed);
    }
}

/// Asked identities up to this long are kept whole; longer ones as their
/// first [`LONG_PREFIX`] bytes, a `0xff` byte and a keyed 64-bit hash of
/// the whole ([`Strangers::is_whole`] tells them apart: longer than this).
/// A peer choosing 64 KiB identities then costs at most this much per
/// entry, not 64 KiB.
pub const KEEP_WHOLE: usize = 256;
/// The bytes of a long identity kept as they are.
const LONG_PREFIX: usize = KEEP_WHOLE - 8;

/// Asked identities without a key: the last ask of each, at most `cap` of
/// them, each at most `KEEP_WHOLE` + 1 bytes. Survives every swap (it is
/// not part of a snapshot).
#[derive(Debug)]
pub struct Strangers {
    map: HashMap<Box<[u8]>, Tick, RandomState>,
    cap: usize,
    /// Asks not recorded because the set was full.
    overflow: u64,
}

impl Strangers {
    pub fn new(cap: usize) -> Strangers {
        Strangers {
            map: HashMap::default(),
            cap,
            overflow: 0,
        }
    }

    /// The hot path for identities without a key: one probe; one
    /// allocation the first time an identity is asked (none after).
    pub fn record(&mut self, identity: &[u8], now: Tick) {
        if !self.put(identity, now) {
            self.overflow += 1;
        }
    }

    /// How an identity is held: itself up to [`KEEP_WHOLE`] bytes, else
    /// its prefix, `0xff` and its hash, built in `buf` (no allocation).
    fn held<'a>(&self, identity: &'a [u8], buf: &'a mut [u8; KEEP_WHOLE + 1]) -> &'a [u8] {
        if identity.len() <= KEEP_WHOLE {
            return identity;
        }
        buf[..LONG_PREFIX].copy_from_slice(&identity[..LONG_PREFIX]);
        buf[LONG_PREFIX] = 0xff;
        let hash = self.map.hasher().hash_one(identity);
        buf[LONG_PREFIX + 1..].copy_from_slice(&hash.to_be_bytes());
        &buf[..]
    }

    /// Whether a held identity (from [`Strangers::iter`]) is the whole
    /// identity, not a long one's prefix and hash.
    pub fn is_whole(held: &[u8]) -> bool {
        held.len() <= KEEP_WHOLE
    }

    /// Takes over the last ask of an identity whose key was deleted,
    /// unless a later one is known (or there is no room).
    pub fn carry(&mut self, identity: &[u8], last: Tick) {
        if !last.is_never() && self.last(identity) < last {
            self.put(identity, last);
        }
    }

    /// Sets an identity's last ask; `false` if it is new and there is no
    /// room.
    fn put(&mut self, identity: &[u8], last: Tick) -> bool {
        let mut buf = [0; KEEP_WHOLE + 1];
        let identity = self.held(identity, &mut buf);
        if let Some(held) = self.map.get_mut(identity) {
            *held = last;
        } else if self.map.len() < self.cap {
            self.map.insert(Box::from(identity), last);
        } else {
            return false;
        }
        true
    }

    /// Removes an identity that now has a key; its last ask.
    pub fn take(&mut self, identity: &[u8]) -> Tick {
        let mut buf = [0; KEEP_WHOLE + 1];
        let identity = self.held(identity, &mut buf);
        self.map.remove(identity).unwrap_or(Tick::NEVER)
    }

    pub fn last(&self, identity: &[u8]) -> Tick {
        let mut buf = [0; KEEP_WHOLE + 1];
        let identity = self.held(identity, &mut buf);
        self.map.get(identity).copied().unwrap_or(Tick::NEVER)
    }

    /// Forgets identities not asked for since `before` (a server removed
    /// from haproxy, or a one-off `ask`), making room for new ones.
    pub fn forget_older_than(&mut self, before: Tick) {
        self.map.retain(|_, last| *last >= before);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// Every identity held and its last ask, in no particular order (a
    /// long one as its prefix and hash, see [`Strangers::is_whole`]). An
    /// asked identity need not be UTF-8: show it with [`shown_identity`].
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Tick)> {
        self.map.iter().map(|(k, t)| (&k[..], *t))
    }
}

/// An asked identity as shown (JSON, `status`): as it is when it is UTF-8
/// without a backslash, else escaped (`\\`, `\xff`), so that two
/// identities never show alike. A long one held as its prefix and hash
/// shows as `prefix...#` and 16 hex digits: longer than any whole
/// identity shown unescaped.
pub fn shown_identity(identity: &[u8]) -> String {
    if !Strangers::is_whole(identity) {
        let (prefix, hash) = identity.split_at(LONG_PREFIX);
        let hash = u64::from_be_bytes(hash[1..].try_into().unwrap_or_default());
        return format!("{}...#{hash:016x}", shown_identity(prefix));
    }
    match std::str::from_utf8(identity) {
        Ok(s) if !s.contains('\\') => s.to_owned(),
        _ => crate::safe::escape(identity, usize::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_identities_are_held_as_a_prefix_and_a_hash() {
        let mut s = Strangers::new(10_000);
        let t = Tick(5);
        // 2,000 distinct 65 KB identities (the review's +130 MB): each held
        // in at most KEEP_WHOLE + 1 bytes.
        let long = |i: usize| {
            let mut id = vec![b'a'; 65_000];
            id.extend_from_slice(format!("/{i}").as_bytes());
            id
        };
        for i in 0..2000 {
            s.record(&long(i), t);
        }
        assert_eq!(s.len(), 2000, "same prefix, different identities");
        let held: usize = s.iter().map(|(k, _)| k.len()).sum();
        assert_eq!(held, 2000 * (KEEP_WHOLE + 1));
        // The same identity again is the same entry, and found as itself.
        s.record(&long(7), Tick(9));
        assert_eq!((s.len(), s.last(&long(7))), (2000, Tick(9)));
        assert_eq!(s.take(&long(7)), Tick(9));
        assert_eq!(s.last(&long(7)), Tick::NEVER);
        // Up to KEEP_WHOLE bytes an identity is held whole.
        let edge = vec![b'b'; KEEP_WHOLE];
        s.record(&edge, t);
        assert!(s
            .iter()
            .any(|(k, _)| k == &edge[..] && Strangers::is_whole(k)));
        let (k, _) = s.iter().find(|(k, _)| !Strangers::is_whole(k)).unwrap();
        let shown = shown_identity(k);
        assert!(
            shown.starts_with("aaaa") && shown.contains("...#"),
            "{shown}"
        );
        assert_eq!(shown.len(), LONG_PREFIX + 4 + 16);
    }

    #[test]
    fn ticks_are_whole_seconds_after_start_and_never_is_zero() {
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let c = Clock::new(start, wall);
        assert_eq!(c.tick(start), Tick(1));
        assert_eq!(c.tick(start + Duration::from_millis(999)), Tick(1));
        assert_eq!(c.tick(start + Duration::from_secs(61)), Tick(62));
        assert_eq!(
            c.unix_seconds(c.tick(start + Duration::from_secs(61))),
            1_061
        );
        assert_eq!(c.unix_seconds(Tick::NEVER), 0);
        assert_eq!(c.wall(Tick::NEVER), None);
        assert_eq!(Tick(5).secs_until(Tick(65)), 60);
        assert_eq!(Tick(65).secs_until(Tick(5)), 0);
    }

    #[test]
    fn a_slot_keeps_the_later_ask_and_carries_since_only_when_unchanged() {
        let a = Asks::default();
        assert!(a.last().is_never());
        assert_eq!(a.since(Tick(7)), Tick(7), "born with its snapshot");
        a.record(Tick(9));
        a.carry(Tick(4), None);
        assert_eq!(a.last(), Tick(9), "an older ask never wins");
        a.carry(Tick(12), Some((Tick(3), false)));
        assert_eq!((a.last(), a.since(Tick(7))), (Tick(12), Tick(3)));
    }

    #[test]
    fn an_ask_into_the_slot_is_since_the_write_even_in_its_second() {
        // A new entry, born at tick 7 and asked at tick 7: after the write.
        let a = Asks::default();
        a.record(Tick(7));
        assert!(a.asked_since_write());
        assert_eq!(a.last(), Tick(7));
        // Carried over from a changed entry: an ask of the old value, later
        // by the clock, is not an ask since this write.
        let b = Asks::default();
        b.carry(Tick(8), None);
        assert_eq!((b.last(), b.asked_since_write()), (Tick(8), false));
        // Unchanged: the old slot's asks since the write count.
        b.carry(Tick(8), Some((Tick(3), true)));
        assert!(b.asked_since_write());
        let c = Asks::default();
        c.carry(Tick(8), Some((Tick(3), false)));
        assert!(!c.asked_since_write());
    }

    #[test]
    fn odd_identities_show_apart() {
        let shown: Vec<String> = [
            &b"zz/\xff"[..],
            b"zz/\xfe",
            "zz/\u{fffd}".as_bytes(),
            b"a\\xff",
            b"b/\xc3\xa9",
        ]
        .iter()
        .map(|id| shown_identity(id))
        .collect();
        assert_eq!(
            shown,
            [
                "zz/\\xff",
                "zz/\\xfe",
                "zz/\u{fffd}",
                "a\\\\xff",
                "b/\u{e9}"
            ]
        );
    }

    #[test]
    fn strangers_are_bounded_and_count_what_they_could_not_keep() {
        let mut s = Strangers::new(2);
        s.record(b"be/a", Tick(1));
        s.record(b"be/b", Tick(2));
        s.record(b"be/c", Tick(3));
        s.record(b"be/c", Tick(4));
        assert_eq!((s.len(), s.overflow()), (2, 2));
        assert!(s.last(b"be/c").is_never());
        s.record(b"be/a", Tick(5));
        assert_eq!(s.last(b"be/a"), Tick(5), "a known one is updated when full");
        s.forget_older_than(Tick(3));
        assert_eq!(s.len(), 1);
        s.record(b"be/c", Tick(6));
        assert_eq!(s.last(b"be/c"), Tick(6), "room again after forgetting");
    }
}
