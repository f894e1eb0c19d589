//! The operator commands' consul requests (`set`, `unset`, `ramp`): one
//! request at a time, driven to completion by a small blocking driver over
//! the watch's own transport steps ([`crate::consul::transport`]: connect,
//! TLS, request bytes, framing, gzip), not a second HTTP stack.
//!
//! In: the daemon's consul settings, a method, a target and a body. Out:
//! the response's status, head and decoded body, or the [`Failure`] the
//! watch would report.
//!
//! Always holds:
//! - every stage has the watch's deadline (connect, handshake) and the
//!   whole exchange [`EXCHANGE_TIMEOUT`];
//! - a signal that interrupts the wait does not interrupt the request (a
//!   `ramp` stops after the write in flight, never in the middle of it).

use std::io;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use crate::config::ConsulConfig;
use crate::consul::error::{ErrorReason, Failure};
use crate::consul::stream::Connect;
use crate::consul::transport::{
    connect_step, handshake_step, receive_step, send_step, Conn, Received, RequestSpec, Rx,
    SocketConnector, Stream, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT,
};
use crate::http::ResponseHead;

/// A whole exchange, connect to last byte.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// A complete response.
pub struct Reply {
    pub head: ResponseHead,
    pub body: Vec<u8>,
}

/// Requests to consul, one at a time, each on a new connection.
pub struct Exchange {
    connector: SocketConnector,
    spec: RequestSpec,
    poll: Poll,
    events: Events,
}

impl Exchange {
    pub fn new(config: &ConsulConfig) -> io::Result<Exchange> {
        Ok(Exchange {
            connector: SocketConnector::new(config),
            spec: RequestSpec::new(config),
            poll: Poll::new()?,
            events: Events::with_capacity(4),
        })
    }

    /// How requests look (the path prefix, namespace and partition).
    pub fn spec(&self) -> &RequestSpec {
        &self.spec
    }

    /// Sends `method target` with `body` and reads the whole response.
    pub fn send(&mut self, method: &str, target: &str, body: &[u8]) -> Result<Reply, Failure> {
        let start = Instant::now();
        let mut stream = self
            .connector
            .connect()
            .map_err(|e| Failure::new(ErrorReason::Connect, e.to_string()))?;
        let source = stream.source();
        self.poll
            .registry()
            .register(source, Token(0), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| {
                Failure::new(ErrorReason::Connect, format!("cannot poll the socket: {e}"))
            })?;
        let conn = Conn {
            stream,
            id: 0,
            reused: false,
        };
        let request = self.spec.request(method, target, body);
        // The stream is closed (and so leaves the poll) when dropped.
        self.drive(conn, &request, start)
    }

    fn drive(
        &mut self,
        mut conn: Conn<Stream>,
        request: &[u8],
        start: Instant,
    ) -> Result<Reply, Failure> {
        let whole = start + EXCHANGE_TIMEOUT;
        let connected_by = start + CONNECT_TIMEOUT;
        while !connect_step(&mut conn)? {
            self.wait(connected_by, || {
                Failure::new(ErrorReason::Connect, "connect timed out")
            })?;
        }
        let handshake_by = Instant::now() + HANDSHAKE_TIMEOUT;
        while !handshake_step(&mut conn)? {
            self.wait(handshake_by, || {
                Failure::new(
                    ErrorReason::Tls,
                    format!("TLS: handshake not done within {HANDSHAKE_TIMEOUT:?} of the connect"),
                )
            })?;
        }
        let timeout = || {
            Failure::new(
                ErrorReason::Timeout,
                format!("no complete response within {EXCHANGE_TIMEOUT:?}"),
            )
        };
        let mut written = 0;
        while !send_step(&mut conn, request, &mut written)? {
            self.wait(whole, timeout)?;
        }
        let mut rx = Rx::new(conn, whole);
        let mut body = None;
        loop {
            match receive_step(&mut rx, body.take(), self.spec.max_body_bytes) {
                Received::Complete(b) => {
                    return Ok(Reply {
                        head: b.head,
                        body: b.bytes,
                    })
                }
                Received::Wait(b) => {
                    body = b;
                    // A spent read budget reads on at once.
                    if !rx.more {
                        self.wait(whole, timeout)?;
                    }
                }
                Received::Dropped(f) | Received::Failed(f) => return Err(f),
            }
        }
    }

    /// Waits for the socket's next readiness, or fails at `deadline`.
    fn wait(&mut self, deadline: Instant, late: impl Fn() -> Failure) -> Result<(), Failure> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(late());
            }
            match self.poll.poll(&mut self.events, Some(left)) {
                Ok(()) if self.events.is_empty() => {}
                Ok(()) => return Ok(()),
                // A signal (SIGINT during a ramp's write): finish the write.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::new(ErrorReason::Connect, format!("poll: {e}"))),
            }
        }
    }
}
