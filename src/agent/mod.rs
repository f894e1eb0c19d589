//! The haproxy side: the request-line parser ([`request`], pure) and the
//! per-connection state machine ([`conn`]).
//!
//! Every agent connection ends in exactly one [`Outcome`]: a reply of some
//! admin state, or a named reason for closing without one.

pub mod allow;
pub mod conn;
pub mod hint;
pub mod request;

use crate::labels::label_enum;

label_enum! {
    /// How one agent-check connection ended (metric label `outcome`, fixed:
    /// dashboards outlive refactors).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Outcome {
        Ready => "ready",
        Drain => "drain",
        Maint => "maint",
        /// No complete consul read yet: closed without a reply.
        NotSynced => "not_synced",
        TooLong => "too_long",
        ControlByte => "control_byte",
        Empty => "empty",
        /// Bytes but no newline, then timeout, close or reset: an `agent-send`
        /// missing its `\n`.
        NoNewline => "no_newline",
        Timeout => "timeout",
        PeerClosed => "peer_closed",
        IoError => "io_error",
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
    fn only_the_three_admin_states_are_replies() {
        let replies: Vec<_> = Outcome::ALL.iter().filter(|o| o.is_reply()).collect();
        assert_eq!(replies, [&Outcome::Ready, &Outcome::Drain, &Outcome::Maint]);
    }
}
