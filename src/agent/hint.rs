//! The missing-newline hint: a connection that sent bytes but no
//! `\n` is almost always an `agent-send` without its `\n`. Which strings to
//! name, and how often, is decided here ([`Hints::note`], pure), and the
//! warning logged ([`Hints::on_done`]).
//!
//! In: how a connection ended, the bytes it sent, and the time. Out:
//! whether to log a hint for them now (with how many were held back since),
//! and its text.
//!
//! Always holds:
//! - at most one hint line per [`ANY_EVERY`] across all peers (a flood of
//!   distinct strings is one line a second, with a count of the ones held
//!   back), and each distinct byte string is named at most once per
//!   [`HINT_EVERY`];
//! - a string not named yet, held back by the rate limit, is named by the
//!   next line (a second later at most), so two misconfigured servers are
//!   both named within seconds, each with its own cause;
//! - at most [`TRACKED`] strings are remembered (the oldest forgotten), and
//!   one more waiting to be named, so memory is bounded whatever peers
//!   send.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use log::warn;

use super::Outcome;
use crate::safe::escape_keeping_backslashes;

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
    /// The first string not named yet that the rate limit held back, and
    /// how often it was seen since the last line: the next line names it.
    unnamed: Option<(Vec<u8>, u64)>,
}

/// What the line due after a held-back hint says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Due {
    /// A string not named yet: named now.
    Name(Vec<u8>, Hint),
    /// Only strings named already: how many were held back.
    HeldBack(u64),
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
            log_hint(received, &hint);
        }
    }

    /// When the hints held back by the rate limit are due to be reported
    /// (a flood that stopped is still reported, a second after its line).
    pub fn due(&self) -> Option<Instant> {
        let last = self.last_line?;
        (self.held_back > 0 || self.unnamed.is_some()).then_some(last + ANY_EVERY)
    }

    /// Reports the hints held back, once due: one line naming the string
    /// not named yet, if there is one, else with their count.
    pub fn on_time(&mut self, now: Instant) {
        match self.take_due(now) {
            Some(Due::Name(received, hint)) => log_hint(&received, &hint),
            Some(Due::HeldBack(n)) => {
                warn!(others_suppressed = n; "more agent connections sent bytes without a newline (at most one hint line a second; requests_total{{outcome=\"no_newline\"}} counts them all)");
            }
            None => {}
        }
    }

    /// The line due at `now`, if any (then the next line is a second
    /// away).
    fn take_due(&mut self, now: Instant) -> Option<Due> {
        if self.due().is_none_or(|t| now < t) {
            return None;
        }
        self.last_line = Some(now);
        let held_back = std::mem::take(&mut self.held_back);
        let Some((received, seen)) = self.unnamed.take() else {
            return Some(Due::HeldBack(held_back));
        };
        self.remember(&received, now);
        let hint = Hint {
            cause: Cause::of(&received),
            suppressed: seen.saturating_sub(1),
            held_back: held_back.saturating_sub(seen),
        };
        Some(Due::Name(received, hint))
    }

    /// A connection ended having sent `received` and no newline.
    pub fn note(&mut self, received: &[u8], now: Instant) -> Option<Hint> {
        let line_allowed = self.last_line.is_none_or(|t| now >= t + ANY_EVERY);
        if let Some((at, suppressed)) = self.last.get_mut(received) {
            let due = now >= *at + HINT_EVERY;
            // A string not named yet goes first.
            if !due || !line_allowed || self.unnamed.is_some() {
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
            // Not remembered yet: named by the next line.
            self.held_back += 1;
            match &mut self.unnamed {
                Some((first, seen)) if first.as_slice() == received => *seen += 1,
                Some(_) => {}
                None => self.unnamed = Some((received.to_vec(), 1)),
            }
            return None;
        }
        // The one waiting, if it is this string, is named now; another
        // waits for the next line, its count reported in this one.
        let seen = match &mut self.unnamed {
            Some((first, seen)) if first.as_slice() == received => {
                let seen = *seen;
                self.unnamed = None;
                seen
            }
            Some((_, seen)) => {
                *seen = 0;
                0
            }
            None => 0,
        };
        self.remember(received, now);
        self.last_line = Some(now);
        Some(Hint {
            cause: Cause::of(received),
            suppressed: seen,
            held_back: std::mem::take(&mut self.held_back) - seen,
        })
    }

    /// Names `received` at `now`: not again for [`HINT_EVERY`].
    fn remember(&mut self, received: &[u8], now: Instant) {
        if self.order.len() == TRACKED {
            if let Some(oldest) = self.order.pop_front() {
                self.last.remove(&oldest);
            }
        }
        self.order.push_back(received.to_vec());
        self.last.insert(received.to_vec(), (now, 0));
    }
}

fn log_hint(received: &[u8], hint: &Hint) {
    warn!(received = escape_keeping_backslashes(received, 64), similar_suppressed = hint.suppressed, others_suppressed = hint.held_back; "{}", hint.cause.message());
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
        assert_eq!((second.suppressed, second.held_back), (1, 0));
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
        // The first one held back is still to be named: by the next line,
        // its count reported already.
        assert_eq!(h.due(), Some(t0 + 2 * ANY_EVERY));
        let Some(Due::Name(name, hint)) = h.take_due(t0 + 2 * ANY_EVERY) else {
            panic!("not named");
        };
        assert_eq!(
            (&name[..], hint.suppressed, hint.held_back),
            (&b"be/s1"[..], 0, 0)
        );
        assert_eq!(h.due(), None, "nothing left");
    }

    #[test]
    fn a_flood_that_stops_is_still_reported_a_second_after_its_line() {
        let t0 = Instant::now();
        let mut h = Hints::default();
        for i in 0..500u32 {
            h.note(format!("be/s{i}").as_bytes(), t0);
        }
        assert_eq!(h.due(), Some(t0 + ANY_EVERY));
        assert_eq!(h.take_due(t0 + ANY_EVERY / 2), None, "not yet");
        let hint = Hint {
            cause: Cause::NoNewline,
            suppressed: 0,
            held_back: 498,
        };
        assert_eq!(
            h.take_due(t0 + ANY_EVERY),
            Some(Due::Name(b"be/s1".to_vec(), hint)),
            "the first held back named, the others counted"
        );
        assert_eq!(h.due(), None, "once");
        // Only repeats of named strings held back: a line with the count.
        let t1 = t0 + HINT_EVERY + ANY_EVERY / 2;
        assert!(h.note(b"be/s0", t1).is_some(), "named again");
        let s1_due = t0 + ANY_EVERY + HINT_EVERY + ANY_EVERY / 5;
        assert_eq!(h.note(b"be/s1", s1_due), None, "within a second of a line");
        assert_eq!(h.take_due(t1 + ANY_EVERY), Some(Due::HeldBack(1)));
    }

    /// Issue 34: `agent-send "be_bad/one"` and `agent-send
    /// 'be_bad/two\n'`, each checked every 0.5 s for 3 s; the loop runs
    /// the hint timer when due (before the connections of the same
    /// instant, or after: `two_after`). Only `be_bad/one` was ever named:
    /// the timer's count line took every second's slot.
    fn two_misconfigured_servers(two_after: Duration) -> Vec<(Duration, Vec<u8>, Cause)> {
        let t0 = Instant::now();
        let mut h = Hints::default();
        let mut lines = Vec::new();
        let mut arrivals: Vec<(Duration, &[u8])> = (0..=6u32)
            .flat_map(|i| {
                let at = Duration::from_millis(500) * i;
                [(at, &b"be_bad/one"[..]), (at + two_after, b"be_bad/two\\n")]
            })
            .collect();
        arrivals.sort_by_key(|a| a.0);
        for (at, received) in arrivals {
            while let Some(due) = h.due().filter(|d| *d <= t0 + at) {
                match h.take_due(due) {
                    Some(Due::Name(name, hint)) => lines.push((due - t0, name, hint.cause)),
                    Some(Due::HeldBack(_)) => lines.push((due - t0, Vec::new(), Cause::NoNewline)),
                    None => unreachable!("due"),
                }
            }
            if let Some(hint) = h.note(received, t0 + at) {
                lines.push((at, received.to_vec(), hint.cause));
            }
        }
        lines
    }

    #[test]
    fn two_distinct_strings_arriving_together_are_both_named_each_with_its_cause() {
        for two_after in [Duration::ZERO, Duration::from_millis(10)] {
            let lines = two_misconfigured_servers(two_after);
            let named = |s: &[u8]| lines.iter().find(|l| l.1 == s).map(|l| (l.0, l.2));
            assert_eq!(
                named(b"be_bad/one"),
                Some((Duration::ZERO, Cause::NoNewline)),
                "{lines:?}"
            );
            let (at, cause) = named(b"be_bad/two\\n").expect("be_bad/two named");
            assert_eq!(cause, Cause::SingleQuoted, "the single-quote advice");
            assert!(at <= Duration::from_secs(2), "within seconds: {at:?}");
            for pair in lines.windows(2) {
                assert!(
                    pair[1].0 >= pair[0].0 + ANY_EVERY,
                    "one line a second: {lines:?}"
                );
            }
        }
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
