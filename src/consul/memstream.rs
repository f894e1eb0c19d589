//! An in-memory consul peer for the client's unit tests and the fuzzer: a
//! [`Transport`] whose reads follow a script, and a virtual-clock pump that
//! runs a [`Client`] over it with no socket and no sleep.
//!
//! In: the acts of the peer (bytes, "nothing yet", FIN, RST), one script
//! per request it answers. Out: what the client wrote, how often it
//! connected, and the updates it reported ([`pump`]), or one response's
//! [`Outcome`] ([`answer_once`], the fuzz targets' driver).
//!
//! Always holds:
//! - a read never blocks (an empty script is `WouldBlock`);
//! - FIN and RST stay in effect once reached, as on a socket.
//!
//! Built for the unit tests and under the `test-peers` feature (the fuzz
//! crate turns it on); the release binary does not contain it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::config::{ConsulConfig, ConsulEndpoint};
use crate::consul::client::{Client, Connect, Transport};
use crate::consul::error::ErrorReason;
use crate::consul::watch::Update;

/// One thing the peer does, as seen by the client's reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    /// These bytes arrive (a read may take them in parts).
    Data(Vec<u8>),
    /// These bytes, over and over, forever (a peer that never stops).
    Endless(Vec<u8>),
    /// Nothing more for now: one read says `WouldBlock`.
    Pause,
    /// The peer closed (FIN): every read from here is EOF.
    Fin,
    /// The peer reset (RST): every read from here fails.
    Reset,
}

/// The peer's side of one connection.
#[derive(Debug, Default)]
pub struct Peer {
    /// What the client's reads meet next.
    pub script: VecDeque<Act>,
    /// One script per request, appended to `script` when the request's
    /// head is complete (so nothing arrives before it is asked for).
    pub answers: VecDeque<Vec<Act>>,
    /// Everything the client wrote.
    pub written: Vec<u8>,
    /// Request heads received.
    pub requests: usize,
}

/// A connection to the scripted peer; clones share it.
#[derive(Debug, Clone, Default)]
pub struct MemStream(pub Rc<RefCell<Peer>>);

impl MemStream {
    /// A peer that answers its requests with these scripts, in order.
    pub fn answering(answers: impl IntoIterator<Item = Vec<Act>>) -> MemStream {
        let peer = Peer {
            answers: answers.into_iter().collect(),
            ..Peer::default()
        };
        MemStream(Rc::new(RefCell::new(peer)))
    }

    pub fn requests(&self) -> usize {
        self.0.borrow().requests
    }
}

impl Read for MemStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut peer = self.0.borrow_mut();
        while matches!(peer.script.front(), Some(Act::Data(d)) if d.is_empty()) {
            peer.script.pop_front();
        }
        match peer.script.front_mut() {
            None => Err(io::ErrorKind::WouldBlock.into()),
            Some(Act::Pause) => {
                peer.script.pop_front();
                Err(io::ErrorKind::WouldBlock.into())
            }
            Some(Act::Fin) => Ok(0),
            Some(Act::Reset) => Err(io::ErrorKind::ConnectionReset.into()),
            Some(Act::Endless(pattern)) => {
                let n = buf.len();
                for (dst, src) in buf.iter_mut().zip(pattern.iter().cycle()) {
                    *dst = *src;
                }
                // Keep the pattern aligned for the next read.
                let shift = n % pattern.len().max(1);
                pattern.rotate_left(shift);
                Ok(n)
            }
            Some(Act::Data(bytes)) => {
                let n = bytes.len().min(buf.len());
                buf[..n].copy_from_slice(&bytes[..n]);
                bytes.drain(..n);
                if bytes.is_empty() {
                    peer.script.pop_front();
                }
                Ok(n)
            }
        }
    }
}

impl Write for MemStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut peer = self.0.borrow_mut();
        if matches!(peer.script.front(), Some(Act::Reset)) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let before = peer.written.len();
        peer.written.extend_from_slice(buf);
        // Heads ending in this write (the `\r\n\r\n` may straddle writes).
        let from = before.saturating_sub(3);
        let ends = peer.written[from..]
            .windows(4)
            .filter(|w| w == b"\r\n\r\n")
            .count();
        for _ in 0..ends {
            peer.requests += 1;
            let answer = peer.answers.pop_front().unwrap_or_default();
            peer.script.extend(answer);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Transport for MemStream {
    fn connected(&mut self) -> io::Result<bool> {
        Ok(true)
    }
}

/// A scripted connection, as [`pump`] sees it.
pub trait Scripted {
    /// Whether a read now would find something (bytes, FIN or RST).
    fn pending(&mut self) -> bool;
}

impl Scripted for MemStream {
    fn pending(&mut self) -> bool {
        !self.0.borrow().script.is_empty()
    }
}

/// Hands out the prepared peers in order; refuses once they are used up.
#[derive(Debug, Default)]
pub struct MemConnector {
    pub peers: VecDeque<MemStream>,
    pub connects: usize,
}

impl Connect for MemConnector {
    type Stream = MemStream;

    fn connect(&mut self) -> io::Result<MemStream> {
        self.connects += 1;
        self.peers
            .pop_front()
            .ok_or_else(|| io::ErrorKind::ConnectionRefused.into())
    }
}

/// A client configuration for a scripted peer: `-consul-wait 1s` (a
/// response deadline of 6.0625 s), no token, the given body bound.
pub fn config(max_body_bytes: usize) -> ConsulConfig {
    ConsulConfig {
        endpoint: ConsulEndpoint::Tcp(([127, 0, 0, 1], 8500).into()),
        host_header: "127.0.0.1:8500".into(),
        path_prefix: String::new(),
        token: None,
        basic_auth: None,
        namespace: None,
        partition: None,
        tls: None,
        wait: Duration::from_secs(1),
        max_body_bytes,
        gzip: crate::config::GzipMode::Auto,
        max_stale: Duration::ZERO,
    }
}

/// Runs the client as the loop would, on a virtual clock: a readiness
/// event (spurious ones are allowed; bytes the script holds after a pause
/// are read at the next turn), then its timer whenever due; each turn
/// takes `tick`, and when the connection has nothing more to say the clock
/// jumps to the client's next time. Stops after the first update, or when
/// the clock passes `limit` (returns `None`).
pub fn pump<C: Connect>(
    client: &mut Client<C>,
    now: &mut Instant,
    limit: Duration,
    tick: Duration,
) -> Option<Update>
where
    C::Stream: Scripted,
{
    let end = *now + limit;
    let mut out = Vec::new();
    while *now <= end {
        *now += tick;
        client.on_event(*now, &mut out);
        if out.is_empty() && client.poll_at(*now) <= *now {
            client.on_timer(*now, &mut out);
        }
        if !out.is_empty() {
            return Some(out.remove(0));
        }

        // Drop what the loop would close.
        client.retired().for_each(drop);
        // Nothing for the socket to say: sleep until the client's time.
        let readable = client.wants().is_some_and(|(s, _, _)| s.pending());
        if !readable {
            *now = (*now).max(client.poll_at(*now) - tick);
        }
    }
    None
}

/// What one response came to, reduced to what the loop acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Swap {
        index: u64,
        keys: usize,
        invalid: usize,
    },
    Unchanged,
    Reset {
        from: u64,
        to: u64,
    },
    TooStale,
    Failed(ErrorReason),
}

impl Outcome {
    pub fn of(update: Update) -> Outcome {
        match update {
            Update::Swap(s) => Outcome::Swap {
                index: s.index(),
                keys: s.len(),
                invalid: s.invalid().len(),
            },
            Update::Unchanged => Outcome::Unchanged,
            Update::Reset { from, to } => Outcome::Reset { from, to },
            Update::TooStale { .. } => Outcome::TooStale,
            Update::Failed(f) => Outcome::Failed(f.reason),
        }
    }
}

/// A fresh client (`-consul-wait 1s`, `max_body`) answered `wire` in
/// `pieces` (a pause after each), then the rest, then `ending`: its one
/// outcome and whether it kept the connection. Panics when it comes to no
/// outcome within its response deadline, to a second one, or when it sends
/// a second request.
pub fn answer_once(
    wire: &[u8],
    pieces: &[usize],
    ending: &Act,
    max_body: usize,
) -> (Outcome, bool) {
    let mut script = Vec::new();
    let mut at = 0;
    for &len in pieces {
        let end = (at + len).min(wire.len());
        script.push(Act::Data(wire[at..end].to_vec()));
        script.push(Act::Pause);
        at = end;
    }
    script.push(Act::Data(wire[at..].to_vec()));
    script.push(ending.clone());
    let peer = MemStream::answering([script]);
    let connector = MemConnector {
        peers: [peer.clone()].into(),
        connects: 0,
    };
    let mut client = Client::new(
        &config(max_body),
        connector,
        "gitlab-haproxy-agent/state",
        1,
    );
    let t0 = Instant::now();
    let mut now = t0;
    let update = pump(
        &mut client,
        &mut now,
        Duration::from_secs(60),
        Duration::from_millis(1),
    )
    .expect("an outcome within the response deadline");
    // 1 s × 17/16 + 5 s, and the turns it took to get there.
    assert!(now - t0 < Duration::from_secs(8), "took {:?}", now - t0);
    let outcome = Outcome::of(update);
    // Let the client see the rest of the script (a decode finishes first).
    let mut out = Vec::new();
    for _ in 0..pieces.len() + 4 {
        client.on_event(now, &mut out);
    }
    assert!(out.is_empty(), "a second outcome: {out:?}");
    assert_eq!(peer.requests(), 1);
    (outcome, client.wants().is_some())
}
