//! Consul response framing: `http::parse_response_head` then
//! `http::BodyDecoder`, driven the way `consul::client` drives them (bytes
//! buffered, the head re-parsed on each arrival, the body fed what follows
//! it, the peer's close as `eof`). The outcome of a one-shot feed must equal
//! the outcome of a feed split where the input says, and of a feed one byte
//! at a time. A complete response also goes through `consul::watch`.
//!
//! Input: byte 0 is the control byte: bits 0-2 = how many piece lengths
//! follow (0-7, one byte each, 0 meaning an empty read), bits 3-5 pick the
//! body bound, bit 6 a small head bound (256) instead of consul's 64 KiB,
//! bit 7 adds the byte-at-a-time feed. Then the piece lengths, then the
//! bytes consul sent; the connection closes after the last one.
#![no_main]

use std::sync::OnceLock;
use std::time::Instant;

use gitlab_haproxy_agent::consul::watch::{Response, Watch};
use gitlab_haproxy_agent::http::{
    parse_response_head, BodyDecoder, BodyError, Parse, ResponseHead,
};
use libfuzzer_sys::fuzz_target;

const BODY_BOUNDS: [usize; 8] = [0, 1, 5, 64, 2048, 4096, 1 << 20, usize::MAX];

/// Everything the client would act on.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The peer closed before a complete head.
    NoHead,
    BadHead(&'static str),
    Response {
        head: ResponseHead,
        body: Vec<u8>,
        result: Result<(), BodyError>,
        /// Unconsumed bytes after a complete body (the client drops the
        /// connection when there are any).
        stray: Vec<u8>,
    },
}

enum Phase {
    ExpectHead,
    ExpectBody(ResponseHead, BodyDecoder),
}

struct Reader {
    max_head: usize,
    max_body: usize,
    inbuf: Vec<u8>,
    body: Vec<u8>,
    phase: Phase,
}

impl Reader {
    fn new(max_head: usize, max_body: usize) -> Reader {
        Reader {
            max_head,
            max_body,
            inbuf: Vec::new(),
            body: Vec::new(),
            phase: Phase::ExpectHead,
        }
    }

    /// One read of `bytes` (possibly empty); `Some` once the outcome is known.
    fn read(&mut self, bytes: &[u8]) -> Option<Outcome> {
        self.inbuf.extend_from_slice(bytes);
        if let Phase::ExpectHead = self.phase {
            match parse_response_head(&self.inbuf, self.max_head) {
                Parse::Partial => return None,
                Parse::Invalid(why) => return Some(Outcome::BadHead(why)),
                Parse::Done(head, used) => {
                    assert!(used <= self.inbuf.len() && used <= self.max_head);
                    self.inbuf.drain(..used);
                    let decoder = BodyDecoder::new(head.framing, self.max_body);
                    self.phase = Phase::ExpectBody(head, decoder);
                }
            }
        }
        let Phase::ExpectBody(_, decoder) = &mut self.phase else {
            unreachable!()
        };
        match decoder.feed(&self.inbuf, &mut self.body) {
            Ok(used) => {
                assert!(used <= self.inbuf.len());
                self.inbuf.drain(..used);
            }
            Err(e) => return Some(self.finish(Err(e))),
        }
        assert!(self.body.len() <= self.max_body, "body past its bound");
        decoder.is_done().then(|| self.finish(Ok(())))
    }

    fn eof(&mut self) -> Outcome {
        match &mut self.phase {
            Phase::ExpectHead => Outcome::NoHead,
            Phase::ExpectBody(_, decoder) => {
                let r = decoder.eof();
                self.finish(r)
            }
        }
    }

    /// A failed body is dropped whole by the client, so how much of it was
    /// decoded before the failure (which does depend on the split: a
    /// piece past the bound is refused whole) is not part of the outcome.
    fn finish(&mut self, result: Result<(), BodyError>) -> Outcome {
        let Phase::ExpectBody(head, _) = std::mem::replace(&mut self.phase, Phase::ExpectHead)
        else {
            unreachable!()
        };
        let (body, stray) = match result {
            Ok(()) => (
                std::mem::take(&mut self.body),
                std::mem::take(&mut self.inbuf),
            ),
            Err(_) => (Vec::new(), Vec::new()),
        };
        Outcome::Response {
            head,
            body,
            result,
            stray,
        }
    }
}

/// Feeds `wire` in `pieces` (lengths; whatever is left goes in one last
/// read), then closes.
fn drive(wire: &[u8], pieces: impl IntoIterator<Item = usize>, bounds: (usize, usize)) -> Outcome {
    let mut reader = Reader::new(bounds.0, bounds.1);
    let mut at = 0;
    for len in pieces {
        let end = (at + len).min(wire.len());
        if let Some(outcome) = reader.read(&wire[at..end]) {
            return with_rest(outcome, &wire[end..]);
        }
        at = end;
    }
    if let Some(outcome) = reader.read(&wire[at..]) {
        return outcome;
    }
    reader.eof()
}

/// Bytes not read yet when the outcome was known are stray too.
fn with_rest(mut outcome: Outcome, rest: &[u8]) -> Outcome {
    if let Outcome::Response { stray, result, .. } = &mut outcome {
        if result.is_ok() {
            stray.extend_from_slice(rest);
        }
    }
    outcome
}

fn now() -> Instant {
    static NOW: OnceLock<Instant> = OnceLock::new();
    *NOW.get_or_init(Instant::now)
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let npieces = usize::from(ctl & 7).min(rest.len());
    let (pieces, wire) = rest.split_at(npieces);
    let max_body = BODY_BOUNDS[usize::from(ctl >> 3 & 7)];
    let max_head = if ctl & 0x40 != 0 { 256 } else { 64 * 1024 };
    let bounds = (max_head, max_body);

    let whole = drive(wire, [], bounds);
    let split = drive(wire, pieces.iter().map(|&p| usize::from(p)), bounds);
    assert_eq!(whole, split, "split {pieces:?} changed the outcome");
    if ctl & 0x80 != 0 {
        let bytewise = drive(wire, std::iter::repeat_n(1, wire.len()), bounds);
        assert_eq!(whole, bytewise, "byte-at-a-time changed the outcome");
    }

    if let Outcome::Response {
        head,
        body,
        result: Ok(()),
        ..
    } = &whole
    {
        assert!(head.status >= 200);
        assert!(head
            .headers
            .iter()
            .all(|(n, _)| *n == n.to_ascii_lowercase()));
        let mut watch = Watch::new("gitlab-haproxy-agent/state", 1);
        watch.on_start(now());
        let index = head.header("x-consul-index");
        // A listing is decoded in slices as the client does; any slice size
        // must end (the decoder always moves forward).
        if let Response::Decode(mut d) = watch.on_response(now(), head.status, index, body.clone())
        {
            let mut turns = 0usize;
            let result = loop {
                if let Some(r) = d.step(7) {
                    break r;
                }
                turns += 1;
                assert!(turns <= body.len(), "sliced decode did not finish");
            };
            let _ = watch.on_decoded(now(), result);
        }
    }
});
