//! The loop's side of HTTP connections (monitoring, pprof, dev KV):
//! accepting into each listener's pool, following each connection's
//! progress within its per-turn budget, handing complete requests to
//! their handler, and the dev KV's parked queries.
//!
//! Always holds: a full pool evicts the oldest connection that never
//! completed a request (else the oldest not being answered) and refuses
//! the new one only when every connection is being answered; a parked
//! query's connection is never evicted (it is being answered) nor timed
//! out by its own deadline (its wait is [`Parking`]'s).
//!
//! [`Parking`]: crate::devkv::Parking

use std::time::Instant;

use log::{debug, warn};
use mio::event::Source;
use mio::net::TcpStream;
use mio::Interest;

use super::gate::{AcceptError, Admit};
use super::table::Pollable;
use super::{EventLoop, HTTP_REQUESTS_PER_TURN, HTTP_REQUESTS_PER_TURN_ALL};
use crate::devkv::{Handled, Wait};
use crate::http::{RequestHead, Response};
use crate::monitoring::metrics::HttpDrop;
use crate::monitoring::renders::{Body, Heavy};
use crate::monitoring::server::{is_head, HttpConn, HttpProgress, Role};
use crate::monitoring::{handle_monitoring, handle_pprof, Routed};
use crate::slice::Slice;

/// Connections one HTTP listener may accept per turn.
const ACCEPT_BATCH: usize = 64;
/// The HTTP connections' read buffer, shared (they copy out what they keep).
pub const SCRATCH: usize = 16 * 1024;
/// Repeated full-pool warnings at most this often.
const POOL_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// Dev KV bodies over this size are sent chunked, as consul's are.
const DEVKV_CHUNK: usize = 2048;

/// An open HTTP connection.
pub struct HttpSlot {
    conn: HttpConn<TcpStream>,
    role: Role,
}

impl Pollable for HttpSlot {
    fn source(&mut self) -> &mut dyn Source {
        self.conn.stream_mut()
    }
}

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
                self.metrics.count_http_drop(role, HttpDrop::Refused);
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
        let dropped = &self.metrics.http_dropped[role.index()];
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
        self.metrics.count_http_drop(role, HttpDrop::Evicted);
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
        let Some(role) = self.https.get(key).map(|s| s.role) else {
            return HttpProgress::Close;
        };
        let routed = match role {
            Role::Monitoring => handle_monitoring(&head, &self.status(now)),
            Role::Pprof => handle_pprof(&head),
            Role::DevKv => return self.handle_devkv(key, &head, &body, now),
        };
        let head_only = is_head(&head);
        match routed {
            Routed::Now(resp) => self.respond(key, &resp, head_only, None, now),
            Routed::Render(kind) => {
                let Some(gen) = self.https.gen(key) else {
                    return HttpProgress::Close;
                };
                let changes = self.changes(kind);
                match self.renders.ask(kind, (key, gen, head_only), now, changes) {
                    Some(body) => self.respond_shared(key, kind, body, head_only, now),
                    // Answered when the render is done (render_slice).
                    None => HttpProgress::NeedRead,
                }
            }
        }
    }

    /// A slice of the heavy renders requests wait for; each one done
    /// answers its waiters with the shared body.
    pub(super) fn render_slice(&mut self, now: Instant) {
        let mut renders = std::mem::take(&mut self.renders);
        renders.forget(|&(key, gen, _)| self.https.gen(key) != Some(gen));
        let shared = self.state.shared();
        let st = self.status(now);
        let metrics_started = renders.start(&st, shared.as_ref(), &|k| self.changes(k));
        let mut done = Vec::new();
        renders.step(st.asking, &mut Slice::of_turn(now), now, &mut done);
        self.renders = renders;
        if metrics_started {
            // "Since the last scrape": that render has taken the max.
            self.metrics.loop_turn_max = std::time::Duration::ZERO;
        }
        for ((key, gen, head_only), kind, body) in done {
            if self.https.gen(key) == Some(gen) {
                let progress = self.respond_shared(key, kind, body, head_only, now);
                self.http_progress(key, progress, now);
            }
        }
    }

    /// What makes a heavy render of `kind` out of date.
    fn changes(&self, kind: Heavy) -> u64 {
        match kind {
            Heavy::Metrics => self.metrics.changes(),
            Heavy::DebugState { .. } => self.metrics.state_changes(),
        }
    }

    fn respond_shared(
        &mut self,
        key: usize,
        kind: Heavy,
        body: Body,
        head_only: bool,
        now: Instant,
    ) -> HttpProgress {
        let resp = Response {
            status: 200,
            headers: vec![("Content-Type", kind.content_type().into())],
            body: Vec::new(),
        };
        match self.https.get_mut(key) {
            Some(slot) => slot.conn.respond_shared(&resp, body, head_only, now),
            None => HttpProgress::Close,
        }
    }

    /// A dev KV request: answered, or parked; a write then wakes the
    /// queries it concerns (after its own response is on its way).
    fn handle_devkv(
        &mut self,
        key: usize,
        head: &RequestHead,
        body: &[u8],
        now: Instant,
    ) -> HttpProgress {
        let Some(kv) = self.devkv.as_mut() else {
            return HttpProgress::Close;
        };
        let before = kv.generation();
        let handled = kv.handle(head, body, now);
        let changed = kv.generation() != before;
        let progress = match handled {
            Handled::Respond(resp) => {
                self.respond(key, &resp, is_head(head), Some(DEVKV_CHUNK), now)
            }
            Handled::Wait(wait) => {
                self.parking.park(key, wait);
                HttpProgress::NeedRead
            }
        };
        if changed {
            self.wake_parked(now);
        }
        progress
    }

    fn respond(
        &mut self,
        key: usize,
        resp: &Response,
        head_only: bool,
        chunk_over: Option<usize>,
        now: Instant,
    ) -> HttpProgress {
        match self.https.get_mut(key) {
            Some(slot) => slot.conn.respond(resp, head_only, chunk_over, now),
            None => HttpProgress::Close,
        }
    }

    /// After a dev KV write: answer every parked query whose prefix moved.
    fn wake_parked(&mut self, now: Instant) {
        let Some(kv) = self.devkv.as_ref() else {
            return;
        };
        for (key, wait) in self.parking.woken(kv) {
            self.answer_parked(key, &wait, now);
        }
        self.forget_rendered();
    }

    /// A batch of parked queries is answered: the dev KV frees the
    /// rendering they shared.
    pub(super) fn forget_rendered(&mut self) {
        if let Some(kv) = self.devkv.as_mut() {
            kv.forget_rendered();
        }
    }

    /// Answers a query that left [`crate::devkv::Parking`] (woken, or its
    /// wait over).
    pub(super) fn answer_parked(&mut self, key: usize, wait: &Wait, now: Instant) {
        let (Some(kv), Some(slot)) = (self.devkv.as_mut(), self.https.get_mut(key)) else {
            return;
        };
        let progress = slot
            .conn
            .respond(&kv.answer(wait), false, Some(DEVKV_CHUNK), now);
        self.http_progress(key, progress, now);
    }

    /// A timer record fired: close a connection past its deadline, or
    /// re-arm for a later one.
    pub(super) fn http_timer(&mut self, key: usize, now: Instant) {
        let Some(slot) = self.https.get(key) else {
            return;
        };
        match slot.conn.deadline() {
            Some(d) if d <= now => {
                self.metrics.count_http_drop(slot.role, HttpDrop::Timeout);
                self.close_http(key);
            }
            Some(d) => self.https.arm(key, d),
            None => {}
        }
    }

    fn close_http(&mut self, key: usize) {
        self.parking.unpark(key);
        if let Some(slot) = self.https.remove(self.poll.registry(), key) {
            self.http_open[slot.role.index()] -= 1;
        }
    }
}
