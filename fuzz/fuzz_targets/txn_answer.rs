//! `contract::txn::parse_answer`, the writers' reading of consul's answer
//! to `PUT /v1/txn`: never panic; an applied answer names only keys that
//! are in the body.
//!
//! Input: an answer body (the first byte picks the status, 200 or 409).
#![no_main]

use gitlab_haproxy_agent::contract::txn::{parse_answer, TxnAnswer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let status = if pick % 2 == 0 { 200 } else { 409 };
    match parse_answer(status, body) {
        Ok(TxnAnswer::Applied(written)) => {
            assert_eq!(status, 200);
            assert!(written.len() <= body.len());
        }
        Ok(TxnAnswer::Failed(errors)) => {
            assert_eq!(status, 409);
            assert!(errors.iter().all(|(_, what)| what.len() <= body.len()));
        }
        Err(_) => {}
    }
});
