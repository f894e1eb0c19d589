//! Request and response heads over `httparse`, with the framing rules of
//! RFC 9112 §6 applied strictly (smuggling shapes are refused).

use super::Parse;

/// The request methods the servers here know; anything else is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Put,
    Delete,
    Options,
    Other,
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: n` (0 when a request carries neither header).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Response only: the body runs until the peer closes.
    Close,
}

/// A request head (server side: monitoring, pprof, dev KV).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Method,
    /// The method token as sent, for error messages (`method X not allowed`).
    pub method_name: String,
    /// Path, still percent-encoded, without the query.
    pub path: String,
    /// Raw query string after `?` (empty if none).
    pub query: String,
    pub framing: Framing,
    /// False for HTTP/1.0 without keep-alive, or `Connection: close`.
    pub keep_alive: bool,
    /// Header names lowercased, values as sent (only the ones kept: at most
    /// [`super::MAX_HEADERS`]).
    pub headers: Vec<(String, Vec<u8>)>,
}

/// A response head (client side: consul).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub framing: Framing,
    /// False when the server said `Connection: close`, spoke HTTP/1.0
    /// without keep-alive, or the body is close-delimited.
    pub keep_alive: bool,
    /// Header names lowercased.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl RequestHead {
    /// First value of a header, name matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find(&self.headers, name)
    }
}

impl ResponseHead {
    /// First value of a header, name matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find(&self.headers, name)
    }
}

fn find<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
}

/// Parses a request head of at most `max_head_bytes`. Refused
/// (`Invalid`): a head past the bound, more than `MAX_HEADERS` headers,
/// obs-fold, two `Content-Length`s that differ or a list, a
/// `Content-Length` with `Transfer-Encoding`, a transfer coding other than
/// exactly `chunked`, HTTP versions other than 1.0/1.1.
pub fn parse_request_head(buf: &[u8], max_head_bytes: usize) -> Parse<RequestHead> {
    todo!("{buf:?} {max_head_bytes}")
}

/// Parses a response head of at most `max_head_bytes`. 1xx responses are
/// `Invalid` (consul never sends them for GET). Responses to HEAD or with
/// status 204/304 are not expected from consul and need no special case.
/// Refused like requests for the framing rules; without `Content-Length`
/// or `Transfer-Encoding` the body is `Framing::Close`.
pub fn parse_response_head(buf: &[u8], max_head_bytes: usize) -> Parse<ResponseHead> {
    todo!("{buf:?} {max_head_bytes}")
}
