//! The snapshot the responder answers from (SPEC §2): identity -> desired
//! state, built whole from one consul listing and swapped whole.
//!
//! In: the normalised KV prefix, the consul index, and the decoded KV pairs.
//! Out: a [`Snapshot`] whose lookup is one hash probe returning `'static`
//! reply bytes, plus the keys that were dropped and why. Always holds: an
//! invalid key or value never reaches the map; an identity that is not in the
//! map answers [`Desired::READY`].

use std::collections::HashMap;

use crate::consul::kv::KvPair;
use crate::contract::{Desired, InvalidValue};

/// Why a KV key was dropped (metric label `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    Syntax,
    HealthWord,
    OutOfRange,
    /// The key can never be asked for: empty identity, trailing `/`,
    /// surrounding whitespace, control bytes, or not under the prefix.
    BadKey,
}

impl InvalidReason {
    pub const ALL: [InvalidReason; 4] = [
        InvalidReason::Syntax,
        InvalidReason::HealthWord,
        InvalidReason::OutOfRange,
        InvalidReason::BadKey,
    ];

    pub fn label(self) -> &'static str {
        match self {
            InvalidReason::Syntax => "syntax",
            InvalidReason::HealthWord => "health_word",
            InvalidReason::OutOfRange => "out_of_range",
            InvalidReason::BadKey => "bad_key",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

impl From<InvalidValue> for InvalidReason {
    fn from(v: InvalidValue) -> Self {
        match v {
            InvalidValue::Syntax => InvalidReason::Syntax,
            InvalidValue::HealthWord => InvalidReason::HealthWord,
            InvalidValue::OutOfRange => InvalidReason::OutOfRange,
        }
    }
}

/// One valid identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub desired: Desired,
    pub modify_index: u64,
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
    entries: HashMap<Box<[u8]>, Entry>,
    invalid: Vec<InvalidKey>,
}

impl Snapshot {
    /// Builds a snapshot from a listing of `prefix/` (prefix already without
    /// leading/trailing `/`). Keys not starting with `prefix/`, or whose
    /// suffix fails [`crate::contract::parse_identity`], are `BadKey`; values
    /// failing [`crate::contract::parse_value`] are dropped with their reason.
    pub fn build(prefix: &str, index: u64, pairs: Vec<KvPair>) -> Snapshot {
        todo!("{prefix} {index} {pairs:?}")
    }

    /// The consul index this snapshot is as of.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The reply for an identity: its entry's reply, else `ready 100%\n`.
    pub fn reply(&self, identity: &[u8]) -> &'static [u8] {
        todo!("{identity:?}")
    }

    /// The entry for an identity, if the KV holds a valid value for it.
    pub fn get(&self, identity: &[u8]) -> Option<Entry> {
        todo!("{identity:?}")
    }

    /// Valid identities, in no particular order. Identities are valid UTF-8
    /// (they come from consul keys).
    pub fn entries(&self) -> impl Iterator<Item = (&str, Entry)> {
        self.entries.iter().map(|(k, e)| (std::str::from_utf8(k).unwrap_or(""), *e))
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

    /// Every identity whose entry differs between `old` and `self` (added,
    /// removed, or changed desired state or modify index), sorted by identity.
    pub fn changes_from<'a>(&'a self, old: &'a Snapshot) -> Vec<Change<'a>> {
        todo!("{old:?}")
    }

    /// The invalid keys of `self` that are new or differ (value, reason or
    /// modify index) from `old`'s: logged once per change, not per request.
    pub fn new_invalid_since<'a>(&'a self, old: &Snapshot) -> Vec<&'a InvalidKey> {
        todo!("{old:?}")
    }
}
