//! The loop's side of HTTP connections (monitoring, pprof, dev KV):
//! accepting into each listener's pool, following each connection's
//! progress within its per-turn budget, handing complete requests to the
//! core and writing the answers it gives, now or later.
//!
//! Always holds:
//! - a full pool evicts the oldest connection that never completed a
//!   request (else the oldest not being answered) and refuses the new one
//!   only when every connection is being answered;
//! - a connection waiting for its answer is never evicted nor timed out by
//!   its own deadline (its wait is the core's);
//! - the core hears of every close.

use std::time::Instant;

use log::{debug, warn};
use mio::net::TcpStream;
use mio::Interest;

use super::gate::{AcceptError, Admit};
use super::slots::HttpSlot;
use super::{EventLoop, HTTP_REQUESTS_PER_TURN, HTTP_REQUESTS_PER_TURN_ALL};
use crate::core::{Answer, ConnId};
use crate::http::server::{HttpConn, HttpProgress, Role};
use crate::http::RequestHead;
use crate::monitoring::metrics::HttpDrop;

/// Connections one HTTP listener may accept per turn.
const ACCEPT_BATCH: usize = 64;
/// Repeated full-pool warnings at most this often.
const POOL_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl EventLoop {
    pub(super) fn accept_http(&mut self, role: Role, now: Instant) {
        for _ in 0..ACCEPT_BATCH {
            if self.http_gate.admit(0) != Admit::Yes {
                return;
            }
            let Some(listener) = self.http_listeners[role.index()].as_ref() else {
                return;
            };
            match listener.accept().map_err(AcceptError::from) {
                Ok((stream, _)) => self.serve_http(role, stream, now),
                Err(AcceptError::Drained) => return,
                Err(AcceptError::Retry) => {}
                Err(AcceptError::Failed(e)) => {
                    self.http_gate.on_error(now);
                    debug!(error = e.to_string(); "http accept failed: retrying shortly");
                    return;
                }
            }
        }
        self.http_gate.batch_spent();
    }

    fn serve_http(&mut self, role: Role, stream: TcpStream, now: Instant) {
        if self.http_open[role.index()] >= role.pool() {
            self.warn_pool_full(role, now);
            if !self.evict_http(role) {
                self.core
                    .metrics_mut()
                    .count_http_drop(role, HttpDrop::Refused);
                return; // dropped: closed at once
            }
        }
        let _ = stream.set_nodelay(true);
        let slot = HttpSlot {
            conn: HttpConn::new(stream, role.limits(), now),
            role,
        };
        match self
            .https
            .insert(self.poll.registry(), slot, Interest::READABLE)
        {
            Ok(key) => {
                self.http_open[role.index()] += 1;
                self.http_event(key, now);
            }
            Err((_, e)) => debug!(error = e.to_string(); "register failed"),
        }
    }

    fn warn_pool_full(&mut self, role: Role, now: Instant) {
        let last = &mut self.last_pool_warning[role.index()];
        if last.is_some_and(|t| now < t + POOL_WARN_EVERY) {
            return;
        }
        *last = Some(now);
        let dropped = &self.core.metrics().http_dropped[role.index()];
        warn!(listener = role.label(), pool = role.pool(), evicted_total = dropped[HttpDrop::Evicted.index()], refused_total = dropped[HttpDrop::Refused.index()];
            "HTTP connection pool full (a flood or slow clients?): evicting the oldest connection without a complete request");
    }

    /// Makes room in a full pool: closes the connection of `role` that
    /// never completed a request and is oldest (else the oldest one not
    /// being answered; a parked query is being answered). False if every
    /// one is being answered.
    fn evict_http(&mut self, role: Role) -> bool {
        let victim = self
            .https
            .iter()
            .filter(|(_, s)| s.role == role)
            .filter_map(|(k, s)| s.conn.eviction_key().map(|e| (e, k)))
            .min();
        let Some((_, key)) = victim else {
            return false;
        };
        self.core
            .metrics_mut()
            .count_http_drop(role, HttpDrop::Evicted);
        self.close_http(key);
        true
    }

    pub(super) fn http_event(&mut self, key: usize, now: Instant) {
        if self.http_turn_requests >= HTTP_REQUESTS_PER_TURN_ALL {
            // The turn's HTTP budget is spent: next turn.
            return self.again_http(key);
        }
        let Some(slot) = self.https.get_mut(key) else {
            return;
        };
        let progress = slot.conn.on_readable(now, &mut self.http_scratch);
        self.http_progress(key, progress, now);
        self.deliver(now);
    }

    /// Queues a connection for next turn, once (a spent budget and a new
    /// event in the same turn must not give it two).
    fn again_http(&mut self, key: usize) {
        if let Some(gen) = self.https.gen(key) {
            if !self.again.contains(&(key, gen)) {
                self.again.push((key, gen));
            }
        }
    }

    /// Follows a connection's progress: hands its requests out, at most
    /// [`HTTP_REQUESTS_PER_TURN`] of them, then registers what it waits
    /// for and arms its deadline.
    fn http_progress(&mut self, key: usize, mut progress: HttpProgress, now: Instant) {
        let mut answered = 0;
        let want = loop {
            let Some(slot) = self.https.get_mut(key) else {
                return;
            };
            progress = match progress {
                HttpProgress::Close => return self.close_http(key),
                HttpProgress::NeedRead => break Interest::READABLE,
                HttpProgress::NeedWrite => break Interest::READABLE | Interest::WRITABLE,
                HttpProgress::Written
                    if answered < HTTP_REQUESTS_PER_TURN
                        && self.http_turn_requests < HTTP_REQUESTS_PER_TURN_ALL =>
                {
                    slot.conn.on_readable(now, &mut self.http_scratch)
                }
                HttpProgress::Written | HttpProgress::Yield => {
                    self.again_http(key);
                    break Interest::READABLE;
                }
                HttpProgress::Request(head, body) => {
                    answered += 1;
                    self.http_turn_requests += 1;
                    self.handle_http(key, head, body, now)
                }
            };
        };
        if self
            .https
            .set_interest(self.poll.registry(), key, want)
            .is_err()
        {
            return self.close_http(key);
        }
        if let Some(deadline) = self.https.get(key).and_then(|s| s.conn.deadline()) {
            self.https.arm(key, deadline);
        }
    }

    fn handle_http(
        &mut self,
        key: usize,
        head: RequestHead,
        body: Vec<u8>,
        now: Instant,
    ) -> HttpProgress {
        let (Some(role), Some(gen)) = (self.https.get(key).map(|s| s.role), self.https.gen(key))
        else {
            return HttpProgress::Close;
        };
        let consul = self.consul_view(now);
        let id = ConnId { key, gen };
        match self.core.on_request(id, role, &head, &body, now, &consul) {
            Some(answer) => self.write(key, answer, now),
            // Answered later, from the core (deliver).
            None => HttpProgress::NeedRead,
        }
    }

    fn write(&mut self, key: usize, answer: Answer, now: Instant) -> HttpProgress {
        match self.https.get_mut(key) {
            Some(slot) => slot.conn.reply(answer, now),
            None => HttpProgress::Close,
        }
    }

    /// Writes the answers the core made ready for connections that waited
    /// (a render done, a parked query woken or over).
    pub(super) fn deliver(&mut self, now: Instant) {
        while let Some((id, answer)) = self.core.poll_answer() {
            if self.https.gen(id.key) == Some(id.gen) {
                let progress = self.write(id.key, answer, now);
                self.http_progress(id.key, progress, now);
            }
        }
    }

    /// A timer record fired: close a connection past its deadline, or
    /// re-arm for a later one.
    pub(super) fn http_timer(&mut self, key: usize, now: Instant) {
        let Some(slot) = self.https.get(key) else {
            return;
        };
        match slot.conn.deadline() {
            Some(d) if d <= now => {
                self.core
                    .metrics_mut()
                    .count_http_drop(slot.role, HttpDrop::Timeout);
                self.close_http(key);
            }
            Some(d) => self.https.arm(key, d),
            None => {}
        }
    }

    fn close_http(&mut self, key: usize) {
        if let Some(gen) = self.https.gen(key) {
            self.core.on_http_closed(ConnId { key, gen });
        }
        if let Some(slot) = self.https.remove(self.poll.registry(), key) {
            self.http_open[slot.role.index()] -= 1;
        }
    }
}
