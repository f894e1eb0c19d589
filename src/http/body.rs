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

/// Decodes one message body fed in arbitrary pieces.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    // private state, implementation's choice
}

impl BodyDecoder {
    /// `max_body` bounds the decoded body (excess is `TooLarge`, reported as
    /// soon as it is known: a `Content-Length` past the bound fails at once).
    pub fn new(framing: Framing, max_body: usize) -> BodyDecoder {
        todo!("{framing:?} {max_body}")
    }

    /// Feeds bytes that follow the head. Appends decoded body bytes to `out`
    /// and returns how many input bytes were consumed; bytes after the end of
    /// the body are not consumed (they belong to the next message). Chunk
    /// extensions are ignored; trailers are read and dropped.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, BodyError> {
        todo!("{input:?} {out:?}")
    }

    /// True once the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        todo!()
    }

    /// The peer closed: completes a close-delimited body, else `Truncated`
    /// (unless already done).
    pub fn eof(&mut self) -> Result<(), BodyError> {
        todo!()
    }
}
