//! `devkv::txn::handle`: never panic; a transaction is applied whole at one
//! new index (200) or not at all (anything else).
//!
//! Input: a `PUT /v1/txn` body.
#![no_main]

use std::time::Instant;

use gitlab_haproxy_agent::devkv::store::Store;
use gitlab_haproxy_agent::devkv::txn::handle;
use gitlab_haproxy_agent::http::Framing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut store = Store::new();
    store.put("a", b"drain", 0, None);
    store.put("b", b"50%", 0, None);
    let before = store.clone();
    let index = store.last_index();
    let resp = handle(
        &mut store,
        "",
        Framing::Length(data.len() as u64),
        data,
        Instant::now(),
    );
    match resp.status {
        200 => assert!(store.last_index() <= index + 1, "more than one index"),
        400 | 409 | 413 => {
            assert_eq!(store.last_index(), index);
            assert_eq!(
                store.list("").collect::<Vec<_>>(),
                before.list("").collect::<Vec<_>>(),
                "a refused transaction changed the store"
            );
        }
        s => panic!("status {s}"),
    }
});
