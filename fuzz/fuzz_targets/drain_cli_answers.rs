//! `drain::process`: haproxy's `show info`, the master CLI's `show proc`
//! and `show servers state` answers (read for some servers, or whole for
//! `save-server-state`), as a stats or master socket (or anything
//! listening there) sends them.
//!
//! Input: byte 0 picks the slice size (1..=64) and byte 1 the reader; the
//! rest is the answer. Checks: never panics; fed whole or in slices each
//! reads the same; the servers-state reader keeps only servers asked for;
//! a saved answer is a version line, a header and one line per server,
//! each ended by a newline, and the closing empty line.
#![no_main]

use std::collections::HashSet;

use gitlab_haproxy_agent::drain::process::{DumpReader, InfoReader, ProcReader, StateReader};
use gitlab_haproxy_agent::drain::stat::ServerKey;
use libfuzzer_sys::fuzz_target;

fn wanted() -> HashSet<ServerKey> {
    [("be", "s1"), ("app", "s.2")]
        .into_iter()
        .map(|(b, s)| (b.to_owned(), s.to_owned()))
        .collect()
}

/// Feeds `data` to a reader in slices of `n`, then the close, stopping
/// when it is done or fails.
fn feed_all<R>(
    r: &mut R,
    feed: fn(&mut R, &[u8]) -> Result<bool, String>,
    data: &[u8],
    n: usize,
) -> Result<(), String> {
    for part in data.chunks(n) {
        if feed(r, part)? {
            return Ok(());
        }
    }
    feed(r, &[]).map(|_| ())
}

/// What reader `which` makes of `data` fed in slices of `n`, as text.
fn read(which: u8, data: &[u8], n: usize) -> String {
    match which % 4 {
        0 => {
            let mut r = InfoReader::default();
            let fed = feed_all(&mut r, InfoReader::feed, data, n);
            format!("{:?}", fed.and_then(|()| r.finish()))
        }
        1 => {
            let mut r = ProcReader::default();
            let fed = feed_all(&mut r, ProcReader::feed, data, n);
            format!("{:?}", fed.and_then(|()| r.finish()))
        }
        3 => {
            let mut r = DumpReader::default();
            let fed = feed_all(&mut r, DumpReader::feed, data, n);
            let got = fed.and_then(|()| r.finish()).map(|d| {
                let lines = d.bytes.iter().filter(|&&b| b == b'\n').count() as u64;
                assert_eq!(lines, d.servers + 3, "version, header, rows, empty line");
                assert!(d.bytes.ends_with(b"\n\n"));
                assert!(d.backends >= 1 && d.backends <= d.servers);
                d
            });
            format!("{got:?}")
        }
        _ => {
            let mut r = StateReader::new(wanted());
            let fed = feed_all(&mut r, StateReader::feed, data, n);
            let got = fed.and_then(|()| r.finish()).map(|m| {
                assert!(
                    m.keys().all(|k| wanted().contains(k)),
                    "kept a server not asked for"
                );
                let mut v: Vec<_> = m.into_iter().collect();
                v.sort();
                v
            });
            format!("{got:?}")
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [slice, which, answer @ ..] = data else {
        return;
    };
    let n = 1 + usize::from(slice % 64);
    let whole = read(*which, answer, answer.len().max(1));
    let sliced = read(*which, answer, n);
    assert_eq!(whole, sliced, "slices change the reading");
});
