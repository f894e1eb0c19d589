//! The consul side: the watch logic (index
//! rules, rate limit, backoff: [`watch`], pure) and the nonblocking HTTP/1.1
//! client connection that runs it inside the loop ([`client`]), over the
//! transport steps ([`transport`]: connect, handshake, write, read a
//! response), under TLS when configured ([`tls`]); the
//! watch's health as operators see it: outages, the last error ([`health`]);
//! the operator commands' requests over the same transport ([`exchange`]);
//! leaves under them: why a request failed ([`error`]), what a connection
//! runs over ([`stream`]); a scripted peer for the tests and the fuzzer
//! (`memstream`, only under `cfg(test)` or the `test-peers` feature).

pub mod client;
pub mod error;
pub mod exchange;
pub mod health;
#[cfg(any(test, feature = "test-peers"))]
pub mod memstream;
pub mod stream;
pub mod tls;
pub mod transport;
pub mod watch;
