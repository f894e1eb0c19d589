//! One HTTP/1.1 server connection, shared by the monitoring, pprof and dev
//! KV listeners: read a request (head + body, bounded), hand it to the loop,
//! write the response, keep alive or close.
//!
//! In: readiness of the socket, and responses from whoever handles the
//! request. Out: complete requests, or what to wait for. Always holds: a head
//! is at most [`MAX_HEAD_BYTES`], a body at most the limit given at
//! creation; a request that breaks the framing rules gets a 400 and the
//! connection is closed; one request is handled at a time (pipelined bytes
//! wait in the buffer).
//!
//! | phase | waits for | on event | next |
//! |---|---|---|---|
//! | `ExpectHead` | readable | head parsed | `ExpectBody` |
//! | `ExpectBody` | readable | body complete | `Handling` (request out) |
//! | `Handling` | the loop's response (dev KV: maybe parked) | response | `Writing` |
//! | `Writing` | writable | written | `ExpectHead` (keep-alive) or closed |

use std::io::{self, Read, Write};

use mio::net::TcpStream;

use crate::http::{
    parse_request_head, render_response, BodyDecoder, Method, Parse, RequestHead, Response,
};

pub const MAX_HEAD_BYTES: usize = 16 * 1024;
const READ_CHUNK: usize = 16 * 1024;

/// What the loop should do after an event.
#[derive(Debug)]
pub enum HttpProgress {
    /// A complete request: answer it with [`HttpConn::respond`].
    Request(RequestHead, Vec<u8>),
    NeedRead,
    NeedWrite,
    /// Done (peer closed, error, or `Connection: close` answered).
    Close,
}

enum Phase {
    ExpectHead,
    ExpectBody {
        head: RequestHead,
        decoder: BodyDecoder,
        body: Vec<u8>,
    },
    Handling {
        keep_alive: bool,
    },
    Writing {
        written: usize,
        keep_alive: bool,
    },
}

pub struct HttpConn {
    stream: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    phase: Phase,
    max_body: usize,
}

impl HttpConn {
    pub fn new(stream: TcpStream, max_body: usize) -> HttpConn {
        HttpConn {
            stream,
            inbuf: Vec::new(),
            out: Vec::new(),
            phase: Phase::ExpectHead,
            max_body,
        }
    }

    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// True while a request is out with the loop (the dev KV may hold it).
    pub fn is_handling(&self) -> bool {
        matches!(self.phase, Phase::Handling { .. })
    }

    pub fn on_readable(&mut self) -> HttpProgress {
        match self.phase {
            Phase::ExpectHead | Phase::ExpectBody { .. } => {}
            Phase::Handling { .. } => return self.peek_closed(),
            Phase::Writing { .. } => return self.on_writable(),
        }
        loop {
            match self.parse_buffered() {
                Ok(Some(p)) => return p,
                Ok(None) => {}
                Err(why) => return self.refuse(why),
            }
            let len = self.inbuf.len();
            self.inbuf.resize(len + READ_CHUNK, 0);
            let r = self.stream.read(&mut self.inbuf[len..]);
            match r {
                Ok(0) => {
                    self.inbuf.truncate(len);
                    return HttpProgress::Close;
                }
                Ok(n) => self.inbuf.truncate(len + n),
                Err(e) => {
                    self.inbuf.truncate(len);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return HttpProgress::NeedRead,
                        io::ErrorKind::Interrupted => {}
                        _ => return HttpProgress::Close,
                    }
                }
            }
        }
    }

    /// While a request is parked, a readable socket means the client went
    /// away (or pipelined more): EOF closes, bytes wait in the buffer.
    fn peek_closed(&mut self) -> HttpProgress {
        let mut tmp = [0u8; 1024];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => return HttpProgress::Close,
                Ok(n) => {
                    if self.inbuf.len() + n > MAX_HEAD_BYTES + self.max_body {
                        return HttpProgress::Close;
                    }
                    self.inbuf.extend_from_slice(&tmp[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HttpProgress::NeedRead,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return HttpProgress::Close,
            }
        }
    }

    /// `Ok(Some)`: a request is complete; `Ok(None)`: need more bytes.
    fn parse_buffered(&mut self) -> Result<Option<HttpProgress>, &'static str> {
        if let Phase::ExpectHead = self.phase {
            match parse_request_head(&self.inbuf, MAX_HEAD_BYTES) {
                Parse::Partial => return Ok(None),
                Parse::Invalid(why) => return Err(why),
                Parse::Done(head, used) => {
                    self.inbuf.drain(..used);
                    let decoder = BodyDecoder::new(head.framing, self.max_body);
                    self.phase = Phase::ExpectBody {
                        head,
                        decoder,
                        body: Vec::new(),
                    };
                }
            }
        }
        let Phase::ExpectBody { decoder, body, .. } = &mut self.phase else {
            return Ok(None);
        };
        let used = decoder
            .feed(&self.inbuf, body)
            .map_err(|_| "bad or oversized request body")?;
        self.inbuf.drain(..used);
        if !decoder.is_done() {
            return Ok(None);
        }
        let Phase::ExpectBody { head, body, .. } =
            std::mem::replace(&mut self.phase, Phase::ExpectHead)
        else {
            unreachable!()
        };
        self.phase = Phase::Handling {
            keep_alive: head.keep_alive,
        };
        Ok(Some(HttpProgress::Request(head, body)))
    }

    fn refuse(&mut self, why: &'static str) -> HttpProgress {
        self.phase = Phase::Handling { keep_alive: false };
        let resp = Response {
            status: 400,
            headers: vec![("Content-Type", "text/plain".into())],
            body: format!("{why}\n").into_bytes(),
        };
        self.respond(&resp, false, None)
    }

    /// Sends the response to the request handed out last.
    pub fn respond(
        &mut self,
        resp: &Response,
        head_only: bool,
        chunk_over: Option<usize>,
    ) -> HttpProgress {
        let keep_alive = match self.phase {
            Phase::Handling { keep_alive } => keep_alive,
            _ => false,
        };
        self.out.clear();
        render_response(&mut self.out, resp, keep_alive, chunk_over, head_only);
        self.phase = Phase::Writing {
            written: 0,
            keep_alive,
        };
        self.on_writable()
    }

    pub fn on_writable(&mut self) -> HttpProgress {
        let Phase::Writing {
            written,
            keep_alive,
        } = &mut self.phase
        else {
            return HttpProgress::NeedRead;
        };
        while *written < self.out.len() {
            match self.stream.write(&self.out[*written..]) {
                Ok(0) => return HttpProgress::Close,
                Ok(n) => *written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HttpProgress::NeedWrite,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return HttpProgress::Close,
            }
        }
        if !*keep_alive {
            return HttpProgress::Close;
        }
        self.phase = Phase::ExpectHead;
        if self.out.capacity() > 1 << 20 {
            self.out = Vec::new();
        }
        // A pipelined request may already be buffered.
        self.on_readable()
    }
}

/// `HEAD` is answered like `GET` without a body.
pub fn is_head(head: &RequestHead) -> bool {
    head.method == Method::Head
}
