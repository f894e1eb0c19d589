//! The state file on disk: read once at start, written after every
//! change by a thread of its own, so the answer path never waits on the
//! disk.
//!
//! In: the path, the prefix, the snapshots the loop hands over
//! ([`StateFile::save`]). Out: the file, replaced atomically (a temporary
//! file in the same directory, its name unique to the write, fsync, rename,
//! fsync of the directory); counters of writes and failed writes; one
//! warning per spell of failures.
//!
//! Always holds:
//! - at most one write in flight and at most one waiting, the newest (a
//!   burst of changes costs two writes, not one per change);
//! - a reader never sees a half-written file (rename is atomic, and the
//!   format's checksum refuses anything else);
//! - the loop only swaps a pointer under a mutex the writer holds for as
//!   long as that takes.

use std::fs::{self, File, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use log::{info, warn};

use crate::config::Config;
use crate::state::file::{self, Loaded};
use crate::state::{Snapshot, Swapper, FIRST_READ_GRACE};

/// How long shutdown waits for the last write.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// Reads the state file at `path`: `Err` is the one-line reason it is not
/// used (missing, unreadable, larger than `max_bytes`, or refused by the
/// format: see [`file::decode`]).
pub fn load(
    path: &Path,
    prefix: &str,
    max_age: Duration,
    max_bytes: usize,
    now: SystemTime,
) -> Result<Loaded, String> {
    // A FIFO, a device such as /dev/zero, a socket are refused without
    // waiting (start-up, SIGTERM included, must not hang on them).
    let limit = u64::try_from(max_bytes).unwrap_or(u64::MAX);
    let bytes = crate::files::read_regular(path, limit).map_err(|e| match e {
        e if e.contains("more than") => {
            format!("larger than -consul-max-body-bytes ({max_bytes} bytes)")
        }
        e => format!("cannot read: {e}"),
    })?;
    file::decode(&bytes, prefix, now, max_age).map_err(|r| r.to_string())
}

/// Reads the state file at `path` (else logs why it is not used), then
/// starts its writer. The state read is answered only once the first
/// consul read has failed or taken too long ([`crate::state::HeldFile`]).
pub fn open(config: &Config, path: &Path) -> io::Result<(StateFile, Option<Loaded>)> {
    let shown = path.display().to_string();
    let max_bytes = config.consul.max_body_bytes;
    let loaded = load(
        path,
        &config.kv_prefix,
        config.state_max_age,
        max_bytes,
        SystemTime::now(),
    );
    let grace_ms = FIRST_READ_GRACE.as_millis() as u64;
    let loaded = match loaded {
        Ok(l) => {
            let s = &l.snapshot;
            info!(path = shown.as_str(), age_seconds = l.age.as_secs(), keys = s.len(), invalid = s.invalid().len(), index = s.index(), grace_ms = grace_ms;
                "state file read: answered only if the first consul read fails or does not complete within the grace");
            Some(l)
        }
        Err(reason) if fs::symlink_metadata(path).is_err() => {
            info!(path = shown.as_str(), reason = reason.as_str(); "no state file yet: not answering until a first complete consul read");
            None
        }
        Err(reason) => {
            warn!(path = shown.as_str(), reason = reason.as_str(); "state file ignored: not answering until a first complete consul read");
            None
        }
    };
    let file = StateFile::start(path.to_owned(), config.kv_prefix.clone())?;
    Ok((file, loaded))
}

/// Answers from the state file's state `l` from `now` on, because of
/// `why` (the first consul read failed, or did not come in time).
pub fn answer_from(l: Loaded, why: &str, state: &mut Swapper, now: Instant) {
    let s = &l.snapshot;
    info!(age_seconds = l.age.as_secs(), keys = s.len(), invalid = s.invalid().len(), index = s.index(), why = why;
        "answering from the state file until consul answers");
    state.load(l.snapshot, l.written, now);
}

/// A written file's permission bits, and its owner when it is to be kept
/// (a file another user reads: haproxy's `server-state-file`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    pub mode: u32,
    /// (uid, gid); set when the writer may (root), else left as created.
    pub owner: Option<(u32, u32)>,
}

/// Writes `bytes` to `path` so that `path` is always either the old file
/// or the new one, whole, mode 0600 unless `keep` gives the mode and owner;
/// no temporary file is left, whatever fails. A symbolic link at `path` is
/// refused (an error, so a warning): whoever can write the directory must
/// not make the writer replace the file a link points to; the temporary
/// file is created new (`O_EXCL`, `O_NOFOLLOW`), never through a link
/// either.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], keep: Option<Keep>) -> io::Result<()> {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(io::Error::other(
            "a symbolic link is at the path: not written through it (give the real file's path)",
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // Opened first: a directory that cannot be opened fails the write
    // before the rename, never after it.
    let directory = File::open(dir)?;
    let (mut f, tmp) = create_temporary(dir, &name)?;
    let written = (|| {
        if let Some(keep) = keep {
            use std::os::unix::fs::PermissionsExt;
            if let Some((uid, gid)) = keep.owner {
                // Only root may give a file away: anyone else keeps their own.
                match std::os::unix::fs::fchown(&f, Some(uid), Some(gid)) {
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {}
                    other => other?,
                }
            }
            // After the owner: chown clears setuid and setgid bits.
            f.set_permissions(fs::Permissions::from_mode(keep.mode))?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    directory.sync_all()
}

/// A new file `.{name}.tmp.{random}` in `dir`, created here and by no one
/// else (`O_EXCL`): two agents sharing a directory, each PID 1 in its own
/// container, must never write or rename each other's temporary file.
fn create_temporary(dir: &Path, name: &str) -> io::Result<(File, PathBuf)> {
    let random = std::collections::hash_map::RandomState::new();
    let mut tries = 0u64;
    loop {
        let suffix = random.hash_one((std::process::id(), Instant::now(), tries));
        let tmp = dir.join(format!(".{name}.tmp.{suffix:016x}"));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(0o600);
        match options.custom_flags(libc::O_NOFOLLOW).open(&tmp) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
            opened => return opened.map(|f| (f, tmp)),
        }
    }
}

/// The newest state waiting to be written, and whether the writer must stop.
#[derive(Default)]
struct Queue {
    pending: Option<Arc<Snapshot>>,
    /// States replaced before they were written: freed by the writer, off
    /// the loop (the last reference to a retired 100,000-key state would
    /// otherwise be dropped in one loop turn).
    replaced: Vec<Arc<Snapshot>>,
    writing: bool,
    stop: bool,
}

impl Queue {
    /// The state to write next; one still waiting is kept for the writer
    /// to free.
    fn put(&mut self, snapshot: Arc<Snapshot>) {
        if let Some(replaced) = self.pending.replace(snapshot) {
            self.replaced.push(replaced);
        }
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    writes: AtomicU64,
    errors: AtomicU64,
    /// The last write failed (a later confirmation of the same state
    /// retries it).
    failing: AtomicBool,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The writer thread and what the loop shares with it.
pub struct StateFile {
    path: PathBuf,
    /// When a state was last queued: an unchanged state is written again
    /// this often, so the file's age is the time since consul last
    /// confirmed it, not since it last changed.
    queued: Option<Instant>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Gives the calling thread (the writer) its own copy of the descriptor
/// table, with only stdio left in it. While a second thread shares the
/// loop's table, every socket call of the loop pays an atomic pair for its
/// descriptor lookup (about 3 µs of CPU a check, `scripts/bench-ab.sh`).
/// The listeners are bound by now, so the copy must drop them: a listener
/// the loop closes must close. One call does both (`CLOSE_RANGE_UNSHARE`,
/// Linux 5.9); on an older kernel it fails and the table stays shared:
/// slower, never wrong. The writer opens what it writes by path.
fn own_descriptor_table() {
    // SAFETY: close_range(2) only unshares and closes descriptors of this
    // thread's own (new) table; nothing here holds one of them.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        )
    };
}

impl StateFile {
    /// Starts the writer for `path`; states are written as read under
    /// `prefix`.
    pub fn start(path: PathBuf, prefix: String) -> io::Result<StateFile> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            writes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        });
        let writer = Writer {
            path: path.clone(),
            prefix,
            shared: shared.clone(),
            failing: false,
        };
        let thread = std::thread::Builder::new()
            .name("state-file".into())
            .spawn(move || {
                own_descriptor_table();
                writer.run()
            })?;
        Ok(StateFile {
            path,
            queued: None,
            shared,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `snapshot` to be written, replacing any state still waiting.
    pub fn save(&mut self, snapshot: Arc<Snapshot>) {
        self.queued = Some(Instant::now());
        self.shared.queue().put(snapshot);
        self.shared.wake.notify_one();
    }

    /// Consul confirmed the current state without a change: write it
    /// again if the last write failed or is older than `refresh`.
    pub fn confirm(&mut self, snapshot: Arc<Snapshot>, refresh: Duration) {
        let failing = self.shared.failing.load(Ordering::Relaxed);
        if failing || self.queued.is_none_or(|t| t.elapsed() >= refresh) {
            self.save(snapshot);
        }
    }

    /// Files written so far.
    pub fn writes(&self) -> u64 {
        self.shared.writes.load(Ordering::Relaxed)
    }

    /// Writes that failed so far.
    pub fn write_errors(&self) -> u64 {
        self.shared.errors.load(Ordering::Relaxed)
    }

    /// At shutdown: waits up to `within` for the waiting state to be
    /// written, then stops the writer. True if nothing was left unwritten.
    pub fn finish(mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut q = self.shared.queue();
        while q.pending.is_some() || q.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = match self.shared.wake.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(p) => p.into_inner().0,
            };
        }
        let done = q.pending.is_none() && !q.writing;
        q.stop = true;
        drop(q);
        self.shared.wake.notify_all();
        if done {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        done
    }
}

/// The thread's side.
struct Writer {
    path: PathBuf,
    prefix: String,
    shared: Arc<Shared>,
    /// In a spell of failed writes (warned once).
    failing: bool,
}

impl Writer {
    fn run(mut self) {
        loop {
            let snapshot = {
                let mut q = self.shared.queue();
                loop {
                    let replaced = std::mem::take(&mut q.replaced);
                    if !replaced.is_empty() {
                        drop(q);
                        drop(replaced); // freed here, off the loop
                        q = self.shared.queue();
                        continue;
                    }
                    if let Some(s) = q.pending.take() {
                        q.writing = true;
                        break s;
                    }
                    if q.stop {
                        return;
                    }
                    q = match self.shared.wake.wait(q) {
                        Ok(q) => q,
                        Err(p) => p.into_inner(),
                    };
                }
            };
            self.write(&snapshot);
            drop(snapshot); // a retired state is freed here, off the loop
            self.shared.queue().writing = false;
            self.shared.wake.notify_all();
        }
    }

    fn write(&mut self, snapshot: &Snapshot) {
        let started = Instant::now();
        let bytes = file::encode(snapshot, &self.prefix, SystemTime::now());
        match write_atomically(&self.path, &bytes, None) {
            Ok(()) => {
                self.shared.writes.fetch_add(1, Ordering::Relaxed);
                self.shared.failing.store(false, Ordering::Relaxed);
                if std::mem::take(&mut self.failing) {
                    info!(path = self.path.display().to_string(); "state file written again");
                }
                log::debug!(path = self.path.display().to_string(), keys = snapshot.len(), index = snapshot.index(), bytes = bytes.len(), seconds = started.elapsed().as_secs_f64(); "state file written");
            }
            Err(e) => {
                self.shared.errors.fetch_add(1, Ordering::Relaxed);
                self.shared.failing.store(true, Ordering::Relaxed);
                if !std::mem::replace(&mut self.failing, true) {
                    warn!(path = self.path.display().to_string(), error = e.to_string(); "cannot write the state file: answers go on; a restart while consul is unreachable will not have this state");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPair;

    const PREFIX: &str = "p";
    const DAY: Duration = Duration::from_secs(86_400);

    fn snapshot(index: u64, value: &str) -> Arc<Snapshot> {
        let pairs = vec![KvPair {
            key: "p/be/s1".into(),
            value: value.as_bytes().to_vec(),
            modify_index: index,
            flags: 0,
        }];
        Arc::new(Snapshot::build(PREFIX, index, pairs))
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gha-persist-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_newest_state_is_written_and_read_back() {
        let dir = temp_dir("newest");
        let path = dir.join("state.json");
        let mut f = StateFile::start(path.clone(), PREFIX.into()).unwrap();
        for i in 1..=50 {
            f.save(snapshot(i, if i % 2 == 0 { "drain" } else { "maint" }));
        }
        assert_eq!(f.path(), path);
        assert!(
            f.finish(Duration::from_secs(10)),
            "written before the deadline"
        );
        let loaded = load(&path, PREFIX, DAY, 1 << 20, SystemTime::now()).unwrap();
        assert_eq!(loaded.snapshot.index(), 50, "the newest wins");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            [std::ffi::OsString::from("state.json")],
            "no temporary file left"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Regression (issue 27): the temporary file was `.{name}.tmp.{pid}`,
    /// opened without `O_EXCL`; two agents on one path with the same PID
    /// (each PID 1 in its container) renamed each other's file (write
    /// errors) and could publish one torn by the other. Two writers in one
    /// process share a PID too.
    #[test]
    fn two_writers_on_one_path_never_collide_and_every_read_is_whole() {
        let dir = temp_dir("two-writers");
        let path = dir.join("state.json");
        let mut a = StateFile::start(path.clone(), PREFIX.into()).unwrap();
        let mut b = StateFile::start(path.clone(), PREFIX.into()).unwrap();
        let reading = Arc::new(AtomicBool::new(true));
        let reader = {
            let (path, reading) = (path.clone(), reading.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while reading.load(Ordering::Relaxed) {
                    if let Ok(bytes) = fs::read(&path) {
                        file::decode(&bytes, PREFIX, SystemTime::now(), DAY).expect("a whole file");
                        reads += 1;
                    }
                }
                reads
            })
        };
        // Big enough that writes overlap.
        let big = |i: u64| {
            let pairs = (0..2000)
                .map(|k| KvPair {
                    key: format!("p/be/s{k}"),
                    value: b"drain".to_vec(),
                    modify_index: i,
                    flags: 0,
                })
                .collect();
            Arc::new(Snapshot::build(PREFIX, i, pairs))
        };
        for i in 1..=40 {
            a.save(big(i));
            b.save(big(i));
            std::thread::sleep(Duration::from_millis(2));
        }
        let counts = [a.shared.clone(), b.shared.clone()];
        assert!(a.finish(Duration::from_secs(20)) && b.finish(Duration::from_secs(20)));
        reading.store(false, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0, "the file was read");
        for c in counts {
            assert_eq!(c.errors.load(Ordering::Relaxed), 0, "no write error");
            assert!(c.writes.load(Ordering::Relaxed) >= 2);
        }
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("state.json")]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_state_replaced_before_it_is_written_is_kept_for_the_writer_to_free() {
        let mut q = Queue::default();
        let first = snapshot(1, "drain");
        let weak = Arc::downgrade(&first);
        q.put(first);
        q.put(snapshot(2, "maint"));
        // The loop's side never drops the last reference to a retired state.
        assert_eq!(q.pending.as_ref().map(|s| s.index()), Some(2));
        assert_eq!(q.replaced.len(), 1);
        assert!(weak.upgrade().is_some(), "still held, for the writer");
        // With a writer: freed, and the newest written.
        let dir = temp_dir("replaced");
        let mut f = StateFile::start(dir.join("state.json"), PREFIX.into()).unwrap();
        let third = snapshot(3, "drain");
        let weak = Arc::downgrade(&third);
        f.save(third);
        f.save(snapshot(4, "drain"));
        assert!(f.finish(Duration::from_secs(10)));
        assert!(weak.upgrade().is_none(), "freed by the writer");
    }

    #[test]
    fn an_unwritable_file_is_counted_and_answers_go_on() {
        let dir = temp_dir("unwritable");
        let path = dir.join("missing-dir").join("state.json");
        let mut f = StateFile::start(path, PREFIX.into()).unwrap();
        f.save(snapshot(1, "drain"));
        f.save(snapshot(2, "drain"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while f.write_errors() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(f.write_errors() >= 1);
        assert_eq!(f.writes(), 0);
        f.finish(Duration::from_secs(5));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_oversized_and_bad_files_give_a_reason() {
        let dir = temp_dir("bad");
        let path = dir.join("state.json");
        let now = SystemTime::now();
        let missing = load(&path, PREFIX, DAY, 1 << 20, now).unwrap_err();
        assert!(
            missing.starts_with("cannot read: No such file"),
            "{missing}"
        );
        let bytes = file::encode(&snapshot(3, "drain"), PREFIX, now);
        fs::write(&path, &bytes).unwrap();
        let big = load(&path, PREFIX, DAY, bytes.len() - 1, now).unwrap_err();
        assert!(big.contains("larger than"), "{big}");
        assert!(load(&path, PREFIX, DAY, bytes.len(), now).is_ok());
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let cut = load(&path, PREFIX, DAY, 1 << 20, now).unwrap_err();
        assert!(cut.contains("truncated"), "{cut}");
        let unreadable = load(&dir, PREFIX, DAY, 1 << 20, now).unwrap_err();
        assert!(
            unreadable.contains("not a regular file"),
            "a directory: {unreadable}"
        );
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let got = load(&fifo, PREFIX, DAY, 1 << 20, now).unwrap_err();
        assert!(
            got.contains("not a regular file"),
            "a FIFO, without hanging: {got}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
