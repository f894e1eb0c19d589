//! The consul client (`consul::client::Client`) answered by a scripted peer
//! (`consul::memstream`) on a virtual clock: whatever bytes consul sends, in
//! whatever pieces, followed by whatever ending, the client must never
//! panic, must come to exactly one outcome (a state, "unchanged", an index
//! reset, or a counted error) within its deadline, and that outcome, and
//! whether the connection is kept, must not depend on how the bytes were
//! split.
//!
//! Input: byte 0 is the control byte: bits 0-2 = how many piece lengths
//! follow (0-7, one byte each, 0 meaning an empty read), bits 3-5 pick the
//! body bound, bits 6-7 the ending (nothing more, FIN, RST, a stray byte).
//! Then the piece lengths, then the bytes consul sends (at most 64 KiB, so
//! the client's wire bound, at least 64 KiB past twice the body bound, is
//! never what decides).
#![no_main]

use gitlab_haproxy_agent::consul::memstream::{answer_once as run, Act};
use libfuzzer_sys::fuzz_target;

const BODY_BOUNDS: [usize; 8] = [0, 1, 5, 64, 2048, 4096, 1 << 20, usize::MAX];
const MAX_WIRE: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let npieces = usize::from(ctl & 7).min(rest.len());
    let (pieces, wire) = rest.split_at(npieces);
    if wire.len() > MAX_WIRE {
        return;
    }
    let max_body = BODY_BOUNDS[usize::from(ctl >> 3 & 7)];
    let ending = match ctl >> 6 {
        0 => Act::Pause,
        1 => Act::Fin,
        2 => Act::Reset,
        _ => Act::Data(b"x".to_vec()),
    };
    let pieces: Vec<usize> = pieces.iter().map(|&p| usize::from(p)).collect();

    let whole = run(wire, &[], &ending, max_body);
    let split = run(wire, &pieces, &ending, max_body);
    assert_eq!(whole, split, "split {pieces:?} changed the outcome");
    if wire.len() <= 512 {
        let bytewise = run(wire, &vec![1; wire.len()], &ending, max_body);
        assert_eq!(whole, bytewise, "byte-at-a-time changed the outcome");
    }
});
