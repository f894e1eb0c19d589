//! A key as the writers read it and what a write makes it, pure.
//!
//! - [`Held`]: absent, a valid value, or one the agent ignores, each with
//!   the ModifyIndex a check-and-set must name; shown in reply terms.
//! - [`Target`]: a value or a delete; whether it changes what is held,
//!   and whether a re-read finds it written ([`Target::is_held_in`],
//!   [`moved`]).

use crate::contract::record::cut;
use crate::contract::{parse_value, Admin, Desired};

/// How much of a value the writers show.
pub const SHOWN_VALUE_BYTES: usize = 80;

/// A key's state in KV, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    Absent,
    Valid(Desired, u64),
    /// A value the agent ignores (it answers `ready 100%`).
    Invalid(String, u64),
}

impl Held {
    pub fn of(value: Option<(&[u8], u64)>) -> Held {
        match value {
            None => Held::Absent,
            Some((raw, index)) => match parse_value(raw) {
                Ok(d) => Held::Valid(d, index),
                Err(_) => Held::Invalid(String::from_utf8_lossy(raw).into_owned(), index),
            },
        }
    }

    /// The ModifyIndex a check-and-set must name (0: must be absent).
    pub fn index(&self) -> u64 {
        match self {
            Held::Absent => 0,
            Held::Valid(_, i) | Held::Invalid(_, i) => *i,
        }
    }

    /// The reply the agent writes for it, with why when not the value's.
    pub fn render(&self) -> String {
        match self {
            Held::Absent => format!("{} (absent)", reply(Desired::READY)),
            Held::Valid(d, _) => reply(*d),
            Held::Invalid(raw, _) => format!(
                "{} (invalid value {:?})",
                reply(Desired::READY),
                cut(raw, SHOWN_VALUE_BYTES)
            ),
        }
    }

    /// The reply the agent writes for it.
    pub fn reply(&self) -> Desired {
        match self {
            Held::Valid(d, _) => *d,
            Held::Absent | Held::Invalid(..) => Desired::READY,
        }
    }

    /// The weight a ramp starts from: `None` for `maint` (no weight).
    pub fn weight(&self) -> Option<u16> {
        match self {
            Held::Valid(d, _) => match d.admin() {
                Admin::Ready => Some(d.weight_pct()),
                Admin::Drain => Some(0),
                Admin::Maint => None,
            },
            Held::Absent | Held::Invalid(..) => Some(100),
        }
    }
}

/// The reply line without its `\n`.
pub fn reply(d: Desired) -> String {
    String::from_utf8_lossy(d.reply()).trim_end().to_owned()
}

/// What one key is to become: a value, or deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Set(Desired),
    Unset,
}

impl Target {
    /// A weight other than 0% and 100%, which a static-algorithm backend
    /// ignores.
    pub fn intermediate(self) -> bool {
        matches!(self, Target::Set(d) if !matches!(d.weight_pct(), 0 | 100))
    }

    /// The value written, `None` for a delete.
    pub fn value(self) -> Option<Desired> {
        match self {
            Target::Set(d) => Some(d),
            Target::Unset => None,
        }
    }

    pub fn render(self) -> String {
        match self {
            Target::Set(d) => reply(d),
            Target::Unset => format!("{} (absent)", reply(Desired::READY)),
        }
    }

    /// Whether writing it over `held` changes nothing: a value whose reply
    /// is the reply of the valid value (or absence) held, or a delete of an
    /// absent key. A value over an invalid one is written: it fixes it.
    pub fn is_noop(self, held: &Held) -> bool {
        match (self, held) {
            (Target::Set(d), Held::Valid(..) | Held::Absent) => d.reply() == held.reply().reply(),
            (Target::Unset, Held::Absent) => true,
            _ => false,
        }
    }

    /// Whether `held` (read after the write) is this target, written at an
    /// index other than `guard` (the one the write was guarded by).
    pub fn is_held_in(self, held: &Held, guard: u64) -> bool {
        match (self, held) {
            (Target::Set(d), Held::Valid(h, i)) => d == *h && *i != guard,
            (Target::Unset, Held::Absent) => true,
            _ => false,
        }
    }
}

/// A key that a transaction's check-and-set can no longer match: its
/// ModifyIndex moved from the one the write is guarded by, to something
/// that is not the write's target. Consul never commits such a write
/// (`agent/consul/state/kvs.go` `kvsSetCASTxn`: a cas whose index differs
/// from the entry's "return false"; `txn.go` `TxnRW` applies all or
/// nothing), so after a lost answer it is a conflict, not an unknown: the
/// position of the first such key.
pub fn moved(targets: &[Target], held: &[Held], guards: &[u64]) -> Option<usize> {
    targets
        .iter()
        .zip(held)
        .zip(guards)
        .position(|((t, h), &g)| h.index() != g && !t.is_held_in(h, g))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `ready N%`.
    pub(in crate::cli::write) fn pct(n: u16) -> Desired {
        Desired::ready_pct(n).unwrap()
    }

    /// After a lost answer: a key moved elsewhere (another writer) is the
    /// one named; a key at our target at a new index (applied), or as it
    /// was (not applied yet), is not.
    #[test]
    fn a_key_moved_elsewhere_is_named_and_ours_or_unmoved_are_not() {
        let ready = |pct| Target::Set(Desired::ready_pct(pct).unwrap());
        let valid = |pct, i| Held::Valid(Desired::ready_pct(pct).unwrap(), i);
        let targets = [ready(50), ready(50), Target::Unset];
        let guards = [10, 11, 12];
        let unmoved = [valid(25, 10), valid(25, 11), valid(25, 12)];
        assert_eq!(moved(&targets, &unmoved, &guards), None);
        let applied = [valid(50, 20), valid(50, 20), Held::Absent];
        assert_eq!(moved(&targets, &applied, &guards), None);
        let operator = [
            valid(25, 10),
            Held::Valid(Desired::DRAIN, 15),
            valid(25, 12),
        ];
        assert_eq!(moved(&targets, &operator, &guards), Some(1));
        let deleted = [Held::Absent, valid(25, 11), valid(25, 12)];
        assert_eq!(moved(&targets, &deleted, &guards), Some(0));
    }

    #[test]
    fn a_write_answering_as_the_valid_value_held_is_unchanged_but_one_over_an_invalid_value_is_written(
    ) {
        assert!(Target::Set(Desired::READY).is_noop(&Held::Absent));
        assert!(Target::Set(pct(100)).is_noop(&Held::Absent));
        assert!(Target::Set(Desired::READY).is_noop(&Held::Valid(pct(100), 3)));
        assert!(!Target::Set(Desired::READY).is_noop(&Held::of(Some((b"drian", 3)))));
        assert!(!Target::Set(Desired::DRAIN).is_noop(&Held::Absent));
        assert!(!Target::Unset.is_noop(&Held::Valid(Desired::READY, 3)));
    }

    #[test]
    fn values_are_shown_cut_to_80_bytes() {
        let raw = "x".repeat(500 * 1024);
        let held = Held::of(Some((raw.as_bytes(), 3)));
        let shown = held.render();
        assert!(shown.len() < 140, "{shown}");
        assert!(shown.contains(&format!("{}…", "x".repeat(80))), "{shown}");
        assert_eq!(cut("héllo", 2), "h…", "on a character boundary");
    }
}
