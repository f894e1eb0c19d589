//! The sans-IO core: the state the agent answers from and everything that
//! decides about it, driven by events and the time, with no socket.
//!
//! The loop ([`crate::event_loop`]) owns `poll`, listeners and connection
//! tables; it hands the core what happened and writes what the core says:
//!
//! - a check's identity ([`Core::answer`]) and how its connection ended
//!   ([`Core::check_done`]);
//! - consul's updates ([`Core::on_consul`]): a swap, an unchanged answer, a
//!   failure, for the state, the state file, the health and the metrics;
//! - an HTTP request ([`Core::on_request`]): an answer now, or later from
//!   [`Core::poll_answer`] (a shared render done, a parked dev KV query
//!   woken or over); a closed connection ([`Core::on_http_closed`]);
//! - the time ([`Core::on_time`]): the state being retired, the held
//!   state file's grace, the unasked sweep, the expiry, renders, hints;
//!   [`Core::poll_timeout`] says when it next has work.
//!
//! Always holds:
//! - every method takes `now` and does no IO but the state file's writer (a
//!   thread of its own, fed a shared snapshot);
//! - work in the background runs in [`Slice`]s of the turn;
//! - a connection the loop closed is never answered (its waits are
//!   forgotten at once).

mod http;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant, SystemTime};

use log::{debug, warn};

use crate::agent::hint::Hints;
use crate::agent::Outcome;
use crate::config::Config;
use crate::consul::client::Traffic;
use crate::consul::health::Health;
use crate::consul::watch::Update;
use crate::contract::Admin;
use crate::devkv::{DevKv, Parking};
use crate::monitoring::metrics::Metrics;
use crate::monitoring::renders::Renders;
use crate::notify::Answering;
use crate::persist::{self, StateFile};
use crate::slice::Slice;
use crate::state::expiry::Expiry;
use crate::state::file::Loaded;
use crate::state::unasked::Unasked;
use crate::state::{Clock, HeldFile, Snapshot, Source, Swapper};

/// A response for a connection: what the loop writes.
pub type Answer = crate::http::server::Reply;

/// An HTTP connection as the loop names it: its table key and the key's
/// generation (a key reused by a later connection has another).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnId {
    pub key: usize,
    pub gen: u32,
}

/// What the loop's consul client says of itself, for `/debug/state` and
/// the metrics (the core adds the health's last error).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConsulView {
    pub phase: &'static str,
    pub index: u64,
    pub failures: u32,
    pub requests: u64,
    pub traffic: Traffic,
    pub next_request_in: Option<Duration>,
    pub request_deadline_in: Option<Duration>,
}

/// The state, its persistence, health, metrics, renders and the dev KV.
pub struct Core {
    state: Swapper,
    health: Health,
    /// Diverted keys no check asks for, swept every few seconds.
    unasked: Unasked,
    /// Diverted keys past their expiry, counted on each swap and on the
    /// nearest expiry.
    expiry: Expiry,
    /// `-state-file`: written after every swap, off the loop.
    state_file: Option<StateFile>,
    /// The state file read at start, until the first consul read decides.
    held_file: HeldFile<Loaded>,
    metrics: Metrics,
    hints: Hints,
    /// `/-/metrics` and `/debug/state`, rendered in slices and shared;
    /// each waiter is (connection, `HEAD`).
    renders: Renders<(ConnId, bool)>,
    devkv: Option<DevKv>,
    parking: Parking<ConnId>,
    /// Answers ready for connections that wait ([`Core::poll_answer`]).
    outbox: VecDeque<(ConnId, Answer)>,
    started: SystemTime,
    kv_prefix: String,
    /// `-reply-up`: ` up` on every reply.
    reply_up: bool,
    max_connections: usize,
    /// An unchanged state is written again this often (a quarter of
    /// `-state-max-age`, at most an hour).
    state_refresh: Duration,
}

impl Core {
    /// The core of a daemon started at `start` (`started` on the wall
    /// clock): reads the state file, if any, and starts its writer; with
    /// `devkv`, serves the dev KV.
    pub fn new(
        config: &Config,
        start: Instant,
        started: SystemTime,
        devkv: bool,
    ) -> io::Result<Core> {
        let clock = Clock::new(start, started);
        let (state_file, loaded) = match &config.state_file {
            Some(path) => persist::open(config, path).map(|(f, l)| (Some(f), l))?,
            None => (None, None),
        };
        Ok(Core {
            state: Swapper::new(&config.kv_prefix, clock, config.max_unknown_identities),
            health: Health::new(config.consul.endpoint.to_string()),
            unasked: Unasked::new(config.unasked_after, start),
            expiry: Expiry::default(),
            state_file,
            held_file: HeldFile::new(loaded, start),
            metrics: Metrics::default(),
            hints: Hints::default(),
            renders: Renders::default(),
            devkv: devkv.then(|| DevKv::new(true)),
            parking: Parking::default(),
            outbox: VecDeque::new(),
            started,
            kv_prefix: config.kv_prefix.clone(),
            reply_up: config.reply_up,
            max_connections: config.max_connections,
            state_refresh: (config.state_max_age / 4).min(Duration::from_secs(3600)),
        })
    }

    // ---- agent checks ----

    /// The reply to a check for `identity` at `now`, and the admin state it
    /// votes for; `None` while there is no state to answer from.
    pub fn answer(&mut self, identity: &[u8], now: Instant) -> Option<(&'static [u8], Admin)> {
        let desired = self.state.answer(identity, now)?;
        Some((desired.reply_voting(self.reply_up), desired.admin()))
    }

    /// A check's connection ended with `outcome` (accepted at `accepted`,
    /// having sent `received`): counted, and hinted at if it looks wrong.
    pub fn check_done(
        &mut self,
        outcome: Outcome,
        accepted: Instant,
        received: &[u8],
        now: Instant,
    ) {
        let took = outcome.is_reply().then(|| now.duration_since(accepted));
        self.metrics.count_request(outcome, took);
        self.hints.on_done(outcome, received, now);
    }

    // ---- consul ----

    /// Applies one of the consul client's updates.
    pub fn on_consul(&mut self, update: Update, now: Instant) {
        match update {
            Update::Swap(new) => {
                self.consul_ok(now);
                self.metrics.swaps += 1;
                self.swap_in(new, now);
                if let Some(unused) = self.held_file.consul_answered() {
                    self.state.discard(unused.snapshot);
                }
            }
            Update::Unchanged => {
                self.consul_ok(now);
                if let (Some(f), Some(s)) = (&mut self.state_file, self.state.shared()) {
                    f.confirm(s, self.state_refresh);
                }
                self.metrics.consul_unchanged += 1;
            }
            Update::Reset { from, to } => {
                self.metrics.consul_index_resets += 1;
                self.health.index_reset(from, to);
            }
            Update::TooStale { last_contact } => {
                // Counted by the watch; routine when a follower lags.
                let ms = last_contact.map(|d| d.as_millis() as u64);
                debug!(last_contact_ms = ms; "stale consul answer past -consul-max-stale, or behind the state applied: discarded, asking the leader");
            }
            Update::Failed(f) => {
                self.metrics.count_consul_error(f.reason);
                if let Some(l) = self.held_file.consul_failed() {
                    persist::answer_from(l, "the first consul read failed", &mut self.state, now);
                    self.expiry.soon(now);
                }
                let answering = self.state.current().is_some();
                self.health.failed(f, now, answering);
            }
        }
    }

    fn consul_ok(&mut self, now: Instant) {
        self.metrics.last_success = Some(now);
        self.health.succeeded(now);
    }

    /// Answers from `new` at once; its change log and the old state's
    /// freeing run a slice per turn ([`Core::on_time`]).
    fn swap_in(&mut self, new: Snapshot, now: Instant) {
        let swapped = self.state.swap(new, now);
        self.unasked.soon(now);
        self.expiry.soon(now);
        if let (Some(f), Some(s)) = (&mut self.state_file, self.state.shared()) {
            f.save(s);
        }
        if swapped.first {
            self.metrics.last_change = Some(SystemTime::now());
        }
    }

    // ---- time ----

    /// Everything due at `now`, in this order: the state being retired,
    /// parked queries whose wait is over, the held state file's grace, the
    /// unasked-key sweep, the expiry, a slice of the renders, the hints.
    pub fn on_time(&mut self, now: Instant, consul: &ConsulView) {
        let retired = self.state.step(&mut Slice::of_turn(now));
        for reason in &retired.invalid {
            self.metrics.invalid_values[reason.index()] += 1;
        }
        if retired.changed() {
            self.metrics.last_change = Some(SystemTime::now());
        }
        let expired = self.parking.expired(now);
        self.answer_parked(expired);
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
            self.render_slice(now, consul);
        }
        self.hints.on_time(now);
    }

    /// When the core next has work: `now` if it has work left (a state
    /// being retired, a render waited for, answers not yet taken).
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        let busy = self.state.busy() || self.renders.busy() || !self.outbox.is_empty();
        [
            busy.then_some(now),
            self.parking.next_deadline(),
            Some(self.unasked.due()),
            self.expiry.due(),
            self.hints.due(),
            self.held_file.deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ---- what the loop reads and counts ----

    /// What systemd is told the agent answers from.
    pub fn answering(&self) -> Answering<'_> {
        match self.state.source() {
            Some(Source::Consul) => Answering::FromConsul,
            Some(Source::File { .. }) => Answering::FromStateFile,
            None => Answering::Not {
                last_error: self.health.last_error(),
            },
        }
    }

    /// The registry the loop counts its own events in (accepts, polls,
    /// evictions, turns).
    pub fn metrics_mut(&mut self) -> &mut Metrics {
        &mut self.metrics
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// At shutdown: waits up to [`persist::SHUTDOWN_WAIT`] for the state
    /// file's last write (a warning if it did not complete).
    pub fn finish(&mut self) {
        let Some(f) = self.state_file.take() else {
            return;
        };
        if !f.finish(persist::SHUTDOWN_WAIT) {
            warn!("shut down before the last state file write completed");
        }
    }
}
