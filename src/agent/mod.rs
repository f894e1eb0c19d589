//! The haproxy side: the request-line parser ([`request`], pure) and the
//! per-connection state machine ([`conn`]).
//!
//! Every agent connection ends in exactly one [`Outcome`]: a reply of some
//! admin state, or a named reason for closing without one.

pub mod conn;
pub mod hint;
pub mod request;

/// How one agent-check connection ended (metric label `outcome`, fixed:
/// dashboards outlive refactors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ready,
    Drain,
    Maint,
    /// No complete consul read yet: closed without a reply.
    NotSynced,
    TooLong,
    ControlByte,
    Empty,
    /// Bytes but no newline, then timeout, close or reset: an `agent-send`
    /// missing its `\n`.
    NoNewline,
    Timeout,
    PeerClosed,
    IoError,
}

impl Outcome {
    pub const ALL: [Outcome; 11] = [
        Outcome::Ready,
        Outcome::Drain,
        Outcome::Maint,
        Outcome::NotSynced,
        Outcome::TooLong,
        Outcome::ControlByte,
        Outcome::Empty,
        Outcome::NoNewline,
        Outcome::Timeout,
        Outcome::PeerClosed,
        Outcome::IoError,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ready => "ready",
            Outcome::Drain => "drain",
            Outcome::Maint => "maint",
            Outcome::NotSynced => "not_synced",
            Outcome::TooLong => "too_long",
            Outcome::ControlByte => "control_byte",
            Outcome::Empty => "empty",
            Outcome::NoNewline => "no_newline",
            Outcome::Timeout => "timeout",
            Outcome::PeerClosed => "peer_closed",
            Outcome::IoError => "io_error",
        }
    }

    /// Index into [`Outcome::ALL`], for counters kept in a plain array.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl Outcome {
    /// Whether the connection got a reply (its accept-to-reply time goes
    /// into the duration histogram; the rest closed without one).
    pub fn is_reply(self) -> bool {
        matches!(self, Outcome::Ready | Outcome::Drain | Outcome::Maint)
    }
}

impl From<crate::contract::Admin> for Outcome {
    fn from(admin: crate::contract::Admin) -> Self {
        match admin {
            crate::contract::Admin::Ready => Outcome::Ready,
            crate::contract::Admin::Drain => Outcome::Drain,
            crate::contract::Admin::Maint => Outcome::Maint,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_matches_position_in_all() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i, "{o:?}");
        }
    }

    #[test]
    fn only_the_three_admin_states_are_replies() {
        let replies: Vec<_> = Outcome::ALL.iter().filter(|o| o.is_reply()).collect();
        assert_eq!(replies, [&Outcome::Ready, &Outcome::Drain, &Outcome::Maint]);
    }
}
