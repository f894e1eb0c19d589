//! HTTP/1.1 framing, pure (RFC 9112): request and response heads (via
//! `httparse`), `Content-Length`, chunked and close-delimited bodies, query
//! strings, and rendering of responses. One copy, used by the consul client,
//! the monitoring/pprof server and the dev KV; [`server`]: the one HTTP
//! server connection those listeners share (it does IO on the stream it
//! is given).
//!
//! In: bytes, in whatever pieces the socket delivered them. Out: a parsed
//! head, decoded body bytes, or a reason the peer's bytes are not
//! acceptable.
//!
//! Always holds:
//! - no function here does IO, panics on any input, or allocates more than
//!   its input (plus a bounded head);
//! - the result never depends on how the bytes were split.

mod body;
mod coding;
mod head;
mod query;
mod render;
pub mod server;

pub use body::{BodyDecoder, BodyError};
pub use coding::{
    accepts_gzip, content_coding, gzip, Coding, InflateError, Inflater, GZIP_MIN_SIZE,
};
pub use head::{
    parse_request_head, parse_response_head, Framing, Method, Parse, RequestHead, ResponseHead,
    MAX_HEADERS,
};
pub use query::{percent_decode, percent_encode, query_pairs, EncodeSet};
pub use render::{render_head, render_response, Response};
