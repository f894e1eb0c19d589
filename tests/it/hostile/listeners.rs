//! Hostile requests to the HTTP listeners (monitoring, dev KV): smuggling
//! shapes and header floods get 400 and a close.

use super::*;

const SMUGGLING: &[&str] = &[
    "Content-Length: 5\r\nContent-Length: 6\r\n",
    "Content-Length: 5\r\nContent-Length: 5\r\n",
    "Content-Length: 5, 5\r\n",
    "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    "Transfer-Encoding: gzip\r\n",
    "Transfer-Encoding: gzip, chunked\r\n",
    "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    "Transfer-Encoding: xchunked\r\n",
    "Content-Length: +5\r\n",
    "Content-Length: 5\r\n folded: yes\r\n",
    "X-Folded: a\r\n b\r\nContent-Length: 5\r\n",
    "X-Folded: a\r\n\tb\r\n",
    "Content-Length : 5\r\n",
    " Content-Length: 5\r\n",
];

#[track_caller]
fn refused(addr: SocketAddr, raw: &[u8], what: &str, statuses: &[&str]) {
    let (got, closed) = send_raw(addr, raw, Duration::from_secs(3));
    let text = String::from_utf8_lossy(&got);
    assert!(
        statuses
            .iter()
            .any(|s| text.starts_with(&format!("HTTP/1.1 {s} "))),
        "{what}: {text:?}"
    );
    assert!(closed, "{what}: connection left open");
}

#[test]
fn smuggling_shapes_to_monitoring_and_dev_kv_get_400_and_close() {
    let (mut agent, _kv) = dev_agent(&[]);
    let kv = agent.dev_kv.unwrap();
    let targets = [
        ("monitoring", agent.monitoring.unwrap(), "GET /-/metrics"),
        ("dev KV", kv, "PUT /v1/kv/smuggled"),
    ];
    for (name, addr, line) in targets {
        for shape in SMUGGLING {
            let raw = format!("{line} HTTP/1.1\r\nHost: x\r\n{shape}\r\nhello");
            refused(addr, raw.as_bytes(), &format!("{name} {shape:?}"), &["400"]);
        }
    }
    // CL.TE with a second request hidden in the body: refused whole, the
    // hidden PUT never runs.
    let hidden = "PUT /v1/kv/smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\ndrain";
    let raw = format!("PUT /v1/kv/a HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{hidden}", 5 + hidden.len());
    refused(kv, raw.as_bytes(), "CL.TE", &["400"]);
    assert_eq!(http(kv, "GET", "/v1/kv/smuggled", b"").unwrap().0, 404);
    assert_eq!(http(kv, "GET", "/v1/kv/a", b"").unwrap().0, 404);
    eprintln!(
        "{} smuggling shapes x 2 listeners + CL.TE: all 400 and closed",
        SMUGGLING.len()
    );
    alive(&mut agent);
}

#[test]
fn header_floods_get_400_and_close() {
    let (mut agent, _kv) = dev_agent(&[]);
    for (name, addr) in [
        ("monitoring", agent.monitoring.unwrap()),
        ("dev KV", agent.dev_kv.unwrap()),
        ("pprof", agent.pprof.unwrap()),
    ] {
        let mut many = String::from("GET /-/metrics HTTP/1.1\r\nHost: x\r\n");
        for i in 0..100 {
            many.push_str(&format!("X-Flood-{i}: v\r\n"));
        }
        many.push_str("\r\n");
        refused(
            addr,
            many.as_bytes(),
            &format!("{name}: 100 headers"),
            &["400", "431"],
        );
        let big = format!(
            "GET /-/metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(20 * 1024)
        );
        refused(
            addr,
            big.as_bytes(),
            &format!("{name}: 20 KiB head"),
            &["400", "431"],
        );
        // A head that never ends, sent without a pause: refused at 16 KiB.
        let endless = format!("GET / HTTP/1.1\r\n{}", "X-A: b\r\n".repeat(8 * 1024));
        refused(
            addr,
            endless.as_bytes(),
            &format!("{name}: endless head"),
            &["400", "431"],
        );
    }
    alive(&mut agent);
}
