//! One agent-check connection: read one line, look it up, write the reply
//! whole, close. Its phases (`ExpectLine`, `Replying`): `docs/LIFECYCLE.md`,
//! "Agent connection".
//!
//! - In: readiness of the socket, the lookup to answer with (nothing before
//!   the first consul read), a scratch buffer the loop owns. Out: a
//!   [`Progress`]: done with an [`Outcome`] (the socket closes when the
//!   connection is dropped), or what to wait for next.
//! - At most `max_line_bytes + 1` bytes are ever buffered; a connection
//!   answers at most once.
//! - Nothing allocates on the path where the line is already in the socket
//!   at accept (the common case: haproxy sends right after connecting).

use std::io::{self, Read, Write};

use mio::net::TcpStream;

use crate::agent::request::{self, Reject, Request};
use crate::agent::Outcome;
use crate::contract::Admin;

/// What the loop should do with a connection after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Finished: drop the connection (closing it) and count the outcome.
    Done(Outcome),
    /// Wait for the socket to become readable.
    NeedRead,
    /// Wait for the socket to become writable (a partial reply write).
    NeedWrite,
}

enum Phase {
    ExpectLine,
    Replying {
        reply: &'static [u8],
        written: usize,
        outcome: Outcome,
    },
}

/// An agent connection still waiting for its line or finishing its reply.
pub struct AgentConn {
    stream: TcpStream,
    /// Bytes of an incomplete line (allocated only when a line arrives in
    /// pieces).
    buf: Vec<u8>,
    phase: Phase,
}

impl AgentConn {
    pub fn new(stream: TcpStream) -> AgentConn {
        AgentConn {
            stream,
            buf: Vec::new(),
            phase: Phase::ExpectLine,
        }
    }

    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Still waiting for a complete line (a flood's idle connection looks
    /// like this; one being answered does not).
    pub fn awaiting_line(&self) -> bool {
        matches!(self.phase, Phase::ExpectLine)
    }

    /// The bytes of the incomplete line received so far.
    pub fn received(&self) -> &[u8] {
        &self.buf
    }

    /// The socket is (or may be) readable. `answer` looks an identity up
    /// (`None`: no state to answer from yet); it is called at most once.
    /// `scratch` must be at least `max_line_bytes + 1` long.
    pub fn on_readable(
        &mut self,
        answer: impl FnOnce(&[u8]) -> Option<(&'static [u8], Admin)>,
        max_line_bytes: usize,
        scratch: &mut [u8],
    ) -> Progress {
        if !matches!(self.phase, Phase::ExpectLine) {
            return self.on_writable();
        }
        let limit = max_line_bytes + 1;
        loop {
            // Read into the scratch buffer, after the bytes held so far, so
            // the usual one-read line never touches the heap.
            let held = self.buf.len();
            if held > 0 {
                scratch[..held].copy_from_slice(&self.buf);
            }
            let n = match self.stream.read(&mut scratch[held..limit]) {
                Ok(0) => return Progress::Done(self.ended_without_line(Outcome::PeerClosed)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::NeedRead,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Progress::Done(self.ended_without_line(Outcome::IoError)),
            };
            let seen = &scratch[..held + n];
            match request::parse(seen, max_line_bytes) {
                Request::Partial => {
                    self.buf.clear();
                    self.buf.extend_from_slice(seen);
                }
                Request::Reject(r) => return Progress::Done(reject_outcome(r)),
                Request::Identity(id) => {
                    let Some((reply, admin)) = answer(id) else {
                        return Progress::Done(Outcome::NotSynced);
                    };
                    let outcome = admin.into();
                    self.phase = Phase::Replying {
                        reply,
                        written: 0,
                        outcome,
                    };
                    return self.on_writable();
                }
            }
        }
    }

    /// Writes (the rest of) the reply.
    pub fn on_writable(&mut self) -> Progress {
        let Phase::Replying {
            reply,
            written,
            outcome,
        } = &mut self.phase
        else {
            return Progress::NeedRead;
        };
        while *written < reply.len() {
            match self.stream.write(&reply[*written..]) {
                Ok(0) => return Progress::Done(Outcome::IoError),
                Ok(n) => *written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::NeedWrite,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // haproxy gave up (its check timeout) and reset: counted, not logged.
                Err(_) => return Progress::Done(Outcome::IoError),
            }
        }
        Progress::Done(*outcome)
    }

    /// The read deadline passed.
    pub fn on_timeout(&self) -> Outcome {
        match self.phase {
            Phase::ExpectLine => self.ended_without_line(Outcome::Timeout),
            // A reply stuck in a full send buffer: the peer does not read.
            Phase::Replying { .. } => Outcome::IoError,
        }
    }

    /// A connection that ends with bytes but no newline is almost always an
    /// `agent-send` missing its `\n`: counted apart from plain timeouts.
    fn ended_without_line(&self, otherwise: Outcome) -> Outcome {
        if self.buf.is_empty() {
            otherwise
        } else {
            Outcome::NoNewline
        }
    }
}

fn reject_outcome(r: Reject) -> Outcome {
    match r {
        Reject::TooLong => Outcome::TooLong,
        Reject::ControlByte => Outcome::ControlByte,
        Reject::Empty => Outcome::Empty,
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

    use super::*;
    use crate::kv::KvPair;
    use crate::state::{Snapshot, Tick};

    /// A connected pair: our mio end (as accepted) and the peer's std end.
    fn pair() -> (TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        (TcpStream::from_std(ours), peer)
    }

    fn snapshot() -> Snapshot {
        let pair = KvPair {
            key: "p/be/s1".into(),
            value: b"drain".to_vec(),
            modify_index: 3,
            flags: 0,
        };
        Snapshot::build("p", 3, vec![pair])
    }

    #[test]
    fn a_reply_that_does_not_fit_the_send_buffer_is_resumed_when_writable() {
        let (mut ours, mut peer) = pair();
        peer.write_all(b"be/s1\n").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // Fill our send buffer (and the peer's receive buffer) so the reply
        // write can only go out in part or not at all.
        let junk = vec![b'x'; 64 * 1024];
        let mut queued = 0;
        for size in [64 * 1024, 1024, 1] {
            loop {
                match ours.write(&junk[..size]) {
                    Ok(n) => queued += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        let mut conn = AgentConn::new(ours);
        let mut scratch = vec![0; 257];
        let snap = snapshot();
        let mut asked = Vec::new();
        let answer = |id: &[u8]| {
            asked.push(id.to_vec());
            snap.answer(id, Tick::NEVER).map(|d| (d.reply(), d.admin()))
        };
        assert_eq!(
            conn.on_readable(answer, 256, &mut scratch),
            Progress::NeedWrite
        );
        assert_eq!(asked, [b"be/s1".to_vec()], "looked up once");
        // The peer drains: the rest of the reply goes out on the next
        // writable event, whole and once.
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0; 64 * 1024];
        while got.len() < queued {
            let n = peer.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        let mut progress = conn.on_writable();
        while progress == Progress::NeedWrite {
            std::thread::sleep(Duration::from_millis(5));
            let n = peer.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            progress = conn.on_writable();
        }
        assert_eq!(progress, Progress::Done(Outcome::Drain));
        drop(conn);
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(&got[queued..], b"drain 100%\n");
    }

    #[test]
    fn not_synced_reads_the_line_then_closes_without_a_reply() {
        let (ours, mut peer) = pair();
        peer.write_all(b"be/s1\n").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut conn = AgentConn::new(ours);
        let mut scratch = vec![0; 257];
        assert_eq!(
            conn.on_readable(|_| None, 256, &mut scratch),
            Progress::Done(Outcome::NotSynced)
        );
        drop(conn);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        assert!(got.is_empty());
    }
}
