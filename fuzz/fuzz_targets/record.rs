//! `contract::record::decode`, `status`'s reading of a writer's record
//! from KV (anyone may `consul kv put` any bytes there): never panic; a
//! record read back is written again within 4 KiB when its free text is
//! within the writers' bounds, and reads back the same but for the cut
//! command line; `check_text` never panics and refuses every control
//! character and bidi override; `parse_until` (`-until TIME`) never panics
//! and gives only an expiry the agent reads as one.
//!
//! Input: a record's bytes.
#![no_main]

use gitlab_haproxy_agent::contract::expiry::{of_flags, parse_until};
use gitlab_haproxy_agent::cli::write::recorder::check_text;
use gitlab_haproxy_agent::contract::record::{decode, MAX_RECORD, MAX_TEXT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if check_text("reason", text).is_ok() {
            assert!(text.len() <= MAX_TEXT);
            assert!(!text.chars().any(|c| c.is_control()));
        }
        if let Ok(until) = parse_until(text) {
            assert_eq!(
                of_flags(u64::from(until)),
                until
            );
        }
    }
    let Ok(r) = decode(data) else {
        return;
    };
    let bounded = r.by.len() <= MAX_TEXT
        && r.reason.as_ref().is_none_or(|x| x.len() <= MAX_TEXT)
        && r.value.len() <= 16;
    if bounded {
        let again = r.encode();
        assert!(again.len() <= MAX_RECORD, "{}", again.len());
        let back = decode(again.as_bytes()).expect("a record written reads back");
        assert_eq!((&back.by, &back.reason, back.until), (&r.by, &r.reason, r.until));
    }
});
