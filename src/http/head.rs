//! Request and response heads over `httparse`, with the framing rules of
//! RFC 9112 §6 applied strictly (smuggling shapes are refused).

/// Result of parsing a head from the bytes seen so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<T> {
    /// The head is complete; it used this many bytes of the input.
    Done(T, usize),
    /// More bytes are needed.
    Partial,
    /// The bytes can never become an acceptable head.
    Invalid(&'static str),
}

/// Most header lines accepted in one head.
pub const MAX_HEADERS: usize = 64;

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
    /// [`MAX_HEADERS`]).
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
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// Parses a request head of at most `max_head_bytes`. Refused
/// (`Invalid`): a head past the bound, more than `MAX_HEADERS` headers,
/// obs-fold, more than one `Content-Length` (even equal ones) or a list, a
/// `Content-Length` with `Transfer-Encoding`, a transfer coding other than
/// exactly `chunked` (one header, one coding), HTTP versions other than
/// 1.0/1.1, and `Transfer-Encoding` in an HTTP/1.0 message (RFC 9112 §6.1
/// calls that framing faulty).
pub fn parse_request_head(buf: &[u8], max_head_bytes: usize) -> Parse<RequestHead> {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut raw);
    let head_len = match req.parse(bounded(buf, max_head_bytes)) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return partial(buf, max_head_bytes),
        Err(e) => return Parse::Invalid(httparse_reason(e)),
    };
    let version = match req.version {
        Some(v @ (0 | 1)) => v,
        _ => return Parse::Invalid("unsupported HTTP version"),
    };
    let (Some(method_name), Some(target)) = (req.method, req.path) else {
        return Parse::Invalid("incomplete request line");
    };
    let framing = match body_framing(req.headers, version) {
        Ok(Some(f)) => f,
        Ok(None) => Framing::Length(0),
        Err(why) => return Parse::Invalid(why),
    };
    let keep_alive = keep_alive(req.headers, version);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (target, ""),
    };
    Parse::Done(
        RequestHead {
            method: Method::from_name(method_name),
            method_name: method_name.to_string(),
            path: path.to_string(),
            query: query.to_string(),
            framing,
            keep_alive,
            headers: owned(req.headers),
        },
        head_len,
    )
}

/// Parses a response head of at most `max_head_bytes`. An interim (1xx)
/// response is `Done` with no body: the caller skips it and parses the real
/// response after it (RFC 9110 §15.2); `101 Switching Protocols` is
/// `Invalid` (nothing here upgrades). 1xx, 204 and 304 have no body
/// whatever their headers say (RFC 9112 §6.3). Refused like requests for the
/// framing rules; without `Content-Length` or `Transfer-Encoding` the body
/// is `Framing::Close`.
pub fn parse_response_head(buf: &[u8], max_head_bytes: usize) -> Parse<ResponseHead> {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut raw);
    let head_len = match resp.parse(bounded(buf, max_head_bytes)) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return partial(buf, max_head_bytes),
        Err(e) => return Parse::Invalid(httparse_reason(e)),
    };
    let version = match resp.version {
        Some(v @ (0 | 1)) => v,
        _ => return Parse::Invalid("unsupported HTTP version"),
    };
    let status = match resp.code {
        Some(c) if c < 100 => return Parse::Invalid("bad status code"),
        Some(101) => return Parse::Invalid("101 switching protocols"),
        Some(c) => c,
        None => return Parse::Invalid("incomplete status line"),
    };
    let (framing, keep_alive) = match body_framing(resp.headers, version) {
        _ if status < 200 || status == 204 || status == 304 => {
            (Framing::Length(0), keep_alive(resp.headers, version))
        }
        Ok(Some(f)) => (f, keep_alive(resp.headers, version)),
        // Close-delimited: the end of the body is the end of the connection.
        Ok(None) => (Framing::Close, false),
        Err(why) => return Parse::Invalid(why),
    };
    Parse::Done(
        ResponseHead {
            status,
            framing,
            keep_alive,
            headers: owned(resp.headers),
        },
        head_len,
    )
}

/// At most `max` bytes are ever given to httparse, so a complete head is
/// within the bound by construction.
fn bounded(buf: &[u8], max: usize) -> &[u8] {
    &buf[..buf.len().min(max)]
}

fn partial<T>(buf: &[u8], max: usize) -> Parse<T> {
    if buf.len() <= max {
        Parse::Partial
    } else {
        // No head ends within the first `max` bytes.
        Parse::Invalid("head too large")
    }
}

fn httparse_reason(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "unsupported HTTP version",
        httparse::Error::HeaderName => "bad header name (or obs-fold)",
        httparse::Error::HeaderValue => "bad header value",
        httparse::Error::NewLine => "bad line ending",
        httparse::Error::Status => "bad status line",
        httparse::Error::Token => "bad method token",
    }
}

impl Method {
    /// The method a token names; case-sensitive (RFC 9110 §9.1).
    pub fn from_name(name: &str) -> Method {
        match name {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }
}

/// The body framing the headers declare, `None` when they declare none.
/// Every ambiguous shape is an error: a message that two parsers could
/// frame differently is how request smuggling starts.
fn body_framing(
    headers: &[httparse::Header<'_>],
    version: u8,
) -> Result<Option<Framing>, &'static str> {
    let mut length = None;
    let mut chunked = false;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Err("more than one content-length");
            }
            length = Some(parse_content_length(h.value).ok_or("bad content-length")?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if chunked {
                return Err("more than one transfer-encoding");
            }
            if !trim_ows(h.value).eq_ignore_ascii_case(b"chunked") {
                return Err("transfer-encoding other than chunked");
            }
            chunked = true;
        }
    }
    match (length, chunked) {
        (Some(_), true) => Err("content-length with transfer-encoding"),
        (_, true) if version == 0 => Err("transfer-encoding in HTTP/1.0"),
        (_, true) => Ok(Some(Framing::Chunked)),
        (Some(n), false) => Ok(Some(Framing::Length(n))),
        (None, false) => Ok(None),
    }
}

/// Plain decimal digits only (no sign, no list, no inner space), within u64.
fn parse_content_length(value: &[u8]) -> Option<u64> {
    crate::decimal::parse_uint(trim_ows(value)).ok()
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = v.iter().position(|b| !is_ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !is_ows(b)).map_or(start, |i| i + 1);
    &v[start..end]
}

/// HTTP/1.1 persists unless `close`; HTTP/1.0 only with `keep-alive`.
/// `Connection` is a comma list and may be repeated.
fn keep_alive(headers: &[httparse::Header<'_>], version: u8) -> bool {
    let mut close = false;
    let mut keep = false;
    for h in headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
    {
        for token in h.value.split(|&b| b == b',').map(trim_ows) {
            close |= token.eq_ignore_ascii_case(b"close");
            keep |= token.eq_ignore_ascii_case(b"keep-alive");
        }
    }
    !close && (version == 1 || keep)
}

fn owned(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 16 * 1024;

    fn resp(raw: &[u8]) -> (ResponseHead, usize) {
        match parse_response_head(raw, MAX) {
            Parse::Done(h, n) => (h, n),
            other => panic!(
                "expected Done, got {other:?} for {:?}",
                String::from_utf8_lossy(raw)
            ),
        }
    }

    fn req(raw: &[u8]) -> (RequestHead, usize) {
        match parse_request_head(raw, MAX) {
            Parse::Done(h, n) => (h, n),
            other => panic!(
                "expected Done, got {other:?} for {:?}",
                String::from_utf8_lossy(raw)
            ),
        }
    }

    fn resp_invalid(raw: &[u8]) -> bool {
        matches!(parse_response_head(raw, MAX), Parse::Invalid(_))
    }

    fn req_invalid(raw: &[u8]) -> bool {
        matches!(parse_request_head(raw, MAX), Parse::Invalid(_))
    }

    const CONSUL_200: &[u8] = b"HTTP/1.1 200 OK\r\n\
Content-Type: application/json\r\n\
Vary: Accept-Encoding\r\n\
X-Consul-Default-Acl-Policy: allow\r\n\
X-Consul-Effective-Consistency: leader\r\n\
X-Consul-Index: 42\r\n\
X-Consul-Knownleader: true\r\n\
X-Consul-Lastcontact: 0\r\n\
X-Consul-Query-Backend: blocking-query\r\n\
Date: Tue, 14 Nov 2023 22:13:20 GMT\r\n\
Content-Length: 102\r\n\
\r\n";

    #[test]
    fn consul_200_with_content_length() {
        let mut raw = CONSUL_200.to_vec();
        raw.extend_from_slice(br#"[{"LockIndex":0,"Key":"gitlab/web-01","Flags":0,"Value":"cmVhZHk=","CreateIndex":12,"ModifyIndex":42}]"#);
        let (h, n) = resp(&raw);
        assert_eq!(n, CONSUL_200.len());
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Length(102));
        assert!(h.keep_alive);
        assert_eq!(h.header("X-Consul-Index"), Some(&b"42"[..]));
        assert_eq!(h.header("x-consul-knownleader"), Some(&b"true"[..]));
        assert_eq!(h.headers.len(), 10);
        assert_eq!(&raw[n..].len(), &102);
        assert!(h
            .headers
            .iter()
            .all(|(name, _)| *name == name.to_ascii_lowercase()));
    }

    #[test]
    fn consul_404_is_empty_with_index() {
        let raw = b"HTTP/1.1 404 Not Found\r\nVary: Accept-Encoding\r\nX-Consul-Default-Acl-Policy: allow\r\n\
X-Consul-Index: 17\r\nX-Consul-Knownleader: true\r\nX-Consul-Lastcontact: 0\r\n\
Date: Tue, 14 Nov 2023 22:13:20 GMT\r\nContent-Length: 0\r\n\r\n";
        let (h, n) = resp(raw);
        assert_eq!(n, raw.len());
        assert_eq!(h.status, 404);
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.keep_alive);
        assert_eq!(h.header("x-consul-index"), Some(&b"17"[..]));
    }

    #[test]
    fn consul_chunked_200() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nVary: Accept-Encoding\r\n\
X-Consul-Index: 9001\r\nX-Consul-Knownleader: true\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n\
Transfer-Encoding: chunked\r\n\r\na3f\r\n";
        let (h, n) = resp(raw);
        assert_eq!(&raw[n..], b"a3f\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        assert!(h.keep_alive);
    }

    #[test]
    fn http10_close_delimited() {
        let (h, _) = resp(
            b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nX-Consul-Index: 5\r\n\r\n[]",
        );
        assert_eq!(h.framing, Framing::Close);
        assert!(!h.keep_alive);
        // HTTP/1.1 without any length is close-delimited too.
        let (h, _) = resp(b"HTTP/1.1 200 OK\r\nX-Consul-Index: 5\r\n\r\n");
        assert_eq!(h.framing, Framing::Close);
        assert!(!h.keep_alive);
    }

    #[test]
    fn response_keep_alive_rules() {
        let (h, _) = resp(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        assert!(!h.keep_alive);
        let (h, _) =
            resp(b"HTTP/1.1 200 OK\r\nConnection: Upgrade, CLOSE\r\nContent-Length: 0\r\n\r\n");
        assert!(!h.keep_alive);
        let (h, _) = resp(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
        assert!(!h.keep_alive);
        let (h, _) =
            resp(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n");
        assert!(h.keep_alive);
    }

    #[test]
    fn header_names_case_insensitive() {
        let (h, _) = resp(b"HTTP/1.1 200 OK\r\ncontent-LENGTH: 3\r\nx-CONSUL-index: 7\r\n\r\nabc");
        assert_eq!(h.framing, Framing::Length(3));
        assert_eq!(h.header("X-Consul-Index"), Some(&b"7"[..]));
        let (h, _) = resp(b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: Chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        let (r, _) = req(b"GET / HTTP/1.1\r\nhOsT: x\r\nCONTENT-length: 2\r\n\r\n");
        assert_eq!(r.framing, Framing::Length(2));
        assert_eq!(r.header("host"), Some(&b"x"[..]));
        assert_eq!(r.headers[0].0, "host");
    }

    #[test]
    fn optional_whitespace_around_values_is_allowed() {
        let (h, _) = resp(b"HTTP/1.1 200 OK\r\nContent-Length:   12 \r\n\r\n");
        assert_eq!(h.framing, Framing::Length(12));
        let (h, _) = resp(b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\tchunked \r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
    }

    /// Header blocks that two parsers could frame differently.
    const SMUGGLING: &[&str] = &[
        "Content-Length: 5\r\nContent-Length: 5\r\n",
        "Content-Length: 5\r\nContent-Length: 6\r\n",
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        "Transfer-Encoding: gzip\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "Transfer-Encoding: chunked,\r\n",
        "Transfer-Encoding: xchunked\r\n",
        "Transfer-Encoding:\r\n",
        "Content-Length: +5\r\n",
        "Content-Length: -5\r\n",
        "Content-Length: 5 5\r\n",
        "Content-Length: 0x10\r\n",
        "Content-Length: \r\n",
        "Content-Length: 99999999999999999999999\r\n",
        "Content-Length: 5\r\n folded: yes\r\n",
        "X-Folded: a\r\n b\r\nContent-Length: 5\r\n",
        "X-Folded: a\r\n\tb\r\n",
        "Content-Length : 5\r\n",
        " Content-Length: 5\r\n",
    ];

    #[test]
    fn smuggling_shapes_refused_in_responses() {
        for headers in SMUGGLING {
            let raw = format!("HTTP/1.1 200 OK\r\nX-Consul-Index: 1\r\n{headers}\r\nhello");
            assert!(
                resp_invalid(raw.as_bytes()),
                "accepted response with {headers:?}"
            );
        }
    }

    #[test]
    fn smuggling_shapes_refused_in_requests() {
        for headers in SMUGGLING {
            let raw = format!("PUT /v1/kv/a HTTP/1.1\r\nHost: x\r\n{headers}\r\nhello");
            assert!(
                req_invalid(raw.as_bytes()),
                "accepted request with {headers:?}"
            );
        }
    }

    #[test]
    fn transfer_encoding_in_http10_refused() {
        assert!(resp_invalid(
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(req_invalid(
            b"PUT / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
    }

    #[test]
    fn versions_other_than_10_and_11_refused() {
        assert!(resp_invalid(
            b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(resp_invalid(
            b"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(req_invalid(b"GET / HTTP/0.9\r\n\r\n"));
        assert!(req_invalid(b"GET / HTTP/1.2\r\n\r\n"));
        assert!(req_invalid(b"GET /\r\n\r\n"));
    }

    #[test]
    fn interim_responses_have_no_body_and_101_is_refused() {
        // 1xx (to be skipped by the caller), 204 and 304: no body whatever
        // the headers say.
        for raw in [
            &b"HTTP/1.1 100 Continue\r\n\r\n"[..],
            b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
            b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let (h, used) = resp(raw);
            assert_eq!((h.framing, used), (Framing::Length(0), raw.len()));
        }
        assert!(resp_invalid(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"
        ));
        assert!(resp_invalid(b"HTTP/1.1 099 Weird\r\n\r\n"));
    }

    #[test]
    fn head_too_large() {
        let mut raw = b"HTTP/1.1 200 OK\r\n".to_vec();
        while raw.len() < 300 {
            raw.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaa\r\n");
        }
        raw.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        let len = raw.len();
        assert!(matches!(parse_response_head(&raw, len), Parse::Done(_, n) if n == len));
        assert_eq!(
            parse_response_head(&raw, len - 1),
            Parse::Invalid("head too large")
        );
        assert_eq!(
            parse_response_head(&raw, 100),
            Parse::Invalid("head too large")
        );
        // Incomplete and within the bound: wait for more.
        assert_eq!(parse_response_head(&raw[..100], 100), Parse::Partial);
        assert_eq!(parse_response_head(&raw[..99], 100), Parse::Partial);
        assert_eq!(
            parse_response_head(&raw[..101], 100),
            Parse::Invalid("head too large")
        );
        let mut raw = b"GET / HTTP/1.1\r\n".to_vec();
        raw.extend(std::iter::repeat_n(b'a', 200));
        assert_eq!(
            parse_request_head(&raw, 64),
            Parse::Invalid("head too large")
        );
        assert_eq!(parse_request_head(&raw[..64], 64), Parse::Partial);
    }

    #[test]
    fn every_prefix_of_a_head_is_partial() {
        let raw = b"HTTP/1.1 200 OK\r\nX-Consul-Index: 42\r\nContent-Length: 2\r\n\r\n[]";
        let head_len = raw.len() - 2;
        for cut in 0..head_len {
            assert_eq!(
                parse_response_head(&raw[..cut], MAX),
                Parse::Partial,
                "cut at {cut}"
            );
        }
        let req_raw = b"GET /v1/kv/a?recurse HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 0..req_raw.len() {
            assert_eq!(
                parse_request_head(&req_raw[..cut], MAX),
                Parse::Partial,
                "cut at {cut}"
            );
        }
        assert!(
            matches!(parse_request_head(req_raw, MAX), Parse::Done(_, n) if n == req_raw.len())
        );
    }

    #[test]
    fn too_many_headers() {
        let build = |count: usize| {
            let mut raw = b"GET / HTTP/1.1\r\n".to_vec();
            for i in 0..count {
                raw.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
            }
            raw.extend_from_slice(b"\r\n");
            raw
        };
        assert!(
            matches!(parse_request_head(&build(MAX_HEADERS), MAX), Parse::Done(h, _) if h.headers.len() == MAX_HEADERS)
        );
        assert_eq!(
            parse_request_head(&build(MAX_HEADERS + 1), MAX),
            Parse::Invalid("too many headers")
        );
        let mut raw = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            raw.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
        }
        raw.extend_from_slice(b"\r\n");
        assert_eq!(
            parse_response_head(&raw, MAX),
            Parse::Invalid("too many headers")
        );
    }

    #[test]
    fn request_line_and_target() {
        let raw = b"GET /v1/kv/gitlab/?recurse&index=42&wait=5s HTTP/1.1\r\nHost: 127.0.0.1:8500\r\n\r\nGET /next";
        let (h, n) = req(raw);
        assert_eq!(&raw[n..], b"GET /next");
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.method_name, "GET");
        assert_eq!(h.path, "/v1/kv/gitlab/");
        assert_eq!(h.query, "recurse&index=42&wait=5s");
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.keep_alive);
        let (h, _) = req(b"GET /a?b?c=d HTTP/1.1\r\n\r\n");
        assert_eq!((h.path.as_str(), h.query.as_str()), ("/a", "b?c=d"));
        let (h, _) = req(b"GET /-/metrics HTTP/1.1\r\n\r\n");
        assert_eq!((h.path.as_str(), h.query.as_str()), ("/-/metrics", ""));
        let (h, _) = req(b"GET /x? HTTP/1.1\r\n\r\n");
        assert_eq!((h.path.as_str(), h.query.as_str()), ("/x", ""));
    }

    #[test]
    fn request_methods() {
        for (name, m) in [
            ("GET", Method::Get),
            ("HEAD", Method::Head),
            ("PUT", Method::Put),
            ("DELETE", Method::Delete),
            ("OPTIONS", Method::Options),
            ("PATCH", Method::Other),
            ("get", Method::Other),
        ] {
            let (h, _) = req(format!("{name} / HTTP/1.1\r\n\r\n").as_bytes());
            assert_eq!(h.method, m, "{name}");
            assert_eq!(h.method_name, name);
        }
    }

    #[test]
    fn request_framing() {
        let (h, _) = req(b"PUT /v1/kv/a HTTP/1.1\r\nContent-Length: 5\r\n\r\nready");
        assert_eq!(h.framing, Framing::Length(5));
        let (h, _) = req(
            b"PUT /v1/kv/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nready\r\n0\r\n\r\n",
        );
        assert_eq!(h.framing, Framing::Chunked);
    }

    #[test]
    fn request_keep_alive_rules() {
        assert!(req(b"GET / HTTP/1.1\r\n\r\n").0.keep_alive);
        assert!(
            !req(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
                .0
                .keep_alive
        );
        assert!(
            !req(b"GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n")
                .0
                .keep_alive
        );
        assert!(!req(b"GET / HTTP/1.0\r\n\r\n").0.keep_alive);
        assert!(
            req(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .0
                .keep_alive
        );
        assert!(
            req(b"GET / HTTP/1.0\r\nconnection: KEEP-ALIVE\r\n\r\n")
                .0
                .keep_alive
        );
    }

    #[test]
    fn garbage_is_invalid() {
        assert!(resp_invalid(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"));
        assert!(resp_invalid(b"HTTP/1.1 abc OK\r\n\r\n"));
        assert!(req_invalid(b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n"));
        assert!(req_invalid(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"));
    }
}
