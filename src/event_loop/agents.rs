//! The loop's side of agent checks: accepting under the gate, the fast
//! path that answers before registering anything, the slow path's table
//! slot, and counting how each connection ended.
//!
//! Always holds: a check whose line is in the socket at accept costs four
//! system calls (`accept4`, `recvfrom`, `sendto`, `close`) and no table
//! slot; only one that must wait gets a registration and a timer.

use std::time::Instant;

use log::{debug, trace, warn};
use mio::event::Source;
use mio::net::TcpStream;
use mio::Interest;

use super::gate::{AcceptError, Admit};
use super::table::Pollable;
use super::EventLoop;
use crate::agent::conn::{AgentConn, Progress};
use crate::agent::Outcome;

/// Accept at most this many per turn, so one busy listener cannot starve
/// the rest of the loop; the loop comes back at once if more are waiting.
const ACCEPT_BATCH: usize = 256;

/// An agent connection waiting for the rest of its line (or for room to
/// write its reply).
pub struct AgentSlot {
    pub conn: AgentConn,
    pub accepted: Instant,
}

impl Pollable for AgentSlot {
    fn source(&mut self) -> &mut dyn Source {
        self.conn.stream_mut()
    }
}

fn interest(progress: Progress) -> Result<Interest, Outcome> {
    match progress {
        Progress::Done(outcome) => Err(outcome),
        Progress::NeedRead => Ok(Interest::READABLE),
        Progress::NeedWrite => Ok(Interest::WRITABLE),
    }
}

impl EventLoop {
    pub(super) fn accept_agents(&mut self, now: Instant) {
        if self.shutdown_deadline.is_some() {
            return;
        }
        for _ in 0..ACCEPT_BATCH {
            match self.agent_gate.admit(self.agents.len()) {
                Admit::Yes => {}
                Admit::No => return,
                Admit::Closing => {
                    self.metrics.gate_closings += 1;
                    return;
                }
            }
            let Some(listener) = self.agent_listener.as_ref() else {
                return;
            };
            match listener.accept().map_err(AcceptError::from) {
                Ok((stream, _)) => self.serve_new(stream),
                Err(AcceptError::Drained) => return,
                Err(AcceptError::Retry) => {}
                Err(AcceptError::Failed(e)) => {
                    self.metrics.accept_errors += 1;
                    if self.agent_gate.on_error(now) {
                        warn!(error = e.to_string(); "accept failed (out of file descriptors?): pausing accepts briefly; open connections are still served");
                    }
                    return;
                }
            }
        }
        self.agent_gate.batch_spent();
    }

    /// The fast path: the line is usually in the socket already, so read it
    /// before registering anything; only a connection that must wait gets a
    /// table slot, a registration and a timer.
    fn serve_new(&mut self, stream: TcpStream) {
        let accepted = Instant::now();
        let mut conn = AgentConn::new(stream);
        let (state, up) = (&mut self.state, self.reply_up);
        let answer = |id: &[u8]| {
            let desired = state.answer(id, accepted)?;
            Some((desired.reply_voting(up), desired.admin()))
        };
        let progress = conn.on_readable(answer, self.max_line_bytes, &mut self.scratch);
        let want = match interest(progress) {
            Ok(want) => want,
            Err(outcome) => return self.count(outcome, accepted, &conn),
        };
        let slot = AgentSlot { conn, accepted };
        match self.agents.insert(self.poll.registry(), slot, want) {
            Ok(key) => {
                self.agents.arm(key, accepted + self.read_timeout);
                self.metrics.open_connections = self.agents.len() as u64;
            }
            Err((slot, e)) => {
                debug!(error = e.to_string(); "register failed");
                self.count(Outcome::IoError, accepted, &slot.conn);
            }
        }
    }

    pub(super) fn agent_event(&mut self, key: usize, now: Instant) {
        let Some(slot) = self.agents.get_mut(key) else {
            return;
        };
        let (state, up) = (&mut self.state, self.reply_up);
        let answer = |id: &[u8]| {
            let desired = state.answer(id, now)?;
            Some((desired.reply_voting(up), desired.admin()))
        };
        let progress = slot
            .conn
            .on_readable(answer, self.max_line_bytes, &mut self.scratch);
        match interest(progress) {
            Ok(want) => {
                if self
                    .agents
                    .set_interest(self.poll.registry(), key, want)
                    .is_err()
                {
                    self.close_agent(key, Outcome::IoError);
                }
            }
            Err(outcome) => self.close_agent(key, outcome),
        }
    }

    pub(super) fn close_agent(&mut self, key: usize, outcome: Outcome) {
        let Some(slot) = self.agents.remove(self.poll.registry(), key) else {
            return;
        };
        self.count(outcome, slot.accepted, &slot.conn);
        self.metrics.open_connections = self.agents.len() as u64;
        self.agent_gate.on_closed(self.agents.len());
    }

    fn count(&mut self, outcome: Outcome, accepted: Instant, conn: &AgentConn) {
        let now = Instant::now();
        let took = outcome.is_reply().then(|| now.duration_since(accepted));
        self.metrics.count_request(outcome, took);
        trace!(outcome = outcome.label(); "agent connection done");
        self.hints.on_done(outcome, conn.received(), now);
    }
}
