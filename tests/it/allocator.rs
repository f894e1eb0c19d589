//! The allocator's part of the loop budget: a big buffer freed on the loop
//! (a listing, a `/debug/state` render) is unmapped whole, and never makes
//! glibc move the next big buffer into the heap, where freeing it would
//! consolidate and trim the whole heap in one call (the longest loop
//! turns of `scripts/loop-stall.py`, issue 26).
//!
//! The allocator's counters are process-wide, and this binary's other
//! tests allocate beside it: the test runs itself again, alone, in a
//! process of its own (`ALONE` set), and reads the verdict from there.

use std::process::Command;

/// Set in the process that measures.
const ALONE: &str = "GITLAB_HAPROXY_AGENT_TEST_ALLOCATOR_ALONE";

#[test]
fn a_freed_big_buffer_leaves_the_next_one_in_its_own_mapping() {
    if std::env::var_os(ALONE).is_some() {
        return measure();
    }
    let name = "allocator::a_freed_big_buffer_leaves_the_next_one_in_its_own_mapping";
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("test result: ok. 1 passed"), "{text}");
}

fn measure() {
    gitlab_haproxy_agent::slice::keep_big_buffers_mapped();
    // glibc's default would now raise its mapping threshold to 4 MiB.
    drop(std::hint::black_box(vec![1u8; 4 << 20]));
    let before = mapped_bytes();
    let next = std::hint::black_box(vec![1u8; 3 << 20]);
    let after = mapped_bytes();
    assert!(
        after >= before + next.len(),
        "a 3 MiB buffer after a 4 MiB one was freed: mapped bytes {before} -> {after} (in the heap)"
    );
}

/// Bytes the allocator holds in mappings of their own.
fn mapped_bytes() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    unsafe { libc::mallinfo2() }.hblkhd
}
