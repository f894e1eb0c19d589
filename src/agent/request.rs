//! The agent-check request line, pure.
//!
//! In: the bytes received so far on one connection. Out: the identity, a need
//! for more bytes, or the reason to close without a reply. Always holds: the
//! result depends only on the bytes up to the first `\n` (or on all of them
//! when there is none yet), and the identity is a sub-slice of the input.

use crate::contract::is_control;

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

/// Parses the request line, in this order: take everything up to the
/// first `\n`; the line must be at most `max_line_bytes`; strip one trailing
/// `\r`; trim surrounding spaces and tabs; the rest must be non-empty and free
/// of control bytes (< 0x20 and 0x7f).
pub fn parse(buf: &[u8], max_line_bytes: usize) -> Request<'_> {
    let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > max_line_bytes {
            Request::Reject(Reject::TooLong)
        } else {
            Request::Partial
        };
    };
    let line = &buf[..newline];
    if line.len() > max_line_bytes {
        return Request::Reject(Reject::TooLong);
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let identity = trim_spaces_and_tabs(line);
    if identity.is_empty() {
        Request::Reject(Reject::Empty)
    } else if identity.iter().copied().any(is_control) {
        Request::Reject(Reject::ControlByte)
    } else {
        Request::Identity(identity)
    }
}

fn trim_spaces_and_tabs(line: &[u8]) -> &[u8] {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
    let end = line
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |i| i + 1);
    &line[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 256;

    #[track_caller]
    fn identity(buf: &[u8], want: &[u8]) {
        assert_eq!(
            parse(buf, MAX),
            Request::Identity(want),
            "{:?}",
            String::from_utf8_lossy(buf)
        );
    }

    #[track_caller]
    fn reject(buf: &[u8], want: Reject) {
        assert_eq!(
            parse(buf, MAX),
            Request::Reject(want),
            "{:?}",
            String::from_utf8_lossy(buf)
        );
    }

    /// A line of `len` bytes (without the `\n`) made of `x`, ending in `tail`.
    fn line(len: usize, tail: &[u8]) -> Vec<u8> {
        let mut v = vec![b'x'; len - tail.len()];
        v.extend_from_slice(tail);
        v
    }

    fn with_newline(mut v: Vec<u8>) -> Vec<u8> {
        v.push(b'\n');
        v
    }

    #[test]
    fn plain_identity() {
        identity(b"be_web/srv1\n", b"be_web/srv1");
    }

    #[test]
    fn one_trailing_cr_is_stripped() {
        identity(b"be_web/srv1\r\n", b"be_web/srv1");
        reject(b"be_web/srv1\r\r\n", Reject::ControlByte);
    }

    #[test]
    fn spaces_and_tabs_are_trimmed_inner_ones_kept() {
        identity(b"  be_web/srv1 \t\n", b"be_web/srv1");
        identity(b"\tbe web/srv 1\t\r\n", b"be web/srv 1");
        // Only surrounding tabs are trimmed: an inner one is a control byte.
        reject(b"a\tb\n", Reject::ControlByte);
    }

    #[test]
    fn identity_is_a_sub_slice_of_the_input() {
        let buf = b"  srv\n";
        let Request::Identity(id) = parse(buf, MAX) else {
            panic!("no identity")
        };
        assert!(std::ptr::eq(id.as_ptr(), buf[2..].as_ptr()));
    }

    #[test]
    fn matching_is_byte_for_byte() {
        identity(b"BE_Web/Srv1\n", b"BE_Web/Srv1");
        identity("é/ü\n".as_bytes(), "é/ü".as_bytes());
        identity(b"\xff\xfe\n", b"\xff\xfe");
    }

    #[test]
    fn empty_lines() {
        reject(b"\n", Reject::Empty);
        reject(b"\r\n", Reject::Empty);
        reject(b" \t \r\n", Reject::Empty);
        reject(b"\t\n", Reject::Empty);
    }

    #[test]
    fn control_bytes() {
        reject(b"srv\x001\n", Reject::ControlByte);
        reject(b"srv\r1\n", Reject::ControlByte);
        reject(b"srv1\x7f\n", Reject::ControlByte);
        reject(b"\x1bsrv1\n", Reject::ControlByte);
        reject(b"\0\n", Reject::ControlByte);
        // The CR is not the trailing one once spaces follow it.
        reject(b"srv1\r \n", Reject::ControlByte);
        // A vertical tab or form feed is not trimmed: it is a control byte.
        reject(b"srv1\x0b\n", Reject::ControlByte);
        reject(b"\x0csrv1\n", Reject::ControlByte);
    }

    #[test]
    fn bytes_after_the_first_newline_are_ignored() {
        identity(b"srv1\nsrv2\n", b"srv1");
        identity(b"srv1\n\0\x7f garbage", b"srv1");
        let mut buf = b"srv1\n".to_vec();
        buf.extend(std::iter::repeat_n(b'x', 10_000));
        identity(&buf, b"srv1");
        reject(b"\nsrv1\n", Reject::Empty);
    }

    #[test]
    fn partial_until_newline() {
        assert_eq!(parse(b"", MAX), Request::Partial);
        assert_eq!(parse(b"be_web/srv1", MAX), Request::Partial);
        assert_eq!(parse(b"be_web/srv1\r", MAX), Request::Partial);
        // Control bytes are judged only once the line is complete.
        assert_eq!(parse(b"srv\0", MAX), Request::Partial);
        assert_eq!(parse(&line(MAX, b""), MAX), Request::Partial);
    }

    #[test]
    fn no_newline_past_the_limit_is_too_long() {
        reject(&line(MAX + 1, b""), Reject::TooLong);
        reject(&line(MAX + 1, b"\r"), Reject::TooLong);
        reject(&vec![b'x'; 100_000], Reject::TooLong);
    }

    #[test]
    fn length_boundary() {
        let at_limit = line(MAX, b"");
        identity(&with_newline(line(MAX - 1, b"")), &line(MAX - 1, b""));
        identity(&with_newline(at_limit.clone()), &at_limit);
        reject(&with_newline(line(MAX + 1, b"")), Reject::TooLong);
    }

    #[test]
    fn length_boundary_counts_the_cr() {
        // 256 bytes including the CR: fits, the CR is stripped.
        identity(&with_newline(line(MAX, b"\r")), &line(MAX - 1, b""));
        // 257 bytes ending in CR: the length is checked before stripping.
        reject(&with_newline(line(MAX + 1, b"\r")), Reject::TooLong);
    }

    #[test]
    fn length_boundary_counts_trimmed_blanks() {
        identity(&with_newline(line(MAX, b"   ")), &line(MAX - 3, b""));
        reject(&with_newline(line(MAX + 1, b"   ")), Reject::TooLong);
    }

    #[test]
    fn too_long_wins_over_other_reasons() {
        reject(&with_newline(line(MAX + 1, b"\0")), Reject::TooLong);
        reject(&with_newline(vec![b' '; MAX + 1]), Reject::TooLong);
    }

    #[test]
    fn other_limits() {
        assert_eq!(parse(b"ab\n", 2), Request::Identity(b"ab"));
        assert_eq!(parse(b"abc\n", 2), Request::Reject(Reject::TooLong));
        assert_eq!(parse(b"\n", 0), Request::Reject(Reject::Empty));
        assert_eq!(parse(b"a", 0), Request::Reject(Reject::TooLong));
        assert_eq!(parse(b"", 0), Request::Partial);
    }
}
