//! One HTTP/1.1 server connection, shared by the monitoring, pprof and dev
//! KV listeners: read a request (head + body, bounded), hand it to the loop,
//! write the response, keep alive or close.
//!
//! In: readiness of the socket, the time, and responses from whoever
//! handles the request. Out: complete requests, what to wait for, and the
//! connection's deadline.
//!
//! Always holds:
//! - a head is at most [`Limits::max_head`];
//! - a body at most [`Limits::max_put_body`] on `PUT`, [`SMALL_BODY`] on
//!   other methods (read, so that the route can answer "405 method not
//!   allowed"), else 413, and a request that breaks the framing rules
//!   gets a 400: either closes the connection.
//!
//! One request is handled at a time (pipelined bytes wait in the buffer, at
//! most a head's worth plus one read). One call reads at most
//! [`READ_BUDGET`] bytes and hands out at most one request. Every phase but
//! `Handling` has a deadline: a connection never holds its slot forever.
//!
//! Phases `ExpectHead`, `ExpectBody`, `Handling`, `Writing`: the table is in
//! `docs/LIFECYCLE.md`.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use super::{
    parse_request_head, render_head, render_response, BodyDecoder, BodyError, Method, Parse,
    RequestHead, Response,
};
use crate::labels::label_enum;

/// A kept-alive connection may wait this long for the first byte of its
/// next request (and a new one for its first).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// From the first byte of a request head to its end (slowloris).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// From the end of the head to the end of the body (a dev KV PUT).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// A response must be taken by the peer within this.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes read per call, at most: one peer cannot hold the loop.
pub const READ_BUDGET: usize = 64 * 1024;
/// Bytes written per call, at most: 32 connections handed a 3 MB render at
/// once copy 64 KiB each into the kernel per turn, not their whole socket
/// buffers (about 20 ms in one turn).
pub const WRITE_BUDGET: usize = 64 * 1024;

/// A rendered body, shared by every connection that asked for it (one
/// reference-counted buffer: a connection that never reads holds a
/// reference, not a copy).
pub type Body = std::sync::Arc<Vec<u8>>;

/// A response to write on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A whole response; a body over `chunk_over` bytes is sent chunked.
    Full {
        resp: Response,
        head_only: bool,
        chunk_over: Option<usize>,
    },
    /// A shared body (`resp.body` is ignored), with `resp`'s head.
    Shared {
        resp: Response,
        body: Body,
        head_only: bool,
    },
}

label_enum! {
    /// The HTTP listeners (metric label `listener`); each has its own pool
    /// of connection slots, so a flood on one never refuses another.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Role {
        Monitoring => "monitoring",
        Pprof => "pprof",
        DevKv => "dev_kv",
    }
}

impl Role {
    /// Connections open at once; a full pool evicts (see
    /// [`HttpConn::eviction_key`]). Memory at most `pool × (max_head +
    /// one read)` for a GET-only listener.
    pub fn pool(self) -> usize {
        match self {
            Role::Monitoring => 256,
            Role::Pprof => 32,
            Role::DevKv => 512,
        }
    }

    pub fn limits(self) -> Limits {
        match self {
            // GET only: a small head, no body worth the name.
            Role::Monitoring | Role::Pprof => Limits {
                max_head: 8 * 1024,
                max_put_body: SMALL_BODY,
            },
            // A PUT value may be 512 KiB in consul; a little slack.
            Role::DevKv => Limits {
                max_head: 16 * 1024,
                max_put_body: 1024 * 1024,
            },
        }
    }
}

/// What one listener accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_head: usize,
    /// A `PUT` body may be this long; other methods' at most [`SMALL_BODY`].
    pub max_put_body: usize,
}

/// The body any request may carry: no route but a dev KV PUT takes one,
/// but a small one is read so that the answer says why (405, not 413).
pub const SMALL_BODY: usize = 1024;

/// What the loop should do after an event.
#[derive(Debug)]
pub enum HttpProgress {
    /// A complete request: answer it with [`HttpConn::respond`].
    Request(RequestHead, Vec<u8>),
    NeedRead,
    NeedWrite,
    /// A response went out whole and the connection is kept: call
    /// [`HttpConn::on_readable`] for the next request (now or next turn).
    Written,
    /// The read (or write) budget is spent with bytes possibly left:
    /// call [`HttpConn::on_readable`] again next turn (no event will come).
    Yield,
    /// Done (peer closed, error, or `Connection: close` answered).
    Close,
}

enum Phase {
    ExpectHead {
        /// When the wait began (accept, or the last response written).
        since: Instant,
        /// When the first byte of the head came.
        started: Option<Instant>,
    },
    ExpectBody {
        head: RequestHead,
        decoder: BodyDecoder,
        body: Vec<u8>,
        since: Instant,
    },
    Handling {
        keep_alive: bool,
    },
    Writing {
        written: usize,
        keep_alive: bool,
        since: Instant,
    },
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::ExpectHead { .. } => "expect_head",
            Phase::ExpectBody { .. } => "expect_body",
            Phase::Handling { .. } => "handling",
            Phase::Writing { .. } => "writing",
        }
    }
}

pub struct HttpConn<S> {
    stream: S,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// A shared body written after `out` (a heavy render: a reference,
    /// never a copy per connection).
    shared: Option<Body>,
    phase: Phase,
    limits: Limits,
    accepted: Instant,
    /// Responses written whole.
    served: u64,
}

impl<S: Read + Write> HttpConn<S> {
    pub fn new(stream: S, limits: Limits, now: Instant) -> HttpConn<S> {
        HttpConn {
            stream,
            inbuf: Vec::new(),
            out: Vec::new(),
            shared: None,
            phase: Phase::ExpectHead {
                since: now,
                started: None,
            },
            limits,
            accepted: now,
            served: 0,
        }
    }

    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// True while a request is out with the loop (the dev KV may hold it).
    pub fn is_handling(&self) -> bool {
        matches!(self.phase, Phase::Handling { .. })
    }

    /// When the connection has waited too long (`None` while handling).
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::ExpectHead {
                since,
                started: None,
            } => Some(*since + IDLE_TIMEOUT),
            Phase::ExpectHead {
                started: Some(t), ..
            } => Some(*t + HEAD_TIMEOUT),
            Phase::ExpectBody { since, .. } => Some(*since + BODY_TIMEOUT),
            Phase::Handling { .. } => None,
            Phase::Writing { since, .. } => Some(*since + WRITE_TIMEOUT),
        }
    }

    /// Which connection a full pool closes first: the lowest key, among
    /// those `None` (a request out with the loop is never evicted). Those
    /// that never completed a request go first, oldest first.
    pub fn eviction_key(&self) -> Option<(bool, Instant)> {
        (!self.is_handling()).then_some((self.served > 0, self.accepted))
    }

    /// The socket is (or may be) readable. `scratch` is the loop's read
    /// buffer (any size > 0).
    pub fn on_readable(&mut self, now: Instant, scratch: &mut [u8]) -> HttpProgress {
        match self.phase {
            Phase::ExpectHead { .. } | Phase::ExpectBody { .. } => {}
            Phase::Handling { .. } => return self.peek_closed(scratch),
            Phase::Writing { .. } => return self.on_writable(now),
        }
        let mut budget = READ_BUDGET;
        loop {
            match self.parse_buffered(now) {
                Ok(Some(p)) => return p,
                Ok(None) => {}
                Err(refusal) => return self.refuse(refusal, now),
            }
            if budget == 0 {
                return HttpProgress::Yield;
            }
            let room = scratch.len().min(budget);
            match self.stream.read(&mut scratch[..room]) {
                Ok(0) => return HttpProgress::Close,
                Ok(n) => {
                    budget -= n;
                    self.inbuf.extend_from_slice(&scratch[..n]);
                    if let Phase::ExpectHead { started, .. } = &mut self.phase {
                        started.get_or_insert(now);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HttpProgress::NeedRead,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return HttpProgress::Close,
            }
        }
    }

    /// While a request is parked, a readable socket means the client went
    /// away (or pipelined more): EOF closes, bytes wait in the buffer (at
    /// most a head's worth; past it reading stops, and the socket's own
    /// buffer holds the rest until the response is written: a pipelining
    /// client waiting for a heavy render is not closed).
    fn peek_closed(&mut self, scratch: &mut [u8]) -> HttpProgress {
        loop {
            let room = self.limits.max_head.saturating_sub(self.inbuf.len());
            if room == 0 {
                return HttpProgress::NeedRead;
            }
            let room = room.min(scratch.len());
            match self.stream.read(&mut scratch[..room]) {
                Ok(0) => return HttpProgress::Close,
                Ok(n) => self.inbuf.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HttpProgress::NeedRead,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return HttpProgress::Close,
            }
        }
    }

    /// `Ok(Some)`: a request is complete; `Ok(None)`: need more bytes;
    /// `Err`: refuse it with this status and reason.
    fn parse_buffered(
        &mut self,
        now: Instant,
    ) -> Result<Option<HttpProgress>, (u16, &'static str)> {
        if let Phase::ExpectHead { .. } = self.phase {
            match parse_request_head(&self.inbuf, self.limits.max_head) {
                Parse::Partial => return Ok(None),
                Parse::Invalid(why) => return Err((400, why)),
                Parse::Done(head, used) => {
                    self.inbuf.drain(..used);
                    let max_body = if head.method == Method::Put {
                        self.limits.max_put_body
                    } else {
                        SMALL_BODY
                    };
                    self.enter(Phase::ExpectBody {
                        decoder: BodyDecoder::new(head.framing, max_body),
                        head,
                        body: Vec::new(),
                        since: now,
                    });
                }
            }
        }
        let Phase::ExpectBody {
            head,
            decoder,
            body,
            ..
        } = &mut self.phase
        else {
            return Ok(None);
        };
        let used = decoder.feed(&self.inbuf, body).map_err(|e| match e {
            BodyError::TooLarge => (413, "request body not accepted here, or too large"),
            _ => (400, "bad request body framing"),
        })?;
        self.inbuf.drain(..used);
        if !decoder.is_done() {
            return Ok(None);
        }
        let keep_alive = head.keep_alive;
        match self.enter(Phase::Handling { keep_alive }) {
            Phase::ExpectBody { head, body, .. } => Ok(Some(HttpProgress::Request(head, body))),
            _ => Ok(None),
        }
    }

    fn refuse(&mut self, (status, why): (u16, &'static str), now: Instant) -> HttpProgress {
        self.enter(Phase::Handling { keep_alive: false });
        let resp = Response {
            status,
            headers: vec![("Content-Type", "text/plain".into())],
            body: format!("{why}\n").into_bytes(),
        };
        self.respond(&resp, false, None, now)
    }

    /// Sends `reply` (see [`Reply`]).
    pub fn reply(&mut self, reply: Reply, now: Instant) -> HttpProgress {
        match reply {
            Reply::Full {
                resp,
                head_only,
                chunk_over,
            } => self.respond(&resp, head_only, chunk_over, now),
            Reply::Shared {
                resp,
                body,
                head_only,
            } => self.respond_shared(&resp, body, head_only, now),
        }
    }

    /// Sends the response to the request handed out last.
    pub fn respond(
        &mut self,
        resp: &Response,
        head_only: bool,
        chunk_over: Option<usize>,
        now: Instant,
    ) -> HttpProgress {
        self.send(None, now, |out, keep_alive| {
            render_response(out, resp, keep_alive, chunk_over, head_only);
        })
    }

    /// Sends a response whose body is shared (`resp.body` is ignored): the
    /// connection holds a reference until it is written.
    pub fn respond_shared(
        &mut self,
        resp: &Response,
        body: Body,
        head_only: bool,
        now: Instant,
    ) -> HttpProgress {
        let len = body.len();
        self.send((!head_only).then_some(body), now, |out, keep_alive| {
            render_head(out, resp, len, keep_alive);
        })
    }

    /// Writes what `head` renders (given keep-alive), then `shared`.
    fn send(
        &mut self,
        shared: Option<Body>,
        now: Instant,
        head: impl FnOnce(&mut Vec<u8>, bool),
    ) -> HttpProgress {
        let keep_alive = match self.phase {
            Phase::Handling { keep_alive } => keep_alive,
            _ => false,
        };
        self.out.clear();
        head(&mut self.out, keep_alive);
        self.shared = shared;
        self.enter(Phase::Writing {
            written: 0,
            keep_alive,
            since: now,
        });
        self.on_writable(now)
    }

    /// The one place the phase changes, traced (`GITLAB_LOG_LEVEL=trace`);
    /// the phase left is returned.
    fn enter(&mut self, next: Phase) -> Phase {
        log::trace!(from = self.phase.name(), to = next.name(); "http connection phase");
        std::mem::replace(&mut self.phase, next)
    }

    pub fn on_writable(&mut self, now: Instant) -> HttpProgress {
        let Phase::Writing {
            written,
            keep_alive,
            ..
        } = &mut self.phase
        else {
            return HttpProgress::NeedRead;
        };
        let total = self.out.len() + self.shared.as_ref().map_or(0, |b| b.len());
        let mut budget = WRITE_BUDGET;
        while *written < total {
            if budget == 0 {
                return HttpProgress::Yield;
            }
            let rest = match written.checked_sub(self.out.len()) {
                None => &self.out[*written..],
                Some(at) => &self.shared.as_deref().map_or(&[][..], |b| &b[..])[at..],
            };
            match self.stream.write(&rest[..rest.len().min(budget)]) {
                Ok(0) => return HttpProgress::Close,
                Ok(n) => {
                    *written += n;
                    budget -= n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HttpProgress::NeedWrite,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return HttpProgress::Close,
            }
        }
        self.shared = None;
        self.served += 1;
        if !*keep_alive {
            return HttpProgress::Close;
        }
        // A pipelined request may already be buffered: its head started now.
        self.enter(Phase::ExpectHead {
            since: now,
            started: (!self.inbuf.is_empty()).then_some(now),
        });
        // An idle connection keeps no large buffers.
        if self.out.capacity() > 64 * 1024 {
            self.out = Vec::new();
        }
        if self.inbuf.is_empty() && self.inbuf.capacity() > 4096 {
            self.inbuf = Vec::new();
        }
        HttpProgress::Written
    }
}

/// `HEAD` is answered like `GET` without a body.
pub fn is_head(head: &RequestHead) -> bool {
    head.method == Method::Head
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::memstream::{Act, MemStream};

    const LIMITS: Limits = Limits {
        max_head: 1024,
        max_put_body: 4096,
    };

    /// A connection whose peer sends these acts, opened at `t0`.
    fn conn(acts: Vec<Act>, t0: Instant) -> (HttpConn<MemStream>, MemStream) {
        let peer = MemStream::default();
        peer.0.borrow_mut().script.extend(acts);
        (HttpConn::new(peer.clone(), LIMITS, t0), peer)
    }

    fn data(b: &[u8]) -> Act {
        Act::Data(b.to_vec())
    }

    fn ok() -> Response {
        Response {
            status: 200,
            headers: vec![],
            body: b"ok".to_vec(),
        }
    }

    fn written(peer: &MemStream) -> String {
        String::from_utf8_lossy(&peer.0.borrow().written).into_owned()
    }

    #[test]
    fn a_pipelined_flood_is_handed_out_one_request_per_call() {
        let t0 = Instant::now();
        let flood = b"GET /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
        let (mut c, peer) = conn(vec![data(&flood)], t0);
        let mut scratch = vec![0; 16 * 1024];
        let mut served = 0;
        let mut progress = c.on_readable(t0, &mut scratch);
        loop {
            match progress {
                HttpProgress::Request(head, _) => {
                    assert_eq!(head.path, "/-/liveness");
                    match c.respond(&ok(), false, None, t0) {
                        HttpProgress::Written => served += 1,
                        other => panic!("{other:?}"),
                    }
                    // The loop decides when to come back for the next one.
                    progress = c.on_readable(t0, &mut scratch);
                }
                HttpProgress::Yield => progress = c.on_readable(t0, &mut scratch),
                HttpProgress::NeedRead => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(served, 1000);
        assert_eq!(written(&peer).matches("HTTP/1.1 200").count(), 1000);
        // Nothing large stays allocated on the idle connection.
        assert!(c.inbuf.capacity() <= 4096, "{}", c.inbuf.capacity());
    }

    #[test]
    fn a_shared_body_is_written_a_budget_per_call() {
        let t0 = Instant::now();
        let (mut c, peer) = conn(vec![data(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")], t0);
        let mut scratch = [0u8; 4096];
        assert!(matches!(
            c.on_readable(t0, &mut scratch),
            HttpProgress::Request(..)
        ));
        let body: Body = std::sync::Arc::new(vec![b'x'; 3 * WRITE_BUDGET]);
        let mut p = c.respond_shared(&ok(), body, false, t0);
        let mut calls = 1;
        while matches!(p, HttpProgress::Yield) {
            assert!(written(&peer).len() <= calls * WRITE_BUDGET + 1024);
            p = c.on_readable(t0, &mut scratch);
            calls += 1;
        }
        assert!(calls >= 4, "{calls} calls");
        assert!(written(&peer).ends_with(&"x".repeat(100)));
    }

    #[test]
    fn one_call_reads_at_most_the_budget() {
        let t0 = Instant::now();
        let len = READ_BUDGET * 3;
        let mut put =
            format!("PUT /v1/kv/k HTTP/1.1\r\nContent-Length: {len}\r\n\r\n").into_bytes();
        put.extend(vec![b'x'; len]);
        let peer = MemStream::default();
        peer.0.borrow_mut().script.push_back(data(&put));
        let limits = Limits {
            max_head: 1024,
            max_put_body: len,
        };
        let mut c = HttpConn::new(peer.clone(), limits, t0);
        let mut scratch = vec![0; 16 * 1024];
        let left = |peer: &MemStream| match peer.0.borrow().script.front() {
            Some(Act::Data(d)) => d.len(),
            _ => 0,
        };
        let mut calls = 0;
        let body = loop {
            let before = left(&peer);
            match c.on_readable(t0, &mut scratch) {
                HttpProgress::Yield => assert!(before - left(&peer) <= READ_BUDGET),
                HttpProgress::Request(_, body) => break body,
                other => panic!("{other:?}"),
            }
            calls += 1;
        };
        assert_eq!(body.len(), len);
        assert!(calls >= 3, "{calls} calls");
        // A head that never ends is refused at its bound, not read on.
        let (mut c, peer) = conn(vec![data(&vec![b'G'; READ_BUDGET * 3])], t0);
        assert!(matches!(
            c.on_readable(t0, &mut scratch),
            HttpProgress::Close
        ));
        assert!(written(&peer).starts_with("HTTP/1.1 400"));
        assert!(left(&peer) >= READ_BUDGET * 3 - LIMITS.max_head - scratch.len());
    }

    #[test]
    fn a_body_on_a_get_is_refused_at_the_head_with_413() {
        let t0 = Instant::now();
        let req = b"POST /-/liveness HTTP/1.1\r\nContent-Length: 1048576\r\n\r\nxxxx";
        let (mut c, peer) = conn(vec![data(req)], t0);
        let mut scratch = vec![0; 1024];
        assert!(matches!(
            c.on_readable(t0, &mut scratch),
            HttpProgress::Close
        ));
        assert!(
            written(&peer).starts_with("HTTP/1.1 413"),
            "{}",
            written(&peer)
        );
        // A PUT body within the bound is fine; past it, 413 too.
        for (len, want) in [(4096, None), (4097, Some("HTTP/1.1 413"))] {
            let mut req =
                format!("PUT /v1/kv/k HTTP/1.1\r\nContent-Length: {len}\r\n\r\n").into_bytes();
            req.extend(vec![b'v'; len]);
            let (mut c, peer) = conn(vec![data(&req)], t0);
            match (c.on_readable(t0, &mut scratch), want) {
                (HttpProgress::Request(_, body), None) => assert_eq!(body.len(), len),
                (HttpProgress::Close, Some(status)) => {
                    assert!(written(&peer).starts_with(status))
                }
                (other, _) => panic!("{len}: {other:?}"),
            }
        }
    }

    #[test]
    fn deadlines_follow_the_phase() {
        let t0 = Instant::now();
        let (mut c, peer) = conn(vec![], t0);
        let mut scratch = vec![0; 1024];
        assert_eq!(c.deadline(), Some(t0 + IDLE_TIMEOUT));
        // One byte of a head: the head deadline, counted from that byte.
        let t1 = t0 + Duration::from_secs(7);
        peer.0.borrow_mut().script.push_back(data(b"G"));
        assert!(matches!(
            c.on_readable(t1, &mut scratch),
            HttpProgress::NeedRead
        ));
        assert_eq!(c.deadline(), Some(t1 + HEAD_TIMEOUT));
        // More bytes do not move it.
        let t2 = t1 + Duration::from_secs(2);
        peer.0
            .borrow_mut()
            .script
            .push_back(data(b"ET / HTTP/1.1\r\n"));
        assert!(matches!(
            c.on_readable(t2, &mut scratch),
            HttpProgress::NeedRead
        ));
        assert_eq!(c.deadline(), Some(t1 + HEAD_TIMEOUT));
        assert_eq!(c.eviction_key(), Some((false, t0)));
        peer.0.borrow_mut().script.push_back(data(b"\r\n"));
        assert!(matches!(
            c.on_readable(t2, &mut scratch),
            HttpProgress::Request(..)
        ));
        assert_eq!(c.deadline(), None, "handling: the loop owns the time");
        assert_eq!(c.eviction_key(), None);
        let t3 = t2 + Duration::from_secs(1);
        assert!(matches!(
            c.respond(&ok(), false, None, t3),
            HttpProgress::Written
        ));
        assert_eq!(c.deadline(), Some(t3 + IDLE_TIMEOUT));
        assert_eq!(c.eviction_key(), Some((true, t0)));
    }
}
