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

use std::time::{Duration, Instant};

use gitlab_haproxy_agent::consul::client::Client;
use gitlab_haproxy_agent::consul::memstream::{config, pump, Act, MemConnector, MemStream};
use gitlab_haproxy_agent::consul::watch::{ErrorReason, Update};
use libfuzzer_sys::fuzz_target;

const BODY_BOUNDS: [usize; 8] = [0, 1, 5, 64, 2048, 4096, 1 << 20, usize::MAX];
const MAX_WIRE: usize = 64 * 1024;

/// Everything the loop would act on.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Swap { index: u64, keys: usize, invalid: usize },
    Unchanged,
    Reset { from: u64, to: u64 },
    Failed(ErrorReason),
}

/// One run: the wire in `pieces` (a pause between each), then `ending`.
fn run(wire: &[u8], pieces: &[usize], ending: &Act, max_body: usize) -> (Outcome, bool) {
    let mut script = Vec::new();
    let mut at = 0;
    for &len in pieces {
        let end = (at + len).min(wire.len());
        script.push(Act::Data(wire[at..end].to_vec()));
        script.push(Act::Pause);
        at = end;
    }
    script.push(Act::Data(wire[at..].to_vec()));
    script.push(ending.clone());
    let peer = MemStream::answering([script]);
    let connector = MemConnector {
        peers: [peer.clone()].into(),
        connects: 0,
    };
    let mut client = Client::new(&config(max_body), connector, "gitlab-haproxy-agent/state", 1);
    let t0 = Instant::now();
    let mut now = t0;
    let update = pump(
        &mut client,
        &mut now,
        Duration::from_secs(60),
        Duration::from_millis(1),
    )
    .expect("an outcome within the response deadline");
    // 1 s × 17/16 + 5 s, and the turns it took to get there.
    assert!(now - t0 < Duration::from_secs(8), "took {:?}", now - t0);
    let outcome = match update {
        Update::Swap(s) => Outcome::Swap {
            index: s.index(),
            keys: s.len(),
            invalid: s.invalid().len(),
        },
        Update::Unchanged => Outcome::Unchanged,
        Update::Reset { from, to } => Outcome::Reset { from, to },
        Update::Failed(f) => Outcome::Failed(f.reason),
    };
    // Let the client see the rest of the script (a decode finishes first).
    let mut out = Vec::new();
    for _ in 0..pieces.len() + 4 {
        client.on_event(now, &mut out);
    }
    assert!(out.is_empty(), "a second outcome: {out:?}");
    assert_eq!(peer.requests(), 1);
    (outcome, client.wants().is_some())
}

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
