//! What the loop's connection tables hold: an agent connection waiting
//! for its line, an HTTP connection, and the agent connections' eviction
//! order.
//!
//! - [`AgentSlot`], [`AcceptOrder`]: driven by `agents.rs`;
//! - [`HttpSlot`], [`SCRATCH`]: driven by `http.rs`.

use std::collections::VecDeque;
use std::time::Instant;

use mio::event::Source;
use mio::net::TcpStream;

use super::table::Pollable;
use crate::agent::conn::AgentConn;
use crate::http::server::{HttpConn, Role};

/// The HTTP connections' read buffer, shared (they copy out what they keep).
pub const SCRATCH: usize = 16 * 1024;

/// Agent connections in the table, oldest first, as (key, generation):
/// the eviction order. Entries of closed or answered connections are
/// skipped at the front and compacted when they pile up.
#[derive(Default)]
pub struct AcceptOrder {
    pub(super) queue: VecDeque<(usize, u32)>,
    pub(super) last_warning: Option<Instant>,
}

/// An agent connection waiting for the rest of its line (or for room to
/// write its reply).
pub struct AgentSlot {
    pub conn: AgentConn,
    pub accepted: Instant,
}

impl Pollable for AgentSlot {
    fn source(&mut self) -> &mut dyn Source {
        self.conn.stream_mut()
    }
}

/// An open HTTP connection.
pub struct HttpSlot {
    pub(super) conn: HttpConn<TcpStream>,
    pub(super) role: Role,
}

impl Pollable for HttpSlot {
    fn source(&mut self) -> &mut dyn Source {
        self.conn.stream_mut()
    }
}
