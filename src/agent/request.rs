//! The agent-check request line (SPEC §3), pure.
//!
//! In: the bytes received so far on one connection. Out: the identity, a need
//! for more bytes, or the reason to close without a reply. Always holds: the
//! result depends only on the bytes up to the first `\n` (or on all of them
//! when there is none yet), and the identity is a sub-slice of the input.

/// Why a request line gets no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// The line (without its `\n`) is longer than `max_line_bytes`, or the
    /// buffer holds more than that and no `\n` yet.
    TooLong,
    /// A control byte (NUL, CR other than one trailing, DEL, ...) in the line.
    ControlByte,
    /// Nothing left after stripping `\r` and trimming spaces and tabs.
    Empty,
}

/// Result of looking at the bytes received so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// A complete, valid line: the identity, matched byte for byte.
    Identity(&'a [u8]),
    /// No `\n` yet and still within the length limit: read more.
    Partial,
    Reject(Reject),
}

/// Parses the request per SPEC §3, in this order: take everything up to the
/// first `\n`; the line must be at most `max_line_bytes`; strip one trailing
/// `\r`; trim surrounding spaces and tabs; the rest must be non-empty and free
/// of control bytes (< 0x20 and 0x7f).
pub fn parse(buf: &[u8], max_line_bytes: usize) -> Request<'_> {
    todo!("{buf:?} {max_line_bytes}")
}
