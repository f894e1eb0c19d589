//! The view of the daemon the monitoring handlers and renders read: the
//! core builds a [`Status`] when a request or a render needs one.
//!
//! - [`Status`]: the metrics, the state, the watch, the state file, who asks;
//! - [`metrics_view`]: the part `/-/metrics` renders.

use std::time::{Duration, Instant, SystemTime};

use super::metrics::{Metrics, View};
use crate::consul::client::Traffic;
use crate::state::unasked::Asking;
use crate::state::{Snapshot, Source};

/// `/debug/state` lists at most this many identities asked without a key
/// (the most recently asked); `unknown_identities_count` has them all.
pub const MAX_UNKNOWN_SHOWN: usize = 1000;

/// The watcher's side of the status.
pub struct WatchStatus<'a> {
    pub phase: &'static str,
    pub index: u64,
    pub failures: u32,
    /// Requests sent so far.
    pub requests: u64,
    /// Bytes received, what consul said of its cluster, stale re-asks.
    pub traffic: Traffic,
    pub last_error: Option<&'a str>,
    /// While idle: time until the next request may start (rate limit, or
    /// backoff after a failure). `None` while a request is in flight.
    pub next_request_in: Option<Duration>,
    /// While a request is in flight: time left before the client gives up
    /// on it (connect timeout, or the whole-response deadline). `None` while
    /// idle.
    pub request_deadline_in: Option<Duration>,
}

/// What the handlers may look at.
pub struct Status<'a> {
    pub metrics: &'a Metrics,
    pub snapshot: Option<&'a Snapshot>,
    pub watch: WatchStatus<'a>,
    pub now: Instant,
    pub started: SystemTime,
    pub max_connections: usize,
    pub kv_prefix: &'a str,
    /// Where the state answered from came from (`None`: no state yet).
    pub source: Option<Source>,
    /// With `-state-file`.
    pub state_file: Option<StateFileStatus<'a>>,
    /// Who asks for what.
    pub asking: Option<Asking<'a>>,
    /// Diverted keys past their expiry, and the nearest ahead.
    pub expiry: crate::state::expiry::Shown,
}

/// The state file's side of the status.
pub struct StateFileStatus<'a> {
    pub path: &'a std::path::Path,
    pub writes: u64,
    pub write_errors: u64,
}

/// The metrics view of a status.
pub fn metrics_view<'a>(st: &Status<'a>) -> View<'a> {
    View {
        metrics: st.metrics,
        snapshot: st.snapshot,
        now: st.now,
        started: st.started,
        max_connections: st.max_connections,
        consul_failures: st.watch.failures,
        consul_requests: st.watch.requests,
        consul_traffic: st.watch.traffic,
        synced: st.source == Some(Source::Consul),
        from_file: matches!(st.source, Some(Source::File { .. })),
        state_file_writes: st.state_file.as_ref().map_or(0, |f| f.writes),
        state_file_write_errors: st.state_file.as_ref().map_or(0, |f| f.write_errors),
        asking: st.asking,
        expiry: st.expiry,
    }
}
