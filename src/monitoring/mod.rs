//! Observability: the metrics registry ([`metrics`]), the HTTP
//! server connection shared with the dev KV ([`server`]), and the routes of
//! the monitoring (`/-/metrics`, `/-/liveness`, `/-/readiness`) and pprof
//! (`/debug/state`) listeners. `/debug/pprof/*` answers 404 with how to
//! profile from outside ([`NO_PPROF`]): an in-process signal sampler would
//! interrupt the one answering thread and need a second thread to report.
//!
//! In: a request head and a [`Status`] view of the loop. Out: a response.
//! Always holds: handlers are pure over the view, so they never block the
//! loop and tests need no sockets; the consul token is never part of a view.

pub mod metrics;
pub mod server;

use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use crate::consul::client::Traffic;
use crate::contract::Desired;
use crate::http::{Method, RequestHead, Response};
use crate::monitoring::metrics::{Metrics, View};
use crate::state::unasked::Asking;
use crate::state::{shown_identity, Snapshot, Source, Tick};

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
}

/// The state file's side of the status.
pub struct StateFileStatus<'a> {
    pub path: &'a std::path::Path,
    pub writes: u64,
    pub write_errors: u64,
}

/// Routes of `-monitoring-addr`.
pub fn handle_monitoring(head: &RequestHead, st: &Status<'_>) -> Response {
    if let Some(r) = only_get(head) {
        return r;
    }
    match head.path.as_str() {
        "/-/liveness" => text(200, "ok\n"),
        "/-/readiness" if st.snapshot.is_some() => text(200, "ready\n"),
        "/-/readiness" => text(503, "not ready: no complete consul read yet\n"),
        "/-/metrics" => {
            let view = View {
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
            };
            let mut r = text(200, &metrics::render(&view));
            r.headers[0].1 = "text/plain; version=0.0.4; charset=utf-8".into();
            r
        }
        _ => text(
            404,
            "not found; try /-/metrics, /-/liveness, /-/readiness\n",
        ),
    }
}

/// Why `/debug/pprof/*` is not served, and what to use instead.
pub const NO_PPROF: &str = "\
CPU profiles are not served in-process: a signal-based sampler would interrupt
the single answering thread and needs a second thread to build the report.
Profile from outside instead, with no cost until you do:

    perf record -F 99 -g -p <pid> -- sleep 30
    perf report            # or: perf script | inferno-flamegraph > cpu.svg

Release builds keep line tables (profile.release debug = 1) for readable
stacks. The state the agent answers from is at /debug/state.
";

/// Routes of `-pprof-addr`.
pub fn handle_pprof(head: &RequestHead, st: &Status<'_>) -> Response {
    if let Some(r) = only_get(head) {
        return r;
    }
    match head.path.as_str() {
        "/debug/state" => {
            let only_diverted = head.query.split('&').any(|p| p == "diverted");
            let mut r = text(200, &debug_state(st, only_diverted));
            r.headers[0].1 = "application/json".into();
            r
        }
        p if p == "/debug/pprof" || p.starts_with("/debug/pprof/") => text(404, NO_PPROF),
        _ => text(404, "not found; try /debug/state\n"),
    }
}

fn only_get(head: &RequestHead) -> Option<Response> {
    match head.method {
        Method::Get | Method::Head => None,
        _ => {
            let mut r = text(405, "method not allowed\n");
            r.headers.push(("Allow", "GET, HEAD".into()));
            Some(r)
        }
    }
}

fn text(status: u16, body: &str) -> Response {
    Response {
        status,
        headers: vec![("Content-Type", "text/plain; charset=utf-8".into())],
        body: body.as_bytes().to_vec(),
    }
}

/// `/debug/state`: the snapshot the agent answers from and the watcher.
/// `age_seconds` is the time since the last successful consul read; the
/// consul token is not in [`Status`], so it cannot appear here.
///
/// With `only_diverted` (`?diverted`, what `status` asks for), the
/// identities are the diverted ones only: a 20,000-key state renders in
/// about 100-150 ms of the loop's time, 5 diverted keys of it in about 1 ms
/// (`scripts/debug-state-cost.py`).
pub fn debug_state(st: &Status<'_>, only_diverted: bool) -> String {
    let age = st
        .metrics
        .last_success
        .map(|t| st.now.saturating_duration_since(t).as_secs_f64());
    let asked = |t: Option<Tick>| st.asking.and_then(|a| asked_json(a, t?, st.now));
    let state = st.snapshot.map(|s| {
        let mut entries: Vec<_> = match only_diverted {
            true => s.diverted().map(|d| (d.identity, d.entry)).collect(),
            false => s.entries().collect(),
        };
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let identities: serde_json::Map<String, serde_json::Value> = entries
            .into_iter()
            .map(|(id, e)| {
                let reply = reply_text(e.desired);
                let unasked = st.asking.is_some_and(|a| a.unasked.get(id).is_some());
                let asks = st.asking.and_then(|a| Some((a, s.asks(id.as_bytes(), a.previous)?)));
                let since = asks.map(|(a, (_, since))| a.clock.unix_seconds(since));
                let last = asks.map(|(_, (last, _))| last);
                (id.to_owned(), json!({"value": e.desired.to_string(), "reply": reply, "modify_index": e.modify_index, "last_asked": asked(last), "unchanged_since_unix_seconds": since, "unasked": unasked}))
            })
            .collect();
        let invalid: Vec<_> = s
            .invalid()
            .iter()
            .map(|k| json!({"key": k.key, "value": k.value, "reason": k.reason.label(), "modify_index": k.modify_index}))
            .collect();
        let shown = if only_diverted { "diverted" } else { "all" };
        json!({"index": s.index(), "keys": s.len(), "identities_shown": shown, "identities": identities, "invalid": invalid})
    });
    let last_change = st.metrics.last_change.and_then(|t| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs_f64())
    });
    let doc = json!({
        "version": crate::build_info::version_line(),
        "synced": st.source == Some(Source::Consul),
        "source": st.source.map(|s| match s {
            Source::Consul => "consul",
            Source::File { .. } => "state_file",
        }),
        "state_file": st.state_file.as_ref().map(|f| {
            let written = match st.source {
                Some(Source::File { written }) => Some(written),
                _ => None,
            };
            json!({
                "path": f.path.display().to_string(),
                "answering_from_it": written.is_some(),
                "written_unix_seconds": written.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map(|d| d.as_secs_f64()),
                "age_seconds": written.and_then(|t| SystemTime::now().duration_since(t).ok()).map(|d| d.as_secs_f64()),
                "writes": f.writes,
                "write_errors": f.write_errors,
            })
        }),
        "kv_prefix": st.kv_prefix,
        "age_seconds": age,
        "last_change_unix_seconds": last_change,
        "absent_reply": "ready 100%",
        "state": state,
        "asking": st.asking.map(|a| asking_json(a, st.now, !only_diverted)),
        "watcher": {
            "phase": st.watch.phase,
            "index": st.watch.index,
            "consecutive_failures": st.watch.failures,
            "last_error": st.watch.last_error,
            "backing_off": st.watch.failures > 0 && st.watch.next_request_in.is_some(),
            "next_request_in_seconds": st.watch.next_request_in.map(|d| d.as_secs_f64()),
            "request_deadline_in_seconds": st.watch.request_deadline_in.map(|d| d.as_secs_f64()),
        },
    });
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
    s.push('\n');
    s
}

fn reply_text(d: Desired) -> String {
    String::from_utf8_lossy(d.reply()).trim_end().to_owned()
}

/// A last ask: when (Unix seconds) and how long ago; `None` for never.
fn asked_json(a: Asking<'_>, t: Tick, now: Instant) -> Option<serde_json::Value> {
    let unix = a.clock.unix_seconds(t);
    let ago = t.secs_until(a.clock.tick(now));
    (!t.is_never()).then(|| json!({"unix_seconds": unix, "seconds_ago": ago}))
}

/// `/debug/state`'s `asking`: the unasked keys with the identity probably
/// meant, and the identities asked for that have no key (listed only
/// `with_unknown`; counted always).
fn asking_json(a: Asking<'_>, now: Instant, with_unknown: bool) -> serde_json::Value {
    let unasked: Vec<_> = a
        .unasked
        .sorted()
        .into_iter()
        .map(|(id, f)| {
            json!({
                "identity": id,
                "value": f.entry.desired.to_string(),
                "reply": reply_text(f.entry.desired),
                "modify_index": f.entry.modify_index,
                "last_asked": asked_json(a, f.last_asked, now),
                "unchanged_since_unix_seconds": a.clock.unix_seconds(f.since),
                "did_you_mean": f.suggestion.as_ref().and_then(|s| s.as_deref()),
            })
        })
        .collect();
    // The most recently asked (a flood of 65,536 would be seconds of JSON
    // on the loop), then by name.
    let mut strangers: Vec<_> = match with_unknown {
        true => a.strangers.iter().collect(),
        false => Vec::new(),
    };
    let order = |x: &(&[u8], Tick), y: &(&[u8], Tick)| y.1.cmp(&x.1).then(x.0.cmp(y.0));
    if strangers.len() > MAX_UNKNOWN_SHOWN {
        strangers.select_nth_unstable_by(MAX_UNKNOWN_SHOWN, order);
        strangers.truncate(MAX_UNKNOWN_SHOWN);
    }
    strangers.sort_unstable_by(order);
    let unknown: serde_json::Map<String, serde_json::Value> = strangers
        .into_iter()
        .map(|(id, t)| {
            (
                shown_identity(id),
                asked_json(a, t, now).unwrap_or_default(),
            )
        })
        .collect();
    json!({
        "unasked_after_seconds": a.unasked.after().as_secs(),
        "unasked": unasked,
        "unknown_identities": unknown,
        "unknown_identities_count": a.strangers.len(),
        "unknown_identities_overflow": a.strangers.overflow(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::kv::KvPair;
    use crate::http::{parse_request_head, Parse};

    fn head(req: &str) -> RequestHead {
        match parse_request_head(req.as_bytes(), 4096) {
            Parse::Done(h, _) => h,
            _ => panic!("bad test request {req:?}"),
        }
    }

    fn get(path: &str) -> RequestHead {
        head(&format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"))
    }

    fn pair(key: &str, value: &str, modify_index: u64) -> KvPair {
        KvPair {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            modify_index,
        }
    }

    fn status<'a>(
        metrics: &'a Metrics,
        snapshot: Option<&'a Snapshot>,
        now: Instant,
        idle: bool,
    ) -> Status<'a> {
        Status {
            metrics,
            snapshot,
            watch: WatchStatus {
                phase: if idle { "idle" } else { "awaiting_head" },
                index: snapshot.map_or(0, |s| s.index()),
                failures: if idle { 2 } else { 0 },
                requests: 3,
                traffic: Traffic::default(),
                last_error: idle.then_some("connection refused"),
                next_request_in: idle.then_some(Duration::from_millis(500)),
                request_deadline_in: (!idle).then_some(Duration::from_secs(300)),
            },
            now,
            started: SystemTime::now(),
            max_connections: 100,
            kv_prefix: "p",
            source: snapshot.map(|_| Source::Consul),
            state_file: None,
            asking: None,
        }
    }

    fn body(r: &Response) -> &str {
        std::str::from_utf8(&r.body).unwrap()
    }

    #[test]
    fn readiness_follows_the_first_read() {
        let m = Metrics::default();
        let now = Instant::now();
        let r = handle_monitoring(&get("/-/readiness"), &status(&m, None, now, true));
        assert_eq!(r.status, 503);
        let snap = Snapshot::build("p", 3, vec![]);
        let r = handle_monitoring(&get("/-/readiness"), &status(&m, Some(&snap), now, true));
        assert_eq!(r.status, 200);
        let r = handle_monitoring(&get("/-/liveness"), &status(&m, None, now, true));
        assert_eq!((r.status, body(&r)), (200, "ok\n"));
    }

    #[test]
    fn metrics_route_has_the_text_format_content_type() {
        let m = Metrics::default();
        let r = handle_monitoring(&get("/-/metrics"), &status(&m, None, Instant::now(), true));
        assert_eq!(r.status, 200);
        assert_eq!(r.headers[0].1, "text/plain; version=0.0.4; charset=utf-8");
        assert!(body(&r).contains("gitlab_haproxy_agent_consul_consecutive_failures 2\n"));
    }

    #[test]
    fn unknown_paths_and_methods() {
        let m = Metrics::default();
        let st = status(&m, None, Instant::now(), true);
        assert_eq!(handle_monitoring(&get("/nope"), &st).status, 404);
        assert_eq!(handle_pprof(&get("/-/metrics"), &st).status, 404);
        let post = head("POST /-/metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        let r = handle_monitoring(&post, &st);
        assert_eq!(r.status, 405);
        assert!(r
            .headers
            .iter()
            .any(|(k, v)| *k == "Allow" && v == "GET, HEAD"));
        assert_eq!(handle_pprof(&post, &st).status, 405);
        let head_req = head("HEAD /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(handle_monitoring(&head_req, &st).status, 200);
    }

    #[test]
    fn pprof_profile_explains_perf() {
        let m = Metrics::default();
        let st = status(&m, None, Instant::now(), true);
        for path in ["/debug/pprof/profile", "/debug/pprof", "/debug/pprof/heap"] {
            let r = handle_pprof(&get(path), &st);
            assert_eq!(r.status, 404, "{path}");
            assert!(body(&r).contains("perf record"), "{path}");
        }
        let r = handle_pprof(&get("/debug/pprof/profile?seconds=5"), &st);
        assert!(body(&r).contains("perf record -F 99 -g -p <pid>"));
    }

    #[test]
    fn debug_state_shows_identities_invalid_keys_and_the_idle_watcher() {
        let snap = Snapshot::build(
            "p",
            42,
            vec![
                pair("p/be/a", "drain", 40),
                pair("p/be/b", "50%", 41),
                pair("p/be/c", "up", 42),
            ],
        );
        let mut m = Metrics::default();
        let now = Instant::now();
        m.last_success = Some(now - Duration::from_secs(3));
        let doc: serde_json::Value =
            serde_json::from_str(&debug_state(&status(&m, Some(&snap), now, true), false)).unwrap();
        assert_eq!(doc["synced"], true);
        assert_eq!(doc["age_seconds"], 3.0);
        assert_eq!(doc["state"]["index"], 42);
        assert_eq!(doc["state"]["keys"], 2);
        let ids = &doc["state"]["identities"];
        assert_eq!(ids["be/a"]["value"], "drain");
        assert_eq!(ids["be/a"]["reply"], "drain 100%");
        assert_eq!(ids["be/a"]["modify_index"], 40);
        assert_eq!(ids["be/b"]["reply"], "ready 50%");
        assert_eq!(doc["state"]["invalid"][0]["key"], "p/be/c");
        assert_eq!(doc["state"]["invalid"][0]["reason"], "health_word");
        let w = &doc["watcher"];
        assert_eq!(w["phase"], "idle");
        assert_eq!(w["consecutive_failures"], 2);
        assert_eq!(w["backing_off"], true);
        assert_eq!(w["last_error"], "connection refused");
        assert_eq!(w["next_request_in_seconds"], 0.5);
        assert!(w["request_deadline_in_seconds"].is_null());
    }

    #[test]
    fn debug_state_shows_last_asks_unasked_keys_and_identities_without_a_key() {
        use crate::state::unasked::Unasked;
        use crate::state::{Clock, Swapper};
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(5_000);
        let mut state = Swapper::new("p", Clock::new(t0, wall), 8);
        let pairs = vec![
            pair("p/be_web/srv01", "drain", 7),
            pair("p/be_web/srv2", "maint", 8),
            pair("p/be_web/srv3", "ready", 8),
        ];
        state.swap(Snapshot::build("p", 8, pairs), t0);
        let at = t0 + Duration::from_secs(50);
        for id in ["be_web/srv1", "be_web/srv2"] {
            state.answer(id.as_bytes(), at);
        }
        let mut unasked = Unasked::new(Duration::from_secs(60), t0);
        let now = t0 + Duration::from_secs(61);
        unasked.sweep(&mut state, now);
        let m = Metrics::default();
        let mut st = status(&m, state.current(), now, false);
        st.asking = Some(Asking {
            clock: state.clock(),
            strangers: state.strangers(),
            unasked: &unasked,
            previous: None,
        });
        let doc: serde_json::Value = serde_json::from_str(&debug_state(&st, false)).unwrap();
        let ids = &doc["state"]["identities"];
        assert!(ids["be_web/srv01"]["last_asked"].is_null(), "never");
        assert_eq!(ids["be_web/srv01"]["unasked"], true);
        assert_eq!(ids["be_web/srv2"]["last_asked"]["unix_seconds"], 5_050);
        assert_eq!(ids["be_web/srv2"]["last_asked"]["seconds_ago"], 11);
        assert_eq!(ids["be_web/srv2"]["unasked"], false);
        assert_eq!(ids["be_web/srv2"]["unchanged_since_unix_seconds"], 5_000);
        let a = &doc["asking"];
        assert_eq!(a["unasked_after_seconds"], 60);
        assert_eq!(a["unasked"].as_array().unwrap().len(), 1);
        let u = &a["unasked"][0];
        assert_eq!(u["identity"], "be_web/srv01");
        assert_eq!(u["value"], "drain");
        assert_eq!(u["reply"], "drain 100%");
        assert_eq!(u["did_you_mean"], "be_web/srv1");
        assert_eq!(u["unchanged_since_unix_seconds"], 5_000);
        assert_eq!(
            a["unknown_identities"]["be_web/srv1"]["unix_seconds"],
            5_050
        );
        assert_eq!(a["unknown_identities_overflow"], 0);
        assert_eq!(ids.as_object().unwrap().len(), 3);
        // `?diverted`: the same, but only the diverted identities.
        let r = handle_pprof(&get("/debug/state?diverted"), &st);
        let only: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(only["state"]["identities_shown"], "diverted");
        let shown: Vec<&String> = only["state"]["identities"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(shown, ["be_web/srv01", "be_web/srv2"]);
        assert_eq!(
            only["state"]["identities"]["be_web/srv2"],
            ids["be_web/srv2"]
        );
        assert_eq!(only["asking"]["unasked"], doc["asking"]["unasked"]);
        assert_eq!(only["asking"]["unknown_identities_count"], 1);
        assert_eq!(
            only["asking"]["unknown_identities"],
            json!({}),
            "counted, not listed"
        );
    }

    #[test]
    fn debug_state_in_flight_shows_the_request_deadline_not_a_next_request() {
        let m = Metrics::default();
        let doc: serde_json::Value = serde_json::from_str(&debug_state(
            &status(&m, None, Instant::now(), false),
            false,
        ))
        .unwrap();
        assert_eq!(doc["synced"], false);
        assert!(doc["state"].is_null());
        assert!(doc["age_seconds"].is_null());
        let w = &doc["watcher"];
        assert_eq!(w["phase"], "awaiting_head");
        assert!(w["next_request_in_seconds"].is_null());
        assert_eq!(w["request_deadline_in_seconds"], 300.0);
        assert_eq!(w["backing_off"], false);
    }
}
