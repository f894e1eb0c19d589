//! The writers' step loop, pure: which write is due, what each answer
//! means, when the run stops. A `ramp` is writes at offsets, each guarded
//! by the indexes the last one left; a `set` is a ramp of one step whose
//! transactions (a batch of keys each) are all due at once. Its phases are
//! types: a transition consumes the phase it leaves, and time is an
//! argument (`elapsed`, since the start), so it runs on a virtual clock.
//!
//! - [`Idle`]: write `k` is next; [`Idle::poll`] with the time and any
//!   signal: wait, stop, or send it ([`Polled`]).
//! - [`InFlight`]: write `k` is sent, guarded by [`InFlight::guards`];
//!   [`InFlight::answered`], the one place an answer moves the run: idle
//!   again, or stopped.
//! - [`Stop`]: why it ended, and how many writes are in KV. A conflict
//!   stops for good (never fight an operator); a signal is only seen
//!   between writes. The table of transitions: `docs/LIFECYCLE.md`.

use std::time::Duration;

use super::deliver::{Lost, Settled};
use super::key::Target;

/// One write of the ramp: when (from the start), and what each key
/// becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write1 {
    pub at: Duration,
    pub targets: Vec<Target>,
}

/// The answer to a write, as the command read it: the four meanings of
/// [`super::deliver::deliver`], `Applied` carrying what the next write is
/// guarded by.
#[derive(Debug)]
pub enum Answer<G> {
    /// Applied: for `ramp`, each key's new ModifyIndex (0 for a deleted
    /// key); for `set`, whose writes cover distinct keys, nothing.
    Applied(G),
    /// A key's ModifyIndex moved: someone else wrote it. The line says
    /// who holds what.
    Conflict(String),
    /// Consul refused it and applied nothing (a denied permission, a
    /// status it refuses with), or it was never sent.
    Refused(Vec<String>),
    /// It was sent and no answer came: the keys as read again, and what
    /// they say.
    Lost(Lost),
}

/// Why the run of writes ended, and how many are in KV.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every write applied.
    Done,
    /// A signal arrived (its exit code) before write `done`.
    Signal { code: u8, done: usize },
    /// Someone else changed a key during write `done` (not applied).
    Conflict { line: String, done: usize },
    /// Write `done` was refused, nothing of it applied.
    Refused { lines: Vec<String>, done: usize },
    /// Write `at`'s answer was lost: `done` is `at + 1` when the re-read
    /// found it applied, `at` otherwise (then consul may still commit
    /// it).
    Lost { lost: Lost, at: usize, done: usize },
}

/// Between writes: write `next` is due at its offset; `guards`, what the
/// last applied write (or the read) left for the next to be guarded by.
#[derive(Debug, PartialEq, Eq)]
pub struct Idle<G> {
    next: usize,
    guards: G,
}

/// Write `at` is sent and its answer awaited.
#[derive(Debug, PartialEq, Eq)]
pub struct InFlight<G> {
    at: usize,
    guards: G,
}

/// What [`Idle::poll`] comes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Polled<G> {
    /// Nothing is due for this long.
    Wait(Idle<G>, Duration),
    /// Send this write and report its answer.
    Write(InFlight<G>),
    /// The run is over.
    Stop(Stop),
}

impl<G> Idle<G> {
    /// Before the first write, guarded by `guards` (for `ramp`, each key's
    /// ModifyIndex as read before it).
    pub fn start(guards: G) -> Idle<G> {
        Idle { next: 0, guards }
    }

    /// Writes applied so far.
    pub fn done(&self) -> usize {
        self.next
    }

    /// At `elapsed` since the start, with `signal` (an exit code) if one
    /// arrived: what to do with the writes due at `due` (offsets from the
    /// start; a `set`'s are all zero).
    pub fn poll(self, due: &[Duration], elapsed: Duration, signal: Option<u8>) -> Polled<G> {
        match (signal, due.get(self.next)) {
            (Some(code), _) => Polled::Stop(Stop::Signal {
                code,
                done: self.next,
            }),
            (None, None) => Polled::Stop(Stop::Done),
            (None, Some(&at)) if elapsed < at => {
                let left = at - elapsed;
                Polled::Wait(self, left)
            }
            (None, Some(_)) => Polled::Write(InFlight {
                at: self.next,
                guards: self.guards,
            }),
        }
    }
}

impl<G> InFlight<G> {
    /// The write sent.
    pub fn at(&self) -> usize {
        self.at
    }

    /// What the write is guarded by.
    pub fn guards(&self) -> &G {
        &self.guards
    }

    /// Its answer: the next write idle, or the run stopped. The one place
    /// an answer moves the run.
    pub fn answered(self, answer: Answer<G>) -> Result<Idle<G>, Stop> {
        let at = self.at;
        Err(match answer {
            Answer::Applied(guards) => {
                return Ok(Idle {
                    next: at + 1,
                    guards,
                })
            }
            Answer::Conflict(line) => Stop::Conflict { line, done: at },
            Answer::Refused(lines) => Stop::Refused { lines, done: at },
            Answer::Lost(lost) => {
                let done = at + usize::from(lost.settled == Settled::Applied);
                Stop::Lost { lost, at, done }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::write::key::Held;
    use crate::contract::Desired;

    const SEC: Duration = Duration::from_secs(1);

    fn valid(n: u16, index: u64) -> Held {
        Held::Valid(Desired::ready_pct(n).unwrap(), index)
    }

    type Guards = Vec<u64>;

    /// Two keys, 25% at +0s, 50% at +10s, deleted (100%) at +20s: when
    /// each write is due.
    fn writes() -> Vec<Duration> {
        vec![Duration::ZERO, 10 * SEC, 20 * SEC]
    }

    /// The keys as read: absent, and 10% at index 7.
    fn start() -> Idle<Guards> {
        Idle::start(vec![0, 7])
    }

    #[track_caller]
    fn sent(p: Polled<Guards>) -> InFlight<Guards> {
        match p {
            Polled::Write(f) => f,
            other => panic!("not a write: {other:?}"),
        }
    }

    #[track_caller]
    fn stopped(p: Polled<Guards>) -> Stop {
        match p {
            Polled::Stop(s) => s,
            other => panic!("not a stop: {other:?}"),
        }
    }

    /// Step 1 applied (index 12) and step 2 in flight.
    fn second_in_flight() -> InFlight<Guards> {
        let w = writes();
        let first = sent(start().poll(&w, Duration::ZERO, None));
        let idle = first.answered(Answer::Applied(vec![12, 12])).unwrap();
        sent(idle.poll(&w, 10 * SEC, None))
    }

    #[test]
    fn writes_come_due_on_the_virtual_clock_each_guarded_by_the_last_answer() {
        let w = writes();
        let first = sent(start().poll(&w, Duration::ZERO, None));
        assert_eq!((first.at(), &first.guards()[..]), (0, &[0, 7][..]));
        let idle = first.answered(Answer::Applied(vec![12, 12])).unwrap();
        let Polled::Wait(idle, left) = idle.poll(&w, SEC, None) else {
            panic!("not due yet")
        };
        assert_eq!((left, idle.done()), (9 * SEC, 1));
        let second = sent(idle.poll(&w, 10 * SEC, None));
        assert_eq!((second.at(), &second.guards()[..]), (1, &[12, 12][..]));
        let idle = second.answered(Answer::Applied(vec![15, 15])).unwrap();
        // Late: due at once.
        let third = sent(idle.poll(&w, 25 * SEC, None));
        let idle = third.answered(Answer::Applied(vec![0, 0])).unwrap();
        assert_eq!(idle.done(), 3);
        assert_eq!(stopped(idle.poll(&w, 25 * SEC, None)), Stop::Done);
    }

    #[test]
    fn a_signal_between_writes_stops_before_the_next() {
        let w = writes();
        let first = sent(start().poll(&w, Duration::ZERO, None));
        let idle = first.answered(Answer::Applied(vec![12, 12])).unwrap();
        assert_eq!(
            stopped(idle.poll(&w, 3 * SEC, Some(130))),
            Stop::Signal { code: 130, done: 1 }
        );
    }

    #[test]
    fn a_refused_write_stops_with_the_writes_done_for_the_resume() {
        assert_eq!(
            second_in_flight().answered(Answer::Refused(vec!["denied".into()])),
            Err(Stop::Refused {
                lines: vec!["denied".into()],
                done: 1
            })
        );
    }

    #[test]
    fn a_conflict_stops_and_nothing_more_is_due() {
        let first = sent(start().poll(&writes(), Duration::ZERO, None));
        assert!(matches!(
            first.answered(Answer::Conflict("be/b changed".into())),
            Err(Stop::Conflict { done: 0, .. })
        ));
    }

    fn lost(why: &str, held: Result<Vec<Held>, String>, settled: Settled) -> Lost {
        let why = why.to_owned();
        Lost { why, held, settled }
    }

    #[test]
    fn a_lost_answer_stops_at_what_the_keys_hold_after_the_re_read() {
        // Applied: both keys hold 50% at a new index: two writes done.
        let held = vec![valid(50, 20), valid(50, 20)];
        let applied = lost("reset", Ok(held), Settled::Applied);
        assert_eq!(
            second_in_flight().answered(Answer::Lost(applied.clone())),
            Err(Stop::Lost {
                lost: applied,
                at: 1,
                done: 2,
            })
        );
        // Not applied (yet): one done.
        let unknown = lost("timeout", Ok(vec![valid(25, 12); 2]), Settled::Unknown);
        assert!(matches!(
            second_in_flight().answered(Answer::Lost(unknown)),
            Err(Stop::Lost { at: 1, done: 1, .. })
        ));
        // A key moved elsewhere: never applied.
        let moved = lost("timeout", Ok(vec![valid(25, 30); 2]), Settled::Moved(0));
        assert!(matches!(
            second_in_flight().answered(Answer::Lost(moved)),
            Err(Stop::Lost { at: 1, done: 1, .. })
        ));
        // The re-read failed too: nothing is known past the last answer.
        let first = sent(start().poll(&writes(), Duration::ZERO, None));
        let failed = lost("timeout", Err("refused".into()), Settled::Unknown);
        assert!(matches!(
            first.answered(Answer::Lost(failed)),
            Err(Stop::Lost { at: 0, done: 0, .. })
        ));
    }

    /// A `set`: transactions all due at once, each covering its own keys
    /// (nothing to carry from one to the next), stopping at the first
    /// that is not applied.
    #[test]
    fn a_set_is_a_ramp_whose_writes_are_all_due_at_once() {
        let due = [Duration::ZERO; 3];
        let first = match Idle::start(()).poll(&due, Duration::ZERO, None) {
            Polled::Write(f) => f,
            other => panic!("{other:?}"),
        };
        let idle = first.answered(Answer::Applied(())).unwrap();
        let second = match idle.poll(&due, Duration::ZERO, None) {
            Polled::Write(f) => f,
            other => panic!("{other:?}"),
        };
        assert_eq!(second.at(), 1);
        assert_eq!(
            second.answered(Answer::Conflict("be/c changed".into())),
            Err(Stop::Conflict {
                line: "be/c changed".into(),
                done: 1
            })
        );
    }
}
