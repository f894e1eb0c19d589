//! The loop's side of consul: after every call into the client, close
//! what it retired, register what it waits on, and apply its updates (a
//! swap, an unchanged answer, an index reset, a failure) to the state, the
//! state file, the health and the metrics.

use std::time::{Instant, SystemTime};

use log::debug;

use super::{EventLoop, CONSUL};
use crate::consul::watch::Update;
use crate::persist;
use crate::state::Snapshot;

impl EventLoop {
    /// After every call into the client: close what it retired
    /// (deregistered first), register what it waits on, apply its updates.
    pub(super) fn sync_consul(&mut self, now: Instant) {
        let reg = self.poll.registry();
        for (id, mut stream) in self.client.retired() {
            let _ = reg.deregister(stream.source());
            if self.consul_registered.is_some_and(|(rid, _)| rid == id) {
                self.consul_registered = None;
            }
        }
        match self.client.wants() {
            None => self.consul_registered = None,
            Some((stream, id, want)) => {
                let done = match self.consul_registered {
                    Some((rid, rwant)) if rid == id && rwant == want => Ok(()),
                    Some((rid, _)) if rid == id => reg.reregister(stream.source(), CONSUL, want),
                    _ => reg.register(stream.source(), CONSUL, want),
                };
                match done {
                    Ok(()) => self.consul_registered = Some((id, want)),
                    Err(e) => {
                        self.consul_registered = None;
                        self.client.on_register_error(now, &e, &mut self.updates);
                        return self.sync_consul(now);
                    }
                }
            }
        }
        for update in std::mem::take(&mut self.updates) {
            self.apply(update, now);
        }
    }

    fn apply(&mut self, update: Update, now: Instant) {
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
    /// freeing run a slice per turn ([`EventLoop::on_time`]).
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
}
