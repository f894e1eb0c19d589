//! `kv::decode_list` then `state::Snapshot::build`: never panic, and
//! the snapshot is consistent with the contract it was built by.
//!
//! Input: a response body as consul would send it for `?recurse`.
#![no_main]

use gitlab_haproxy_agent::kv::{decode_list, ListDecoder};
use gitlab_haproxy_agent::contract::parse_value;
use gitlab_haproxy_agent::slice::Slice;
use gitlab_haproxy_agent::state::Snapshot;
use libfuzzer_sys::fuzz_target;

const PREFIX: &str = "gitlab-haproxy-agent/state";

fuzz_target!(|data: &[u8]| {
    // Decoding in slices (as the client does for large listings) gives the
    // one-shot result, whatever the slice size, and always ends.
    let whole = decode_list(data);
    let slice = 1 + data.first().map_or(0, |b| u64::from(*b % 8));
    let mut decoder = ListDecoder::new();
    let mut sliced = Vec::new();
    let mut steps = 0usize;
    let sliced = loop {
        match decoder.step(data, &mut Slice::items(slice), &mut sliced) {
            Ok(true) => break Ok(sliced),
            Ok(false) => {}
            Err(e) => break Err(e),
        }
        steps += 1;
        assert!(steps <= data.len(), "sliced decode did not end");
    };
    assert_eq!(
        whole.is_ok(),
        sliced.is_ok(),
        "one-shot and sliced disagree"
    );
    let Ok(pairs) = whole else {
        return;
    };
    assert_eq!(sliced.as_ref().ok(), Some(&pairs));
    // Values are base64 in the body: never longer than it.
    let decoded: usize = pairs.iter().map(|p| p.key.len() + p.value.len()).sum();
    assert!(decoded <= data.len(), "decoded more than the input");

    for prefix in [PREFIX, ""] {
        let snap = Snapshot::build(prefix, 42, pairs.clone());
        assert_eq!(snap.index(), 42);
        // Duplicate identities collapse, so at most one slot per pair.
        assert!(snap.len() + snap.invalid().len() <= pairs.len());
        assert!(snap.len() + snap.invalid().len() >= pairs.len().min(1));
        for (identity, entry) in snap.entries() {
            assert_eq!(snap.reply(identity.as_bytes()), entry.desired.reply());
            assert_eq!(snap.get(identity.as_bytes()), Some(entry));
            // The last pair for this identity decided, and it was valid.
            let key = if prefix.is_empty() {
                identity.to_owned()
            } else {
                format!("{prefix}/{identity}")
            };
            let last = pairs.iter().rev().find(|p| p.key == key).expect("no pair");
            assert_eq!(parse_value(&last.value), Ok(entry.desired));
            assert_eq!(last.modify_index, entry.modify_index);
        }
        for bad in snap.invalid() {
            assert!(bad.value.len() <= 128, "shown value not cut");
        }
        assert!(snap.changes_from(&snap).is_empty());
        let empty = Snapshot::build(prefix, 0, Vec::new());
        assert_eq!(snap.changes_from(&empty).len(), snap.len());
        assert_eq!(empty.changes_from(&snap).len(), snap.len());
    }
});
