//! The KV contract (SPEC §2), pure: KV value bytes -> [`Desired`] -> reply
//! bytes, and KV key suffix -> identity.
//!
//! In: raw KV values (already base64-decoded) and key suffixes below the
//! prefix. Out: a typed desired state or the reason it is invalid, and the
//! canonical reply line. Always holds: every reply names an admin state *and*
//! a weight, ends in `\n`, and is one of a fixed set of `'static` strings, so
//! the hot path never formats or allocates.

/// The admin state haproxy is told to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admin {
    Ready,
    Drain,
    Maint,
}

/// A valid KV value, decoded once per consul update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Desired {
    admin: Admin,
    /// Weight as a percentage of the server line's configured weight, 0..=256.
    weight_pct: u16,
}

/// Why a KV value is invalid (metric label `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidValue {
    /// Not a word of the grammar: empty, control or non-UTF-8 bytes, several
    /// words, a sign, a fraction, `maxconn:N`, anything unknown.
    Syntax,
    /// `up`, `down`, `stopped`, `fail`: health belongs to haproxy's checks.
    HealthWord,
    /// `N%` with N past 256.
    OutOfRange,
}

impl Desired {
    /// The absent-key state: `ready 100%`.
    pub const READY: Desired = Desired { admin: Admin::Ready, weight_pct: 100 };

    pub fn admin(self) -> Admin {
        self.admin
    }

    pub fn weight_pct(self) -> u16 {
        self.weight_pct
    }

    /// The canonical reply line, `\n` included: `ready N%\n`, `drain 100%\n`,
    /// `maint 100%\n`. A `'static` slice from a table built once.
    pub fn reply(self) -> &'static [u8] {
        todo!()
    }
}

impl std::fmt::Display for Desired {
    /// The canonical KV spelling: `ready`, `drain`, `maint` or `N%`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        todo!("{f:p}")
    }
}

impl InvalidValue {
    pub fn label(self) -> &'static str {
        todo!()
    }
}

/// Parses a KV value per SPEC §2 (trim ASCII whitespace, case-insensitive
/// words, `N%` with 1-3 digits and N <= 256).
pub fn parse_value(raw: &[u8]) -> Result<Desired, InvalidValue> {
    todo!("{raw:?}")
}

/// Checks a key suffix (the part below `prefix/`) can ever be asked for by an
/// agent-send line: non-empty, not ending in `/`, no leading or trailing ASCII
/// whitespace, no control bytes (incl. CR, LF, DEL). Returns it as the identity.
pub fn parse_identity(suffix: &str) -> Option<&str> {
    todo!("{suffix}")
}
