//! The ramp's step loop, pure: which write is due, what each answer
//! means, when the ramp stops. Its phases are types: a transition consumes
//! the phase it leaves, and time is an argument (`elapsed`, since the
//! start), so it runs on a virtual clock.
//!
//! - [`Idle`]: write `k` is next; [`Idle::poll`] with the time and any
//!   signal: wait, stop, or send it ([`Polled`]).
//! - [`InFlight`]: write `k` is sent, guarded by [`InFlight::guards`];
//!   [`InFlight::answered`]: idle again, or stopped.
//! - [`Stop`]: why it ended, and how many writes are in KV. A conflict
//!   stops for good (never fight an operator); a signal is only seen
//!   between writes. The table of transitions: `docs/LIFECYCLE.md`.

use std::time::Duration;

use super::key::{Held, Target};

/// One write of the ramp: when (from the start), and what each key
/// becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write1 {
    pub at: Duration,
    pub targets: Vec<Target>,
}

/// The answer to a write, as the command read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Applied: each key's new ModifyIndex (0 for a deleted key), matched
    /// by key from consul's results (or re-read).
    Applied(Vec<u64>),
    /// A key's ModifyIndex moved: someone else wrote it. The line says
    /// who holds what.
    Conflict(String),
    /// Consul refused it and applied nothing (a denied permission, a
    /// status it refuses with), or it was never sent.
    Refused(Vec<String>),
    /// It was sent and no answer came: whether the re-read found it
    /// `applied`, and the keys as read again (`None`: the re-read failed).
    Lost {
        why: String,
        applied: bool,
        held: Option<Vec<Held>>,
    },
}

/// Why the ramp ended, and how many writes are in KV.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// it); `held`, the keys as read again.
    Lost {
        why: String,
        at: usize,
        done: usize,
        held: Option<Vec<Held>>,
    },
}

/// Between writes: write `next` is due at its offset.
#[derive(Debug, PartialEq, Eq)]
pub struct Idle {
    next: usize,
    /// The ModifyIndex each key's next write is guarded by: the read's,
    /// then the ramp's own last write's.
    guards: Vec<u64>,
}

/// Write `at` is sent and its answer awaited.
#[derive(Debug, PartialEq, Eq)]
pub struct InFlight {
    at: usize,
    guards: Vec<u64>,
}

/// What [`Idle::poll`] comes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Polled {
    /// Nothing is due for this long.
    Wait(Idle, Duration),
    /// Send this write and report its answer.
    Write(InFlight),
    /// The ramp is over.
    Stop(Stop),
}

impl Idle {
    /// Before the first write, `held`: each key as read before the ramp.
    pub fn start(held: &[Held]) -> Idle {
        Idle {
            next: 0,
            guards: held.iter().map(Held::index).collect(),
        }
    }

    /// Writes applied so far.
    pub fn done(&self) -> usize {
        self.next
    }

    /// At `elapsed` since the start, with `signal` (an exit code) if one
    /// arrived: what to do with `writes`.
    pub fn poll(self, writes: &[Write1], elapsed: Duration, signal: Option<u8>) -> Polled {
        match (signal, writes.get(self.next)) {
            (Some(code), _) => Polled::Stop(Stop::Signal {
                code,
                done: self.next,
            }),
            (None, None) => Polled::Stop(Stop::Done),
            (None, Some(w)) if elapsed < w.at => {
                let left = w.at - elapsed;
                Polled::Wait(self, left)
            }
            (None, Some(_)) => Polled::Write(InFlight {
                at: self.next,
                guards: self.guards,
            }),
        }
    }
}

impl InFlight {
    /// The write sent.
    pub fn at(&self) -> usize {
        self.at
    }

    /// The ModifyIndex each key's write is guarded by.
    pub fn guards(&self) -> &[u64] {
        &self.guards
    }

    /// Its answer: the next write idle, or the ramp stopped.
    pub fn answered(self, answer: Answer) -> Result<Idle, Stop> {
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
            Answer::Lost { why, applied, held } => Stop::Lost {
                why,
                at,
                done: at + usize::from(applied),
                held,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Desired;

    const SEC: Duration = Duration::from_secs(1);

    fn pct(n: u16) -> Target {
        Target::Set(Desired::ready_pct(n).unwrap())
    }

    fn valid(n: u16, index: u64) -> Held {
        Held::Valid(Desired::ready_pct(n).unwrap(), index)
    }

    /// Two keys, 25% at +0s, 50% at +10s, deleted (100%) at +20s.
    fn writes() -> Vec<Write1> {
        vec![
            Write1 {
                at: Duration::ZERO,
                targets: vec![pct(25); 2],
            },
            Write1 {
                at: 10 * SEC,
                targets: vec![pct(50); 2],
            },
            Write1 {
                at: 20 * SEC,
                targets: vec![Target::Unset; 2],
            },
        ]
    }

    fn start() -> Idle {
        Idle::start(&[Held::Absent, valid(10, 7)])
    }

    #[track_caller]
    fn sent(p: Polled) -> InFlight {
        match p {
            Polled::Write(f) => f,
            other => panic!("not a write: {other:?}"),
        }
    }

    #[track_caller]
    fn stopped(p: Polled) -> Stop {
        match p {
            Polled::Stop(s) => s,
            other => panic!("not a stop: {other:?}"),
        }
    }

    /// Step 1 applied (index 12) and step 2 in flight.
    fn second_in_flight() -> InFlight {
        let w = writes();
        let first = sent(start().poll(&w, Duration::ZERO, None));
        let idle = first.answered(Answer::Applied(vec![12, 12])).unwrap();
        sent(idle.poll(&w, 10 * SEC, None))
    }

    #[test]
    fn writes_come_due_on_the_virtual_clock_each_guarded_by_the_last_answer() {
        let w = writes();
        let first = sent(start().poll(&w, Duration::ZERO, None));
        assert_eq!((first.at(), first.guards()), (0, &[0, 7][..]));
        let idle = first.answered(Answer::Applied(vec![12, 12])).unwrap();
        let Polled::Wait(idle, left) = idle.poll(&w, SEC, None) else {
            panic!("not due yet")
        };
        assert_eq!((left, idle.done()), (9 * SEC, 1));
        let second = sent(idle.poll(&w, 10 * SEC, None));
        assert_eq!((second.at(), second.guards()), (1, &[12, 12][..]));
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

    #[test]
    fn a_lost_answer_stops_at_what_the_keys_hold_after_the_re_read() {
        // Applied: both keys hold 50% at a new index: two writes done.
        let held = vec![valid(50, 20), valid(50, 20)];
        let lost = Answer::Lost {
            why: "reset".into(),
            applied: true,
            held: Some(held.clone()),
        };
        assert_eq!(
            second_in_flight().answered(lost),
            Err(Stop::Lost {
                why: "reset".into(),
                at: 1,
                done: 2,
                held: Some(held)
            })
        );
        // Not applied (yet): one done.
        let lost = Answer::Lost {
            why: "timeout".into(),
            applied: false,
            held: Some(vec![valid(25, 12); 2]),
        };
        assert!(matches!(
            second_in_flight().answered(lost),
            Err(Stop::Lost { at: 1, done: 1, .. })
        ));
        // The re-read failed too: nothing is known past the last answer.
        let first = sent(start().poll(&writes(), Duration::ZERO, None));
        let lost = Answer::Lost {
            why: "timeout".into(),
            applied: false,
            held: None,
        };
        assert!(matches!(
            first.answered(lost),
            Err(Stop::Lost {
                at: 0,
                done: 0,
                held: None,
                ..
            })
        ));
    }
}
