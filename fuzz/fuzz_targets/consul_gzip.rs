//! The consul client (`consul::client::Client`) reading gzip bodies from a
//! scripted peer (`consul::memstream`): whatever the body, in whatever
//! pieces, the client must never panic and must come to one outcome that
//! does not depend on the split; and a body gzipped must come to the same
//! outcome as the same body sent as it is (same bound, same framing: the
//! bound is on the inflated size).
//!
//! Input: byte 0 is the control byte: bits 0-2 = how many piece lengths
//! follow (one byte each), bits 3-4 the framing (Content-Length, chunked in
//! one chunk, chunked in 7-byte chunks, close-delimited), bits 5-6 the body
//! bound, bit 7 raw mode: the rest is sent as the gzip stream itself (so
//! the fuzzer mutates headers, deflate blocks, CRCs, sizes and members),
//! else it is the body, gzipped here. Then the piece lengths, then the
//! bytes (at most 16 KiB).
#![no_main]

use gitlab_haproxy_agent::consul::memstream::{answer_once, Act};
use gitlab_haproxy_agent::http::gzip;
use libfuzzer_sys::fuzz_target;

const BODY_BOUNDS: [usize; 4] = [64, 4096, 1 << 20, usize::MAX];
const MAX_INPUT: usize = 16 * 1024;

/// A 200 at index 9 carrying `body`, framed as `framing` says.
fn wire(framing: u8, coding: &str, body: &[u8]) -> Vec<u8> {
    let mut w = format!("HTTP/1.1 200 OK\r\nX-Consul-Index: 9\r\n{coding}").into_bytes();
    match framing {
        0 => w.extend(format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes()),
        3 => w.extend_from_slice(b"\r\n"),
        _ => w.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n"),
    }
    match framing {
        1 | 2 => {
            let size = if framing == 1 { body.len().max(1) } else { 7 };
            for chunk in body.chunks(size) {
                w.extend(format!("{:x}\r\n", chunk.len()).into_bytes());
                w.extend_from_slice(chunk);
                w.extend_from_slice(b"\r\n");
            }
            w.extend_from_slice(b"0\r\n\r\n");
        }
        _ => w.extend_from_slice(body),
    }
    w
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let npieces = usize::from(ctl & 7).min(rest.len());
    let (pieces, body) = rest.split_at(npieces);
    if body.len() > MAX_INPUT {
        return;
    }
    let framing = ctl >> 3 & 3;
    let max_body = BODY_BOUNDS[usize::from(ctl >> 5 & 3)];
    let raw = ctl & 0x80 != 0;
    let pieces: Vec<usize> = pieces.iter().map(|&p| usize::from(p)).collect();
    let coded = if raw { body.to_vec() } else { gzip(body) };
    let gz = wire(framing, "Content-Encoding: gzip\r\n", &coded);

    let whole = answer_once(&gz, &[], &Act::Fin, max_body);
    let split = answer_once(&gz, &pieces, &Act::Fin, max_body);
    assert_eq!(whole, split, "split {pieces:?} changed the outcome");
    if gz.len() <= 512 {
        let bytewise = answer_once(&gz, &vec![1; gz.len()], &Act::Fin, max_body);
        assert_eq!(whole, bytewise, "byte-at-a-time changed the outcome");
    }
    if !raw {
        let plain = answer_once(&wire(framing, "", body), &[], &Act::Fin, max_body);
        assert_eq!(whole.0, plain.0, "gzipped and plain differ");
    }
});
