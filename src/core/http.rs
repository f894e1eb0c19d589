//! The core's side of HTTP requests: routing to the monitoring and pprof
//! handlers or the dev KV, heavy renders shared by every waiter, and the
//! dev KV's parked queries.
//!
//! - A request is answered now, or waits: for a render ([`Renders`]) or in
//!   the dev KV's [`Parking`]; its answer then comes out of
//!   [`Core::poll_answer`].
//! - A dev KV write wakes the parked queries it concerns; their answers
//!   queue behind the writer's own.
//! - A closed connection ([`Core::on_http_closed`]) leaves every wait at
//!   once: it is never answered, and a render nobody waits for is dropped.
//!
//! [`Renders`]: crate::monitoring::renders::Renders
//! [`Parking`]: crate::devkv::Parking

use std::time::Instant;

use super::{Answer, ConnId, ConsulView, Core};
use crate::devkv::{Handled, Wait};
use crate::http::server::{is_head, Reply, Role};
use crate::http::{RequestHead, Response};
use crate::monitoring::renders::{Body, Heavy};
use crate::monitoring::{
    handle_monitoring, handle_pprof, Routed, StateFileStatus, Status, WatchStatus,
};
use crate::slice::Slice;
use crate::state::unasked::Asking;

/// Dev KV bodies over this size are sent chunked, as consul's are.
const DEVKV_CHUNK: usize = 2048;

impl Reply {
    fn full(resp: Response, head_only: bool, chunk_over: Option<usize>) -> Reply {
        Reply::Full {
            resp,
            head_only,
            chunk_over,
        }
    }

    fn shared(kind: Heavy, body: Body, head_only: bool) -> Reply {
        let resp = Response {
            status: 200,
            headers: vec![("Content-Type", kind.content_type().into())],
            body: Vec::new(),
        };
        Reply::Shared {
            resp,
            body,
            head_only,
        }
    }
}

impl Core {
    /// A complete request on connection `id` of listener `role`: its
    /// answer now, or `None` when it waits (its answer comes later from
    /// [`Core::poll_answer`]). A dev KV write queues the answers of the
    /// queries it woke behind this one.
    pub fn on_request(
        &mut self,
        id: ConnId,
        role: Role,
        head: &RequestHead,
        body: &[u8],
        now: Instant,
        consul: &ConsulView,
    ) -> Option<Answer> {
        let head_only = is_head(head);
        let routed = match role {
            Role::Monitoring => handle_monitoring(head, &self.status(now, consul)),
            Role::Pprof => handle_pprof(head),
            Role::DevKv => return self.on_devkv(id, head, body, now),
        };
        match routed {
            Routed::Now(resp) => Some(Reply::full(resp, head_only, None)),
            Routed::Render(kind) => {
                let changes = self.changes(kind);
                let body = self.renders.ask(kind, (id, head_only), now, changes)?;
                Some(Reply::shared(kind, body, head_only))
            }
        }
    }

    /// The next answer ready for a connection that waited, if any.
    pub fn poll_answer(&mut self) -> Option<(ConnId, Answer)> {
        self.outbox.pop_front()
    }

    /// Connection `id` closed: it leaves every wait, and is not answered.
    pub fn on_http_closed(&mut self, id: ConnId) {
        self.parking.unpark(id);
        self.renders.forget(|&(w, _)| w == id);
        self.outbox.retain(|(w, _)| *w != id);
    }

    fn on_devkv(
        &mut self,
        id: ConnId,
        head: &RequestHead,
        body: &[u8],
        now: Instant,
    ) -> Option<Answer> {
        let kv = self.devkv.as_mut()?;
        let before = kv.generation();
        let handled = kv.handle(head, body, now);
        let woken = match kv.generation() != before {
            true => self.parking.woken(kv),
            false => Vec::new(),
        };
        let answer = match handled {
            Handled::Respond(resp) => Some(Reply::full(resp, is_head(head), Some(DEVKV_CHUNK))),
            Handled::Wait(wait) => {
                self.parking.park(id, wait);
                None
            }
        };
        self.answer_parked(woken);
        answer
    }

    /// A slice of the heavy renders requests wait for; each one done
    /// queues its waiters' answers with the shared body.
    pub(super) fn render_slice(&mut self, now: Instant, consul: &ConsulView) {
        let mut renders = std::mem::take(&mut self.renders);
        let shared = self.state.shared();
        let st = self.status(now, consul);
        let metrics_started = renders.start(&st, shared.as_ref(), &|k| self.changes(k));
        let mut done = Vec::new();
        renders.step(st.asking, &mut Slice::of_turn(now), now, &mut done);
        self.renders = renders;
        if metrics_started {
            // "Since the last scrape": that render has taken the max.
            self.metrics.loop_turn_max = std::time::Duration::ZERO;
        }
        for ((id, head_only), kind, body) in done {
            self.outbox
                .push_back((id, Reply::shared(kind, body, head_only)));
        }
    }

    /// What makes a heavy render of `kind` out of date.
    fn changes(&self, kind: Heavy) -> u64 {
        match kind {
            Heavy::Metrics => self.metrics.changes(),
            Heavy::DebugState { .. } => self.metrics.state_changes(),
        }
    }

    /// The view the monitoring handlers and renders read.
    fn status<'a>(&'a self, now: Instant, consul: &ConsulView) -> Status<'a> {
        Status {
            metrics: &self.metrics,
            snapshot: self.state.current(),
            watch: WatchStatus {
                phase: consul.phase,
                index: consul.index,
                failures: consul.failures,
                requests: consul.requests,
                traffic: consul.traffic,
                last_error: self.health.last_error(),
                next_request_in: consul.next_request_in,
                request_deadline_in: consul.request_deadline_in,
            },
            now,
            started: self.started,
            max_connections: self.max_connections,
            kv_prefix: &self.kv_prefix,
            source: self.state.source(),
            state_file: self.state_file.as_ref().map(|f| StateFileStatus {
                path: f.path(),
                writes: f.writes(),
                write_errors: f.write_errors(),
            }),
            asking: Some(Asking {
                clock: self.state.clock(),
                strangers: self.state.strangers(),
                unasked: &self.unasked,
                previous: self.state.carrying_from(),
            }),
            expiry: self.expiry.shown(),
        }
    }

    /// Answers the parked queries that left the parking: the dev KV renders
    /// each, then frees what they shared.
    pub(super) fn answer_parked(&mut self, left: Vec<(ConnId, Wait)>) {
        let Some(kv) = self.devkv.as_mut() else {
            return;
        };
        if left.is_empty() {
            return;
        }
        for (id, wait) in left {
            let answer = Reply::full(kv.answer(&wait), false, Some(DEVKV_CHUNK));
            self.outbox.push_back((id, answer));
        }
        kv.forget_rendered();
    }
}
