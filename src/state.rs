//! The snapshot the responder answers from: identity -> desired
//! state, built whole from one consul listing and swapped whole.
//!
//! In: the normalised KV prefix, the consul index, and the decoded KV
//! pairs. Out: a [`Snapshot`] whose lookup is one hash probe returning
//! `'static` reply bytes, plus the keys that were dropped and why.
//!
//! Always holds:
//! - an invalid key or value never reaches the map;
//! - an identity that is not in the map answers [`Desired::READY`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::contract::{parse_identity, parse_value, Desired, InvalidValue};
use crate::kv::KvPair;
use crate::slice::Slice;

mod asked;
pub mod expiry;
pub mod file;
mod held;
mod swap;
pub mod unasked;
use asked::Asks;
pub use asked::{shown_identity, Clock, Strangers, Tick};
pub use held::{HeldFile, FIRST_READ_GRACE};
pub use swap::{Source, Swapped, Swapper};

/// How much of an invalid value is kept for showing.
const INVALID_VALUE_SHOWN_BYTES: usize = 128;

/// Why a KV key was dropped (metric label `reason`): its value's
/// [`InvalidValue`], or a key that can never be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// The value failed [`crate::contract::parse_value`].
    Value(InvalidValue),
    /// The key can never be asked for: empty identity, trailing `/`,
    /// surrounding whitespace, control bytes, or not under the prefix.
    BadKey,
}

impl InvalidReason {
    /// The value reasons in [`InvalidValue::ALL`]'s order, then `BadKey`.
    pub const ALL: [InvalidReason; InvalidValue::ALL.len() + 1] = {
        let mut all = [InvalidReason::BadKey; InvalidValue::ALL.len() + 1];
        let mut i = 0;
        while i < InvalidValue::ALL.len() {
            all[i] = InvalidReason::Value(InvalidValue::ALL[i]);
            i += 1;
        }
        all
    };

    pub fn label(self) -> &'static str {
        match self {
            InvalidReason::Value(v) => v.label(),
            InvalidReason::BadKey => "bad_key",
        }
    }

    /// Position in [`InvalidReason::ALL`].
    pub fn index(self) -> usize {
        match self {
            InvalidReason::Value(v) => v.index(),
            InvalidReason::BadKey => InvalidValue::ALL.len(),
        }
    }
}

impl From<InvalidValue> for InvalidReason {
    fn from(v: InvalidValue) -> Self {
        InvalidReason::Value(v)
    }
}

/// One valid identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub desired: Desired,
    pub modify_index: u64,
    /// The expiry its consul `Flags` carry (Unix seconds), 0 for none
    /// ([`crate::contract::expiry::of_flags`]): shown, never acted on.
    pub expires: u32,
}

/// One dropped key, kept for logs and `/debug/state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidKey {
    /// The full KV key.
    pub key: String,
    /// The raw value, lossily decoded and cut to at most 128 bytes, for
    /// showing (always escape it before logging).
    pub value: String,
    pub reason: InvalidReason,
    pub modify_index: u64,
    /// The whole raw value, in the snapshot's arena.
    raw: RawRef,
}

/// Where a raw value sits in [`Snapshot`]'s arena of raw values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawRef {
    start: usize,
    len: usize,
}

/// What changed for one identity between two snapshots (for the per-key
/// change log). `None` means absent (answers `ready 100%`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<'a> {
    pub identity: &'a str,
    pub old: Option<Entry>,
    pub new: Option<Entry>,
}

/// The desired state of every identity, as of one consul index.
#[derive(Debug, Default)]
pub struct Snapshot {
    index: u64,
    entries: HashMap<Box<[u8]>, Slot, BuildHasherDefault<IdentityHasher>>,
    invalid: Vec<InvalidKey>,
    /// Every key's raw value as consul sent it, back to back (for the state
    /// file, which keeps what consul said, not what the agent made of it).
    raw: Vec<u8>,
    /// When this snapshot began answering (its swap, or the state file's
    /// load): since when an entry new in it is as it is.
    born: Tick,
    /// Diverted entries with an expiry (counted at build: a state without
    /// one costs [`expiry::Expiry`] no scan).
    expiring: usize,
}

/// A map value: the entry (its reply is an index into a static table,
/// [`Desired::reply`]), the raw value and what the identity's checks have
/// asked.
#[derive(Debug)]
struct Slot {
    entry: Entry,
    raw: RawRef,
    asks: Asks,
}

/// One diverted entry (its reply is not `ready 100%`) and its asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diverted<'a> {
    pub identity: &'a str,
    pub entry: Entry,
    pub last_asked: Tick,
    /// Since when the entry is as it is (the later of its write, as seen by
    /// this agent, and the agent's start).
    pub since: Tick,
}

impl Snapshot {
    /// Builds a snapshot from a listing of `prefix/` (prefix already without
    /// leading/trailing `/`). Keys not starting with `prefix/`, or whose
    /// suffix fails [`crate::contract::parse_identity`], are `BadKey`; values
    /// failing [`crate::contract::parse_value`] are dropped with their reason.
    ///
    /// An empty `prefix` means the whole store: the full key is the identity.
    /// Should an identity appear twice (consul cannot send that), the last
    /// occurrence decides, valid or not.
    pub fn build(prefix: &str, index: u64, pairs: Vec<KvPair>) -> Snapshot {
        let mut builder = SnapshotBuilder::new(prefix, index, pairs.len());
        for pair in pairs {
            builder.add(pair);
        }
        builder.finish()
    }

    /// The consul index this snapshot is as of.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The reply for an identity: its entry's reply, else `ready 100%\n`.
    pub fn reply(&self, identity: &[u8]) -> &'static [u8] {
        match self.entries.get(identity) {
            Some(slot) => slot.entry.desired.reply(),
            None => Desired::READY.reply(),
        }
    }

    /// The hot path: the desired state for an identity with a key,
    /// recording the ask at `now`, in one probe; `None` without a key (the
    /// caller answers `ready 100%` and records the ask itself).
    pub fn answer(&self, identity: &[u8], now: Tick) -> Option<Desired> {
        let slot = self.entries.get(identity)?;
        slot.asks.record(now);
        Some(slot.entry.desired)
    }

    /// An identity's last ask, since when its entry is as it is (its
    /// write as this agent saw it, or the agent's start), and whether a
    /// check asked since then (ordered by the swaps, not by the seconds);
    /// `None`: no key. While `previous`'s asks are still being carried over
    /// to this snapshot, they count as carried.
    pub fn asks(&self, identity: &[u8], previous: Option<&Snapshot>) -> Option<(Tick, Tick, bool)> {
        let slot = self.entries.get(identity)?;
        let (mut last, mut since) = (slot.asks.last(), slot.asks.since(self.born));
        let mut asked_since = slot.asks.asked_since_write();
        if let Some(old) = previous.and_then(|p| Some((p.entries.get(identity)?, p.born))) {
            last = last.max(old.0.asks.last());
            if old.0.entry == slot.entry {
                since = old.0.asks.since(old.1);
                asked_since |= old.0.asks.asked_since_write();
            }
        }
        Some((last, since, asked_since))
    }

    /// Starts answering at `now`: entries new in this snapshot are as they
    /// are since then.
    pub fn set_born(&mut self, now: Tick) {
        self.born = now;
    }

    /// Every entry whose reply is not `ready 100%`, with its asks, from
    /// the `pos`-th entry on (in the map's order, which holds while the
    /// snapshot is not changed), counting every entry passed in `pos`: a
    /// scan resumable slice by slice.
    pub fn diverted_from<'a>(&'a self, pos: &'a mut usize) -> impl Iterator<Item = Diverted<'a>> {
        let start = *pos;
        self.entries
            .iter()
            .skip(start)
            .inspect(move |_| *pos += 1)
            .filter_map(|(k, slot)| self.if_diverted(k, slot))
    }

    fn if_diverted<'a>(&'a self, identity: &'a [u8], slot: &Slot) -> Option<Diverted<'a>> {
        (slot.entry.desired != Desired::READY).then(|| Diverted {
            identity: identity_str(identity),
            entry: slot.entry,
            last_asked: slot.asks.last(),
            since: slot.asks.since(self.born),
        })
    }

    /// Diverted entries with an expiry (see [`Entry::expires`]).
    pub fn expiring(&self) -> usize {
        self.expiring
    }

    /// Every entry, from the `pos`-th on, counting every entry passed in
    /// `pos` (see [`Snapshot::diverted_from`]).
    pub fn entries_from<'a>(
        &'a self,
        pos: &'a mut usize,
    ) -> impl Iterator<Item = (&'a str, Entry)> {
        let start = *pos;
        self.entries
            .iter()
            .skip(start)
            .inspect(move |_| *pos += 1)
            .map(|(k, slot)| (identity_str(k), slot.entry))
    }

    /// Every entry's identity and last ask, from the `pos`-th entry on,
    /// counting every entry passed in `pos` (see
    /// [`Snapshot::diverted_from`]).
    pub fn asks_from<'a>(&'a self, pos: &'a mut usize) -> impl Iterator<Item = (&'a str, Tick)> {
        let start = *pos;
        self.entries
            .iter()
            .skip(start)
            .inspect(move |_| *pos += 1)
            .map(|(k, slot)| (identity_str(k), slot.asks.last()))
    }

    /// The entry for an identity, if the KV holds a valid value for it.
    pub fn get(&self, identity: &[u8]) -> Option<Entry> {
        self.entries.get(identity).map(|slot| slot.entry)
    }

    /// Valid identities, in no particular order. Identities are valid UTF-8
    /// (they come from consul keys).
    pub fn entries(&self) -> impl Iterator<Item = (&str, Entry)> {
        self.entries
            .iter()
            .map(|(k, slot)| (identity_str(k), slot.entry))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn invalid(&self) -> &[InvalidKey] {
        &self.invalid
    }

    /// Every key as consul listed it (full key, raw value, ModifyIndex,
    /// Flags as far as kept: the expiry, 0 for a dropped key): the valid
    /// ones (named under `prefix`), then the dropped ones. Building a
    /// snapshot from these pairs gives this snapshot again.
    pub fn raw_pairs<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (String, &'a [u8], u64, u64)> + 'a {
        let raw = |r: RawRef| &self.raw[r.start..r.start + r.len];
        let valid = self.entries.iter().map(move |(k, slot)| {
            let identity = identity_str(k);
            let key = if prefix.is_empty() {
                identity.to_owned()
            } else {
                format!("{prefix}/{identity}")
            };
            let e = slot.entry;
            (key, raw(slot.raw), e.modify_index, u64::from(e.expires))
        });
        let invalid = self
            .invalid
            .iter()
            .map(move |k| (k.key.clone(), raw(k.raw), k.modify_index, 0));
        valid.chain(invalid)
    }

    /// Every identity whose entry differs between `old` and `self` (added,
    /// removed, or changed desired state or modify index), sorted by identity.
    pub fn changes_from<'a>(&'a self, old: &'a Snapshot) -> Vec<Change<'a>> {
        let mut changes = Vec::new();
        let mut scan = ChangeScan::default();
        let mut emit = |c| changes.push(c);
        while !scan.step(self, old, &mut Slice::unlimited(), &mut emit, None) {}
        changes.sort_unstable_by(|a, b| a.identity.cmp(b.identity));
        changes
    }

    /// Hands the snapshot over to be freed a slice at a time (dropping
    /// 100,000 entries at once is several milliseconds of one loop turn).
    pub fn into_graveyard(self) -> Graveyard {
        Graveyard(self.entries.into_iter())
    }
}

/// Finds the changes between two snapshots (the same ones as
/// [`Snapshot::changes_from`], unsorted) a slice of entries at a time, so the
/// per-key change log of a 100,000-key swap never stalls the loop. Neither
/// snapshot may change between steps (HashMap iteration order is stable
/// while the map is not modified, which is what makes the position valid).
///
/// Given the asked identities without a key, the same pass carries the
/// asks over: each new entry gets the later last ask of its old entry (or,
/// for an identity that had no key, of the strangers' set, which it
/// leaves), and keeps its
/// old entry's `since` (and whether it was asked since) when it did not
/// change; a removed entry's last ask
/// goes to the strangers' set.
#[derive(Debug, Default)]
pub struct ChangeScan {
    /// Past the new snapshot's entries; now looking for removals in the old.
    in_old: bool,
    pos: usize,
}

impl ChangeScan {
    /// Looks at more entries until the slice is spent; `true` once both
    /// are scanned.
    pub fn step<'a>(
        &mut self,
        new: &'a Snapshot,
        old: &'a Snapshot,
        slice: &mut Slice,
        emit: &mut dyn FnMut(Change<'a>),
        mut carry: Option<&mut Strangers>,
    ) -> bool {
        if !self.in_old {
            for (k, slot) in new.entries.iter().skip(self.pos) {
                self.pos += 1;
                let old_slot = old.entries.get(k);
                let before = old_slot.map(|o| o.entry);
                if let Some(strangers) = carry.as_deref_mut() {
                    match old_slot {
                        Some(o) => slot.asks.carry(
                            o.asks.last(),
                            (o.entry == slot.entry)
                                .then(|| (o.asks.since(old.born), o.asks.asked_since_write())),
                        ),
                        None => slot.asks.carry(strangers.take(k), None),
                    }
                }
                let changed = before != Some(slot.entry);
                if changed {
                    emit(Change {
                        identity: identity_str(k),
                        old: before,
                        new: Some(slot.entry),
                    });
                }
                if slice.spent(scan_cost(k, changed)) {
                    break;
                }
            }
            if self.pos < new.entries.len() {
                return false;
            }
            self.in_old = true;
            self.pos = 0;
            if slice.is_over() {
                return false;
            }
        }
        for (k, slot) in old.entries.iter().skip(self.pos) {
            self.pos += 1;
            let removed = !new.entries.contains_key(&k[..]);
            if removed {
                if let Some(strangers) = carry.as_deref_mut() {
                    strangers.carry(k, slot.asks.last());
                }
                emit(Change {
                    identity: identity_str(k),
                    old: Some(slot.entry),
                    new: None,
                });
            }
            if slice.spent(scan_cost(k, removed)) {
                break;
            }
        }
        self.pos >= old.entries.len()
    }
}

/// The rough cost of scanning one entry, for the [`Slice`]: a change is
/// also a log line, written by `emit` inside the slice.
fn scan_cost(identity: &[u8], changed: bool) -> usize {
    identity.len() + if changed { 512 } else { 0 }
}

/// A snapshot being freed a slice at a time.
pub struct Graveyard(std::collections::hash_map::IntoIter<Box<[u8]>, Slot>);

impl Graveyard {
    /// Frees entries until the slice is spent; `true` once all are gone.
    pub fn free(&mut self, slice: &mut Slice) -> bool {
        // Each entry (key, slot) is dropped at the end of its iteration.
        for (k, _) in self.0.by_ref() {
            if slice.spent(k.len()) {
                break;
            }
        }
        self.0.len() == 0
    }
}

impl std::fmt::Debug for Graveyard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graveyard({} left)", self.0.len())
    }
}

/// Builds a [`Snapshot`] one KV pair at a time, so a large listing can be
/// decoded across several loop turns ([`Snapshot::build`] is the one-shot
/// form). Same rules as `build`.
#[derive(Debug)]
pub struct SnapshotBuilder {
    prefix: String,
    snapshot: Snapshot,
}

impl SnapshotBuilder {
    pub fn new(prefix: &str, index: u64, capacity: usize) -> SnapshotBuilder {
        let entries = HashMap::with_capacity_and_hasher(capacity, BuildHasherDefault::default());
        SnapshotBuilder {
            prefix: prefix.to_owned(),
            snapshot: Snapshot {
                index,
                entries,
                invalid: Vec::new(),
                raw: Vec::new(),
                born: Tick::NEVER,
                expiring: 0,
            },
        }
    }

    pub fn add(&mut self, pair: KvPair) {
        let s = &mut self.snapshot;
        let raw = RawRef {
            start: s.raw.len(),
            len: pair.value.len(),
        };
        s.raw.extend_from_slice(&pair.value);
        let Some(identity) = identity_of(&self.prefix, &pair.key) else {
            s.invalid
                .push(InvalidKey::new(pair, InvalidReason::BadKey, raw));
            return;
        };
        match parse_value(&pair.value) {
            Ok(desired) => {
                let entry = Entry {
                    desired,
                    modify_index: pair.modify_index,
                    expires: crate::contract::expiry::of_flags(pair.flags),
                };
                let diverted = desired.reply() != Desired::READY.reply();
                s.expiring += usize::from(diverted && entry.expires != 0);
                let slot = Slot {
                    entry,
                    raw,
                    asks: Asks::default(),
                };
                s.entries.insert(Box::from(identity.as_bytes()), slot);
            }
            Err(reason) => {
                s.entries.remove(identity.as_bytes());
                s.invalid.push(InvalidKey::new(pair, reason.into(), raw));
            }
        }
    }

    pub fn finish(self) -> Snapshot {
        self.snapshot
    }
}

impl InvalidKey {
    fn new(pair: KvPair, reason: InvalidReason, raw: RawRef) -> InvalidKey {
        InvalidKey {
            value: shown_value(&pair.value),
            key: pair.key,
            reason,
            modify_index: pair.modify_index,
            raw,
        }
    }

    /// Everything that makes a dropped key worth logging again.
    fn fingerprint(&self) -> (&str, &str, InvalidReason, u64) {
        (&self.key, &self.value, self.reason, self.modify_index)
    }
}

/// The identity below `prefix/`, if the key can ever be asked for.
fn identity_of<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
    let suffix = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix('/')?
    };
    parse_identity(suffix)
}

/// Map keys come from `String`s, so this never falls back.
fn identity_str(key: &[u8]) -> &str {
    std::str::from_utf8(key).unwrap_or("")
}

/// The raw value as text for logs and `/debug/state`: lossy UTF-8, cut at a
/// char boundary to at most [`INVALID_VALUE_SHOWN_BYTES`] bytes. Decodes only
/// a bounded head (plus room for one whole char at the cut), so a huge value
/// costs nothing extra.
fn shown_value(raw: &[u8]) -> String {
    let head = &raw[..raw.len().min(INVALID_VALUE_SHOWN_BYTES + 3)];
    let mut shown = String::from_utf8_lossy(head).into_owned();
    let mut cut = shown.len().min(INVALID_VALUE_SHOWN_BYTES);
    while !shown.is_char_boundary(cut) {
        cut -= 1;
    }
    shown.truncate(cut);
    shown
}

/// A fast hasher for identities (Fx-style, a word at a time, with a
/// murmur3 finaliser so that the low bits the table indexes with depend on
/// every byte). Not DoS-resistant, which is fine: keys come from our own KV,
/// and lookups cannot insert.
#[derive(Default, Clone, Copy)]
struct IdentityHasher {
    hash: u64,
}

impl IdentityHasher {
    const SEED: u64 = 0xf135_7aea_2e62_a9c5;

    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(Self::SEED);
    }
}

impl Hasher for IdentityHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut w = [0; 8];
            w.copy_from_slice(word);
            self.add(u64::from_le_bytes(w));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            // Zero padding is unambiguous: `[u8]` hashes its length first.
            let mut w = [0; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// A snapshot of `pairs` (identity below `prefix`, value) all written at
/// `index`: the unit tests' state.
#[cfg(test)]
pub(crate) fn test_snapshot(prefix: &str, index: u64, pairs: &[(&str, &str)]) -> Snapshot {
    let pairs = pairs
        .iter()
        .map(|(k, v)| KvPair {
            key: format!("{prefix}/{k}"),
            value: v.as_bytes().to_vec(),
            modify_index: index,
            flags: 0,
        })
        .collect();
    Snapshot::build(prefix, index, pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_scan_in_small_slices_finds_what_changes_from_finds() {
        let old = Snapshot::build(
            PREFIX,
            1,
            (0..50)
                .map(|i| kv(&format!("{PREFIX}/s{i}"), b"drain", 1))
                .collect(),
        );
        let mut pairs: Vec<KvPair> = (10..60)
            .map(|i| kv(&format!("{PREFIX}/s{i}"), b"drain", 1))
            .collect();
        pairs[5] = kv(&format!("{PREFIX}/s15"), b"maint", 2);
        let new = Snapshot::build(PREFIX, 2, pairs);
        let mut whole = new.changes_from(&old);
        assert_eq!(whole.len(), 10 + 1 + 10, "10 removed, 1 changed, 10 added");
        let mut sliced = Vec::new();
        let mut scan = ChangeScan::default();
        let mut steps = 0;
        while !scan.step(
            &new,
            &old,
            &mut Slice::items(7),
            &mut |c| sliced.push(c),
            None,
        ) {
            steps += 1;
        }
        assert_eq!(steps, 100 / 7, "50 + 50 entries, 7 a step");
        sliced.sort_unstable_by(|a, b| a.identity.cmp(b.identity));
        whole.sort_unstable_by(|a, b| a.identity.cmp(b.identity));
        assert_eq!(sliced, whole);
    }

    #[test]
    fn graveyard_frees_in_slices() {
        let s = Snapshot::build(
            PREFIX,
            1,
            (0..10)
                .map(|i| kv(&format!("{PREFIX}/s{i}"), b"drain", 1))
                .collect(),
        );
        let mut g = s.into_graveyard();
        assert!(!g.free(&mut Slice::items(4)));
        assert!(!g.free(&mut Slice::items(4)));
        assert!(g.free(&mut Slice::items(4)));
    }

    const PREFIX: &str = "gitlab-haproxy-agent/state";

    fn kv(key: &str, value: &[u8], modify_index: u64) -> KvPair {
        KvPair {
            key: key.to_owned(),
            value: value.to_vec(),
            modify_index,
            flags: 0,
        }
    }

    /// A key under [`PREFIX`].
    fn at(identity: &str, value: &[u8], modify_index: u64) -> KvPair {
        kv(&format!("{PREFIX}/{identity}"), value, modify_index)
    }

    fn snapshot(pairs: Vec<KvPair>) -> Snapshot {
        Snapshot::build(PREFIX, 7, pairs)
    }

    fn entry(value: &str, modify_index: u64) -> Entry {
        Entry {
            desired: parse_value(value.as_bytes()).unwrap(),
            modify_index,
            expires: 0,
        }
    }

    fn reasons(snap: &Snapshot) -> Vec<(&str, InvalidReason)> {
        snap.invalid()
            .iter()
            .map(|k| (k.key.as_str(), k.reason))
            .collect()
    }

    #[test]
    fn answer_is_reply_and_admin_in_one_probe_and_records_the_ask() {
        let snap = snapshot(vec![
            at("be_web/srv1", b"drain", 10),
            at("be_web/srv2", b"maint", 11),
            at("be_web/srv3", b"50%", 12),
            at("be_web/srv4", b"bogus", 13),
        ]);
        let now = Clock::new(std::time::Instant::now(), std::time::SystemTime::now())
            .tick(std::time::Instant::now());
        for id in ["be_web/srv1", "be_web/srv2", "be_web/srv3"] {
            let id = id.as_bytes();
            let desired = snap.get(id).unwrap().desired;
            assert_eq!(snap.asks(id, None).map(|a| a.0), Some(Tick::NEVER));
            assert_eq!(snap.answer(id, now), Some(desired), "{id:?}");
            assert_eq!(snap.asks(id, None).map(|a| a.0), Some(now));
        }
        for id in ["be_web/srv4", "absent"] {
            assert_eq!(snap.answer(id.as_bytes(), now), None, "no key: {id}");
            assert_eq!(snap.asks(id.as_bytes(), None), None);
        }
        assert_eq!(snap.answer(b"be_web/srv2", now), Some(Desired::MAINT));
        let mut pos = 0;
        let diverted: Vec<_> = snap.diverted_from(&mut pos).map(|d| d.identity).collect();
        assert_eq!(diverted.len(), 3, "drain, maint and 50% are diverted");
    }

    #[test]
    fn valid_values_answer_their_reply() {
        let snap = snapshot(vec![
            at("be_web/srv1", b"drain", 10),
            at("be_web/srv2", b"MAINT\n", 11),
            at("be_web/srv3", b"050%", 12),
            at("be_web/srv4", b"ready", 13),
            at("be web/srv 5", b"0%", 14),
        ]);
        assert_eq!(snap.index(), 7);
        assert_eq!(snap.len(), 5);
        assert!(!snap.is_empty());
        assert!(snap.invalid().is_empty());
        assert_eq!(snap.reply(b"be_web/srv1"), b"drain 100%\n");
        assert_eq!(snap.reply(b"be_web/srv2"), b"maint 100%\n");
        assert_eq!(snap.reply(b"be_web/srv3"), b"ready 50%\n");
        assert_eq!(snap.reply(b"be_web/srv4"), b"ready 100%\n");
        assert_eq!(snap.reply(b"be web/srv 5"), b"ready 0%\n");
        assert_eq!(snap.get(b"be_web/srv1"), Some(entry("drain", 10)));
        assert_eq!(snap.get(b"be_web/srv3"), Some(entry("50%", 12)));
    }

    #[test]
    fn unknown_identities_are_ready() {
        let snap = snapshot(vec![at("be_web/srv1", b"drain", 10)]);
        assert_eq!(snap.reply(b"be_web/srv9"), b"ready 100%\n");
        assert_eq!(snap.get(b"be_web/srv9"), None);
        // Matching is byte for byte.
        assert_eq!(snap.reply(b"BE_WEB/SRV1"), b"ready 100%\n");
        assert_eq!(snap.reply(b"be_web/srv1 "), b"ready 100%\n");
        assert_eq!(snap.reply(b""), b"ready 100%\n");
        assert_eq!(Snapshot::default().reply(b"be_web/srv1"), b"ready 100%\n");
        assert!(Snapshot::default().is_empty());
    }

    #[test]
    fn invalid_values_are_dropped_with_their_reason() {
        let snap = snapshot(vec![
            at("a", b"up", 1),
            at("b", b"257%", 2),
            at("c", b"maxconn:3", 3),
            at("d", b"", 4),
            at("e", b"drain", 5),
        ]);
        use InvalidValue::{HealthWord, OutOfRange, Syntax};
        let value = InvalidReason::Value;
        assert_eq!(
            reasons(&snap),
            [
                ("gitlab-haproxy-agent/state/a", value(HealthWord)),
                ("gitlab-haproxy-agent/state/b", value(OutOfRange)),
                ("gitlab-haproxy-agent/state/c", value(Syntax)),
                ("gitlab-haproxy-agent/state/d", value(Syntax)),
            ]
        );
        for id in [&b"a"[..], b"b", b"c", b"d"] {
            assert_eq!(snap.get(id), None);
            assert_eq!(snap.reply(id), b"ready 100%\n");
        }
        // One invalid value does not affect the others.
        assert_eq!(snap.reply(b"e"), b"drain 100%\n");
        assert_eq!(snap.len(), 1);
        assert_eq!(snap.invalid()[1].value, "257%");
        assert_eq!(snap.invalid()[1].modify_index, 2);
    }

    #[test]
    fn bad_keys() {
        let bad = [
            "other-prefix/be_web/srv1",
            "gitlab-haproxy-agent/statefoo/srv1",
            "gitlab-haproxy-agent/state",
            "gitlab-haproxy-agent/state/",
            "gitlab-haproxy-agent/state/be_web/",
            "gitlab-haproxy-agent/state/ srv1",
            "gitlab-haproxy-agent/state/srv1 ",
            "gitlab-haproxy-agent/state/srv\r1",
            "gitlab-haproxy-agent/state/srv1\n",
            "gitlab-haproxy-agent/state/srv\x001",
            "gitlab-haproxy-agent/state/srv\x7f1",
        ];
        let mut pairs: Vec<KvPair> = bad.iter().map(|k| kv(k, b"drain", 1)).collect();
        pairs.push(at("ok", b"drain", 1));
        let snap = snapshot(pairs);
        assert_eq!(
            reasons(&snap),
            bad.iter()
                .map(|k| (*k, InvalidReason::BadKey))
                .collect::<Vec<_>>()
        );
        assert_eq!(snap.len(), 1);
        assert_eq!(snap.entries().map(|(id, _)| id).collect::<Vec<_>>(), ["ok"]);
    }

    #[test]
    fn a_bad_key_is_bad_whatever_its_value() {
        let snap = snapshot(vec![kv("elsewhere/x", b"up", 1)]);
        assert_eq!(reasons(&snap), [("elsewhere/x", InvalidReason::BadKey)]);
    }

    #[test]
    fn empty_prefix_takes_the_whole_key() {
        let snap = Snapshot::build(
            "",
            1,
            vec![kv("be_web/srv1", b"maint", 1), kv("/", b"maint", 1)],
        );
        assert_eq!(snap.reply(b"be_web/srv1"), b"maint 100%\n");
        assert_eq!(reasons(&snap), [("/", InvalidReason::BadKey)]);
    }

    #[test]
    fn nested_identities_keep_their_slashes() {
        let snap = snapshot(vec![at("dc1/be_web/srv1", b"drain", 1)]);
        assert_eq!(snap.reply(b"dc1/be_web/srv1"), b"drain 100%\n");
    }

    #[test]
    fn last_occurrence_of_an_identity_wins() {
        let snap = snapshot(vec![at("a", b"drain", 1), at("a", b"maint", 2)]);
        assert_eq!(snap.get(b"a"), Some(entry("maint", 2)));
        let snap = snapshot(vec![at("a", b"drain", 1), at("a", b"bogus", 2)]);
        assert_eq!(snap.get(b"a"), None);
        assert_eq!(snap.reply(b"a"), b"ready 100%\n");
    }

    #[test]
    fn shown_value_is_lossy_and_bounded() {
        let long = "é".repeat(100); // 200 bytes
        let snap = snapshot(vec![
            at("a", b"\xffup\x00", 1),
            at("b", long.as_bytes(), 2),
            at("c", &[b'x'; 100_000], 3),
            at("d", &[b'\xff'; 200], 4),
        ]);
        let shown: Vec<&str> = snap.invalid().iter().map(|k| k.value.as_str()).collect();
        assert_eq!(shown[0], "\u{fffd}up\0");
        assert_eq!(shown[1], "é".repeat(64));
        assert_eq!(shown[2], "x".repeat(128));
        // Each U+FFFD is 3 bytes: 42 of them fit in 128.
        assert_eq!(shown[3], "\u{fffd}".repeat(42));
        // A char that straddles byte 128 of the raw value is cut whole, not
        // turned into U+FFFD.
        let mut straddle = "x".repeat(125);
        straddle.push('😀'); // bytes 125..129
        assert_eq!(shown_value(straddle.as_bytes()), "x".repeat(125));
        let mut fits = "x".repeat(124);
        fits.push('😀'); // bytes 124..128
        assert_eq!(shown_value(fits.as_bytes()), fits);
    }

    #[test]
    fn entries_lists_every_valid_identity() {
        let snap = snapshot(vec![
            at("a", b"drain", 1),
            at("b", b"5%", 2),
            at("c", b"up", 3),
        ]);
        let mut entries: Vec<(&str, Entry)> = snap.entries().collect();
        entries.sort_by_key(|(id, _)| *id);
        assert_eq!(entries, [("a", entry("drain", 1)), ("b", entry("5%", 2))]);
    }

    #[test]
    fn changes_from_added_removed_changed() {
        let old = snapshot(vec![
            at("same", b"drain", 1),
            at("removed", b"maint", 2),
            at("reweighted", b"50%", 3),
            at("reindexed", b"drain", 4),
            at("became_invalid", b"drain", 5),
        ]);
        let new = snapshot(vec![
            at("same", b"drain", 1),
            at("reweighted", b"60%", 13),
            at("reindexed", b"drain", 14),
            at("became_invalid", b"up", 15),
            at("added", b"maint", 16),
        ]);
        let changes = new.changes_from(&old);
        assert_eq!(
            changes,
            [
                Change {
                    identity: "added",
                    old: None,
                    new: Some(entry("maint", 16))
                },
                Change {
                    identity: "became_invalid",
                    old: Some(entry("drain", 5)),
                    new: None
                },
                Change {
                    identity: "reindexed",
                    old: Some(entry("drain", 4)),
                    new: Some(entry("drain", 14))
                },
                Change {
                    identity: "removed",
                    old: Some(entry("maint", 2)),
                    new: None
                },
                Change {
                    identity: "reweighted",
                    old: Some(entry("50%", 3)),
                    new: Some(entry("60%", 13))
                },
            ]
        );
        assert!(new.changes_from(&new).is_empty());
        assert_eq!(Snapshot::default().changes_from(&old).len(), 5);
        assert!(old
            .changes_from(&Snapshot::default())
            .iter()
            .all(|c| c.old.is_none() && c.new.is_some()));
    }

    #[test]
    fn changes_are_sorted_by_identity() {
        let ids: Vec<String> = (0..200).map(|i| format!("be/srv{i}")).collect();
        let new = snapshot(ids.iter().map(|id| at(id, b"drain", 1)).collect());
        let empty = Snapshot::default();
        let changes = new.changes_from(&empty);
        let got: Vec<&str> = changes.iter().map(|c| c.identity).collect();
        let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn reason_labels_and_indexes() {
        let labels: Vec<&str> = InvalidReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels, ["syntax", "health_word", "out_of_range", "bad_key"]);
        for (i, r) in InvalidReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        for v in InvalidValue::ALL {
            assert_eq!(InvalidReason::from(v), InvalidReason::ALL[v.index()]);
            assert_eq!(InvalidReason::from(v).label(), v.label());
        }
    }

    #[test]
    fn hasher_spreads_identities_that_differ_in_one_byte() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let build = BuildHasherDefault::<IdentityHasher>::default();
        // The table indexes with the low bits: they must differ too.
        let low: std::collections::HashSet<u64> = (0..1000)
            .map(|i| build.hash_one(format!("be_web/srv{i:04}").as_bytes()) & 0xffff)
            .collect();
        assert!(low.len() > 950, "{} distinct of 1000", low.len());
        assert_ne!(build.hash_one(&b"ab"[..]), build.hash_one(&b"ab\0"[..]));
    }

    #[test]
    fn large_snapshot() {
        let n = 20_000;
        let snap = snapshot(
            (0..n)
                .map(|i| at(&format!("be/srv{i}"), b"drain", i))
                .collect(),
        );
        assert_eq!(snap.len(), n as usize);
        assert_eq!(snap.get(b"be/srv12345"), Some(entry("drain", 12345)));
        assert_eq!(snap.reply(format!("be/srv{n}").as_bytes()), b"ready 100%\n");
    }
}
