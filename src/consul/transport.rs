//! The transport steps to consul, shared by the loop's watch
//! ([`crate::consul::client`]) and the operator commands' blocking driver
//! ([`crate::consul::exchange`]): open a nonblocking connection (TCP or unix
//! socket, under TLS when configured), finish the connect, the handshake,
//! write a request, read and decode one response.
//!
//! In: a connection ([`Conn`]) and what its socket allows now. Out: how far
//! each step got (done, wait for the socket, or a [`Failure`]). Always
//! holds: no step blocks; a step reads at most [`READ_BUDGET`] bytes per
//! call; a body is bounded (decoded and on the wire) and decoded
//! incrementally; bytes are parsed only by [`crate::http`]. Deadlines are
//! the caller's: the steps know no time.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;

use crate::config::{ConsulConfig, ConsulEndpoint};
use crate::consul::error::{ErrorReason, Failure};
use crate::consul::stream::{Connect, Transport};
use crate::consul::tls::{TlsError, TlsStream};
use crate::http::{
    content_coding, parse_response_head, BodyDecoder, BodyError, Coding, InflateError, Inflater,
    Parse, ResponseHead,
};

/// Connecting must succeed within this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The TLS handshake must be done within this after the connect (consul's
/// own `https_handshake_timeout`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HEAD_BYTES: usize = 64 * 1024;
const READ_CHUNK: usize = 64 * 1024;
/// Read (and inflate) at most this much of a response per call (a 13 MB
/// listing read in one go holds every answer for milliseconds).
pub const READ_BUDGET: usize = 1024 * 1024;

/// A socket to consul.
pub enum Socket {
    Tcp(mio::net::TcpStream),
    Unix(mio::net::UnixStream),
}

impl Transport for Socket {
    /// Finishes a nonblocking connect per mio's docs: `take_error`, then
    /// `peer_addr` (NotConnected means "not yet").
    fn connected(&mut self) -> io::Result<bool> {
        let (err, peer) = match self {
            Socket::Tcp(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
            Socket::Unix(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
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
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The connection to consul: a socket, or TLS over it.
pub enum Stream {
    Plain(Socket),
    Tls(Box<TlsStream<Socket>>),
}

impl Stream {
    /// The socket, for the loop to register.
    pub fn source(&mut self) -> &mut dyn mio::event::Source {
        let socket = match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.socket(),
        };
        match socket {
            Socket::Tcp(s) => s,
            Socket::Unix(s) => s,
        }
    }

    fn transport(&mut self) -> &mut dyn Transport {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &mut **t,
        }
    }
}

impl Transport for Stream {
    fn connected(&mut self) -> io::Result<bool> {
        self.transport().connected()
    }

    fn handshake(&mut self) -> io::Result<bool> {
        self.transport().handshake()
    }

    fn wants_write(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(t) => t.wants_write(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.transport().read(buf)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.transport().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Connects sockets to the configured endpoint, under TLS when configured.
pub struct SocketConnector {
    endpoint: ConsulEndpoint,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

impl SocketConnector {
    pub fn new(config: &ConsulConfig) -> SocketConnector {
        SocketConnector {
            endpoint: config.endpoint.clone(),
            tls: config
                .tls
                .as_ref()
                .map(|t| (Arc::clone(&t.config.0), t.server_name.clone())),
        }
    }
}

impl Connect for SocketConnector {
    type Stream = Stream;

    fn connect(&mut self) -> io::Result<Stream> {
        let socket = match &self.endpoint {
            ConsulEndpoint::Tcp(addr) => {
                let s = mio::net::TcpStream::connect(*addr)?;
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
            ConsulEndpoint::Unix(path) => Socket::Unix(mio::net::UnixStream::connect(path)?),
        };
        Ok(match &self.tls {
            None => Stream::Plain(socket),
            Some((config, name)) => Stream::Tls(Box::new(TlsStream::new(
                socket,
                Arc::clone(config),
                name.clone(),
            )?)),
        })
    }
}

/// How requests look, from the configuration.
pub struct RequestSpec {
    pub host_header: String,
    pub path_prefix: String,
    token: Option<String>,
    basic_auth: Option<String>,
    pub namespace: Option<String>,
    pub partition: Option<String>,
    pub wait: Duration,
    pub max_body_bytes: usize,
    /// Send `Accept-Encoding: gzip`.
    gzip: bool,
}

impl RequestSpec {
    pub fn new(config: &ConsulConfig) -> RequestSpec {
        RequestSpec {
            host_header: config.host_header.clone(),
            path_prefix: config.path_prefix.clone(),
            token: config.token.clone(),
            basic_auth: config.basic_auth.clone(),
            namespace: config.namespace.clone(),
            partition: config.partition.clone(),
            wait: config.wait,
            max_body_bytes: config.max_body_bytes,
            gzip: config.asks_gzip(),
        }
    }

    /// The request's bytes: `method target`, the headers every request
    /// carries (host, user agent, token, basic auth, gzip), and `body`
    /// with its length when there is one.
    pub fn request(&self, method: &str, target: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "{method} {target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: gitlab-haproxy-agent/{}\r\n",
            self.host_header,
            crate::build_info::version()
        );
        if let Some(t) = &self.token {
            r.push_str("X-Consul-Token: ");
            r.push_str(t);
            r.push_str("\r\n");
        }
        if let Some(a) = &self.basic_auth {
            r.push_str("Authorization: Basic ");
            r.push_str(a);
            r.push_str("\r\n");
        }
        if self.gzip {
            r.push_str("Accept-Encoding: gzip\r\n");
        }
        if !body.is_empty() {
            r.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        r.push_str("\r\n");
        let mut bytes = r.into_bytes();
        bytes.extend_from_slice(body);
        bytes
    }
}

/// One connection and what it has carried.
pub struct Conn<S> {
    pub stream: S,
    /// Names the connection for the loop's registration bookkeeping.
    pub id: u64,
    /// It has carried a complete response before: a close before any byte
    /// of the next answer is consul (or a proxy) dropping an idle
    /// keep-alive connection, retried once at once.
    pub reused: bool,
}

/// A request in flight, reading its response.
pub struct Rx<S> {
    pub conn: Conn<S>,
    pub deadline: Instant,
    pub inbuf: Vec<u8>,
    /// Wire bytes received for this request.
    pub received: usize,
    /// The read budget ran out with bytes possibly still in the socket
    /// (edge-triggered: no new event would say so).
    pub more: bool,
}

impl<S: Read> Rx<S> {
    /// One read of at most `want` bytes onto the end of `inbuf`.
    fn read_some(&mut self, want: usize) -> io::Result<usize> {
        let len = self.inbuf.len();
        self.inbuf.resize(len + want, 0);
        let r = self.conn.stream.read(&mut self.inbuf[len..]);
        let got = *r.as_ref().unwrap_or(&0);
        self.inbuf.truncate(len + got);
        self.received += got;
        r
    }
}

/// A final response head and its body so far.
pub struct Body {
    pub head: ResponseHead,
    decoder: BodyDecoder,
    /// The body as decoded (inflated, for a gzip body).
    pub bytes: Vec<u8>,
    gzip: Option<Box<Gzip>>,
}

/// A gzip body on its way through the inflater.
struct Gzip {
    inflater: Inflater,
    /// Framed bytes not inflated yet (the step of a turn ran out).
    coded: Vec<u8>,
    /// A framing error (or a close mid-body) met after these bytes: it is
    /// reported once they are inflated, so that an error inside them comes
    /// first, as it came first on the wire, however the bytes were split.
    framing_error: Option<BodyError>,
}

/// How far a body got with what was buffered.
enum Absorbed {
    /// The whole body is in (and inflated).
    Complete,
    /// More bytes are needed from the socket.
    NeedInput,
    /// The turn's budget ran out with work left: come back next turn.
    Spent,
}

impl Body {
    /// The body of `head`, decoded as its framing and coding say.
    fn new(head: ResponseHead, max_body: usize) -> Result<Body, Failure> {
        let encodings = head
            .headers
            .iter()
            .filter(|(name, _)| name == "content-encoding")
            .map(|(_, v)| v.as_slice());
        let gzip = match content_coding(encodings) {
            Ok(Coding::Identity) => None,
            Ok(Coding::Gzip) => Some(Box::new(Gzip {
                inflater: Inflater::new(max_body),
                coded: Vec::new(),
                framing_error: None,
            })),
            Err(why) => return Err(Failure::new(ErrorReason::BadBody, why)),
        };
        // A gzip body is bounded once inflated (and on the wire), not as
        // framed: bytes that do not compress grow a little.
        let framed_bound = if gzip.is_some() { usize::MAX } else { max_body };
        Ok(Body {
            decoder: BodyDecoder::new(head.framing, framed_bound),
            head,
            bytes: Vec::new(),
            gzip,
        })
    }

    /// Takes the framed body bytes at the front of `inbuf` and inflates
    /// them (a gzip body), counting what was inflated against `budget`.
    fn absorb(
        &mut self,
        inbuf: &mut Vec<u8>,
        budget: &mut usize,
        max_body: usize,
    ) -> Result<Absorbed, Failure> {
        let Some(gz) = &mut self.gzip else {
            let used = self
                .decoder
                .feed(inbuf, &mut self.bytes)
                .map_err(|e| body_failure(e, max_body))?;
            inbuf.drain(..used);
            return Ok(match self.decoder.is_done() {
                true => Absorbed::Complete,
                false => Absorbed::NeedInput,
            });
        };
        if gz.framing_error.is_none() {
            match self.decoder.feed(inbuf, &mut gz.coded) {
                Ok(used) => drop(inbuf.drain(..used)),
                Err(e) => gz.framing_error = Some(e),
            }
        }
        let before = self.bytes.len();
        let used = gz
            .inflater
            .feed(&gz.coded, &mut self.bytes, *budget)
            .map_err(|e| inflate_failure(e, max_body))?;
        gz.coded.drain(..used);
        *budget -= self.bytes.len() - before;
        if *budget == 0 {
            return Ok(Absorbed::Spent);
        }
        if let Some(e) = gz.framing_error {
            return Err(body_failure(e, max_body));
        }
        if !self.decoder.is_done() {
            return Ok(Absorbed::NeedInput);
        }
        gz.inflater
            .finish()
            .map_err(|e| inflate_failure(e, max_body))?;
        Ok(Absorbed::Complete)
    }

    /// The peer closed: a close-delimited body is complete; anything else
    /// is truncated (for a gzip body, reported after what came before).
    fn eof(&mut self) -> Result<(), BodyError> {
        match (self.decoder.eof(), &mut self.gzip) {
            (Ok(()), _) => Ok(()),
            (Err(e), Some(gz)) => {
                gz.framing_error.get_or_insert(e);
                Ok(())
            }
            (Err(e), None) => Err(e),
        }
    }
}

impl<S> Rx<S> {
    /// A request written on `conn`: its response is due by `deadline`.
    pub fn new(conn: Conn<S>, deadline: Instant) -> Rx<S> {
        Rx {
            conn,
            deadline,
            inbuf: Vec::new(),
            received: 0,
            more: false,
        }
    }
}

/// Finishes a nonblocking connect: `Ok(true)` once connected.
pub fn connect_step<S: Transport>(conn: &mut Conn<S>) -> Result<bool, Failure> {
    conn.stream
        .connected()
        .map_err(|e| Failure::new(ErrorReason::Connect, e.to_string()))
}

/// Drives the transport's handshake (TLS): `Ok(true)` once done.
pub fn handshake_step<S: Transport>(conn: &mut Conn<S>) -> Result<bool, Failure> {
    conn.stream.handshake().map_err(|e| io_failure(&e))
}

/// Writes what is left of `request` after `written`: `Ok(true)` once all
/// of it is written, `Ok(false)` when the socket takes no more for now.
pub fn send_step<S: Transport>(
    conn: &mut Conn<S>,
    request: &[u8],
    written: &mut usize,
) -> Result<bool, Failure> {
    while *written < request.len() {
        match conn.stream.write(&request[*written..]) {
            Ok(0) => {
                return Err(Failure::new(
                    ErrorReason::Reset,
                    "connection closed while sending",
                ))
            }
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_failure(&e)),
        }
    }
    Ok(true)
}

/// How far [`receive_step`] got.
pub enum Received {
    /// The whole response is in.
    Complete(Body),
    /// Waits: for readable (`rx.more` false), or for the next turn, the
    /// read budget spent (`rx.more` true). The body so far, once the head
    /// is in.
    Wait(Option<Body>),
    /// The peer closed or reset the connection before the response head:
    /// the caller decides whether that was an idle close (retried).
    Dropped(Failure),
    /// Anything else that ends the request.
    Failed(Failure),
}

/// Reads, parses and inflates the response, at most [`READ_BUDGET`]
/// bytes read and inflated.
pub fn receive_step<S: Read>(rx: &mut Rx<S>, mut body: Option<Body>, max_body: usize) -> Received {
    // Chunk extensions, trailers or interim heads could otherwise
    // stretch the body bound to any amount of input.
    let max_wire = max_body.saturating_mul(2).saturating_add(MAX_HEAD_BYTES);
    let mut budget = READ_BUDGET;
    loop {
        // Parse what is buffered first, then read.
        if body.is_none() {
            match take_final_head(&mut rx.inbuf, max_body) {
                Ok(b) => body = b,
                Err(failure) => return Received::Failed(failure),
            }
        }
        if let Some(mut b) = body.take() {
            match b.absorb(&mut rx.inbuf, &mut budget, max_body) {
                Ok(Absorbed::Complete) => return Received::Complete(b),
                Ok(Absorbed::NeedInput) => body = Some(b),
                Ok(Absorbed::Spent) => {
                    rx.more = true;
                    return Received::Wait(Some(b));
                }
                Err(failure) => return Received::Failed(failure),
            }
        }
        if rx.received > max_wire {
            return Received::Failed(Failure::new(
                ErrorReason::TooLarge,
                format!("response over {max_wire} bytes on the wire (2 × -consul-max-body-bytes + 64 KiB)"),
            ));
        }
        if budget == 0 {
            rx.more = true;
            return Received::Wait(body);
        }
        match rx.read_some(READ_CHUNK.min(budget)) {
            Ok(0) => return on_eof(rx, body, budget, max_body),
            Ok(n) => budget -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                rx.more = false;
                return Received::Wait(body);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_reset(&e) => return Received::Dropped(io_failure(&e)),
            Err(e) => return Received::Failed(io_failure(&e)),
        }
    }
}

/// The peer closed; `budget` is what is left of the turn's.
fn on_eof<S>(rx: &mut Rx<S>, body: Option<Body>, mut budget: usize, max_body: usize) -> Received {
    let Some(mut b) = body else {
        return Received::Dropped(Failure::new(
            ErrorReason::Reset,
            "consul closed the connection before a response",
        ));
    };
    if let Err(e) = b.eof() {
        return Received::Failed(body_failure(e, max_body));
    }
    // A close-delimited body is complete now; a gzip one may still
    // have inflating left, a budget per turn (the socket is only read
    // again, for EOF, once it is all inflated).
    match b.absorb(&mut rx.inbuf, &mut budget, max_body) {
        Ok(Absorbed::Complete) => Received::Complete(b),
        Ok(_) => {
            rx.more = true;
            Received::Wait(Some(b))
        }
        Err(failure) => Received::Failed(failure),
    }
}

/// Takes the final response head off the front of `inbuf`, skipping
/// interim ones (100 Continue, 103 Early Hints: the real response follows):
/// `None` while it is incomplete.
pub fn take_final_head(inbuf: &mut Vec<u8>, max_body: usize) -> Result<Option<Body>, Failure> {
    // Interim heads are skipped by offset and drained once, so a storm of
    // them costs linear time.
    let mut skipped = 0;
    let mut parsed = parse_response_head(inbuf, MAX_HEAD_BYTES);
    while let Parse::Done(head, used) = &parsed {
        if head.status >= 200 {
            break;
        }
        skipped += used;
        parsed = parse_response_head(&inbuf[skipped..], MAX_HEAD_BYTES);
    }
    inbuf.drain(..skipped);
    match parsed {
        Parse::Partial => Ok(None),
        Parse::Invalid(why) => Err(Failure::new(
            ErrorReason::BadBody,
            format!("bad response head: {why}"),
        )),
        Parse::Done(head, used) => {
            inbuf.drain(..used);
            Body::new(head, max_body).map(Some)
        }
    }
}

pub fn is_reset(e: &io::Error) -> bool {
    io_failure(e).reason == ErrorReason::Reset
}

pub fn io_failure(e: &io::Error) -> Failure {
    if let Some(tls) = TlsError::of(e) {
        return Failure::new(ErrorReason::Tls, tls.to_string());
    }
    let reason = match e.kind() {
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
            format!("response over -consul-max-body-bytes ({max})"),
        ),
        BodyError::BadChunk => Failure::new(ErrorReason::BadBody, "bad chunked framing"),
        BodyError::Truncated => Failure::new(
            ErrorReason::BadBody,
            "connection closed mid-body (truncated body)",
        ),
    }
}

fn inflate_failure(e: InflateError, max: usize) -> Failure {
    match e {
        InflateError::TooLarge => Failure::new(
            ErrorReason::TooLarge,
            format!("gzip body inflates past -consul-max-body-bytes ({max})"),
        ),
        e => Failure::new(ErrorReason::BadBody, e.to_string()),
    }
}
