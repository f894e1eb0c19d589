//! `safe`: the one rendering of outside text for a terminal, and
//! `-listen-allow`'s CIDR list.
//!
//! Input: byte 0 picks the function; the rest is the outside text (bytes).
//! Holds: no rendering ever holds a character a terminal would act on or
//! hide (`output` keeps only `\n` and `\t`); text without one comes back
//! unchanged;
//! an error body never holds its secret (a token-like one) and stays printable ASCII; the
//! CIDR parser never panics, and an address parsed alone is allowed.
#![no_main]

use gitlab_haproxy_agent::agent::allow::Allow;
use gitlab_haproxy_agent::safe;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match first % 4 {
        0 => {
            let shown = safe::bytes(rest);
            assert!(!shown.chars().any(safe::hidden), "{shown:?}");
            let shown = safe::text(&text);
            assert!(!shown.chars().any(safe::hidden), "{shown:?}");
            if !text.chars().any(safe::hidden) {
                assert_eq!(shown, text);
            }
        }
        1 => {
            let shown = safe::output(&text);
            let layout = |c: char| c == '\n' || c == '\t';
            assert!(!shown.chars().any(|c| safe::hidden(c) && !layout(c)));
            if !text.chars().any(|c| safe::hidden(c) && !layout(c)) {
                assert_eq!(shown, text);
            }
        }
        2 => {
            let cut = rest.len().min(24);
            let secret = rest[..cut].to_vec();
            let shown = safe::error_body(rest, std::slice::from_ref(&secret));
            assert!(shown.bytes().all(|b| (0x20..0x7f).contains(&b)), "{shown:?}");
            // A token's characters (a UUID's), not one inside the marker
            // itself (`cted` is shown by `<redacted>`), in a body needing
            // no escapes (an escape's `\xff` before `ff...` would spell
            // such a secret out of other bytes).
            let token_like = secret.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-');
            let text = std::str::from_utf8(&secret).unwrap_or("<");
            let plain = rest.iter().all(|b| (0x20..0x7f).contains(b) && *b != b'\\');
            if secret.len() >= 4 && token_like && plain && !"<redacted>".contains(text) {
                assert!(!shown.contains(std::str::from_utf8(&secret).unwrap()), "{shown:?}");
            }
        }
        _ => {
            if let Ok(allow) = Allow::parse(&text) {
                for entry in text.split(',').map(str::trim) {
                    if let Ok(ip) = entry.parse::<std::net::IpAddr>() {
                        assert!(allow.permits(ip), "{entry}");
                    }
                }
            }
        }
    }
});
