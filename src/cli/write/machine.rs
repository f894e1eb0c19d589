//! The ramp's step loop, pure: which write is due, what each answer
//! means, when the ramp stops.
//!
//! In: the writes (offset from the start and each key's target), the
//! ModifyIndex each key was read at, and then, one at a time, the time
//! since the start and any signal ([`Machine::poll`]) and the answer to
//! each write ([`Machine::answered`]). Out: [`Next`]: wait, send write `k`
//! guarded by [`Machine::guards`], or stop with a [`Stop`]. Always holds:
//! one write in flight at most; a write is guarded by the index the
//! ramp's own previous write left (or the read); after a stop, nothing
//! more is written; a signal is only seen between writes.
//!
//! | state | waits for | on | next |
//! |---|---|---|---|
//! | idle (write `k` next) | `poll` | signal | stopped (signal, `k` done) |
//! | idle | `poll` | before write `k`'s offset | idle (`Wait`) |
//! | idle | `poll` | at or past it | in flight (`Write(k)`) |
//! | in flight | `answered` | applied | idle, `k + 1` next (or stopped, done) |
//! | in flight | `answered` | conflict | stopped (no resume: never fight an operator) |
//! | in flight | `answered` | refused, not sent | stopped (`k` done, resume) |
//! | in flight | `answered` | lost, re-read | stopped (`k` or `k + 1` done, as the re-read shows) |

use std::time::Duration;

use super::plan::{Held, Target};

/// One write of the ramp: when (from the start), and what each key
/// becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write1 {
    pub at: Duration,
    pub targets: Vec<Target>,
}

/// What the command does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Nothing is due for this long.
    Wait(Duration),
    /// Send write `k` (guarded by [`Machine::guards`]) and report its
    /// answer.
    Write(usize),
    /// The ramp is over.
    Stop(Stop),
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
    /// It was sent and no answer came; the keys as read again (`None`:
    /// the re-read failed too), with why.
    Lost(String, Option<Vec<Held>>),
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

/// The ramp in progress.
#[derive(Debug)]
pub struct Machine {
    writes: Vec<Write1>,
    guards: Vec<u64>,
    next: usize,
    in_flight: bool,
    stopped: Option<Stop>,
}

impl Machine {
    /// `held`: each key as read before the ramp.
    pub fn new(writes: Vec<Write1>, held: &[Held]) -> Machine {
        Machine {
            writes,
            guards: held.iter().map(Held::index).collect(),
            next: 0,
            in_flight: false,
            stopped: None,
        }
    }

    pub fn writes(&self) -> &[Write1] {
        &self.writes
    }

    /// The ModifyIndex each key's next write is guarded by.
    pub fn guards(&self) -> &[u64] {
        &self.guards
    }

    /// Writes applied so far.
    pub fn done(&self) -> usize {
        self.next
    }

    /// At `elapsed` since the start, with `signal` (an exit code) if one
    /// arrived: what to do.
    pub fn poll(&mut self, elapsed: Duration, signal: Option<u8>) -> Next {
        if let Some(stop) = &self.stopped {
            return Next::Stop(stop.clone());
        }
        assert!(
            !self.in_flight,
            "poll while write {} is in flight",
            self.next
        );
        let stop = match (signal, self.writes.get(self.next)) {
            (Some(code), _) => Stop::Signal {
                code,
                done: self.next,
            },
            (None, None) => Stop::Done,
            (None, Some(w)) if elapsed < w.at => return Next::Wait(w.at - elapsed),
            (None, Some(_)) => {
                self.in_flight = true;
                return Next::Write(self.next);
            }
        };
        self.stopped = Some(stop.clone());
        Next::Stop(stop)
    }

    /// The answer to the write in flight.
    pub fn answered(&mut self, answer: Answer) {
        assert!(self.in_flight, "an answer with no write in flight");
        self.in_flight = false;
        let at = self.next;
        let stop = match answer {
            Answer::Applied(indexes) => {
                self.guards = indexes;
                self.next += 1;
                return;
            }
            Answer::Conflict(line) => Stop::Conflict { line, done: at },
            Answer::Refused(lines) => Stop::Refused { lines, done: at },
            Answer::Lost(why, held) => self.lost(why, held),
        };
        self.stopped = Some(stop);
    }

    /// Write `next` was applied if every key holds its target at an index
    /// other than its guard (a deleted key: absent).
    fn lost(&mut self, why: String, held: Option<Vec<Held>>) -> Stop {
        let at = self.next;
        let targets = &self.writes[at].targets;
        let applied = held.as_ref().is_some_and(|held| {
            targets
                .iter()
                .zip(held)
                .zip(&self.guards)
                .all(|((t, h), &g)| t.is_held_in(h, g))
        });
        if applied {
            self.next += 1;
            if let Some(held) = &held {
                self.guards = held.iter().map(Held::index).collect();
            }
        }
        Stop::Lost {
            why,
            at,
            done: self.next,
            held,
        }
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
    fn machine() -> Machine {
        let writes = vec![
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
        ];
        Machine::new(writes, &[Held::Absent, valid(10, 7)])
    }

    /// [`machine`] with step 1 applied (index 12) and step 2 in flight.
    fn second_in_flight() -> Machine {
        let mut m = machine();
        assert_eq!(m.poll(Duration::ZERO, None), Next::Write(0));
        m.answered(Answer::Applied(vec![12, 12]));
        assert_eq!(m.poll(10 * SEC, None), Next::Write(1));
        m
    }

    #[test]
    fn writes_come_due_on_the_virtual_clock_each_guarded_by_the_last_answer() {
        let mut m = machine();
        assert_eq!(m.poll(Duration::ZERO, None), Next::Write(0));
        assert_eq!(m.guards(), [0, 7]);
        m.answered(Answer::Applied(vec![12, 12]));
        assert_eq!(m.poll(SEC, None), Next::Wait(9 * SEC));
        assert_eq!(m.poll(10 * SEC, None), Next::Write(1));
        assert_eq!(m.guards(), [12, 12]);
        m.answered(Answer::Applied(vec![15, 15]));
        // Late: due at once.
        assert_eq!(m.poll(25 * SEC, None), Next::Write(2));
        m.answered(Answer::Applied(vec![0, 0]));
        assert_eq!(m.poll(25 * SEC, None), Next::Stop(Stop::Done));
        assert_eq!(m.done(), 3);
    }

    #[test]
    fn a_signal_between_writes_stops_before_the_next() {
        let mut m = machine();
        assert_eq!(m.poll(Duration::ZERO, None), Next::Write(0));
        m.answered(Answer::Applied(vec![12, 12]));
        let stop = Stop::Signal { code: 130, done: 1 };
        assert_eq!(m.poll(3 * SEC, Some(130)), Next::Stop(stop.clone()));
        assert_eq!(m.poll(30 * SEC, None), Next::Stop(stop), "stopped for good");
    }

    #[test]
    fn a_refused_write_stops_with_the_writes_done_for_the_resume() {
        let mut m = second_in_flight();
        m.answered(Answer::Refused(vec!["denied".into()]));
        assert_eq!(
            m.poll(20 * SEC, None),
            Next::Stop(Stop::Refused {
                lines: vec!["denied".into()],
                done: 1
            })
        );
    }

    #[test]
    fn a_conflict_stops_and_nothing_more_is_due() {
        let mut m = machine();
        assert_eq!(m.poll(Duration::ZERO, None), Next::Write(0));
        m.answered(Answer::Conflict("be/b changed".into()));
        assert!(matches!(
            m.poll(20 * SEC, None),
            Next::Stop(Stop::Conflict { done: 0, .. })
        ));
    }

    #[test]
    fn a_lost_answer_stops_at_what_the_keys_hold_after_the_re_read() {
        // Applied: both keys hold 50% at a new index: two writes done.
        let mut m = second_in_flight();
        let held = vec![valid(50, 20), valid(50, 20)];
        m.answered(Answer::Lost("reset".into(), Some(held.clone())));
        assert_eq!(
            m.poll(10 * SEC, None),
            Next::Stop(Stop::Lost {
                why: "reset".into(),
                at: 1,
                done: 2,
                held: Some(held)
            })
        );
        assert_eq!(m.guards(), [20, 20]);
        // Not applied (yet): still 25% at the ramp's own index: one done.
        let mut m = second_in_flight();
        m.answered(Answer::Lost("timeout".into(), Some(vec![valid(25, 12); 2])));
        assert!(matches!(
            m.poll(10 * SEC, None),
            Next::Stop(Stop::Lost { at: 1, done: 1, .. })
        ));
        // The re-read failed too: nothing is known past the last answer.
        let mut m = machine();
        assert_eq!(m.poll(Duration::ZERO, None), Next::Write(0));
        m.answered(Answer::Lost("timeout".into(), None));
        assert!(matches!(
            m.poll(SEC, None),
            Next::Stop(Stop::Lost {
                at: 0,
                done: 0,
                held: None,
                ..
            })
        ));
    }
}
