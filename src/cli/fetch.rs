//! The operator commands' blocking exchanges with a deadline: one HTTP GET
//! (`status`'s `/debug/state`, `wait-drained`'s Prometheus query), one
//! haproxy CLI command (a stats or master socket: `wait-drained`,
//! `save-server-state`), and the reading loop under both.
//!
//! In: where, what to send, a deadline, and a reader of the answer's bytes.
//! Out: what the reader made of them, or one line saying what went wrong.
//!
//! Always holds:
//! - the whole exchange, connect to last byte, ends by the deadline;
//! - the bytes are handed on as they arrive, so memory is what the reader
//!   keeps (an HTTP body at most its `max_body`).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::config::StatsSocket;
use crate::drain::process::{ProcReader, Worker};
use crate::http::{parse_response_head, BodyDecoder, BodyError, Parse};

/// A stream whose reads can be given a timeout.
pub(super) trait Timed: Read + Write {
    fn set_timeout(&self, d: Duration) -> std::io::Result<()>;
    /// Says the request is complete (a half-close).
    fn shutdown_write(&self) -> std::io::Result<()>;
}

impl Timed for TcpStream {
    fn set_timeout(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }

    fn shutdown_write(&self) -> std::io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

impl Timed for UnixStream {
    fn set_timeout(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }

    fn shutdown_write(&self) -> std::io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

/// A TCP connection made by `deadline`.
pub(super) fn connect(addr: SocketAddr, deadline: Instant) -> Result<TcpStream, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("no time left to connect".into());
    }
    TcpStream::connect_timeout(&addr, left).map_err(|e| format!("cannot connect: {e}"))
}

/// Writes `request` (then half-closes, with `half_close`), then hands
/// every chunk read to `feed` until it says done (`Ok(true)`), the peer
/// closes (`feed` gets an empty slice), or the deadline passes.
pub(super) fn exchange(
    s: &mut dyn Timed,
    (request, half_close): (&[u8], bool),
    deadline: Instant,
    mut feed: impl FnMut(&[u8]) -> Result<bool, String>,
) -> Result<(), String> {
    let timed_out = || "no complete answer in time".to_owned();
    let left = || deadline.saturating_duration_since(Instant::now());
    if left().is_zero() {
        return Err(timed_out());
    }
    s.set_timeout(left()).map_err(|e| e.to_string())?;
    s.write_all(request).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => timed_out(),
        _ => format!("cannot send: {e}"),
    })?;
    if half_close {
        s.shutdown_write()
            .map_err(|e| format!("cannot send: {e}"))?;
    }
    let mut chunk = vec![0; 16 * 1024];
    loop {
        let left = left();
        if left.is_zero() {
            return Err(timed_out());
        }
        s.set_timeout(left).map_err(|e| e.to_string())?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out())
            }
            Err(e) => return Err(format!("cannot read: {e}")),
        };
        if feed(&chunk[..n])? || n == 0 {
            return Ok(());
        }
    }
}

/// One haproxy CLI command on `at`, its answer handed to `feed` as it
/// arrives. The command is followed by a half-close: haproxy 2.6's master
/// CLI answers only then, and a stats socket ends the exchange after one
/// command anyway.
pub(super) fn cli(
    at: &StatsSocket,
    command: &str,
    deadline: Instant,
    feed: impl FnMut(&[u8]) -> Result<bool, String>,
) -> Result<(), String> {
    let mut stream: Box<dyn Timed> = match at {
        StatsSocket::Tcp(addr) => Box::new(connect(*addr, deadline)?),
        StatsSocket::Unix(path) => Box::new(connect_unix(path, deadline)?),
    };
    let line = format!("{command}\n");
    exchange(stream.as_mut(), (line.as_bytes(), true), deadline, feed)
}

/// The workers the master lists.
pub(super) fn show_proc(at: &StatsSocket, deadline: Instant) -> Result<Vec<Worker>, String> {
    let mut proc = ProcReader::default();
    cli(at, "show proc", deadline, |d| proc.feed(d))?;
    proc.finish()
}

/// A unix stream connection made by `deadline` (a listener whose backlog
/// is full would block a plain connect).
fn connect_unix(path: &std::path::Path, deadline: Instant) -> Result<UnixStream, String> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let cannot = |e: std::io::Error| format!("cannot connect: {e}");
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("no time left to connect".into());
    }
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(cannot)?;
    socket
        .connect_timeout(&SockAddr::unix(path).map_err(cannot)?, left)
        .map_err(cannot)?;
    Ok(socket.into())
}

/// `GET target` on `addr` (`host` for the Host header): the status and
/// the body (at most `max_body` bytes), within `deadline`.
pub(super) fn http_get(
    addr: SocketAddr,
    host: &str,
    target: &str,
    deadline: Instant,
    max_body: usize,
) -> Result<(u16, Vec<u8>), String> {
    let mut s = connect(addr, deadline)?;
    let req = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let mut buf = Vec::new();
    let mut body = Vec::new();
    let mut head: Option<(u16, BodyDecoder)> = None;
    exchange(&mut s, (req.as_bytes(), false), deadline, |data| {
        buf.extend_from_slice(data);
        if head.is_none() {
            match parse_response_head(&buf, 64 * 1024) {
                Parse::Done(h, used) => {
                    head = Some((h.status, BodyDecoder::new(h.framing, max_body)));
                    buf.drain(..used);
                }
                Parse::Invalid(why) => return Err(format!("not an HTTP response: {why}")),
                Parse::Partial if data.is_empty() => return Err("closed before a response".into()),
                Parse::Partial => return Ok(false),
            }
        }
        let Some((_, decoder)) = head.as_mut() else {
            unreachable!("the head was just read")
        };
        let bad = |e| body_error(e, max_body);
        let used = decoder.feed(&buf, &mut body).map_err(bad)?;
        buf.drain(..used);
        if data.is_empty() {
            decoder.eof().map_err(bad)?;
        }
        Ok(decoder.is_done())
    })?;
    match head {
        Some((status, _)) => Ok((status, body)),
        None => Err("closed before a response".into()),
    }
}

fn body_error(e: BodyError, max_body: usize) -> String {
    match e {
        BodyError::BadChunk => "a malformed chunked body".into(),
        BodyError::TooLarge => format!("a body over {} MiB", max_body >> 20),
        BodyError::Truncated => "the body was cut short".into(),
    }
}
