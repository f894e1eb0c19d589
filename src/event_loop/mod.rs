//! The one mio poll loop: a dispatcher. It owns every socket and token,
//! reads the clock once per turn, gathers the machines' deadlines into the
//! `poll` timeout, and shuts down; it knows no protocol (bytes are parsed
//! by the machines it drives) and no domain rule (those live in the rooms
//! it calls: [`crate::state::Swapper`], [`crate::consul::health`],
//! [`crate::devkv::Parking`], [`crate::agent`]).
//!
//! In: bound listeners, the configuration, signals. Out: answers, state
//! swaps, metrics, logs; returns on SIGTERM/SIGINT once in-flight answers are
//! done (bounded). Always holds: one thread; the loop never blocks except in
//! `poll`, whose timeout is the nearest deadline; the clock is read once per
//! turn and passed down (answers read it for the duration histogram only).
//!
//! Tokens: fixed ones for the listeners, consul and signals; agent
//! connections at `AGENT_BASE + slab key`, HTTP connections at
//! `HTTP_BASE + slab key` (each a `table::ConnTable`).
//!
//! Work left: every machine with more to do reports a deadline of now
//! (`EventLoop::next_deadline`): a decode slice or a spent read budget
//! (the consul client), a state still being retired, a sweep in progress,
//! a heavy render requests wait for, an accept batch that ran out or a
//! gate that opened again, HTTP connections queued in `again`. That one
//! signal turns the `poll` timeout to zero.
//!
//! Background work (decoding, retiring, the unasked sweep, renders) runs
//! in [`Slice`]s of time: each turn's work ends about [`crate::slice::SLICE`]
//! after the turn's clock, so a ready check waits at most about that long
//! behind the agent's own work (`loop_turn_seconds` shows it).
//!
//! Fairness: no connection gets more than a fixed budget per turn (an
//! agent check one line; an HTTP connection
//! [`crate::monitoring::server::READ_BUDGET`] bytes and
//! `HTTP_REQUESTS_PER_TURN` requests, all of them together
//! `HTTP_REQUESTS_PER_TURN_ALL`; consul its client's read budget or
//! one decode slice; each listener one accept batch). Work left over is
//! done next turn, after the turn's new checks.

mod agents;
mod consul;
mod gate;
mod http;
mod listeners;
mod poll_errors;
mod systemd;
mod table;

use std::io;
use std::time::{Duration, Instant, SystemTime};

use log::{error, info, warn};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};

pub use listeners::{bind, Listeners, BACKLOG};

use crate::agent::hint::Hints;
use crate::config::Config;
use crate::consul::client::{Client, SocketConnector};
use crate::consul::health::Health;
use crate::consul::watch::Update;
use crate::devkv::{DevKv, Parking};
use crate::monitoring::metrics::Metrics;
use crate::monitoring::renders::Renders;
use crate::monitoring::server::Role;
use crate::monitoring::{StateFileStatus, Status, WatchStatus};
use crate::notify::Answering;
use crate::persist::{self, StateFile};
use crate::slice::Slice;
use crate::state::expiry::Expiry;
use crate::state::file::Loaded;
use crate::state::unasked::{Asking, Unasked};
use crate::state::{Clock, HeldFile, Swapper};
use agents::{AcceptOrder, AgentSlot};
use gate::AcceptGate;
use http::HttpSlot;
use poll_errors::{PollErrors, Verdict};
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
    hints: Hints,

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
    /// `/-/metrics` and `/debug/state`, rendered in slices and shared;
    /// each waiter is (HTTP key, generation, `HEAD`).
    renders: Renders<(usize, u32, bool)>,
    last_pool_warning: [Option<Instant>; Role::ALL.len()],

    client: Client<SocketConnector>,
    /// The consul connection registered now: (connection id, interest).
    consul_registered: Option<(u64, Interest)>,
    updates: Vec<Update>,
    health: Health,
    state: Swapper,
    /// Diverted keys no check asks for, swept every few seconds.
    unasked: Unasked,
    /// Diverted keys past their expiry, counted on each swap and on the
    /// nearest expiry.
    expiry: Expiry,
    devkv: Option<DevKv>,
    parking: Parking,
    /// `-state-file`: written after every swap, off the loop.
    state_file: Option<StateFile>,
    /// The state file read at start, until the first consul read decides.
    held_file: HeldFile<Loaded>,

    metrics: Metrics,
    started: SystemTime,
    kv_prefix: String,
    read_timeout: Duration,
    max_line_bytes: usize,
    /// `-reply-up`: ` up` on every reply.
    reply_up: bool,
    max_connections: usize,
    /// An unchanged state is written again this often (a quarter of
    /// `-state-max-age`, at most an hour).
    state_refresh: Duration,
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
        let devkv = http_listeners[Role::DevKv.index()].as_ref();
        let devkv = devkv.map(|_| DevKv::new(true));
        let consul = &config.consul;
        let (start, started) = (Instant::now(), SystemTime::now());
        let clock = Clock::new(start, started);
        let state = Swapper::new(&config.kv_prefix, clock, config.max_unknown_identities);
        let notify = config
            .notify
            .as_ref()
            .map(|s| Notify::open(s, start))
            .transpose()?;
        let (state_file, loaded) = match &config.state_file {
            Some(path) => persist::open(config, path).map(|(f, l)| (Some(f), l))?,
            None => (None, None),
        };
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
            hints: Hints::default(),
            https: ConnTable::new(HTTP_BASE, 0),
            http_gate: AcceptGate::new(usize::MAX),
            http_open: [0; Role::ALL.len()],
            http_scratch: vec![0; http::SCRATCH],
            again: Vec::new(),
            http_turn_requests: 0,
            renders: Renders::default(),
            last_pool_warning: [None; Role::ALL.len()],
            client: Client::new(
                consul,
                SocketConnector::new(consul),
                &config.kv_prefix,
                seed,
            ),
            consul_registered: None,
            updates: Vec::new(),
            health: Health::new(consul.endpoint.to_string()),
            state,
            unasked: Unasked::new(config.unasked_after, start),
            expiry: Expiry::default(),
            devkv,
            parking: Parking::default(),
            state_file,
            held_file: HeldFile::new(loaded, start),
            metrics: Metrics::default(),
            started,
            kv_prefix: config.kv_prefix.clone(),
            read_timeout: config.read_timeout,
            max_line_bytes: config.max_line_bytes,
            reply_up: config.reply_up,
            max_connections: config.max_connections,
            state_refresh: (config.state_max_age / 4).min(Duration::from_secs(3600)),
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
                if let Some(f) = self.state_file.take() {
                    if !f.finish(persist::SHUTDOWN_WAIT) {
                        warn!("shut down before the last state file write completed");
                    }
                }
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
            self.metrics.count_turn(start.elapsed());
        }
    }

    /// Counts a failed `poll` and pauses briefly; the error itself once
    /// the failures have persisted.
    fn on_poll_error(&mut self, e: io::Error) -> io::Result<()> {
        self.metrics.poll_errors += 1;
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
        let busy =
            (!self.again.is_empty() || self.state.busy() || self.renders.busy()).then_some(now);
        [
            busy,
            Some(self.client.poll_at(now)),
            self.agents.next_deadline(),
            self.https.next_deadline(),
            self.parking.next_deadline(),
            Some(self.unasked.due()),
            self.expiry.due(),
            self.hints.due(),
            self.held_file.deadline(),
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

    /// Everything due at `now`, in the order the turn promises: the state
    /// being retired, connection timers, parked queries, the unasked-key
    /// sweep, consul, accepts.
    fn on_time(&mut self, now: Instant) {
        let retired = self.state.step(&mut Slice::of_turn(now));
        for reason in &retired.invalid {
            self.metrics.invalid_values[reason.index()] += 1;
        }
        if retired.changed() {
            self.metrics.last_change = Some(SystemTime::now());
        }
        while let Some(key) = self.agents.expired(now) {
            if let Some(outcome) = self.agents.get(key).map(|s| s.conn.on_timeout()) {
                self.close_agent(key, outcome);
            }
        }
        while let Some(key) = self.https.expired(now) {
            self.http_timer(key, now);
        }
        for (key, wait) in self.parking.expired(now) {
            self.answer_parked(key, &wait, now);
        }
        if let Some(l) = self.held_file.due(now) {
            persist::answer_from(l, "no consul read within the grace", &mut self.state, now);
            self.expiry.soon(now);
        }
        if self.unasked.due() <= now {
            self.unasked
                .step(&mut self.state, now, &mut Slice::of_turn(now));
        }
        if self.expiry.due().is_some_and(|t| t <= now) {
            let unix = self
                .state
                .clock()
                .unix_seconds(self.state.clock().tick(now));
            self.expiry
                .step(&self.state, now, unix, &mut Slice::of_turn(now));
        }
        if self.renders.busy() {
            self.render_slice(now);
        }
        self.hints.on_time(now);
        self.forget_rendered();
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
        let answering = match self.state.source() {
            Some(crate::state::Source::Consul) => Answering::FromConsul,
            Some(crate::state::Source::File { .. }) => Answering::FromStateFile,
            None => Answering::Not {
                last_error: self.health.last_error(),
            },
        };
        notify.on_turn(now, answering);
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

    fn status(&self, now: Instant) -> Status<'_> {
        let watch = self.client.watch();
        let until = |t: Instant| t.saturating_duration_since(now);
        let next_request_in = self.client.next_request_at(now).map(until);
        let request_deadline_in = self.client.request_deadline().map(until);
        Status {
            metrics: &self.metrics,
            snapshot: self.state.current(),
            watch: WatchStatus {
                phase: self.client.phase_name(),
                index: watch.index(),
                failures: watch.failures(),
                requests: self.client.requests(),
                traffic: self.client.traffic(),
                last_error: self.health.last_error(),
                next_request_in,
                request_deadline_in,
            },
            now,
            started: self.started,
            max_connections: self.max_connections,
            kv_prefix: &self.kv_prefix,
            source: self.state.source(),
            state_file: self.state_file.as_ref().map(|f| StateFileStatus {
                path: f.path(),
                writes: f.writes(),
                write_errors: f.write_errors(),
            }),
            asking: Some(Asking {
                clock: self.state.clock(),
                strangers: self.state.strangers(),
                unasked: &self.unasked,
                previous: self.state.carrying_from(),
            }),
            expiry: self.expiry.shown(),
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
