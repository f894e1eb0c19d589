//! The loop's time budget for background work: a [`Slice`] ends at a
//! deadline, not after a count of items, because items cost anything from
//! nanoseconds (a hash probe) to milliseconds (a 500 KB value decoded).
//!
//! In: the turn's clock (every job of a turn gets the same deadline, `now +
//! SLICE`), and after each item its rough size. Out: whether the slice is
//! spent.
//!
//! Always holds:
//! - every job does at least one item per turn (the check comes after an
//!   item), so nothing starves;
//! - the clock is read every `CHECK_EVERY` items or `CHECK_BYTES` bytes, so
//!   a check costs a few nanoseconds an item.
//!
//! Tests use [`Slice::items`], a virtual clock that ends after a number of
//! items.
//!
//! A free is loop work too: [`keep_big_buffers_mapped`] keeps every big
//! buffer in a mapping of its own, so freeing one is an unmap, never a
//! consolidation of the whole heap.

use std::time::{Duration, Instant};

/// Background work one loop turn may do before ready checks run again.
pub const SLICE: Duration = Duration::from_millis(1);
/// Items between two reads of the clock.
const CHECK_EVERY: u32 = 16;
/// Bytes of items between two reads of the clock.
const CHECK_BYTES: usize = 16 * 1024;

/// One turn's budget of background work.
#[derive(Debug)]
pub struct Slice {
    end: End,
    items: u32,
    bytes: usize,
}

#[derive(Debug)]
enum End {
    At(Instant),
    /// Tests: the virtual clock runs out after this many items.
    Items(u64),
    Never,
}

impl Slice {
    /// The turn's slice: ends [`SLICE`] after the turn's clock.
    pub fn of_turn(now: Instant) -> Slice {
        Slice::until(now + SLICE)
    }

    pub fn until(end: Instant) -> Slice {
        Slice {
            end: End::At(end),
            items: 0,
            bytes: 0,
        }
    }

    /// A virtual clock that runs out after `n` items (at least one).
    pub fn items(n: u64) -> Slice {
        Slice {
            end: End::Items(n.max(1)),
            items: 0,
            bytes: 0,
        }
    }

    /// No limit: one-shot work off the loop (a command, a test).
    pub fn unlimited() -> Slice {
        Slice {
            end: End::Never,
            items: 0,
            bytes: 0,
        }
    }

    /// Counts one item of about `bytes` bytes of work; `true` once the
    /// slice is spent (stop after this item).
    pub fn spent(&mut self, bytes: usize) -> bool {
        self.items = self.items.wrapping_add(1);
        self.bytes = self.bytes.saturating_add(bytes);
        match &mut self.end {
            End::Never => false,
            End::Items(n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            End::At(end) => {
                if self.items % CHECK_EVERY != 0 && self.bytes < CHECK_BYTES {
                    return false;
                }
                self.bytes = 0;
                Instant::now() >= *end
            }
        }
    }

    /// Whether the slice is spent, counting nothing (before starting a job
    /// that must not take its first item).
    pub fn is_over(&self) -> bool {
        match self.end {
            End::Never => false,
            End::Items(n) => n == 0,
            End::At(end) => Instant::now() >= end,
        }
    }
}

/// Buffers of 128 KiB and more (a listing being read, a `/debug/state`
/// render, a state's table) get a mapping of their own, returned whole
/// when freed. By default glibc raises that threshold to the largest
/// buffer freed so far (up to 32 MiB); multi-megabyte buffers then live in
/// the heap, and freeing one consolidates and trims the heap in that one
/// call: the longest loop turns of `scripts/loop-stall.py` (issue 26),
/// 10-17 ms before this and 3-7 ms after. A fixed threshold also turns that adjustment off. Before
/// any other thread exists.
pub fn keep_big_buffers_mapped() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a parameter of the allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_slice_ends_after_its_items() {
        let mut s = Slice::items(3);
        assert!(!s.spent(1));
        assert!(!s.spent(1_000_000), "bytes do not end a virtual slice");
        assert!(s.spent(1));
        assert!(s.is_over());
        assert!(!Slice::items(0).is_over(), "at least one item");
    }

    #[test]
    fn a_timed_slice_reads_the_clock_every_few_items_or_bytes() {
        let past = Instant::now() - Duration::from_secs(1);
        let mut s = Slice::until(past);
        // Past its end, but the clock is read only every CHECK_EVERY items.
        for _ in 1..CHECK_EVERY {
            assert!(!s.spent(1));
        }
        assert!(s.spent(1));
        // A big item reads it at once.
        let mut s = Slice::until(past);
        assert!(s.spent(CHECK_BYTES));
        let mut s = Slice::until(Instant::now() + Duration::from_secs(60));
        assert!((0..10 * CHECK_EVERY).all(|_| !s.spent(CHECK_BYTES)));
        assert!(!Slice::unlimited().spent(usize::MAX));
    }
}
