//! The one mio poll loop: owns every socket and token, the
//! timers, and shutdown; knows no protocol (bytes are parsed by the
//! machines it drives).
//!
//! In: bound listeners, the configuration, signals. Out: answers, state
//! swaps, metrics, logs; returns on SIGTERM/SIGINT once in-flight answers are
//! done (bounded). Always holds: one thread; the loop never blocks except in
//! `poll`, whose timeout is the nearest deadline; the clock is read once per
//! turn and passed down (answers read it for the duration histogram only).
//!
//! Tokens: fixed ones for the listeners, consul and signals; agent
//! connections at `AGENT_BASE + slab key`, HTTP connections at
//! `HTTP_BASE + slab key`. Slab keys are reused, so timer records carry a
//! generation and a stale one is ignored.
//!
//! Fairness: no connection gets more than a fixed budget per turn (an
//! agent check one line; an HTTP connection
//! [`crate::monitoring::server::READ_BUDGET`] bytes and
//! [`HTTP_REQUESTS_PER_TURN`] requests, all of them together
//! [`HTTP_REQUESTS_PER_TURN_ALL`]; consul its client's read budget or
//! one decode slice; each listener one accept batch). Work left over is
//! queued in `again` and done next turn, after the turn's new checks.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::time::{Duration, Instant, SystemTime};

use log::{debug, error, info, trace, warn};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::agent::conn::{AgentConn, Progress};
use crate::agent::hint::Hints;
use crate::agent::Outcome;
use crate::config::{Config, ListenAddr};
use crate::consul::client::{Client, SocketConnector};
use crate::consul::watch::Update;
use crate::devkv::{DevKv, Handled, Wait};
use crate::logging::{escape, escape_keeping_backslashes};
use crate::monitoring::metrics::{HttpDrop, Metrics};
use crate::monitoring::server::{is_head, HttpConn, HttpProgress, Role};
use crate::monitoring::{handle_monitoring, handle_pprof, Status, WatchStatus};
use crate::state::{ChangeScan, Graveyard, Snapshot};

const AGENT_LISTENER: Token = Token(0);
const MONITORING_LISTENER: Token = Token(1);
const PPROF_LISTENER: Token = Token(2);
const DEVKV_LISTENER: Token = Token(3);
const CONSUL: Token = Token(4);
const SIGNALS: Token = Token(5);
const AGENT_BASE: usize = 1 << 8;
/// The upper half of the token space (agent keys stay far below it on any
/// word size).
const HTTP_BASE: usize = 1 << (usize::BITS - 1);

/// The listen backlog: new connections wait here while the gate is closed.
pub const BACKLOG: i32 = 4096;
/// Accept at most this many per turn, so one busy listener cannot starve
/// the rest of the loop; the loop comes back at once if more are waiting.
const ACCEPT_BATCH: usize = 256;
/// In a turn with many events, look for new checks again after this many
/// (one `accept4`, usually EAGAIN, per 64 events).
const ACCEPT_EVERY: usize = 64;
/// After EMFILE/ENFILE, retry accepting after this (no busy loop).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Requests one HTTP connection may have answered per turn (pipelining).
const HTTP_REQUESTS_PER_TURN: usize = 16;
/// Requests all HTTP connections together may have answered per turn: a
/// `/-/metrics` render costs about 0.1 ms, so a turn spends at most a few
/// ms on HTTP however many connections pipeline.
const HTTP_REQUESTS_PER_TURN_ALL: usize = 64;
/// Connections one HTTP listener may accept per turn.
const HTTP_ACCEPT_BATCH: usize = 64;
/// The HTTP connections' read buffer, shared (they copy out what they keep).
const HTTP_SCRATCH: usize = 16 * 1024;
/// Entries of a replaced state compared (for the change log) or freed per
/// loop turn: well under a millisecond each.
const RETIRE_SLICE: usize = 4096;
/// Shutdown waits at most this long for in-flight answers.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Repeated warnings (accept errors, full HTTP pools) at most this often.
const HINT_EVERY: Duration = Duration::from_secs(10);

enum Tok {
    Listener(Role),
    AgentListener,
    Consul,
    Signals,
    Agent(usize),
    Http(usize),
    Unknown,
}

fn classify(t: Token) -> Tok {
    match t {
        AGENT_LISTENER => Tok::AgentListener,
        MONITORING_LISTENER => Tok::Listener(Role::Monitoring),
        PPROF_LISTENER => Tok::Listener(Role::Pprof),
        DEVKV_LISTENER => Tok::Listener(Role::DevKv),
        CONSUL => Tok::Consul,
        SIGNALS => Tok::Signals,
        Token(n) if n >= HTTP_BASE => Tok::Http(n - HTTP_BASE),
        Token(n) if n >= AGENT_BASE => Tok::Agent(n - AGENT_BASE),
        _ => Tok::Unknown,
    }
}

/// What a failed `accept` means for the accept loop.
enum AcceptError {
    /// Nothing more waiting (`WouldBlock`).
    Drained,
    /// Interrupted, or a connection aborted before it was accepted: go on.
    Retry,
    /// Anything else (EMFILE, ENFILE, ENOBUFS ...): stop for now.
    Failed(io::Error),
}

fn classify_accept_error(e: io::Error) -> AcceptError {
    match e.kind() {
        io::ErrorKind::WouldBlock => AcceptError::Drained,
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => AcceptError::Retry,
        _ => AcceptError::Failed(e),
    }
}

/// Queues an HTTP connection for next turn, once (a spent budget and a new
/// event in the same turn must not give it two).
fn again_http(again: &mut Vec<Again>, key: usize, gen: u32) {
    if !again
        .iter()
        .any(|a| matches!(a, Again::Http { key: k, gen: g } if *k == key && *g == gen))
    {
        again.push(Again::Http { key, gen });
    }
}

/// Listeners bound at start-up (a bind failure is fatal, exit 1).
pub struct Listeners {
    pub agent: Option<std::net::TcpListener>,
    pub monitoring: Option<std::net::TcpListener>,
    pub pprof: Option<std::net::TcpListener>,
    pub devkv: Option<std::net::TcpListener>,
}

/// Binds a listener: `SO_REUSEADDR`, nonblocking, backlog [`BACKLOG`];
/// `:port` is `[::]` dual-stack, or `0.0.0.0` where IPv6 is absent.
pub fn bind(addr: &ListenAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let make = |sa: std::net::SocketAddr, dual: bool| -> io::Result<std::net::TcpListener> {
        let s = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
        if dual {
            s.set_only_v6(false)?;
        }
        s.set_reuse_address(true)?;
        s.set_nonblocking(true)?;
        s.bind(&sa.into())?;
        s.listen(BACKLOG)?;
        Ok(s.into())
    };
    match addr {
        ListenAddr::Addr(sa) => make(*sa, false),
        ListenAddr::AnyDualStack(port) => {
            let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, *port));
            match make(v6, true) {
                Ok(l) => Ok(l),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL)
                    ) =>
                {
                    make(
                        std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, *port)),
                        false,
                    )
                }
                Err(e) => Err(e),
            }
        }
    }
}

struct AgentSlot {
    conn: AgentConn,
    gen: u32,
    accepted: Instant,
    registered: Option<Interest>,
}

struct HttpSlot {
    conn: HttpConn<mio::net::TcpStream>,
    role: Role,
    gen: u32,
    /// The deadline of this slot's one live record in `http_timers`
    /// (records with another time are stale), so the heap holds at most a
    /// record or two per connection however many requests it serves.
    armed: Option<Instant>,
    registered: Option<Interest>,
    parked: Option<Wait>,
}

impl HttpSlot {
    /// When the slot needs the loop: a parked query's end, else the
    /// connection's own deadline.
    fn deadline(&self) -> Option<Instant> {
        match &self.parked {
            Some(w) => Some(w.deadline),
            None => self.conn.deadline(),
        }
    }
}

/// Work left over from a turn (a budget ran out): done next turn, without
/// an event (edge-triggered readiness will not repeat).
#[derive(Debug, Clone, Copy)]
enum Again {
    Http { key: usize, gen: u32 },
    Accept(Role),
}

/// The loop and everything it owns.
pub struct EventLoop {
    poll: Poll,
    agent_listener: Option<TcpListener>,
    monitoring_listener: Option<TcpListener>,
    pprof_listener: Option<TcpListener>,
    devkv_listener: Option<TcpListener>,
    signals: signal_hook_mio::v1_0::Signals,

    agents: Slab<AgentSlot>,
    /// (deadline, key, generation), pushed in deadline order: every agent
    /// connection has the same read timeout.
    agent_timers: VecDeque<(Instant, usize, u32)>,
    https: Slab<HttpSlot>,
    /// Open HTTP connections per [`Role`] (each has its own pool).
    http_open: [usize; Role::ALL.len()],
    http_timers: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    http_scratch: Vec<u8>,
    again: Vec<Again>,
    /// HTTP requests handed out this turn, all connections together.
    http_turn_requests: usize,
    next_gen: u32,

    client: Client<SocketConnector>,
    /// The consul connection registered now: (connection id, interest).
    consul_registered: Option<(u64, Interest)>,
    snapshot: Option<Snapshot>,
    /// The state before the last swap, while its changes are logged.
    retiring: Option<(Snapshot, ChangeScan)>,
    /// The state before that, being freed.
    graveyard: Option<Graveyard>,
    last_error: Option<String>,
    outage: Option<(Instant, u64)>,
    devkv: Option<DevKv>,
    updates: Vec<Update>,

    metrics: Metrics,
    started: SystemTime,
    kv_prefix: String,
    /// The consul address, as logged.
    consul_addr: String,
    read_timeout: Duration,
    max_line_bytes: usize,
    max_connections: usize,
    scratch: Vec<u8>,

    gate_open: bool,
    accept_paused_until: Option<Instant>,
    /// After EMFILE on an HTTP listener: retry accepting on all of them then
    /// (edge-triggered, a waiting connection would not wake us again).
    http_accept_retry_at: Option<Instant>,
    accept_pending: bool,
    hints: Hints,
    last_accept_warning: Option<Instant>,
    last_pool_warning: [Option<Instant>; Role::ALL.len()],
    shutdown_deadline: Option<Instant>,
}

impl EventLoop {
    pub fn new(config: &Config, listeners: Listeners) -> io::Result<EventLoop> {
        let poll = Poll::new()?;
        let reg = poll.registry();
        let wrap =
            |l: Option<std::net::TcpListener>, t: Token| -> io::Result<Option<TcpListener>> {
                l.map(|l| {
                    let mut l = TcpListener::from_std(l);
                    reg.register(&mut l, t, Interest::READABLE)?;
                    Ok(l)
                })
                .transpose()
            };
        let agent_listener = wrap(listeners.agent, AGENT_LISTENER)?;
        let monitoring_listener = wrap(listeners.monitoring, MONITORING_LISTENER)?;
        let pprof_listener = wrap(listeners.pprof, PPROF_LISTENER)?;
        let devkv_listener = wrap(listeners.devkv, DEVKV_LISTENER)?;
        let mut signals = signal_hook_mio::v1_0::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGINT,
        ])?;
        reg.register(&mut signals, SIGNALS, Interest::READABLE)?;
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        let devkv = devkv_listener.as_ref().map(|_| DevKv::new(true));
        Ok(EventLoop {
            poll,
            agent_listener,
            monitoring_listener,
            pprof_listener,
            devkv_listener,
            signals,
            agents: Slab::with_capacity(1024),
            agent_timers: VecDeque::with_capacity(1024),
            https: Slab::new(),
            http_open: [0; Role::ALL.len()],
            http_timers: BinaryHeap::new(),
            http_scratch: vec![0; HTTP_SCRATCH],
            again: Vec::new(),
            http_turn_requests: 0,
            next_gen: 0,
            client: Client::new(
                &config.consul,
                SocketConnector(config.consul.endpoint.clone()),
                &config.kv_prefix,
                seed,
            ),
            consul_registered: None,
            snapshot: None,
            retiring: None,
            graveyard: None,
            last_error: None,
            outage: None,
            devkv,
            updates: Vec::new(),
            metrics: Metrics::default(),
            started: SystemTime::now(),
            kv_prefix: config.kv_prefix.clone(),
            consul_addr: config.consul.endpoint.to_string(),
            read_timeout: config.read_timeout,
            max_line_bytes: config.max_line_bytes,
            max_connections: config.max_connections,
            scratch: vec![0; config.max_line_bytes + 1],
            gate_open: true,
            accept_paused_until: None,
            http_accept_retry_at: None,
            accept_pending: false,
            hints: Hints::default(),
            last_accept_warning: None,
            last_pool_warning: [None; Role::ALL.len()],
            shutdown_deadline: None,
        })
    }

    /// Runs until SIGTERM/SIGINT and in-flight answers are done.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            let now = Instant::now();
            if self.shutdown_done(now) {
                info!(open_connections = self.agents.len(); "shut down");
                return Ok(());
            }
            let busy = self.accept_pending
                || !self.again.is_empty()
                || self.retiring.is_some()
                || self.graveyard.is_some();
            let timeout = if busy {
                Some(Duration::ZERO)
            } else {
                Some(self.next_deadline(now).saturating_duration_since(now))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let now = Instant::now();
            // Last turn's leftovers run after this turn's events.
            let again = std::mem::take(&mut self.again);
            self.http_turn_requests = 0;
            // New checks first, and again every ACCEPT_EVERY events: their
            // line is usually already there, so they are answered at once
            // instead of waiting behind a turn full of slow peers' bytes.
            if events.iter().any(|e| e.token() == AGENT_LISTENER) {
                self.accept_agents(now);
            }
            let others = events.iter().filter(|e| e.token() != AGENT_LISTENER);
            for (i, event) in others.enumerate() {
                if i % ACCEPT_EVERY == ACCEPT_EVERY - 1 && self.agent_listener.is_some() {
                    self.accept_agents(now);
                }
                self.dispatch(event.token(), now);
            }
            if !again.is_empty() && self.agent_listener.is_some() {
                self.accept_agents(now);
            }
            for work in again {
                self.run_again(work, now);
            }
            self.on_time(now);
            if self.accept_pending {
                self.accept_agents(now);
            }
        }
    }

    fn dispatch(&mut self, token: Token, now: Instant) {
        match classify(token) {
            Tok::AgentListener => {} // accepted before the other events
            Tok::Listener(role) => self.accept_http(role, now),
            Tok::Consul => {
                self.client.on_event(now, &mut self.updates);
                self.sync_consul(now);
            }
            Tok::Signals => self.on_signals(now),
            Tok::Agent(key) => self.agent_event(key),
            Tok::Http(key) => self.http_event(key, now),
            Tok::Unknown => {}
        }
    }

    fn run_again(&mut self, work: Again, now: Instant) {
        match work {
            Again::Http { key, gen } => {
                if self.https.get(key).is_some_and(|s| s.gen == gen) {
                    self.http_event(key, now);
                }
            }
            Again::Accept(role) => self.accept_http(role, now),
        }
    }

    fn next_deadline(&self, now: Instant) -> Instant {
        let mut d = self.client.poll_at(now);
        if let Some(&(t, _, _)) = self.agent_timers.front() {
            d = d.min(t);
        }
        if let Some(Reverse((t, _, _))) = self.http_timers.peek() {
            d = d.min(*t);
        }
        if let Some(t) = self.http_accept_retry_at {
            d = d.min(t);
        }
        if let Some(t) = self.accept_paused_until {
            d = d.min(t);
        }
        if let Some(t) = self.shutdown_deadline {
            d = d.min(t);
        }
        d
    }

    fn gen(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    // ---- agent connections ----

    fn accept_agents(&mut self, now: Instant) {
        self.accept_pending = false;
        // Closed gate: accepting resumes in `close_agent`, below 90 %.
        if self.shutdown_deadline.is_some() || self.accept_paused_until.is_some() || !self.gate_open
        {
            return;
        }
        for _ in 0..ACCEPT_BATCH {
            if self.agents.len() >= self.max_connections {
                if self.gate_open {
                    self.gate_open = false;
                    self.metrics.gate_closings += 1;
                    warn!(open_connections = self.agents.len(), limit = self.max_connections; "connection limit reached: not accepting until below 90% (new connections wait in the backlog)");
                }
                return;
            }
            let Some(listener) = self.agent_listener.as_ref() else {
                return;
            };
            match listener.accept().map_err(classify_accept_error) {
                Ok((stream, _)) => self.serve_new(stream),
                Err(AcceptError::Drained) => return,
                Err(AcceptError::Retry) => {}
                Err(AcceptError::Failed(e)) => {
                    self.metrics.accept_errors += 1;
                    self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    if self
                        .last_accept_warning
                        .is_none_or(|t| now >= t + HINT_EVERY)
                    {
                        self.last_accept_warning = Some(now);
                        warn!(error = e.to_string(); "accept failed (out of file descriptors?): pausing accepts briefly; open connections are still served");
                    }
                    return;
                }
            }
        }
        self.accept_pending = true;
    }

    /// The fast path: the line is usually in the socket already, so read it
    /// before registering anything; only a connection that must wait gets a
    /// slab entry, a registration and a timer.
    fn serve_new(&mut self, stream: mio::net::TcpStream) {
        let accepted = Instant::now();
        let mut conn = AgentConn::new(stream);
        let progress = conn.on_readable(
            self.snapshot.as_ref(),
            self.max_line_bytes,
            &mut self.scratch,
        );
        let interest = match progress {
            Progress::Done(outcome) => return self.count(outcome, accepted, &conn),
            Progress::NeedRead => Interest::READABLE,
            Progress::NeedWrite => Interest::WRITABLE,
        };
        let gen = self.gen();
        let entry = self.agents.vacant_entry();
        let key = entry.key();
        if let Err(e) =
            self.poll
                .registry()
                .register(conn.stream_mut(), Token(AGENT_BASE + key), interest)
        {
            debug!(error = e.to_string(); "register failed");
            return self.count(Outcome::IoError, accepted, &conn);
        }
        entry.insert(AgentSlot {
            conn,
            gen,
            accepted,
            registered: Some(interest),
        });
        self.agent_timers
            .push_back((accepted + self.read_timeout, key, gen));
        self.metrics.open_connections = self.agents.len() as u64;
    }

    fn agent_event(&mut self, key: usize) {
        let Some(slot) = self.agents.get_mut(key) else {
            return;
        };
        let progress = slot.conn.on_readable(
            self.snapshot.as_ref(),
            self.max_line_bytes,
            &mut self.scratch,
        );
        let want = match progress {
            Progress::Done(outcome) => return self.close_agent(key, outcome),
            Progress::NeedRead => Interest::READABLE,
            Progress::NeedWrite => Interest::WRITABLE,
        };
        if slot.registered != Some(want) {
            if self
                .poll
                .registry()
                .reregister(slot.conn.stream_mut(), Token(AGENT_BASE + key), want)
                .is_err()
            {
                return self.close_agent(key, Outcome::IoError);
            }
            slot.registered = Some(want);
        }
    }

    fn close_agent(&mut self, key: usize, outcome: Outcome) {
        let Some(slot) = self.agents.get_mut(key) else {
            return;
        };
        // Deregister while the slot still owns the token, then free it.
        let _ = self.poll.registry().deregister(slot.conn.stream_mut());
        let slot = self.agents.remove(key);
        self.count(outcome, slot.accepted, &slot.conn);
        self.metrics.open_connections = self.agents.len() as u64;
        if !self.gate_open && self.agents.len() * 10 < self.max_connections * 9 {
            self.gate_open = true;
            info!(open_connections = self.agents.len(); "below 90% of the connection limit: accepting again");
            self.accept_pending = true;
        }
    }

    fn count(&mut self, outcome: Outcome, accepted: Instant, conn: &AgentConn) {
        let replied = matches!(outcome, Outcome::Ready | Outcome::Drain | Outcome::Maint);
        let took = replied.then(|| accepted.elapsed());
        self.metrics.count_request(outcome, took);
        trace!(outcome = outcome.label(); "agent connection done");
        if outcome == Outcome::NoNewline {
            self.hint_no_newline(conn.received());
        }
    }

    fn hint_no_newline(&mut self, received: &[u8]) {
        if let Some(hint) = self.hints.note(received, Instant::now()) {
            warn!(received = escape_keeping_backslashes(received, 64), similar_suppressed = hint.suppressed; "{}", hint.cause.message());
        }
    }

    // ---- HTTP connections (monitoring, pprof, dev KV) ----

    fn accept_http(&mut self, role: Role, now: Instant) {
        for _ in 0..HTTP_ACCEPT_BATCH {
            let listener = match role {
                Role::Monitoring => self.monitoring_listener.as_ref(),
                Role::Pprof => self.pprof_listener.as_ref(),
                Role::DevKv => self.devkv_listener.as_ref(),
            };
            let Some(listener) = listener else { return };
            match listener.accept().map_err(classify_accept_error) {
                Ok((stream, _)) => self.serve_http(role, stream, now),
                Err(AcceptError::Drained) => return,
                Err(AcceptError::Retry) => {}
                Err(AcceptError::Failed(e)) => {
                    debug!(error = e.to_string(); "http accept failed: retrying shortly");
                    self.http_accept_retry_at = Some(now + ACCEPT_PAUSE);
                    return;
                }
            }
        }
        self.again.push(Again::Accept(role));
    }

    fn serve_http(&mut self, role: Role, stream: mio::net::TcpStream, now: Instant) {
        if self.http_open[role.index()] >= role.pool() {
            self.warn_pool_full(role, now);
            if !self.evict_http(role) {
                self.metrics.count_http_drop(role, HttpDrop::Refused);
                return; // dropped: closed at once
            }
        }
        let _ = stream.set_nodelay(true);
        let gen = self.gen();
        let entry = self.https.vacant_entry();
        let key = entry.key();
        let mut slot = HttpSlot {
            conn: HttpConn::new(stream, role.limits(), now),
            role,
            gen,
            armed: None,
            registered: None,
            parked: None,
        };
        let token = Token(HTTP_BASE + key);
        if let Err(e) =
            self.poll
                .registry()
                .register(slot.conn.stream_mut(), token, Interest::READABLE)
        {
            debug!(error = e.to_string(); "register failed");
            return;
        }
        slot.registered = Some(Interest::READABLE);
        entry.insert(slot);
        self.http_open[role.index()] += 1;
        self.http_event(key, now);
    }

    fn warn_pool_full(&mut self, role: Role, now: Instant) {
        let last = &mut self.last_pool_warning[role.index()];
        if last.is_some_and(|t| now < t + HINT_EVERY) {
            return;
        }
        *last = Some(now);
        let dropped = &self.metrics.http_dropped[role.index()];
        warn!(listener = role.label(), pool = role.pool(), evicted_total = dropped[HttpDrop::Evicted as usize], refused_total = dropped[HttpDrop::Refused as usize];
            "HTTP connection pool full (a flood or slow clients?): evicting the oldest connection without a complete request");
    }

    /// Makes room in a full pool: closes the connection of `role` that
    /// never completed a request and is oldest (else the oldest one not
    /// being answered). False if every one is being answered.
    fn evict_http(&mut self, role: Role) -> bool {
        let victim = self
            .https
            .iter()
            .filter(|(_, s)| s.role == role && s.parked.is_none())
            .filter_map(|(k, s)| s.conn.eviction_key().map(|e| (e, k)))
            .min();
        let Some((_, key)) = victim else {
            return false;
        };
        self.metrics.count_http_drop(role, HttpDrop::Evicted);
        self.close_http(key);
        true
    }

    fn http_event(&mut self, key: usize, now: Instant) {
        let Some(slot) = self.https.get_mut(key) else {
            return;
        };
        if self.http_turn_requests >= HTTP_REQUESTS_PER_TURN_ALL {
            // The turn's HTTP budget is spent: next turn (edge-triggered,
            // so it must be queued; once, whatever the events).
            return again_http(&mut self.again, key, slot.gen);
        }
        let progress = slot.conn.on_readable(now, &mut self.http_scratch);
        self.http_progress(key, progress, now);
    }

    /// Follows a connection's progress: hands its requests out, at most
    /// [`HTTP_REQUESTS_PER_TURN`] of them, then registers what it waits
    /// for and arms its deadline.
    fn http_progress(&mut self, key: usize, mut progress: HttpProgress, now: Instant) {
        let mut answered = 0;
        loop {
            let Some(slot) = self.https.get_mut(key) else {
                return;
            };
            let want = match progress {
                HttpProgress::Close => return self.close_http(key),
                HttpProgress::NeedRead => Interest::READABLE,
                HttpProgress::NeedWrite => Interest::READABLE | Interest::WRITABLE,
                HttpProgress::Yield => {
                    again_http(&mut self.again, key, slot.gen);
                    Interest::READABLE
                }
                HttpProgress::Written
                    if answered < HTTP_REQUESTS_PER_TURN
                        && self.http_turn_requests < HTTP_REQUESTS_PER_TURN_ALL =>
                {
                    progress = slot.conn.on_readable(now, &mut self.http_scratch);
                    continue;
                }
                HttpProgress::Written => {
                    again_http(&mut self.again, key, slot.gen);
                    Interest::READABLE
                }
                HttpProgress::Request(head, body) => {
                    answered += 1;
                    self.http_turn_requests += 1;
                    progress = self.handle_http(key, head, body, now);
                    continue;
                }
            };
            if slot.registered != Some(want) {
                if self
                    .poll
                    .registry()
                    .reregister(slot.conn.stream_mut(), Token(HTTP_BASE + key), want)
                    .is_err()
                {
                    return self.close_http(key);
                }
                slot.registered = Some(want);
            }
            return self.arm_http_timer(key);
        }
    }

    /// Pushes a timer record for the slot's deadline unless one at or
    /// before it is already armed (a later record re-arms when it fires).
    fn arm_http_timer(&mut self, key: usize) {
        let Some(slot) = self.https.get_mut(key) else {
            return;
        };
        if let Some(d) = slot.deadline() {
            if slot.armed.is_none_or(|a| d < a) {
                slot.armed = Some(d);
                self.http_timers.push(Reverse((d, key, slot.gen)));
            }
        }
        // Records of closed connections wait in the heap until their time
        // (up to a minute): under connection churn, drop them once they
        // outnumber the live ones, so the heap stays within about twice
        // the open connections (amortized O(1) per push).
        if self.http_timers.len() > 2 * self.https.len() + 1024 {
            let https = &self.https;
            self.http_timers.retain(|Reverse((t, k, g))| {
                https
                    .get(*k)
                    .is_some_and(|s| s.gen == *g && s.armed == Some(*t))
            });
            self.http_timers.shrink_to(2 * self.https.len() + 1024);
        }
    }

    fn handle_http(
        &mut self,
        key: usize,
        head: crate::http::RequestHead,
        body: Vec<u8>,
        now: Instant,
    ) -> HttpProgress {
        let role = self.https[key].role;
        let head_only = is_head(&head);
        match role {
            Role::Monitoring | Role::Pprof => {
                let st = self.status(now);
                let resp = if role == Role::Monitoring {
                    handle_monitoring(&head, &st)
                } else {
                    handle_pprof(&head, &st)
                };
                self.https[key].conn.respond(&resp, head_only, None, now)
            }
            Role::DevKv => {
                let Some(kv) = self.devkv.as_mut() else {
                    return HttpProgress::Close;
                };
                let before = kv.generation();
                let handled = kv.handle(&head, &body, now);
                let changed = kv.generation() != before;
                let progress = match handled {
                    Handled::Respond(resp) => {
                        self.https[key]
                            .conn
                            .respond(&resp, head_only, Some(2048), now)
                    }
                    Handled::Wait(wait) => {
                        self.https[key].parked = Some(wait);
                        HttpProgress::NeedRead
                    }
                };
                if changed {
                    self.wake_parked(now);
                }
                progress
            }
        }
    }

    /// After a dev KV write: answer every parked query whose prefix moved.
    fn wake_parked(&mut self, now: Instant) {
        let Some(kv) = self.devkv.as_ref() else {
            return;
        };
        let ready: Vec<usize> = self
            .https
            .iter()
            .filter(|(_, s)| s.parked.as_ref().is_some_and(|w| kv.is_ready(w)))
            .map(|(k, _)| k)
            .collect();
        for key in ready {
            self.answer_parked(key, now, true);
        }
    }

    /// Answers the query parked on `key`: at its wait's end, or (`woken`)
    /// because its prefix moved, re-checked here: answering one connection
    /// can park a new query on another before its turn comes.
    fn answer_parked(&mut self, key: usize, now: Instant, woken: bool) {
        let Some(kv) = self.devkv.as_ref() else {
            return;
        };
        let Some(slot) = self.https.get_mut(key) else {
            return;
        };
        if woken && !slot.parked.as_ref().is_some_and(|w| kv.is_ready(w)) {
            return;
        }
        let Some(wait) = slot.parked.take() else {
            return;
        };
        let resp = kv.answer(&wait);
        let progress = slot.conn.respond(&resp, false, Some(2048), now);
        self.http_progress(key, progress, now);
    }

    /// An HTTP timer record fired: answer a parked query whose wait is
    /// over, close a connection past its deadline, or re-arm.
    fn http_timer(&mut self, key: usize, gen: u32, at: Instant, now: Instant) {
        let Some(slot) = self.https.get_mut(key) else {
            return;
        };
        if slot.gen != gen || slot.armed != Some(at) {
            return; // stale: the slot was reused or re-armed earlier
        }
        slot.armed = None;
        match slot.deadline() {
            Some(d) if d <= now && slot.parked.is_some() => self.answer_parked(key, now, false),
            Some(d) if d <= now => {
                self.metrics.count_http_drop(slot.role, HttpDrop::Timeout);
                self.close_http(key);
            }
            _ => self.arm_http_timer(key),
        }
    }

    fn close_http(&mut self, key: usize) {
        let Some(slot) = self.https.get_mut(key) else {
            return;
        };
        let _ = self.poll.registry().deregister(slot.conn.stream_mut());
        let slot = self.https.remove(key);
        self.http_open[slot.role.index()] -= 1;
    }

    // ---- consul ----

    /// After every call into the client: close what it retired
    /// (deregistered first), register what it waits on, apply its updates.
    fn sync_consul(&mut self, now: Instant) {
        let reg = self.poll.registry();
        for (id, mut stream) in self.client.retired() {
            let _ = reg.deregister(stream.source());
            if self.consul_registered.is_some_and(|(rid, _)| rid == id) {
                self.consul_registered = None;
            }
        }
        match self.client.wants() {
            None => self.consul_registered = None,
            Some((stream, id, want)) => {
                let done = match self.consul_registered {
                    Some((rid, rwant)) if rid == id && rwant == want => Ok(()),
                    Some((rid, _)) if rid == id => reg.reregister(stream.source(), CONSUL, want),
                    _ => reg.register(stream.source(), CONSUL, want),
                };
                match done {
                    Ok(()) => self.consul_registered = Some((id, want)),
                    Err(e) => {
                        self.consul_registered = None;
                        self.client.on_register_error(now, &e, &mut self.updates);
                        return self.sync_consul(now);
                    }
                }
            }
        }
        self.apply_updates(now);
    }

    fn apply_updates(&mut self, now: Instant) {
        let updates = std::mem::take(&mut self.updates);
        for u in updates {
            self.apply(u, now);
        }
    }

    fn apply(&mut self, update: Update, now: Instant) {
        match update {
            Update::Swap(new) => {
                self.consul_ok(now);
                self.metrics.swaps += 1;
                self.swap_in(new);
            }
            Update::Unchanged => {
                self.consul_ok(now);
                self.metrics.consul_unchanged += 1;
            }
            Update::Reset { from, to } => {
                self.metrics.consul_index_resets += 1;
                warn!(from = from, to = to; "X-Consul-Index went backwards (snapshot restore or tombstone reap): re-reading from index 0");
            }
            Update::Failed(f) => {
                self.metrics.count_consul_error(f.reason);
                if self.outage.is_none() {
                    let what = if self.snapshot.is_some() {
                        "answering from the last known state"
                    } else {
                        "not answering until a first complete read"
                    };
                    warn!(consul = self.consul_addr.as_str(), reason = f.reason.label(), error = f.detail.as_str(); "consul read failed: {what}; retrying with backoff");
                    self.outage = Some((now, 0));
                } else {
                    debug!(reason = f.reason.label(), error = f.detail.as_str(); "consul read failed again");
                }
                if let Some((_, n)) = self.outage.as_mut() {
                    *n += 1;
                }
                if f.configuration && self.last_error.as_deref() != Some(f.detail.as_str()) {
                    error!(error = f.detail.as_str(); "consul refused the request: check -consul-addr, -kv-prefix, the ACL token and namespace/partition");
                }
                self.last_error = Some(f.detail);
            }
        }
        self.metrics.consul_requests = self.client.requests();
    }

    fn consul_ok(&mut self, now: Instant) {
        self.metrics.last_success = Some(now);
        if let Some((since, errors)) = self.outage.take() {
            info!(outage_seconds = now.duration_since(since).as_secs_f64(), failed_requests = errors; "consul reads succeed again");
        }
    }

    /// Logs the swap; true if this is the first read, or an identity was
    /// added, removed or rewritten, or a new invalid value arrived (a wake
    /// is not always a change).
    /// Answers from `new` at once; the per-key change log against the old
    /// state, and freeing it, then run a slice per loop turn
    /// ([`EventLoop::retire_step`]).
    fn swap_in(&mut self, new: Snapshot) {
        // A swap still being logged from the last change: finish it first.
        while self.retiring.is_some() || self.graveyard.is_some() {
            self.retire_step(usize::MAX);
        }
        let empty = Snapshot::default();
        let invalid = new.new_invalid_since(self.snapshot.as_ref().unwrap_or(&empty));
        for k in &invalid {
            self.metrics.invalid_values[k.reason.index()] += 1;
            // The identity, as the change lines name it; the full key too.
            let identity = k
                .key
                .strip_prefix(self.kv_prefix.as_str())
                .and_then(|r| r.strip_prefix('/'))
                .unwrap_or(&k.key);
            warn!(identity = escape(identity.as_bytes(), 256), key = escape(k.key.as_bytes(), 256), value = escape(k.value.as_bytes(), 128), reason = k.reason.label(), index = k.modify_index;
                "invalid KV entry dropped: answered as if absent (ready 100%)");
        }
        if !invalid.is_empty() {
            self.metrics.last_change = Some(SystemTime::now());
        }
        debug!(index = new.index(), keys = new.len(); "state swapped");
        match self.snapshot.replace(new) {
            None => {
                let s = self.snapshot.as_ref().expect("just swapped in");
                info!(keys = s.len(), invalid = s.invalid().len(), index = s.index(); "first consul read complete: answering");
                self.metrics.last_change = Some(SystemTime::now());
            }
            Some(old) => self.retiring = Some((old, ChangeScan::default())),
        }
    }

    /// One slice of retiring the previous state: log what changed, then
    /// free it.
    fn retire_step(&mut self, max: usize) {
        if let Some((old, scan)) = self.retiring.as_mut() {
            let new = self.snapshot.as_ref().expect("a state to compare with");
            let mut changes = Vec::new();
            let done = scan.step(new, old, max, &mut changes);
            for c in &changes {
                let show = |e: Option<crate::state::Entry>| {
                    e.map_or_else(|| "absent".to_owned(), |e| e.desired.to_string())
                };
                // A delete has no ModifyIndex of its own: the state's.
                let index = c.new.map_or(new.index(), |e| e.modify_index);
                info!(identity = escape(c.identity.as_bytes(), 256), old = show(c.old), new = show(c.new), index = index; "state change");
            }
            if !changes.is_empty() {
                self.metrics.last_change = Some(SystemTime::now());
            }
            if done {
                let (old, _) = self.retiring.take().expect("retiring");
                self.graveyard = Some(old.into_graveyard());
            }
            return;
        }
        if let Some(g) = self.graveyard.as_mut() {
            if g.free(max) {
                self.graveyard = None;
            }
        }
    }

    // ---- time, signals ----

    fn on_time(&mut self, now: Instant) {
        if self.retiring.is_some() || self.graveyard.is_some() {
            self.retire_step(RETIRE_SLICE);
        }
        while let Some(&(t, key, gen)) = self.agent_timers.front() {
            if t > now {
                break;
            }
            self.agent_timers.pop_front();
            if let Some(slot) = self.agents.get(key) {
                if slot.gen == gen {
                    let outcome = slot.conn.on_timeout();
                    self.close_agent(key, outcome);
                }
            }
        }
        while let Some(Reverse((t, key, gen))) = self.http_timers.peek().copied() {
            if t > now {
                break;
            }
            self.http_timers.pop();
            self.http_timer(key, gen, t, now);
        }
        if self.client.poll_at(now) <= now {
            self.client.on_timer(now, &mut self.updates);
            self.sync_consul(now);
        }
        if self.http_accept_retry_at.is_some_and(|t| now >= t) {
            self.http_accept_retry_at = None;
            for role in [Role::Monitoring, Role::Pprof, Role::DevKv] {
                self.accept_http(role, now);
            }
        }
        if self.accept_paused_until.is_some_and(|t| now >= t) {
            self.accept_paused_until = None;
            self.accept_pending = true;
        }
    }

    fn on_signals(&mut self, now: Instant) {
        let got: Vec<i32> = self.signals.pending().collect();
        if got.is_empty() || self.shutdown_deadline.is_some() {
            return;
        }
        info!(signal = got[0], in_flight = self.agents.len(); "shutting down: not accepting; finishing in-flight answers");
        let grace = self.read_timeout.min(SHUTDOWN_GRACE);
        self.shutdown_deadline = Some(now + grace);
        let reg = self.poll.registry();
        for l in [
            &mut self.agent_listener,
            &mut self.monitoring_listener,
            &mut self.pprof_listener,
            &mut self.devkv_listener,
        ] {
            if let Some(mut l) = l.take() {
                let _ = reg.deregister(&mut l);
            }
        }
    }

    fn shutdown_done(&self, now: Instant) -> bool {
        match self.shutdown_deadline {
            None => false,
            Some(t) => self.agents.is_empty() || now >= t,
        }
    }

    fn status(&self, now: Instant) -> Status<'_> {
        let watch = self.client.watch();
        let until = |t: Instant| t.saturating_duration_since(now);
        let next_request_in = self.client.next_request_at(now).map(until);
        let request_deadline_in = self.client.request_deadline().map(until);
        Status {
            metrics: &self.metrics,
            snapshot: self.snapshot.as_ref(),
            watch: WatchStatus {
                phase: self.client.phase_name(),
                index: watch.index(),
                failures: watch.failures(),
                last_error: self.last_error.as_deref(),
                next_request_in,
                request_deadline_in,
            },
            now,
            started: self.started,
            max_connections: self.max_connections,
            kv_prefix: &self.kv_prefix,
        }
    }

    /// The addresses actually bound, for the start-up log line.
    pub fn local_addrs(&self) -> Vec<(&'static str, std::net::SocketAddr)> {
        let mut v = Vec::new();
        for (name, l) in [
            ("listen_addr", &self.agent_listener),
            ("monitoring_addr", &self.monitoring_listener),
            ("pprof_addr", &self.pprof_listener),
            ("dev_kv_addr", &self.devkv_listener),
        ] {
            if let Some(a) = l.as_ref().and_then(|l| l.local_addr().ok()) {
                v.push((name, a));
            }
        }
        v
    }
}
