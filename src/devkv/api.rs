//! `/v1/kv/` over the store: GET (single key, `?recurse`, `?keys`,
//! `?raw`, blocking with `index`/`wait`), PUT (`?flags`, `?cas`), DELETE
//! (`?recurse`, `?cas`), OPTIONS; 405 otherwise.

use std::time::Instant;

use crate::http::{RequestHead, Response};

/// The dev KV: store plus blocking-query bookkeeping.
pub struct DevKv {
    // implementation's choice
}

/// What to do with one request.
#[derive(Debug)]
pub enum Handled {
    /// Answer now.
    Respond(Response),
    /// A blocking GET: park the connection until [`DevKv::is_ready`] says so
    /// or `deadline` passes, then send [`DevKv::answer`].
    Wait(Wait),
}

/// A parked blocking query.
#[derive(Debug, Clone)]
pub struct Wait {
    /// When to answer even if nothing changed (clamped wait plus jitter in
    /// [0, wait/16), as consul does).
    pub deadline: Instant,
    // the rest: implementation's choice (key, recurse/keys flags, index ...)
}

impl DevKv {
    /// `jitter`: add consul's random stagger to waits (off in tests that
    /// need exact deadlines).
    pub fn new(jitter: bool) -> DevKv {
        todo!("{jitter}")
    }

    /// Handles one complete request (head + decoded body) at `now`.
    pub fn handle(&mut self, req: &RequestHead, body: &[u8], now: Instant) -> Handled {
        todo!("{req:?} {body:?} {now:?}")
    }

    /// True when a parked query must be answered now (its prefix index went
    /// past the requested index). Cheap: called for every parked query after
    /// each write.
    pub fn is_ready(&self, wait: &Wait) -> bool {
        todo!("{wait:?}")
    }

    /// The response for a parked query (woken or timed out).
    pub fn answer(&self, wait: &Wait) -> Response {
        todo!("{wait:?}")
    }

    /// Bumps on every write that changed the store; the loop re-checks
    /// parked queries only when it moved.
    pub fn generation(&self) -> u64 {
        todo!()
    }
}
