//! gitlab-haproxy-agent: an HAProxy agent-check responder that answers each
//! backend server's desired admin state from an in-memory copy of consul KV.
//!
//! The library holds every part so that tests, benches and fuzz targets can
//! reach the pure parsers directly; `main.rs` only wires them together.
//!
//! Layout (one place per part of the spec):
//! - [`contract`]: KV value -> typed desired state -> reply bytes (pure);
//! - [`agent`]: the haproxy side: request-line parser (pure) and the
//!   per-connection state machine;
//! - [`state`]: the snapshot the responder answers from, swapped whole, and
//!   the state file's format; [`persist`]: that file on disk;
//! - [`http`]: HTTP/1.1 framing (pure), shared by every HTTP peer;
//! - [`kv`]: KV JSON decoding (pure), the pairs the state is built from;
//! - [`consul`]: the watcher machine, backoff, the client connection;
//! - [`monitoring`]: metrics registry, routes and renders of the
//!   health/metrics/debug listeners;
//! - [`devkv`]: the `-dev` consul-compatible KV (also the tests' consul);
//! - [`drain`]: `wait-drained`'s judgement of what haproxy says of a
//!   server's sessions (`show stat` and Prometheus readers, pure);
//! - [`lint`]: `lint-haproxy`, haproxy's configuration read as haproxy
//!   reads it, checked against what the agent needs;
//! - [`core`]: the sans-IO core: the state and every decision about it,
//!   driven by events and the time; [`event_loop`]: the one mio loop, IO
//!   only;
//! - [`config`], [`logging`]: start-up;
//!   [`notify`]: systemd's readiness, status and watchdog messages;
//!   [`slice`](mod@slice): the loop's time budget for background work;
//!   [`safe`]: the one terminal-safe rendering of outside text;
//! - [`gocompat`]: the Go standard-library behaviour the flags and the dev
//!   KV must match; [`decimal`]: the one decimal parser; [`build_info`]:
//!   version and commit.

pub mod agent;
pub mod build_info;
pub mod cli;
mod columns;
pub mod config;
pub mod consul;
pub mod contract;
pub mod core;
pub mod debug_doc;
pub mod decimal;
pub mod devkv;
pub mod drain;
pub mod event_loop;
pub mod files;
pub mod gocompat;
pub mod http;
pub mod jitter;
pub mod kv;
mod labels;
pub mod lint;
pub mod logging;
pub mod monitoring;
pub mod notify;
pub mod persist;
pub mod safe;
pub mod slice;
pub mod state;
#[cfg(test)]
mod testpki;
