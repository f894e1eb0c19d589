//! The allocator's part of the loop budget: a big buffer freed on the loop
//! (a listing, a `/debug/state` render) is unmapped whole, and never makes
//! glibc move the next big buffer into the heap, where freeing it would
//! consolidate and trim the whole heap in one call (the longest loop
//! turns of `scripts/loop-stall.py`, issue 26). One test in its own process: the
//! allocator's counters are process-wide.

#[cfg(target_env = "gnu")]
#[test]
fn a_freed_big_buffer_leaves_the_next_one_in_its_own_mapping() {
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
#[cfg(target_env = "gnu")]
fn mapped_bytes() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    unsafe { libc::mallinfo2() }.hblkhd
}
