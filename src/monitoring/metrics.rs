//! The metrics registry: plain counters in fixed arrays, owned by
//! the single loop thread, so recording costs one add and no lock or
//! allocation; the Prometheus text exposition (format 0.0.4) is rendered
//! only when scraped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::agent::Outcome;
use crate::consul::client::Traffic;
use crate::consul::error::ErrorReason;
use crate::http::server::Role;
use crate::labels::label_enum;
use crate::slice::Slice;
use crate::state::unasked::Asking;
use crate::state::{InvalidReason, Snapshot};

/// Upper bounds (seconds) of the request duration histogram: answers take
/// microseconds, stalls milliseconds, timeouts seconds.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.5, 1.0, 5.0,
];

/// A histogram with fixed buckets (counts per bucket, not cumulative).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: [u64; DURATION_BUCKETS.len() + 1],
    sum_ns: u128,
    count: u64,
}

impl Histogram {
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.counts[i] += 1;
        self.sum_ns += d.as_nanos();
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Everything the loop counts.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: [u64; Outcome::ALL.len()],
    pub request_duration: Histogram,
    pub open_connections: u64,
    pub gate_closings: u64,
    /// Agent connections closed at the limit to make room for a new one.
    pub connections_evicted: u64,
    /// Agent connections closed at accept: source outside `-listen-allow`.
    pub connections_disallowed: u64,
    pub accept_errors: u64,
    /// Poll (epoll_wait) errors other than EINTR.
    pub poll_errors: u64,
    pub consul_errors: [u64; ErrorReason::ALL.len()],
    pub consul_unchanged: u64,
    pub consul_index_resets: u64,
    pub swaps: u64,
    pub invalid_values: [u64; InvalidReason::ALL.len()],
    pub last_success: Option<Instant>,
    pub last_change: Option<SystemTime>,
    /// HTTP connections closed by the agent, by listener and [`HttpDrop`].
    pub http_dropped: [[u64; HttpDrop::ALL.len()]; Role::ALL.len()],
    /// How long each loop turn's work took (from `poll` returning to the
    /// next `poll`).
    pub loop_turn: Histogram,
    /// The longest turn since the last `/-/metrics` render.
    pub loop_turn_max: Duration,
}

label_enum! {
    /// Why the agent closed an HTTP connection itself (metric label `reason`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum HttpDrop {
        /// The listener's pool was full: the oldest connection without a
        /// complete request made room for a new one.
        Evicted => "evicted",
        /// The pool was full of requests being answered: the new one closed.
        Refused => "refused",
        /// Idle, head, body or write deadline passed.
        Timeout => "timeout",
    }
}

impl Metrics {
    pub fn count_request(&mut self, outcome: Outcome, took: Option<Duration>) {
        self.requests[outcome.index()] += 1;
        if let Some(d) = took {
            self.request_duration.observe(d);
        }
    }

    /// A count that moves when the state changes (a swap, an index reset)
    /// or consul fails: `/debug/state` is reused for at most a second,
    /// and never across such a change. Answered checks do not count: they
    /// never stop, and a 100,000-key render per request would let one
    /// client keep a core busy (last asks are then at most a second old).
    pub fn state_changes(&self) -> u64 {
        let errors: u64 = self.consul_errors.iter().sum();
        errors + self.swaps + self.consul_index_resets
    }

    /// [`Metrics::state_changes`] and every answered check and consul
    /// answer: `/-/metrics` (a fraction of a millisecond) is reused only
    /// while no counter moved, so a scrape never reads counters older than
    /// what it caused.
    pub fn changes(&self) -> u64 {
        let requests: u64 = self.requests.iter().sum();
        self.state_changes() + requests + self.consul_unchanged
    }

    /// One loop turn's work took `d`.
    pub fn count_turn(&mut self, d: Duration) {
        self.loop_turn.observe(d);
        self.loop_turn_max = self.loop_turn_max.max(d);
    }

    pub fn count_consul_error(&mut self, reason: ErrorReason) {
        self.consul_errors[reason.index()] += 1;
    }

    pub fn count_http_drop(&mut self, role: Role, why: HttpDrop) {
        self.http_dropped[role.index()][why.index()] += 1;
    }
}

/// What the exposition needs besides the counters.
pub struct View<'a> {
    pub metrics: &'a Metrics,
    pub snapshot: Option<&'a Snapshot>,
    pub now: Instant,
    pub started: SystemTime,
    pub max_connections: usize,
    /// Consecutive failed consul requests (0 after a success).
    pub consul_failures: u32,
    /// Requests sent to consul so far.
    pub consul_requests: u64,
    /// Bytes from consul, what it said of its cluster, stale re-asks.
    pub consul_traffic: Traffic,
    /// Answering from a complete consul read (not nothing, not the file).
    pub synced: bool,
    /// Answering from the state file, until consul answers.
    pub from_file: bool,
    /// State files written, and writes that failed.
    pub state_file_writes: u64,
    pub state_file_write_errors: u64,
    /// Who asks for what (`None` in tests that do not look).
    pub asking: Option<Asking<'a>>,
    /// Diverted keys past their expiry.
    pub expiry: crate::state::expiry::Shown,
}

/// At most this many `diverted_key_last_asked_timestamp_seconds` series
/// (the most recently asked first, then by identity); the rest are counted.
pub const MAX_DIVERTED_SERIES: usize = 1000;

const P: &str = "gitlab_haproxy_agent_";

/// The exposition (text format 0.0.4) being rendered, a slice of the
/// loop's time at a time: every family but the per-key last-ask series is
/// written at once (a fixed amount of work); those series are chosen from
/// the diverted entries slice by slice ([`MetricsRender::step`]), then
/// written last ([`MetricsRender::finish`]).
#[derive(Debug)]
pub struct MetricsRender {
    out: Exposition,
    /// The state the series are chosen from.
    state: Option<Arc<Snapshot>>,
    pos: usize,
    /// The best [`MAX_DIVERTED_SERIES`] so far (the worst on top).
    chosen: BinaryHeap<Series>,
    diverted: usize,
}

/// One per-key last-ask series, ranked (the smaller first): the most
/// recently asked first (never asked last), then by identity. A key this
/// agent's haproxy asks is never left out for one it does not ask: the
/// fleet's max for it would be another agent's 0, and the fleet alert would
/// fire for a key that is asked.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Series {
    /// Unix seconds of the last ask (0: never), the latest first.
    last_asked: Reverse<u64>,
    identity: Box<str>,
}

impl MetricsRender {
    /// Writes every family but the per-key series; `state` is `v`'s
    /// snapshot, shared, for the slices to come.
    pub fn new(v: &View<'_>, state: Option<Arc<Snapshot>>) -> MetricsRender {
        let mut o = Exposition(String::with_capacity(16 * 1024));
        agent_requests(&mut o, v);
        http_connections(&mut o, v.metrics);
        self::state(&mut o, v);
        asks(&mut o, v);
        consul(&mut o, v);
        process(&mut o, v);
        MetricsRender {
            out: o,
            state,
            pos: 0,
            chosen: BinaryHeap::new(),
            diverted: 0,
        }
    }

    /// Chooses the series among more diverted entries until the slice is
    /// spent; `true` once all are seen.
    pub fn step(&mut self, asking: Option<Asking<'_>>, slice: &mut Slice) -> bool {
        let (Some(s), Some(a)) = (self.state.as_deref(), asking) else {
            return true;
        };
        for d in s.diverted_from(&mut self.pos) {
            self.diverted += 1;
            let last_asked = Reverse(a.clock.unix_seconds(d.last_asked));
            let worst = self.chosen.peek();
            let better = self.chosen.len() < MAX_DIVERTED_SERIES
                || worst.is_some_and(|w| (last_asked, d.identity) < (w.last_asked, &*w.identity));
            if better {
                self.chosen.push(Series {
                    last_asked,
                    identity: d.identity.into(),
                });
                if self.chosen.len() > MAX_DIVERTED_SERIES {
                    self.chosen.pop();
                }
            }
            if slice.spent(d.identity.len()) {
                break;
            }
        }
        self.pos >= s.len()
    }

    /// Writes the per-key series (at most [`MAX_DIVERTED_SERIES`]: a
    /// bounded amount of work) and returns the exposition.
    pub fn finish(mut self) -> String {
        let o = &mut self.out;
        o.family(
            "diverted_key_last_asked_timestamp_seconds",
            "gauge",
            "Per diverted key (reply not ready 100%): Unix time a check last asked for it here, 0 = never. The max over the fleet finds keys no haproxy asks for.",
        );
        for s in self.chosen.into_sorted_vec() {
            o.int(
                "diverted_key_last_asked_timestamp_seconds",
                &[("identity", &s.identity)],
                s.last_asked.0,
            );
        }
        o.gauge(
            "diverted_keys_over_series_limit",
            "Diverted keys left out of diverted_key_last_asked_timestamp_seconds (at most 1000 series; the most recently asked come first).",
            self.diverted.saturating_sub(MAX_DIVERTED_SERIES) as f64,
        );
        self.out.0
    }
}

/// The whole exposition at once (tests, and off the loop).
#[cfg(test)]
pub fn render(v: &View<'_>, state: Option<Arc<Snapshot>>) -> String {
    let mut r = MetricsRender::new(v, state);
    while !r.step(v.asking, &mut Slice::unlimited()) {}
    r.finish()
}

/// Agent-check connections: outcomes, reply latency, the connection limit.
fn agent_requests(o: &mut Exposition, v: &View<'_>) {
    let m = v.metrics;
    o.family("requests_total", "counter", "Agent-check connections by how they ended: a reply of that admin state, or why no reply was sent.");
    for outcome in Outcome::ALL {
        o.int(
            "requests_total",
            &[("outcome", outcome.label())],
            m.requests[outcome.index()],
        );
    }
    o.histogram(
        "request_duration_seconds",
        "Time from accepting an agent-check connection to its reply written (replies only).",
        &m.request_duration,
    );
    o.gauge(
        "open_connections",
        "Agent-check connections open now.",
        m.open_connections as f64,
    );
    o.gauge(
        "max_connections",
        "The -max-connections limit.",
        v.max_connections as f64,
    );
    o.counter(
        "connection_limit_reached_total",
        "Times accepting paused because -max-connections was reached (gate closings).",
        m.gate_closings,
    );
    o.counter(
        "connections_evicted_total",
        "Agent connections without a complete line closed at -max-connections to make room for a new one (a flood of idle connections?).",
        m.connections_evicted,
    );
    o.counter(
        "connections_disallowed_total",
        "Agent connections closed at accept without a reply: source address outside -listen-allow.",
        m.connections_disallowed,
    );
    o.counter(
        "accept_errors_total",
        "Accept failures (e.g. out of file descriptors); accepting pauses briefly after each.",
        m.accept_errors,
    );
}

/// Connections to the monitoring, pprof and dev KV listeners.
fn http_connections(o: &mut Exposition, m: &Metrics) {
    o.family(
        "http_connections_dropped_total",
        "counter",
        "Monitoring, pprof and dev KV connections the agent closed itself, by listener and reason (evicted from a full pool, refused by a pool full of requests in progress, or timed out).",
    );
    for role in Role::ALL {
        for why in HttpDrop::ALL {
            o.int(
                "http_connections_dropped_total",
                &[("listener", role.label()), ("reason", why.label())],
                m.http_dropped[role.index()][why.index()],
            );
        }
    }
}

/// The state the agent answers from.
fn state(o: &mut Exposition, v: &View<'_>) {
    let m = v.metrics;
    o.gauge(
        "synced",
        "1 once a first consul read completed (the agent answers consul's state), else 0 (no read yet, or answering from the state file).",
        f64::from(u8::from(v.synced)),
    );
    o.gauge(
        "state_from_file",
        "1 while the agent answers from the state file read at start (readiness 200, consul not read yet), else 0.",
        f64::from(u8::from(v.from_file)),
    );
    o.counter(
        "state_file_writes_total",
        "State files written (-state-file): one per change at most, coalesced under churn, and an unchanged state rewritten every quarter of -state-max-age (at most hourly).",
        v.state_file_writes,
    );
    o.counter(
        "state_file_write_errors_total",
        "State file writes that failed (permissions, disk full, read-only); answers go on.",
        v.state_file_write_errors,
    );
    o.gauge(
        "state_keys",
        "Valid identities in the state the agent answers from.",
        v.snapshot.map_or(0, |s| s.len()) as f64,
    );
    o.family(
        "state_invalid_keys",
        "gauge",
        "KV keys dropped from the current state (answered as absent), by reason.",
    );
    for r in InvalidReason::ALL {
        let n = v
            .snapshot
            .map_or(0, |s| s.invalid().iter().filter(|k| k.reason == r).count());
        o.int("state_invalid_keys", &[("reason", r.label())], n as u64);
    }
    o.family(
        "invalid_values_total",
        "counter",
        "Invalid KV keys or values seen, counted once per change, by reason.",
    );
    for r in InvalidReason::ALL {
        o.int(
            "invalid_values_total",
            &[("reason", r.label())],
            m.invalid_values[r.index()],
        );
    }
    o.counter(
        "state_swaps_total",
        "New states swapped in (consul index moved forward; not every swap changes an answer).",
        m.swaps,
    );
    o.gauge(
        "state_last_change_timestamp_seconds",
        "Unix time the state last changed: first read, an identity added, removed or rewritten, or a new invalid value (0 before the first read).",
        m.last_change.map_or(0.0, unix_seconds),
    );
}

/// Who asks for what: unasked keys and identities asked without a key
/// (per diverted key its last ask comes last, see [`MetricsRender`]).
fn asks(o: &mut Exposition, v: &View<'_>) {
    let a = v.asking;
    o.gauge(
        "state_unasked_keys",
        "Diverted keys (reply not ready 100%) no check asked for within -unasked-after: the write changes nothing here (see /debug/state for the identity meant).",
        a.map_or(0, |a| a.unasked.len()) as f64,
    );
    o.gauge(
        "state_expired_keys",
        "Diverted keys past the expiry a writer's -for put in their consul Flags: still answered as KV says (the agent never acts on it); undo them or set them again with a new -for.",
        v.expiry.expired as f64,
    );
    o.gauge(
        "unknown_identities",
        "Identities checks asked for that have no key (their last ask is kept, at most -max-unknown-identities).",
        a.map_or(0, |a| a.strangers.len()) as f64,
    );
    o.counter(
        "unknown_identities_overflow_total",
        "Asks for an identity without a key that were not recorded because -max-unknown-identities was reached.",
        a.map_or(0, |a| a.strangers.overflow()),
    );
}

/// The consul watch.
fn consul(o: &mut Exposition, v: &View<'_>) {
    let m = v.metrics;
    o.counter(
        "consul_requests_total",
        "Requests sent to consul.",
        v.consul_requests,
    );
    o.family(
        "consul_errors_total",
        "counter",
        "Failed consul requests, by reason.",
    );
    for r in ErrorReason::ALL {
        o.int(
            "consul_errors_total",
            &[("reason", r.label())],
            m.consul_errors[r.index()],
        );
    }
    o.gauge(
        "consul_consecutive_failures",
        "Consul requests failed in a row (0 after a success): non-zero means consul is unhealthy now.",
        f64::from(v.consul_failures),
    );
    o.counter(
        "consul_unchanged_total",
        "Consul responses that did not move the index (blocking-query timeouts, spurious wakes).",
        m.consul_unchanged,
    );
    o.counter(
        "consul_index_resets_total",
        "Times X-Consul-Index went backwards and the watch restarted from 0.",
        m.consul_index_resets,
    );
    o.gauge(
        "consul_index",
        "X-Consul-Index of the state the agent answers from (0 before the first read).",
        v.snapshot.map_or(0, |s| s.index()) as f64,
    );
    o.gauge(
        "consul_last_success_age_seconds",
        "Seconds since the last successful consul read (-1 before the first); grows up to -consul-wait between reads when nothing changes.",
        m.last_success
            .map_or(-1.0, |t| v.now.saturating_duration_since(t).as_secs_f64()),
    );
    consul_cluster(o, &v.consul_traffic);
}

/// What consul sent and said of its cluster (fleet scale: bytes per write,
/// stale reads).
fn consul_cluster(o: &mut Exposition, t: &Traffic) {
    o.counter(
        "consul_received_bytes_total",
        "Bytes received from consul on the wire (gzip bodies counted compressed).",
        t.bytes_received,
    );
    o.gauge(
        "consul_last_contact_seconds",
        "X-Consul-LastContact of the last consul response that carried it: how long the answering server had not heard from the leader (0 on the leader; -1 before any).",
        t.last_contact.map_or(-1.0, |d| d.as_secs_f64()),
    );
    o.counter(
        "consul_stale_reasked_total",
        "Stale answers past -consul-max-stale (or not saying how stale) discarded and asked again of the leader.",
        t.stale_reasks,
    );
    o.gauge(
        "consul_known_leader",
        "1 when the last consul response that said so knew a leader (X-Consul-KnownLeader: true), else 0 (also before any).",
        if t.known_leader == Some(true) { 1.0 } else { 0.0 },
    );
}

/// The loop and the process: turn times, poll errors, dropped log lines,
/// build, then what /proc says.
fn process(o: &mut Exposition, v: &View<'_>) {
    o.histogram(
        "loop_turn_seconds",
        "Time each event-loop turn spent working (between two polls): checks wait at most this long behind the agent's own work.",
        &v.metrics.loop_turn,
    );
    o.gauge(
        "loop_turn_max_seconds",
        "The longest event-loop turn since the last /-/metrics render (a stall between scrapes shows here).",
        v.metrics.loop_turn_max.as_secs_f64(),
    );
    o.counter(
        "poll_errors_total",
        "Errors from the event loop's poll (epoll_wait) other than EINTR; the loop survives them, and exits only when they persist.",
        v.metrics.poll_errors,
    );
    o.counter(
        "log_lines_dropped_total",
        "Log lines dropped because the log reader (stderr: journald, a container pipe) was too slow and the bounded queue was full; the loop never waits on a log write.",
        crate::logging::dropped(),
    );
    o.family("build_info", "gauge", "Build information; always 1.");
    o.int(
        "build_info",
        &[
            ("version", crate::build_info::version()),
            ("commit", crate::build_info::commit()),
        ],
        1,
    );
    process_metrics(o, v.started);
}

/// The exposition being written. Names given without the `process_` prefix
/// get the agent's prefix.
#[derive(Debug)]
struct Exposition(String);

impl Exposition {
    fn name(name: &str) -> (&'static str, &str) {
        if name.starts_with("process_") {
            ("", name)
        } else {
            (P, name)
        }
    }

    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let (p, name) = Self::name(name);
        let help = escape_help(help);
        let _ = writeln!(self.0, "# HELP {p}{name} {help}\n# TYPE {p}{name} {kind}");
    }

    fn series(&mut self, name: &str, labels: &[(&str, &str)]) {
        let (p, name) = Self::name(name);
        let _ = write!(self.0, "{p}{name}");
        for (i, (k, v)) in labels.iter().enumerate() {
            let sep = if i == 0 { '{' } else { ',' };
            let _ = write!(self.0, "{sep}{k}=\"{}\"", escape_label(v));
        }
        if !labels.is_empty() {
            self.0.push('}');
        }
    }

    fn int(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.series(name, labels);
        let _ = writeln!(self.0, " {value}");
    }

    fn float(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.series(name, labels);
        let _ = writeln!(self.0, " {}", format_float(value));
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, "gauge", help);
        self.float(name, &[], value);
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, "counter", help);
        self.int(name, &[], value);
    }

    /// Cumulative `le` buckets, `+Inf` equal to `_count`, then `_sum`.
    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (i, b) in DURATION_BUCKETS.iter().enumerate() {
            cumulative += h.counts[i];
            self.int(&bucket, &[("le", &format_float(*b))], cumulative);
        }
        self.int(&bucket, &[("le", "+Inf")], h.count);
        self.float(&format!("{name}_sum"), &[], h.sum_ns as f64 / 1e9);
        self.int(&format!("{name}_count"), &[], h.count);
    }
}

/// A sample value as the text format wants it: `+Inf`, `-Inf`, `NaN`, or
/// a plain decimal (Rust's `Display` never uses an exponent).
fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        v.to_string()
    }
}

/// Label values: `\`, `"` and line feed escaped (text format 0.0.4).
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// HELP text: `\` and line feed escaped (text format 0.0.4).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The fields of `/proc/self/stat` the `process_*` metrics need, in the
/// units the kernel gives (clock ticks, bytes, pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    utime_ticks: u64,
    stime_ticks: u64,
    start_ticks: u64,
    vsize_bytes: u64,
    rss_pages: u64,
}

/// Parses `/proc/<pid>/stat` (proc(5)): fields after the `(comm)`, which
/// may itself hold spaces and parentheses, so split after the last `)`.
fn parse_proc_stat(stat: &str) -> Option<ProcStat> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    // rest[0] is field 3 (state); field n (1-based) is rest[n - 3].
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        utime_ticks: num(14)?,
        stime_ticks: num(15)?,
        start_ticks: num(22)?,
        vsize_bytes: num(23)?,
        rss_pages: num(24)?,
    })
}

/// `btime` (boot time, unix seconds) from `/proc/stat`.
fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The standard `process_*` metrics (as the Prometheus Go client names
/// them), read from /proc at scrape time.
fn process_metrics(o: &mut Exposition, started: SystemTime) {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    let stat = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_proc_stat(&s));
    if let Some(st) = stat {
        o.family(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
        );
        o.float(
            "process_cpu_seconds_total",
            &[],
            (st.utime_ticks + st.stime_ticks) as f64 / ticks,
        );
        o.gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            st.vsize_bytes as f64,
        );
        o.gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            st.rss_pages as f64 * page,
        );
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // read_dir's own descriptor is counted too, as the Go client does.
        o.gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            dir.count() as f64,
        );
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        o.gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            lim.rlim_cur as f64,
        );
    }
    // The kernel's start time (boot time + start ticks), as the Go client
    // reports it; the loop's own start time where /proc cannot say.
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| parse_boot_time(&s));
    let start = match (stat, boot) {
        (Some(st), Some(boot)) => boot as f64 + st.start_ticks as f64 / ticks,
        _ => unix_seconds(started),
    };
    o.gauge(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        start,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(m: &Metrics) -> String {
        render(&view(m), None)
    }

    fn view(m: &Metrics) -> View<'_> {
        View {
            metrics: m,
            snapshot: None,
            now: Instant::now(),
            started: SystemTime::now(),
            max_connections: 10,
            consul_failures: 0,
            consul_requests: 0,
            consul_traffic: Traffic::default(),
            synced: false,
            from_file: false,
            state_file_writes: 0,
            state_file_write_errors: 0,
            asking: None,
            expiry: Default::default(),
        }
    }

    fn value(text: &str, series: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("{series} missing"));
        line[series.len() + 1..].parse().unwrap()
    }

    #[test]
    fn counters_show_what_was_recorded() {
        let mut m = Metrics::default();
        m.count_request(Outcome::Drain, Some(Duration::from_micros(30)));
        m.count_request(Outcome::Drain, Some(Duration::from_millis(3)));
        m.count_request(Outcome::NoNewline, None);
        m.count_consul_error(ErrorReason::Timeout);
        m.poll_errors = 2;
        let t = scrape(&m);
        assert_eq!(
            value(&t, "gitlab_haproxy_agent_requests_total{outcome=\"drain\"}"),
            2.0
        );
        assert_eq!(
            value(
                &t,
                "gitlab_haproxy_agent_requests_total{outcome=\"no_newline\"}"
            ),
            1.0
        );
        assert_eq!(
            value(&t, "gitlab_haproxy_agent_requests_total{outcome=\"ready\"}"),
            0.0
        );
        assert_eq!(
            value(
                &t,
                "gitlab_haproxy_agent_consul_errors_total{reason=\"timeout\"}"
            ),
            1.0
        );
        // Buckets are cumulative: 30 µs lands in le=5e-5, 3 ms in le=0.005.
        assert_eq!(
            value(
                &t,
                "gitlab_haproxy_agent_request_duration_seconds_bucket{le=\"0.000025\"}"
            ),
            0.0
        );
        assert_eq!(
            value(
                &t,
                "gitlab_haproxy_agent_request_duration_seconds_bucket{le=\"0.00005\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &t,
                "gitlab_haproxy_agent_request_duration_seconds_bucket{le=\"0.005\"}"
            ),
            2.0
        );
        assert_eq!(
            value(
                &t,
                "gitlab_haproxy_agent_request_duration_seconds_bucket{le=\"+Inf\"}"
            ),
            2.0
        );
        assert_eq!(
            value(&t, "gitlab_haproxy_agent_request_duration_seconds_count"),
            2.0
        );
        assert!(
            (value(&t, "gitlab_haproxy_agent_request_duration_seconds_sum") - 0.00303).abs() < 1e-9
        );
        assert_eq!(value(&t, "gitlab_haproxy_agent_synced"), 0.0);
        assert_eq!(value(&t, "gitlab_haproxy_agent_poll_errors_total"), 2.0);
        assert_eq!(
            value(&t, "gitlab_haproxy_agent_consul_last_success_age_seconds"),
            -1.0
        );
        assert!(value(&t, "process_resident_memory_bytes") > 0.0);
    }

    #[test]
    fn every_family_has_help_and_type_once() {
        let t = scrape(&Metrics::default());
        let mut seen = std::collections::HashSet::new();
        for l in t.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = l.split(' ').nth(2).unwrap();
            assert!(seen.insert(name.to_owned()), "{name} twice");
            assert!(
                t.contains(&format!("# HELP {name} ")),
                "{name} without HELP"
            );
        }
        assert!(seen.contains("gitlab_haproxy_agent_request_duration_seconds"));
    }

    /// Regression (issue 27): the cap kept unasked keys first, so an agent
    /// with 1,000 unasked keys exported none of the keys its haproxy asks;
    /// the fleet's max for those was another agent's 0, and the fleet alert
    /// fired for keys that are asked.
    #[test]
    fn diverted_keys_last_asks_are_capped_most_recently_asked_first() {
        use crate::kv::KvPair;
        use crate::state::unasked::Unasked;
        use crate::state::{Clock, Swapper};
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut state = Swapper::new("p", Clock::new(t0, wall), 8);
        // 1,002 diverted keys: "b/k0000".."b/k1001", and one ready key.
        let mut pairs: Vec<KvPair> = (0..MAX_DIVERTED_SERIES + 2)
            .map(|i| KvPair {
                key: format!("p/b/k{i:04}"),
                value: b"drain".to_vec(),
                modify_index: 1,
                flags: 0,
            })
            .collect();
        pairs.push(KvPair {
            key: "p/b/ready".into(),
            value: b"ready".to_vec(),
            modify_index: 1,
            flags: 0,
        });
        state.swap(Snapshot::build("p", 1, pairs), t0);
        // k0000..k0997 asked at 30 s, k1000 and k1001 at 50 s (the last in
        // identity order, the most recent), k0998 and k0999 never;
        // "nobody/asks" has no key.
        for i in 0..MAX_DIVERTED_SERIES - 2 {
            state.answer(
                format!("b/k{i:04}").as_bytes(),
                t0 + Duration::from_secs(30),
            );
        }
        for k in ["b/k1000", "b/k1001"] {
            state.answer(k.as_bytes(), t0 + Duration::from_secs(50));
        }
        state.answer(b"nobody/asks", t0 + Duration::from_secs(30));
        let mut unasked = Unasked::new(Duration::from_secs(60), t0);
        unasked.step(
            &mut state,
            t0 + Duration::from_secs(61),
            &mut Slice::unlimited(),
        );
        let m = Metrics::default();
        let mut view = view(&m);
        view.snapshot = state.current();
        view.asking = Some(Asking {
            clock: state.clock(),
            strangers: state.strangers(),
            unasked: &unasked,
            previous: None,
        });
        let t = render(&view, state.shared());
        // Chosen a few entries a slice, the same series.
        let mut sliced = MetricsRender::new(&view, state.shared());
        let mut slices = 0;
        while !sliced.step(view.asking, &mut Slice::items(100)) {
            slices += 1;
        }
        assert!(slices > 9, "{slices} slices");
        let keyed = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| l.contains("diverted"))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(keyed(&sliced.finish()), keyed(&t));
        let series = "gitlab_haproxy_agent_diverted_key_last_asked_timestamp_seconds";
        let n = t
            .lines()
            .filter(|l| l.starts_with(&format!("{series}{{")))
            .count();
        assert_eq!(n, MAX_DIVERTED_SERIES);
        assert_eq!(
            value(&t, "gitlab_haproxy_agent_diverted_keys_over_series_limit"),
            2.0
        );
        assert_eq!(value(&t, "gitlab_haproxy_agent_state_unasked_keys"), 2.0);
        assert_eq!(value(&t, "gitlab_haproxy_agent_unknown_identities"), 1.0);
        // Every asked key is in, the most recent too, whatever its name.
        assert_eq!(
            value(&t, &format!("{series}{{identity=\"b/k1001\"}}")),
            1_000_050.0
        );
        assert_eq!(
            value(&t, &format!("{series}{{identity=\"b/k0000\"}}")),
            1_000_030.0
        );
        assert!(!t.contains("b/ready"), "ready keys are not diverted");
        for never in ["b/k0998\"", "b/k0999\""] {
            assert!(!t.contains(never), "never asked: past the cap");
        }
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut o = Exposition(String::new());
        o.family("x", "gauge", "a \\ b\nc");
        o.int("x", &[("v", "q\"b\\s\nn"), ("w", "ok")], 1);
        assert_eq!(
            o.0,
            concat!(
                "# HELP gitlab_haproxy_agent_x a \\\\ b\\nc\n",
                "# TYPE gitlab_haproxy_agent_x gauge\n",
                "gitlab_haproxy_agent_x{v=\"q\\\"b\\\\s\\nn\",w=\"ok\"} 1\n"
            )
        );
    }

    #[test]
    fn floats_in_the_text_format() {
        assert_eq!(format_float(0.000_01), "0.00001");
        assert_eq!(format_float(5.0), "5");
        assert_eq!(format_float(-1.0), "-1");
        assert_eq!(format_float(f64::INFINITY), "+Inf");
        assert_eq!(format_float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_float(f64::NAN), "NaN");
        assert_eq!(format_float(1e21), "1000000000000000000000");
    }

    #[test]
    fn histogram_edges_land_in_their_bucket_and_past_the_last_in_inf() {
        let mut m = Metrics::default();
        m.count_request(Outcome::Ready, Some(Duration::from_micros(10)));
        m.count_request(Outcome::Ready, Some(Duration::from_secs(9)));
        let t = scrape(&m);
        let b = |le: &str| {
            value(
                &t,
                &format!("gitlab_haproxy_agent_request_duration_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        assert_eq!(b("0.00001"), 1.0);
        assert_eq!(b("5"), 1.0);
        assert_eq!(b("+Inf"), 2.0);
        // Buckets never decrease.
        let counts: Vec<f64> = t
            .lines()
            .filter(|l| l.starts_with("gitlab_haproxy_agent_request_duration_seconds_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(counts.len(), DURATION_BUCKETS.len() + 1);
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    }

    #[test]
    fn every_sample_follows_its_family_and_names_follow_the_rules() {
        let t = scrape(&Metrics::default());
        let mut family: Option<(String, String)> = None;
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                match kind {
                    "counter" => assert!(name.ends_with("_total"), "{name}"),
                    _ => assert!(!name.ends_with("_total"), "{name}"),
                }
                family = Some((name.to_owned(), kind.to_owned()));
                continue;
            }
            if l.starts_with('#') {
                continue;
            }
            let (name, kind) = family.as_ref().expect("sample before any TYPE");
            let series = l.split([' ', '{']).next().unwrap();
            let ok = match kind.as_str() {
                "histogram" => [
                    format!("{name}_bucket"),
                    format!("{name}_sum"),
                    format!("{name}_count"),
                ]
                .contains(&series.to_owned()),
                _ => series == name,
            };
            assert!(ok, "{series} under family {name} ({kind})");
        }
    }

    #[test]
    fn build_info_carries_version_and_commit() {
        let t = scrape(&Metrics::default());
        let line = t
            .lines()
            .find(|l| l.starts_with("gitlab_haproxy_agent_build_info{"))
            .unwrap();
        assert!(
            line.starts_with(&format!(
                "gitlab_haproxy_agent_build_info{{version=\"{}\",commit=\"",
                crate::build_info::version()
            )),
            "{line}"
        );
        assert!(line.ends_with("\"} 1"), "{line}");
    }

    #[test]
    fn proc_stat_fields_after_a_tricky_comm() {
        // proc(5) field numbers: 14 utime, 15 stime, 22 starttime, 23 vsize, 24 rss.
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[0] = "S".into();
        let stat = format!("1234 (a) (b c) {}\n", fields.join(" "));
        assert_eq!(
            parse_proc_stat(&stat),
            Some(ProcStat {
                utime_ticks: 14,
                stime_ticks: 15,
                start_ticks: 22,
                vsize_bytes: 23,
                rss_pages: 24,
            })
        );
        assert_eq!(parse_proc_stat("1234 (x) S 1 2"), None);
        assert_eq!(parse_proc_stat("no paren"), None);
        let real = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_proc_stat(&real).is_some_and(|s| s.rss_pages > 0));
    }

    #[test]
    fn boot_time_from_proc_stat() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
        assert_eq!(parse_boot_time("cpu 1\n"), None);
    }

    #[test]
    fn process_start_time_is_near_now_for_this_process() {
        let t = scrape(&Metrics::default());
        let start = value(&t, "process_start_time_seconds");
        let now = unix_seconds(SystemTime::now());
        // This test process started within the last hour, and not in the future.
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
    }
}
