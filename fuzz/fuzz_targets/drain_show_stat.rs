//! `drain::stat::StatReader`: haproxy's `show stat` answer, as a stats
//! socket (or anything listening there) sends it.
//!
//! Input: byte 0 picks the slice size the answer is fed in (1..=64); the
//! rest is the answer. Checks: never panics; fed whole or in slices it
//! reads the same (result and servers); it keeps only servers asked for;
//! once done, it reads no more.
#![no_main]

use std::collections::HashSet;

use gitlab_haproxy_agent::drain::stat::{ServerKey, StatReader};
use libfuzzer_sys::fuzz_target;

fn wanted() -> HashSet<ServerKey> {
    [("app", "s1"), ("app", "s.2"), ("be", "")]
        .into_iter()
        .map(|(b, s)| (b.to_owned(), s.to_owned()))
        .collect()
}

fn read(data: &[u8], slice: usize) -> Result<Vec<(ServerKey, u64, u64, String)>, String> {
    let mut r = StatReader::new(wanted());
    for part in data.chunks(slice) {
        if r.feed(part)? {
            assert_eq!(r.feed(b"app,s1,1,1,UP\n"), Ok(true), "read past the end");
            break;
        }
    }
    let mut got: Vec<_> = r
        .finish()?
        .into_iter()
        .map(|(k, s)| (k, s.sessions, s.queued, s.status))
        .collect();
    got.sort();
    Ok(got)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, answer)) = data.split_first() else {
        return;
    };
    let slice = 1 + usize::from(first % 64);
    let whole = read(answer, answer.len().max(1));
    let sliced = read(answer, slice);
    assert_eq!(whole, sliced, "slices change the reading");
    if let Ok(servers) = whole {
        let wanted = wanted();
        assert!(servers.iter().all(|(k, ..)| wanted.contains(k)));
    }
});
