//! `/v1/kv/` over the store: GET (single key, `?recurse`, `?keys`,
//! `?raw`, blocking with `index`/`wait`), PUT (`?flags`, `?cas`), DELETE
//! (`?recurse`, `?cas`), OPTIONS; 405 otherwise. `PUT /v1/txn` is
//! [`super::txn`]'s.
//!
//! In: a parsed request head, its decoded body and `now`. Out: a
//! [`Response`] to render, or a [`Wait`] the loop parks until
//! [`DevKv::is_ready`] or its deadline. The checks run in consul's order
//! (Go's ServeMux path cleaning, then `wrap`, then `parse`, then the KV
//! handler), so the first error a request hits is the one consul reports,
//! with consul's status and text. This file holds consul's rules; what is
//! Go's own (path cleaning, the redirect, `strconv`, `url`, JSON escaping)
//! comes from [`crate::gocompat`].
//!
//! Like consul's gzip handler, a response of at least 1,400 bytes to a
//! request that accepts gzip is gzipped. A fleet of agents asks for the
//! same listing at the same index after every write: the parked queries a
//! write (or a wait's end) answers together share one rendering, kept
//! until the loop calls [`DevKv::forget_rendered`] after the batch.
//!
//! Deliberate differences from a real `consul agent -dev`: JSON is compact
//! unless `?pretty` is given (a real dev agent always pretty-prints);
//! sessions do not exist, so `?acquire` fails like an unknown session; a
//! percent-decoded key that is not UTF-8 gets 400 (consul would store it).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::store::Store;
use super::wire::{
    dir_entry, error, forward, json_bytes, leader_headers, parse_query_options, sort_headers,
    wrapped, DirEntry, Params, MAX_VALUE_SIZE, TEXT,
};
use crate::gocompat::{clean_path, go_encode_query, go_quote, go_redirect};
use crate::http::{
    accepts_gzip, gzip, percent_decode, Method, RequestHead, Response, GZIP_MIN_SIZE,
};
use crate::jitter::Jitter;

/// consul's `default_query_time` (a blocking wait of 0 or less) and
/// `max_query_time` (the cap).
pub const DEFAULT_QUERY_TIME: Duration = Duration::from_secs(300);
pub const MAX_QUERY_TIME: Duration = Duration::from_secs(600);

const ALLOW: &str = "OPTIONS,GET,PUT,DELETE";
const TXN_ALLOW: &str = "OPTIONS,PUT";
const JITTER_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The dev KV: store plus blocking-query bookkeeping.
pub struct DevKv {
    store: Store,
    jitter: bool,
    /// xorshift64* state for the wait stagger (never 0).
    rng: Jitter,
    /// The last parked read rendered, until [`DevKv::forget_rendered`]:
    /// (store generation and the read's index, which a tombstone reaped can
    /// move alone; the read; gzipped; the response).
    rendered: Option<((u64, u64), Read, bool, Response)>,
}

/// What to do with one request.
#[derive(Debug)]
pub enum Handled {
    /// Answer now.
    Respond(Response),
    /// A blocking GET: park the connection until [`DevKv::is_ready`] says so
    /// or `deadline` passes, then send [`DevKv::answer`].
    Wait(Wait),
}

/// A parked blocking query.
#[derive(Debug, Clone)]
pub struct Wait {
    /// When to answer even if nothing changed (clamped wait plus jitter in
    /// [0, wait/16), as consul does).
    pub deadline: Instant,
    /// What to answer with.
    read: Read,
    /// The `?index=` the client sent; ready once the read's index passes it.
    index: u64,
    /// The request accepted gzip.
    gzip: bool,
}

impl Wait {
    /// The `?index=` the query blocks on.
    pub fn index(&self) -> u64 {
        self.index
    }
}

/// A GET, once parsed: everything needed to answer it again later.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Read {
    key: String,
    kind: ReadKind,
    pretty: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ReadKind {
    Single { raw: bool },
    Recurse,
    Keys { separator: String },
}

impl DevKv {
    /// `jitter`: add consul's random stagger to waits (off in tests that
    /// need exact deadlines).
    pub fn new(jitter: bool) -> DevKv {
        DevKv {
            store: Store::new(),
            jitter,
            rng: Jitter::new(JITTER_SEED),
            rendered: None,
        }
    }

    /// Reseeds the stagger PRNG (deterministic by default).
    pub fn set_jitter_seed(&mut self, seed: u64) {
        self.rng = Jitter::new(seed);
    }

    /// How long tombstones live (15 min by default).
    pub fn set_tombstone_ttl(&mut self, ttl: Duration) {
        self.store.set_tombstone_ttl(ttl);
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Direct access for seeding tests; writes made here move
    /// [`DevKv::generation`] like HTTP ones.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Handles one complete request (head + decoded body) at `now`.
    pub fn handle(&mut self, req: &RequestHead, body: &[u8], now: Instant) -> Handled {
        self.store.reap(now);
        let gzip = accepts_gzip(req.header("accept-encoding"));
        if req.path == "/v1/status/leader" && req.method == Method::Get {
            // Tools (and test harnesses) poll this until a leader is elected;
            // the dev KV is its own leader from the start.
            return Handled::Respond(Response {
                status: 200,
                headers: vec![("Content-Type", "application/json".to_owned())],
                body: br#""127.0.0.1:8300""#.to_vec(),
            });
        }
        if req.path == "/v1/txn" {
            return Handled::Respond(encode(self.txn(req, body, now), gzip));
        }
        if let Some(resp) = not_served(&req.path) {
            return Handled::Respond(encode(resp, gzip));
        }
        match self.route(req, body, now, gzip) {
            Ok(Handled::Respond(resp)) | Err(resp) => Handled::Respond(encode(resp, gzip)),
            Ok(wait) => wait,
        }
    }

    /// True when a parked query must be answered now (its prefix index went
    /// past the requested index). Cheap: called for every parked query after
    /// each write.
    pub fn is_ready(&self, wait: &Wait) -> bool {
        self.read_index(&wait.read) > wait.index
    }

    /// The response for a parked query (woken or timed out), rendered
    /// (and gzipped when asked and worth it) once for every query of a
    /// batch that asks the same.
    pub fn answer(&mut self, wait: &Wait) -> Response {
        self.render_once(&wait.read, wait.gzip)
    }

    /// A batch of parked queries was answered: the rendering kept for it
    /// is freed (it is not kept between batches, so an idle KV holds no
    /// copy of a listing).
    pub fn forget_rendered(&mut self) {
        self.rendered = None;
    }

    fn render_once(&mut self, read: &Read, gzip: bool) -> Response {
        let generation = (self.generation(), self.read_index(read));
        if let Some((g, r, z, resp)) = &self.rendered {
            if (*g, r, *z) == (generation, read, gzip) {
                return resp.clone();
            }
        }
        let resp = encode(self.render(read), gzip);
        self.rendered = Some((generation, read.clone(), gzip, resp.clone()));
        resp
    }

    /// Bumps on every write that changed the store; the loop re-checks
    /// parked queries only when it moved.
    pub fn generation(&self) -> u64 {
        // The store hands out a new index for every real write and only then.
        self.store.last_index()
    }

    /// `/v1/txn`: PUT only (consul's `Txn` handler).
    fn txn(&mut self, req: &RequestHead, body: &[u8], now: Instant) -> Response {
        match req.method {
            Method::Put => super::txn::handle(&mut self.store, &req.query, req.framing, body, now),
            Method::Options => wrapped(200, vec![("Allow", TXN_ALLOW.to_owned())], Vec::new()),
            _ => {
                let mut resp = error(405, &format!("method {} not allowed", req.method_name));
                resp.headers.push(("Allow", TXN_ALLOW.to_owned()));
                sort_headers(&mut resp.headers);
                resp
            }
        }
    }

    /// Every early answer is an `Err` so the steps read top to bottom.
    /// `gzip`: the request accepts gzip.
    fn route(
        &mut self,
        req: &RequestHead,
        body: &[u8],
        now: Instant,
        gzip: bool,
    ) -> Result<Handled, Response> {
        let key = route_path(req)?;
        // `wrap`: a query Go's `url.ParseQuery` refuses is a bare 500.
        if req.query.contains(';') || percent_decode(&req.query).is_none() {
            return Err(wrapped(500, Vec::new(), Vec::new()));
        }
        match req.method {
            Method::Get | Method::Put | Method::Delete => {}
            Method::Options => {
                return Err(wrapped(200, vec![("Allow", ALLOW.to_owned())], Vec::new()))
            }
            Method::Head | Method::Other => {
                let mut resp = error(405, &format!("method {} not allowed", req.method_name));
                resp.headers.push(("Allow", ALLOW.to_owned()));
                sort_headers(&mut resp.headers);
                return Err(resp);
            }
        }
        let params = Params::parse(&req.query);
        let (min_index, wait) = parse_query_options(&params)?;
        match req.method {
            Method::Get => Ok(self.get(key, &params, (min_index, wait), now, gzip)?),
            Method::Put => Ok(Handled::Respond(self.put(key, &params, body)?)),
            _ => Ok(Handled::Respond(self.delete(key, &params, now)?)),
        }
    }

    fn get(
        &mut self,
        key: String,
        params: &Params,
        (min_index, wait): (u64, Option<Duration>),
        now: Instant,
        gzip: bool,
    ) -> Result<Handled, Response> {
        let kind = if params.has("keys") {
            enterprise_meta(params)?;
            // Legacy spelling first, so `separator` wins when both are sent.
            let mut separator = "";
            if params.has("seperator") {
                separator = params.get("seperator");
            }
            if params.has("separator") {
                separator = params.get("separator");
            }
            ReadKind::Keys {
                separator: separator.to_owned(),
            }
        } else if params.has("recurse") {
            enterprise_meta(params)?;
            ReadKind::Recurse
        } else {
            if key.is_empty() {
                return Err(error(400, "Missing key name"));
            }
            enterprise_meta(params)?;
            ReadKind::Single {
                raw: params.has("raw"),
            }
        };
        let read = Read {
            key,
            kind,
            pretty: params.has("pretty"),
        };
        forward(params)?;
        if min_index == 0 || self.read_index(&read) > min_index {
            return Ok(Handled::Respond(encode(self.render(&read), gzip)));
        }
        let timeout = clamp_wait(wait);
        let deadline = now + timeout + self.stagger(timeout);
        Ok(Handled::Wait(Wait {
            deadline,
            read,
            index: min_index,
            gzip,
        }))
    }

    fn put(&mut self, key: String, params: &Params, body: &[u8]) -> Result<Response, Response> {
        enterprise_meta(params)?;
        if key.is_empty() {
            return Err(error(400, "Missing key name"));
        }
        conflicting_flags(params, &["cas", "acquire", "release"])?;
        let flags = if params.has("flags") {
            parse_uint(params.get("flags"))?
        } else {
            0
        };
        let cas = if params.has("cas") {
            Some(parse_uint(params.get("cas"))?)
        } else {
            None
        };
        if body.len() > MAX_VALUE_SIZE {
            return Err(error(
                413,
                &format!(
                    "Request body({} bytes) too large, max size: {MAX_VALUE_SIZE} bytes. See {}.",
                    body.len(),
                    "https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size"
                ),
            ));
        }
        forward(params)?;
        let pretty = params.has("pretty");
        // No sessions exist: every acquire names an unknown one, and no key
        // is held by the session a release names (`state/kvs.go`).
        if params.has("acquire") || params.has("release") {
            let (session, acquire) = match params.has("acquire") {
                true => (params.get("acquire"), true),
                false => (params.get("release"), false),
            };
            if session.is_empty() {
                return Err(error(500, "missing session"));
            }
            if acquire {
                return Err(error(
                    500,
                    &format!("invalid session {}", go_quote(session)),
                ));
            }
            return Ok(json_response(&false, pretty));
        }
        let ok = self.store.put(&key, body, flags, cas);
        Ok(json_response(&ok, pretty))
    }

    fn delete(&mut self, key: String, params: &Params, now: Instant) -> Result<Response, Response> {
        enterprise_meta(params)?;
        conflicting_flags(params, &["recurse", "cas"])?;
        let recurse = params.has("recurse");
        if !recurse && key.is_empty() {
            return Err(error(400, "Missing key name"));
        }
        let cas = if params.has("cas") {
            Some(parse_uint(params.get("cas"))?)
        } else {
            None
        };
        forward(params)?;
        let ok = if recurse {
            self.store.delete_tree(&key, now);
            true
        } else {
            self.store.delete(&key, cas, now)
        };
        Ok(json_response(&ok, params.has("pretty")))
    }

    fn read_index(&self, read: &Read) -> u64 {
        match read.kind {
            ReadKind::Single { .. } => self.store.key_index(&read.key),
            ReadKind::Recurse | ReadKind::Keys { .. } => self.store.prefix_index(&read.key),
        }
    }

    fn render(&self, read: &Read) -> Response {
        // `agent/http.go` `setMeta`: the index, the leader's two, the backend.
        let mut headers = vec![("X-Consul-Index", self.read_index(read).to_string())];
        headers.extend(leader_headers());
        headers.push(("X-Consul-Query-Backend", "blocking-query".to_owned()));
        let not_found = |headers| wrapped(404, headers, Vec::new());
        let body = match &read.kind {
            ReadKind::Single { raw } => {
                let Some(e) = self.store.get(&read.key) else {
                    return not_found(headers);
                };
                if *raw {
                    headers.push(("Content-Type", "text/plain".to_owned()));
                    headers.push(("X-Content-Type-Options", "nosniff".to_owned()));
                    headers.push(("Content-Security-Policy", "sandbox".to_owned()));
                    return wrapped(200, headers, e.value.clone());
                }
                json_bytes(&[dir_entry(&read.key, e)], read.pretty)
            }
            ReadKind::Recurse => {
                let entries: Vec<DirEntry> = self
                    .store
                    .list(&read.key)
                    .map(|(k, e)| dir_entry(k, e))
                    .collect();
                if entries.is_empty() {
                    return not_found(headers);
                }
                json_bytes(&entries, read.pretty)
            }
            ReadKind::Keys { separator } => {
                let keys = list_keys(&self.store, &read.key, separator);
                // The root answers `[]`, any other prefix 404 (`KVSGetKeys`).
                if keys.is_empty() && !read.key.is_empty() {
                    return not_found(headers);
                }
                json_bytes(&keys, read.pretty)
            }
        };
        headers.push(("Content-Type", "application/json".to_owned()));
        wrapped(200, headers, body)
    }

    /// consul's `RandomStagger(T/16)`: uniform in [0, T/16), 0 when off.
    fn stagger(&mut self, timeout: Duration) -> Duration {
        let span = (timeout / 16).as_nanos() as u64;
        if !self.jitter || span == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.rng.below(span))
    }
}

/// What the dev KV deliberately does not do, answered in consul's error
/// shape (a status and a plain-text body, as consul's `wrap` writes an
/// error) rather than Go's "404 page not found": ACLs are disabled (consul
/// answers every `/v1/acl/` endpoint so then: `agent/acl_endpoint.go`
/// `ACLDisabled`, 401 "ACL support disabled"), and there are no sessions
/// (500, as an RPC error is, naming what to use instead).
fn not_served(path: &str) -> Option<Response> {
    if path.starts_with("/v1/acl/") {
        return Some(error(401, "ACL support disabled"));
    }
    if path.starts_with("/v1/session/") {
        return Some(error(
            500,
            "Sessions are not supported by the dev KV (gitlab-haproxy-agent -dev): use a consul agent",
        ));
    }
    None
}

/// Go's ServeMux and consul's path filter: the decoded path, cleaned and
/// routed. `Ok` is the key (the decoded path after `/v1/kv/`).
fn route_path(req: &RequestHead) -> Result<String, Response> {
    let Some(decoded) = percent_decode(&req.path) else {
        // Go's server refuses an unparsable request target itself.
        return Err(Response {
            status: 400,
            headers: vec![("Content-Type", TEXT.to_owned())],
            body: b"400 Bad Request".to_vec(),
        });
    };
    let Ok(path) = String::from_utf8(decoded) else {
        return Err(error(400, "Key is not valid UTF-8"));
    };
    // go-cleanhttp's PrintablePathCheckHandler (approximating Go's
    // `unicode.IsPrint`): an empty 400 before any routing.
    if path
        .chars()
        .any(|c| c.is_control() || (c.is_whitespace() && c != ' '))
    {
        return Err(Response {
            status: 400,
            headers: Vec::new(),
            body: Vec::new(),
        });
    }
    let mut clean = clean_path(&path);
    // The pattern `/v1/kv/` also claims `/v1/kv`, by redirect.
    if clean == "/v1/kv" {
        clean.push('/');
    }
    if clean != path {
        // Go's ServeMux answers this itself: outside consul's `wrap`, so
        // none of its headers.
        return Err(go_redirect(req.method, &clean, &req.query));
    }
    match path.strip_prefix("/v1/kv/") {
        Some(key) => Ok(key.to_owned()),
        None => Err(Response {
            status: 404,
            headers: vec![
                ("Content-Type", TEXT.to_owned()),
                ("X-Content-Type-Options", "nosniff".to_owned()),
            ],
            body: b"404 page not found\n".to_vec(),
        }),
    }
}

/// consul's `RPCQueryTimeout`: 0 (or absent) means the default, and the
/// cap applies.
fn clamp_wait(wait: Option<Duration>) -> Duration {
    match wait {
        None => DEFAULT_QUERY_TIME,
        Some(d) if d.is_zero() => DEFAULT_QUERY_TIME,
        Some(d) => d.min(MAX_QUERY_TIME),
    }
}

/// CE's `parseEntMeta`: a namespace or partition is an Enterprise feature.
fn enterprise_meta(params: &Params) -> Result<(), Response> {
    if !params.get("ns").is_empty() {
        return Err(error(
            400,
            "Invalid query parameter: \"ns\" - Namespaces are a Consul Enterprise feature",
        ));
    }
    if !params.get("partition").is_empty() {
        return Err(error(
            400,
            "Invalid query parameter: \"partition\" - Partitions are a Consul Enterprise feature",
        ));
    }
    Ok(())
}

/// consul's `conflictingFlags`: at most one of `flags` may be present.
fn conflicting_flags(params: &Params, flags: &[&str]) -> Result<(), Response> {
    if flags.iter().filter(|f| params.has(f)).count() > 1 {
        return Err(error(
            400,
            &format!("Conflicting flags: {}", go_encode_query(&params.0)),
        ));
    }
    Ok(())
}

/// `strconv.ParseUint(s, 10, 64)` as an error response: consul returns
/// the Go error itself, hence a 500 with its text.
fn parse_uint(s: &str) -> Result<u64, Response> {
    crate::decimal::parse_uint(s.as_bytes()).map_err(|why| {
        error(
            500,
            &format!("strconv.ParseUint: parsing {}: {why}", go_quote(s)),
        )
    })
}

/// consul's `kvsListKeysTxn`: keys under `prefix`, each cut after the first
/// `separator` past the prefix, duplicates of the previous key dropped.
fn list_keys(store: &Store, prefix: &str, separator: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for (k, _) in store.list(prefix) {
        let key = match (separator.is_empty(), k[prefix.len()..].find(separator)) {
            (false, Some(at)) => &k[..prefix.len() + at + separator.len()],
            _ => k,
        };
        if keys.last().map(String::as_str) != Some(key) {
            keys.push(key.to_owned());
        }
    }
    keys
}

/// A 200 JSON answer to a write (no index header on writes).
fn json_response<T: Serialize>(v: &T, pretty: bool) -> Response {
    wrapped(
        200,
        vec![("Content-Type", "application/json".to_owned())],
        json_bytes(v, pretty),
    )
}

/// consul's gzip handler: a body of at least [`GZIP_MIN_SIZE`] bytes to a
/// request that accepts gzip goes gzipped (then framed like any body:
/// `Content-Length` up to 2 KiB, else chunked).
fn encode(mut resp: Response, gzip_ok: bool) -> Response {
    if !gzip_ok
        || resp.body.len() < GZIP_MIN_SIZE
        || resp.headers.iter().any(|(n, _)| *n == "Content-Encoding")
    {
        return resp;
    }
    resp.body = gzip(&resp.body);
    resp.headers.push(("Content-Encoding", "gzip".to_owned()));
    sort_headers(&mut resp.headers);
    resp
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::http::Framing;

    /// A request head for `target` (`path?query`).
    pub(in crate::devkv) fn req(method: &str, target: &str) -> RequestHead {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let m = Method::from_name(method);
        RequestHead {
            method: m,
            method_name: method.to_owned(),
            path: path.to_owned(),
            query: query.to_owned(),
            framing: Framing::Length(0),
            keep_alive: true,
            headers: Vec::new(),
        }
    }

    /// A small script harness: a clock and the KV.
    struct T {
        kv: DevKv,
        now: Instant,
    }

    impl T {
        fn new() -> T {
            T {
                kv: DevKv::new(false),
                now: Instant::now(),
            }
        }

        fn send(&mut self, method: &str, target: &str, body: &[u8]) -> Handled {
            self.kv.handle(&req(method, target), body, self.now)
        }

        fn call(&mut self, method: &str, target: &str, body: &[u8]) -> Response {
            match self.send(method, target, body) {
                Handled::Respond(r) => r,
                Handled::Wait(w) => panic!("{method} {target} blocked: {w:?}"),
            }
        }

        fn get(&mut self, target: &str) -> Response {
            self.call("GET", target, b"")
        }

        fn put(&mut self, target: &str, body: &[u8]) -> Response {
            self.call("PUT", target, body)
        }

        fn wait(&mut self, target: &str) -> Wait {
            match self.send("GET", target, b"") {
                Handled::Wait(w) => w,
                Handled::Respond(r) => panic!("GET {target} answered at once: {}", r.status),
            }
        }
    }

    fn header<'a>(r: &'a Response, name: &str) -> Option<&'a str> {
        r.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn index(r: &Response) -> u64 {
        header(r, "X-Consul-Index")
            .expect("X-Consul-Index")
            .parse()
            .unwrap()
    }

    fn body(r: &Response) -> &str {
        std::str::from_utf8(&r.body).unwrap()
    }

    fn json(r: &Response) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    /// A GET with `Accept-Encoding: gzip`.
    fn gzip_get(t: &mut T, target: &str) -> Handled {
        let mut r = req("GET", target);
        r.headers
            .push(("accept-encoding".to_owned(), b"deflate, gzip".to_vec()));
        t.kv.handle(&r, b"", t.now)
    }

    fn inflated(r: &Response) -> Vec<u8> {
        let mut inf = crate::http::Inflater::new(1 << 24);
        let mut out = Vec::new();
        assert_eq!(inf.feed(&r.body, &mut out, 1 << 24), Ok(r.body.len()));
        inf.finish().unwrap();
        out
    }

    #[test]
    fn gzip_when_asked_like_consuls_handler_from_1400_bytes() {
        let mut t = T::new();
        for i in 0..40 {
            t.put(&format!("/v1/kv/app/srv{i}"), b"drain");
        }
        let plain = t.get("/v1/kv/app/?recurse");
        assert!(plain.body.len() >= GZIP_MIN_SIZE, "{}", plain.body.len());
        assert_eq!(header(&plain, "Content-Encoding"), None);
        let Handled::Respond(z) = gzip_get(&mut t, "/v1/kv/app/?recurse&stale") else {
            panic!("blocked");
        };
        assert_eq!(header(&z, "Content-Encoding"), Some("gzip"));
        assert_eq!(header(&z, "Vary"), Some("Accept-Encoding"));
        assert_eq!(header(&z, "X-Consul-Lastcontact"), Some("0"));
        assert_eq!(header(&z, "X-Consul-Knownleader"), Some("true"));
        assert!(z.body.len() * 4 < plain.body.len());
        assert_eq!(inflated(&z), plain.body);
        // Headers stay in Go's (sorted) order.
        let names: Vec<&str> = z.headers.iter().map(|(n, _)| *n).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        // Small bodies (and 404s) go as they are, asked or not.
        let Handled::Respond(small) = gzip_get(&mut t, "/v1/kv/app/srv1") else {
            panic!("blocked");
        };
        assert_eq!(header(&small, "Content-Encoding"), None);
        let Handled::Respond(missing) = gzip_get(&mut t, "/v1/kv/none/?recurse") else {
            panic!("blocked");
        };
        assert_eq!(
            (missing.status, header(&missing, "Content-Encoding")),
            (404, None)
        );
    }

    #[test]
    fn a_parked_query_is_answered_gzipped_if_it_asked_and_each_answer_is_rendered_once() {
        let mut t = T::new();
        for i in 0..40 {
            t.put(&format!("/v1/kv/app/srv{i}"), b"maint");
        }
        let at = index(&t.get("/v1/kv/app/?recurse"));
        let target = format!("/v1/kv/app/?recurse&index={at}&wait=1m&stale");
        let Handled::Wait(zipped) = gzip_get(&mut t, &target) else {
            panic!("answered at once");
        };
        let plain = t.wait(&target);
        t.put("/v1/kv/app/srv1", b"drain");
        assert!(t.kv.is_ready(&zipped) && t.kv.is_ready(&plain));
        let z = t.kv.answer(&zipped);
        let p = t.kv.answer(&plain);
        assert_eq!(header(&z, "Content-Encoding"), Some("gzip"));
        assert_eq!(header(&p, "Content-Encoding"), None);
        assert_eq!(inflated(&z), p.body);
        assert_eq!(t.kv.answer(&zipped), z, "the same answer again");
        assert!(t.kv.rendered.is_some());
        t.kv.forget_rendered();
        assert!(t.kv.rendered.is_none(), "no copy kept between batches");
        // A write renders anew.
        t.put("/v1/kv/app/srv2", b"drain");
        assert_ne!(inflated(&t.kv.answer(&zipped)), p.body);
    }

    #[test]
    fn status_leader_answers_like_an_elected_dev_agent() {
        let mut t = T::new();
        let r = t.get("/v1/status/leader");
        assert_eq!((r.status, body(&r)), (200, "\"127.0.0.1:8300\""));
        assert_eq!(t.get("/v1/status/peers").status, 404);
    }

    #[test]
    fn empty_prefix_is_404_with_empty_body_and_meta() {
        let mut t = T::new();
        for target in ["/v1/kv/app/?recurse", "/v1/kv/?recurse", "/v1/kv/missing"] {
            let r = t.get(target);
            assert_eq!(r.status, 404, "{target}");
            assert!(r.body.is_empty());
            assert_eq!(index(&r), 1, "index never below 1");
            assert_eq!(header(&r, "X-Consul-Knownleader"), Some("true"));
            assert_eq!(header(&r, "X-Consul-Lastcontact"), Some("0"));
            assert_eq!(header(&r, "X-Consul-Default-Acl-Policy"), Some("allow"));
            assert_eq!(header(&r, "X-Consul-Query-Backend"), Some("blocking-query"));
            assert_eq!(header(&r, "Vary"), Some("Accept-Encoding"));
            assert_eq!(header(&r, "Content-Type"), None);
        }
    }

    #[test]
    fn recurse_shape_and_null_value() {
        let mut t = T::new();
        assert_eq!(body(&t.put("/v1/kv/a/b", b"bar")), "true");
        t.put("/v1/kv/a/", b"");
        let r = t.get("/v1/kv/a?recurse");
        assert_eq!(r.status, 200);
        assert_eq!(header(&r, "Content-Type"), Some("application/json"));
        let b = t.kv.store().get("a/b").unwrap().clone();
        let f = t.kv.store().get("a/").unwrap().clone();
        let expect = format!(
            "[{{\"LockIndex\":0,\"Key\":\"a/\",\"Flags\":0,\"Value\":null,\"CreateIndex\":{fc},\"ModifyIndex\":{fc}}},\
             {{\"LockIndex\":0,\"Key\":\"a/b\",\"Flags\":0,\"Value\":\"YmFy\",\"CreateIndex\":{bc},\"ModifyIndex\":{bc}}}]",
            fc = f.create_index,
            bc = b.create_index
        );
        assert_eq!(body(&r), expect);
        assert_eq!(index(&r), f.modify_index);
    }

    #[test]
    fn recurse_is_byte_prefix_sorted_bytewise() {
        let mut t = T::new();
        for k in ["foo/bar", "food", "foo", "fo", "foo-x"] {
            t.put(&format!("/v1/kv/{k}"), b"1");
        }
        let keys: Vec<String> = json(&t.get("/v1/kv/foo?recurse"))
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["Key"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(keys, ["foo", "foo-x", "foo/bar", "food"]);
    }

    #[test]
    fn single_key_and_raw() {
        let mut t = T::new();
        t.put("/v1/kv/k?flags=42", b"<v&>");
        let r = t.get("/v1/kv/k");
        let v = json(&r);
        assert_eq!(v.as_array().unwrap().len(), 1);
        assert_eq!(v[0]["Flags"], 42);
        assert_eq!(v[0]["Value"], "PHYmPg==");
        let r = t.get("/v1/kv/k?raw");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"<v&>");
        assert_eq!(header(&r, "Content-Type"), Some("text/plain"));
        assert_eq!(header(&r, "X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(index(&r), t.kv.store().get("k").unwrap().modify_index);
        assert_eq!(t.get("/v1/kv/nope?raw").status, 404);
    }

    #[test]
    fn keys_and_separator() {
        let mut t = T::new();
        let r = t.get("/v1/kv/?keys");
        assert_eq!(
            (r.status, body(&r)),
            (200, "[]"),
            "root answers [] when empty"
        );
        assert_eq!(t.get("/v1/kv/web/?keys").status, 404);
        for k in ["web/bar", "web/subdir/a", "web/subdir/b", "web/zz"] {
            t.put(&format!("/v1/kv/{k}"), b"1");
        }
        assert_eq!(
            body(&t.get("/v1/kv/web/?keys&separator=/")),
            r#"["web/bar","web/subdir/","web/zz"]"#
        );
        assert_eq!(
            body(&t.get("/v1/kv/web/?keys")),
            r#"["web/bar","web/subdir/a","web/subdir/b","web/zz"]"#
        );
        assert_eq!(
            body(&t.get("/v1/kv/web/?keys&seperator=/")),
            r#"["web/bar","web/subdir/","web/zz"]"#
        );
    }

    #[test]
    fn identical_put_does_not_bump_index_or_generation() {
        let mut t = T::new();
        t.put("/v1/kv/k?flags=1", b"v");
        let (i, g) = (index(&t.get("/v1/kv/?recurse")), t.kv.generation());
        assert_eq!(body(&t.put("/v1/kv/k?flags=1", b"v")), "true");
        assert_eq!(index(&t.get("/v1/kv/?recurse")), i);
        assert_eq!(t.kv.generation(), g);
    }

    #[test]
    fn flags_reset_when_absent() {
        let mut t = T::new();
        t.put("/v1/kv/k?flags=18446744073709551615", b"v");
        assert_eq!(t.kv.store().get("k").unwrap().flags, u64::MAX);
        assert_eq!(body(&t.get("/v1/kv/k")), body(&t.get("/v1/kv/k")));
        assert!(body(&t.get("/v1/kv/k")).contains("\"Flags\":18446744073709551615"));
        t.put("/v1/kv/k", b"v");
        assert_eq!(t.kv.store().get("k").unwrap().flags, 0);
        let r = t.put("/v1/kv/k?flags=x", b"v");
        assert_eq!(
            (r.status, body(&r)),
            (500, "strconv.ParseUint: parsing \"x\": invalid syntax")
        );
    }

    #[test]
    fn delete_wakes_prefix_waiter_via_tombstone() {
        let mut t = T::new();
        t.put("/v1/kv/app/a", b"1");
        t.put("/v1/kv/app/b", b"2");
        let i = index(&t.get("/v1/kv/app/?recurse"));
        let w = t.wait(&format!("/v1/kv/app/?recurse&index={i}"));
        assert!(!t.kv.is_ready(&w));
        let g = t.kv.generation();
        assert_eq!(body(&t.call("DELETE", "/v1/kv/app/b", b"")), "true");
        assert!(t.kv.generation() > g);
        assert!(t.kv.is_ready(&w));
        let r = t.kv.answer(&w);
        assert_eq!(r.status, 200);
        assert!(index(&r) > i, "index rises after a delete");
        assert_eq!(json(&r).as_array().unwrap().len(), 1);
    }

    #[test]
    fn recurse_delete_wakes_with_404_and_higher_index() {
        let mut t = T::new();
        t.put("/v1/kv/app/a", b"1");
        t.put("/v1/kv/app/b/c", b"1");
        t.put("/v1/kv/zzz", b"1");
        let i = index(&t.get("/v1/kv/app/?recurse"));
        let w = t.wait(&format!("/v1/kv/app/?recurse&index={i}"));
        assert_eq!(body(&t.call("DELETE", "/v1/kv/app/?recurse", b"")), "true");
        assert!(t.kv.is_ready(&w));
        let r = t.kv.answer(&w);
        assert_eq!(r.status, 404);
        assert!(index(&r) > i);
        assert_eq!(t.get("/v1/kv/?recurse").status, 200, "zzz survives");
        // Deleting the whole store needs recurse; a plain empty key is refused.
        let r = t.call("DELETE", "/v1/kv/", b"");
        assert_eq!((r.status, body(&r)), (400, "Missing key name"));
    }

    #[test]
    fn tombstone_expiry_makes_index_go_backwards() {
        let mut t = T::new();
        t.kv.set_tombstone_ttl(Duration::from_secs(900));
        t.put("/v1/kv/app/a", b"1");
        t.put("/v1/kv/app/b", b"1");
        t.call("DELETE", "/v1/kv/app/b", b"");
        let high = index(&t.get("/v1/kv/app/?recurse"));
        let g = t.kv.generation();
        t.now += Duration::from_secs(899);
        assert_eq!(index(&t.get("/v1/kv/app/?recurse")), high);
        t.now += Duration::from_secs(1);
        let low = index(&t.get("/v1/kv/app/?recurse"));
        assert!(low < high, "consul #5498: {low} < {high}");
        assert_eq!(low, t.kv.store().get("app/a").unwrap().modify_index);
        assert_eq!(t.kv.generation(), g, "a reap wakes nobody");
    }

    #[test]
    fn blocking_query_waits_for_a_write_under_the_prefix() {
        let mut t = T::new();
        t.put("/v1/kv/app/a", b"1");
        t.put("/v1/kv/other", b"1");
        let i = index(&t.get("/v1/kv/app/?recurse"));
        let w = t.wait(&format!("/v1/kv/app/?recurse&index={i}&wait=10s"));
        assert_eq!(
            w.deadline,
            t.now + Duration::from_secs(10),
            "no jitter when off"
        );
        t.put("/v1/kv/other", b"2");
        t.put("/v1/kv/app", b"not under app/");
        assert!(
            !t.kv.is_ready(&w),
            "writes outside an existing prefix do not wake it"
        );
        // Timed out: the same data and index, a normal 200.
        let r = t.kv.answer(&w);
        assert_eq!((r.status, index(&r)), (200, i));
        t.put("/v1/kv/app/b", b"1");
        assert!(t.kv.is_ready(&w));
        let r = t.kv.answer(&w);
        assert!(index(&r) > i);
        assert_eq!(json(&r).as_array().unwrap().len(), 2);
    }

    #[test]
    fn index_zero_absent_or_behind_answers_at_once() {
        let mut t = T::new();
        t.put("/v1/kv/app/a", b"1");
        let i = index(&t.get("/v1/kv/app/?recurse"));
        assert!(matches!(
            t.send("GET", "/v1/kv/app/?recurse&index=0&wait=1s", b""),
            Handled::Respond(_)
        ));
        assert!(matches!(
            t.send("GET", "/v1/kv/app/?recurse&wait=1s", b""),
            Handled::Respond(_)
        ));
        assert!(matches!(
            t.send("GET", &format!("/v1/kv/app/?recurse&index={}", i - 1), b""),
            Handled::Respond(_)
        ));
        // Blocking also applies past the current index.
        t.wait(&format!("/v1/kv/app/?recurse&index={}", i + 100));
    }

    #[test]
    fn missing_prefix_waiter_wakes_on_any_write() {
        // Its index is the whole-table index (consul's #3712 pattern).
        let mut t = T::new();
        t.put("/v1/kv/x", b"1");
        let i = index(&t.get("/v1/kv/nothing/?recurse"));
        let w = t.wait(&format!("/v1/kv/nothing/?recurse&index={i}"));
        t.put("/v1/kv/y", b"1");
        assert!(t.kv.is_ready(&w));
        let r = t.kv.answer(&w);
        assert_eq!(r.status, 404);
        assert!(index(&r) > i);
    }

    #[test]
    fn single_key_waiter_ignores_other_keys() {
        let mut t = T::new();
        t.put("/v1/kv/k", b"1");
        let i = index(&t.get("/v1/kv/k"));
        let w = t.wait(&format!("/v1/kv/k?index={i}"));
        t.put("/v1/kv/k2", b"1");
        assert!(!t.kv.is_ready(&w));
        t.put("/v1/kv/k", b"2");
        assert!(t.kv.is_ready(&w));
        assert_eq!(json(&t.kv.answer(&w))[0]["Value"], "Mg==");
    }

    #[test]
    fn wait_is_clamped() {
        let mut t = T::new();
        let cases = [
            ("0s", 300),
            ("0", 300),
            ("-5s", 300),
            ("", 300),
            ("20m", 600),
            ("1m30s", 90),
            ("1.5h", 600),
        ];
        for (wait, secs) in cases {
            let w = t.wait(&format!("/v1/kv/k?index=5&wait={wait}"));
            assert_eq!(w.deadline - t.now, Duration::from_secs(secs), "wait={wait}");
            assert_eq!(w.index(), 5);
        }
        let w = t.wait("/v1/kv/k?index=5&wait=250ms");
        assert_eq!(w.deadline - t.now, Duration::from_millis(250));
    }

    #[test]
    fn jitter_is_in_zero_to_a_sixteenth() {
        let mut t = T::new();
        t.kv = DevKv::new(true);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let w = t.wait("/v1/kv/k?index=5&wait=160s");
            let extra = w.deadline - t.now - Duration::from_secs(160);
            assert!(extra < Duration::from_secs(10), "{extra:?}");
            seen.insert(extra.as_secs());
        }
        assert!(seen.len() >= 8, "spread over [0, 10s): {seen:?}");
        let w = t.wait("/v1/kv/k?index=5&wait=20m");
        assert!(w.deadline - t.now < Duration::from_millis(637_500));
        assert!(w.deadline - t.now >= Duration::from_secs(600));
    }

    #[test]
    fn bad_wait_index_and_consistency() {
        let mut t = T::new();
        let cases = [
            ("/v1/kv/k?wait=10", "Invalid wait time"),
            ("/v1/kv/k?wait=5x", "Invalid wait time"),
            ("/v1/kv/k?index=abc", "Invalid index"),
            ("/v1/kv/k?index=-1", "Invalid index"),
            ("/v1/kv/k?index=+1", "Invalid index"),
            (
                "/v1/kv/k?stale&consistent",
                "Cannot specify ?stale with ?consistent, conflicting semantics.",
            ),
            (
                "/v1/kv/k?max_stale=5s&consistent",
                "Cannot specify ?stale with ?consistent, conflicting semantics.",
            ),
            ("/v1/kv/k?max_stale=x", "Invalid max_stale value \"x\""),
            ("/v1/kv/", "Missing key name"),
            (
                "/v1/kv/k?ns=team",
                "Invalid query parameter: \"ns\" - Namespaces are a Consul Enterprise feature",
            ),
        ];
        for (target, text) in cases {
            let r = t.get(target);
            assert_eq!((r.status, body(&r)), (400, text), "{target}");
        }
        // `wait` is checked before `index`; both apply to writes as well.
        assert_eq!(body(&t.get("/v1/kv/k?index=x&wait=y")), "Invalid wait time");
        assert_eq!(body(&t.put("/v1/kv/k?index=x", b"")), "Invalid index");
        // Flags by presence: `?stale=false` is still stale.
        assert_eq!(t.get("/v1/kv/k?stale=false&consistent=").status, 400);
        assert_eq!(t.get("/v1/kv/k?dc=dc2").status, 500);
        assert_eq!(t.get("/v1/kv/k?dc=dc1").status, 404);
    }

    /// `?dc=` naming another datacenter: every KV handler makes its RPC
    /// (`KVS.Get`, `KVS.List`, `KVS.ListKeys`, `KVS.Apply`) after its own
    /// checks, and the RPC has no route (`agent/consul/rpc.go` `forwardDC`,
    /// `structs.ErrNoDCPath`): 500 "No path to datacenter", nothing
    /// written, nothing parked.
    #[test]
    fn another_datacenter_is_500_no_path_after_the_handlers_own_checks() {
        let mut t = T::new();
        t.put("/v1/kv/k", b"drain");
        let g = t.kv.generation();
        let i = index(&t.get("/v1/kv/k"));
        let no_path = [
            ("GET", "/v1/kv/k?dc=dc2".to_owned()),
            ("GET", "/v1/kv/?recurse&dc=dc2".to_owned()),
            ("GET", "/v1/kv/?keys&dc=dc2".to_owned()),
            ("GET", format!("/v1/kv/k?dc=dc2&index={i}")),
            ("PUT", "/v1/kv/k?dc=dc2".to_owned()),
            ("PUT", "/v1/kv/k?dc=dc2&acquire=s".to_owned()),
            ("DELETE", "/v1/kv/k?dc=dc2".to_owned()),
            ("DELETE", "/v1/kv/?recurse&dc=dc2".to_owned()),
        ];
        for (method, target) in no_path {
            let r = t.call(method, &target, b"maint");
            assert_eq!(
                (r.status, body(&r)),
                (500, "No path to datacenter"),
                "{method} {target}"
            );
        }
        assert_eq!(t.kv.generation(), g, "nothing written");
        assert_eq!(t.kv.store().get("k").unwrap().value, b"drain");
        // The handler's own checks come first.
        let first = [
            ("GET", "/v1/kv/k?dc=dc2&index=x", 400, "Invalid index"),
            ("GET", "/v1/kv/?dc=dc2", 400, "Missing key name"),
            (
                "PUT",
                "/v1/kv/k?dc=dc2&flags=x",
                500,
                "strconv.ParseUint: parsing \"x\": invalid syntax",
            ),
            (
                "DELETE",
                "/v1/kv/k?dc=dc2&cas=1&recurse",
                400,
                "Conflicting flags: cas=1&dc=dc2&recurse=",
            ),
        ];
        for (method, target, status, text) in first {
            let r = t.call(method, target, b"");
            assert_eq!((r.status, body(&r)), (status, text), "{method} {target}");
        }
        assert_eq!(
            t.put("/v1/kv/k?dc=dc1", b"maint").status,
            200,
            "its own datacenter"
        );
    }

    /// `/v1/txn` is PUT only (consul's `Txn` handler), its body handed to
    /// the txn module with the query.
    #[test]
    fn txn_routes_put_with_its_query_and_refuses_other_methods() {
        let mut t = T::new();
        let ops = br#"[{"KV":{"Verb":"set","Key":"k","Value":"ZHJhaW4="}}]"#;
        let r = t.put("/v1/txn?dc=dc2", ops);
        assert_eq!((r.status, body(&r)), (500, "No path to datacenter"));
        assert_eq!(t.put("/v1/txn", ops).status, 200);
        assert_eq!(t.kv.store().get("k").unwrap().value, b"drain");
        let r = t.get("/v1/txn");
        assert_eq!(
            (r.status, body(&r), header(&r, "Allow")),
            (405, "method GET not allowed", Some("OPTIONS,PUT"))
        );
        let r = t.call("OPTIONS", "/v1/txn", b"");
        assert_eq!((r.status, header(&r, "Allow")), (200, Some("OPTIONS,PUT")));
    }

    #[test]
    fn put_cas() {
        let mut t = T::new();
        assert_eq!(body(&t.put("/v1/kv/k?cas=0", b"1")), "true");
        assert_eq!(body(&t.put("/v1/kv/k?cas=0", b"2")), "false");
        let m = t.kv.store().get("k").unwrap().modify_index;
        let r = t.put(&format!("/v1/kv/k?cas={}", m + 1), b"2");
        assert_eq!((r.status, body(&r)), (200, "false"));
        assert_eq!(header(&r, "X-Consul-Index"), None, "no index on writes");
        assert_eq!(t.kv.store().get("k").unwrap().value, b"1");
        assert_eq!(body(&t.put(&format!("/v1/kv/k?cas={m}"), b"2")), "true");
        assert_eq!(t.kv.store().get("k").unwrap().value, b"2");
        assert_eq!(body(&t.put("/v1/kv/new?cas=7", b"x")), "false");
        let r = t.put("/v1/kv/k?cas=1&acquire=s", b"");
        assert_eq!(
            (r.status, body(&r)),
            (400, "Conflicting flags: acquire=s&cas=1")
        );
    }

    #[test]
    fn delete_cas() {
        let mut t = T::new();
        assert_eq!(
            body(&t.call("DELETE", "/v1/kv/k?cas=9", b"")),
            "true",
            "absent: true"
        );
        t.put("/v1/kv/k", b"1");
        let m = t.kv.store().get("k").unwrap().modify_index;
        assert_eq!(
            body(&t.call("DELETE", "/v1/kv/k?cas=0", b"")),
            "false",
            "cas=0 never deletes"
        );
        assert_eq!(
            body(&t.call("DELETE", &format!("/v1/kv/k?cas={}", m + 1), b"")),
            "false"
        );
        assert!(t.kv.store().get("k").is_some());
        assert_eq!(
            body(&t.call("DELETE", &format!("/v1/kv/k?cas={m}"), b"")),
            "true"
        );
        assert!(t.kv.store().get("k").is_none());
        let r = t.call("DELETE", "/v1/kv/k?cas=1&recurse", b"");
        assert_eq!(
            (r.status, body(&r)),
            (400, "Conflicting flags: cas=1&recurse=")
        );
    }

    #[test]
    fn methods() {
        let mut t = T::new();
        let r = t.call("OPTIONS", "/v1/kv/k", b"");
        assert_eq!(
            (r.status, header(&r, "Allow")),
            (200, Some("OPTIONS,GET,PUT,DELETE"))
        );
        assert!(r.body.is_empty());
        for m in ["POST", "PATCH", "HEAD"] {
            let r = t.call(m, "/v1/kv/k", b"");
            assert_eq!(r.status, 405, "{m}");
            assert_eq!(body(&r), format!("method {m} not allowed"));
            assert_eq!(header(&r, "Allow"), Some("OPTIONS,GET,PUT,DELETE"));
        }
    }

    #[test]
    fn unclean_paths_redirect() {
        let mut t = T::new();
        let cases = [
            ("/v1/kv//foo", "/v1/kv/foo"),
            ("/v1/kv/a/./b", "/v1/kv/a/b"),
            ("/v1/kv/a/../b?recurse", "/v1/kv/b?recurse"),
            ("/v1/kv/a%2F%2Fb", "/v1/kv/a/b"),
            ("/v1/kv", "/v1/kv/"),
            ("/v1/kv/dir/", "-"),
        ];
        for (target, location) in cases {
            let r = t.get(target);
            if location == "-" {
                assert_eq!(r.status, 404, "{target}");
                continue;
            }
            assert_eq!(r.status, 301, "{target}");
            assert_eq!(header(&r, "Location"), Some(location), "{target}");
        }
        let r = t.put("/v1/kv//foo", b"x");
        assert_eq!(r.status, 301);
        assert!(t.kv.store().get("foo").is_none() && t.kv.store().get("/foo").is_none());
    }

    #[test]
    fn percent_decoded_keys() {
        let mut t = T::new();
        t.put("/v1/kv/a%2Fb%20c", b"1");
        assert!(t.kv.store().get("a/b c").is_some());
        assert_eq!(t.get("/v1/kv/a/b%20c").status, 200);
        assert_eq!(t.get("/v1/kv/%FF").status, 400, "not UTF-8");
        assert_eq!(t.get("/v1/kv/%0A").status, 400, "unprintable");
        assert_eq!(t.get("/v1/kv/%zz").status, 400);
        assert_eq!(t.get("/v1/agent/self").status, 404);
    }

    /// A value over `kv_max_value_size` (512 KiB) is 413:
    /// `agent/kvs_endpoint.go` `KVSPut` checks the Content-Length against
    /// `KVMaxValueSize` before reading the body.
    #[test]
    fn too_large_value_is_413() {
        let mut t = T::new();
        assert_eq!(
            body(&t.put("/v1/kv/k", &vec![b'x'; MAX_VALUE_SIZE])),
            "true"
        );
        let r = t.put("/v1/kv/k", &vec![b'y'; MAX_VALUE_SIZE + 1]);
        assert_eq!(r.status, 413);
        assert!(
            body(&r)
                .starts_with("Request body(524289 bytes) too large, max size: 524288 bytes. See "),
            "{}",
            body(&r)
        );
        assert_eq!(t.kv.store().get("k").unwrap().value[0], b'x');
    }

    #[test]
    fn json_escaping_and_pretty() {
        let mut t = T::new();
        t.put("/v1/kv/a%3Cb%3E%26%22", b"");
        let r = t.get("/v1/kv/a?recurse");
        assert!(
            body(&r).contains(r#""Key":"a\u003cb\u003e\u0026\"""#),
            "{}",
            body(&r)
        );
        assert_eq!(json(&r)[0]["Key"], "a<b>&\"");
        let r = t.get("/v1/kv/a?recurse&pretty");
        assert!(
            body(&r).starts_with("[\n    {\n        \"LockIndex\": 0,"),
            "{}",
            body(&r)
        );
        assert!(body(&r).ends_with("}\n]\n"));
        assert_eq!(body(&t.put("/v1/kv/k?pretty", b"")), "true\n");
    }

    /// The dev KV has no ACLs and no sessions: a client asking gets
    /// consul's error shape (`agent/acl_endpoint.go` `ACLDisabled`: 401
    /// "ACL support disabled"; a plain-text 500 for sessions), not Go's 404
    /// page nor a hang.
    #[test]
    fn acl_and_session_endpoints_answer_in_consuls_error_shape() {
        let mut t = T::new();
        let r = t.call("PUT", "/v1/acl/policy", b"{}");
        assert_eq!((r.status, body(&r)), (401, "ACL support disabled"));
        let r = t.call("GET", "/v1/acl/token/self", b"");
        assert_eq!(r.status, 401);
        let r = t.call("PUT", "/v1/session/create", b"{}");
        assert_eq!(r.status, 500);
        assert!(
            body(&r).starts_with("Sessions are not supported by the dev KV"),
            "{}",
            body(&r)
        );
        assert_eq!(
            header(&r, "content-type"),
            Some("text/plain; charset=utf-8")
        );
    }
}
