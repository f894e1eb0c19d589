//! The `-dev` consul-compatible KV, pure: an in-memory store with
//! consul's index, tombstone and blocking-query rules ([`store`]) and the
//! `/v1/kv/` HTTP API over it ([`api`]), `/v1/txn` ([`txn`], its body
//! read as Go's JSON decoder reads it: `go_json`), what both
//! share of consul's HTTP layer (`wire`, a leaf), and the blocked GETs
//! parked until a write or their wait's end ([`park`]). The event loop
//! owns the sockets; nothing here does IO or reads the clock.
//!
//! Held to consul's wire behaviour as its source (`agent/kvs_endpoint.go`,
//! `agent/http.go`, `agent/consul/state/kvs.go`) and a real `consul agent
//! -dev` show it (tests in this module are written from that, not from the
//! client).

pub mod api;
mod go_json;
pub mod park;
pub mod store;
pub mod txn;
mod wire;

pub use api::{DevKv, Handled, Wait};
pub use park::Parking;
