//! The loop's side of agent checks: accepting under the gate, the fast
//! path that answers before registering anything, the slow path's table
//! slot, and counting how each connection ended.
//!
//! Always holds:
//! - a check whose line is in the socket at accept costs four system calls
//!   (`accept4`, `recvfrom`, `sendto`, `close`) and no table slot;
//! - only one that must wait gets a registration and a timer.
//!
//! At `-max-connections` a new connection evicts the oldest one still
//! waiting for its line (a flood of idle connections cannot keep haproxy's
//! checks in the backlog); the gate closes only when none waits for a line.
//! A source outside `-listen-allow` is closed at accept, unread. Each
//! accept costs O(1) amortized: the eviction order is a queue, its stale
//! entries dropped as they reach the front or once they outnumber the open
//! connections.

use std::time::{Duration, Instant};

use log::{debug, trace, warn};
use mio::net::TcpStream;
use mio::Interest;

use super::gate::{AcceptError, Admit};
use super::slots::AgentSlot;
use super::EventLoop;
use crate::agent::conn::{AgentConn, Progress};
use crate::agent::Outcome;

/// Accept at most this many per turn, so one busy listener cannot starve
/// the rest of the loop; the loop comes back at once if more are waiting.
const ACCEPT_BATCH: usize = 256;

/// Eviction warnings at most this often.
const EVICT_WARN_EVERY: Duration = Duration::from_secs(10);

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
            // At the limit, a connection still waiting for its line counts
            // as room: it is evicted once a new one is really accepted.
            let full = self.agents.len() >= self.max_connections;
            let victim = if full { self.oldest_idle() } else { None };
            let open = self.agents.len() - usize::from(victim.is_some());
            match self.agent_gate.admit(open) {
                Admit::Yes => {}
                Admit::No => return,
                Admit::Closing => {
                    self.core.metrics_mut().gate_closings += 1;
                    return;
                }
            }
            let Some(listener) = self.agent_listener.as_ref() else {
                return;
            };
            match listener.accept().map_err(AcceptError::from) {
                Ok((stream, peer)) => {
                    if !self.listen_allow.permits(peer.ip()) {
                        self.core.metrics_mut().connections_disallowed += 1;
                        continue; // dropped: closed unread, no reply
                    }
                    if let Some(key) = victim {
                        self.evict_agent(key, now);
                    }
                    self.serve_new(stream)
                }
                Err(AcceptError::Drained) => return,
                Err(AcceptError::Retry) => {}
                Err(AcceptError::Failed(e)) => {
                    self.core.metrics_mut().accept_errors += 1;
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
        let answer = |id: &[u8]| self.core.answer(id, accepted);
        let progress = conn.on_readable(answer, self.max_line_bytes, &mut self.scratch);
        let want = match interest(progress) {
            Ok(want) => want,
            Err(outcome) => return self.count(outcome, accepted, &conn),
        };
        let slot = AgentSlot { conn, accepted };
        match self.agents.insert(self.poll.registry(), slot, want) {
            Ok(key) => {
                self.agents.arm(key, accepted + self.read_timeout);
                self.remember_order(key);
                self.core.metrics_mut().open_connections = self.agents.len() as u64;
            }
            Err((slot, e)) => {
                debug!(error = e.to_string(); "register failed");
                self.count(Outcome::IoError, accepted, &slot.conn);
            }
        }
    }

    /// The oldest open connection still waiting for its line; entries in
    /// front of it (closed, reused or answering) are dropped on the way.
    fn oldest_idle(&mut self) -> Option<usize> {
        while let Some(&(key, gen)) = self.accept_order.queue.front() {
            let live = self.agents.gen(key) == Some(gen);
            if live && self.agents.get(key).is_some_and(|s| s.conn.awaiting_line()) {
                return Some(key);
            }
            self.accept_order.queue.pop_front();
        }
        None
    }

    /// Queues a new table slot for eviction; drops the stale entries once
    /// they outnumber the live ones (amortized O(1) per connection).
    fn remember_order(&mut self, key: usize) {
        let Some(gen) = self.agents.gen(key) else {
            return;
        };
        let order = &mut self.accept_order.queue;
        order.push_back((key, gen));
        if order.len() > 2 * self.agents.len() + 1024 {
            let agents = &self.agents;
            order.retain(|&(k, g)| agents.gen(k) == Some(g));
        }
    }

    /// Closes `key` (waiting for its line) to make room at the limit:
    /// counted, and a warning at most every [`EVICT_WARN_EVERY`].
    fn evict_agent(&mut self, key: usize, now: Instant) {
        self.accept_order.queue.pop_front();
        let metrics = self.core.metrics_mut();
        metrics.connections_evicted += 1;
        let evicted_total = metrics.connections_evicted;
        let last = &mut self.accept_order.last_warning;
        if last.is_none_or(|t| now >= t + EVICT_WARN_EVERY) {
            *last = Some(now);
            warn!(limit = self.max_connections, evicted_total = evicted_total;
                "connection limit reached: evicting the oldest connection without a complete line (a flood of idle connections? see -listen-allow)");
        }
        let outcome = self.agents.get(key).map(|s| s.conn.on_timeout());
        self.close_agent(key, outcome.unwrap_or(Outcome::Timeout));
    }

    pub(super) fn agent_event(&mut self, key: usize, now: Instant) {
        let Some(slot) = self.agents.get_mut(key) else {
            return;
        };
        let answer = |id: &[u8]| self.core.answer(id, now);
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
        self.core.metrics_mut().open_connections = self.agents.len() as u64;
        self.agent_gate.on_closed(self.agents.len());
    }

    fn count(&mut self, outcome: Outcome, accepted: Instant, conn: &AgentConn) {
        trace!(outcome = outcome.label(); "agent connection done");
        self.core
            .check_done(outcome, accepted, conn.received(), Instant::now());
    }
}
