//! The asks and the unasked keys over a virtual clock: a swapper fed
//! snapshots and checks at chosen instants, swept at chosen instants.

use std::time::{Duration, Instant, SystemTime};

use super::*;
use crate::kv::KvPair;
use crate::slice::Slice;
use crate::state::{Clock, Snapshot};

const PREFIX: &str = "p";
const MINUTE: Duration = Duration::from_secs(60);

struct World {
    t0: Instant,
    state: Swapper,
    unasked: Unasked,
}

impl World {
    fn new(max_strangers: usize) -> World {
        let t0 = Instant::now();
        World {
            t0,
            state: Swapper::new(PREFIX, Clock::new(t0, SystemTime::now()), max_strangers),
            unasked: Unasked::new(MINUTE, t0),
        }
    }

    fn at(&self, secs: u64) -> Instant {
        self.t0 + Duration::from_secs(secs)
    }

    /// A complete read at `secs`: `(identity, value, ModifyIndex)`, its
    /// asks carried over at once.
    fn swap(&mut self, secs: u64, pairs: &[(&str, &str, u64)]) {
        self.swap_only(secs, pairs);
        while self.state.busy() {
            self.state.step(&mut Slice::unlimited());
        }
    }

    /// The swap alone: the old state not yet retired.
    fn swap_only(&mut self, secs: u64, pairs: &[(&str, &str, u64)]) {
        let pairs = pairs
            .iter()
            .map(|(k, v, i)| KvPair {
                key: format!("{PREFIX}/{k}"),
                value: v.as_bytes().to_vec(),
                modify_index: *i,
                flags: 0,
            })
            .collect();
        let at = self.at(secs);
        self.state.swap(Snapshot::build(PREFIX, 1, pairs), at);
    }

    /// haproxy asks for each identity every 2 s from `from` to `to`.
    fn checks(&mut self, ids: &[&str], from: u64, to: u64) {
        for s in (from..=to).step_by(2) {
            for id in ids {
                let at = self.at(s);
                assert!(self.state.answer(id.as_bytes(), at).is_some());
            }
        }
    }

    fn sweep(&mut self, secs: u64) -> Swept {
        let at = self.at(secs);
        self.unasked
            .step(&mut self.state, at, &mut Slice::unlimited())
    }

    fn unasked(&self) -> Vec<(&str, Option<&str>)> {
        let mut v: Vec<_> = self
            .unasked
            .iter()
            .map(|(id, f)| (id, f.suggestion.as_ref().and_then(|s| s.as_deref())))
            .collect();
        v.sort();
        v
    }
}

#[test]
fn a_typo_is_unasked_after_the_window_with_the_identity_meant() {
    let mut w = World::new(100);
    w.swap(
        0,
        &[("be_web/srv01", "drain", 5), ("be_web/srv2", "maint", 6)],
    );
    w.checks(&["be_web/srv1", "be_web/srv2", "be_web/srv3"], 0, 70);
    assert_eq!(w.sweep(59), Swept::default(), "not before -unasked-after");
    assert!(w.unasked.is_empty());
    assert_eq!(w.sweep(61).warned, 1);
    assert_eq!(w.unasked(), [("be_web/srv01", Some("be_web/srv1"))]);
    let f = w.unasked.get("be_web/srv01").unwrap();
    assert!(f.last_asked.is_never());
    assert_eq!(f.entry.modify_index, 5);
    assert_eq!(w.sweep(66), Swept::default(), "warned once per key");
    assert_eq!(w.unasked.len(), 1);
}

#[test]
fn ready_keys_and_asked_keys_are_never_unasked() {
    let mut w = World::new(100);
    w.swap(
        0,
        &[
            ("b/ready", "ready", 1),
            ("b/full", "100%", 1),
            ("b/half", "50%", 1),
        ],
    );
    w.checks(&["b/half"], 0, 200);
    w.sweep(200);
    assert!(w.unasked.is_empty(), "{:?}", w.unasked());
}

#[test]
fn a_key_stops_being_unasked_when_asked_rewritten_or_deleted_and_warns_again_only_anew() {
    let mut w = World::new(100);
    let keys = [
        ("b/asked", "drain", 1),
        ("b/rewritten", "drain", 1),
        ("b/deleted", "drain", 1),
    ];
    w.swap(0, &keys);
    assert_eq!(w.sweep(61).warned, 3);
    w.checks(&["b/asked"], 62, 200);
    w.swap(63, &[("b/asked", "drain", 1), ("b/rewritten", "maint", 9)]);
    assert_eq!(
        w.sweep(64),
        Swept {
            warned: 0,
            cleared: 3
        }
    );
    assert!(w.unasked.is_empty());
    // The rewrite counts from its own swap, not from the start.
    assert_eq!(w.sweep(122).warned, 0);
    assert_eq!(w.sweep(124).warned, 1, "unasked again, warned again");
    assert_eq!(w.unasked(), [("b/rewritten", None)]);
}

#[test]
fn asks_survive_swaps_and_a_swap_does_not_restart_the_window() {
    let mut w = World::new(100);
    w.swap(0, &[("b/a", "drain", 1), ("b/xyzzy", "drain", 1)]);
    w.checks(&["b/a"], 0, 10);
    // Swaps of other keys keep b/a's last ask and b/xyzzy's since.
    w.swap(
        20,
        &[
            ("b/a", "drain", 1),
            ("b/xyzzy", "drain", 1),
            ("b/c", "ready", 2),
        ],
    );
    w.swap(
        40,
        &[
            ("b/a", "drain", 1),
            ("b/xyzzy", "drain", 1),
            ("b/c", "ready", 3),
        ],
    );
    let last = |w: &World, id: &str| {
        w.state
            .current()
            .unwrap()
            .asks(id.as_bytes(), None)
            .map(|a| a.0)
    };
    assert_eq!(last(&w, "b/a"), Some(w.state.clock().tick(w.at(10))));
    assert_eq!(w.sweep(61).warned, 1, "b/xyzzy: 61 s since its write");
    assert_eq!(w.unasked(), [("b/xyzzy", None)]);
    assert_eq!(w.sweep(71).warned, 1, "b/a: 61 s since its last ask");
}

#[test]
fn a_sweep_waits_for_the_asks_to_be_carried_over() {
    let mut w = World::new(100);
    let keys = [
        ("b/a", "drain", 1),
        ("b/b", "drain", 1),
        ("b/c", "ready", 1),
    ];
    w.swap(0, &keys);
    assert_eq!(w.sweep(61).warned, 2);
    // A swap of another key: until the carry-over is done, b/a and b/b
    // look new (born at the swap); a sweep then would clear them and warn
    // again later.
    w.swap_only(
        62,
        &[
            ("b/a", "drain", 1),
            ("b/b", "drain", 1),
            ("b/c", "ready", 2),
        ],
    );
    assert!(w.state.carrying_from().is_some());
    // Meanwhile what is shown of b/a's asks is what will be carried over.
    let (t0, at61) = (
        w.state.clock().tick(w.at(0)),
        w.state.clock().tick(w.at(61)),
    );
    let now = w.state.current().unwrap();
    assert_eq!(
        now.asks(b"b/a", None),
        Some((Tick::NEVER, w.state.clock().tick(w.at(62)), false))
    );
    assert_eq!(
        now.asks(b"b/a", w.state.carrying_from()),
        Some((Tick::NEVER, t0, false))
    );
    w.state.answer(b"b/c", w.at(61));
    let now = w.state.current().unwrap();
    let c = now.asks(b"b/c", w.state.carrying_from()).unwrap();
    assert_eq!(c.0, at61, "asked in the new state");
    assert_eq!(w.sweep(63), Swept::default());
    assert_eq!(
        w.unasked.due(),
        w.at(63),
        "back as soon as the loop is free"
    );
    assert_eq!(w.unasked.len(), 2);
    w.state.step(&mut Slice::items(1));
    while w.state.busy() {
        w.state.step(&mut Slice::unlimited());
    }
    assert_eq!(
        w.sweep(64),
        Swept::default(),
        "still unasked, not warned again"
    );
    assert_eq!(w.unasked.len(), 2);
}

#[test]
fn a_stranger_keeps_its_last_ask_when_it_gets_a_key_and_gets_it_back_when_deleted() {
    let mut w = World::new(100);
    w.swap(0, &[]);
    w.checks(&["b/s"], 0, 4);
    let at4 = w.state.clock().tick(w.at(4));
    assert_eq!(w.state.strangers().last(b"b/s"), at4);
    w.swap(10, &[("b/s", "drain", 2)]);
    assert_eq!(
        w.state.current().unwrap().asks(b"b/s", None).map(|a| a.0),
        Some(at4)
    );
    assert!(w.state.strangers().is_empty(), "no longer without a key");
    w.checks(&["b/s"], 12, 12);
    w.swap(20, &[]);
    let at12 = w.state.clock().tick(w.at(12));
    assert_eq!(w.state.strangers().last(b"b/s"), at12);
}

#[test]
fn a_key_never_asked_since_the_start_counts_from_the_start_not_its_write() {
    // The state file's snapshot is loaded at the agent's start: its keys
    // were written long before, but the window starts now.
    let mut w = World::new(100);
    let old = Snapshot::build(
        PREFIX,
        1,
        vec![KvPair {
            key: "p/b/a".into(),
            value: b"maint".to_vec(),
            modify_index: 1,
            flags: 0,
        }],
    );
    let t0 = w.t0;
    w.state.load(old, SystemTime::UNIX_EPOCH, t0);
    assert_eq!(w.sweep(60).warned, 0);
    assert_eq!(w.sweep(61).warned, 1);
}

#[test]
fn a_key_asked_more_often_than_the_window_is_never_unasked_whatever_the_phase() {
    // Whole-second ticks: with -unasked-after 1s and an ask every 0.4 s, a
    // sweep just after a second boundary sees the last ask a tick ago.
    let mut w = World::new(10);
    w.unasked = Unasked::new(Duration::from_secs(1), w.t0);
    w.swap(0, &[("b/a", "drain", 1)]);
    for i in 0..50u64 {
        let at = w.t0 + Duration::from_millis(400 * i);
        w.state.answer(b"b/a", at);
        let sweep_at = w.t0 + Duration::from_millis(400 * i + 399);
        assert_eq!(
            w.unasked
                .step(&mut w.state, sweep_at, &mut Slice::unlimited())
                .warned,
            0,
            "ask {i}"
        );
    }
    // Two whole seconds later it is.
    let later = w.t0 + Duration::from_millis(400 * 49 + 2_001);
    assert_eq!(
        w.unasked
            .step(&mut w.state, later, &mut Slice::unlimited())
            .warned,
        1
    );
}

#[test]
fn a_sweep_over_many_keys_and_candidates_takes_many_slices_with_checks_between() {
    let mut w = World::new(200_000);
    // 2,000 diverted keys nobody asks for, 100,000 identities asked (the
    // review's stall: each key's suggestion searched every candidate).
    let keys: Vec<String> = (0..2000).map(|i| format!("be/key{i}")).collect();
    let pairs: Vec<(&str, &str, u64)> = keys.iter().map(|k| (k.as_str(), "drain", 1)).collect();
    w.swap(0, &pairs);
    let at = w.at(60);
    for i in 0..100_000 {
        w.state.answer(format!("be/other{i}").as_bytes(), at);
    }
    w.state.answer(b"be/kex2", at);
    let (mut slices, mut warned) = (0, 0);
    let now = w.at(61);
    loop {
        warned += w
            .unasked
            .step(&mut w.state, now, &mut Slice::items(5_000))
            .warned;
        slices += 1;
        if w.unasked.due() > now {
            break; // swept: the next one is a period away
        }
        // Between slices the loop answers checks.
        assert!(w.state.answer(b"be/other7", now).is_some());
        assert!(slices < 10_000, "a sweep must end");
    }
    assert_eq!(warned, 2000);
    assert!(slices > 20, "{slices} slices");
    assert_eq!(
        w.unasked.get("be/key2").unwrap().suggestion,
        Some(Some("be/kex2".into()))
    );
    // A swap (another key written) sweeps again at once, but the keys
    // already warned about keep their suggestion: no search, no warning.
    let mut more = pairs.clone();
    more.push(("be/new", "ready", 2));
    w.swap(62, &more);
    let at = w.at(62);
    w.unasked.soon(at);
    let mut slices = 0;
    let mut again = Swept::default();
    while slices == 0 || w.unasked.due() <= at {
        let s = w.unasked.step(&mut w.state, at, &mut Slice::items(5_000));
        again.warned += s.warned;
        again.cleared += s.cleared;
        slices += 1;
    }
    assert_eq!(again, Swept::default());
    assert!(
        slices < 10,
        "marking 2,000 keys, no suggestions: {slices} slices"
    );
}

#[test]
fn old_strangers_are_forgotten_making_room() {
    let mut w = World::new(2);
    w.swap(0, &[]);
    w.checks(&["b/1", "b/2"], 0, 0);
    w.checks(&["b/3"], 10, 10);
    assert_eq!(w.state.strangers().overflow(), 1);
    w.checks(&["b/2"], 500, 500);
    w.sweep(599);
    assert_eq!(w.state.strangers().len(), 2, "not ten minutes yet for b/1");
    w.sweep(700);
    assert_eq!(w.state.strangers().len(), 1, "b/1 forgotten, b/2 kept");
    w.checks(&["b/3"], 701, 701);
    assert_eq!(w.state.strangers().len(), 2);
}

/// The closest of `asked` (identity, keyed) to `identity`, searched at once.
fn closest(identity: &[u8], asked: &[(&str, bool)]) -> Option<String> {
    let mut index = Index::default();
    for (id, keyed) in asked {
        index.add(id.as_bytes(), *keyed);
    }
    let mut search = Search::default();
    search
        .run(identity, &index, &mut Slice::unlimited())
        .expect("an unlimited slice ends the search")
}

#[test]
fn the_closest_identity_is_suggested_only_when_close() {
    let asked = [
        ("be_web/srv1", false),
        ("be_web/srv2", false),
        ("be_api/srv1", true),
    ];
    assert_eq!(
        closest(b"be_web/srv01", &asked).as_deref(),
        Some("be_web/srv1")
    );
    assert_eq!(
        closest(b"be_web/srv9", &asked).as_deref(),
        Some("be_web/srv1"),
        "tie: by name"
    );
    assert_eq!(
        closest(b"be_wbe/srv1", &asked).as_deref(),
        Some("be_web/srv1")
    );
    assert_eq!(
        closest(b"be_ap/srv1", &asked).as_deref(),
        Some("be_api/srv1")
    );
    assert_eq!(closest(b"totally/else", &asked), None);
    assert_eq!(
        closest(b"be_web/srv1", &asked).as_deref(),
        Some("be_web/srv2"),
        "never itself"
    );
    // A tie between a keyed and an unkeyed identity: the unkeyed one.
    let tie = [("b/s1", true), ("b/s3", false)];
    assert_eq!(closest(b"b/s2", &tie).as_deref(), Some("b/s3"));
}

#[test]
fn edit_distance_is_levenshtein_within_a_bound() {
    let mut row = Vec::new();
    let mut d = |a: &str, b: &str, max| edit_distance(a.as_bytes(), b.as_bytes(), max, &mut row);
    assert_eq!(d("srv01", "srv1", 2), Some(1));
    assert_eq!(d("kitten", "sitting", 3), Some(3));
    assert_eq!(d("kitten", "sitting", 2), None);
    assert_eq!(d("", "abc", 3), Some(3));
    assert_eq!(d("abc", "", 2), None);
    assert_eq!(d("same", "same", 0), Some(0));
    assert_eq!(d("ab", "ba", 2), Some(2));
    assert_eq!(d("abcdefgh", "xbcdefgx", 1), None, "given up early");
}
