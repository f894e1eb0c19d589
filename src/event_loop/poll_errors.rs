//! What the loop does when `poll` itself fails: counted and survived,
//! fatal only when the failures persist.
//!
//! In: each failed and each successful `poll`, and the time. Out: whether
//! the loop goes on (after a short pause, so a failing `epoll_wait` is not
//! a busy loop) or gives up.
//!
//! Always holds:
//! - one warning per spell of failures;
//! - a spell that lasts [`FATAL_AFTER`] without one successful `poll` ends
//!   the process (exit 1: a supervisor restarts it with a fresh epoll),
//!   since nothing is answered while it lasts.
//!
//! EINTR is not a failure and never reaches this. Modelled on sozu's
//! `max_poll_errors`.

use std::time::{Duration, Instant};

/// Failures for this long with no success in between are fatal.
pub const FATAL_AFTER: Duration = Duration::from_secs(10);
/// The pause after a failed `poll` before the next one.
pub const PAUSE: Duration = Duration::from_millis(10);

/// The loop's answer to a failed `poll`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The first failure of a spell: warn, pause, poll again.
    Warn,
    /// More of the same spell: pause, poll again.
    Retry,
    /// Failing for [`FATAL_AFTER`]: give up.
    Fatal,
}

/// The current spell of `poll` failures.
#[derive(Debug, Default)]
pub struct PollErrors {
    since: Option<Instant>,
}

impl PollErrors {
    pub fn on_error(&mut self, now: Instant) -> Verdict {
        match self.since {
            None => {
                self.since = Some(now);
                Verdict::Warn
            }
            Some(t) if now >= t + FATAL_AFTER => Verdict::Fatal,
            Some(_) => Verdict::Retry,
        }
    }

    /// A `poll` returned: the spell, if any, is over.
    pub fn on_ok(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spell_warns_once_and_is_fatal_only_if_it_persists() {
        let t0 = Instant::now();
        let mut p = PollErrors::default();
        assert_eq!(p.on_error(t0), Verdict::Warn);
        assert_eq!(p.on_error(t0 + PAUSE), Verdict::Retry);
        assert_eq!(p.on_error(t0 + FATAL_AFTER - PAUSE), Verdict::Retry);
        assert_eq!(p.on_error(t0 + FATAL_AFTER), Verdict::Fatal);
    }

    #[test]
    fn one_success_ends_the_spell() {
        let t0 = Instant::now();
        let mut p = PollErrors::default();
        assert_eq!(p.on_error(t0), Verdict::Warn);
        p.on_ok();
        let later = t0 + 2 * FATAL_AFTER;
        assert_eq!(p.on_error(later), Verdict::Warn, "a new spell");
        assert_eq!(p.on_error(later + PAUSE), Verdict::Retry);
    }
}
