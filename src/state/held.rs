//! The state file read at start, held back while the first consul read
//! has its chance: a file is yesterday's state, and answering it for the
//! few milliseconds before consul answers flaps every server whose key
//! changed since (a drain undone in consul is drained again, for one agent
//! interval). Its phases: `docs/LIFECYCLE.md`, "State file writer".
//!
//! - In: the file's state (or none), the start time, then the first consul
//!   read's outcome and the time. Out: the state to answer from, once, when
//!   it may be answered; or, once consul answered first, the state to free.
//! - The file is answered only after the first consul read failed or
//!   [`FIRST_READ_GRACE`] passed without one; once a read completed in
//!   time, it is never answered; it is handed out at most once.

use std::time::{Duration, Instant};

/// How long the first consul read has before the file is answered.
pub const FIRST_READ_GRACE: Duration = Duration::from_secs(1);

/// A state file's state until it is answered or made useless.
#[derive(Debug)]
pub struct HeldFile<T> {
    /// The file's state and when it is answered at the latest; `None` once
    /// decided (or without a usable file).
    held: Option<(T, Instant)>,
}

impl<T> HeldFile<T> {
    /// Holds `file` (`None`: no usable file) from `now`, the start.
    pub fn new(file: Option<T>, now: Instant) -> HeldFile<T> {
        HeldFile {
            held: file.map(|f| (f, now + FIRST_READ_GRACE)),
        }
    }

    /// When the file is answered unless consul answers first.
    pub fn deadline(&self) -> Option<Instant> {
        self.held.as_ref().map(|(_, at)| *at)
    }

    /// The file's state to answer from, once the grace has passed at `now`.
    pub fn due(&mut self, now: Instant) -> Option<T> {
        match self.held.take() {
            Some((f, at)) if at <= now => Some(f),
            held => {
                self.held = held;
                None
            }
        }
    }

    /// A consul read failed: the file's state to answer from at once.
    pub fn consul_failed(&mut self) -> Option<T> {
        self.decided()
    }

    /// A consul read completed first: the file's state, never to be
    /// answered (the caller frees it).
    pub fn consul_answered(&mut self) -> Option<T> {
        self.decided()
    }

    fn decided(&mut self) -> Option<T> {
        self.held.take().map(|(f, _)| f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_read_within_the_grace_wins_and_the_file_is_never_answered() {
        let t0 = Instant::now();
        let mut h = HeldFile::new(Some("file"), t0);
        assert_eq!(h.deadline(), Some(t0 + FIRST_READ_GRACE));
        assert_eq!(h.due(t0), None);
        assert_eq!(h.due(t0 + 999 * MS), None, "not before the grace ends");
        assert_eq!(h.consul_answered(), Some("file"), "handed back to free");
        assert_eq!(h.deadline(), None, "nothing to wake for");
        assert_eq!(h.due(t0 + 5 * FIRST_READ_GRACE), None, "never answered");
        assert_eq!(h.consul_failed(), None, "a later failure changes nothing");
    }

    #[test]
    fn a_failed_first_read_answers_the_file_at_once() {
        let t0 = Instant::now();
        let mut h = HeldFile::new(Some("file"), t0);
        assert_eq!(h.due(t0 + 3 * MS), None);
        assert_eq!(h.consul_failed(), Some("file"));
        assert_eq!(h.deadline(), None);
        assert_eq!(h.consul_failed(), None, "handed out once");
        assert_eq!(h.consul_answered(), None);
    }

    #[test]
    fn no_read_within_the_grace_answers_the_file_at_its_end() {
        let t0 = Instant::now();
        let mut h = HeldFile::new(Some("file"), t0);
        assert_eq!(h.due(t0 + FIRST_READ_GRACE - MS), None);
        assert_eq!(h.due(t0 + FIRST_READ_GRACE), Some("file"));
        assert_eq!(h.deadline(), None);
        assert_eq!(h.due(t0 + 2 * FIRST_READ_GRACE), None, "handed out once");
        // Consul answering later replaces it as any swap does: not here.
        assert_eq!(h.consul_answered(), None);
    }

    #[test]
    fn without_a_usable_file_there_is_nothing_to_hold() {
        let t0 = Instant::now();
        let mut h: HeldFile<&str> = HeldFile::new(None, t0);
        assert_eq!(h.deadline(), None);
        assert_eq!(h.due(t0 + 2 * FIRST_READ_GRACE), None);
        assert_eq!(h.consul_failed(), None);
        assert_eq!(h.consul_answered(), None);
    }
}
