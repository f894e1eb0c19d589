//! `drain::process`: haproxy's `show info`, the master CLI's `show proc`
//! and `show servers state` answers, as a stats or master socket (or
//! anything listening there) sends them.
//!
//! Input: byte 0 picks the slice size (1..=64) and byte 1 the reader; the
//! rest is the answer. Checks: never panics; fed whole or in slices each
//! reads the same; the servers-state reader keeps only servers asked for.
#![no_main]

use std::collections::HashSet;

use gitlab_haproxy_agent::drain::process::{InfoReader, ProcReader, StateReader};
use gitlab_haproxy_agent::drain::stat::ServerKey;
use libfuzzer_sys::fuzz_target;

fn wanted() -> HashSet<ServerKey> {
    [("be", "s1"), ("app", "s.2")]
        .into_iter()
        .map(|(b, s)| (b.to_owned(), s.to_owned()))
        .collect()
}

/// Feeds `data` in slices of `n` (then the close), stopping when the
/// reader is done; what `finish` makes of it, as text.
fn read(which: u8, data: &[u8], n: usize) -> String {
    macro_rules! run {
        ($reader:expr) => {{
            let mut r = $reader;
            let mut done = Ok(false);
            for part in data.chunks(n) {
                done = r.feed(part);
                if !matches!(done, Ok(false)) {
                    break;
                }
            }
            if matches!(done, Ok(false)) {
                done = r.feed(&[]);
            }
            match done {
                Err(e) => format!("error {e}"),
                Ok(_) => format!("{:?}", r.finish().map(|v| format!("{v:?}"))),
            }
        }};
    }
    match which % 3 {
        0 => run!(InfoReader::default()),
        1 => run!(ProcReader::default()),
        _ => {
            let out = run!(StateReader::new(wanted()));
            assert!(!out.contains("\"other\""));
            out
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
    // A HashMap's Debug order may differ between two maps: compare sorted.
    let sorted = |s: &str| {
        let mut c: Vec<char> = s.chars().collect();
        c.sort_unstable();
        c
    };
    assert_eq!(sorted(&whole), sorted(&sliced), "slices change the reading");
});
