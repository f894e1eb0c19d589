//! The consul side: KV JSON decoding ([`kv`], pure), the watch logic (index
//! rules, rate limit, backoff: [`watch`], pure) and the nonblocking HTTP/1.1
//! client connection that runs it inside the loop ([`client`]).

pub mod client;
pub mod kv;
pub mod memstream;
pub mod watch;
