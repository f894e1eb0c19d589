//! One key's change, pure: what it held, what it becomes, and what the
//! write carries of its record (SPEC §13, "a record survives the
//! runbook").
//!
//! - [`Carried`]: the reason and expiry a write puts, and which it kept.
//! - [`Change`]: whether it writes anything, and its line
//!   (`IDENTITY: before -> after`).

use super::key::{Held, Target};

/// What a write carries in its record and Flags: the reason and the
/// expiry (Unix seconds, 0: none), and whether each was kept from the key
/// it replaces (SPEC §13, "a record survives the runbook").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    pub reason: Option<String>,
    pub until: u32,
    pub kept_reason: bool,
    pub kept_until: bool,
}

impl Carried {
    /// `keeps reason "INC-123", until 2026-12-04T23:28:18Z`, or `None`
    /// when nothing was kept.
    pub fn keeps(&self) -> Option<String> {
        let mut kept = Vec::new();
        if let (true, Some(r)) = (self.kept_reason, &self.reason) {
            kept.push(format!("reason {r:?}"));
        }
        if self.kept_until {
            kept.push(format!("until {}", until(self.until)));
        }
        (!kept.is_empty()).then(|| format!("keeps {}", kept.join(", ")))
    }
}

/// An expiry as shown (Unix seconds, UTC).
pub fn until(e: u32) -> String {
    crate::logging::utc_seconds(u64::from(e))
}

/// One key's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub identity: String,
    pub before: Held,
    pub after: Target,
    /// The reason recorded before (none without a record, or for an
    /// absent key).
    pub reason: Option<String>,
    /// The expiry its Flags carry before (Unix seconds, 0: none).
    pub expiry: u32,
    /// What the write carries.
    pub carried: Carried,
}

impl Change {
    /// Nothing to write: the reply, the reason and the expiry stay as they
    /// are.
    pub fn is_noop(&self) -> bool {
        self.after.is_noop(&self.before)
            && self.expiry == self.carried.until
            && self.reason == self.carried.reason
    }

    /// `IDENTITY: before -> after`, or that it is unchanged; with what the
    /// write keeps of the record it replaces.
    pub fn line(&self) -> String {
        let after_until = |e: u32| match e {
            0 => String::new(),
            e => format!(" until {}", until(e)),
        };
        let before = format!("{}{}", self.before.render(), after_until(self.expiry));
        if self.is_noop() {
            return format!("{}: {before} (unchanged)", self.identity);
        }
        let c = &self.carried;
        let shown = match c.kept_until {
            true => 0,
            false => c.until,
        };
        let mut line = format!(
            "{}: {before} -> {}{}",
            self.identity,
            self.after.render(),
            after_until(shown)
        );
        if let Some(keeps) = c.keeps() {
            line.push_str(&format!(" ({keeps})"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::super::key::tests::pct;
    use super::*;
    use crate::contract::Desired;

    #[test]
    fn changes_render_in_reply_terms() {
        let c = |before, after| {
            Change {
                identity: "be/s1".into(),
                before,
                after,
                expiry: 0,
                reason: None,
                carried: Carried::default(),
            }
            .line()
        };
        assert_eq!(
            c(Held::Absent, Target::Set(Desired::DRAIN)),
            "be/s1: ready 100% (absent) -> drain 100%"
        );
        assert_eq!(
            c(Held::Valid(pct(50), 7), Target::Unset),
            "be/s1: ready 50% -> ready 100% (absent)"
        );
        assert_eq!(
            c(Held::Valid(Desired::DRAIN, 7), Target::Set(Desired::DRAIN)),
            "be/s1: drain 100% (unchanged)"
        );
        assert_eq!(
            c(Held::Absent, Target::Unset),
            "be/s1: ready 100% (absent) (unchanged)"
        );
        assert_eq!(
            c(Held::of(Some((b"drian", 3))), Target::Set(Desired::DRAIN)),
            "be/s1: ready 100% (invalid value \"drian\") -> drain 100%"
        );
        assert_eq!(Held::of(Some((b"maint", 1))).weight(), None);
        assert_eq!(Held::of(Some((b"drain", 1))).weight(), Some(0));
        assert_eq!(Held::of(Some((b"30%", 1))).weight(), Some(30));
        assert_eq!(Held::Absent.weight(), Some(100));
    }

    #[test]
    fn a_change_of_expiry_alone_is_written_and_shown() {
        let c = Change {
            identity: "be/a".into(),
            before: Held::Valid(Desired::DRAIN, 3),
            after: Target::Set(Desired::DRAIN),
            expiry: 0,
            reason: None,
            carried: Carried {
                until: 1_800_000_000,
                ..Carried::default()
            },
        };
        assert!(!c.is_noop());
        assert_eq!(
            c.line(),
            "be/a: drain 100% -> drain 100% until 2027-01-15T08:00:00Z"
        );
        let same = Change {
            expiry: 1_800_000_000,
            ..c
        };
        assert_eq!(
            same.line(),
            "be/a: drain 100% until 2027-01-15T08:00:00Z (unchanged)"
        );
    }
}
