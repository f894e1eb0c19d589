//! The metrics registry (SPEC §7): plain counters in fixed arrays, owned by
//! the single loop thread, so recording costs one add and no lock or
//! allocation; the Prometheus text exposition (format 0.0.4) is rendered
//! only when scraped.

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use crate::agent::Outcome;
use crate::consul::watch::ErrorReason;
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
    pub accept_errors: u64,
    pub consul_requests: u64,
    pub consul_errors: [u64; ErrorReason::ALL.len()],
    pub consul_unchanged: u64,
    pub consul_index_resets: u64,
    pub swaps: u64,
    pub invalid_values: [u64; InvalidReason::ALL.len()],
    pub last_success: Option<Instant>,
    pub last_change: Option<SystemTime>,
}

impl Metrics {
    pub fn count_request(&mut self, outcome: Outcome, took: Option<Duration>) {
        self.requests[outcome.index()] += 1;
        if let Some(d) = took {
            self.request_duration.observe(d);
        }
    }

    pub fn count_consul_error(&mut self, reason: ErrorReason) {
        self.consul_errors[reason.index()] += 1;
    }
}

/// What the exposition needs besides the counters.
pub struct View<'a> {
    pub metrics: &'a Metrics,
    pub snapshot: Option<&'a Snapshot>,
    pub now: Instant,
    pub started: SystemTime,
    pub max_connections: usize,
}

/// Renders the whole exposition.
pub fn render(v: &View<'_>) -> String {
    let m = v.metrics;
    let mut o = String::with_capacity(8 * 1024);
    let p = "gitlab_haproxy_agent_";

    family(&mut o, &format!("{p}requests_total"), "counter", "Agent-check connections by how they ended: a reply of that admin state, or why no reply was sent.");
    for outcome in Outcome::ALL {
        sample(
            &mut o,
            &format!("{p}requests_total{{outcome=\"{}\"}}", outcome.label()),
            m.requests[outcome.index()] as f64,
        );
    }

    let h = &m.request_duration;
    let name = format!("{p}request_duration_seconds");
    family(
        &mut o,
        &name,
        "histogram",
        "Time from accepting an agent-check connection to its reply written.",
    );
    let mut cumulative = 0;
    for (i, b) in DURATION_BUCKETS.iter().enumerate() {
        cumulative += h.counts[i];
        sample(
            &mut o,
            &format!("{name}_bucket{{le=\"{b}\"}}"),
            cumulative as f64,
        );
    }
    sample(
        &mut o,
        &format!("{name}_bucket{{le=\"+Inf\"}}"),
        h.count as f64,
    );
    sample(&mut o, &format!("{name}_sum"), h.sum_ns as f64 / 1e9);
    sample(&mut o, &format!("{name}_count"), h.count as f64);

    gauge(
        &mut o,
        &format!("{p}open_connections"),
        "Agent-check connections open now.",
        m.open_connections as f64,
    );
    gauge(
        &mut o,
        &format!("{p}max_connections"),
        "The -max-connections limit.",
        v.max_connections as f64,
    );
    counter(
        &mut o,
        &format!("{p}connection_limit_reached_total"),
        "Times accepting paused because -max-connections was reached.",
        m.gate_closings,
    );
    counter(
        &mut o,
        &format!("{p}accept_errors_total"),
        "Accept failures (e.g. out of file descriptors); accepting pauses briefly after each.",
        m.accept_errors,
    );

    gauge(
        &mut o,
        &format!("{p}synced"),
        "1 once a first consul read completed (the agent answers), else 0.",
        v.snapshot.is_some() as u8 as f64,
    );
    gauge(
        &mut o,
        &format!("{p}state_keys"),
        "Valid identities in the state the agent answers from.",
        v.snapshot.map_or(0, |s| s.len()) as f64,
    );
    let name = format!("{p}state_invalid_keys");
    family(
        &mut o,
        &name,
        "gauge",
        "KV keys dropped from the current state (answered as absent), by reason.",
    );
    for r in InvalidReason::ALL {
        let n = v
            .snapshot
            .map_or(0, |s| s.invalid().iter().filter(|k| k.reason == r).count());
        sample(
            &mut o,
            &format!("{name}{{reason=\"{}\"}}", r.label()),
            n as f64,
        );
    }
    let name = format!("{p}invalid_values_total");
    family(
        &mut o,
        &name,
        "counter",
        "Invalid KV keys or values seen, counted once per change, by reason.",
    );
    for r in InvalidReason::ALL {
        sample(
            &mut o,
            &format!("{name}{{reason=\"{}\"}}", r.label()),
            m.invalid_values[r.index()] as f64,
        );
    }
    counter(
        &mut o,
        &format!("{p}state_swaps_total"),
        "New states swapped in (consul index moved forward).",
        m.swaps,
    );
    let change = m.last_change.map_or(0.0, unix_seconds);
    gauge(
        &mut o,
        &format!("{p}state_last_change_timestamp_seconds"),
        "Unix time of the last state swap (0 before the first).",
        change,
    );

    counter(
        &mut o,
        &format!("{p}consul_requests_total"),
        "Requests sent to consul.",
        m.consul_requests,
    );
    let name = format!("{p}consul_errors_total");
    family(
        &mut o,
        &name,
        "counter",
        "Failed consul requests, by reason.",
    );
    for r in ErrorReason::ALL {
        sample(
            &mut o,
            &format!("{name}{{reason=\"{}\"}}", r.label()),
            m.consul_errors[r.index()] as f64,
        );
    }
    counter(
        &mut o,
        &format!("{p}consul_unchanged_total"),
        "Consul responses that did not move the index (blocking-query timeouts, spurious wakes).",
        m.consul_unchanged,
    );
    counter(
        &mut o,
        &format!("{p}consul_index_resets_total"),
        "Times X-Consul-Index went backwards and the watch restarted from 0.",
        m.consul_index_resets,
    );
    gauge(
        &mut o,
        &format!("{p}consul_index"),
        "X-Consul-Index of the state the agent answers from.",
        v.snapshot.map_or(0, |s| s.index()) as f64,
    );
    let age = m
        .last_success
        .map_or(-1.0, |t| v.now.saturating_duration_since(t).as_secs_f64());
    gauge(
        &mut o,
        &format!("{p}consul_last_success_age_seconds"),
        "Seconds since the last successful consul read (-1 before the first).",
        age,
    );

    let name = format!("{p}build_info");
    family(&mut o, &name, "gauge", "Build information; always 1.");
    let commit = option_env!("GIT_COMMIT").unwrap_or("unknown");
    sample(
        &mut o,
        &format!(
            "{name}{{version=\"{}\",commit=\"{}\"}}",
            crate::config::version(),
            escape_label(commit)
        ),
        1.0,
    );

    process_metrics(&mut o, v.started);
    o
}

fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(o: &mut String, series: &str, value: f64) {
    let _ = writeln!(o, "{series} {value}");
}

fn gauge(o: &mut String, name: &str, help: &str, value: f64) {
    family(o, name, "gauge", help);
    sample(o, name, value);
}

fn counter(o: &mut String, name: &str, help: &str, value: u64) {
    family(o, name, "counter", help);
    sample(o, name, value as f64);
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The standard `process_*` metrics, read from /proc at scrape time.
fn process_metrics(o: &mut String, started: SystemTime) {
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the `(comm)`, which may itself hold spaces.
        if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) {
            let f: Vec<&str> = rest.split(' ').collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            // utime, stime are fields 14, 15 (1-based), here 11, 12; vsize 23 -> 20; rss 24 -> 21.
            gauge_kind(
                o,
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                (num(11) + num(12)) / ticks,
            );
            gauge(
                o,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                num(20),
            );
            gauge(
                o,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                num(21) * page,
            );
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        gauge(
            o,
            "process_open_fds",
            "Number of open file descriptors.",
            dir.count() as f64,
        );
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        gauge(
            o,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            lim.rlim_cur as f64,
        );
    }
    gauge(
        o,
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        unix_seconds(started),
    );
}

fn gauge_kind(o: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    family(o, name, kind, help);
    sample(o, name, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(m: &Metrics) -> String {
        render(&View {
            metrics: m,
            snapshot: None,
            now: Instant::now(),
            started: SystemTime::now(),
            max_connections: 10,
        })
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
}
