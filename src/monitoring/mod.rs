//! Observability: the metrics registry ([`metrics`]) and the routes of
//! the monitoring (`/-/metrics`, `/-/liveness`, `/-/readiness`) and pprof
//! (`/debug/state`) listeners. `/debug/pprof/*` answers 404 with how to
//! profile from outside ([`NO_PPROF`]): an in-process signal sampler would
//! interrupt the one answering thread and need a second thread to report.
//!
//! In: a request head and a [`Status`] view of the loop. Out: a response,
//! or for `/-/metrics` and `/debug/state` a [`Heavy`] render: built a slice
//! of the loop's time at a time, at most once a second, and shared by every
//! connection that asks ([`renders`]).
//!
//! Always holds:
//! - handlers are pure over the view, so they never block the loop and
//!   tests need no sockets;
//! - the consul token is never part of a view.

mod debug_state;
pub mod metrics;
pub mod renders;
mod status;

use crate::http::{Method, RequestHead, Response};
pub use renders::Heavy;
pub use status::{metrics_view, StateFileStatus, Status, WatchStatus, MAX_UNKNOWN_SHOWN};

/// What a route answers: a small response at once, or a heavy one
/// rendered in slices and shared ([`renders`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Routed {
    Now(Response),
    Render(Heavy),
}

/// Routes of `-monitoring-addr`.
pub fn handle_monitoring(head: &RequestHead, st: &Status<'_>) -> Routed {
    if let Some(r) = only_get(head) {
        return Routed::Now(r);
    }
    Routed::Now(match head.path.as_str() {
        "/-/liveness" => text(200, "ok\n"),
        "/-/readiness" if st.snapshot.is_some() => text(200, "ready\n"),
        "/-/readiness" => text(503, "not ready: no complete consul read yet\n"),
        "/-/metrics" => return Routed::Render(Heavy::Metrics),
        _ => text(
            404,
            "not found; try /-/metrics, /-/liveness, /-/readiness\n",
        ),
    })
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
pub fn handle_pprof(head: &RequestHead) -> Routed {
    if let Some(r) = only_get(head) {
        return Routed::Now(r);
    }
    Routed::Now(match head.path.as_str() {
        "/debug/state" => {
            let diverted = head.query.split('&').any(|p| p == "diverted");
            return Routed::Render(Heavy::DebugState { diverted });
        }
        p if p == "/debug/pprof" || p.starts_with("/debug/pprof/") => text(404, NO_PPROF),
        _ => text(404, "not found; try /debug/state\n"),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::client::Traffic;
    use crate::http::{parse_request_head, Parse};
    use crate::kv::KvPair;
    use crate::monitoring::debug_state::debug_state;
    use crate::monitoring::metrics::Metrics;
    use crate::slice::Slice;
    use crate::state::unasked::Asking;
    use crate::state::{Snapshot, Source};
    use serde_json::json;
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime};

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
            flags: 0,
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
            expiry: Default::default(),
            asking: None,
        }
    }

    fn body(r: &Response) -> &str {
        std::str::from_utf8(&r.body).unwrap()
    }

    /// A small response, answered at once.
    fn now(r: Routed) -> Response {
        match r {
            Routed::Now(r) => r,
            Routed::Render(kind) => panic!("rendered in slices: {kind:?}"),
        }
    }

    #[test]
    fn readiness_follows_the_first_read() {
        let m = Metrics::default();
        let t = Instant::now();
        let r = now(handle_monitoring(
            &get("/-/readiness"),
            &status(&m, None, t, true),
        ));
        assert_eq!(r.status, 503);
        let snap = Snapshot::build("p", 3, vec![]);
        let r = now(handle_monitoring(
            &get("/-/readiness"),
            &status(&m, Some(&snap), t, true),
        ));
        assert_eq!(r.status, 200);
        let r = now(handle_monitoring(
            &get("/-/liveness"),
            &status(&m, None, t, true),
        ));
        assert_eq!((r.status, body(&r)), (200, "ok\n"));
    }

    #[test]
    fn heavy_routes_are_rendered_in_slices_with_their_content_type() {
        let m = Metrics::default();
        let st = status(&m, None, Instant::now(), true);
        assert_eq!(
            handle_monitoring(&get("/-/metrics"), &st),
            Routed::Render(Heavy::Metrics)
        );
        assert_eq!(
            Heavy::Metrics.content_type(),
            "text/plain; version=0.0.4; charset=utf-8"
        );
        assert_eq!(
            handle_pprof(&get("/debug/state?x&diverted")),
            Routed::Render(Heavy::DebugState { diverted: true })
        );
        assert_eq!(
            handle_pprof(&get("/debug/state")),
            Routed::Render(Heavy::DebugState { diverted: false })
        );
        let view = metrics_view(&st);
        let text = metrics::render(&view, None);
        assert!(text.contains("gitlab_haproxy_agent_consul_consecutive_failures 2\n"));
    }

    #[test]
    fn unknown_paths_and_methods() {
        let m = Metrics::default();
        let st = status(&m, None, Instant::now(), true);
        assert_eq!(now(handle_monitoring(&get("/nope"), &st)).status, 404);
        assert_eq!(now(handle_pprof(&get("/-/metrics"))).status, 404);
        let post = head("POST /-/metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        let r = now(handle_monitoring(&post, &st));
        assert_eq!(r.status, 405);
        assert!(r
            .headers
            .iter()
            .any(|(k, v)| *k == "Allow" && v == "GET, HEAD"));
        assert_eq!(now(handle_pprof(&post)).status, 405);
        let head_req = head("HEAD /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(now(handle_monitoring(&head_req, &st)).status, 200);
    }

    #[test]
    fn pprof_profile_explains_perf() {
        for path in ["/debug/pprof/profile", "/debug/pprof", "/debug/pprof/heap"] {
            let r = now(handle_pprof(&get(path)));
            assert_eq!(r.status, 404, "{path}");
            assert!(body(&r).contains("perf record"), "{path}");
        }
        let r = now(handle_pprof(&get("/debug/pprof/profile?seconds=5")));
        assert!(body(&r).contains("perf record -F 99 -g -p <pid>"));
    }

    #[test]
    fn debug_state_shows_identities_invalid_keys_and_the_idle_watcher() {
        let snap = Arc::new(Snapshot::build(
            "p",
            42,
            vec![
                pair("p/be/a", "drain", 40),
                pair("p/be/b", "50%", 41),
                pair("p/be/c", "up", 42),
            ],
        ));
        let mut m = Metrics::default();
        let now = Instant::now();
        m.last_success = Some(now - Duration::from_secs(3));
        let doc: serde_json::Value = serde_json::from_str(&debug_state(
            &status(&m, Some(&snap), now, true),
            Some(Arc::clone(&snap)),
            false,
        ))
        .unwrap();
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
        unasked.step(&mut state, now, &mut Slice::unlimited());
        let m = Metrics::default();
        let mut st = status(&m, state.current(), now, false);
        st.asking = Some(Asking {
            clock: state.clock(),
            strangers: state.strangers(),
            unasked: &unasked,
            previous: None,
        });
        let doc: serde_json::Value =
            serde_json::from_str(&debug_state(&st, state.shared(), false)).unwrap();
        let ids = &doc["state"]["identities"];
        assert!(ids["be_web/srv01"]["last_asked"].is_null(), "never");
        assert_eq!(ids["be_web/srv01"]["unasked"], true);
        assert_eq!(ids["be_web/srv2"]["last_asked"]["unix_seconds"], 5_050);
        assert_eq!(ids["be_web/srv2"]["last_asked"]["seconds_ago"], 11);
        assert_eq!(ids["be_web/srv2"]["unasked"], false);
        assert_eq!(ids["be_web/srv2"]["unchanged_since_unix_seconds"], 5_000);
        assert_eq!(ids["be_web/srv2"]["asked_since_write"], true);
        assert_eq!(ids["be_web/srv01"]["asked_since_write"], false);
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
        let only: serde_json::Value =
            serde_json::from_str(&debug_state(&st, state.shared(), true)).unwrap();
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
            None,
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
