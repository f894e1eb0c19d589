//! The watch logic of the consul client, pure: which index to
//! ask for, when the next request may start, and what one response means.
//!
//! In: the outcome of each request (a response head and body, or an error)
//! and the time. Out: the next request's index and start time, and either a
//! new [`Snapshot`] to swap in, "no change", "too stale", or an error
//! reason.
//!
//! Always holds:
//! - requests start at least [`MIN_GAP`] apart and no faster than the token
//!   bucket allows;
//! - after any error the next read is non-blocking (index 0) and swaps in
//!   what it reads;
//! - an index that goes backwards resets to 0;
//! - an equal index on a blocking read never swaps;
//! - errors back off 250 ms doubling to 30 s with jitter (the first retry
//!   anywhere in its 250 ms, so a fleet dropped at once reconnects spread
//!   out), reset on success;
//! - with `-consul-max-stale` set, requests carry `stale` and wait at most
//!   [`STALE_WAIT_CAP`], and an answer whose `X-Consul-LastContact` is past
//!   the bound (or missing), or whose index is below the state applied (a
//!   follower behind), is never applied and never moves the index: the next
//!   request, at once, goes without `stale` (to the leader).

use std::time::{Duration, Instant};

use crate::consul::error::{ErrorReason, Failure};
use crate::http::ResponseHead;
use crate::jitter::Jitter;
use crate::kv::{DecodeError, KvPair, ListDecoder};
use crate::slice::Slice;
use crate::state::{Snapshot, SnapshotBuilder};

/// Never two requests closer than this.
pub const MIN_GAP: Duration = Duration::from_millis(100);
/// Token bucket: up to this many requests in a burst ...
const BUCKET_BURST: f64 = 5.0;
/// ... refilled at this many per second, so a churning KV degrades to
/// polling once a second instead of spinning.
const BUCKET_REFILL_PER_S: f64 = 1.0;
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// The longest `wait` of a `stale` blocking request: a follower that loses
/// the leader during the hold stops replicating and answers only when the
/// wait ends, so a 5 m wait would hide writes for minutes.
pub const STALE_WAIT_CAP: Duration = Duration::from_secs(30);
/// Configuration errors (a redirect, 400, 403: bad token, bad namespace):
/// retried, but no faster than this.
pub const CONFIG_ERROR_DELAY: Duration = Duration::from_secs(10);

/// What one response means for the state.
#[derive(Debug)]
pub enum Update {
    /// A higher index, or any non-blocking read (the first, or one after an
    /// error or a reset): swap this snapshot in.
    Swap(Snapshot),
    /// Same index (a blocking-query timeout or a wake without change).
    Unchanged,
    /// The index went backwards: nothing swapped, the next read is index 0.
    Reset {
        from: u64,
        to: u64,
    },
    /// A `stale` answer from a server out of touch with the leader for
    /// longer than `-consul-max-stale` (`None`: it did not say), or behind
    /// the state applied (its index is lower: applying it would step the
    /// state backwards): discarded, asked again at once without `stale`.
    TooStale {
        last_contact: Option<Duration>,
    },
    Failed(Failure),
}

/// What a complete response leads to.
#[derive(Debug)]
pub enum Response {
    Done(Update),
    /// A large listing: call [`Decoding::step`] once per loop turn, then
    /// [`Watch::on_decoded`]; no request starts meanwhile.
    Decode(Decoding),
}

/// A listing being decoded, a slice at a time.
#[derive(Debug)]
pub struct Decoding {
    index: u64,
    decoder: ListDecoder,
    builder: SnapshotBuilder,
    pairs: Vec<KvPair>,
    body: Vec<u8>,
}

impl Decoding {
    /// Decodes until the slice is spent; `Some` once finished.
    pub fn step(&mut self, slice: &mut Slice) -> Option<Result<Snapshot, DecodeError>> {
        self.pairs.clear();
        let done = match self.decoder.step(&self.body, slice, &mut self.pairs) {
            Ok(done) => done,
            Err(e) => return Some(Err(e)),
        };
        for pair in self.pairs.drain(..) {
            self.builder.add(pair);
        }
        if !done {
            return None;
        }
        let builder = std::mem::replace(&mut self.builder, SnapshotBuilder::new("", self.index, 0));
        Some(Ok(builder.finish()))
    }
}

/// The index rules, rate limit and backoff of one prefix watch.
#[derive(Debug)]
pub struct Watch {
    prefix: String,
    /// The index of the state we hold (0: none, or reset).
    index: u64,
    /// Ask with index 0 next (after an error or a reset).
    nonblocking_next: bool,
    last_start: Option<Instant>,
    tokens: f64,
    tokens_at: Option<Instant>,
    failures: u32,
    not_before: Option<Instant>,
    rng: Jitter,
    /// Entries in the last listing decoded (to size the next one).
    last_entries: usize,
    /// `-consul-max-stale` (`None`: off, the leader answers).
    max_stale: Option<Duration>,
    /// Never shown in an error body ([`crate::safe::error_body`]).
    secrets: Vec<Vec<u8>>,
    /// The request in flight carries `stale`.
    asked_stale: bool,
    /// The last answer was too stale: ask the leader next.
    consistent_next: bool,
    /// Answers discarded as too stale and asked again.
    stale_reasks: u64,
}

impl Watch {
    /// `prefix` without leading/trailing `/`; `seed` feeds the backoff
    /// jitter (any value; tests pass a fixed one); `max_stale` is
    /// `-consul-max-stale` (zero: off).
    /// The same watch, replacing `secrets` (the token ...) in the error
    /// bodies it reports.
    pub fn hiding(self, secrets: Vec<Vec<u8>>) -> Watch {
        Watch { secrets, ..self }
    }

    pub fn new(prefix: &str, seed: u64, max_stale: Duration) -> Watch {
        Watch {
            prefix: prefix.to_owned(),
            index: 0,
            nonblocking_next: true,
            last_start: None,
            tokens: BUCKET_BURST,
            tokens_at: None,
            failures: 0,
            not_before: None,
            rng: Jitter::new(seed),
            last_entries: 0,
            max_stale: (!max_stale.is_zero()).then_some(max_stale),
            secrets: Vec::new(),
            asked_stale: false,
            consistent_next: false,
            stale_reasks: 0,
        }
    }

    /// The index to send with the next request (0: answer at once).
    pub fn request_index(&self) -> u64 {
        if self.nonblocking_next {
            0
        } else {
            self.index
        }
    }

    /// The index of the state held now.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Consecutive failures so far (0 after a success).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Answers discarded as too stale (each asked again without `stale`).
    pub fn stale_reasks(&self) -> u64 {
        self.stale_reasks
    }

    /// The next request carries `stale`.
    fn stale_next(&self) -> bool {
        self.max_stale.is_some() && !self.consistent_next
    }

    /// The `wait` of the request in flight (or just started), given
    /// `-consul-wait`: capped at [`STALE_WAIT_CAP`] when it is `stale`.
    pub fn request_wait(&self, configured: Duration) -> Duration {
        stale_wait(configured, self.asked_stale)
    }

    /// The earliest time the next request may start.
    pub fn next_start(&self, now: Instant) -> Instant {
        let mut at = now;
        if let Some(last) = self.last_start {
            at = at.max(last + MIN_GAP);
        }
        if let Some(nb) = self.not_before {
            at = at.max(nb);
        }
        let tokens = self.tokens_at_time(at);
        if tokens < 1.0 {
            at += Duration::from_secs_f64((1.0 - tokens) / BUCKET_REFILL_PER_S);
        }
        at
    }

    fn tokens_at_time(&self, t: Instant) -> f64 {
        match self.tokens_at {
            None => self.tokens,
            Some(at) => {
                let dt = t.saturating_duration_since(at).as_secs_f64();
                (self.tokens + dt * BUCKET_REFILL_PER_S).min(BUCKET_BURST)
            }
        }
    }

    /// A request starts now (call only at or after [`Watch::next_start`]).
    pub fn on_start(&mut self, now: Instant) {
        self.tokens = (self.tokens_at_time(now) - 1.0).max(0.0);
        self.tokens_at = Some(now);
        self.last_start = Some(now);
        self.not_before = None;
        self.asked_stale = self.stale_next();
    }

    /// The request target: `/v1/kv/<prefix>/?recurse&index=N&wait=Ws`
    /// (`path_prefix` from `http://host/prefix`, `ns`/`partition` only when
    /// set; `stale` when `-consul-max-stale` is set, unless the last answer
    /// was too stale).
    pub fn target(
        &self,
        path_prefix: &str,
        wait: Duration,
        ns: Option<&str>,
        partition: Option<&str>,
    ) -> String {
        let mut t = format!("{path_prefix}/v1/kv/");
        if !self.prefix.is_empty() {
            t.push_str(&encode_path(&self.prefix));
            t.push('/');
        }
        t.push_str("?recurse=");
        let index = self.request_index();
        if index > 0 {
            let wait = stale_wait(wait, self.stale_next());
            t.push_str(&format!("&index={index}&wait={}ms", wait.as_millis()));
        }
        if self.stale_next() {
            t.push_str("&stale=");
        }
        if let Some(ns) = ns {
            t.push_str("&ns=");
            t.push_str(&encode_path(ns));
        }
        if let Some(p) = partition {
            t.push_str("&partition=");
            t.push_str(&encode_path(p));
        }
        t
    }

    /// A complete response arrived: its head and its (decoded) body.
    /// Applies the staleness bound and the index rules, and decodes.
    pub fn on_response(&mut self, now: Instant, head: &ResponseHead, body: Vec<u8>) -> Response {
        let asked_stale = std::mem::take(&mut self.asked_stale);
        self.consistent_next = false;
        if let Some(f) = Failure::of_status(head.status, &body, &self.secrets) {
            return Response::Done(self.fail(now, f));
        }
        if asked_stale {
            if let Some(update) = self.too_stale(head.header("x-consul-lastcontact")) {
                return Response::Done(update);
            }
        }
        let index_header = head.header("x-consul-index");
        let Some(new_index) = index_header.and_then(parse_index) else {
            let shown = index_header.map(|v| crate::safe::escape(v, 32));
            let detail = match shown {
                Some(v) => format!("non-numeric X-Consul-Index {v:?}"),
                None => "response without X-Consul-Index".to_owned(),
            };
            return Response::Done(self.fail(now, Failure::new(ErrorReason::BadIndex, detail)));
        };
        // Index 0 is treated as 1 (consul's documented client rule).
        let new_index = new_index.max(1);
        if new_index < self.index {
            if asked_stale {
                // A follower behind the state applied: consul's reset rule
                // is for the leader's index; this one would undo writes
                // already answered.
                let lc = head.header("x-consul-lastcontact");
                return Response::Done(self.ask_the_leader(last_contact(lc)));
            }
            let from = self.index;
            self.index = 0;
            self.nonblocking_next = true;
            self.succeeded();
            return Response::Done(Update::Reset {
                from,
                to: new_index,
            });
        }
        if new_index == self.index && !self.nonblocking_next {
            // A blocking-query timeout: the state held is still current.
            // A non-blocking re-read (after an error) is decoded and swapped
            // even at the index held: a consul that restarted empty (a `-dev`
            // agent, a rebuilt cluster) can reach that index with other data,
            // and the read is what consul holds now.
            self.succeeded();
            return Response::Done(Update::Unchanged);
        }
        if head.status == 404 {
            let empty = Snapshot::build(&self.prefix, new_index, Vec::new());
            return Response::Done(self.on_decoded(now, Ok(empty)));
        }
        let decoding = Decoding {
            index: new_index,
            decoder: ListDecoder::new(),
            // Sized like the last listing: growing a 100,000-entry table
            // rehashes it all in one loop turn.
            builder: SnapshotBuilder::new(
                &self.prefix,
                new_index,
                self.last_entries + self.last_entries / 8,
            ),
            pairs: Vec::new(),
            body,
        };
        // Decoded by the caller, a slice of the loop's time per turn.
        Response::Decode(decoding)
    }

    /// A `stale` answer past `-consul-max-stale` (or not saying how stale
    /// it is): discarded whatever it holds, the index untouched, the next
    /// request at once and to the leader.
    fn too_stale(&mut self, header: Option<&[u8]>) -> Option<Update> {
        let max = self.max_stale?;
        let last_contact = last_contact(header);
        if last_contact.is_some_and(|lc| lc <= max) {
            return None;
        }
        Some(self.ask_the_leader(last_contact))
    }

    /// A `stale` answer not applied: the next request, at once, without
    /// `stale`, at the index of the state applied.
    fn ask_the_leader(&mut self, last_contact: Option<Duration>) -> Update {
        self.consistent_next = true;
        self.stale_reasks += 1;
        Update::TooStale { last_contact }
    }

    /// A decode started by [`Watch::on_response`] finished.
    pub fn on_decoded(&mut self, now: Instant, result: Result<Snapshot, DecodeError>) -> Update {
        match result {
            Ok(snapshot) => {
                self.last_entries = snapshot.len() + snapshot.invalid().len();
                self.index = snapshot.index();
                self.nonblocking_next = false;
                self.succeeded();
                Update::Swap(snapshot)
            }
            Err(e) => self.fail(now, Failure::new(ErrorReason::BadBody, e.0)),
        }
    }

    /// The request failed before a complete response (connect, timeout,
    /// reset, framing, size).
    pub fn on_failure(&mut self, now: Instant, failure: Failure) -> Update {
        self.fail(now, failure)
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
    }

    fn fail(&mut self, now: Instant, failure: Failure) -> Update {
        self.failures = self.failures.saturating_add(1);
        self.nonblocking_next = true;
        self.asked_stale = false;
        self.consistent_next = false;
        let mut delay = self.backoff_delay();
        if failure.configuration {
            delay = delay.max(CONFIG_ERROR_DELAY);
        }
        self.not_before = Some(now + delay);
        Update::Failed(failure)
    }

    /// 250 ms doubling per consecutive failure, capped at 30 s. The first
    /// retry is anywhere in its 250 ms: every agent of a fleet sees a
    /// consul restart at the same instant, and their reconnects must not
    /// arrive together. Later ones are a random point in the upper half of
    /// theirs (spread out, and still backing off).
    fn backoff_delay(&mut self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(16);
        let full = BACKOFF_FIRST.saturating_mul(1 << exp).min(BACKOFF_CAP);
        let floor = if self.failures <= 1 {
            Duration::ZERO
        } else {
            full / 2
        };
        let span = (full - floor).as_micros() as u64;
        floor + Duration::from_micros(self.rng.below(span + 1))
    }
}

/// `X-Consul-LastContact` (ms), if there is one and it is a number.
fn last_contact(header: Option<&[u8]>) -> Option<Duration> {
    header.and_then(parse_index).map(Duration::from_millis)
}

/// A request's `wait`: `-consul-wait`, capped for a `stale` one.
fn stale_wait(configured: Duration, stale: bool) -> Duration {
    if stale {
        configured.min(STALE_WAIT_CAP)
    } else {
        configured
    }
}

/// `X-Consul-Index` (and `X-Consul-LastContact`): a decimal u64,
/// surrounding whitespace allowed.
fn parse_index(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Percent-encodes a KV path, keeping `/` and the unreserved characters.
fn encode_path(s: &str) -> String {
    crate::http::percent_encode(s, crate::http::EncodeSet::KV_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39: an error body echoing the request headers put the ACL
    /// token into the log, `/debug/state` and `status`.
    #[test]
    fn an_error_body_is_shown_without_the_token() {
        let config = crate::consul::memstream::config(1 << 20);
        let config = crate::config::ConsulConfig {
            token: Some("s3cr3t-acl-token".into()),
            ..config
        };
        let body = b"403 denied; you sent X-Consul-Token: s3cr3t-acl-token\x1b[2J\xc2\x9b";
        let f = Failure::of_status(403, body, &config.secrets()).unwrap();
        assert!(!f.detail.contains("s3cr3t"), "{}", f.detail);
        assert!(f.detail.contains("<redacted>"), "{}", f.detail);
        assert!(!f.detail.chars().any(crate::safe::hidden), "{}", f.detail);
        let w = Watch::new("p", 1, Duration::ZERO).hiding(config.secrets());
        assert_eq!(w.secrets, [b"s3cr3t-acl-token".to_vec()]);
    }

    const BODY: &[u8] = br#"[{"LockIndex":0,"Key":"p/be/s1","Flags":0,"Value":"ZHJhaW4=","CreateIndex":5,"ModifyIndex":7}]"#;

    fn t0() -> Instant {
        Instant::now()
    }

    /// A response head with this status, `X-Consul-Index` and
    /// `X-Consul-LastContact`.
    fn head(status: u16, index: Option<&[u8]>, last_contact: Option<&str>) -> ResponseHead {
        let mut headers = Vec::new();
        if let Some(i) = index {
            headers.push(("x-consul-index".to_owned(), i.to_vec()));
        }
        if let Some(lc) = last_contact {
            headers.push(("x-consul-lastcontact".to_owned(), lc.as_bytes().to_vec()));
        }
        ResponseHead {
            status,
            framing: crate::http::Framing::Length(0),
            keep_alive: true,
            headers,
        }
    }

    /// A response, decoded to the end whatever its size.
    fn respond(
        w: &mut Watch,
        now: Instant,
        status: u16,
        index: Option<&[u8]>,
        body: &[u8],
    ) -> Update {
        let response = w.on_response(now, &head(status, index, None), body.to_vec());
        finish(w, now, response)
    }

    /// A response applied, its listing decoded 4,096 entries a slice.
    fn finish(w: &mut Watch, now: Instant, response: Response) -> Update {
        match response {
            Response::Done(u) => u,
            Response::Decode(mut d) => loop {
                if let Some(result) = d.step(&mut Slice::items(4096)) {
                    break w.on_decoded(now, result);
                }
            },
        }
    }

    fn swap(u: Update) -> Snapshot {
        match u {
            Update::Swap(s) => s,
            other => panic!("expected a swap, got {other:?}"),
        }
    }

    #[test]
    fn first_request_is_nonblocking_then_blocks_on_the_index() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        assert_eq!(w.request_index(), 0);
        assert_eq!(
            w.target("", Duration::from_secs(300), None, None),
            "/v1/kv/p/?recurse="
        );
        let s = swap(respond(&mut w, now, 200, Some(b"7"), BODY));
        assert_eq!(s.index(), 7);
        assert_eq!(s.reply(b"be/s1"), b"drain 100%\n");
        assert_eq!(w.request_index(), 7);
        assert_eq!(
            w.target(
                "/consul",
                Duration::from_secs(300),
                Some("team a"),
                Some("p1")
            ),
            "/consul/v1/kv/p/?recurse=&index=7&wait=300000ms&ns=team%20a&partition=p1"
        );
    }

    #[test]
    fn equal_index_does_not_swap() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        swap(respond(&mut w, now, 200, Some(b"7"), BODY));
        assert!(matches!(
            respond(&mut w, now, 200, Some(b"7"), BODY),
            Update::Unchanged
        ));
        assert_eq!(w.request_index(), 7);
    }

    #[test]
    fn lower_index_resets_to_zero_and_rereads_at_once() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        swap(respond(&mut w, now, 200, Some(b"70"), BODY));
        match respond(&mut w, now, 200, Some(b"9"), BODY) {
            Update::Reset { from: 70, to: 9 } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(w.request_index(), 0);
        assert_eq!(w.index(), 0);
        // The re-read at index 0 swaps in whatever consul has now.
        let s = swap(respond(&mut w, now, 200, Some(b"9"), BODY));
        assert_eq!(s.index(), 9);
        assert_eq!(w.request_index(), 9);
    }

    #[test]
    fn index_zero_is_treated_as_one() {
        let mut w = Watch::new("p", 1, Duration::ZERO);
        let s = swap(respond(&mut w, t0(), 404, Some(b"0"), b""));
        assert_eq!(s.index(), 1);
        assert_eq!(w.request_index(), 1);
    }

    #[test]
    fn not_found_is_a_valid_empty_state() {
        let mut w = Watch::new("p", 1, Duration::ZERO);
        let s = swap(respond(&mut w, t0(), 404, Some(b"12"), b""));
        assert!(s.is_empty());
        assert_eq!(s.reply(b"be/s1"), b"ready 100%\n");
    }

    #[test]
    fn missing_or_garbage_index_is_bad_index() {
        for h in [
            None,
            Some(&b"abc"[..]),
            Some(b""),
            Some(b"-1"),
            Some(b"99999999999999999999999"),
        ] {
            let mut w = Watch::new("p", 1, Duration::ZERO);
            match respond(&mut w, t0(), 200, h, BODY) {
                Update::Failed(f) => assert_eq!(f.reason, ErrorReason::BadIndex, "{h:?}"),
                other => panic!("{h:?}: {other:?}"),
            }
            assert_eq!(w.request_index(), 0);
        }
    }

    #[test]
    fn http_errors_keep_the_state_and_make_the_next_read_nonblocking() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        swap(respond(&mut w, now, 200, Some(b"7"), BODY));
        match respond(&mut w, now, 500, Some(b"7"), b"No cluster leader") {
            Update::Failed(f) => {
                assert_eq!(f.reason, ErrorReason::Http5xx);
                assert_eq!(f.detail, "HTTP 500: No cluster leader");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(w.index(), 7, "the state held is still as of 7");
        assert_eq!(w.request_index(), 0);
        // The non-blocking re-read at the same index swaps in what it read.
        swap(respond(&mut w, now, 200, Some(b"7"), BODY));
        assert_eq!(w.request_index(), 7);
        match respond(&mut w, now, 429, Some(b"7"), b"") {
            Update::Failed(f) => assert_eq!(
                (f.reason, f.detail.as_str()),
                (ErrorReason::Http4xx, "HTTP 429")
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn consul_restarted_empty_at_the_same_index_is_swapped_in() {
        // Regression (tests/it/haproxy/, consul down): a dev KV restarted
        // empty and rewritten reached the index the agent held with other
        // data; the re-read after the outage was taken as "unchanged" and
        // the new data was never applied.
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        swap(respond(&mut w, now, 200, Some(b"7"), BODY));
        assert!(matches!(
            w.on_failure(now, Failure::new(ErrorReason::Connect, "refused")),
            Update::Failed(_)
        ));
        assert_eq!(w.request_index(), 0);
        let maint = br#"[{"Key":"p/be/s1","Value":"bWFpbnQ=","CreateIndex":7,"ModifyIndex":7}]"#;
        let s = swap(respond(&mut w, now, 200, Some(b"7"), maint));
        assert_eq!(s.reply(b"be/s1"), b"maint 100%\n");
        // Back to blocking on 7, where an equal index is a timeout.
        assert_eq!(w.request_index(), 7);
        assert!(matches!(
            respond(&mut w, now, 200, Some(b"7"), maint),
            Update::Unchanged
        ));
    }

    #[test]
    fn garbage_body_is_bad_body() {
        let mut w = Watch::new("p", 1, Duration::ZERO);
        match respond(&mut w, t0(), 200, Some(b"7"), b"[{\"Key\":") {
            Update::Failed(f) => assert_eq!(f.reason, ErrorReason::BadBody),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_are_at_least_min_gap_apart_and_bucket_limits_churn() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        assert_eq!(w.next_start(now), now);
        let mut t = now;
        let mut starts = Vec::new();
        for _ in 0..12 {
            t = w.next_start(t);
            w.on_start(t);
            starts.push(t);
        }
        for pair in starts.windows(2) {
            assert!(pair[1] - pair[0] >= MIN_GAP, "{:?}", pair[1] - pair[0]);
        }
        // The burst goes at the minimum gap, then about one a second.
        assert!(starts[4] - starts[0] < Duration::from_millis(450));
        let tail = starts[11] - starts[8];
        assert!(
            tail >= Duration::from_millis(2900) && tail <= Duration::from_millis(3100),
            "{tail:?}"
        );
    }

    #[test]
    fn backoff_doubles_with_jitter_capped_and_resets_on_success() {
        let now = t0();
        let mut w = Watch::new("p", 42, Duration::ZERO);
        let mut expected_full = BACKOFF_FIRST;
        for n in 0..12 {
            w.on_start(now);
            w.on_failure(now, Failure::new(ErrorReason::Connect, "refused"));
            let delay = w.next_start(now) - now;
            // The first retry anywhere in its interval (here no sooner than
            // the minimum gap), later ones in the upper half of theirs.
            let floor = if n == 0 { MIN_GAP } else { expected_full / 2 };
            assert!(
                delay >= floor && delay <= expected_full.max(MIN_GAP),
                "{delay:?} vs {expected_full:?}"
            );
            expected_full = (expected_full * 2).min(BACKOFF_CAP);
        }
        assert_eq!(expected_full, BACKOFF_CAP);
        respond(&mut w, now, 404, Some(b"3"), b"");
        assert_eq!(w.failures(), 0);
        assert_eq!(
            w.next_start(now + Duration::from_secs(10)),
            now + Duration::from_secs(10)
        );
    }

    /// Retry times (after the failure) of `n` watches with seeds 1..=n,
    /// each failing `failures` times in a row, the last one after a long
    /// blocking request (so the minimum gap is not what decides).
    fn retry_delays(n: u64, failures: u32) -> Vec<Duration> {
        let t0 = t0();
        (1..=n)
            .map(|seed| {
                let mut w = Watch::new("p", seed, Duration::ZERO);
                let mut t = t0;
                for _ in 0..failures {
                    t = w.next_start(t);
                    w.on_start(t);
                    t += Duration::from_secs(300);
                    w.on_failure(t, Failure::new(ErrorReason::Reset, "closed"));
                }
                w.next_start(t) - t
            })
            .collect()
    }

    #[test]
    fn the_first_retry_spreads_over_its_whole_interval_and_later_ones_over_the_upper_half() {
        let first = retry_delays(2000, 1);
        assert!(first.iter().all(|&d| d <= BACKOFF_FIRST), "{first:?}");
        // Ten buckets of 25 ms, each with about a tenth of the fleet.
        let mut buckets = [0; 10];
        for d in &first {
            buckets[((d.as_micros() * 10 / BACKOFF_FIRST.as_micros()) as usize).min(9)] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (140..=260).contains(&b)),
            "{buckets:?}"
        );
        let second = retry_delays(500, 2);
        let full = BACKOFF_FIRST * 2;
        assert!(
            second.iter().all(|&d| d >= full / 2 && d <= full),
            "{second:?}"
        );
    }

    fn head_stale(
        w: &mut Watch,
        now: Instant,
        index: &[u8],
        lc: Option<&str>,
        body: &[u8],
    ) -> Update {
        let response = w.on_response(now, &head(200, Some(index), lc), body.to_vec());
        finish(w, now, response)
    }

    #[test]
    fn stale_reads_within_the_bound_apply_and_past_it_are_asked_again_of_the_leader() {
        let mut now = t0();
        let mut w = Watch::new("p", 1, Duration::from_secs(2));
        let target = |w: &Watch| w.target("", Duration::from_secs(60), None, None);
        assert_eq!(target(&w), "/v1/kv/p/?recurse=&stale=");
        w.on_start(now);
        swap(head_stale(&mut w, now, b"7", Some("2000"), BODY));
        assert_eq!(target(&w), "/v1/kv/p/?recurse=&index=7&wait=30000ms&stale=");
        now += Duration::from_secs(30);
        w.on_start(now);
        // A follower 2.5 s behind the leader answers a newer index: never
        // applied, the index untouched, the leader asked at once.
        let maint = br#"[{"Key":"p/be/s1","Value":"bWFpbnQ=","ModifyIndex":9}]"#;
        match head_stale(&mut w, now, b"9", Some("2500"), maint) {
            Update::TooStale { last_contact } => {
                assert_eq!(last_contact, Some(Duration::from_millis(2500)))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((w.index(), w.request_index(), w.stale_reasks()), (7, 7, 1));
        assert_eq!(w.failures(), 0);
        now += Duration::from_secs(30);
        assert_eq!(w.next_start(now), now, "asked again at once");
        assert_eq!(target(&w), "/v1/kv/p/?recurse=&index=7&wait=60000ms");
        w.on_start(now);
        // The leader's answer (it sends LastContact 0, but is not asked
        // stale: whatever it says is applied).
        let s = swap(head_stale(&mut w, now, b"9", None, maint));
        assert_eq!(s.reply(b"be/s1"), b"maint 100%\n");
        // And back to stale reads.
        assert_eq!(target(&w), "/v1/kv/p/?recurse=&index=9&wait=30000ms&stale=");
    }

    /// Regression (issue 27): a stale answer with an index below the one
    /// applied was taken as consul's "index went backwards" and reset the
    /// watch: the follower's older state was then read and applied (a drain
    /// undone, redone when the follower caught up).
    #[test]
    fn a_stale_answer_behind_the_state_applied_is_never_applied_and_asked_of_the_leader() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::from_secs(2));
        let target = |w: &Watch| w.target("", Duration::from_secs(60), None, None);
        w.on_start(now);
        swap(head_stale(&mut w, now, b"20", Some("10"), BODY));
        w.on_start(now);
        // A follower within the bound, but at 15.
        match head_stale(&mut w, now, b"15", Some("10"), BODY) {
            Update::TooStale { last_contact } => {
                assert_eq!(last_contact, Some(Duration::from_millis(10)))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            (w.index(), w.request_index(), w.stale_reasks()),
            (20, 20, 1)
        );
        assert_eq!(w.failures(), 0);
        assert_eq!(target(&w), "/v1/kv/p/?recurse=&index=20&wait=60000ms");
        w.on_start(now);
        // The leader's answer at a lower index is consul's reset rule.
        match head_stale(&mut w, now, b"15", None, BODY) {
            Update::Reset { from: 20, to: 15 } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(w.stale_reasks(), 1);
        // An equal index from a follower is a wait that ended: no change.
        let mut w = Watch::new("p", 1, Duration::from_secs(2));
        w.on_start(now);
        swap(head_stale(&mut w, now, b"20", Some("10"), BODY));
        w.on_start(now);
        assert!(matches!(
            head_stale(&mut w, now, b"20", Some("10"), BODY),
            Update::Unchanged
        ));
    }

    #[test]
    fn a_stale_blocking_request_waits_at_most_thirty_seconds() {
        let now = t0();
        let five_minutes = Duration::from_secs(300);
        let mut w = Watch::new("p", 1, Duration::from_secs(2));
        w.on_start(now);
        assert_eq!(w.request_wait(five_minutes), STALE_WAIT_CAP);
        swap(head_stale(&mut w, now, b"7", Some("0"), BODY));
        assert_eq!(
            w.target("", five_minutes, None, None),
            "/v1/kv/p/?recurse=&index=7&wait=30000ms&stale="
        );
        assert_eq!(
            w.target("", Duration::from_secs(10), None, None),
            "/v1/kv/p/?recurse=&index=7&wait=10000ms&stale=",
            "a shorter -consul-wait as it is"
        );
        w.on_start(now);
        assert_eq!(
            w.request_wait(Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        // Too stale: the leader is asked with the full wait.
        head_stale(&mut w, now, b"9", Some("5000"), BODY);
        assert_eq!(
            w.target("", five_minutes, None, None),
            "/v1/kv/p/?recurse=&index=7&wait=300000ms"
        );
        w.on_start(now);
        assert_eq!(w.request_wait(five_minutes), five_minutes);
        // Without -consul-max-stale, the full wait always.
        let mut off = Watch::new("p", 1, Duration::ZERO);
        off.on_start(now);
        assert_eq!(off.request_wait(five_minutes), five_minutes);
    }

    #[test]
    fn a_stale_answer_that_does_not_say_how_stale_is_too_stale() {
        let now = t0();
        for lc in [None, Some(""), Some("soon"), Some("-1")] {
            let mut w = Watch::new("p", 1, Duration::from_secs(5));
            w.on_start(now);
            assert!(
                matches!(
                    head_stale(&mut w, now, b"7", lc, BODY),
                    Update::TooStale { last_contact: None }
                ),
                "{lc:?}"
            );
            // The first read was non-blocking: so is the re-ask.
            assert_eq!(w.request_index(), 0);
            assert_eq!(
                w.target("", Duration::from_secs(1), None, None),
                "/v1/kv/p/?recurse="
            );
        }
    }

    #[test]
    fn errors_come_before_staleness_and_stale_reads_off_ignore_last_contact() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::from_secs(1));
        w.on_start(now);
        match respond(&mut w, now, 500, Some(b"7"), b"No cluster leader") {
            Update::Failed(f) => assert_eq!(f.reason, ErrorReason::Http5xx),
            other => panic!("{other:?}"),
        }
        assert_eq!(w.stale_reasks(), 0);
        // After an error the next read is stale again (and non-blocking).
        assert_eq!(
            w.target("", Duration::from_secs(1), None, None),
            "/v1/kv/p/?recurse=&stale="
        );
        let mut off = Watch::new("p", 1, Duration::ZERO);
        off.on_start(now);
        swap(head_stale(&mut off, now, b"7", Some("999999"), BODY));
        assert_eq!(
            off.target("", Duration::from_secs(1), None, None),
            "/v1/kv/p/?recurse=&index=7&wait=1000ms"
        );
    }

    #[test]
    fn forbidden_is_retried_slowly() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        w.on_start(now);
        match respond(&mut w, now, 403, None, b"ACL not found") {
            Update::Failed(f) => assert_eq!(f.detail, "HTTP 403: ACL not found"),
            other => panic!("{other:?}"),
        }
        assert!(w.next_start(now) - now >= CONFIG_ERROR_DELAY);
    }

    #[test]
    fn a_large_listing_is_decoded_in_slices_and_commits_its_index_at_the_end() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        let entries: Vec<String> = (0..8202)
            .map(|i| format!(r#"{{"Key":"p/be/s{i}","Value":"ZHJhaW4=","ModifyIndex":{i}}}"#))
            .collect();
        let body = format!("[{}]", entries.join(",")).into_bytes();
        let Response::Decode(mut d) = w.on_response(now, &head(200, Some(b"99"), None), body)
        else {
            panic!("expected a sliced decode");
        };
        assert!(d.step(&mut Slice::items(4096)).is_none(), "first slice");
        assert!(d.step(&mut Slice::items(4096)).is_none(), "second slice");
        assert_eq!(w.request_index(), 0, "index not committed mid-decode");
        let result = d
            .step(&mut Slice::items(4096))
            .expect("done after three slices");
        let s = swap(w.on_decoded(now, result));
        assert_eq!(s.len(), 8202);
        assert_eq!(s.reply(b"be/s8200"), b"drain 100%\n");
        assert_eq!(w.request_index(), 99);
    }

    #[test]
    fn a_bad_entry_late_in_a_sliced_decode_fails_the_whole_listing() {
        let now = t0();
        let mut w = Watch::new("p", 1, Duration::ZERO);
        swap(respond(&mut w, now, 200, Some(b"7"), BODY));
        let mut entries: Vec<String> = (0..4101)
            .map(|i| format!(r#"{{"Key":"p/s{i}","Value":null,"ModifyIndex":1}}"#))
            .collect();
        entries.push("{\"Key\":".to_owned());
        let body = format!("[{}]", entries.join(",")).into_bytes();
        match respond(&mut w, now, 200, Some(b"9"), &body) {
            Update::Failed(f) => assert_eq!(f.reason, ErrorReason::BadBody),
            other => panic!("{other:?}"),
        }
        assert_eq!(w.index(), 7, "the state held is still as of 7");
        assert_eq!(w.request_index(), 0);
    }

    #[test]
    fn prefix_is_percent_encoded_in_the_path() {
        let w = Watch::new("a b/c%d", 1, Duration::ZERO);
        assert_eq!(
            w.target("", Duration::from_secs(1), None, None),
            "/v1/kv/a%20b/c%25d/?recurse="
        );
    }
}
