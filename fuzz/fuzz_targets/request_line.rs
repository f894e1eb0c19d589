//! `agent::request::parse` against a reference written straight from the
//! responder protocol (README).
//!
//! Input: byte 0 picks `max_line_bytes` (1..=300, so the 256 default and
//! both sides of every boundary are reached with short inputs); the rest is
//! what the peer sent. Checks: the parser and the reference agree exactly,
//! the identity is a sub-slice of the input, and the result depends only on
//! the bytes up to the first `\n`.
#![no_main]

use gitlab_haproxy_agent::agent::request::{parse, Reject, Request};
use libfuzzer_sys::fuzz_target;

/// The responder protocol's rules, in its order. Never calls the code under test.
fn reference(buf: &[u8], max: usize) -> Request<'_> {
    let mut newline = None;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            newline = Some(i);
            break;
        }
    }
    let Some(newline) = newline else {
        return if buf.len() > max {
            Request::Reject(Reject::TooLong)
        } else {
            Request::Partial
        };
    };
    let mut line = &buf[..newline];
    if line.len() > max {
        return Request::Reject(Reject::TooLong);
    }
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    while let [b' ' | b'\t', rest @ ..] = line {
        line = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = line {
        line = rest;
    }
    if line.is_empty() {
        Request::Reject(Reject::Empty)
    } else if line.iter().any(|&b| b < 0x20 || b == 0x7f) {
        Request::Reject(Reject::ControlByte)
    } else {
        Request::Identity(line)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, buf)) = data.split_first() else {
        return;
    };
    let max = usize::from(first) % 300 + 1;
    let got = parse(buf, max);
    assert_eq!(got, reference(buf, max), "max {max}");

    if let Request::Identity(id) = got {
        let start = id.as_ptr() as usize - buf.as_ptr() as usize;
        assert!(start + id.len() <= buf.len(), "identity outside the input");
    }
    // Bytes after the first line never matter.
    if let Some(nl) = buf.iter().position(|&b| b == b'\n') {
        assert_eq!(parse(&buf[..=nl], max), got, "depends on bytes after \\n");
    }
});
