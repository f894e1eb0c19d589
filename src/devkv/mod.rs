//! The `-dev` consul-compatible KV (SPEC §6), pure: an in-memory store with
//! consul's index, tombstone and blocking-query rules ([`store`]) and the
//! `/v1/kv/` HTTP API over it ([`api`]). The event loop owns the sockets and
//! parks blocked GETs; nothing here does IO or reads the clock.
//!
//! Held to consul's wire behaviour as summarised in
//! `shared/research/consul-kv.md` (tests in this module are written from that
//! document, not from the client).

pub mod api;
pub mod store;

pub use api::{DevKv, Handled, Wait};
