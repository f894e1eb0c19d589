//! Observability (SPEC §7): the metrics registry ([`metrics`]), the HTTP
//! server connection shared with the dev KV ([`server`]), and the routes of
//! the monitoring (`/-/metrics`, `/-/liveness`, `/-/readiness`) and pprof
//! (`/debug/state`) listeners.
//!
//! In: a request head and a [`Status`] view of the loop. Out: a response.
//! Always holds: handlers are pure over the view, so they never block the
//! loop and tests need no sockets; the consul token is never part of a view.

pub mod metrics;
pub mod server;

use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use crate::http::{Method, RequestHead, Response};
use crate::monitoring::metrics::{Metrics, View};
use crate::state::Snapshot;

/// The watcher's side of the status.
pub struct WatchStatus<'a> {
    pub phase: &'static str,
    pub index: u64,
    pub failures: u32,
    pub last_error: Option<&'a str>,
    /// Time until the next request may start (rate limit or backoff).
    pub next_request_in: Duration,
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

/// Routes of `-pprof-addr`.
pub fn handle_pprof(head: &RequestHead, st: &Status<'_>) -> Response {
    if let Some(r) = only_get(head) {
        return r;
    }
    match head.path.as_str() {
        "/debug/state" => {
            let mut r = text(200, &debug_state(st));
            r.headers[0].1 = "application/json".into();
            r
        }
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
pub fn debug_state(st: &Status<'_>) -> String {
    let age = st
        .metrics
        .last_success
        .map(|t| st.now.saturating_duration_since(t).as_secs_f64());
    let state = st.snapshot.map(|s| {
        let mut entries: Vec<_> = s.entries().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let identities: serde_json::Map<String, serde_json::Value> = entries
            .into_iter()
            .map(|(id, e)| {
                let reply = String::from_utf8_lossy(e.desired.reply()).trim_end().to_owned();
                (id.to_owned(), json!({"value": e.desired.to_string(), "reply": reply, "modify_index": e.modify_index}))
            })
            .collect();
        let invalid: Vec<_> = s
            .invalid()
            .iter()
            .map(|k| json!({"key": k.key, "value": k.value, "reason": k.reason.label(), "modify_index": k.modify_index}))
            .collect();
        json!({"index": s.index(), "keys": s.len(), "identities": identities, "invalid": invalid})
    });
    let doc = json!({
        "synced": st.snapshot.is_some(),
        "kv_prefix": st.kv_prefix,
        "age_seconds": age,
        "absent_reply": "ready 100%",
        "state": state,
        "watcher": {
            "phase": st.watch.phase,
            "index": st.watch.index,
            "consecutive_failures": st.watch.failures,
            "last_error": st.watch.last_error,
            "next_request_in_seconds": st.watch.next_request_in.as_secs_f64(),
        },
    });
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
    s.push('\n');
    s
}
