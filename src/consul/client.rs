//! The consul connection inside the loop: one persistent nonblocking
//! HTTP/1.1 connection (TCP or unix socket) running the [`Watch`].
//!
//! In: readiness events on its token and the time. Out: [`Update`]s for the
//! loop to apply, and its next deadline. Always holds: the loop never blocks
//! on consul; every phase that waits on consul has a deadline; the body is
//! bounded and decoded incrementally; bytes are parsed only by
//! [`crate::http`].
//!
//! | phase | waits for | on event | next |
//! |---|---|---|---|
//! | `Idle` | `start_at` (rate limit or backoff) | time | `Connecting` (no connection) or `Sending` |
//! | `Connecting` | writable | connected | `Sending`; error: backoff |
//! | `Sending` | writable | request written | `ReadingHead` |
//! | `ReadingHead` | readable, response deadline | head parsed | `ReadingBody`; error: backoff |
//! | `ReadingBody` | readable, response deadline | body done | `Idle` (keep-alive) or closed |

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use mio::{Interest, Registry, Token};

use crate::config::{ConsulConfig, ConsulEndpoint};
use crate::consul::watch::{Decoding, ErrorReason, Failure, Response, Update, Watch, DECODE_SLICE};
use crate::http::{parse_response_head, BodyDecoder, BodyError, Parse, ResponseHead};

/// Connecting must succeed within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Headroom on top of the longest hold consul may apply (wait × 17/16).
const RESPONSE_SLACK: Duration = Duration::from_secs(5);
const MAX_HEAD_BYTES: usize = 64 * 1024;
const READ_CHUNK: usize = 64 * 1024;
/// Read at most this much of a response per loop turn (a 13 MB listing read
/// in one go holds every answer for milliseconds).
const READ_BUDGET: usize = 1024 * 1024;

/// The socket to consul.
enum Stream {
    Tcp(mio::net::TcpStream),
    Unix(mio::net::UnixStream),
}

impl Stream {
    fn connect(endpoint: &ConsulEndpoint) -> io::Result<Stream> {
        match endpoint {
            ConsulEndpoint::Tcp(addr) => {
                let s = mio::net::TcpStream::connect(*addr)?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            ConsulEndpoint::Unix(path) => Ok(Stream::Unix(mio::net::UnixStream::connect(path)?)),
        }
    }

    /// Finishes a nonblocking connect per mio's docs: `take_error`, then
    /// `peer_addr` (NotConnected means "not yet").
    fn connected(&self) -> io::Result<bool> {
        let (err, peer) = match self {
            Stream::Tcp(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
            Stream::Unix(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
        };
        if let Some(e) = err {
            return Err(e);
        }
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the connection waits for.
enum Phase {
    /// No request in flight; the next starts at the watch's `next_start`.
    Idle,
    ExpectConnected {
        since: Instant,
    },
    Sending {
        written: usize,
        deadline: Instant,
    },
    ExpectHead {
        deadline: Instant,
    },
    ExpectBody {
        head: ResponseHead,
        decoder: BodyDecoder,
        deadline: Instant,
    },
    /// A large listing being decoded a slice per loop turn (no request in
    /// flight meanwhile).
    Decoding(Box<Decoding>),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::ExpectConnected { .. } => "connecting",
            Phase::Sending { .. } => "sending",
            Phase::ExpectHead { .. } => "awaiting_head",
            Phase::ExpectBody { .. } => "reading_body",
            Phase::Decoding(_) => "decoding",
        }
    }
}

/// The consul client: config, watch logic, and at most one connection.
pub struct Client {
    config: ConsulConfig,
    token: Token,
    watch: Watch,
    stream: Option<Stream>,
    /// The current connection has carried a complete response before (a
    /// failure before any byte on such a connection is retried at once on a
    /// fresh one: consul, or a proxy, closed it while idle).
    reused: bool,
    phase: Phase,
    request: Vec<u8>,
    inbuf: Vec<u8>,
    body: Vec<u8>,
    /// Bytes received for the request in flight.
    received: usize,
    /// The read budget ran out with bytes possibly still in the socket.
    more_to_read: bool,
    requests: u64,
}

impl Client {
    pub fn new(config: ConsulConfig, prefix: &str, token: Token, seed: u64) -> Client {
        Client {
            watch: Watch::new(prefix, seed),
            config,
            token,
            stream: None,
            reused: false,
            phase: Phase::Idle,
            request: Vec::new(),
            inbuf: Vec::new(),
            body: Vec::new(),
            received: 0,
            more_to_read: false,
            requests: 0,
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

    /// When the loop must call [`Client::on_timer`] next.
    pub fn deadline(&self, now: Instant) -> Instant {
        if self.more_to_read {
            return now;
        }
        match &self.phase {
            Phase::Idle => self.watch.next_start(now),
            Phase::Decoding(_) => now,
            _ => self.request_deadline().unwrap_or(now),
        }
    }

    /// While idle: when the next request may start (rate limit, backoff).
    pub fn next_request_at(&self, now: Instant) -> Option<Instant> {
        matches!(self.phase, Phase::Idle).then(|| self.watch.next_start(now))
    }

    /// While a request is in flight: when the client gives up on it.
    pub fn request_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Idle | Phase::Decoding(_) => None,
            Phase::ExpectConnected { since } => Some(*since + CONNECT_TIMEOUT),
            Phase::Sending { deadline, .. }
            | Phase::ExpectHead { deadline }
            | Phase::ExpectBody { deadline, .. } => Some(*deadline),
        }
    }

    fn response_deadline(&self, now: Instant) -> Instant {
        let wait = self.config.wait;
        now + wait * 17 / 16 + RESPONSE_SLACK
    }

    /// Time passed: start a request or give up on one.
    pub fn on_timer(&mut self, registry: &Registry, now: Instant, out: &mut Vec<Update>) {
        if std::mem::take(&mut self.more_to_read) {
            return self.drive(registry, now, out);
        }
        if now < self.deadline(now) {
            return;
        }
        match &mut self.phase {
            Phase::Idle => self.start(registry, now, out),
            Phase::Decoding(decoding) => {
                if let Some(result) = decoding.step(DECODE_SLICE) {
                    self.phase = Phase::Idle;
                    out.push(self.watch.on_decoded(now, result));
                }
            }
            Phase::ExpectConnected { .. } => self.fail(
                registry,
                now,
                Failure::new(ErrorReason::Connect, "connect timed out"),
                out,
            ),
            _ => {
                let waited = self.config.wait * 17 / 16 + RESPONSE_SLACK;
                let detail = format!("no complete response within {waited:?}");
                self.fail(
                    registry,
                    now,
                    Failure::new(ErrorReason::Timeout, detail),
                    out,
                )
            }
        }
    }

    fn start(&mut self, registry: &Registry, now: Instant, out: &mut Vec<Update>) {
        self.watch.on_start(now);
        self.requests += 1;
        self.build_request();
        self.received = 0;
        if self.stream.is_some() {
            self.phase = Phase::Sending {
                written: 0,
                deadline: self.response_deadline(now),
            };
            return self.drive(registry, now, out);
        }
        let connected = Stream::connect(&self.config.endpoint).and_then(|mut s| {
            let interest = Interest::READABLE | Interest::WRITABLE;
            registry.register(s.source(), self.token, interest)?;
            Ok(s)
        });
        match connected {
            Ok(s) => {
                self.stream = Some(s);
                self.reused = false;
                self.phase = Phase::ExpectConnected { since: now };
            }
            Err(e) => {
                let failure = Failure::new(ErrorReason::Connect, e.to_string());
                self.fail(registry, now, failure, out);
            }
        }
    }

    fn build_request(&mut self) {
        let c = &self.config;
        let target = self.watch.target(
            &c.path_prefix,
            c.wait,
            c.namespace.as_deref(),
            c.partition.as_deref(),
        );
        let mut r = format!(
            "GET {target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: gitlab-haproxy-agent/{}\r\n",
            c.host_header,
            crate::config::version()
        );
        if let Some(t) = &c.token {
            r.push_str("X-Consul-Token: ");
            r.push_str(t);
            r.push_str("\r\n");
        }
        if let Some(a) = &c.basic_auth {
            r.push_str("Authorization: Basic ");
            r.push_str(a);
            r.push_str("\r\n");
        }
        r.push_str("\r\n");
        self.request = r.into_bytes();
    }

    /// A readiness event on the client's token.
    pub fn on_event(&mut self, registry: &Registry, now: Instant, out: &mut Vec<Update>) {
        if self.stream.is_none() {
            return;
        }
        self.drive(registry, now, out);
    }

    /// Moves the machine as far as the socket allows.
    fn drive(&mut self, registry: &Registry, now: Instant, out: &mut Vec<Update>) {
        loop {
            let step = match self.phase {
                Phase::Idle | Phase::Decoding(_) => return self.check_idle(registry),
                Phase::ExpectConnected { .. } => self.step_connect(now),
                Phase::Sending { .. } => self.step_send(),
                Phase::ExpectHead { .. } | Phase::ExpectBody { .. } => self.step_read(now),
            };
            match step {
                Step::Again => continue,
                Step::Blocked => return,
                Step::Done(update) => {
                    out.push(update);
                    return;
                }
                Step::Fail(f) => return self.fail(registry, now, f, out),
            }
        }
    }

    /// Bytes or EOF on an idle keep-alive connection: consul (or something
    /// between) closed it. Drop it quietly; the next request reconnects.
    fn check_idle(&mut self, registry: &Registry) {
        let Some(s) = self.stream.as_mut() else {
            return;
        };
        let mut probe = [0u8; 512];
        loop {
            match s.read(&mut probe) {
                Ok(_) => return self.close(registry),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return self.close(registry),
            }
        }
    }

    fn step_connect(&mut self, now: Instant) -> Step {
        let s = self.stream.as_ref().expect("connecting without a stream");
        match s.connected() {
            Ok(true) => {
                self.phase = Phase::Sending {
                    written: 0,
                    deadline: self.response_deadline(now),
                };
                Step::Again
            }
            Ok(false) => Step::Blocked,
            Err(e) => Step::Fail(Failure::new(ErrorReason::Connect, e.to_string())),
        }
    }

    fn step_send(&mut self) -> Step {
        let Phase::Sending { written, deadline } = &mut self.phase else {
            unreachable!()
        };
        let s = self.stream.as_mut().expect("sending without a stream");
        while *written < self.request.len() {
            match s.write(&self.request[*written..]) {
                Ok(0) => {
                    return Step::Fail(Failure::new(
                        ErrorReason::Reset,
                        "connection closed while sending",
                    ))
                }
                Ok(n) => *written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Blocked,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Step::Fail(io_failure(&e)),
            }
        }
        let deadline = *deadline;
        self.inbuf.clear();
        self.phase = Phase::ExpectHead { deadline };
        Step::Again
    }

    fn step_read(&mut self, now: Instant) -> Step {
        // Parse what is buffered first (pipelined leftovers), then read.
        let mut budget = READ_BUDGET;
        loop {
            match self.advance_parse(now) {
                Step::Blocked => {}
                other => return other,
            }
            if budget == 0 {
                // A big body: let the loop answer checks, then come back
                // (edge-triggered: no new event would tell us to).
                self.more_to_read = true;
                return Step::Blocked;
            }
            let s = self.stream.as_mut().expect("reading without a stream");
            let len = self.inbuf.len();
            self.inbuf.resize(len + READ_CHUNK, 0);
            let r = s.read(&mut self.inbuf[len..]);
            match r {
                Ok(0) => {
                    self.inbuf.truncate(len);
                    return self.on_eof(now);
                }
                Ok(n) => {
                    self.inbuf.truncate(len + n);
                    self.received += n;
                    budget = budget.saturating_sub(n);
                }
                Err(e) => {
                    self.inbuf.truncate(len);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Step::Blocked,
                        io::ErrorKind::Interrupted => {}
                        _ => return Step::Fail(io_failure(&e)),
                    }
                }
            }
        }
    }

    /// Parses buffered bytes; `Blocked` means "need more".
    fn advance_parse(&mut self, now: Instant) -> Step {
        if let Phase::ExpectHead { deadline } = self.phase {
            match parse_response_head(&self.inbuf, MAX_HEAD_BYTES) {
                Parse::Partial => return Step::Blocked,
                Parse::Invalid(why) => {
                    return Step::Fail(Failure::new(
                        ErrorReason::BadBody,
                        format!("bad response head: {why}"),
                    ))
                }
                Parse::Done(head, used) => {
                    self.inbuf.drain(..used);
                    self.body.clear();
                    let decoder = BodyDecoder::new(head.framing, self.config.max_body_bytes);
                    self.phase = Phase::ExpectBody {
                        head,
                        decoder,
                        deadline,
                    };
                }
            }
        }
        let Phase::ExpectBody { decoder, .. } = &mut self.phase else {
            unreachable!()
        };
        match decoder.feed(&self.inbuf, &mut self.body) {
            Ok(used) => {
                self.inbuf.drain(..used);
            }
            Err(e) => return Step::Fail(body_failure(e, self.config.max_body_bytes)),
        }
        if decoder.is_done() {
            return self.complete(now);
        }
        Step::Blocked
    }

    fn on_eof(&mut self, now: Instant) -> Step {
        if let Phase::ExpectBody { decoder, .. } = &mut self.phase {
            match decoder.eof() {
                Ok(()) => return self.complete(now),
                Err(e) => return Step::Fail(body_failure(e, self.config.max_body_bytes)),
            }
        }
        Step::Fail(Failure::new(
            ErrorReason::Reset,
            "consul closed the connection before a response",
        ))
    }

    fn complete(&mut self, now: Instant) -> Step {
        let Phase::ExpectBody { head, .. } = std::mem::replace(&mut self.phase, Phase::Idle) else {
            unreachable!()
        };
        let keep = head.keep_alive && self.inbuf.is_empty();
        if !keep {
            // Close-delimited, `Connection: close`, or stray bytes: start
            // the next request on a fresh connection.
            self.stream = None;
        }
        self.reused = keep;
        let body = std::mem::take(&mut self.body);
        let index = head.header("x-consul-index");
        let response = self.watch.on_response(now, head.status, index, body);
        self.shrink_buffers();
        match response {
            Response::Done(update) => Step::Done(update),
            Response::Decode(decoding) => {
                self.phase = Phase::Decoding(Box::new(decoding));
                Step::Blocked
            }
        }
    }

    fn shrink_buffers(&mut self) {
        // A 64 MiB body must not stay allocated until the next one.
        const KEEP: usize = 1 << 20;
        if self.body.capacity() > KEEP {
            self.body = Vec::new();
        } else {
            self.body.clear();
        }
        if self.inbuf.capacity() > KEEP {
            self.inbuf = Vec::new();
        }
    }

    fn close(&mut self, registry: &Registry) {
        if let Some(mut s) = self.stream.take() {
            let _ = registry.deregister(s.source());
        }
        self.reused = false;
    }

    fn fail(&mut self, registry: &Registry, now: Instant, failure: Failure, out: &mut Vec<Update>) {
        let retry_fresh = self.reused
            && self.received == 0
            && matches!(failure.reason, ErrorReason::Reset)
            && matches!(self.phase, Phase::Sending { .. } | Phase::ExpectHead { .. });
        self.close(registry);
        self.phase = Phase::Idle;
        self.shrink_buffers();
        self.inbuf.clear();
        if retry_fresh {
            // The idle connection had been closed under us: one immediate
            // retry on a new connection, not an error.
            return self.start(registry, now, out);
        }
        out.push(self.watch.on_failure(now, failure));
    }
}

enum Step {
    Again,
    Blocked,
    Done(Update),
    Fail(Failure),
}

fn io_failure(e: &io::Error) -> Failure {
    let reason = match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => ErrorReason::Reset,
        io::ErrorKind::TimedOut => ErrorReason::Timeout,
        io::ErrorKind::ConnectionRefused => ErrorReason::Connect,
        _ => ErrorReason::Reset,
    };
    Failure::new(reason, e.to_string())
}

fn body_failure(e: BodyError, max: usize) -> Failure {
    match e {
        BodyError::TooLarge => Failure::new(
            ErrorReason::TooLarge,
            format!("response body over -consul-max-body-bytes ({max})"),
        ),
        BodyError::BadChunk => Failure::new(ErrorReason::BadBody, "bad chunked framing"),
        BodyError::Truncated => Failure::new(
            ErrorReason::BadBody,
            "connection closed mid-body (truncated body)",
        ),
    }
}
