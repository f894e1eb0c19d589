//! What the benches share beyond the tests' support (`support`, included
//! by path from `tests/it/support/`):
//!
//! - the agent-check load generator ([`run`]; its method in the comment
//!   that opens its section);
//! - a counting global allocator;
//! - CPU pinning, `getrusage` and `/proc/stat` readers;
//! - the binary and the consul stand-in as the benches start them (info
//!   logs), the fleet's keys and listings, write-to-answer timing;
//! - result tables under `target/bench-results/`.
#![allow(dead_code)]

// The integration tests' support (the agent and the dev KV as guarded
// processes, checks, metric names, `/proc` readers): one copy for both.
#[path = "../../tests/it/support/mod.rs"]
pub mod support;

use support::{poll_reply, process, put_many, Agent, Kv, NO_FIXED_PORTS, STATE_PREFIX};

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- allocator

/// Counts allocations (`alloc`, `alloc_zeroed`, `realloc`) made by threads
/// that opted in with [`count_this_thread`], or by every thread when
/// [`COUNT_ALL`] is set.
pub struct Counting;

pub static ALLOCS: AtomicU64 = AtomicU64::new(0);
pub static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);
pub static COUNT_ALL: AtomicBool = AtomicBool::new(false);

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Counts this thread's allocations from now on.
pub fn count_this_thread() {
    COUNTED.with(|c| c.set(true));
}

fn note(size: usize) {
    if COUNT_ALL.load(Ordering::Relaxed) || COUNTED.with(|c| c.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        ALLOC_BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n);
        System.realloc(p, l, n)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

/// (allocations, bytes) so far.
pub fn allocs() -> (u64, u64) {
    (
        ALLOCS.load(Ordering::Relaxed),
        ALLOC_BYTES.load(Ordering::Relaxed),
    )
}

// ---------------------------------------------------------------- load

// The load generator is a nonblocking epoll client (std + libc only), one
// epoll loop per thread. Per check: `socket`, optional `bind` to a
// `127.0.0.x` source (`IP_BIND_ADDRESS_NO_PORT`), nonblocking `connect`,
// `send` of the line right away (on loopback the handshake is done when
// `connect` returns; otherwise it waits for `EPOLLOUT`), `epoll_ctl(ADD)`
// edge-triggered, `recv` until EOF, then `SO_LINGER {1, 0}` and `close`:
// the responder closed first, so its socket sits in `FIN_WAIT2` and our RST
// removes both ends at once: no `TIME_WAIT` piles up on either side, and
// the 28k ephemeral ports of one source address are reused at once.
// Latency: from just before `connect()` to EOF after the reply; in the open
// loop from the check's *scheduled* start (arrival k is due at t0 + k/R),
// so a stalled responder cannot hide latency (no coordinated omission).
// Every loop is bounded by the run's deadline and a per-check timeout.

#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// N checks in flight; the next starts when one ends.
    Closed(usize),
    /// R checks/s on a fixed schedule.
    Open(u64),
}

#[derive(Clone)]
pub struct Load {
    pub addr: SocketAddrV4,
    pub mode: Mode,
    pub duration: Duration,
    /// Request lines, each ending in `\n`; check k sends `lines[k % len]`.
    pub lines: Arc<Vec<Vec<u8>>>,
    /// Every reply must be exactly this (with its `\n`), else `wrong_reply`.
    pub expect: Option<Vec<u8>>,
    /// Generator threads; CPUs to pin them to (empty: not pinned).
    pub threads: usize,
    pub cpus: Vec<usize>,
    pub timeout: Duration,
    /// Source addresses 127.0.0.1 .. 127.0.0.N (more ephemeral ports).
    pub src_ips: u8,
    /// Keep `(start offset, latency)` of every check (for windows).
    pub keep_samples: bool,
}

impl Load {
    pub fn new(addr: SocketAddrV4, mode: Mode, duration: Duration) -> Load {
        Load {
            addr,
            mode,
            duration,
            lines: Arc::new(identity_lines(1000)),
            expect: Some(b"ready 100%\n".to_vec()),
            threads: 1,
            cpus: Vec::new(),
            timeout: Duration::from_secs(2),
            src_ips: 1,
            keep_samples: false,
        }
    }
}

/// `be_N/srv_M\n` for i < n (N = i/10, M = i%10): the identities the
/// yardsticks hold.
pub fn identity_lines(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("be_{}/srv_{}\n", i / 10, i % 10).into_bytes())
        .collect()
}

#[derive(Default, Clone, Debug)]
pub struct Errors {
    pub connect: u64,
    pub io: u64,
    pub timeout: u64,
    pub bad_reply: u64,
    pub wrong_reply: u64,
    /// Open loop: arrivals dropped because too many were in flight.
    pub not_started: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.connect + self.io + self.timeout + self.bad_reply + self.wrong_reply + self.not_started
    }
    fn add(&mut self, o: &Errors) {
        self.connect += o.connect;
        self.io += o.io;
        self.timeout += o.timeout;
        self.bad_reply += o.bad_reply;
        self.wrong_reply += o.wrong_reply;
        self.not_started += o.not_started;
    }
}

#[derive(Default, Clone, Debug)]
pub struct Outcome {
    pub checks: u64,
    pub errors: Errors,
    pub elapsed: Duration,
    /// Latencies in ns, sorted.
    pub lat_ns: Vec<u64>,
    /// (start offset from t0 in ns, latency ns), if asked for.
    pub samples: Vec<(u64, u64)>,
    /// Generator CPU (user + system) over the run, all threads.
    pub gen_cpu: Duration,
    pub first_error: Option<String>,
}

impl Outcome {
    pub fn rate(&self) -> f64 {
        self.checks as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Quantile in µs (exact: every latency is kept).
    pub fn q_us(&self, q: f64) -> f64 {
        quantile_us(&self.lat_ns, q)
    }
}

pub fn quantile_us(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    let i = ((sorted_ns.len() as f64 * q).ceil() as usize).clamp(1, sorted_ns.len()) - 1;
    sorted_ns[i] as f64 / 1000.0
}

/// Runs the load (threads joined before returning).
pub fn run(load: &Load) -> Outcome {
    let t0 = Instant::now() + Duration::from_millis(5);
    let cpu0 = process_cpu();
    let handles: Vec<_> = (0..load.threads.max(1))
        .map(|t| {
            let load = load.clone();
            std::thread::spawn(move || worker(&load, t, t0))
        })
        .collect();
    let mut out = Outcome::default();
    for h in handles {
        let o = h.join().expect("generator thread");
        out.checks += o.checks;
        out.errors.add(&o.errors);
        out.elapsed = out.elapsed.max(o.elapsed);
        out.lat_ns.extend_from_slice(&o.lat_ns);
        out.samples.extend_from_slice(&o.samples);
        if out.first_error.is_none() {
            out.first_error = o.first_error;
        }
    }
    out.gen_cpu = process_cpu().saturating_sub(cpu0);
    out.lat_ns.sort_unstable();
    out
}

struct Slot {
    fd: i32,
    start: Instant,
    line: usize,
    sent: bool,
    got: [u8; 64],
    len: usize,
}

const FREE: i32 = -1;

fn worker(load: &Load, t: usize, t0: Instant) -> Outcome {
    if !load.cpus.is_empty() {
        pin_self(&[load.cpus[t % load.cpus.len()]]);
    }
    let threads = load.threads.max(1);
    let (slots_n, rate) = match load.mode {
        Mode::Closed(c) => {
            let mine = c / threads + usize::from(t < c % threads);
            (mine, 0.0)
        }
        Mode::Open(r) => (8192, r as f64 / threads as f64),
    };
    let mut out = Outcome::default();
    if slots_n == 0 {
        return out;
    }
    // SAFETY: plain syscalls on descriptors this function owns.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "epoll_create1");
    let mut slots: Vec<Slot> = (0..slots_n)
        .map(|_| Slot {
            fd: FREE,
            start: t0,
            line: 0,
            sent: false,
            got: [0; 64],
            len: 0,
        })
        .collect();
    let mut free: Vec<usize> = (0..slots_n).rev().collect();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut lat = Vec::with_capacity(1 << 20);
    let mut next_line = t * 7919;
    let end = t0 + load.duration;
    let mut k: u64 = 0; // open loop: arrivals scheduled so far
    let mut last_sweep = t0;
    while Instant::now() < t0 {
        std::hint::spin_loop();
    }
    let started_at = Instant::now();
    loop {
        let now = Instant::now();
        // Start checks.
        if now < end {
            match load.mode {
                Mode::Closed(_) => {
                    while let Some(i) = free.pop() {
                        start_check(load, ep, &mut slots[i], i, now, next_line, &mut out);
                        next_line += 1;
                        if slots[i].fd == FREE {
                            free.push(i);
                            break;
                        }
                    }
                }
                Mode::Open(_) => loop {
                    let due = t0 + Duration::from_secs_f64(k as f64 / rate);
                    if due > now || due >= end {
                        break;
                    }
                    k += 1;
                    match free.pop() {
                        Some(i) => {
                            start_check(load, ep, &mut slots[i], i, due, next_line, &mut out);
                            next_line += 1;
                            if slots[i].fd == FREE {
                                free.push(i);
                            }
                        }
                        None => out.errors.not_started += 1,
                    }
                },
            }
        } else if free.len() == slots_n || now > end + load.timeout {
            break;
        }
        // Wait: open loop wakes for the next arrival (spinning when it is
        // under a millisecond away, for start accuracy).
        let timeout_ms = match load.mode {
            Mode::Open(_) if now < end => {
                let due = t0 + Duration::from_secs_f64(k as f64 / rate);
                (due.saturating_duration_since(now).as_micros() / 1000) as i32
            }
            _ => 1,
        };
        // SAFETY: events is a valid buffer of events.len() entries.
        let n =
            unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, timeout_ms) };
        let now = Instant::now();
        for ev in events.iter().take(n.max(0) as usize) {
            let i = ev.u64 as usize;
            let s = &mut slots[i];
            if s.fd == FREE {
                continue;
            }
            if !s.sent {
                if !send_line(load, s) {
                    fail(s, &mut out, |e| e.io += 1, "send");
                    free.push(i);
                    continue;
                }
                if s.fd == FREE {
                    continue;
                }
            }
            match drain(s) {
                Drain::More => {}
                Drain::Eof => {
                    let ok = s.len > 0
                        && s.got[s.len - 1] == b'\n'
                        && !s.got[..s.len - 1].contains(&b'\n');
                    if !ok {
                        fail(s, &mut out, |e| e.bad_reply += 1, "bad reply");
                    } else if load.expect.as_deref().is_some_and(|e| e != &s.got[..s.len]) {
                        let got = String::from_utf8_lossy(&s.got[..s.len]).into_owned();
                        fail(
                            s,
                            &mut out,
                            |e| e.wrong_reply += 1,
                            &format!("wrong reply {got:?}"),
                        );
                    } else {
                        let ns = now.duration_since(s.start).as_nanos() as u64;
                        lat.push(ns);
                        if load.keep_samples {
                            out.samples.push((
                                s.start.saturating_duration_since(t0).as_nanos() as u64,
                                ns,
                            ));
                        }
                        out.checks += 1;
                        close_rst(s.fd);
                        s.fd = FREE;
                    }
                    free.push(i);
                }
                Drain::Err => {
                    fail(s, &mut out, |e| e.io += 1, "recv");
                    free.push(i);
                }
            }
        }
        // Timeouts: a sweep every 10 ms is plenty at a 2 s timeout.
        if now.duration_since(last_sweep) > Duration::from_millis(10) {
            last_sweep = now;
            for (i, s) in slots.iter_mut().enumerate() {
                if s.fd != FREE && now.duration_since(s.start) > load.timeout {
                    fail(s, &mut out, |e| e.timeout += 1, "timeout");
                    free.push(i);
                }
            }
        }
    }
    out.elapsed = Instant::now()
        .duration_since(started_at)
        .min(load.duration)
        .max(Duration::from_millis(1));
    for s in slots.iter_mut().filter(|s| s.fd != FREE) {
        close_rst(s.fd);
        s.fd = FREE;
    }
    // SAFETY: ep is ours.
    unsafe { libc::close(ep) };
    out.lat_ns = lat;
    out
}

fn fail(s: &mut Slot, out: &mut Outcome, count: impl Fn(&mut Errors), what: &str) {
    count(&mut out.errors);
    if out.first_error.is_none() {
        out.first_error = Some(format!("{what}: {}", std::io::Error::last_os_error()));
    }
    if s.fd != FREE {
        close_rst(s.fd);
    }
    s.fd = FREE;
}

fn start_check(
    load: &Load,
    ep: i32,
    s: &mut Slot,
    i: usize,
    start: Instant,
    line: usize,
    out: &mut Outcome,
) {
    s.start = start;
    s.line = line % load.lines.len();
    s.sent = false;
    s.len = 0;
    // SAFETY: plain socket syscalls; fd is closed on every path below.
    unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            out.errors.connect += 1;
            out.first_error
                .get_or_insert_with(|| format!("socket: {}", std::io::Error::last_os_error()));
            return;
        }
        s.fd = fd;
        if load.src_ips > 1 {
            let one: libc::c_int = 1;
            libc::setsockopt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                &one as *const _ as *const _,
                4,
            );
            let src = sockaddr(SocketAddrV4::new(
                Ipv4Addr::new(127, 0, 0, 1 + (line % load.src_ips as usize) as u8),
                0,
            ));
            libc::bind(
                fd,
                &src as *const _ as *const _,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            );
        }
        let sa = sockaddr(load.addr);
        let r = libc::connect(
            fd,
            &sa as *const _ as *const _,
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        );
        if r < 0 && *libc::__errno_location() != libc::EINPROGRESS {
            fail(s, out, |e| e.connect += 1, "connect");
            return;
        }
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: i as u64,
        };
        if !send_line(load, s) {
            fail(s, out, |e| e.connect += 1, "send");
            return;
        }
        if libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) < 0 {
            fail(s, out, |e| e.io += 1, "epoll_ctl");
        }
    }
}

/// Sends the line if the socket is connected; false on a hard error.
fn send_line(load: &Load, s: &mut Slot) -> bool {
    let line = &load.lines[s.line];
    // SAFETY: line is a valid buffer.
    let n = unsafe {
        libc::send(
            s.fd,
            line.as_ptr() as *const _,
            line.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n == line.len() as isize {
        s.sent = true;
        return true;
    }
    let e = std::io::Error::last_os_error().raw_os_error();
    n < 0
        && matches!(
            e,
            Some(libc::EAGAIN) | Some(libc::ENOTCONN) | Some(libc::EINPROGRESS)
        )
}

enum Drain {
    More,
    Eof,
    Err,
}

fn drain(s: &mut Slot) -> Drain {
    loop {
        let room = s.got.len() - s.len;
        if room == 0 {
            return Drain::Err;
        }
        // SAFETY: writes at most `room` bytes into s.got.
        let n = unsafe { libc::recv(s.fd, s.got[s.len..].as_mut_ptr() as *mut _, room, 0) };
        if n > 0 {
            s.len += n as usize;
            continue;
        }
        if n == 0 {
            return Drain::Eof;
        }
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) => Drain::More,
            Some(libc::EINTR) => continue,
            // Reset right after a full reply still counts as EOF.
            Some(libc::ECONNRESET) if s.len > 0 => Drain::Eof,
            _ => Drain::Err,
        };
    }
}

/// Closes with RST (SO_LINGER {1, 0}): no TIME_WAIT on either side.
pub fn close_rst(fd: i32) {
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: fd is a socket we own; closed exactly once here.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &lg as *const _ as *const _,
            std::mem::size_of::<libc::linger>() as u32,
        );
        libc::close(fd);
    }
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Opens `n` connections that never send (nonblocking connects, waited for
/// completion); returns their descriptors (close them with [`close_rst`]).
pub fn hold_idle(addr: SocketAddrV4, n: usize) -> Vec<i32> {
    let mut fds = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: plain socket syscalls.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                eprintln!(
                    "idle: socket failed after {i}: {}",
                    std::io::Error::last_os_error()
                );
                break;
            }
            let sa = sockaddr(addr);
            if libc::connect(
                fd,
                &sa as *const _ as *const _,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            ) < 0
            {
                eprintln!(
                    "idle: connect failed after {i}: {}",
                    std::io::Error::last_os_error()
                );
                libc::close(fd);
                break;
            }
            fds.push(fd);
        }
    }
    fds
}

// ---------------------------------------------------------------- process

/// Sets the CPU affinity of a thread or process (0 = the calling thread).
pub fn pin(pid: i32, cpus: &[usize]) -> bool {
    // SAFETY: cpu_set_t is plain data, filled by CPU_SET.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

pub fn pin_self(cpus: &[usize]) -> bool {
    pin(0, cpus)
}

pub fn ncpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// This process's user + system CPU time.
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// utime + stime of another process (zero once it is gone).
pub fn proc_cpu(pid: u32) -> Duration {
    let ticks = process::cpu_ticks(pid).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// VmRSS of a process in kB (zero once it is gone).
pub fn rss_kb(pid: u32) -> u64 {
    process::status_kib(pid, "VmRSS").unwrap_or(0)
}

/// (busy, steal, total) ticks of cpu0 and cpu1 from /proc/stat.
pub fn cpu_stat() -> Vec<(u64, u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    s.lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            let g = |i: usize| v.get(i).copied().unwrap_or(0);
            let busy = g(0) + g(1) + g(2) + g(5) + g(6);
            (busy, g(7), busy + g(3) + g(4) + g(7))
        })
        .collect()
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns it.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit read and write the struct only.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        l.rlim_cur
    }
}

/// The agent's environment in the benches: logs at info (the tests log at
/// debug), so the log costs the measured loop nothing and a long run keeps
/// few lines.
pub const INFO_LOGS: [(&str, &str); 1] = [("GITLAB_LOG_LEVEL", "info")];

/// The release binary in `-dev` on loopback port 0 (no monitoring or
/// pprof), logging at info, with `extra` flags; killed on drop.
pub fn bench_agent(extra: &[&str]) -> Agent {
    Agent::dev_with(&[&NO_FIXED_PORTS[..], extra].concat(), &INFO_LOGS)
}

/// A consul stand-in: the binary's dev KV alone, logging at info, with
/// `extra` flags.
pub fn bench_consul(extra: &[&str]) -> Kv {
    let any = "127.0.0.1:0".parse().expect("loopback");
    Kv::dev_with(any, extra, &INFO_LOGS)
}

/// The IPv4 address the load generator connects to.
pub fn v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => panic!("not IPv4: {a}"),
    }
}

/// PUTs `n` fleet identities (`be_N/srv_M` = `ready`, as the load
/// generators ask for), then waits until `agent` answers a sentinel key
/// written after them: the agent holds them all.
pub fn load_fleet(kv: &Kv, n: usize, agent: SocketAddr, limit: Duration) {
    let keys = (0..n).map(|i| {
        (
            format!("{STATE_PREFIX}/be_{}/srv_{}", i / 10, i % 10),
            "ready",
        )
    });
    put_many(kv.addr, keys);
    kv.put(&format!("{STATE_PREFIX}/bench/sentinel"), "drain");
    let pause = Duration::from_millis(10);
    poll_reply(agent, "bench/sentinel", "drain 100%", limit, pause)
        .expect("the agent answers the loaded keys");
}

/// Writes `value` for `identity` under the default prefix, then polls
/// `agent` without a pause until it answers `want`: the time from the
/// write's answer, `None` past `limit`.
pub fn write_to_answer(
    kv: &Kv,
    agent: &Agent,
    (identity, value, want): (&str, &str, &str),
    limit: Duration,
) -> Option<Duration> {
    kv.put(&format!("{STATE_PREFIX}/{identity}"), value);
    poll_reply(agent.listen(), identity, want, limit, Duration::ZERO).ok()
}

/// The fleet's values: mostly ready, a tenth each drained and at half
/// weight.
pub fn fleet_value(i: usize) -> &'static str {
    match i % 10 {
        9 => "drain",
        8 => "50%",
        _ => "ready",
    }
}

/// A consul-shaped recurse listing (as the dev KV renders it) of `n` fleet
/// keys (`be_N/srv_M` = [`fleet_value`]) under the default prefix, each
/// with consul Flags `flags`.
pub fn listing(n: usize, flags: u64) -> Vec<u8> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut s = String::with_capacity(n * 200);
    s.push('[');
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "{{\"LockIndex\":0,\"Key\":\"{STATE_PREFIX}/be_{}/srv_{}\",\"Flags\":{flags},\"Value\":\"{}\",\"CreateIndex\":{},\"ModifyIndex\":{}}}",
            i / 10,
            i % 10,
            b64.encode(fleet_value(i)),
            i + 10,
            i + 10
        ));
    }
    s.push(']');
    s.into_bytes()
}

// ---------------------------------------------------------------- output

/// Where results go: `<target>/bench-results/`.
pub fn results_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let d = target.join("bench-results");
    std::fs::create_dir_all(&d).expect("create target/bench-results");
    d
}

/// A result table: printed aligned, written as CSV and JSON lines.
pub struct Table {
    pub name: &'static str,
    pub cols: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(name: &'static str, cols: &[&'static str]) -> Table {
        Table {
            name,
            cols: cols.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, r: Vec<String>) {
        println!("{}", r.join(" | "));
        self.rows.push(r);
    }

    /// A row with only some columns filled (by name); the rest are empty.
    pub fn sparse_row(&mut self, cells: &[(&str, String)]) {
        let mut r = vec![String::new(); self.cols.len()];
        for (name, value) in cells {
            let i = self
                .cols
                .iter()
                .position(|c| c == name)
                .unwrap_or_else(|| panic!("no column {name}"));
            r[i] = value.clone();
        }
        self.row(r);
    }

    pub fn finish(&self) {
        let w: Vec<usize> = (0..self.cols.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].len())
                    .chain([self.cols[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let fmt = |r: &[String]| -> String {
            r.iter()
                .enumerate()
                .map(|(i, c)| format!("{c:>w$}", w = w[i]))
                .collect::<Vec<_>>()
                .join("  ")
        };
        println!("\n== {} ==", self.name);
        println!(
            "{}",
            fmt(&self.cols.iter().map(|c| c.to_string()).collect::<Vec<_>>())
        );
        for r in &self.rows {
            println!("{}", fmt(r));
        }
        let dir = results_dir();
        let mut csv = self.cols.join(",") + "\n";
        let mut json = String::new();
        for r in &self.rows {
            csv += &r
                .iter()
                .map(|c| {
                    if c.contains(',') {
                        format!("\"{c}\"")
                    } else {
                        c.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            csv += "\n";
            let fields: Vec<String> = self
                .cols
                .iter()
                .zip(r)
                .map(|(k, v)| match v.parse::<f64>() {
                    Ok(n) if n.is_finite() => format!("\"{k}\":{v}"),
                    _ => format!(
                        "\"{k}\":\"{}\"",
                        v.replace('\\', "\\\\").replace('"', "\\\"")
                    ),
                })
                .collect();
            json += &format!("{{{}}}\n", fields.join(","));
        }
        std::fs::write(dir.join(format!("{}.csv", self.name)), csv).expect("write csv");
        std::fs::write(dir.join(format!("{}.jsonl", self.name)), json).expect("write json");
        println!("(written to {}/{}.{{csv,jsonl}})", dir.display(), self.name);
    }
}

pub fn f1(v: f64) -> String {
    format!("{v:.1}")
}

pub fn f0(v: f64) -> String {
    format!("{v:.0}")
}

pub fn env_secs(name: &str, default: f64) -> Duration {
    Duration::from_secs_f64(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}
