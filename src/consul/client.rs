//! The consul connection inside the loop: one persistent nonblocking
//! HTTP/1.1 connection (TCP or unix socket, plain or TLS:
//! [`crate::consul::tls`]) running the [`Watch`] over the transport's
//! steps ([`crate::consul::transport`]). It is generic over how it connects
//! ([`Connect`]): sockets in the loop ([`SocketConnector`]), an in-memory
//! stream (`consul::memstream`) and a virtual clock in tests and the fuzzer.
//!
//! - In: readiness ([`Client::on_event`]) and the time
//!   ([`Client::on_timer`], at [`Client::poll_at`]). Out: [`Update`]s,
//!   what to register ([`Client::wants`]; a transport with records of its
//!   own to send adds writable), connections to close
//!   ([`Client::retired`]).
//! - The loop never blocks on consul: every phase that waits on it has a
//!   deadline, checked before any more bytes are read; at most
//!   [`READ_BUDGET`] bytes a call; the body bounded (decoded and on the
//!   wire) and decoded incrementally; bytes parsed only by [`crate::http`].
//! - Each phase owns its data (the connection, the buffers, the decoder,
//!   the decode in progress); a transition consumes the phase it leaves,
//!   through the one place that traces it (`Client::enter`).
//! - Any error (IO, framing, size, deadline) closes the connection,
//!   reports [`Update::Failed`] and goes `Idle` (the watch backs off),
//!   except a kept connection found closed before any byte of the answer:
//!   retried once at once on a fresh one.
//! - The phases and their transitions: `docs/LIFECYCLE.md`, "Consul
//!   client".

use std::io::{self, Read};
use std::time::{Duration, Instant};

use mio::Interest;

use crate::config::ConsulConfig;
use crate::consul::error::{ErrorReason, Failure};
pub use crate::consul::stream::{Connect, Transport};
use crate::consul::transport::{
    connect_step, handshake_step, receive_step, send_step, Body, Conn, Received, RequestSpec, Rx,
};
pub use crate::consul::transport::{
    Socket, SocketConnector, Stream, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, READ_BUDGET,
};
use crate::consul::watch::{Decoding, Response, Update, Watch};
use crate::http::ResponseHead;
use crate::slice::Slice;

/// Headroom on top of the longest hold consul may apply (wait × 17/16).
pub const RESPONSE_SLACK: Duration = Duration::from_secs(5);
/// A kept connection that fails this soon after its request started, before
/// any byte of the answer, was closed while idle (the close crossed our
/// request): retried at once. Later, the close came while consul held the
/// request (a restart): a drop, retried after the jittered backoff.
pub const IDLE_CLOSE_RACE: Duration = Duration::from_secs(1);

/// What the client waits for; see the table in the module docs.
enum Phase<S> {
    Idle {
        conn: Option<Conn<S>>,
    },
    Connecting {
        conn: Conn<S>,
        request: Vec<u8>,
        deadline: Instant,
    },
    /// Connected; the transport's handshake (TLS) in progress.
    Handshaking {
        conn: Conn<S>,
        request: Vec<u8>,
        deadline: Instant,
    },
    Sending {
        conn: Conn<S>,
        request: Vec<u8>,
        written: usize,
        deadline: Instant,
    },
    ExpectHead {
        rx: Rx<S>,
    },
    ExpectBody {
        rx: Rx<S>,
        body: Body,
    },
    /// A large listing decoded a slice per loop turn; no request is in
    /// flight, a kept connection waits beside it.
    Decoding {
        conn: Option<Conn<S>>,
        decoding: Box<Decoding>,
    },
}

impl<S> Phase<S> {
    fn name(&self) -> &'static str {
        match self {
            Phase::Idle { .. } => "idle",
            Phase::Connecting { .. } => "connecting",
            Phase::Handshaking { .. } => "handshaking",
            Phase::Sending { .. } => "sending",
            Phase::ExpectHead { .. } => "awaiting_head",
            Phase::ExpectBody { .. } => "reading_body",
            Phase::Decoding { .. } => "decoding",
        }
    }
}

/// Where one step of the machine leaves it.
enum Next<S> {
    /// Moved on: step the new phase at once.
    Go(Phase<S>),
    /// Waits for the socket or the time.
    Wait(Phase<S>),
    /// A response was applied.
    Done(Phase<S>, Update),
    /// The request failed; the connection (if any) is to be closed.
    Fail {
        conn: Option<Conn<S>>,
        failure: Failure,
        /// An idle keep-alive connection found closed: retry at once.
        retry_fresh: bool,
    },
}

impl<S> Next<S> {
    /// The request failed on `conn`, for good: no retry.
    fn fail(conn: Conn<S>, failure: Failure) -> Next<S> {
        Next::Fail {
            conn: Some(conn),
            failure,
            retry_fresh: false,
        }
    }
}

/// `Connecting`: once connected, the transport's handshake.
fn connecting<S: Transport>(
    mut conn: Conn<S>,
    request: Vec<u8>,
    deadline: Instant,
    now: Instant,
) -> Next<S> {
    match connect_step(&mut conn) {
        Ok(true) => Next::Go(Phase::Handshaking {
            conn,
            request,
            deadline: now + HANDSHAKE_TIMEOUT,
        }),
        Ok(false) => Next::Wait(Phase::Connecting {
            conn,
            request,
            deadline,
        }),
        Err(failure) => Next::fail(conn, failure),
    }
}

/// `Sending`: once the request is written, its response.
fn sending<S: Transport>(
    mut conn: Conn<S>,
    request: Vec<u8>,
    mut written: usize,
    deadline: Instant,
) -> Next<S> {
    match send_step(&mut conn, &request, &mut written) {
        Ok(true) => Next::Go(Phase::ExpectHead {
            rx: Rx::new(conn, deadline),
        }),
        Ok(false) => Next::Wait(Phase::Sending {
            conn,
            request,
            written,
            deadline,
        }),
        // A kept connection found closed: retried at once.
        Err(failure) => Next::Fail {
            retry_fresh: conn.reused && failure.reason == ErrorReason::Reset,
            conn: Some(conn),
            failure,
        },
    }
}

/// What the client saw of consul, for the metrics (read when scraped).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    /// Bytes read from consul connections (before any inflating).
    pub bytes_received: u64,
    /// `X-Consul-LastContact` of the last response that carried it.
    pub last_contact: Option<Duration>,
    /// `X-Consul-KnownLeader` of the last response that carried it.
    pub known_leader: Option<bool>,
    /// Answers discarded as too stale and asked again without `stale`.
    pub stale_reasks: u64,
}

/// The consul client: how to connect, the watch logic, and the phase.
pub struct Client<C: Connect> {
    connector: C,
    spec: RequestSpec,
    watch: Watch,
    phase: Phase<C::Stream>,
    /// The name of the phase entered last, for the trace of the next.
    entered: &'static str,
    /// (connection id, stream) for the loop to close.
    retired: Vec<(u64, C::Stream)>,
    next_conn_id: u64,
    requests: u64,
    traffic: Traffic,
}

impl<C: Connect> Client<C> {
    pub fn new(config: &ConsulConfig, connector: C, prefix: &str, seed: u64) -> Client<C> {
        Client {
            connector,
            spec: RequestSpec::new(config),
            watch: Watch::new(prefix, seed, config.max_stale).hiding(config.secrets()),
            phase: Phase::Idle { conn: None },
            entered: "idle",
            retired: Vec::new(),
            next_conn_id: 0,
            requests: 0,
            traffic: Traffic::default(),
        }
    }

    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    pub fn phase_name(&self) -> &'static str {
        self.phase.name()
    }

    /// Requests started so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Bytes received, what the last response said of the cluster, stale
    /// answers asked again.
    pub fn traffic(&self) -> Traffic {
        Traffic {
            stale_reasks: self.watch.stale_reasks(),
            ..self.traffic
        }
    }

    /// When the loop must call [`Client::on_timer`] next (`now`: work is
    /// waiting, a decode slice or a read budget that ran out).
    pub fn poll_at(&self, now: Instant) -> Instant {
        match &self.phase {
            Phase::Idle { .. } => self.watch.next_start(now),
            Phase::Decoding { .. } => now,
            Phase::ExpectHead { rx } | Phase::ExpectBody { rx, .. } if rx.more => now,
            _ => self.request_deadline().unwrap_or(now),
        }
    }

    /// While idle: when the next request may start (rate limit, backoff).
    pub fn next_request_at(&self, now: Instant) -> Option<Instant> {
        matches!(self.phase, Phase::Idle { .. }).then(|| self.watch.next_start(now))
    }

    /// While a request is in flight: when the client gives up on it.
    pub fn request_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Idle { .. } | Phase::Decoding { .. } => None,
            Phase::Connecting { deadline, .. }
            | Phase::Handshaking { deadline, .. }
            | Phase::Sending { deadline, .. } => Some(*deadline),
            Phase::ExpectHead { rx } | Phase::ExpectBody { rx, .. } => Some(rx.deadline),
        }
    }

    /// The connection to register with the loop's poll, its id (a new id
    /// is a new socket: register, not reregister) and the readiness it
    /// waits for.
    pub fn wants(&mut self) -> Option<(&mut C::Stream, u64, Interest)> {
        let (conn, interest) = match &mut self.phase {
            Phase::Idle { conn } | Phase::Decoding { conn, .. } => {
                (conn.as_mut()?, Interest::READABLE)
            }
            Phase::Connecting { conn, .. } => (conn, Interest::READABLE | Interest::WRITABLE),
            Phase::Handshaking { conn, .. } => (conn, Interest::READABLE),
            Phase::Sending { conn, .. } => (conn, Interest::WRITABLE),
            Phase::ExpectHead { rx } | Phase::ExpectBody { rx, .. } => {
                (&mut rx.conn, Interest::READABLE)
            }
        };
        let interest = if conn.stream.wants_write() {
            interest | Interest::WRITABLE
        } else {
            interest
        };
        Some((&mut conn.stream, conn.id, interest))
    }

    /// Connections the client is done with: the loop deregisters, then
    /// drops (closes) them.
    pub fn retired(&mut self) -> std::vec::Drain<'_, (u64, C::Stream)> {
        self.retired.drain(..)
    }

    /// Time passed: give up on a request past its deadline, start one, or
    /// do the work that was waiting (a decode slice, the rest of a read).
    pub fn on_timer(&mut self, now: Instant, out: &mut Vec<Update>) {
        if self.request_deadline().is_some_and(|d| now >= d) {
            let failure = match self.phase {
                Phase::Connecting { .. } => Failure::new(ErrorReason::Connect, "connect timed out"),
                Phase::Handshaking { .. } => Failure::new(
                    ErrorReason::Tls,
                    format!("TLS: handshake not done within {HANDSHAKE_TIMEOUT:?} of the connect"),
                ),
                _ => Failure::new(
                    ErrorReason::Timeout,
                    format!("no complete response within {:?}", self.response_within()),
                ),
            };
            let conn = self.take_conn();
            return self.fail(now, conn, failure, false, out);
        }
        if now < self.poll_at(now) {
            return;
        }
        match std::mem::replace(&mut self.phase, Phase::Idle { conn: None }) {
            Phase::Idle { conn } => self.start(now, conn, out),
            Phase::Decoding { conn, decoding } => {
                let (phase, update) = self.decode(now, conn, decoding);
                self.enter(phase);
                out.extend(update);
            }
            phase => {
                // The read budget ran out last time: read on.
                self.enter(phase);
                self.drive(now, out);
            }
        }
    }

    /// A readiness event on the client's connection.
    pub fn on_event(&mut self, now: Instant, out: &mut Vec<Update>) {
        if let Phase::ExpectHead { rx } | Phase::ExpectBody { rx, .. } = &mut self.phase {
            // Readiness while a budget is spent changes nothing: the timer
            // reads on, after the deadline check.
            if rx.more {
                return;
            }
        }
        self.drive(now, out);
    }

    /// The loop could not register the connection: it is lost (a kept
    /// one quietly; one carrying a request as a failure).
    pub fn on_register_error(&mut self, now: Instant, e: &io::Error, out: &mut Vec<Update>) {
        if let Phase::Idle { conn } | Phase::Decoding { conn, .. } = &mut self.phase {
            if let Some(c) = conn.take() {
                self.retired.push((c.id, c.stream));
            }
            return;
        }
        let conn = self.take_conn();
        let failure = Failure::new(ErrorReason::Connect, format!("cannot poll the socket: {e}"));
        self.fail(now, conn, failure, false, out);
    }

    /// Takes the connection out of whatever phase holds it, leaving `Idle`
    /// (only on failure: a decode in progress would be abandoned).
    fn take_conn(&mut self) -> Option<Conn<C::Stream>> {
        match std::mem::replace(&mut self.phase, Phase::Idle { conn: None }) {
            Phase::Idle { conn } | Phase::Decoding { conn, .. } => conn,
            Phase::Connecting { conn, .. }
            | Phase::Handshaking { conn, .. }
            | Phase::Sending { conn, .. } => Some(conn),
            Phase::ExpectHead { rx } | Phase::ExpectBody { rx, .. } => Some(rx.conn),
        }
    }

    fn start(&mut self, now: Instant, conn: Option<Conn<C::Stream>>, out: &mut Vec<Update>) {
        self.watch.on_start(now);
        self.requests += 1;
        let request = self.build_request();
        if let Some(conn) = conn {
            let deadline = now + self.response_within();
            self.enter(Phase::Sending {
                conn,
                request,
                written: 0,
                deadline,
            });
            return self.drive(now, out);
        }
        match self.connector.connect() {
            Ok(stream) => {
                self.next_conn_id += 1;
                let conn = Conn {
                    stream,
                    id: self.next_conn_id,
                    reused: false,
                };
                self.enter(Phase::Connecting {
                    conn,
                    request,
                    deadline: now + CONNECT_TIMEOUT,
                });
                self.drive(now, out);
            }
            Err(e) => {
                let failure = Failure::new(ErrorReason::Connect, e.to_string());
                self.fail(now, None, failure, false, out);
            }
        }
    }

    /// The whole-response deadline, from the request's start:
    /// consul holds a blocking query up to wait × 17/16 (the request's
    /// wait: a `stale` one's is capped).
    fn response_within(&self) -> Duration {
        self.watch.request_wait(self.spec.wait) * 17 / 16 + RESPONSE_SLACK
    }

    fn build_request(&self) -> Vec<u8> {
        let c = &self.spec;
        let target = self.watch.target(
            &c.path_prefix,
            c.wait,
            c.namespace.as_deref(),
            c.partition.as_deref(),
        );
        c.request("GET", &target, &[])
    }

    /// The one place the phase changes, traced (`GITLAB_LOG_LEVEL=trace`)
    /// from the phase entered last (a phase taken out to be consumed
    /// leaves a placeholder behind, which is no transition).
    fn enter(&mut self, next: Phase<C::Stream>) {
        let to = next.name();
        if to != self.entered {
            log::trace!(from = self.entered, to; "consul client phase");
            self.entered = to;
        }
        self.phase = next;
    }

    /// Moves the machine as far as the socket allows.
    fn drive(&mut self, now: Instant, out: &mut Vec<Update>) {
        loop {
            let phase = std::mem::replace(&mut self.phase, Phase::Idle { conn: None });
            match self.step(phase, now) {
                Next::Go(p) => self.enter(p),
                Next::Wait(p) => return self.enter(p),
                Next::Done(p, update) => {
                    self.enter(p);
                    return out.push(update);
                }
                Next::Fail {
                    conn,
                    failure,
                    retry_fresh,
                } => return self.fail(now, conn, failure, retry_fresh, out),
            }
        }
    }

    /// One step of the phase the machine is in; each phase is its own
    /// function.
    fn step(&mut self, phase: Phase<C::Stream>, now: Instant) -> Next<C::Stream> {
        match phase {
            Phase::Idle { conn } => Next::Wait(Phase::Idle {
                conn: self.check_idle(conn),
            }),
            Phase::Decoding { conn, decoding } => Next::Wait(Phase::Decoding {
                conn: self.check_idle(conn),
                decoding,
            }),
            Phase::Connecting {
                conn,
                request,
                deadline,
            } => connecting(conn, request, deadline, now),
            Phase::Handshaking {
                conn,
                request,
                deadline,
            } => self.handshaking(conn, request, deadline, now),
            Phase::Sending {
                conn,
                request,
                written,
                deadline,
            } => sending(conn, request, written, deadline),
            Phase::ExpectHead { rx } => self.receive(rx, None, now),
            Phase::ExpectBody { rx, body } => self.receive(rx, Some(body), now),
        }
    }

    /// `Handshaking`: once the transport's handshake is done, the request
    /// is sent, with the whole response's deadline.
    fn handshaking(
        &self,
        mut conn: Conn<C::Stream>,
        request: Vec<u8>,
        deadline: Instant,
        now: Instant,
    ) -> Next<C::Stream> {
        match handshake_step(&mut conn) {
            Ok(true) => Next::Go(Phase::Sending {
                conn,
                request,
                written: 0,
                deadline: now + self.response_within(),
            }),
            Ok(false) => Next::Wait(Phase::Handshaking {
                conn,
                request,
                deadline,
            }),
            Err(failure) => Next::fail(conn, failure),
        }
    }

    /// Bytes or EOF on a connection with no request in flight: consul (or
    /// something between) closed it, or sent what nobody asked for. Close
    /// it quietly; the next request connects anew.
    fn check_idle(&mut self, conn: Option<Conn<C::Stream>>) -> Option<Conn<C::Stream>> {
        let mut conn = conn?;
        let mut probe = [0u8; 512];
        loop {
            match conn.stream.read(&mut probe) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(conn),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => {
                    self.traffic.bytes_received += *r.as_ref().unwrap_or(&0) as u64;
                    self.retire(conn);
                    return None;
                }
            }
        }
    }

    /// Reads, parses and inflates the response, at most [`READ_BUDGET`]
    /// bytes read and inflated.
    fn receive(
        &mut self,
        mut rx: Rx<C::Stream>,
        body: Option<Body>,
        now: Instant,
    ) -> Next<C::Stream> {
        let before = rx.received;
        let received = receive_step(&mut rx, body, self.spec.max_body_bytes);
        self.traffic.bytes_received += (rx.received - before) as u64;
        match received {
            Received::Complete(body) => self.complete(rx, body, now),
            Received::Wait(body) => Next::Wait(receiving(rx, body)),
            Received::Dropped(failure) => Next::Fail {
                retry_fresh: self.closed_while_idle(&rx, now),
                conn: Some(rx.conn),
                failure,
            },
            Received::Failed(failure) => Next::fail(rx.conn, failure),
        }
    }

    /// A kept connection failed before any byte of the answer, so soon
    /// after the request that the close must have crossed it: consul (or a
    /// proxy) closed the connection while it was idle. A close while
    /// consul held the request (a consul restart, seen by every agent at
    /// once) is a drop like any other.
    fn closed_while_idle(&self, rx: &Rx<C::Stream>, now: Instant) -> bool {
        let started = rx.deadline - self.response_within();
        rx.conn.reused && rx.received == 0 && now < started + IDLE_CLOSE_RACE
    }

    /// A whole response is in: keep the connection only if it may carry
    /// another request and nothing followed the body; apply the response.
    fn complete(&mut self, rx: Rx<C::Stream>, body: Body, now: Instant) -> Next<C::Stream> {
        let Rx {
            mut conn, inbuf, ..
        } = rx;
        let conn = if body.head.keep_alive && inbuf.is_empty() {
            conn.reused = true;
            Some(conn)
        } else {
            // Close-delimited, `Connection: close`, HTTP/1.0, or stray
            // bytes after the body: the next request connects anew.
            self.retire(conn);
            None
        };
        let Body { head, bytes, .. } = body;
        self.note_cluster(&head);
        match self.watch.on_response(now, &head, bytes) {
            Response::Done(update) => Next::Done(Phase::Idle { conn }, update),
            Response::Decode(decoding) => match self.decode(now, conn, Box::new(decoding)) {
                (phase, Some(update)) => Next::Done(phase, update),
                (phase, None) => Next::Wait(phase),
            },
        }
    }

    /// One slice of the loop's time decoding a listing: the update once
    /// done, else more next turn.
    fn decode(
        &mut self,
        now: Instant,
        conn: Option<Conn<C::Stream>>,
        mut decoding: Box<Decoding>,
    ) -> (Phase<C::Stream>, Option<Update>) {
        match decoding.step(&mut Slice::of_turn(now)) {
            Some(result) => (
                Phase::Idle { conn },
                Some(self.watch.on_decoded(now, result)),
            ),
            None => (Phase::Decoding { conn, decoding }, None),
        }
    }

    /// What a response says of the cluster (kept for the metrics when it
    /// says it).
    fn note_cluster(&mut self, head: &ResponseHead) {
        let text = |name| {
            let v = head.header(name)?;
            std::str::from_utf8(v).ok().map(str::trim)
        };
        if let Some(ms) = text("x-consul-lastcontact").and_then(|v| v.parse().ok()) {
            self.traffic.last_contact = Some(Duration::from_millis(ms));
        }
        if let Some(v) = text("x-consul-knownleader") {
            self.traffic.known_leader = Some(v.eq_ignore_ascii_case("true"));
        }
    }

    fn retire(&mut self, conn: Conn<C::Stream>) {
        self.retired.push((conn.id, conn.stream));
    }

    fn fail(
        &mut self,
        now: Instant,
        conn: Option<Conn<C::Stream>>,
        failure: Failure,
        retry_fresh: bool,
        out: &mut Vec<Update>,
    ) {
        if let Some(conn) = conn {
            self.retire(conn);
        }
        self.enter(Phase::Idle { conn: None });
        if retry_fresh {
            // The kept connection had been closed under us: one immediate
            // retry on a new connection (which is never `reused`), not an
            // error.
            return self.start(now, None, out);
        }
        out.push(self.watch.on_failure(now, failure));
    }
}

fn receiving<S>(rx: Rx<S>, body: Option<Body>) -> Phase<S> {
    match body {
        None => Phase::ExpectHead { rx },
        Some(body) => Phase::ExpectBody { rx, body },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GzipMode;
    use crate::consul::memstream::{config, pump, Act, MemConnector, MemStream};
    use crate::consul::watch::{CONFIG_ERROR_DELAY, MIN_GAP as MIN_GAP_FOR_TESTS};

    const PREFIX: &str = "p";
    /// One loop turn on the virtual clock.
    const TURN: Duration = Duration::from_millis(1);

    fn client(peers: Vec<MemStream>) -> Client<MemConnector> {
        client_with(peers, 64 << 20)
    }

    fn client_with(peers: Vec<MemStream>, max_body: usize) -> Client<MemConnector> {
        let connector = MemConnector {
            peers: peers.into(),
            connects: 0,
        };
        Client::new(&config(max_body), connector, PREFIX, 7)
    }

    /// A listing of `n` keys in consul's shape (`be/sN`: drain, maint, 50%).
    fn listing(n: usize) -> Vec<u8> {
        let values = ["ZHJhaW4=", "bWFpbnQ=", "NTAl"];
        let entries: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"LockIndex":0,"Key":"{PREFIX}/be/s{i}","Flags":0,"Value":"{}","CreateIndex":{i},"ModifyIndex":{i}}}"#,
                    values[i % 3]
                )
            })
            .collect();
        format!("[{}]", entries.join(",")).into_bytes()
    }

    /// How a response is framed on the wire.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Framing {
        Length,
        /// Chunks of 2 KiB with extensions, and trailers.
        Chunked,
        /// No length: the body ends at FIN.
        CloseDelimited,
        Http10,
        ConnectionClose,
        /// `100 Continue` and `103 Early Hints` before the response.
        InterimFirst,
    }

    const FRAMINGS: [Framing; 6] = [
        Framing::Length,
        Framing::Chunked,
        Framing::CloseDelimited,
        Framing::Http10,
        Framing::ConnectionClose,
        Framing::InterimFirst,
    ];

    impl Framing {
        /// Whether the connection may carry the next request.
        fn keeps(self) -> bool {
            matches!(
                self,
                Framing::Length | Framing::Chunked | Framing::InterimFirst
            )
        }
    }

    fn wire(framing: Framing, index: u64, body: &[u8]) -> Vec<u8> {
        wire_with(framing, index, "", body)
    }

    /// A response with these extra header lines (each ending in CRLF).
    fn wire_with(framing: Framing, index: u64, headers: &str, body: &[u8]) -> Vec<u8> {
        let head = |version: &str, extra: &str| {
            format!(
                "{version} 200 OK\r\nContent-Type: application/json\r\nX-Consul-Index: {index}\r\n{headers}{extra}\r\n"
            )
            .into_bytes()
        };
        let length = format!("Content-Length: {}\r\n", body.len());
        let mut w = match framing {
            Framing::Length => head("HTTP/1.1", &length),
            Framing::Chunked => head("HTTP/1.1", "Transfer-Encoding: chunked\r\n"),
            Framing::CloseDelimited => head("HTTP/1.1", ""),
            Framing::Http10 => head("HTTP/1.0", &length),
            Framing::ConnectionClose => head("HTTP/1.1", &format!("Connection: close\r\n{length}")),
            Framing::InterimFirst => {
                let mut w = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s>; rel=preload\r\n\r\n".to_vec();
                w.extend(head("HTTP/1.1", &length));
                w
            }
        };
        if framing == Framing::Chunked {
            for (i, chunk) in body.chunks(2048).enumerate() {
                w.extend(format!("{:x};ext{i}=\"a b\"\r\n", chunk.len()).into_bytes());
                w.extend_from_slice(chunk);
                w.extend_from_slice(b"\r\n");
            }
            w.extend_from_slice(b"0\r\nX-Trailer: done\r\n\r\n");
        } else {
            w.extend_from_slice(body);
        }
        w
    }

    /// What follows the response on the connection.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Ending {
        Nothing,
        Fin,
        Reset,
        StrayByte,
    }

    const ENDINGS: [Ending; 4] = [
        Ending::Nothing,
        Ending::Fin,
        Ending::Reset,
        Ending::StrayByte,
    ];

    /// An update reduced to what the loop acts on.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Seen {
        Swap { index: u64, keys: usize },
        Unchanged,
        Reset { from: u64, to: u64 },
        TooStale,
        Failed(ErrorReason),
        Nothing,
    }

    fn seen(u: Option<Update>) -> Seen {
        match u {
            Some(Update::Swap(s)) => Seen::Swap {
                index: s.index(),
                keys: s.len(),
            },
            Some(Update::Unchanged) => Seen::Unchanged,
            Some(Update::Reset { from, to }) => Seen::Reset { from, to },
            Some(Update::TooStale { .. }) => Seen::TooStale,
            Some(Update::Failed(f)) => Seen::Failed(f.reason),
            None => Seen::Nothing,
        }
    }

    /// What the first response must come to, whatever the split.
    fn expected(framing: Framing, ending: Ending, keys: usize) -> Seen {
        let swap = Seen::Swap { index: 9, keys };
        match (framing, ending) {
            (Framing::CloseDelimited, Ending::Fin) => swap,
            (Framing::CloseDelimited, Ending::Reset) => Seen::Failed(ErrorReason::Reset),
            // No end of body ever comes: the whole-response deadline.
            (Framing::CloseDelimited, _) => Seen::Failed(ErrorReason::Timeout),
            _ => swap,
        }
    }

    /// The response to the first request, split at `at` (a pause between
    /// the two parts), then `ending`; the peer answers the second request
    /// with a small listing at index 10. Checks the first outcome, whether
    /// the connection was kept, and that the second request goes out and
    /// is applied (on the same connection when kept, else on a new one).
    fn run(framing: Framing, ending: Ending, body: &[u8], keys: usize, at: usize) {
        run_wire(framing, ending, &wire(framing, 9, body), keys, at);
    }

    /// As [`run`], with the first response's bytes given (`framing` as
    /// they are framed).
    fn run_wire(framing: Framing, ending: Ending, first: &[u8], keys: usize, at: usize) {
        let mut script = vec![
            Act::Data(first[..at].to_vec()),
            Act::Pause,
            Act::Data(first[at..].to_vec()),
        ];
        script.push(match ending {
            Ending::Nothing => Act::Pause,
            Ending::Fin => Act::Fin,
            Ending::Reset => Act::Reset,
            Ending::StrayByte => Act::Data(b"x".to_vec()),
        });
        let second = vec![Act::Data(wire(Framing::Length, 10, &listing(2)))];
        let a = MemStream::answering([script, second.clone()]);
        let b = MemStream::answering([second]);
        let mut c = client(vec![a.clone(), b.clone()]);
        let mut now = Instant::now();
        let what = format!(
            "{framing:?} {ending:?} {keys} keys split at {at} of {}",
            first.len()
        );
        let got = seen(pump(&mut c, &mut now, Duration::from_secs(30), TURN));
        assert_eq!(got, expected(framing, ending, keys), "{what}");
        // The ending is seen by the next reads (readiness events).
        for _ in 0..4 {
            c.on_event(now, &mut Vec::new());
        }
        let kept = framing.keeps() && matches!(ending, Ending::Nothing) && got != Seen::Nothing;
        assert_eq!(c.wants().is_some(), kept, "{what}: connection kept");
        let next = seen(pump(&mut c, &mut now, Duration::from_secs(30), TURN));
        assert_eq!(
            next,
            Seen::Swap { index: 10, keys: 2 },
            "{what}: next request"
        );
        assert_eq!(a.requests() + b.requests(), 2, "{what}");
        assert_eq!(
            b.requests(),
            usize::from(!kept),
            "{what}: second connection"
        );
    }

    /// A 10-key listing framed so, split at every byte, then every ending.
    fn small_listing_split_at_every_byte(framing: Framing) {
        let body = listing(10);
        let len = wire(framing, 9, &body).len();
        for ending in ENDINGS {
            for at in 0..=len {
                run(framing, ending, &body, 10, at);
            }
        }
    }

    #[test]
    fn small_listing_content_length_split_at_every_byte_then_every_ending() {
        small_listing_split_at_every_byte(Framing::Length);
    }

    #[test]
    fn small_listing_chunked_split_at_every_byte_then_every_ending() {
        small_listing_split_at_every_byte(Framing::Chunked);
    }

    #[test]
    fn small_listing_close_delimited_split_at_every_byte_then_every_ending() {
        small_listing_split_at_every_byte(Framing::CloseDelimited);
    }

    #[test]
    fn small_listing_http10_split_at_every_byte_then_every_ending() {
        small_listing_split_at_every_byte(Framing::Http10);
    }

    #[test]
    fn small_listing_connection_close_split_at_every_byte_then_every_ending() {
        small_listing_split_at_every_byte(Framing::ConnectionClose);
    }

    #[test]
    fn small_listing_after_1xx_split_at_every_byte_then_every_ending() {
        small_listing_split_at_every_byte(Framing::InterimFirst);
    }

    /// Regression (the issue "No peer but haproxy can stop the answers",
    /// 1): past 4,096 keys the listing is decoded in slices, and the client
    /// read the socket again meanwhile: with `Connection: close`, HTTP/1.0
    /// or a stray byte the process aborted ("reading without a stream"),
    /// a FIN after a keep-alive response threw the listing away forever,
    /// and a late byte reached `unreachable!`.
    #[test]
    fn large_listing_every_framing_then_every_ending_is_applied_or_counted() {
        let body = listing(12_000);
        assert!(body.len() > READ_BUDGET + 1);
        for framing in FRAMINGS {
            let w = wire(framing, 9, &body);
            let head = w.windows(4).rposition(|x| x == b"\r\n\r\n").unwrap_or(0) + 4;
            let splits = [
                0,
                head - 1,
                head,
                READ_BUDGET - 1,
                READ_BUDGET + 1,
                w.len() - 1,
                w.len(),
            ];
            for ending in ENDINGS {
                for at in splits {
                    run(framing, ending, &body, 12_000, at);
                }
            }
        }
    }

    #[test]
    fn a_large_listing_is_read_a_budget_per_turn() {
        let body = listing(12_000);
        assert!(body.len() > READ_BUDGET);
        let peer = MemStream::answering([vec![Act::Data(wire(Framing::Length, 9, &body))]]);
        let mut c = client(vec![peer]);
        let now = Instant::now();
        let mut out = Vec::new();
        c.on_timer(now, &mut out);
        assert!(out.is_empty());
        assert_eq!(c.phase_name(), "reading_body");
        assert_eq!(c.poll_at(now), now, "more to read: come back at once");
        // A readiness event does not read past the budget either.
        c.on_event(now, &mut out);
        assert_eq!(c.phase_name(), "reading_body");
    }

    /// Regression (issue 11, 6): the deadline was skipped while the read
    /// budget kept running out, so a peer sending forever (chunk
    /// extensions: little body, much wire) was read for gigabytes.
    #[test]
    fn a_peer_that_never_stops_sending_is_cut_by_the_deadline() {
        let head = b"HTTP/1.1 200 OK\r\nX-Consul-Index: 9\r\nTransfer-Encoding: chunked\r\n\r\n";
        let ext = format!("1;{}\r\n \r\n", "e".repeat(1000)).into_bytes();
        let peer = MemStream::answering([vec![Act::Data(head.to_vec()), Act::Endless(ext)]]);
        let mut c = client(vec![peer]);
        let t0 = Instant::now();
        let mut now = t0;
        // A turn of a second: the deadline (1 s × 17/16 + 5 s) comes after
        // a handful of budgets, long before the wire bound.
        let got = pump(
            &mut c,
            &mut now,
            Duration::from_secs(60),
            Duration::from_secs(1),
        );
        assert_eq!(seen(got), Seen::Failed(ErrorReason::Timeout));
        // Started on the first turn, given up on the first turn past the
        // deadline.
        assert!(
            now - t0 <= Duration::from_millis(1000 + 1062 + 5000 + 1000),
            "{:?}",
            now - t0
        );
    }

    #[test]
    fn wire_bytes_are_bounded_as_well_as_the_body() {
        let head = b"HTTP/1.1 200 OK\r\nX-Consul-Index: 9\r\nTransfer-Encoding: chunked\r\n\r\n";
        let ext = format!("1;{}\r\n \r\n", "e".repeat(1000)).into_bytes();
        let peer = MemStream::answering([vec![Act::Data(head.to_vec()), Act::Endless(ext)]]);
        let mut c = client_with(vec![peer], 100_000);
        let mut now = Instant::now();
        let got = pump(&mut c, &mut now, Duration::from_secs(5), TURN);
        assert_eq!(seen(got), Seen::Failed(ErrorReason::TooLarge));
    }

    /// Reviewer's finding: each interim head was drained on its own, so a
    /// storm of them cost quadratic time.
    #[test]
    fn a_storm_of_interim_heads_is_skipped_in_one_pass() {
        let mut w = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(20_000);
        w.extend(wire(Framing::Length, 9, &listing(3)));
        let peer = MemStream::answering([vec![Act::Data(w)]]);
        let mut c = client(vec![peer]);
        let mut now = Instant::now();
        let got = seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN));
        assert_eq!(got, Seen::Swap { index: 9, keys: 3 });
    }

    #[test]
    fn status_classes() {
        let cases: [(&str, ErrorReason, bool); 6] = [
            ("204 No Content", ErrorReason::BadBody, false),
            (
                "301 Moved Permanently\r\nLocation: https://x/",
                ErrorReason::Http4xx,
                true,
            ),
            ("403 Forbidden", ErrorReason::Http4xx, true),
            ("429 Too Many Requests", ErrorReason::Http4xx, false),
            ("503 Service Unavailable", ErrorReason::Http5xx, false),
            ("200 OK", ErrorReason::BadIndex, false),
        ];
        for (status, reason, configuration) in cases {
            let resp = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
            let peer = MemStream::answering([vec![Act::Data(resp.into_bytes())]]);
            let mut c = client(vec![peer]);
            let t0 = Instant::now();
            let mut now = t0;
            match pump(&mut c, &mut now, Duration::from_secs(5), TURN) {
                Some(Update::Failed(f)) => {
                    assert_eq!(
                        (f.reason, f.configuration),
                        (reason, configuration),
                        "{status}"
                    )
                }
                other => panic!("{status}: {other:?}"),
            }
            let retry = c.next_request_at(now).expect("idle") - now;
            assert_eq!(
                retry >= CONFIG_ERROR_DELAY,
                configuration,
                "{status}: {retry:?}"
            );
        }
    }

    #[test]
    fn a_kept_connection_closed_while_idle_is_dropped_quietly_and_not_an_error() {
        let first = wire(Framing::Length, 9, &listing(3));
        let a = MemStream::answering([vec![Act::Data(first)]]);
        let b = MemStream::answering([vec![Act::Data(wire(Framing::Length, 10, &listing(2)))]]);
        let mut c = client(vec![a.clone(), b.clone()]);
        let mut now = Instant::now();
        assert_eq!(
            seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN)),
            Seen::Swap { index: 9, keys: 3 }
        );
        assert!(c.wants().is_some());
        a.0.borrow_mut().script.push_back(Act::Fin);
        c.on_event(now, &mut Vec::new());
        assert!(c.wants().is_none(), "closed while idle");
        assert_eq!(c.retired().count(), 1, "handed to the loop to close");
        assert_eq!(
            seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN)),
            Seen::Swap { index: 10, keys: 2 }
        );
        assert_eq!(c.watch().failures(), 0);
    }

    #[test]
    fn a_kept_connection_found_closed_at_the_next_request_is_retried_at_once() {
        // The close races the request: the request is written, then EOF.
        let first = wire(Framing::Length, 9, &listing(3));
        let a = MemStream::answering([vec![Act::Data(first)], vec![Act::Fin]]);
        let b = MemStream::answering([vec![Act::Data(wire(Framing::Length, 10, &listing(2)))]]);
        let mut c = client(vec![a, b.clone()]);
        let mut now = Instant::now();
        seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN));
        let before = now;
        assert_eq!(
            seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN)),
            Seen::Swap { index: 10, keys: 2 },
            "no error reported"
        );
        assert_eq!(b.requests(), 1);
        assert!(
            now - before < Duration::from_millis(200),
            "{:?}",
            now - before
        );
    }

    #[test]
    fn connect_refused_backs_off_and_the_retry_is_nonblocking() {
        let mut c = client(vec![]);
        let mut now = Instant::now();
        assert_eq!(
            seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN)),
            Seen::Failed(ErrorReason::Connect)
        );
        assert!(c.next_request_at(now).expect("idle") > now);
        assert_eq!(c.watch().request_index(), 0);
    }

    // ---- gzip ----

    const GZIP: &str = "Content-Encoding: gzip\r\n";

    fn gzip_wire(framing: Framing, index: u64, body: &[u8]) -> Vec<u8> {
        wire_with(framing, index, GZIP, &crate::http::gzip(body))
    }

    fn gzip_split_at_every_byte(framing: Framing) {
        let body = listing(10);
        let first = gzip_wire(framing, 9, &body);
        for ending in ENDINGS {
            for at in 0..=first.len() {
                run_wire(framing, ending, &first, 10, at);
            }
        }
    }

    #[test]
    fn gzip_content_length_split_at_every_byte_then_every_ending() {
        gzip_split_at_every_byte(Framing::Length);
    }

    #[test]
    fn gzip_chunked_split_at_every_byte_then_every_ending() {
        gzip_split_at_every_byte(Framing::Chunked);
    }

    #[test]
    fn gzip_close_delimited_split_at_every_byte_then_every_ending() {
        gzip_split_at_every_byte(Framing::CloseDelimited);
    }

    #[test]
    fn gzip_other_framings_split_at_every_byte_then_every_ending() {
        for framing in [
            Framing::Http10,
            Framing::ConnectionClose,
            Framing::InterimFirst,
        ] {
            gzip_split_at_every_byte(framing);
        }
    }

    /// Past the budget of a turn the body is inflated over several turns,
    /// under every framing and ending, whatever the split.
    #[test]
    fn a_large_gzip_listing_is_inflated_a_budget_per_turn_under_every_framing() {
        let body = listing(12_000);
        assert!(body.len() > READ_BUDGET, "{}", body.len());
        for framing in FRAMINGS {
            let w = gzip_wire(framing, 9, &body);
            // The final head ends at the first blank line after its index.
            let index = w
                .windows(14)
                .position(|x| x == b"X-Consul-Index")
                .unwrap_or(0);
            let head = index
                + w[index..]
                    .windows(4)
                    .position(|x| x == b"\r\n\r\n")
                    .unwrap_or(0)
                + 4;
            for ending in ENDINGS {
                for at in [
                    0,
                    head - 1,
                    head,
                    head + 10,
                    w.len() / 2,
                    w.len() - 1,
                    w.len(),
                ] {
                    run_wire(framing, ending, &w, 12_000, at);
                }
            }
        }
        // One turn reads and inflates at most the budget, then comes back.
        let peer = MemStream::answering([vec![Act::Data(gzip_wire(Framing::Chunked, 9, &body))]]);
        let mut c = client(vec![peer]);
        let now = Instant::now();
        let mut out = Vec::new();
        c.on_timer(now, &mut out);
        assert!(out.is_empty());
        assert_eq!(c.phase_name(), "reading_body");
        assert_eq!(c.poll_at(now), now, "more to inflate: come back at once");
        let mut turns = 1;
        while out.is_empty() {
            c.on_timer(now, &mut out);
            turns += 1;
        }
        assert!(matches!(out[0], Update::Swap(_)), "{:?}", out[0]);
        let decode_turns = body.len().div_ceil(READ_BUDGET);
        assert!(
            turns >= decode_turns,
            "{turns} turns for {} bytes",
            body.len()
        );
    }

    /// The first request's response is `first`, cut at `at`, then the
    /// peer closes; the client must fail with `reason` (keeping nothing),
    /// and the next request, on a new connection, is applied.
    fn fails_then_recovers(
        first: &[u8],
        at: usize,
        max_body: usize,
        reason: ErrorReason,
    ) -> Instant {
        let script = vec![
            Act::Data(first[..at].to_vec()),
            Act::Pause,
            Act::Data(first[at..].to_vec()),
            Act::Fin,
        ];
        let a = MemStream::answering([script]);
        let b = MemStream::answering([vec![Act::Data(wire(Framing::Length, 10, &listing(2)))]]);
        let mut c = client_with(vec![a, b.clone()], max_body);
        let t0 = Instant::now();
        let mut now = t0;
        let got = seen(pump(&mut c, &mut now, Duration::from_secs(30), TURN));
        assert_eq!(
            got,
            Seen::Failed(reason),
            "split at {at} of {}",
            first.len()
        );
        let failed_at = now;
        assert!(c.wants().is_none(), "connection closed");
        let next = seen(pump(&mut c, &mut now, Duration::from_secs(30), TURN));
        assert_eq!(next, Seen::Swap { index: 10, keys: 2 }, "next request");
        assert_eq!(b.requests(), 1);
        failed_at
    }

    #[test]
    fn a_gzip_bomb_is_too_large_under_every_framing_and_memory_stays_bounded() {
        // 64 MiB of JSON-ish spaces: about 64 KiB on the wire.
        let mut bomb = vec![b' '; 64 << 20];
        bomb[0] = b'[';
        let max_body = 1 << 20;
        for framing in FRAMINGS {
            let w = wire_with(framing, 9, GZIP, &crate::http::gzip(&bomb));
            assert!(w.len() < 128 << 10, "{}", w.len());
            for at in [0, w.len() / 3, w.len()] {
                let t0 = Instant::now();
                let failed_at = fails_then_recovers(&w, at, max_body, ErrorReason::TooLarge);
                // Cut as soon as the bound is passed: a turn or two, not
                // the 64 turns inflating it all would take.
                assert!(failed_at - t0 < Duration::from_millis(20), "{framing:?}");
            }
        }
    }

    #[test]
    fn corrupt_truncated_and_unknown_encodings_are_bad_body() {
        let body = listing(30);
        let z = crate::http::gzip(&body);
        let mut flipped = z.clone();
        let n = flipped.len();
        flipped[n - 6] ^= 0x40; // the CRC
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "gzip header on plain JSON",
                wire_with(Framing::Chunked, 9, GZIP, &body),
            ),
            ("bad CRC", wire_with(Framing::Length, 9, GZIP, &flipped)),
            (
                "cut short, chunked",
                wire_with(Framing::Chunked, 9, GZIP, &z[..n - 9]),
            ),
            (
                "cut short, length",
                wire_with(Framing::Length, 9, GZIP, &z[..n / 2]),
            ),
            (
                "cut short, close-delimited",
                wire_with(Framing::CloseDelimited, 9, GZIP, &z[..n - 1]),
            ),
            (
                "br",
                wire_with(Framing::Length, 9, "Content-Encoding: br\r\n", &body),
            ),
            (
                "gzip twice",
                wire_with(
                    Framing::Length,
                    9,
                    "Content-Encoding: gzip\r\nContent-Encoding: gzip\r\n",
                    &z,
                ),
            ),
        ];
        for (what, w) in cases {
            for at in [0, w.len() / 2, w.len()] {
                let failure = std::panic::catch_unwind(|| {
                    fails_then_recovers(&w, at, 64 << 20, ErrorReason::BadBody);
                });
                assert!(failure.is_ok(), "{what}, split at {at}");
            }
        }
        // `identity`, or an empty value, is no coding at all.
        let plain = wire_with(
            Framing::Length,
            9,
            "Content-Encoding: identity\r\nContent-Encoding:\r\n",
            &body,
        );
        let mut c = client(vec![MemStream::answering([vec![Act::Data(plain)]])]);
        let mut now = Instant::now();
        assert_eq!(
            seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN)),
            Seen::Swap { index: 9, keys: 30 }
        );
    }

    /// Regression (fuzz `consul_gzip`): the framed gzip bytes were bounded
    /// by -consul-max-body-bytes too, and all of a read was framed before
    /// any was inflated: 200 bytes that are not gzip, close-delimited under
    /// a 64-byte bound, were `too_large` in one read and `bad_body` (bad
    /// magic) byte by byte. Errors now come in the order of the bytes.
    #[test]
    fn gzip_errors_come_in_stream_order_whatever_the_split() {
        use crate::consul::memstream::{answer_once, Outcome};
        let not_gzip = vec![b'N'; 200];
        let mut bomb_then_bad_chunk = crate::http::gzip(&vec![b' '; 4096]);
        bomb_then_bad_chunk.truncate(bomb_then_bad_chunk.len() - 4);
        let cases = [
            (
                Framing::CloseDelimited,
                not_gzip.clone(),
                ErrorReason::BadBody,
            ),
            (Framing::Length, not_gzip, ErrorReason::BadBody),
            // Inflates past 64 bytes before the stream is cut short.
            (
                Framing::Length,
                bomb_then_bad_chunk.clone(),
                ErrorReason::TooLarge,
            ),
            (Framing::Chunked, bomb_then_bad_chunk, ErrorReason::TooLarge),
        ];
        for (framing, body, reason) in cases {
            let mut w = wire_with(framing, 9, GZIP, &body);
            if framing == Framing::Chunked {
                // A bad chunk after the data: framing fails late.
                let end = w.len() - 5;
                w.truncate(end);
                w.extend_from_slice(b"zz\r\n");
            }
            let whole = answer_once(&w, &[], &Act::Fin, 64);
            let bytewise = answer_once(&w, &vec![1; w.len()], &Act::Fin, 64);
            assert_eq!(whole.0, Outcome::Failed(reason), "{framing:?}");
            assert_eq!(whole, bytewise, "{framing:?}");
        }
    }

    /// The request head the client wrote first.
    fn first_request(peer: &MemStream) -> String {
        let written = peer.0.borrow().written.clone();
        let end = written
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a request")
            + 4;
        String::from_utf8_lossy(&written[..end]).into_owned()
    }

    #[test]
    fn gzip_is_asked_for_only_when_configured_and_counted_compressed() {
        let body = listing(500);
        let answer = gzip_wire(Framing::Chunked, 9, &body);
        for (mode, asks) in [
            (GzipMode::Always, true),
            (GzipMode::Never, false),
            // The scripted peer is at 127.0.0.1: loopback.
            (GzipMode::Auto, false),
        ] {
            let peer = MemStream::answering([vec![Act::Data(answer.clone())]]);
            let config = ConsulConfig {
                gzip: mode,
                ..config(64 << 20)
            };
            let connector = MemConnector {
                peers: [peer.clone()].into(),
                connects: 0,
            };
            let mut c = Client::new(&config, connector, PREFIX, 7);
            let mut now = Instant::now();
            let got = seen(pump(&mut c, &mut now, Duration::from_secs(5), TURN));
            assert_eq!(
                got,
                Seen::Swap {
                    index: 9,
                    keys: 500
                },
                "{mode:?}"
            );
            let head = first_request(&peer);
            assert_eq!(
                head.contains("\r\nAccept-Encoding: gzip\r\n"),
                asks,
                "{mode:?}: {head}"
            );
            assert_eq!(
                c.traffic().bytes_received,
                answer.len() as u64,
                "wire bytes, not inflated ones"
            );
        }
    }

    #[test]
    fn last_contact_and_known_leader_are_read_from_each_response_that_says_them() {
        let leader = "X-Consul-Knownleader: true\r\nX-Consul-Lastcontact: 0\r\n";
        let follower = "X-Consul-KnownLeader: false\r\nX-Consul-LastContact: 1500\r\n";
        let a = MemStream::answering([
            vec![Act::Data(wire_with(
                Framing::Length,
                9,
                leader,
                &listing(1),
            ))],
            vec![Act::Data(wire_with(
                Framing::Length,
                10,
                follower,
                &listing(1),
            ))],
            vec![Act::Data(wire(Framing::Length, 11, &listing(1)))],
        ]);
        let mut c = client(vec![a]);
        let mut now = Instant::now();
        assert_eq!(c.traffic(), Traffic::default());
        pump(&mut c, &mut now, Duration::from_secs(5), TURN);
        let t = c.traffic();
        assert_eq!(
            (t.last_contact, t.known_leader),
            (Some(Duration::ZERO), Some(true))
        );
        pump(&mut c, &mut now, Duration::from_secs(5), TURN);
        let t = c.traffic();
        assert_eq!(
            (t.last_contact, t.known_leader),
            (Some(Duration::from_millis(1500)), Some(false))
        );
        // A response without them leaves what the last one said.
        pump(&mut c, &mut now, Duration::from_secs(5), TURN);
        assert_eq!(c.traffic().last_contact, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn a_too_stale_answer_is_asked_again_at_once_of_the_leader() {
        let stale = "X-Consul-Lastcontact: 9000\r\nX-Consul-Knownleader: true\r\n";
        let fresh = "X-Consul-Lastcontact: 10\r\n";
        let a = MemStream::answering([
            vec![Act::Data(wire_with(Framing::Length, 9, fresh, &listing(3)))],
            vec![Act::Data(wire_with(
                Framing::Length,
                12,
                stale,
                &listing(5),
            ))],
            vec![Act::Data(wire(Framing::Length, 12, &listing(5)))],
        ]);
        let config = ConsulConfig {
            max_stale: Duration::from_secs(2),
            ..config(64 << 20)
        };
        let connector = MemConnector {
            peers: [a.clone()].into(),
            connects: 0,
        };
        let mut c = Client::new(&config, connector, PREFIX, 7);
        let mut now = Instant::now();
        let step = |c: &mut Client<MemConnector>, now: &mut Instant| {
            seen(pump(c, now, Duration::from_secs(5), TURN))
        };
        assert_eq!(step(&mut c, &mut now), Seen::Swap { index: 9, keys: 3 });
        assert_eq!(step(&mut c, &mut now), Seen::TooStale);
        let before = now;
        assert_eq!(c.watch().index(), 9);
        assert_eq!(step(&mut c, &mut now), Seen::Swap { index: 12, keys: 5 });
        assert!(
            now - before <= MIN_GAP_FOR_TESTS + Duration::from_millis(10),
            "{:?}",
            now - before
        );
        let written = String::from_utf8_lossy(&a.0.borrow().written).into_owned();
        let targets: Vec<&str> = written.lines().filter(|l| l.starts_with("GET ")).collect();
        assert_eq!(
            targets,
            [
                "GET /v1/kv/p/?recurse=&stale= HTTP/1.1",
                "GET /v1/kv/p/?recurse=&index=9&wait=1000ms&stale= HTTP/1.1",
                "GET /v1/kv/p/?recurse=&index=9&wait=1000ms HTTP/1.1",
            ]
        );
        assert_eq!(c.traffic().stale_reasks, 1);
    }

    // ---- reconnects after a consul restart ----

    /// A client synced at index 9 with its blocking request held by consul
    /// since `t0`; returns it, its peer, and the peer of its next
    /// connection (silent).
    fn held(seed: u64, t0: Instant) -> (Client<MemConnector>, MemStream, MemStream) {
        let peer = MemStream::answering([
            vec![Act::Data(wire(Framing::Length, 9, &listing(2)))],
            vec![],
        ]);
        let spare = MemStream::answering([vec![]]);
        let connector = MemConnector {
            peers: [peer.clone(), spare.clone()].into(),
            connects: 0,
        };
        let mut c = Client::new(&config(64 << 20), connector, PREFIX, seed);
        let mut out = Vec::new();
        c.on_timer(t0, &mut out);
        assert!(matches!(out.pop(), Some(Update::Swap(_))));
        let next = c.next_request_at(t0).expect("idle");
        c.on_timer(next, &mut out);
        assert_eq!((peer.requests(), c.phase_name()), (2, "awaiting_head"));
        (c, peer, spare)
    }

    #[test]
    fn a_consul_restart_while_requests_are_held_spreads_the_fleets_reconnects_over_the_backoff() {
        const FLEET: u64 = 1000;
        let t0 = Instant::now();
        for ending in [Act::Fin, Act::Reset] {
            let restart = t0 + Duration::from_secs(120);
            let mut delays = Vec::new();
            for seed in 1..=FLEET {
                let (mut c, peer, spare) = held(seed, t0);
                peer.0.borrow_mut().script.push_back(ending.clone());
                let mut out = Vec::new();
                c.on_event(restart, &mut out);
                assert!(
                    matches!(out.as_slice(), [Update::Failed(f)] if f.reason == ErrorReason::Reset),
                    "{out:?}"
                );
                // Not retried on the spot: nothing connected yet.
                assert!(c.wants().is_none());
                assert_eq!(spare.requests(), 0);
                delays.push(c.next_request_at(restart).expect("idle") - restart);
            }
            // Over the whole first interval (250 ms) ...
            let first = Duration::from_millis(250);
            assert!(delays.iter().all(|&d| d <= first), "{ending:?}");
            let mut tenths = [0; 10];
            let mut per_ms = [0; 251];
            for d in &delays {
                tenths[((d.as_micros() * 10 / first.as_micros()) as usize).min(9)] += 1;
                per_ms[d.as_millis() as usize] += 1;
            }
            assert!(
                tenths.iter().all(|&n| (60..=140).contains(&n)),
                "{ending:?}: {tenths:?}"
            );
            // ... so no millisecond sees more than about 1 % of the fleet
            // (4 on average), where all 1,000 came back at once before.
            let busiest = per_ms.iter().max().copied().unwrap_or(0);
            assert!(
                busiest <= 12,
                "{ending:?}: {busiest} reconnects in one millisecond"
            );
        }
    }

    #[test]
    fn a_close_right_after_the_request_is_an_idle_close_and_retried_at_once() {
        // The same close 10 ms after the blocking request went out: it
        // crossed the request (consul or a proxy closed the idle
        // connection), so a fresh connection goes at once, no error.
        let t0 = Instant::now();
        let (mut c, peer, spare) = held(3, t0);
        let sent = t0 + MIN_GAP_FOR_TESTS;
        peer.0.borrow_mut().script.push_back(Act::Fin);
        let mut out = Vec::new();
        c.on_event(sent + Duration::from_millis(10), &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(spare.requests(), 1, "a fresh connection at once");
        // And one past the window is a drop.
        let (mut c, peer, spare) = held(3, t0);
        peer.0.borrow_mut().script.push_back(Act::Fin);
        c.on_event(sent + IDLE_CLOSE_RACE + Duration::from_millis(1), &mut out);
        assert!(matches!(out.as_slice(), [Update::Failed(_)]), "{out:?}");
        assert_eq!(spare.requests(), 0);
    }
}
