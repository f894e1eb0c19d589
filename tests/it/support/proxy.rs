//! A fault-injecting HTTP proxy between the agent and the KV: the
//! same consul faults against the dev KV or a real consul.
//!
//! In: a target address and a [`Mode`], switchable at any time. Out: a
//! loopback listener that forwards one request at a time per connection
//! (each on a fresh upstream connection) and applies the mode, plus counts
//! of connections and requests and the last request heads (for assertions
//! like "no hot loop" or "the token is a header"). Always holds: bytes are
//! parsed only by the project's own framing (`gitlab_haproxy_agent::http`);
//! every thread polls a stop flag, so dropping the [`Proxy`] stops it; at
//! most [`MAX_CONNECTIONS`] client connections are served at once.
//!
//! The request mode (refuse, reset, hold, immediate) is read when a request
//! arrives; the response mode when the upstream response is in, so a fault
//! set while a blocking query is held applies to its answer.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gitlab_haproxy_agent::http::{
    gzip, parse_request_head, parse_response_head, render_response, BodyDecoder, Framing, Method,
    Parse, RequestHead, Response, ResponseHead,
};

/// Client connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 64;
/// Request heads kept for [`Proxy::request_heads`].
const KEEP_HEADS: usize = 256;
/// How often blocked threads look at the stop flag and the mode.
const POLL: Duration = Duration::from_millis(20);
/// Longest an upstream response may take (a blocking query in the tests
/// waits `-consul-wait 1s`; a real one at most 10 m 37.5 s).
const UPSTREAM_LIMIT: Duration = Duration::from_secs(60);
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 256 << 20;

/// What the proxy does with the next request (or response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Forward byte for byte.
    Pass,
    /// Stop listening (connects are refused) and close every connection at
    /// its next request.
    Refuse,
    /// Read the request, then reset the connection (RST: `SO_LINGER` 0).
    Reset,
    /// Read the request and answer nothing until the mode changes (then
    /// close) or the client goes away: a stalled consul.
    Hold,
    /// Forward GETs; hold each PUT until the mode changes, then handle it
    /// as the new mode says (a write made in between lands between the
    /// writer's read and its write).
    HoldPuts,
    /// Forward the response head and half of the body, then close (needs a
    /// non-empty body).
    Truncate,
    /// A 200 with an `X-Consul-Index` above the real one and a body that is
    /// not JSON.
    GarbageBody,
    /// This status with a text body, the way consul words it.
    Status(u16),
    /// Forward, without `X-Consul-Index`.
    MissingIndex,
    /// Forward, with this `X-Consul-Index` value instead of the real one.
    IndexValue(&'static str),
    /// Forward, with `X-Consul-Index: 1` (below any real index once a key
    /// was written).
    BackwardsIndex,
    /// Turn every blocking query into a non-blocking one: a consul whose
    /// `wait` returns at once with the same index, every time.
    Immediate,
    /// Forward the head at once, then the body one byte per this long.
    SlowDrip(Duration),
    /// Forward the whole response this long after it came: a consul slow
    /// to answer, however busy the machine running the test is.
    Late(Duration),
    /// A 200 with an index above the real one and a chunked body of this many
    /// bytes.
    OversizeBody(usize),
    /// Forward the response framed this way, then do that.
    Reframe(Wire, After),
    /// A 200 with an index above the real one and a gzip body (a few KiB)
    /// that inflates to this many bytes: a gzip bomb.
    GzipBomb(usize),
    /// A 200 with an index above the real one and a gzip body whose CRC is
    /// wrong.
    CorruptGzip,
    /// A 200 with an index above the real one, a JSON body, and this
    /// `Content-Encoding`.
    Encoding(&'static str),
}

/// How [`Mode::Reframe`] frames a forwarded response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    ContentLength,
    /// 2 KiB chunks, each with an extension, and trailers.
    Chunked,
    /// No length: the body ends when the proxy closes.
    CloseDelimited,
    /// HTTP/1.0 with a `Content-Length` (not persistent).
    Http10,
    /// HTTP/1.1 with `Connection: close` and a `Content-Length`.
    ConnectionClose,
    /// `100 Continue` and `103 Early Hints` first, then a length response.
    InterimFirst,
}

impl Wire {
    pub const ALL: [Wire; 6] = [
        Wire::ContentLength,
        Wire::Chunked,
        Wire::CloseDelimited,
        Wire::Http10,
        Wire::ConnectionClose,
        Wire::InterimFirst,
    ];

    /// Whether the connection may carry another request after it.
    pub fn persists(self) -> bool {
        matches!(
            self,
            Wire::ContentLength | Wire::Chunked | Wire::InterimFirst
        )
    }
}

/// What the proxy does after a [`Mode::Reframe`] response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Keep the connection (if the framing lets it persist).
    Keep,
    /// Close it (FIN).
    Fin,
    /// Reset it (RST).
    Reset,
    /// One byte nobody asked for, right behind the response (in the same
    /// write: sent later, it could reach the agent after its next request
    /// and be read, rightly, as a malformed answer); then as `Keep`.
    StrayByte,
}

struct Shared {
    target: SocketAddr,
    mode: Mutex<Mode>,
    stop: AtomicBool,
    connections: AtomicUsize,
    live: AtomicUsize,
    requests: AtomicUsize,
    /// (sequence number from 0, head text).
    heads: Mutex<VecDeque<(usize, String)>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        self.mode.lock().unwrap().clone()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// The running proxy; stops (and joins its threads) when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0`, forwarding to `target`, in [`Mode::Pass`].
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy binds");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target,
            mode: Mutex::new(Mode::Pass),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            heads: Mutex::new(VecDeque::new()),
            workers: Mutex::new(Vec::new()),
        });
        let s = Arc::clone(&shared);
        let acceptor = std::thread::spawn(move || accept_loop(&s, addr, listener));
        Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Client connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Complete requests received so far (whatever the mode did with them).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// The last request heads received, oldest first, as text.
    pub fn request_heads(&self) -> Vec<String> {
        self.request_heads_since(0)
    }

    /// The heads of the requests after the first `n` (as counted by
    /// [`Proxy::requests`]), of those still kept.
    pub fn request_heads_since(&self, n: usize) -> Vec<String> {
        self.shared
            .heads
            .lock()
            .unwrap()
            .iter()
            .filter(|(seq, _)| *seq >= n)
            .map(|(_, h)| h.clone())
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let workers = std::mem::take(&mut *self.shared.workers.lock().unwrap());
        for w in workers {
            let _ = w.join();
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, addr: SocketAddr, listener: TcpListener) {
    let mut listener = Some(listener);
    while !shared.stopped() {
        if shared.mode() == Mode::Refuse {
            listener = None;
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let Some(l) = listener.as_ref() else {
            // Back from Refuse: listen on the same port again (std sets
            // SO_REUSEADDR, so TIME_WAIT leftovers do not block it).
            if let Ok(l) = TcpListener::bind(addr) {
                l.set_nonblocking(true).unwrap();
                listener = Some(l);
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
            continue;
        };
        match l.accept() {
            Ok((stream, _)) => {
                shared.connections.fetch_add(1, Ordering::Relaxed);
                if shared.live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    continue;
                }
                shared.live.fetch_add(1, Ordering::Relaxed);
                let s = Arc::clone(shared);
                let worker = std::thread::spawn(move || {
                    serve(&s, stream);
                    s.live.fetch_sub(1, Ordering::Relaxed);
                });
                let mut workers = shared.workers.lock().unwrap();
                workers.retain(|w| !w.is_finished());
                workers.push(worker);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Reads what is there into `buf`: `Ok(false)` when the peer closed; an
/// error when it failed, the proxy stops, or `deadline` passes.
fn read_some(
    shared: &Shared,
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<bool> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if shared.stopped() || Instant::now() >= deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match s.read(&mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(true);
            }
            Err(e) if read_timed_out(&e) => {}
            Err(e) => return Err(e),
        }
    }
}

/// One client connection: request after request until it closes or a mode
/// closes it.
fn serve(shared: &Shared, mut client: TcpStream) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    client.set_read_timeout(Some(POLL)).unwrap();
    let mut buf = Vec::new();
    loop {
        let Some((head, raw)) = read_request(shared, &mut client, &mut buf) else {
            return;
        };
        {
            let text = String::from_utf8_lossy(&raw).into_owned();
            let mut heads = shared.heads.lock().unwrap();
            let seq = shared.requests.fetch_add(1, Ordering::Relaxed);
            if heads.len() == KEEP_HEADS {
                heads.pop_front();
            }
            heads.push_back((seq, text));
        }
        let mut mode = shared.mode();
        if mode == Mode::HoldPuts && head.method == Method::Put {
            while shared.mode() == Mode::HoldPuts && !shared.stopped() {
                std::thread::sleep(Duration::from_millis(2));
            }
            mode = shared.mode();
        }
        let request = match mode {
            Mode::Refuse => return,
            Mode::Reset => return reset(client),
            Mode::Hold => return hold(shared, &mut client),
            Mode::Immediate => nonblocking(&head, &raw),
            _ => raw,
        };
        let Some(up) = fetch(shared, &request) else {
            return;
        };
        if !respond(shared, &mut client, &up) {
            return;
        }
    }
}

/// The next request on the connection: its head and its raw bytes.
fn read_request(
    shared: &Shared,
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(RequestHead, Vec<u8>)> {
    let far = Instant::now() + Duration::from_secs(3600);
    loop {
        match parse_request_head(buf, MAX_HEAD) {
            Parse::Done(head, used) => {
                // The agent sends GETs without a body; PUTs (if any) carry
                // a Content-Length.
                let Framing::Length(n) = head.framing else {
                    return None;
                };
                let total = used + usize::try_from(n).ok()?;
                while buf.len() < total {
                    if !read_some(shared, client, buf, far).ok()? {
                        return None;
                    }
                }
                let raw: Vec<u8> = buf.drain(..total).collect();
                return Some((head, raw));
            }
            Parse::Partial => {
                if !read_some(shared, client, buf, far).ok()? {
                    return None;
                }
            }
            Parse::Invalid(_) => return None,
        }
    }
}

/// The request with `index` and `wait` removed from its query.
fn nonblocking(head: &RequestHead, raw: &[u8]) -> Vec<u8> {
    let line_end = raw
        .windows(2)
        .position(|w| w == b"\r\n")
        .expect("a parsed head has a request line");
    let query: Vec<&str> = head
        .query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("index=") && !p.starts_with("wait="))
        .collect();
    let target = if query.is_empty() {
        head.path.clone()
    } else {
        format!("{}?{}", head.path, query.join("&"))
    };
    let mut out = format!("{} {target} HTTP/1.1", head.method_name).into_bytes();
    out.extend_from_slice(&raw[line_end..]);
    out
}

/// One upstream response, as received and decoded.
struct Upstream {
    head: ResponseHead,
    raw_head: Vec<u8>,
    raw_body: Vec<u8>,
    body: Vec<u8>,
}

impl Upstream {
    fn index(&self) -> u64 {
        self.head
            .header("x-consul-index")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1)
    }

    /// Whether the client connection can carry another request after this
    /// response as forwarded.
    fn keep_alive(&self) -> bool {
        self.head.keep_alive && self.head.framing != Framing::Close
    }
}

/// Sends `request` on a fresh upstream connection and reads one response.
fn fetch(shared: &Shared, request: &[u8]) -> Option<Upstream> {
    let mut up = TcpStream::connect_timeout(&shared.target, Duration::from_secs(2)).ok()?;
    up.set_read_timeout(Some(POLL)).unwrap();
    up.write_all(request).ok()?;
    let deadline = Instant::now() + UPSTREAM_LIMIT;
    let mut buf = Vec::new();
    let (head, used) = loop {
        match parse_response_head(&buf, MAX_HEAD) {
            Parse::Done(head, used) => break (head, used),
            Parse::Partial => {
                if !read_some(shared, &mut up, &mut buf, deadline).ok()? {
                    return None;
                }
            }
            Parse::Invalid(_) => return None,
        }
    };
    let raw_head = buf[..used].to_vec();
    let mut rest = buf.split_off(used);
    let mut raw_body = Vec::new();
    let mut body = Vec::new();
    let mut decoder = BodyDecoder::new(head.framing, MAX_BODY);
    loop {
        let n = decoder.feed(&rest, &mut body).ok()?;
        raw_body.extend_from_slice(&rest[..n]);
        rest.drain(..n);
        if decoder.is_done() {
            break;
        }
        if !read_some(shared, &mut up, &mut rest, deadline).ok()? {
            decoder.eof().ok()?;
            break;
        }
    }
    Some(Upstream {
        head,
        raw_head,
        raw_body,
        body,
    })
}

/// Writes the (possibly rewritten) response; false when the connection must
/// close.
fn respond(shared: &Shared, client: &mut TcpStream, up: &Upstream) -> bool {
    let mode = shared.mode();
    let keep = up.keep_alive();
    let whole = |client: &mut TcpStream| {
        client.write_all(&up.raw_head).is_ok() && client.write_all(&up.raw_body).is_ok() && keep
    };
    match mode {
        // Set while the request was upstream: the answer is withheld too.
        Mode::Refuse => false,
        Mode::Reset => {
            reset(client.try_clone().unwrap());
            false
        }
        Mode::Hold => {
            hold(shared, client);
            false
        }
        Mode::Pass | Mode::Immediate | Mode::HoldPuts => whole(client),
        Mode::Truncate => {
            let _ = client.write_all(&up.raw_head);
            let _ = client.write_all(&up.raw_body[..up.raw_body.len() / 2]);
            false
        }
        Mode::GarbageBody => send_json(client, up, b"<html>not json</html>"),
        Mode::Status(status) => {
            let text: &[u8] = match status {
                403 => b"ACL not found",
                429 => b"Your IP is issuing too many concurrent connections, please rate limit your calls",
                _ => b"No cluster leader",
            };
            send(
                client,
                status,
                vec![("Content-Type", "text/plain; charset=utf-8".into())],
                text,
            )
        }
        Mode::MissingIndex => send(
            client,
            up.head.status,
            forwarded_headers(up, None),
            &up.body,
        ),
        Mode::IndexValue(v) => send(
            client,
            up.head.status,
            forwarded_headers(up, Some(v.to_owned())),
            &up.body,
        ),
        Mode::BackwardsIndex => send(
            client,
            up.head.status,
            forwarded_headers(up, Some("1".to_owned())),
            &up.body,
        ),
        Mode::SlowDrip(every) => {
            if client.write_all(&up.raw_head).is_err() {
                return false;
            }
            for b in &up.raw_body {
                if shared.stopped() || client.write_all(std::slice::from_ref(b)).is_err() {
                    return false;
                }
                std::thread::sleep(every);
            }
            keep
        }
        Mode::Late(after) => {
            std::thread::sleep(after);
            !shared.stopped() && whole(client)
        }
        Mode::Reframe(wire, after) => {
            let mut framed = reframe(up, wire);
            if after == After::StrayByte {
                framed.push(b'x');
            }
            if client.write_all(&framed).is_err() {
                return false;
            }
            match after {
                After::Keep => wire.persists(),
                After::Fin => false,
                After::Reset => {
                    // A reset drops what the peer has not acknowledged:
                    // let the whole response arrive first.
                    wait_acknowledged(client);
                    reset(client.try_clone().unwrap());
                    false
                }
                After::StrayByte => wire.persists(),
            }
        }
        Mode::OversizeBody(n) => {
            let mut body = vec![b' '; n];
            body[0] = b'[';
            send_json(client, up, &body)
        }
        Mode::GzipBomb(_) | Mode::CorruptGzip | Mode::Encoding(_) => encoded(client, up, &mode),
    }
}

/// The body modes with a `Content-Encoding`.
fn encoded(client: &mut TcpStream, up: &Upstream, mode: &Mode) -> bool {
    let listing = b"[{\"Key\":\"x/y\",\"Value\":null}]";
    let (coding, body) = match *mode {
        Mode::GzipBomb(n) => {
            let mut body = vec![b' '; n];
            body[0] = b'[';
            ("gzip", gzip(&body))
        }
        Mode::CorruptGzip => {
            let mut body = gzip(listing);
            let crc = body.len() - 8;
            body[crc] ^= 0xff;
            ("gzip", body)
        }
        Mode::Encoding(coding) => (coding, listing.to_vec()),
        _ => unreachable!("not a body mode with a coding"),
    };
    let index = (up.index() + 1000).to_string();
    send(
        client,
        200,
        vec![
            ("Content-Encoding", coding.into()),
            ("Content-Type", "application/json".into()),
            ("X-Consul-Index", index),
        ],
        &body,
    )
}

/// The upstream headers worth forwarding, with `X-Consul-Index` replaced
/// (`None`: left out).
fn forwarded_headers(up: &Upstream, index: Option<String>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for (name, value) in &up.head.headers {
        let name: &'static str = match name.as_str() {
            "content-type" => "Content-Type",
            "content-encoding" => "Content-Encoding",
            "x-consul-knownleader" => "X-Consul-Knownleader",
            "x-consul-lastcontact" => "X-Consul-Lastcontact",
            _ => continue,
        };
        out.push((name, String::from_utf8_lossy(value).into_owned()));
    }
    if let Some(i) = index {
        out.push(("X-Consul-Index", i));
    }
    out
}

/// The upstream response (status, consul headers, decoded body) framed as
/// `wire` says.
fn reframe(up: &Upstream, wire: Wire) -> Vec<u8> {
    let version = if wire == Wire::Http10 { "1.0" } else { "1.1" };
    let mut out = match wire {
        Wire::InterimFirst => {
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n".to_vec()
        }
        _ => Vec::new(),
    };
    out.extend(format!("HTTP/{version} {} X\r\n", up.head.status).into_bytes());
    for (name, value) in forwarded_headers(up, Some(up.index().to_string())) {
        out.extend(format!("{name}: {value}\r\n").into_bytes());
    }
    let length = format!("Content-Length: {}\r\n", up.body.len());
    match wire {
        Wire::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Wire::CloseDelimited => {}
        Wire::ConnectionClose => out.extend(format!("Connection: close\r\n{length}").into_bytes()),
        Wire::ContentLength | Wire::Http10 | Wire::InterimFirst => out.extend(length.into_bytes()),
    }
    out.extend_from_slice(b"\r\n");
    if wire == Wire::Chunked {
        for (i, chunk) in up.body.chunks(2048).enumerate() {
            out.extend(format!("{:x};n={i}\r\n", chunk.len()).into_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\nX-Trailer: 1\r\n\r\n");
    } else {
        out.extend_from_slice(&up.body);
    }
    out
}

/// A 200 JSON body under an index past the upstream's.
fn send_json(client: &mut TcpStream, up: &Upstream, body: &[u8]) -> bool {
    let index = (up.index() + 1000).to_string();
    send(
        client,
        200,
        vec![
            ("Content-Type", "application/json".into()),
            ("X-Consul-Index", index),
        ],
        body,
    )
}

/// Renders a response the way consul frames it (chunked past 2 KiB).
fn send(
    client: &mut TcpStream,
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: &[u8],
) -> bool {
    let mut out = Vec::new();
    render_response(
        &mut out,
        &Response {
            status,
            headers,
            body: body.to_vec(),
        },
        true,
        Some(2048),
        false,
    );
    client.write_all(&out).is_ok()
}

/// Waits (at most 5 s) until the peer has acknowledged every byte sent.
fn wait_acknowledged(client: &TcpStream) {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let mut unacked: libc::c_int = 0;
        // SIOCOUTQ (= TIOCOUTQ): bytes in the send queue not yet acknowledged.
        let rc = unsafe { libc::ioctl(client.as_raw_fd(), libc::TIOCOUTQ, &mut unacked) };
        if rc != 0 || unacked == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Closes with RST instead of FIN.
fn reset(client: TcpStream) {
    let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
    drop(client);
}

/// Answers nothing until the mode changes, the client closes, or the proxy
/// stops.
fn hold(shared: &Shared, client: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    while !shared.stopped() && shared.mode() == Mode::Hold {
        match client.read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if read_timed_out(&e) => {}
            Err(_) => return,
        }
    }
}

/// A read that only ran into its timeout (or a signal): poll again.
fn read_timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}
