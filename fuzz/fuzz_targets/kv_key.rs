//! `contract::parse_identity` against a reference written straight from the
//! KV contract (README), and the same rule seen through `Snapshot::build`'s prefix
//! stripping, and the contract's reason for the rule: a key is kept exactly when
//! an agent-send line can ask for it.
//!
//! Input: byte 0 picks the prefix; the rest (lossily made UTF-8, as consul
//! keys are strings) is the key suffix below `prefix/`.
#![no_main]

use gitlab_haproxy_agent::agent::request::{self, Request};
use gitlab_haproxy_agent::kv::KvPair;
use gitlab_haproxy_agent::contract::parse_identity;
use gitlab_haproxy_agent::state::{InvalidReason, Snapshot};
use libfuzzer_sys::fuzz_target;

const PREFIXES: [&str; 3] = ["gitlab-haproxy-agent/state", "p", ""];

/// The KV contract: empty, ending in `/`, starting or ending with ASCII whitespace,
/// or holding a control byte (incl. CR, LF, DEL) -> never asked for.
fn reference(suffix: &str) -> bool {
    let b = suffix.as_bytes();
    let space = |c: u8| matches!(c, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ');
    !b.is_empty()
        && b[b.len() - 1] != b'/'
        && !space(b[0])
        && !space(b[b.len() - 1])
        && b.iter().all(|&c| c >= 0x20 && c != 0x7f)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let prefix = PREFIXES[usize::from(first) % PREFIXES.len()];
    let suffix = String::from_utf8_lossy(rest);
    let suffix = suffix.as_ref();

    let got = parse_identity(suffix);
    assert_eq!(got.is_some(), reference(suffix), "{suffix:?}");
    if let Some(id) = got {
        assert_eq!(id, suffix);
    }

    // Kept exactly when the request line parser would hand the same bytes
    // back as the identity (the `/` rule aside: `a/` is askable, but it is
    // a consul folder, not a server).
    let mut line = suffix.as_bytes().to_vec();
    line.push(b'\n');
    let askable = request::parse(&line, usize::MAX) == Request::Identity(suffix.as_bytes());
    assert_eq!(
        got.is_some(),
        askable && !suffix.ends_with('/'),
        "{suffix:?}"
    );

    // The same rule through the snapshot, under a prefix.
    let key = if prefix.is_empty() {
        suffix.to_owned()
    } else {
        format!("{prefix}/{suffix}")
    };
    let pair = KvPair {
        key: key.clone(),
        value: b"drain".to_vec(),
        modify_index: 7,
        flags: 0,
    };
    let snap = Snapshot::build(prefix, 1, vec![pair]);
    assert_eq!(snap.get(suffix.as_bytes()).is_some(), got.is_some());
    assert_eq!(snap.len() + snap.invalid().len(), 1);
    if got.is_none() {
        assert_eq!(snap.invalid()[0].reason, InvalidReason::BadKey);
        assert_eq!(snap.invalid()[0].key, key);
    }

    // A key outside the prefix is never an identity.
    if !prefix.is_empty() {
        let outside = format!("{prefix}x/{suffix}");
        let snap = Snapshot::build(
            prefix,
            1,
            vec![KvPair {
                key: outside,
                value: b"drain".to_vec(),
                modify_index: 7,
                flags: 0,
            }],
        );
        assert!(snap.is_empty());
        assert_eq!(snap.invalid()[0].reason, InvalidReason::BadKey);
    }
});
