//! The in-memory KV: keys sorted bytewise, a global raft-like index, and
//! tombstones so a prefix's index keeps rising after deletes.
//!
//! In: writes (`put`, `delete`, `delete_tree`) and reads at a caller-given
//! `now` (used only to expire tombstones). Out: entries and the index a
//! consul server would report for a key or prefix.
//!
//! Always holds (consul's `state/kvs.go` and `graveyard.go` rules):
//! - a write that changes nothing (identical PUT, delete of a missing key,
//!   delete-tree matching nothing, failed CAS) touches no index;
//! - every real write takes a new index, greater than all before it;
//! - reported indexes are never below 1;
//! - tombstone expiry wakes nobody and may make a prefix index go backwards
//!   (consul #5498), exactly like a real server's reap.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::{Duration, Instant};

/// Consul's `TombstoneTTL` default.
pub const DEFAULT_TOMBSTONE_TTL: Duration = Duration::from_secs(15 * 60);

/// Index of the first write (consul's raft log has internal entries before
/// any KV write, so user data never sits at index 1).
const FIRST_INDEX: u64 = 10;

/// One live key (consul's `structs.DirEntry` without sessions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    pub flags: u64,
    /// Successful lock acquisitions; always 0 here (no sessions).
    pub lock_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Debug, Clone, Copy)]
struct Tombstone {
    index: u64,
    /// When it was laid; reaped once `ttl` has passed since.
    at: Instant,
}

/// The store. Keys are `String`s compared bytewise (`BTreeMap<String, _>`
/// orders by UTF-8 bytes, which is memdb's radix order).
#[derive(Debug, Clone)]
pub struct Store {
    kvs: BTreeMap<String, Entry>,
    tombstones: BTreeMap<String, Tombstone>,
    /// Last index handed out.
    last_index: u64,
    /// consul's table indexes `kvs` and `tombstones`.
    kvs_index: u64,
    tombstones_index: u64,
    tombstone_ttl: Duration,
    /// Inside [`Store::transaction`]: the last index before it (every
    /// write of the transaction takes the one after).
    txn_base: Option<u64>,
}

impl Default for Store {
    fn default() -> Store {
        Store::new()
    }
}

impl Store {
    pub fn new() -> Store {
        Store {
            kvs: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            last_index: FIRST_INDEX - 1,
            kvs_index: 0,
            tombstones_index: 0,
            tombstone_ttl: DEFAULT_TOMBSTONE_TTL,
            txn_base: None,
        }
    }

    /// How long a tombstone lives (15 min by default; consul's 30 s reap
    /// granularity is not modelled).
    pub fn set_tombstone_ttl(&mut self, ttl: Duration) {
        self.tombstone_ttl = ttl;
    }

    /// Drops tombstones older than the TTL. Touches no index and is not a
    /// change (consul's reap wakes no watcher).
    pub fn reap(&mut self, now: Instant) {
        let ttl = self.tombstone_ttl;
        self.tombstones
            .retain(|_, t| now.saturating_duration_since(t.at) < ttl);
    }

    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.kvs.get(key)
    }

    /// Live entries whose key starts with `prefix` (byte prefix, not path
    /// segments), sorted by key.
    pub fn list<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a Entry)> + 'a {
        self.kvs
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.as_str(), e))
    }

    /// The whole-table index, `max(kvs, tombstones)`, at least 1.
    pub fn table_index(&self) -> u64 {
        self.kvs_index.max(self.tombstones_index).max(1)
    }

    /// Index of a single-key read: the key's ModifyIndex, or the table index
    /// when it is absent (consul's `KVS.Get`).
    pub fn key_index(&self, key: &str) -> u64 {
        match self.kvs.get(key) {
            Some(e) => e.modify_index.max(1),
            None => self.table_index(),
        }
    }

    /// Index of a list under `prefix` (consul's `kvsListTxn`): the highest
    /// ModifyIndex of live keys and Index of tombstones starting with
    /// `prefix`; the table index when both are 0 or `prefix` is empty.
    pub fn prefix_index(&self, prefix: &str) -> u64 {
        if prefix.is_empty() {
            return self.table_index();
        }
        let live = self
            .list(prefix)
            .map(|(_, e)| e.modify_index)
            .max()
            .unwrap_or(0);
        let dead = self
            .tombstones
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, t)| t.index)
            .max()
            .unwrap_or(0);
        match live.max(dead) {
            0 => self.table_index(),
            idx => idx,
        }
    }

    /// Sets `key`. `cas`: `None` writes unconditionally; `Some(0)` only if
    /// the key is absent; `Some(n)` only if its ModifyIndex is `n`. Returns
    /// false only when the CAS check failed. Writing what is already there
    /// succeeds without touching any index.
    pub fn put(&mut self, key: &str, value: &[u8], flags: u64, cas: Option<u64>) -> bool {
        let existing = self.kvs.get(key);
        match (cas, existing) {
            (Some(0), Some(_)) => return false,
            (Some(n), None) if n != 0 => return false,
            (Some(n), Some(e)) if e.modify_index != n => return false,
            _ => {}
        }
        if let Some(e) = existing {
            if e.value == value && e.flags == flags {
                return true;
            }
        }
        let idx = self.next_index();
        match self.kvs.get_mut(key) {
            Some(e) => {
                e.value = value.to_vec();
                e.flags = flags;
                e.modify_index = idx;
            }
            None => {
                let entry = Entry {
                    value: value.to_vec(),
                    flags,
                    lock_index: 0,
                    create_index: idx,
                    modify_index: idx,
                };
                self.kvs.insert(key.to_owned(), entry);
            }
        }
        self.kvs_index = idx;
        true
    }

    /// Deletes `key`, leaving a tombstone. `cas`: `Some(n)` deletes only if
    /// the ModifyIndex is `n` (so `Some(0)` never deletes). Returns false
    /// only when the CAS check failed; true when the key is absent.
    pub fn delete(&mut self, key: &str, cas: Option<u64>, now: Instant) -> bool {
        let Some(e) = self.kvs.get(key) else {
            return true;
        };
        if cas.is_some_and(|n| n != e.modify_index) {
            return false;
        }
        self.kvs.remove(key);
        let idx = self.next_index();
        self.bury(key, idx, now);
        self.kvs_index = idx;
        true
    }

    /// Deletes every key starting with `prefix`, leaving one tombstone keyed
    /// `prefix` (none for `""`). A no-op when nothing matches.
    pub fn delete_tree(&mut self, prefix: &str, now: Instant) {
        let doomed: Vec<String> = self.list(prefix).map(|(k, _)| k.to_owned()).collect();
        if doomed.is_empty() {
            return;
        }
        for k in &doomed {
            self.kvs.remove(k);
        }
        let idx = self.next_index();
        if !prefix.is_empty() {
            self.bury(prefix, idx, now);
        }
        self.kvs_index = idx;
    }

    fn bury(&mut self, key: &str, index: u64, now: Instant) {
        self.tombstones
            .insert(key.to_owned(), Tombstone { index, at: now });
        self.tombstones_index = index;
    }

    fn next_index(&mut self) -> u64 {
        self.last_index = match self.txn_base {
            Some(base) => base + 1,
            None => self.last_index + 1,
        };
        self.last_index
    }

    /// Runs `ops` as one transaction (consul's `Txn`): every write in it
    /// takes the same new index, so a blocking watch sees one change; an
    /// `Err` leaves the store as it was (the ops run on a copy, as memdb's
    /// write transaction does).
    pub fn transaction<T, E>(
        &mut self,
        ops: impl FnOnce(&mut Store) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut draft = self.clone();
        draft.txn_base = Some(self.last_index);
        let done = ops(&mut draft)?;
        draft.txn_base = None;
        *self = draft;
        Ok(done)
    }

    /// The last index handed out (moves on every real write; for
    /// change detection).
    pub fn last_index(&self) -> u64 {
        self.last_index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(s: &Store, prefix: &str) -> Vec<String> {
        s.list(prefix).map(|(k, _)| k.to_owned()).collect()
    }

    #[test]
    fn empty_store_reports_index_one() {
        let s = Store::new();
        assert_eq!(s.table_index(), 1);
        assert_eq!(s.prefix_index(""), 1);
        assert_eq!(s.prefix_index("app/"), 1);
        assert_eq!(s.key_index("k"), 1);
    }

    #[test]
    fn create_then_update_keeps_create_index() {
        let mut s = Store::new();
        assert!(s.put("k", b"1", 0, None));
        let c = s.get("k").unwrap().clone();
        assert!(c.create_index > 1);
        assert_eq!(c.create_index, c.modify_index);
        assert!(s.put("k", b"2", 0, None));
        let u = s.get("k").unwrap();
        assert_eq!(u.create_index, c.create_index);
        assert!(u.modify_index > c.modify_index);
        assert_eq!(u.lock_index, 0);
    }

    #[test]
    fn byte_prefix_match_sorted_bytewise() {
        let mut s = Store::new();
        for k in ["foo/bar", "food", "fo", "foo", "Foo", "foo-", "fop"] {
            s.put(k, b"x", 0, None);
        }
        // '-' (0x2d) < '/' (0x2f) < 'd' (0x64): bytewise, not by segments.
        assert_eq!(keys(&s, "foo"), ["foo", "foo-", "foo/bar", "food"]);
        assert_eq!(keys(&s, "").len(), 7);
        assert_eq!(keys(&s, "")[0], "Foo");
    }

    #[test]
    fn identical_put_changes_no_index() {
        let mut s = Store::new();
        s.put("a/k", b"v", 3, None);
        let (idx, last) = (s.prefix_index("a/"), s.last_index());
        assert!(s.put("a/k", b"v", 3, None));
        assert_eq!(s.prefix_index("a/"), idx);
        assert_eq!(s.last_index(), last);
        // Same value, different flags is a real write.
        s.put("a/k", b"v", 4, None);
        assert!(s.prefix_index("a/") > idx);
    }

    #[test]
    fn delete_leaves_tombstone_so_prefix_index_rises() {
        let mut s = Store::new();
        let now = Instant::now();
        s.put("app/a", b"1", 0, None);
        s.put("app/b", b"2", 0, None);
        let before = s.prefix_index("app/");
        assert_eq!(before, s.get("app/b").unwrap().modify_index);
        s.delete("app/b", None, now);
        assert!(s.get("app/b").is_none());
        // Without the tombstone the index would fall back to app/a's.
        assert!(s.prefix_index("app/") > before);
        assert_eq!(s.prefix_index("app/"), s.table_index());
    }

    #[test]
    fn delete_of_missing_key_is_a_no_op() {
        let mut s = Store::new();
        let now = Instant::now();
        s.put("k", b"1", 0, None);
        let last = s.last_index();
        assert!(s.delete("nope", None, now));
        s.delete_tree("nope/", now);
        assert_eq!(s.last_index(), last);
        assert_eq!(s.table_index(), last);
    }

    #[test]
    fn delete_tree_leaves_one_tombstone_at_prefix() {
        let mut s = Store::new();
        let now = Instant::now();
        s.put("app/a", b"1", 0, None);
        s.put("app/b", b"1", 0, None);
        s.put("other", b"1", 0, None);
        s.delete_tree("app/", now);
        assert!(keys(&s, "app/").is_empty());
        assert_eq!(keys(&s, ""), ["other"]);
        let idx = s.last_index();
        assert_eq!(s.prefix_index("app/"), idx);
        assert_eq!(s.prefix_index("ap"), idx);
        assert_eq!(s.tombstones.len(), 1);
        // The tombstone `app/` does not start with `app/sub/`: that query
        // falls back to the table index (still monotonic).
        assert_eq!(s.prefix_index("app/sub/"), s.table_index());
    }

    #[test]
    fn delete_tree_of_root_leaves_no_tombstone() {
        let mut s = Store::new();
        let now = Instant::now();
        s.put("a", b"1", 0, None);
        s.put("b", b"1", 0, None);
        s.delete_tree("", now);
        assert!(keys(&s, "").is_empty());
        assert!(s.tombstones.is_empty());
        assert_eq!(s.table_index(), s.last_index());
    }

    #[test]
    fn tombstone_expiry_makes_index_go_backwards() {
        let mut s = Store::new();
        s.set_tombstone_ttl(Duration::from_secs(60));
        let t0 = Instant::now();
        s.put("app/a", b"1", 0, None);
        let a_idx = s.get("app/a").unwrap().modify_index;
        s.put("app/b", b"1", 0, None);
        s.delete("app/b", None, t0);
        let high = s.prefix_index("app/");
        assert!(high > a_idx);
        s.reap(t0 + Duration::from_secs(59));
        assert_eq!(s.prefix_index("app/"), high);
        s.reap(t0 + Duration::from_secs(60));
        // Consul #5498: the KV list whose highest index was deleted.
        assert_eq!(s.prefix_index("app/"), a_idx);
        assert!(s.prefix_index("app/") < high);
    }

    #[test]
    fn put_cas() {
        let mut s = Store::new();
        assert!(
            !s.put("k", b"1", 0, Some(5)),
            "cas=N on a missing key fails"
        );
        assert!(s.get("k").is_none());
        assert!(s.put("k", b"1", 0, Some(0)), "cas=0 creates");
        let m = s.get("k").unwrap().modify_index;
        assert!(
            !s.put("k", b"2", 0, Some(0)),
            "cas=0 on an existing key fails"
        );
        assert!(!s.put("k", b"2", 0, Some(m + 1)));
        assert_eq!(s.get("k").unwrap().value, b"1");
        assert!(s.put("k", b"2", 0, Some(m)));
        assert_eq!(s.get("k").unwrap().value, b"2");
        assert!(s.get("k").unwrap().modify_index > m);
    }

    #[test]
    fn delete_cas() {
        let mut s = Store::new();
        let now = Instant::now();
        assert!(s.delete("k", Some(7), now), "absent key: true");
        s.put("k", b"1", 0, None);
        let m = s.get("k").unwrap().modify_index;
        assert!(!s.delete("k", Some(0), now), "cas=0 never deletes");
        assert!(!s.delete("k", Some(m + 1), now));
        assert!(s.get("k").is_some());
        assert!(s.delete("k", Some(m), now));
        assert!(s.get("k").is_none());
    }

    #[test]
    fn missing_key_index_is_table_index() {
        let mut s = Store::new();
        s.put("a", b"1", 0, None);
        s.put("b", b"1", 0, None);
        assert_eq!(s.key_index("a"), s.get("a").unwrap().modify_index);
        assert_eq!(s.key_index("zzz"), s.table_index());
        assert!(s.key_index("a") < s.table_index());
    }
}
