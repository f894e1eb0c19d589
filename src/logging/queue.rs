//! The log pipe: lines go into a queue bounded in bytes, and a writer
//! thread writes them to stderr, so the loop never waits on a slow log
//! reader (journald, a container pipe, a terminal scrolled back).
//!
//! In: whole formatted lines, from any thread. Out: the same lines, in
//! order, on the sink; when the queue is full a line is dropped and counted
//! ([`Queue::dropped`]), and the writer reports how many were lost in one
//! line of its own once there is room again.
//!
//! Always holds:
//! - a push takes a mutex for a few instructions and never waits on I/O;
//! - memory is at most [`QUEUE_BYTES`] of lines queued plus the batch being
//!   written (itself at most that);
//! - the writer holds the lock only to take what is queued.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of lines queued at most (a few thousand lines).
pub const QUEUE_BYTES: usize = 1024 * 1024;

/// Lines waiting for the writer.
#[derive(Debug)]
pub struct Queue {
    inner: Mutex<Inner>,
    /// Signalled when lines arrive (the writer waits on it) and when the
    /// writer finished a batch (a flush waits on it).
    changed: Condvar,
    dropped: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    /// The writer holds a batch it has not finished writing.
    writing: bool,
    /// Dropped since the writer last reported.
    unreported: u64,
}

impl Queue {
    pub const fn new() -> Queue {
        Queue {
            inner: Mutex::new(Inner {
                lines: VecDeque::new(),
                bytes: 0,
                writing: false,
                unreported: 0,
            }),
            changed: Condvar::new(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Queues a line (with its `\n`); `false` if it was dropped because
    /// the queue is full.
    pub fn push(&self, line: Vec<u8>) -> bool {
        let Ok(mut q) = self.inner.lock() else {
            return false;
        };
        if q.bytes + line.len() > QUEUE_BYTES {
            q.unreported += 1;
            drop(q);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.bytes += line.len();
        q.lines.push_back(line);
        drop(q);
        self.changed.notify_all();
        true
    }

    /// Lines dropped so far (the `log_lines_dropped_total` metric).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The writer's loop: waits for lines, writes them to `sink` outside
    /// the lock, and after a batch with drops before it, calls `report`
    /// with how many (it logs one line, which comes back through
    /// [`Queue::push`]). Never returns.
    pub fn run_writer(&self, sink: &mut dyn Write, report: &dyn Fn(u64)) -> ! {
        loop {
            let (batch, unreported) = self.take();
            for line in &batch {
                // A failing stderr has nowhere to be reported.
                let _ = sink.write_all(line);
            }
            let _ = sink.flush();
            if let Ok(mut q) = self.inner.lock() {
                q.writing = false;
            }
            self.changed.notify_all();
            if unreported > 0 {
                report(unreported);
            }
        }
    }

    /// Waits for lines and takes them all, with the drops not yet reported.
    fn take(&self) -> (VecDeque<Vec<u8>>, u64) {
        let mut q = match self.inner.lock() {
            Ok(q) => q,
            Err(poisoned) => poisoned.into_inner(),
        };
        while q.lines.is_empty() && q.unreported == 0 {
            q = match self.changed.wait(q) {
                Ok(q) => q,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
        q.bytes = 0;
        q.writing = true;
        let unreported = std::mem::take(&mut q.unreported);
        (std::mem::take(&mut q.lines), unreported)
    }

    /// Waits until every line queued so far is written, at most `within`
    /// (at exit; a stalled reader must not hold the process forever).
    /// `true` if all were.
    pub fn flush(&self, within: Duration) -> bool {
        let end = Instant::now() + within;
        let Ok(mut q) = self.inner.lock() else {
            return false;
        };
        while !q.lines.is_empty() || q.writing {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = match self.changed.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(_) => return false,
            };
        }
        true
    }
}

/// A `Write` for loggers that write a line in pieces (simplelog): bytes
/// are kept until a `\n`, then the whole line is queued.
#[derive(Debug)]
pub struct LineSink<'a> {
    queue: &'a Queue,
    pending: Vec<u8>,
}

impl<'a> LineSink<'a> {
    pub fn new(queue: &'a Queue) -> LineSink<'a> {
        LineSink {
            queue,
            pending: Vec::new(),
        }
    }
}

impl Write for LineSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let rest = self.pending.split_off(end + 1);
            self.queue.push(std::mem::replace(&mut self.pending, rest));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    /// A sink that blocks until the test lets it write (a stalled reader).
    struct Gated {
        gate: mpsc::Receiver<()>,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.gate
                .recv()
                .map_err(|_| std::io::ErrorKind::BrokenPipe)?;
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(i: usize) -> Vec<u8> {
        let mut l = format!("line {i} ").into_bytes();
        l.resize(1000, b'x');
        l.push(b'\n');
        l
    }

    #[test]
    fn a_stalled_reader_never_blocks_a_push_and_the_drops_are_counted_then_reported() {
        let q = Arc::new(Queue::new());
        let (open, gate) = mpsc::channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let reported = Arc::new(AtomicU64::new(0));
        {
            let (q, out, reported) = (Arc::clone(&q), Arc::clone(&out), Arc::clone(&reported));
            std::thread::spawn(move || {
                let mut sink = Gated { gate, out };
                let report = |n| {
                    reported.fetch_add(n, Ordering::Relaxed);
                };
                q.run_writer(&mut sink, &report)
            });
        }
        // The writer takes what is queued and blocks writing it; the rest
        // fill the queue to its bound, then are dropped, without waiting
        // (memory: the bound queued, and at most the bound being written).
        let n = 3 * QUEUE_BYTES / 1001;
        let started = Instant::now();
        let kept = (0..n).filter(|&i| q.push(line(i))).count();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "pushes never wait"
        );
        let bound = QUEUE_BYTES / 1001;
        assert!(kept >= bound && kept <= 2 * bound + 2, "kept {kept}");
        assert_eq!(q.dropped(), (n - kept) as u64);
        assert!(!q.flush(Duration::from_millis(50)), "still stalled");
        // The reader catches up: every kept line is written, in order, and
        // the drops are reported once.
        std::thread::spawn(move || while open.send(()).is_ok() {});
        assert!(q.flush(Duration::from_secs(10)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while reported.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(reported.load(Ordering::Relaxed), q.dropped());
        let out = out.lock().unwrap();
        let written: Vec<&[u8]> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(written.len(), kept);
        assert!(written[0].starts_with(b"line 0 "));
    }

    #[test]
    fn a_line_written_in_pieces_is_queued_whole() {
        let q = Queue::new();
        let mut sink = LineSink::new(&q);
        write!(sink, "one ").unwrap();
        assert!(q.inner.lock().unwrap().lines.is_empty());
        write!(sink, "line\ntwo\nthree").unwrap();
        let lines: Vec<_> = q.inner.lock().unwrap().lines.iter().cloned().collect();
        assert_eq!(lines, [b"one line\n".to_vec(), b"two\n".to_vec()]);
    }
}
