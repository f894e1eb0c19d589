//! The consul side: KV JSON decoding ([`kv`], pure), the watch logic (index
//! rules, rate limit, backoff: [`watch`], pure) and the nonblocking HTTP/1.1
//! client connection that runs it inside the loop ([`client`]), over the
//! transport steps ([`transport`]: connect, handshake, write, read a
//! response), under TLS when configured ([`tls`]); the
//! watch's health as operators see it: outages, the last error ([`health`]);
//! the operator commands' requests over the same transport ([`exchange`]).

pub mod client;
pub mod exchange;
pub mod health;
pub mod kv;
#[cfg(any(test, feature = "test-peers"))]
pub mod memstream;
pub mod tls;
pub mod transport;
pub mod watch;
