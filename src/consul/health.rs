//! How the watch of consul is doing, as operators see it: outages
//! (start, end, length, failed requests), the last error, and the hint for
//! a request consul refused.
//!
//! In: each request's result ([`Health::succeeded`], [`Health::failed`]) at
//! a time given by the caller; index resets. Out: one warning when an outage starts, one
//! info line when it ends, an error line when consul refuses a request for
//! a new reason; [`Health::last_error`] for `/debug/state`. Always holds: an
//! outage is logged once however many requests fail in it (the rest at
//! debug level), so a consul down for an hour costs two lines.

use std::time::Instant;

use log::{debug, error, info, warn};

use super::error::Failure;

/// An outage in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outage {
    since: Instant,
    failed_requests: u64,
}

/// The watch's health record.
#[derive(Debug)]
pub struct Health {
    /// The consul address, as logged.
    consul: String,
    outage: Option<Outage>,
    last_error: Option<String>,
}

impl Health {
    pub fn new(consul: String) -> Health {
        Health {
            consul,
            outage: None,
            last_error: None,
        }
    }

    /// A request succeeded: ends an outage (logging its length).
    pub fn succeeded(&mut self, now: Instant) {
        if let Some(o) = self.outage.take() {
            info!(outage_seconds = now.duration_since(o.since).as_secs_f64(), failed_requests = o.failed_requests; "consul reads succeed again");
        }
    }

    /// A request failed; `answering`: a state is being answered from (the
    /// outage warning says which of the two failure behaviours applies).
    pub fn failed(&mut self, f: Failure, now: Instant, answering: bool) {
        let outage = match self.outage.as_mut() {
            Some(o) => {
                debug!(reason = f.reason.label(), error = f.detail.as_str(); "consul read failed again");
                o
            }
            None => {
                let what = if answering {
                    "answering from the last known state"
                } else {
                    "not answering until a first complete read"
                };
                warn!(consul = self.consul.as_str(), reason = f.reason.label(), error = f.detail.as_str(); "consul read failed: {what}; retrying with backoff");
                self.outage.insert(Outage {
                    since: now,
                    failed_requests: 0,
                })
            }
        };
        outage.failed_requests += 1;
        if f.configuration && self.last_error.as_deref() != Some(f.detail.as_str()) {
            error!(error = f.detail.as_str(); "consul refused the request: check -consul-addr, -kv-prefix, the ACL token and namespace/partition");
        }
        self.last_error = Some(f.detail);
    }

    /// consul's index went backwards: the watch re-reads from index 0.
    pub fn index_reset(&self, from: u64, to: u64) {
        warn!(from = from, to = to; "X-Consul-Index went backwards (snapshot restore or tombstone reap): re-reading from index 0");
    }

    /// The last failure's detail (kept after the outage ends).
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// When the outage in progress started, and how many requests failed
    /// in it so far.
    pub fn outage(&self) -> Option<(Instant, u64)> {
        self.outage.map(|o| (o.since, o.failed_requests))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::consul::error::ErrorReason;

    fn refused(detail: &str) -> Failure {
        Failure {
            configuration: true,
            ..Failure::new(ErrorReason::Http4xx, detail)
        }
    }

    #[test]
    fn an_outage_spans_failures_until_a_success() {
        let t0 = Instant::now();
        let mut h = Health::new("127.0.0.1:8500".into());
        assert_eq!(h.outage(), None);
        h.failed(Failure::new(ErrorReason::Connect, "refused"), t0, true);
        h.failed(
            Failure::new(ErrorReason::Timeout, "slow"),
            t0 + Duration::from_secs(1),
            true,
        );
        assert_eq!(h.outage(), Some((t0, 2)), "starts at the first failure");
        assert_eq!(h.last_error(), Some("slow"));
        h.succeeded(t0 + Duration::from_secs(3));
        assert_eq!(h.outage(), None);
        assert_eq!(h.last_error(), Some("slow"), "kept for /debug/state");
        h.failed(refused("403"), t0 + Duration::from_secs(4), false);
        assert_eq!(h.outage(), Some((t0 + Duration::from_secs(4), 1)));
        assert_eq!(h.last_error(), Some("403"));
    }

    #[test]
    fn success_without_an_outage_changes_nothing() {
        let mut h = Health::new("x".into());
        h.succeeded(Instant::now());
        assert_eq!((h.outage(), h.last_error()), (None, None));
    }
}
