//! HTTP requests as the monitoring, pprof and dev KV listeners see them:
//! `http::parse_request_head`, body decoding, `query_pairs` /
//! `percent_decode`, then the request handed to `devkv::DevKv::handle` at a
//! fixed `Instant`, and its response rendered and parsed back.
//!
//! Input: the bytes of one connection; pipelined requests (up to 16) are
//! served in order against one dev KV, so a PUT can be read back by a GET.
//! Checks besides "no panic": a head parses the same from any prefix that
//! holds it and is `Partial` from any shorter one; a body is exactly what
//! its framing announced; a rendered response parses back to itself.
#![no_main]

use std::sync::OnceLock;
use std::time::Instant;

use gitlab_haproxy_agent::devkv::{DevKv, Handled};
use gitlab_haproxy_agent::http::{
    parse_request_head, parse_response_head, percent_decode, query_pairs, render_response,
    BodyDecoder, Framing, Method, Parse, Response,
};
use libfuzzer_sys::fuzz_target;

/// The listeners' bounds (`http::server::MAX_HEAD_BYTES`, and a body
/// bound above the dev KV's 512 KiB value limit so its 413 is reachable).
const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 1 << 20;
const MAX_REQUESTS: usize = 16;

fn now() -> Instant {
    static NOW: OnceLock<Instant> = OnceLock::new();
    *NOW.get_or_init(Instant::now)
}

fn dev_kv() -> DevKv {
    let mut kv = DevKv::new(false);
    let store = kv.store_mut();
    store.put("gitlab-haproxy-agent/state/be_web/srv1", b"drain", 0, None);
    store.put("gitlab-haproxy-agent/state/be_web/srv2", b"50%\n", 3, None);
    store.put("other/key", b"x", 0, None);
    kv
}

/// A rendered response reads back as the same status and body.
fn round_trip(resp: &Response, keep_alive: bool, head_only: bool) {
    let mut wire = Vec::new();
    render_response(&mut wire, resp, keep_alive, Some(2048), head_only);
    let Parse::Done(head, used) = parse_response_head(&wire, usize::MAX) else {
        panic!("rendered response does not parse: {wire:?}");
    };
    assert_eq!(head.status, resp.status);
    assert_eq!(head.keep_alive, keep_alive);
    if head_only {
        assert_eq!(used, wire.len());
        return;
    }
    let mut decoder = BodyDecoder::new(head.framing, usize::MAX);
    let mut body = Vec::new();
    let n = decoder
        .feed(&wire[used..], &mut body)
        .expect("rendered body");
    assert!(decoder.is_done());
    assert_eq!(used + n, wire.len());
    assert_eq!(body, resp.body);
}

fuzz_target!(|data: &[u8]| {
    let mut kv = dev_kv();
    let mut buf = data;
    for _ in 0..MAX_REQUESTS {
        let (head, used) = match parse_request_head(buf, MAX_HEAD) {
            Parse::Done(head, used) => (head, used),
            Parse::Partial | Parse::Invalid(_) => return,
        };
        // The head does not depend on how its bytes arrived.
        assert!(used <= buf.len() && used <= MAX_HEAD);
        assert_eq!(
            parse_request_head(&buf[..used - 1], MAX_HEAD),
            Parse::Partial
        );
        assert_eq!(
            parse_request_head(&buf[..used / 2], MAX_HEAD),
            Parse::Partial
        );
        assert_eq!(
            parse_request_head(&buf[..used], MAX_HEAD),
            Parse::Done(head.clone(), used)
        );
        assert_ne!(
            head.framing,
            Framing::Close,
            "request bodies are never close-delimited"
        );

        if let Some(path) = percent_decode(&head.path) {
            assert!(path.len() <= head.path.len());
        }
        for (name, value) in query_pairs(&head.query) {
            assert!(name.len() + value.len() <= head.query.len());
        }

        let mut decoder = BodyDecoder::new(head.framing, MAX_BODY);
        let mut body = Vec::new();
        let Ok(consumed) = decoder.feed(&buf[used..], &mut body) else {
            return;
        };
        if !decoder.is_done() {
            // The peer closed mid-body: never a complete request.
            assert!(decoder.eof().is_err());
            return;
        }
        if let Framing::Length(n) = head.framing {
            assert_eq!(body.len() as u64, n);
        }
        assert!(body.len() <= buf.len() - used);

        let resp = match kv.handle(&head, &body, now()) {
            Handled::Respond(resp) => resp,
            Handled::Wait(wait) => {
                assert!(wait.deadline > now());
                assert!(!kv.is_ready(&wait));
                kv.answer(&wait)
            }
        };
        round_trip(&resp, head.keep_alive, head.method == Method::Head);

        if !head.keep_alive {
            return;
        }
        buf = &buf[used + consumed..];
    }
});
