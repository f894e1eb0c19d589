//! The missing-newline hint: a connection that sent bytes but no
//! `\n` is almost always an `agent-send` without its `\n`. Which strings to
//! name, and how often, is decided here ([`Hints::note`], pure), and the
//! warning logged ([`Hints::on_done`]).
//!
//! In: how a connection ended, the bytes it sent, and the time. Out: whether
//! to log a hint for them now (with how many were held back since), and its
//! text.
//! Always holds: at most one hint line per [`ANY_EVERY`] across all peers
//! (a flood of distinct strings is one line a second, with a count of the
//! ones held back), and each distinct byte string is named at most once
//! per [`HINT_EVERY`], so two misconfigured servers are both named within
//! seconds; at most [`TRACKED`] strings are remembered (the oldest
//! forgotten), so memory is bounded whatever peers send.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use log::warn;

use super::Outcome;
use crate::logging::escape_keeping_backslashes;

/// Each distinct string is named at most this often.
pub const HINT_EVERY: Duration = Duration::from_secs(10);
/// Distinct strings remembered at once.
pub const TRACKED: usize = 64;
/// At most one hint line this often, whatever the strings.
pub const ANY_EVERY: Duration = Duration::from_secs(1);

/// What the bytes suggest is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No newline at all.
    NoNewline,
    /// A literal backslash-n: the `agent-send` string is in single quotes,
    /// which haproxy does not unescape.
    SingleQuoted,
}

impl Cause {
    pub fn of(received: &[u8]) -> Cause {
        if received.windows(2).any(|w| w == b"\\n") {
            Cause::SingleQuoted
        } else {
            Cause::NoNewline
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Cause::NoNewline => "agent connection sent bytes but no newline: does the haproxy agent-send end in \\n? (e.g. agent-send \"be_web/srv1\\n\")",
            Cause::SingleQuoted => "agent connection sent a literal backslash-n but no newline: the haproxy agent-send is in single quotes, which haproxy does not unescape; use double quotes (agent-send \"be_web/srv1\\n\")",
        }
    }
}

/// A hint to log now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub cause: Cause,
    /// The same string seen and not named since it was last named.
    pub suppressed: u64,
    /// Hints of any string held back since the last line (the rate limit
    /// across all peers).
    pub held_back: u64,
}

/// When each distinct string was last named.
#[derive(Debug, Default)]
pub struct Hints {
    last: HashMap<Vec<u8>, (Instant, u64)>,
    /// Insertion order, to forget the oldest.
    order: VecDeque<Vec<u8>>,
    /// When the last hint line went out, and hints held back since.
    last_line: Option<Instant>,
    held_back: u64,
}

impl Hints {
    /// A connection ended with `outcome` having sent `received`: a
    /// [`Outcome::NoNewline`] is named in a warning, as [`Hints::note`]
    /// allows.
    pub fn on_done(&mut self, outcome: Outcome, received: &[u8], now: Instant) {
        if outcome != Outcome::NoNewline {
            return;
        }
        if let Some(hint) = self.note(received, now) {
            warn!(received = escape_keeping_backslashes(received, 64), similar_suppressed = hint.suppressed, others_suppressed = hint.held_back; "{}", hint.cause.message());
        }
    }

    /// When the hints held back by the rate limit are due to be reported
    /// (a flood that stopped is still reported, a second after its line).
    pub fn due(&self) -> Option<Instant> {
        let last = self.last_line?;
        (self.held_back > 0).then_some(last + ANY_EVERY)
    }

    /// Reports the hints held back, once due: one line with their count.
    pub fn on_time(&mut self, now: Instant) {
        if let Some(n) = self.take_held_back(now) {
            warn!(others_suppressed = n; "more agent connections sent bytes without a newline (at most one hint line a second; requests_total{{outcome=\"no_newline\"}} counts them all)");
        }
    }

    /// The count held back, if due at `now` (then the next line is a
    /// second away).
    fn take_held_back(&mut self, now: Instant) -> Option<u64> {
        if self.due().is_none_or(|t| now < t) {
            return None;
        }
        self.last_line = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }

    /// A connection ended having sent `received` and no newline.
    pub fn note(&mut self, received: &[u8], now: Instant) -> Option<Hint> {
        let line_allowed = self.last_line.is_none_or(|t| now >= t + ANY_EVERY);
        if let Some((at, suppressed)) = self.last.get_mut(received) {
            let due = now >= *at + HINT_EVERY;
            if !due || !line_allowed {
                *suppressed += 1;
                self.held_back += u64::from(due);
                return None;
            }
            let hint = Hint {
                cause: Cause::of(received),
                suppressed: std::mem::take(suppressed),
                held_back: std::mem::take(&mut self.held_back),
            };
            *at = now;
            self.last_line = Some(now);
            return Some(hint);
        }
        if !line_allowed {
            // Not remembered: named once the rate allows.
            self.held_back += 1;
            return None;
        }
        if self.order.len() == TRACKED {
            if let Some(oldest) = self.order.pop_front() {
                self.last.remove(&oldest);
            }
        }
        self.order.push_back(received.to_vec());
        self.last.insert(received.to_vec(), (now, 0));
        self.last_line = Some(now);
        Some(Hint {
            cause: Cause::of(received),
            suppressed: 0,
            held_back: std::mem::take(&mut self.held_back),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_distinct_string_is_named_once_per_window() {
        let t0 = Instant::now();
        let mut h = Hints::default();
        let first = h.note(b"be_a/s1", t0).expect("named");
        assert_eq!(first.cause, Cause::NoNewline);
        // A second misconfigured server is named too, a second later (one
        // hint line a second across all peers).
        assert_eq!(h.note(b"be_b/s2", t0), None);
        let second = h.note(b"be_b/s2", t0 + ANY_EVERY).expect("named");
        assert_eq!(second.held_back, 1);
        // Repeats within the window are held back and counted.
        for _ in 0..5 {
            assert_eq!(h.note(b"be_a/s1", t0 + Duration::from_secs(3)), None);
        }
        let again = h.note(b"be_a/s1", t0 + HINT_EVERY).expect("named again");
        assert_eq!(again.suppressed, 5);
        assert_eq!(again.held_back, 0);
    }

    #[test]
    fn a_flood_of_distinct_strings_is_one_line_a_second() {
        let t0 = Instant::now();
        let mut h = Hints::default();
        let mut lines = Vec::new();
        // 3,000 peers in 0.4 s, each with its own string (the review's
        // flood): one line, then one more after a second, counting the rest.
        for i in 0..3000u32 {
            let at = t0 + Duration::from_micros(u64::from(i) * 133);
            lines.extend(h.note(format!("be/s{i}").as_bytes(), at));
        }
        assert_eq!(lines.len(), 1);
        let next = h.note(b"be/late", t0 + ANY_EVERY).expect("a second later");
        assert_eq!(next.held_back, 2999);
        assert!(h.last.len() <= TRACKED);
        assert_eq!(h.due(), None, "reported with that line");
    }

    #[test]
    fn a_flood_that_stops_is_still_reported_a_second_after_its_line() {
        let t0 = Instant::now();
        let mut h = Hints::default();
        for i in 0..500u32 {
            h.note(format!("be/s{i}").as_bytes(), t0);
        }
        assert_eq!(h.due(), Some(t0 + ANY_EVERY));
        assert_eq!(h.take_held_back(t0 + ANY_EVERY / 2), None, "not yet");
        assert_eq!(h.take_held_back(t0 + ANY_EVERY), Some(499));
        assert_eq!(h.due(), None, "once");
    }

    #[test]
    fn a_literal_backslash_n_says_single_quotes() {
        let hint = Hints::default()
            .note(b"be_bad/sq\\n", Instant::now())
            .unwrap();
        assert_eq!(hint.cause, Cause::SingleQuoted);
        assert!(hint.cause.message().contains("single quotes"));
        assert_eq!(Cause::of(b"be/s1\x01"), Cause::NoNewline);
    }

    #[test]
    fn only_a_missing_newline_is_noted() {
        let t0 = Instant::now();
        let mut h = Hints::default();
        h.on_done(Outcome::Timeout, b"be/s1", t0);
        h.on_done(Outcome::Ready, b"be/s1\n", t0);
        assert!(h.last.is_empty());
        h.on_done(Outcome::NoNewline, b"be/s1", t0);
        assert_eq!(h.note(b"be/s1", t0), None, "named once already");
    }

    #[test]
    fn memory_is_bounded_by_the_strings_tracked() {
        let t0 = Instant::now();
        let mut h = Hints::default();
        let mut t = t0;
        for i in 0..10 * TRACKED {
            t += ANY_EVERY;
            assert!(h.note(format!("be/s{i}").as_bytes(), t).is_some());
        }
        assert_eq!((h.last.len(), h.order.len()), (TRACKED, TRACKED));
        // The oldest were forgotten: named again at once.
        assert!(h.note(b"be/s0", t + ANY_EVERY).is_some());
    }
}
