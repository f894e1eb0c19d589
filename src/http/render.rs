//! Rendering responses (server side).

/// A response to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Extra headers, in order (`Content-Length`/`Transfer-Encoding`,
    /// `Connection` and `Date` are added by [`render_response`]).
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// Appends the response to `out`: status line with the standard reason
/// phrase, the headers, `Date`, `Connection: close` when `!keep_alive`, then
/// the body with `Content-Length` when it is at most `chunk_over` bytes
/// (or `chunk_over` is `None`), else `Transfer-Encoding: chunked` (how Go's
/// net/http, hence consul, frames bodies over 2048 bytes). For `HEAD`
/// (`head_only`) the framing headers are written but no body.
pub fn render_response(out: &mut Vec<u8>, resp: &Response, keep_alive: bool, chunk_over: Option<usize>, head_only: bool) {
    todo!("{out:?} {resp:?} {keep_alive} {chunk_over:?} {head_only}")
}
