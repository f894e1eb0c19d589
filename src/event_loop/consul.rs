//! The loop's side of consul: after every call into the client, close
//! what it retired, register what it waits on, and hand its updates to
//! the core.

use std::time::Instant;

use super::{EventLoop, CONSUL};

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
            self.core.on_consul(update, now);
        }
    }
}
