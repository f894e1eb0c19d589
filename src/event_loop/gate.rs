//! When a listener may accept: a connection limit with hysteresis, a
//! pause after accept errors, and accepting again without an event.
//!
//! In: the open connections at each accept and close, accept errors, the
//! time. Out: whether to accept now, whether to come back for more without
//! an event, and when.
//!
//! Always holds:
//! - at the limit the gate closes and stays closed until the open
//!   connections fall below 90 % of it (new connections wait in the
//!   kernel's backlog meanwhile), so a fleet at the limit does not flap;
//! - after an error such as EMFILE it pauses for [`ACCEPT_PAUSE`] instead
//!   of spinning on it.
//!
//! Modelled on sozu's `SessionManager`.

use std::io;
use std::time::{Duration, Instant};

use log::{info, warn};

/// After EMFILE/ENFILE, retry accepting after this (no busy loop).
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Repeated accept-error warnings at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What a failed `accept` means for the accept loop.
pub enum AcceptError {
    /// Nothing more waiting (`WouldBlock`).
    Drained,
    /// Interrupted, or a connection aborted before it was accepted: go on.
    Retry,
    /// Anything else (EMFILE, ENFILE, ENOBUFS ...): stop for now.
    Failed(io::Error),
}

impl From<io::Error> for AcceptError {
    fn from(e: io::Error) -> AcceptError {
        match e.kind() {
            io::ErrorKind::WouldBlock => AcceptError::Drained,
            io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => AcceptError::Retry,
            _ => AcceptError::Failed(e),
        }
    }
}

/// The gate's answer to "may I accept one more?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Closed or paused.
    No,
    /// The limit was reached just now: the gate closed (counted once per
    /// closing).
    Closing,
}

/// The accept gate of one listener (or of a group sharing one pause).
#[derive(Debug)]
pub struct AcceptGate {
    limit: usize,
    open: bool,
    paused_until: Option<Instant>,
    /// Accept again without waiting for an event (edge-triggered
    /// readiness does not repeat for connections already waiting).
    pending: bool,
    last_warning: Option<Instant>,
}

impl AcceptGate {
    /// A gate closing at `limit` open connections (`usize::MAX`: never).
    pub fn new(limit: usize) -> AcceptGate {
        AcceptGate {
            limit,
            open: true,
            paused_until: None,
            pending: false,
            last_warning: None,
        }
    }

    /// Before each accept, with `open` connections now.
    pub fn admit(&mut self, open: usize) -> Admit {
        if !self.open || self.paused_until.is_some() {
            return Admit::No;
        }
        if open < self.limit {
            return Admit::Yes;
        }
        self.open = false;
        warn!(open_connections = open, limit = self.limit; "connection limit reached: not accepting until below 90% (new connections wait in the backlog)");
        Admit::Closing
    }

    /// A connection closed, leaving `open`: below 90 % of the limit a
    /// closed gate opens again.
    pub fn on_closed(&mut self, open: usize) {
        if !self.open && open * 10 < self.limit * 9 {
            self.open = true;
            self.pending = true;
            info!(open_connections = open; "below 90% of the connection limit: accepting again");
        }
    }

    /// `accept` failed: pause. True when this is worth a warning (at most
    /// one per [`WARN_EVERY`]).
    pub fn on_error(&mut self, now: Instant) -> bool {
        self.paused_until = Some(now + ACCEPT_PAUSE);
        if self.last_warning.is_some_and(|t| now < t + WARN_EVERY) {
            return false;
        }
        self.last_warning = Some(now);
        true
    }

    /// The accept batch ran out with connections perhaps still waiting.
    pub fn batch_spent(&mut self) {
        self.pending = true;
    }

    /// When the gate wants the loop back: at once if accepting is pending,
    /// else when a pause ends.
    pub fn deadline(&self, now: Instant) -> Option<Instant> {
        if self.pending {
            return Some(now);
        }
        self.paused_until
    }

    /// Whether to accept now without an event (a pause ended, the gate
    /// opened again, or a batch ran out); clears the signal.
    pub fn due(&mut self, now: Instant) -> bool {
        if self.paused_until.is_some_and(|t| now >= t) {
            self.paused_until = None;
            self.pending = true;
        }
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_at_the_limit_and_opens_below_ninety_percent() {
        let mut g = AcceptGate::new(100);
        let now = Instant::now();
        assert_eq!(g.admit(99), Admit::Yes);
        assert_eq!(g.admit(100), Admit::Closing);
        assert_eq!(g.admit(50), Admit::No, "closed until a close opens it");
        g.on_closed(95);
        g.on_closed(90);
        assert_eq!(g.admit(90), Admit::No, "90 % is not below 90 %");
        assert!(!g.due(now));
        g.on_closed(89);
        assert_eq!(g.deadline(now), Some(now), "accept the waiting ones now");
        assert!(g.due(now));
        assert!(!g.due(now), "once");
        assert_eq!(g.admit(89), Admit::Yes);
    }

    #[test]
    fn an_error_pauses_and_warns_at_most_every_ten_seconds() {
        let mut g = AcceptGate::new(usize::MAX);
        let t0 = Instant::now();
        assert!(g.on_error(t0));
        assert_eq!(g.admit(0), Admit::No);
        assert_eq!(g.deadline(t0), Some(t0 + ACCEPT_PAUSE));
        assert!(!g.due(t0 + ACCEPT_PAUSE / 2));
        assert!(g.due(t0 + ACCEPT_PAUSE), "retries when the pause ends");
        assert_eq!(g.admit(0), Admit::Yes);
        assert!(!g.on_error(t0 + Duration::from_secs(1)), "warned already");
        assert!(g.on_error(t0 + WARN_EVERY));
    }

    #[test]
    fn a_spent_batch_comes_back_at_once() {
        let mut g = AcceptGate::new(10);
        let now = Instant::now();
        assert_eq!(g.deadline(now), None);
        g.batch_spent();
        assert_eq!(g.deadline(now), Some(now));
        assert!(g.due(now));
        assert_eq!(g.deadline(now), None);
    }

    #[test]
    fn accept_errors_sort_into_three_kinds() {
        use io::ErrorKind::*;
        let kind = |k| match AcceptError::from(io::Error::from(k)) {
            AcceptError::Drained => "drained",
            AcceptError::Retry => "retry",
            AcceptError::Failed(_) => "failed",
        };
        assert_eq!(kind(WouldBlock), "drained");
        assert_eq!(kind(Interrupted), "retry");
        assert_eq!(kind(ConnectionAborted), "retry");
        assert_eq!(kind(OutOfMemory), "failed");
        assert_eq!(
            match AcceptError::from(io::Error::from_raw_os_error(libc::EMFILE)) {
                AcceptError::Failed(_) => "failed",
                _ => "other",
            },
            "failed"
        );
    }
}
