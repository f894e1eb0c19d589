//! The one mio poll loop, IO only: `poll`, the listeners, the connection
//! tables and their registrations; what a check, a consul answer or a
//! request means is the sans-IO [`Core`]'s to decide. One thread; the loop
//! blocks only in `poll`, whose timeout is the nearest deadline.
//!
//! - The clock is read once per turn and passed down; a machine with work
//!   left (a decode slice, a state being retired, a render waited for, a
//!   spent budget) reports a deadline of now, which zeroes the timeout.
//! - Background work runs in slices: a turn's work ends about
//!   [`crate::slice::SLICE`] after its clock.
//! - Fairness: per turn, an agent check one line, an HTTP connection
//!   [`crate::http::server::READ_BUDGET`] bytes and `HTTP_REQUESTS_PER_TURN`
//!   requests (`HTTP_REQUESTS_PER_TURN_ALL` in all), consul one read budget
//!   or decode slice, each listener one accept batch; new checks first.
//! - Tokens: fixed ones for listeners, consul and signals; connections at
//!   `AGENT_BASE` or `HTTP_BASE` + slab key. The turn's order and every
//!   room: `docs/LIFECYCLE.md`.

mod agents;
mod consul;
mod gate;
mod http;
mod listeners;
mod poll_errors;
mod slots;
mod systemd;
mod table;

use std::io;
use std::time::{Duration, Instant, SystemTime};

use log::{error, info, warn};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};

pub use listeners::{bind, Listeners, BACKLOG};

use crate::config::Config;
use crate::consul::client::{Client, SocketConnector};
use crate::consul::watch::Update;
use crate::core::{ConsulView, Core};
use crate::http::server::Role;
use gate::AcceptGate;
use poll_errors::{PollErrors, Verdict};
use slots::{AcceptOrder, AgentSlot, HttpSlot};
use systemd::Notify;
use table::ConnTable;

const AGENT_LISTENER: Token = Token(0);
/// HTTP listeners: `HTTP_LISTENERS + role index`.
const HTTP_LISTENERS: usize = 1;
const CONSUL: Token = Token(4);
const SIGNALS: Token = Token(5);
const AGENT_BASE: usize = 1 << 8;
/// The upper half of the token space (agent keys stay far below it on any
/// word size).
const HTTP_BASE: usize = 1 << (usize::BITS - 1);

/// In a turn with many events, look for new checks again after this many
/// (one `accept4`, usually EAGAIN, per 64 events).
const ACCEPT_EVERY: usize = 64;
/// Requests one HTTP connection may have answered per turn (pipelining).
const HTTP_REQUESTS_PER_TURN: usize = 16;
/// Requests all HTTP connections together may have answered per turn;
/// heavy responses are rendered in slices and shared
/// ([`crate::monitoring::renders`]), so a request costs a parse and a
/// write, however many connections pipeline.
const HTTP_REQUESTS_PER_TURN_ALL: usize = 64;
/// Shutdown waits at most this long for in-flight answers.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

enum Tok {
    AgentListener,
    HttpListener(Role),
    Consul,
    Signals,
    Agent(usize),
    Http(usize),
    Unknown,
}

/// The loop and everything it owns.
pub struct EventLoop {
    poll: Poll,
    agent_listener: Option<TcpListener>,
    /// Per [`Role`], by index.
    http_listeners: [Option<TcpListener>; Role::ALL.len()],
    signals: signal_hook_mio::v1_0::Signals,
    poll_errors: PollErrors,

    agents: ConnTable<AgentSlot>,
    agent_gate: AcceptGate,
    /// Who is evicted first at `-max-connections`.
    accept_order: AcceptOrder,
    /// `-listen-allow`: sources whose agent connections are served.
    listen_allow: crate::agent::allow::Allow,
    /// Read buffer for agent lines (`-max-line-bytes` + 1).
    scratch: Vec<u8>,

    https: ConnTable<HttpSlot>,
    /// The three HTTP listeners share one pause after accept errors; their
    /// pools ([`Role::pool`]) evict instead of closing a gate.
    http_gate: AcceptGate,
    /// Open HTTP connections per [`Role`] (each has its own pool).
    http_open: [usize; Role::ALL.len()],
    http_scratch: Vec<u8>,
    /// HTTP connections (key, generation) with work left from a spent
    /// budget: served next turn, without an event (edge-triggered
    /// readiness will not repeat).
    again: Vec<(usize, u32)>,
    /// HTTP requests handed out this turn, all connections together.
    http_turn_requests: usize,
    last_pool_warning: [Option<Instant>; Role::ALL.len()],

    client: Client<SocketConnector>,
    /// The consul connection registered now: (connection id, interest).
    consul_registered: Option<(u64, Interest)>,
    updates: Vec<Update>,

    /// Everything that decides: the state, its files, health, metrics,
    /// renders, the dev KV.
    core: Core,
    read_timeout: Duration,
    max_line_bytes: usize,
    max_connections: usize,
    shutdown_deadline: Option<Instant>,
    /// systemd's `Type=notify` socket and what to tell it, when set.
    notify: Option<Notify>,
}

/// A seed that differs between agents started together: the time and the
/// process id.
fn jitter_seed() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id())
}

impl EventLoop {
    pub fn new(config: &Config, listeners: Listeners) -> io::Result<EventLoop> {
        let poll = Poll::new()?;
        let reg = poll.registry();
        let wrap = |l: Option<std::net::TcpListener>, t: Token| {
            l.map(|l| {
                let mut l = TcpListener::from_std(l);
                reg.register(&mut l, t, Interest::READABLE).map(|()| l)
            })
            .transpose()
        };
        let http = |role: Role| Token(HTTP_LISTENERS + role.index());
        let agent_listener = wrap(listeners.agent, AGENT_LISTENER)?;
        let http_listeners = [
            wrap(listeners.monitoring, http(Role::Monitoring))?,
            wrap(listeners.pprof, http(Role::Pprof))?,
            wrap(listeners.devkv, http(Role::DevKv))?,
        ];
        let mut signals = signal_hook_mio::v1_0::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGINT,
        ])?;
        reg.register(&mut signals, SIGNALS, Interest::READABLE)?;
        let seed = jitter_seed();
        let devkv = http_listeners[Role::DevKv.index()].is_some();
        let consul = &config.consul;
        let (start, started) = (Instant::now(), SystemTime::now());
        let notify = config
            .notify
            .as_ref()
            .map(|s| Notify::open(s, start))
            .transpose()?;
        let core = Core::new(config, start, started, devkv)?;
        Ok(EventLoop {
            poll,
            agent_listener,
            http_listeners,
            signals,
            poll_errors: PollErrors::default(),
            agents: ConnTable::new(AGENT_BASE, 1024),
            agent_gate: AcceptGate::new(config.max_connections),
            accept_order: AcceptOrder::default(),
            listen_allow: config.listen_allow.clone(),
            scratch: vec![0; config.max_line_bytes + 1],
            https: ConnTable::new(HTTP_BASE, 0),
            http_gate: AcceptGate::new(usize::MAX),
            http_open: [0; Role::ALL.len()],
            http_scratch: vec![0; slots::SCRATCH],
            again: Vec::new(),
            http_turn_requests: 0,
            last_pool_warning: [None; Role::ALL.len()],
            client: Client::new(
                consul,
                SocketConnector::new(consul),
                &config.kv_prefix,
                seed,
            ),
            consul_registered: None,
            updates: Vec::new(),
            core,
            read_timeout: config.read_timeout,
            max_line_bytes: config.max_line_bytes,
            max_connections: config.max_connections,
            shutdown_deadline: None,
            notify,
        })
    }

    /// Runs until SIGTERM/SIGINT and in-flight answers are done; an error
    /// only if `poll` keeps failing (`poll_errors`).
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            let now = Instant::now();
            if self.shutdown_done(now) {
                self.core.finish();
                info!(open_connections = self.agents.len(); "shut down");
                return Ok(());
            }
            let timeout = self.next_deadline(now).saturating_duration_since(now);
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => self.poll_errors.on_ok(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.on_poll_error(e)?;
                    continue;
                }
            }
            let start = Instant::now();
            self.turn(&events, start);
            self.core.metrics_mut().count_turn(start.elapsed());
        }
    }

    /// Counts a failed `poll` and pauses briefly; the error itself once
    /// the failures have persisted.
    fn on_poll_error(&mut self, e: io::Error) -> io::Result<()> {
        self.core.metrics_mut().poll_errors += 1;
        match self.poll_errors.on_error(Instant::now()) {
            Verdict::Warn => {
                warn!(error = e.to_string(); "poll failed: retrying (the loop exits if it keeps failing)")
            }
            Verdict::Retry => {}
            Verdict::Fatal => {
                error!(error = e.to_string(), seconds = poll_errors::FATAL_AFTER.as_secs(); "poll kept failing: giving up");
                return Err(e);
            }
        }
        std::thread::sleep(poll_errors::PAUSE);
        Ok(())
    }

    /// One turn: new checks first, and again every [`ACCEPT_EVERY`]
    /// events (their line is usually already there, so they are answered
    /// at once instead of waiting behind a turn full of slow peers'
    /// bytes); then the events, last turn's leftovers, and the timers.
    fn turn(&mut self, events: &Events, now: Instant) {
        let again = std::mem::take(&mut self.again);
        self.http_turn_requests = 0;
        if events.iter().any(|e| e.token() == AGENT_LISTENER) {
            self.accept_agents(now);
        }
        let others = events.iter().filter(|e| e.token() != AGENT_LISTENER);
        for (i, event) in others.enumerate() {
            if i % ACCEPT_EVERY == ACCEPT_EVERY - 1 {
                self.accept_agents(now);
            }
            self.dispatch(event.token(), now);
        }
        if !again.is_empty() {
            self.accept_agents(now);
        }
        for (key, gen) in again {
            if self.https.gen(key) == Some(gen) {
                self.http_event(key, now);
            }
        }
        self.on_time(now);
    }

    fn classify(&self, t: Token) -> Tok {
        match t {
            AGENT_LISTENER => Tok::AgentListener,
            CONSUL => Tok::Consul,
            SIGNALS => Tok::Signals,
            Token(n) if (HTTP_LISTENERS..HTTP_LISTENERS + Role::ALL.len()).contains(&n) => {
                Tok::HttpListener(Role::ALL[n - HTTP_LISTENERS])
            }
            t => match (self.https.key_of(t), self.agents.key_of(t)) {
                (Some(key), _) => Tok::Http(key),
                (None, Some(key)) => Tok::Agent(key),
                (None, None) => Tok::Unknown,
            },
        }
    }

    fn dispatch(&mut self, token: Token, now: Instant) {
        match self.classify(token) {
            Tok::AgentListener => {} // accepted before the other events
            Tok::HttpListener(role) => self.accept_http(role, now),
            Tok::Consul => {
                self.client.on_event(now, &mut self.updates);
                self.sync_consul(now);
            }
            Tok::Signals => self.on_signals(now),
            Tok::Agent(key) => self.agent_event(key, now),
            Tok::Http(key) => self.http_event(key, now),
            Tok::Unknown => {}
        }
    }

    /// The nearest deadline of every machine; `now` when one has work left.
    fn next_deadline(&self, now: Instant) -> Instant {
        [
            (!self.again.is_empty()).then_some(now),
            self.core.poll_timeout(now),
            Some(self.client.poll_at(now)),
            self.agents.next_deadline(),
            self.https.next_deadline(),
            self.notify.as_ref().and_then(Notify::deadline),
            self.agent_gate.deadline(now),
            self.http_gate.deadline(now),
            self.shutdown_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now)
    }

    /// Everything due at `now`, in the order the turn promises: the core's
    /// work (the state being retired, parked queries, the sweeps, renders)
    /// and the answers it made ready, connection timers, consul, accepts.
    fn on_time(&mut self, now: Instant) {
        let consul = self.consul_view(now);
        self.core.on_time(now, &consul);
        self.deliver(now);
        while let Some(key) = self.agents.expired(now) {
            if let Some(outcome) = self.agents.get(key).map(|s| s.conn.on_timeout()) {
                self.close_agent(key, outcome);
            }
        }
        while let Some(key) = self.https.expired(now) {
            self.http_timer(key, now);
        }
        if self.client.poll_at(now) <= now {
            self.client.on_timer(now, &mut self.updates);
            self.sync_consul(now);
        }
        if self.http_gate.due(now) {
            for role in Role::ALL {
                self.accept_http(role, now);
            }
        }
        if self.agent_gate.due(now) {
            self.accept_agents(now);
        }
        self.notify_systemd(now);
    }

    /// systemd's readiness, status and watchdog: from here only, the end
    /// of every turn, so a wedged loop stops the pings.
    fn notify_systemd(&mut self, now: Instant) {
        let Some(notify) = self.notify.as_mut() else {
            return;
        };
        notify.on_turn(now, self.core.answering());
    }

    // ---- signals, status ----

    fn on_signals(&mut self, now: Instant) {
        let got: Vec<i32> = self.signals.pending().collect();
        if got.is_empty() || self.shutdown_deadline.is_some() {
            return;
        }
        info!(signal = got[0], in_flight = self.agents.len(); "shutting down: not accepting; finishing in-flight answers");
        if let Some(notify) = self.notify.as_mut() {
            notify.stopping();
        }
        let grace = self.read_timeout.min(SHUTDOWN_GRACE);
        self.shutdown_deadline = Some(now + grace);
        let reg = self.poll.registry();
        let listeners = self
            .http_listeners
            .iter_mut()
            .chain([&mut self.agent_listener]);
        for l in listeners {
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

    /// What the consul client says of itself, for the core's views.
    fn consul_view(&self, now: Instant) -> ConsulView {
        let watch = self.client.watch();
        let until = |t: Instant| t.saturating_duration_since(now);
        ConsulView {
            phase: self.client.phase_name(),
            index: watch.index(),
            failures: watch.failures(),
            requests: self.client.requests(),
            traffic: self.client.traffic(),
            next_request_in: self.client.next_request_at(now).map(until),
            request_deadline_in: self.client.request_deadline().map(until),
        }
    }

    /// The addresses actually bound, for the start-up log line.
    pub fn local_addrs(&self) -> Vec<(&'static str, std::net::SocketAddr)> {
        let names = [
            "listen_addr",
            "monitoring_addr",
            "pprof_addr",
            "dev_kv_addr",
        ];
        let listeners = [&self.agent_listener]
            .into_iter()
            .chain(&self.http_listeners);
        names
            .into_iter()
            .zip(listeners)
            .filter_map(|(name, l)| Some((name, l.as_ref()?.local_addr().ok()?)))
            .collect()
    }
}
