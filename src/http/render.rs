//! Rendering responses (server side).
//!
//! In: a status, extra headers and a body. Out: the wire bytes, framed the
//! way Go's net/http (hence consul) frames them. Always holds: the output
//! parses back with [`super::parse_response_head`] and
//! [`super::BodyDecoder`] to the same status, headers and body.

use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// A response to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Extra headers, in order (`Content-Length`/`Transfer-Encoding`,
    /// `Connection` and `Date` are added by [`render_response`]).
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// Headers [`render_response`] owns; a caller's copy is dropped so that a
/// response can never carry two framings.
const OWNED_HEADERS: [&str; 4] = ["content-length", "transfer-encoding", "connection", "date"];

/// Appends the response to `out`: status line with the standard reason
/// phrase, the headers, `Date`, `Connection: close` when `!keep_alive`, then
/// the body with `Content-Length` when it is at most `chunk_over` bytes
/// (or `chunk_over` is `None`), else `Transfer-Encoding: chunked` (how Go's
/// net/http, hence consul, frames bodies over 2048 bytes). For `HEAD`
/// (`head_only`) the framing headers are written but no body.
///
/// Extra headers named like the ones added here are dropped, and CR/LF in
/// header values are replaced by spaces (no response splitting).
pub fn render_response(
    out: &mut Vec<u8>,
    resp: &Response,
    keep_alive: bool,
    chunk_over: Option<usize>,
    head_only: bool,
) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    render_at(out, resp, keep_alive, chunk_over, head_only, now);
}

/// Appends the head of a response whose body (of `body_len` bytes, sent
/// with `Content-Length`) the caller writes from its own buffer: a body
/// shared by many connections is never copied into each.
pub fn render_head(out: &mut Vec<u8>, resp: &Response, body_len: usize, keep_alive: bool) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    render_head_at(out, resp, body_len, false, keep_alive, now);
}

fn render_at(
    out: &mut Vec<u8>,
    resp: &Response,
    keep_alive: bool,
    chunk_over: Option<usize>,
    head_only: bool,
    unix_secs: u64,
) {
    let chunked = chunk_over.is_some_and(|limit| resp.body.len() > limit);
    render_head_at(out, resp, resp.body.len(), chunked, keep_alive, unix_secs);
    if head_only {
        return;
    }
    if chunked {
        // Non-empty by construction (len > limit >= 0).
        let _ = write!(out, "{:x}\r\n", resp.body.len());
        out.extend_from_slice(&resp.body);
        out.extend_from_slice(b"\r\n0\r\n\r\n");
    } else {
        out.extend_from_slice(&resp.body);
    }
}

/// The status line and headers, framing included, up to the blank line.
fn render_head_at(
    out: &mut Vec<u8>,
    resp: &Response,
    body_len: usize,
    chunked: bool,
    keep_alive: bool,
    unix_secs: u64,
) {
    let _ = write!(out, "HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    for (name, value) in &resp.headers {
        if OWNED_HEADERS.iter().any(|h| h.eq_ignore_ascii_case(name)) {
            log::debug!("render_response: dropping caller header {name}");
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend(
            value
                .bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Date: ");
    http_date(out, unix_secs);
    out.extend_from_slice(b"\r\n");
    if chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    } else {
        let _ = write!(out, "Content-Length: {body_len}\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The standard reason phrase (RFC 9110 §15), or the class's name.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => match status / 100 {
            1 => "Informational",
            2 => "Success",
            3 => "Redirection",
            4 => "Client Error",
            5 => "Server Error",
            _ => "Unknown",
        },
    }
}

/// IMF-fixdate (RFC 9110 §5.6.7): `Sun, 06 Nov 1994 08:49:37 GMT`.
fn http_date(out: &mut Vec<u8>, unix_secs: u64) {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let _ = write!(
        out,
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize], // 1970-01-01 was a Thursday
        day,
        MONTHS[(month - 1) as usize],
        year,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31), Howard
/// Hinnant's `civil_from_days`, for non-negative days.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{parse_response_head, BodyDecoder, Framing, Parse};

    fn render(
        resp: &Response,
        keep_alive: bool,
        chunk_over: Option<usize>,
        head_only: bool,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        render_response(&mut out, resp, keep_alive, chunk_over, head_only);
        out
    }

    fn kv_response(body: Vec<u8>) -> Response {
        Response {
            status: 200,
            headers: vec![
                ("Content-Type", "application/json".into()),
                ("X-Consul-Index", "42".into()),
            ],
            body,
        }
    }

    /// Parses rendered bytes back: head, then body. Returns the head and
    /// the body; asserts every byte was used.
    fn round_trip(wire: &[u8]) -> (crate::http::ResponseHead, Vec<u8>) {
        let Parse::Done(head, n) = parse_response_head(wire, 8192) else {
            panic!(
                "rendered head does not parse: {:?}",
                String::from_utf8_lossy(wire)
            );
        };
        let mut d = BodyDecoder::new(head.framing, 1 << 20);
        let mut body = Vec::new();
        let used = d
            .feed(&wire[n..], &mut body)
            .expect("rendered body decodes");
        assert_eq!(n + used, wire.len(), "trailing bytes after the body");
        assert!(d.is_done());
        (head, body)
    }

    #[test]
    fn round_trip_content_length() {
        let body = br#"[{"Key":"gitlab/web-01","Value":"cmVhZHk="}]"#.to_vec();
        let wire = render(&kv_response(body.clone()), true, Some(2048), false);
        assert!(wire.starts_with(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Consul-Index: 42\r\nDate: "
        ));
        let (head, got) = round_trip(&wire);
        assert_eq!(head.status, 200);
        assert_eq!(head.framing, Framing::Length(body.len() as u64));
        assert!(head.keep_alive);
        assert_eq!(head.header("x-consul-index"), Some(&b"42"[..]));
        assert_eq!(head.header("date").map(<[u8]>::len), Some(29));
        assert_eq!(got, body);
    }

    #[test]
    fn round_trip_chunked_like_consul() {
        let body: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let wire = render(&kv_response(body.clone()), true, Some(2048), false);
        let (head, got) = round_trip(&wire);
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.keep_alive);
        assert_eq!(head.header("content-length"), None);
        assert_eq!(got, body);
        // 2048 bytes exactly still get a Content-Length, like Go.
        let wire = render(&kv_response(vec![b'x'; 2048]), true, Some(2048), false);
        assert_eq!(round_trip(&wire).0.framing, Framing::Length(2048));
        // No threshold: never chunked.
        let wire = render(&kv_response(body.clone()), true, None, false);
        assert_eq!(round_trip(&wire).0.framing, Framing::Length(3000));
    }

    #[test]
    fn connection_close() {
        let resp = Response {
            status: 503,
            headers: vec![],
            body: b"not ready\n".to_vec(),
        };
        let wire = render(&resp, false, None, false);
        assert!(wire.starts_with(b"HTTP/1.1 503 Service Unavailable\r\n"));
        let (head, body) = round_trip(&wire);
        assert!(!head.keep_alive);
        assert_eq!(head.header("connection"), Some(&b"close"[..]));
        assert_eq!(body, b"not ready\n");
        assert!(!String::from_utf8_lossy(&render(&resp, true, None, false)).contains("Connection"));
    }

    #[test]
    fn head_only_writes_framing_but_no_body() {
        let resp = kv_response(b"[1,2,3]".to_vec());
        let wire = render(&resp, true, Some(2048), true);
        let Parse::Done(head, n) = parse_response_head(&wire, 8192) else {
            panic!()
        };
        assert_eq!(n, wire.len());
        assert_eq!(head.framing, Framing::Length(7));
        let wire = render(&kv_response(vec![b'x'; 5000]), true, Some(2048), true);
        let Parse::Done(head, n) = parse_response_head(&wire, 8192) else {
            panic!()
        };
        assert_eq!(n, wire.len());
        assert_eq!(head.framing, Framing::Chunked);
    }

    #[test]
    fn empty_body() {
        let resp = Response {
            status: 404,
            headers: vec![("X-Consul-Index", "17".into())],
            body: vec![],
        };
        let wire = render(&resp, true, Some(0), false);
        assert!(wire.starts_with(b"HTTP/1.1 404 Not Found\r\n"));
        let (head, body) = round_trip(&wire);
        assert_eq!(head.framing, Framing::Length(0));
        assert!(body.is_empty());
    }

    #[test]
    fn reason_phrases() {
        for (code, phrase) in [
            (200, "OK"),
            (301, "Moved Permanently"),
            (400, "Bad Request"),
            (404, "Not Found"),
            (405, "Method Not Allowed"),
            (413, "Content Too Large"),
            (429, "Too Many Requests"),
            (500, "Internal Server Error"),
            (501, "Not Implemented"),
            (503, "Service Unavailable"),
            (418, "Client Error"),
            (599, "Server Error"),
            (999, "Unknown"),
        ] {
            let wire = render(
                &Response {
                    status: code,
                    headers: vec![],
                    body: vec![],
                },
                true,
                None,
                false,
            );
            assert!(
                wire.starts_with(format!("HTTP/1.1 {code} {phrase}\r\n").as_bytes()),
                "{code}"
            );
        }
    }

    #[test]
    fn caller_cannot_break_framing() {
        let resp = Response {
            status: 301,
            headers: vec![
                ("Content-Length", "999".into()),
                ("transfer-encoding", "chunked".into()),
                ("Location", "/a\r\nSet-Cookie: x=1".into()),
            ],
            body: b"moved".to_vec(),
        };
        let wire = render(&resp, true, None, false);
        let (head, body) = round_trip(&wire);
        assert_eq!(head.framing, Framing::Length(5));
        assert_eq!(head.header("location"), Some(&b"/a  Set-Cookie: x=1"[..]));
        assert_eq!(head.header("set-cookie"), None);
        assert_eq!(body, b"moved");
    }

    #[test]
    fn imf_fixdate() {
        let date = |secs| {
            let mut v = Vec::new();
            http_date(&mut v, secs);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(date(1_700_000_000), "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(date(4_102_444_799), "Thu, 31 Dec 2099 23:59:59 GMT");
    }
}
