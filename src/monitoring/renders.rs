//! Heavy responses (`/-/metrics`, `/debug/state`), rendered a slice of the
//! loop's time at a time and shared.
//!
//! In: requests for a [`Heavy`] kind (each with the caller's waiter, e.g. a
//! connection key), the loop's status when a render starts, and a [`Slice`]
//! per turn. Out: each waiter with the shared body it asked for.
//!
//! Always holds:
//! - a kind is rendered at most once per [`FRESH_FOR`] while its change
//!   count is the same (a request within that of the last render gets the
//!   same bytes: a pipelining flood costs nothing; for `/debug/state` the
//!   count moves with the state, so checks flowing do not defeat it, for
//!   the cheap `/-/metrics` also with every counter);
//! - one render per kind at a time, shared by every request that came while
//!   it was built;
//! - the body is one reference-counted buffer, so a connection that never
//!   reads holds a reference, not a copy: memory is at most a few renders
//!   per kind (one being built, one fresh, and those still being written,
//!   each connection holding one for at most its write timeout), not state
//!   size times connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::debug_state::DebugStateRender;
use super::metrics::MetricsRender;
use super::status::{metrics_view, Status};
use crate::slice::Slice;
use crate::state::unasked::Asking;
use crate::state::Snapshot;

/// A render is served again for this long before a new one is built.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

pub use crate::http::server::Body;

/// The heavy routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heavy {
    /// `/-/metrics`.
    Metrics,
    /// `/debug/state`, or with `?diverted` only the diverted identities.
    DebugState { diverted: bool },
}

impl Heavy {
    const COUNT: usize = 3;

    fn index(self) -> usize {
        match self {
            Heavy::Metrics => 0,
            Heavy::DebugState { diverted: false } => 1,
            Heavy::DebugState { diverted: true } => 2,
        }
    }

    fn of(index: usize) -> Heavy {
        match index {
            0 => Heavy::Metrics,
            1 => Heavy::DebugState { diverted: false },
            _ => Heavy::DebugState { diverted: true },
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Heavy::Metrics => "text/plain; version=0.0.4; charset=utf-8",
            Heavy::DebugState { .. } => "application/json",
        }
    }
}

/// Every kind's render, its fresh body and its waiters.
#[derive(Debug)]
pub struct Renders<W> {
    slots: [Slot<W>; Heavy::COUNT],
}

#[derive(Debug)]
struct Slot<W> {
    /// The last body, when it was done, and the change count it was
    /// started at.
    fresh: Option<(Body, Instant, u64)>,
    /// The render in progress, and the change count it was started at.
    job: Option<(Job, u64)>,
    waiting: Vec<W>,
}

#[derive(Debug)]
enum Job {
    Metrics(Box<MetricsRender>),
    DebugState(Box<DebugStateRender>),
}

impl<W> Default for Renders<W> {
    fn default() -> Self {
        Renders {
            slots: std::array::from_fn(|_| Slot {
                fresh: None,
                job: None,
                waiting: Vec::new(),
            }),
        }
    }
}

impl<W> Renders<W> {
    /// A request for `kind` at `now`, when the loop's change count is
    /// `changes`: the body rendered within [`FRESH_FOR`] at the same count,
    /// else `None` and the waiter is queued for the next render
    /// ([`Renders::step`] hands it out).
    pub fn ask(&mut self, kind: Heavy, waiter: W, now: Instant, changes: u64) -> Option<Body> {
        let slot = &mut self.slots[kind.index()];
        match &slot.fresh {
            Some((body, at, seen))
                if now < *at + FRESH_FOR && *seen == changes && slot.job.is_none() =>
            {
                Some(Arc::clone(body))
            }
            _ => {
                slot.waiting.push(waiter);
                None
            }
        }
    }

    /// Some request waits for a render: call [`Renders::step`] every turn.
    pub fn busy(&self) -> bool {
        self.slots.iter().any(|s| !s.waiting.is_empty())
    }

    /// Forgets the waiters `gone` says have left (closed connections);
    /// a render nobody waits for any more is dropped.
    pub fn forget(&mut self, gone: impl Fn(&W) -> bool) {
        for slot in &mut self.slots {
            slot.waiting.retain(|w| !gone(w));
            if slot.waiting.is_empty() {
                slot.job = None;
            }
        }
    }

    /// Starts a render for every kind with waiters and none in progress,
    /// from `st` (its state shared as `state`) at each kind's change count.
    /// `true` if a metrics render started (the loop then resets what
    /// "since the last scrape" counts).
    pub fn start(
        &mut self,
        st: &Status<'_>,
        state: Option<&Arc<Snapshot>>,
        changes: &dyn Fn(Heavy) -> u64,
    ) -> bool {
        let mut metrics = false;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.waiting.is_empty() || slot.job.is_some() {
                continue;
            }
            let state = state.cloned();
            let job = match Heavy::of(i) {
                Heavy::Metrics => {
                    metrics = true;
                    Job::Metrics(Box::new(MetricsRender::new(&metrics_view(st), state)))
                }
                Heavy::DebugState { diverted } => {
                    Job::DebugState(Box::new(DebugStateRender::new(st, state, diverted)))
                }
            };
            slot.job = Some((job, changes(Heavy::of(i))));
        }
        metrics
    }

    /// Renders on until the slice is spent; every render completed hands
    /// its body to its waiters, in `done`.
    pub fn step(
        &mut self,
        asking: Option<Asking<'_>>,
        slice: &mut Slice,
        now: Instant,
        done: &mut Vec<(W, Heavy, Body)>,
    ) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let finished = match &mut slot.job {
                None => continue,
                Some((Job::Metrics(r), _)) => r.step(asking, slice),
                Some((Job::DebugState(r), _)) => r.step(asking, slice),
            };
            if finished {
                let (body, changes) = match slot.job.take() {
                    Some((Job::Metrics(r), c)) => (r.finish(), c),
                    Some((Job::DebugState(r), c)) => (r.finish(), c),
                    None => (String::new(), 0),
                };
                let body = Arc::new(body.into_bytes());
                let kind = Heavy::of(i);
                done.extend(slot.waiting.drain(..).map(|w| (w, kind, Arc::clone(&body))));
                slot.fresh = Some((body, now, changes));
            }
            if slice.is_over() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::client::Traffic;
    use crate::kv::KvPair;
    use crate::monitoring::metrics::Metrics;
    use crate::monitoring::status::WatchStatus;
    use crate::state::unasked::Unasked;
    use crate::state::{Clock, Source, Swapper};
    use std::time::SystemTime;

    /// A swapped-in state of `n` keys, half diverted, and its asks.
    fn world(n: usize) -> (Swapper, Unasked, Instant) {
        let t0 = Instant::now();
        let mut state = Swapper::new("p", Clock::new(t0, SystemTime::now()), 100);
        let pairs = (0..n)
            .map(|i| KvPair {
                key: format!("p/be_web/srv{i}"),
                value: if i % 2 == 0 {
                    b"drain".to_vec()
                } else {
                    b"ready".to_vec()
                },
                modify_index: i as u64,
                flags: 0,
            })
            .collect();
        state.swap(Snapshot::build("p", 9, pairs), t0);
        (state, Unasked::new(Duration::from_secs(60), t0), t0)
    }

    fn status<'a>(
        m: &'a Metrics,
        state: &'a Swapper,
        unasked: &'a Unasked,
        now: Instant,
    ) -> Status<'a> {
        Status {
            metrics: m,
            snapshot: state.current(),
            watch: WatchStatus {
                phase: "idle",
                index: 9,
                failures: 0,
                requests: 1,
                traffic: Traffic::default(),
                last_error: None,
                next_request_in: None,
                request_deadline_in: None,
            },
            now,
            started: SystemTime::now(),
            max_connections: 10,
            kv_prefix: "p",
            source: Some(Source::Consul),
            state_file: None,
            expiry: Default::default(),
            asking: Some(Asking {
                clock: state.clock(),
                strangers: state.strangers(),
                unasked,
                previous: None,
            }),
        }
    }

    /// Runs every render to completion, `items` entries a slice, checking
    /// between slices (as the loop answers checks there); the slices taken.
    fn run(
        r: &mut Renders<u32>,
        st: &Status<'_>,
        state: &Swapper,
        items: u64,
        done: &mut Vec<(u32, Heavy, Body)>,
    ) -> usize {
        let shared = state.shared();
        r.start(st, shared.as_ref(), &|_| 0);
        let mut slices = 0;
        while r.busy() {
            r.step(st.asking, &mut Slice::items(items), st.now, done);
            slices += 1;
            assert!(slices < 100_000);
        }
        slices
    }

    #[test]
    fn a_debug_state_of_20000_keys_takes_many_slices_and_is_shared_by_every_waiter() {
        let (state, unasked, t0) = world(20_000);
        let m = Metrics::default();
        let st = status(&m, &state, &unasked, t0);
        let mut r = Renders::default();
        let kind = Heavy::DebugState { diverted: false };
        // 32 connections ask before the render is done: one render.
        for w in 0..32 {
            assert!(r.ask(kind, w, t0, 0).is_none());
        }
        let mut done = Vec::new();
        let slices = run(&mut r, &st, &state, 1000, &mut done);
        assert!(
            slices >= 20_000 / 1000 * 2,
            "{slices} slices: collect, then write"
        );
        assert_eq!(done.len(), 32);
        let body = Arc::clone(&done[0].2);
        assert!(
            done.iter().all(|(_, _, b)| Arc::ptr_eq(b, &body)),
            "one buffer"
        );
        assert_eq!(
            Arc::strong_count(&body),
            32 + 1 + 1,
            "waiters, the fresh copy, this one"
        );
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let ids = doc["state"]["identities"].as_object().unwrap();
        assert_eq!(ids.len(), 20_000);
        assert_eq!(ids["be_web/srv4"]["reply"], "drain 100%");
        assert_eq!(ids["be_web/srv5"]["reply"], "ready 100%");
        // Sorted, one per line.
        let text = std::str::from_utf8(&body).unwrap();
        let at = |id: &str| text.find(&format!("\"{id}\":")).unwrap();
        assert!(at("be_web/srv10") < at("be_web/srv2"));
        // Within a second and no change: the same bytes, at once; after
        // it, or after a change, a new render.
        let soon = t0 + Duration::from_millis(900);
        assert!(r
            .ask(kind, 98, soon, 0)
            .is_some_and(|b| Arc::ptr_eq(&b, &body)));
        assert!(r.ask(kind, 99, soon, 1).is_none(), "changed");
        assert!(
            r.ask(kind, 100, t0 + FRESH_FOR, 0).is_none(),
            "a second old"
        );
    }

    #[test]
    fn diverted_only_and_metrics_render_in_slices_too() {
        let (state, unasked, t0) = world(20_000);
        let m = Metrics::default();
        let st = status(&m, &state, &unasked, t0);
        let mut r = Renders::default();
        r.ask(Heavy::DebugState { diverted: true }, 1, t0, 0);
        r.ask(Heavy::Metrics, 2, t0, 0);
        let mut done = Vec::new();
        let slices = run(&mut r, &st, &state, 500, &mut done);
        assert!(slices > 20, "{slices}");
        let by = |w| &done.iter().find(|(x, _, _)| *x == w).unwrap().2;
        let doc: serde_json::Value = serde_json::from_slice(by(1)).unwrap();
        assert_eq!(
            doc["state"]["identities"].as_object().unwrap().len(),
            10_000
        );
        let text = std::str::from_utf8(by(2)).unwrap();
        assert!(text.contains("gitlab_haproxy_agent_diverted_keys_over_series_limit 9000\n"));
    }

    #[test]
    fn a_render_nobody_waits_for_is_dropped() {
        let (state, unasked, t0) = world(100);
        let m = Metrics::default();
        let st = status(&m, &state, &unasked, t0);
        let mut r = Renders::default();
        r.ask(Heavy::Metrics, 7, t0, 0);
        r.start(&st, state.shared().as_ref(), &|_| 0);
        r.forget(|w| *w == 7);
        assert!(!r.busy());
        assert!(r.slots[0].job.is_none());
    }
}
