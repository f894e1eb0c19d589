//! Incremental body decoding: `Content-Length`, chunked, close-delimited.

use super::Framing;

/// Why a body cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Bad chunk size line, missing CRLF after chunk data, bad trailer.
    BadChunk,
    /// Decoded body would pass the caller's bound.
    TooLarge,
    /// The peer closed before the body was complete.
    Truncated,
}

/// Longest chunk size line accepted (size, extensions, CRLF).
pub const MAX_CHUNK_LINE: usize = 1024;
/// Most trailer bytes accepted after the last chunk (including the final
/// empty line).
pub const MAX_TRAILER_BYTES: usize = 8 * 1024;

/// Decodes one message body fed in arbitrary pieces.
///
/// Lifecycle: `Length` / `Close` carry the whole body; chunked bodies cycle
/// `SizeLine -> Data -> DataEnd -> SizeLine` until a zero size, then
/// `Trailers -> Done`. Any error is sticky (`Failed`). The state is a few
/// integers: nothing is buffered, so the output never depends on where the
/// input was split.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    state: State,
    /// Decoded body bytes so far.
    decoded: u64,
    max_body: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length {
        remaining: u64,
    },
    Close,
    SizeLine(SizeLine),
    Data {
        remaining: u64,
    },
    /// The CRLF after chunk data; `cr` once the CR was seen.
    DataEnd {
        cr: bool,
    },
    Trailers(Trailers),
    Done,
    Failed(BodyError),
}

/// A chunk size line read so far: `hex [BWS] [; ext...] CRLF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct SizeLine {
    size: u64,
    digits: usize,
    phase: LinePhase,
    /// Bytes of the line seen so far.
    len: usize,
    cr: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum LinePhase {
    #[default]
    Digits,
    /// Whitespace after the size: only more whitespace, `;` or CR may follow.
    Bws,
    /// After `;`: extensions, ignored.
    Ext,
}

/// Trailer lines read so far (validated loosely, then dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Trailers {
    total: usize,
    line_len: usize,
    colon: bool,
    cr: bool,
}

fn is_ctl(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

impl BodyDecoder {
    /// `max_body` bounds the decoded body (excess is `TooLarge`, reported as
    /// soon as it is known: a `Content-Length` past the bound fails at once).
    pub fn new(framing: Framing, max_body: usize) -> BodyDecoder {
        let max_body = u64::try_from(max_body).unwrap_or(u64::MAX);
        let state = match framing {
            Framing::Length(n) if n > max_body => State::Failed(BodyError::TooLarge),
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length { remaining: n },
            Framing::Chunked => State::SizeLine(SizeLine::default()),
            Framing::Close => State::Close,
        };
        BodyDecoder {
            state,
            decoded: 0,
            max_body,
        }
    }

    /// Feeds bytes that follow the head. Appends decoded body bytes to `out`
    /// and returns how many input bytes were consumed; bytes after the end of
    /// the body are not consumed (they belong to the next message). Chunk
    /// extensions are ignored; trailers are read and dropped.
    ///
    /// A `Content-Length` past the bound fails on the first call, even with
    /// empty input. After an error every call returns the same error.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, BodyError> {
        match self.run(input, out) {
            Ok(n) => Ok(n),
            Err(e) => {
                self.state = State::Failed(e);
                Err(e)
            }
        }
    }

    fn run(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, BodyError> {
        let mut i = 0;
        loop {
            let rest = &input[i..];
            match self.state {
                State::Failed(e) => return Err(e),
                State::Done => return Ok(i),
                _ if rest.is_empty() => return Ok(i),
                State::Close => {
                    self.take(rest, out)?;
                    return Ok(input.len());
                }
                State::Length { remaining } | State::Data { remaining } => {
                    let n = usize::try_from(remaining).map_or(rest.len(), |r| r.min(rest.len()));
                    // Lengths were checked against the bound when announced;
                    // `take` checks again, cheaply.
                    self.take(&rest[..n], out)?;
                    i += n;
                    let remaining = remaining - n as u64;
                    self.state = match self.state {
                        State::Length { .. } if remaining == 0 => State::Done,
                        State::Length { .. } => State::Length { remaining },
                        _ if remaining == 0 => State::DataEnd { cr: false },
                        _ => State::Data { remaining },
                    };
                }
                State::SizeLine(line) => {
                    self.state = self.size_byte(line, rest[0])?;
                    i += 1;
                }
                State::DataEnd { cr } => {
                    self.state = match (cr, rest[0]) {
                        (false, b'\r') => State::DataEnd { cr: true },
                        (true, b'\n') => State::SizeLine(SizeLine::default()),
                        _ => return Err(BodyError::BadChunk),
                    };
                    i += 1;
                }
                State::Trailers(t) => {
                    self.state = trailer_byte(t, rest[0])?;
                    i += 1;
                }
            }
        }
    }

    /// True once the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The peer closed: completes a close-delimited body, else `Truncated`
    /// (unless already done). An earlier error is returned again.
    pub fn eof(&mut self) -> Result<(), BodyError> {
        match self.state {
            State::Done => Ok(()),
            State::Close => {
                self.state = State::Done;
                Ok(())
            }
            State::Failed(e) => Err(e),
            _ => {
                self.state = State::Failed(BodyError::Truncated);
                Err(BodyError::Truncated)
            }
        }
    }

    /// Appends body bytes, enforcing the bound.
    fn take(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), BodyError> {
        let total = self.decoded.saturating_add(bytes.len() as u64);
        if total > self.max_body {
            return Err(BodyError::TooLarge);
        }
        self.decoded = total;
        out.extend_from_slice(bytes);
        Ok(())
    }

    fn size_byte(&self, mut line: SizeLine, b: u8) -> Result<State, BodyError> {
        line.len += 1;
        if line.len > MAX_CHUNK_LINE {
            return Err(BodyError::BadChunk);
        }
        if line.cr {
            if b != b'\n' {
                return Err(BodyError::BadChunk);
            }
            if line.size == 0 {
                return Ok(State::Trailers(Trailers::default()));
            }
            // Known as soon as the size is: fail before reading the data.
            if line.size > self.max_body - self.decoded {
                return Err(BodyError::TooLarge);
            }
            return Ok(State::Data {
                remaining: line.size,
            });
        }
        match (line.phase, b) {
            (LinePhase::Digits, _) if b.is_ascii_hexdigit() => {
                let digit = (b as char).to_digit(16).unwrap_or(0);
                line.size = line
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(u64::from(digit)))
                    .ok_or(BodyError::BadChunk)?;
                line.digits += 1;
            }
            // Everything after the size needs a size first.
            _ if line.digits == 0 => return Err(BodyError::BadChunk),
            (_, b'\r') => line.cr = true,
            (LinePhase::Digits | LinePhase::Bws, b' ' | b'\t') => line.phase = LinePhase::Bws,
            (LinePhase::Digits | LinePhase::Bws, b';') => line.phase = LinePhase::Ext,
            (LinePhase::Ext, _) if !is_ctl(b) => {}
            _ => return Err(BodyError::BadChunk),
        }
        Ok(State::SizeLine(line))
    }
}

fn trailer_byte(mut t: Trailers, b: u8) -> Result<State, BodyError> {
    t.total += 1;
    if t.total > MAX_TRAILER_BYTES {
        return Err(BodyError::BadChunk);
    }
    if t.cr {
        if b != b'\n' {
            return Err(BodyError::BadChunk);
        }
        if t.line_len == 0 {
            return Ok(State::Done);
        }
        return Ok(State::Trailers(Trailers {
            total: t.total,
            ..Trailers::default()
        }));
    }
    match b {
        // A trailer line must be `name: value`; the empty line ends them.
        b'\r' if t.line_len == 0 || t.colon => {
            t.cr = true;
            return Ok(State::Trailers(t));
        }
        // Leading whitespace would be obs-fold.
        b' ' | b'\t' if t.line_len == 0 => return Err(BodyError::BadChunk),
        b':' if t.line_len > 0 => t.colon = true,
        _ if is_ctl(b) => return Err(BodyError::BadChunk),
        _ => {}
    }
    t.line_len += 1;
    Ok(State::Trailers(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    /// Feeds `input` in the given pieces the way a connection would: bytes
    /// not consumed stay pending and are fed again with the next piece.
    /// Returns the decoded body, the result, and the bytes left unconsumed.
    fn decode_pieces(
        framing: Framing,
        max: usize,
        input: &[u8],
        cuts: &[usize],
    ) -> (Vec<u8>, Result<(), BodyError>, Vec<u8>) {
        let mut d = BodyDecoder::new(framing, max);
        let mut out = Vec::new();
        let mut pending = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain(std::iter::once(&input.len())) {
            pending.extend_from_slice(&input[start..end]);
            start = end;
            match d.feed(&pending, &mut out) {
                Ok(n) => {
                    pending.drain(..n);
                }
                Err(e) => return (out, Err(e), pending),
            }
        }
        let r = if d.is_done() { Ok(()) } else { d.eof() };
        (out, r, pending)
    }

    fn decode(framing: Framing, input: &[u8]) -> (Vec<u8>, Result<(), BodyError>, Vec<u8>) {
        decode_pieces(framing, MAX, input, &[])
    }

    fn chunked_err(input: &[u8]) -> Option<BodyError> {
        let mut d = BodyDecoder::new(Framing::Chunked, MAX);
        d.feed(input, &mut Vec::new()).err()
    }

    /// A consul-sized JSON body (> 2048 bytes, so consul would chunk it).
    fn big_json() -> Vec<u8> {
        let mut s = String::from("[");
        for i in 0..40 {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&format!(
                r#"{{"LockIndex":0,"Key":"gitlab/haproxy/web-{i:02}","Flags":0,"Value":"cmVhZHk=","CreateIndex":{i},"ModifyIndex":{}}}"#,
                100 + i
            ));
        }
        s.push(']');
        s.into_bytes()
    }

    fn one_chunk(body: &[u8]) -> Vec<u8> {
        let mut v = format!("{:x}\r\n", body.len()).into_bytes();
        v.extend_from_slice(body);
        v.extend_from_slice(b"\r\n0\r\n\r\n");
        v
    }

    #[test]
    fn content_length_body() {
        let (out, r, rest) = decode(Framing::Length(5), b"ready");
        assert_eq!(
            (out.as_slice(), r, rest.as_slice()),
            (&b"ready"[..], Ok(()), &b""[..])
        );
    }

    #[test]
    fn content_length_leaves_pipelined_bytes() {
        let mut d = BodyDecoder::new(Framing::Length(5), MAX);
        let mut out = Vec::new();
        assert_eq!(d.feed(b"rea", &mut out), Ok(3));
        assert!(!d.is_done());
        assert_eq!(d.feed(b"dyHTTP/1.1 200 OK\r\n", &mut out), Ok(2));
        assert!(d.is_done());
        assert_eq!(out, b"ready");
        // Once done, nothing more is consumed.
        assert_eq!(d.feed(b"more", &mut out), Ok(0));
        assert_eq!(out, b"ready");
        assert_eq!(d.eof(), Ok(()));
    }

    #[test]
    fn zero_length_is_done_at_once() {
        let mut d = BodyDecoder::new(Framing::Length(0), MAX);
        assert!(d.is_done());
        let mut out = Vec::new();
        assert_eq!(d.feed(b"HTTP/1.1 200 OK", &mut out), Ok(0));
        assert!(out.is_empty());
        assert_eq!(d.eof(), Ok(()));
        // Even a bound of zero admits an empty body.
        assert!(BodyDecoder::new(Framing::Length(0), 0).is_done());
    }

    #[test]
    fn content_length_too_large_fails_at_once() {
        let mut d = BodyDecoder::new(Framing::Length(101), 100);
        assert!(!d.is_done());
        assert_eq!(d.feed(b"", &mut Vec::new()), Err(BodyError::TooLarge));
        assert_eq!(d.feed(b"abc", &mut Vec::new()), Err(BodyError::TooLarge));
        assert_eq!(d.eof(), Err(BodyError::TooLarge));
        // Exactly the bound is fine.
        let body = vec![b'x'; 100];
        let (out, r, _) = decode_pieces(Framing::Length(100), 100, &body, &[]);
        assert_eq!((out.len(), r), (100, Ok(())));
        let mut d = BodyDecoder::new(Framing::Length(u64::MAX), usize::MAX);
        assert_eq!(d.feed(b"abc", &mut Vec::new()), Ok(3));
    }

    #[test]
    fn content_length_truncated() {
        let mut d = BodyDecoder::new(Framing::Length(10), MAX);
        assert_eq!(d.feed(b"abc", &mut Vec::new()), Ok(3));
        assert_eq!(d.eof(), Err(BodyError::Truncated));
        assert_eq!(
            d.feed(b"defghij", &mut Vec::new()),
            Err(BodyError::Truncated)
        );
    }

    #[test]
    fn consul_chunked_body_over_2k() {
        let body = big_json();
        assert!(body.len() > 2048);
        let (out, r, rest) = decode(Framing::Chunked, &one_chunk(&body));
        assert_eq!(r, Ok(()));
        assert_eq!(out, body);
        assert!(rest.is_empty());
    }

    /// Several chunks, upper and lower case hex, an extension, whitespace
    /// before it, and trailers.
    fn multi_chunk_wire() -> (Vec<u8>, Vec<u8>) {
        let wire = b"4\r\nWiki\r\n6;name=\"v a l\"\r\npedia \r\nE \t; x\r\nin \r\n\r\nchunks.\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n000\r\nX-Trailer: 1\r\nX-Other:two\r\n\r\n";
        let body = b"Wikipedia in \r\n\r\nchunks.abcdefghijklmnopqrstuvwxyz";
        (wire.to_vec(), body.to_vec())
    }

    #[test]
    fn every_split_point_gives_the_same_result() {
        let (wire, body) = multi_chunk_wire();
        let mut pipelined = wire.clone();
        pipelined.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        for cut in 0..=pipelined.len() {
            let (out, r, rest) = decode_pieces(Framing::Chunked, MAX, &pipelined, &[cut]);
            assert_eq!(r, Ok(()), "cut at {cut}");
            assert_eq!(out, body, "cut at {cut}");
            assert_eq!(rest, b"HTTP/1.1 200 OK\r\n", "cut at {cut}");
        }
        // Every pair of split points, too.
        for a in 0..=wire.len() {
            for b in a..=wire.len() {
                let (out, r, rest) = decode_pieces(Framing::Chunked, MAX, &wire, &[a, b]);
                assert_eq!(
                    (r, out.as_slice(), rest.len()),
                    (Ok(()), body.as_slice(), 0),
                    "cuts at {a},{b}"
                );
            }
        }
    }

    #[test]
    fn every_split_point_of_a_consul_sized_body() {
        let body = big_json();
        let wire = one_chunk(&body);
        for cut in 0..=wire.len() {
            let (out, r, rest) = decode_pieces(Framing::Chunked, MAX, &wire, &[cut]);
            assert!(
                r == Ok(()) && out == body && rest.is_empty(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn byte_at_a_time() {
        let (wire, body) = multi_chunk_wire();
        let cuts: Vec<usize> = (1..wire.len()).collect();
        let (out, r, rest) = decode_pieces(Framing::Chunked, MAX, &wire, &cuts);
        assert_eq!((out, r, rest.len()), (body, Ok(()), 0));
        let cuts: Vec<usize> = (1..5).collect();
        let (out, r, _) = decode_pieces(Framing::Length(5), MAX, b"ready", &cuts);
        assert_eq!((out.as_slice(), r), (&b"ready"[..], Ok(())));
    }

    #[test]
    fn chunked_leaves_pipelined_bytes() {
        let mut d = BodyDecoder::new(Framing::Chunked, MAX);
        let mut out = Vec::new();
        let wire = b"5\r\nready\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n";
        assert_eq!(d.feed(wire, &mut out), Ok(wire.len() - 17));
        assert!(d.is_done());
        assert_eq!(out, b"ready");
    }

    #[test]
    fn bad_chunk_framing() {
        let cases: &[&[u8]] = &[
            b"zz\r\n",
            b"\r\n",
            b";ext\r\n",
            b" 5\r\nhello\r\n",
            b"-5\r\nhello\r\n",
            b"0x5\r\nhello\r\n",
            b"5 x\r\nhello\r\n",
            b"5\nhello\r\n",
            b"5\rXhello\r\n",
            b"5\r\r\nhello\r\n",
            b"5;a\x00b\r\nhello\r\n",
            b"5\r\nhelloXX",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\rX",
            b"5\r\nhello0\r\n\r\n",
            b"10000000000000000\r\n",
            b"0\r\n\n",
            b"0\r\nX-T: 1\n\r\n",
            b"0\r\n folded: x\r\n\r\n",
            b"0\r\nno-colon\r\n\r\n",
            b"0\r\n: no-name\r\n\r\n",
            b"0\r\nX-T: a\x01b\r\n\r\n",
        ];
        for case in cases {
            assert_eq!(
                chunked_err(case),
                Some(BodyError::BadChunk),
                "{:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    #[test]
    fn chunk_size_line_is_bounded() {
        let mut line = b"5;".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_CHUNK_LINE - 4));
        line.extend_from_slice(b"\r\n");
        assert_eq!(line.len(), MAX_CHUNK_LINE);
        let mut ok = line.clone();
        ok.extend_from_slice(b"hello\r\n0\r\n\r\n");
        assert_eq!(decode(Framing::Chunked, &ok).1, Ok(()));
        let mut long = b"5;a".to_vec();
        long.extend_from_slice(&line[2..]);
        assert_eq!(chunked_err(&long), Some(BodyError::BadChunk));
        // Fails without waiting for the end of the line.
        assert_eq!(
            chunked_err(&vec![b'0'; MAX_CHUNK_LINE + 1]),
            Some(BodyError::BadChunk)
        );
    }

    #[test]
    fn trailers_are_read_and_dropped() {
        let wire = b"5\r\nready\r\n0\r\nX-Consul-Index: 42\r\nX-Other: a b\r\n\r\nNEXT";
        let (out, r, rest) = decode(Framing::Chunked, wire);
        assert_eq!(
            (out.as_slice(), r, rest.as_slice()),
            (&b"ready"[..], Ok(()), &b"NEXT"[..])
        );
    }

    #[test]
    fn trailers_are_bounded() {
        let mut wire = b"0\r\n".to_vec();
        while wire.len() < MAX_TRAILER_BYTES + 100 {
            wire.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        wire.extend_from_slice(b"\r\n");
        assert_eq!(chunked_err(&wire), Some(BodyError::BadChunk));
    }

    #[test]
    fn chunked_too_large() {
        // A chunk size past the bound fails before its data arrives.
        let mut d = BodyDecoder::new(Framing::Chunked, 100);
        assert_eq!(d.feed(b"65\r\n", &mut Vec::new()), Err(BodyError::TooLarge));
        // The sum of chunks past the bound.
        let mut d = BodyDecoder::new(Framing::Chunked, 100);
        let mut out = Vec::new();
        let chunk = [b"32\r\n".as_slice(), &[b'x'; 50], b"\r\n"].concat();
        assert_eq!(d.feed(&chunk, &mut out), Ok(chunk.len()));
        assert_eq!(d.feed(&chunk, &mut out), Ok(chunk.len()));
        assert_eq!(d.feed(b"1\r\n", &mut out), Err(BodyError::TooLarge));
        assert_eq!(out.len(), 100);
        assert_eq!(d.feed(b"0\r\n\r\n", &mut out), Err(BodyError::TooLarge));
        // Exactly the bound is fine; the largest size that fits u64 is only
        // too large, not malformed.
        let body = vec![b'y'; 100];
        let (out, r, _) = decode_pieces(Framing::Chunked, 100, &one_chunk(&body), &[]);
        assert_eq!((out.len(), r), (100, Ok(())));
        assert_eq!(
            BodyDecoder::new(Framing::Chunked, MAX).feed(b"ffffffffffffffff\r\n", &mut Vec::new()),
            Err(BodyError::TooLarge)
        );
    }

    #[test]
    fn chunked_truncated() {
        for wire in [
            &b""[..],
            b"5",
            b"5\r",
            b"5\r\n",
            b"5\r\nrea",
            b"5\r\nready",
            b"5\r\nready\r",
            b"5\r\nready\r\n",
            b"5\r\nready\r\n0\r\n",
            b"5\r\nready\r\n0\r\nX-T: 1\r\n",
        ] {
            let mut d = BodyDecoder::new(Framing::Chunked, MAX);
            assert_eq!(d.feed(wire, &mut Vec::new()), Ok(wire.len()));
            assert!(!d.is_done());
            assert_eq!(
                d.eof(),
                Err(BodyError::Truncated),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn close_delimited_body() {
        let mut d = BodyDecoder::new(Framing::Close, MAX);
        let mut out = Vec::new();
        assert_eq!(d.feed(b"[{\"Key\":", &mut out), Ok(8));
        assert_eq!(d.feed(b"\"a\"}]", &mut out), Ok(5));
        assert!(!d.is_done());
        assert_eq!(d.eof(), Ok(()));
        assert!(d.is_done());
        assert_eq!(out, b"[{\"Key\":\"a\"}]");
        // An empty close-delimited body is fine too.
        assert_eq!(BodyDecoder::new(Framing::Close, MAX).eof(), Ok(()));
    }

    #[test]
    fn close_delimited_too_large() {
        let mut d = BodyDecoder::new(Framing::Close, 10);
        let mut out = Vec::new();
        assert_eq!(d.feed(b"0123456789", &mut out), Ok(10));
        assert_eq!(d.feed(b"x", &mut out), Err(BodyError::TooLarge));
        assert_eq!(d.eof(), Err(BodyError::TooLarge));
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn errors_are_sticky() {
        let mut d = BodyDecoder::new(Framing::Chunked, MAX);
        assert_eq!(d.feed(b"zz", &mut Vec::new()), Err(BodyError::BadChunk));
        assert_eq!(
            d.feed(b"5\r\nready\r\n0\r\n\r\n", &mut Vec::new()),
            Err(BodyError::BadChunk)
        );
        assert_eq!(d.eof(), Err(BodyError::BadChunk));
        assert!(!d.is_done());
    }
}
