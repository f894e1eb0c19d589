//! Hostile input (issue 7): every byte value in a request
//! line, lines at and past the limit, a slow million-byte line, HTTP and TLS
//! to the agent port, TLS ClientHellos to every listener, half-open
//! connections, RST storms, request smuggling shapes and header floods to the
//! HTTP listeners, control bytes in KV keys and values (and in the logs),
//! 512 KiB values, 100,000 keys, and deeply nested or huge JSON from a fake
//! consul.
//!
//! Every test starts its own processes on loopback port 0; the fake consul
//! is a std listener thread in the test.

use crate::support;
use crate::support::metrics::outcome;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{check, dev_agent, http, wait_for, Agent, Kv};

mod consul;
mod kv;
mod listeners;

use crate::support::STATE_PREFIX as PREFIX;

fn alive(agent: &mut Agent) {
    assert!(
        agent.proc.child.try_wait().unwrap().is_none(),
        "agent exited"
    );
    assert_eq!(agent.check("be_web/srv1\n").as_deref(), Some("ready 100%"));
    assert_eq!(agent.monitoring_get("/-/liveness").0, 200);
}

/// Sends `bytes` (ignoring a reset part way), then reads until EOF, reset or
/// `limit`: (bytes received, whether the peer closed within `limit`).
fn send_raw(addr: SocketAddr, bytes: &[u8], limit: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    let _ = s.write_all(bytes);
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

/// A TLS 1.3-style ClientHello record (SNI `localhost`, padded to 517 bytes
/// as browsers send it).
fn client_hello() -> Vec<u8> {
    let mut ext = Vec::new();
    let sni = b"localhost";
    ext.extend_from_slice(&[0x00, 0x00]);
    ext.extend_from_slice(&((sni.len() + 5) as u16).to_be_bytes());
    ext.extend_from_slice(&((sni.len() + 3) as u16).to_be_bytes());
    ext.push(0);
    ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    ext.extend_from_slice(sni);
    ext.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]); // supported_versions
    ext.extend_from_slice(&[0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1d]); // groups
    let mut body = vec![0x03, 0x03];
    body.extend((0..32u8).map(|i| i.wrapping_mul(37)));
    body.push(32);
    body.extend((0..32u8).map(|i| i.wrapping_mul(11)));
    body.extend_from_slice(&[0x00, 0x06, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03, 0x01, 0x00]);
    let pad = 512 - 4 - body.len() - 2 - ext.len() - 4;
    ext.extend_from_slice(&[0x00, 0x15]);
    ext.extend_from_slice(&(pad as u16).to_be_bytes());
    ext.extend(std::iter::repeat_n(0u8, pad));
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![0x01, 0x00];
    hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

/// Every stderr line is one JSON object with no raw control byte.
#[track_caller]
fn logs_clean(lines: &[String]) {
    for l in lines {
        assert!(
            !l.bytes().any(|b| b < 0x20 || b == 0x7f),
            "raw control byte in log line {l:?}"
        );
        assert!(
            serde_json::from_str::<serde_json::Value>(l).is_ok(),
            "log line is not one JSON object: {l:?}"
        );
    }
}

// ---- the agent port ----

#[test]
fn every_byte_value_in_a_request_line() {
    let (agent, _kv) = dev_agent(&[]);
    let addr = agent.listen();
    let control = |b: u8| b < 0x20 || b == 0x7f;
    let (mut replied, mut refused) = (0, 0);
    for b in 0..=255u8 {
        let single = check(addr, &[b, b'\n']);
        // Alone: spaces, tabs, CR and LF leave an empty line; other control
        // bytes are refused; every other byte is an identity (unknown: absent).
        let want_single = !(control(b) || b == b' ');
        assert_eq!(
            single.is_some(),
            want_single,
            "single byte {b:#04x}: {single:?}"
        );
        let embedded = check(addr, &[b'a', b, b'b', b'\n']);
        // Inside: `a\nb` is the line `a`; a space is kept; a control byte
        // (tab and CR included) is refused.
        let want_embedded = !control(b) || b == b'\n';
        assert_eq!(
            embedded.is_some(),
            want_embedded,
            "embedded byte {b:#04x}: {embedded:?}"
        );
        for r in [single, embedded].into_iter().flatten() {
            assert_eq!(r, "ready 100%", "byte {b:#04x}");
            replied += 1;
        }
        refused += usize::from(!want_single) + usize::from(!want_embedded);
    }
    eprintln!("512 request lines: {replied} replied, {refused} closed without a reply");
    assert!(agent.metric(&outcome("control_byte")) >= 60.0);
    assert!(agent.metric(&outcome("empty")) >= 4.0);
}

#[test]
fn lines_at_and_past_the_limit_and_a_slow_million_byte_line() {
    let (agent, _kv) = dev_agent(&["-read-timeout", "3s"]);
    let addr = agent.listen();
    let line = |n: usize| {
        let mut v = vec![b'x'; n];
        v.push(b'\n');
        v
    };
    assert_eq!(check(addr, &line(255)).as_deref(), Some("ready 100%"));
    assert_eq!(check(addr, &line(256)).as_deref(), Some("ready 100%"));
    assert_eq!(check(addr, &line(257)), None);
    let (got, closed) = send_raw(addr, &line(64 * 1024), Duration::from_secs(2));
    assert!(
        got.is_empty() && closed,
        "64 KiB line: {got:?} closed={closed}"
    );

    // A million bytes in 100 chunks over ~1 s: closed after 257, long before
    // the end.
    let mut s = TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    let chunk = vec![b'y'; 10_000];
    let mut sent = 0;
    for _ in 0..100 {
        if s.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
        std::thread::sleep(Duration::from_millis(10));
    }
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    eprintln!(
        "slow 1,000,000-byte line: {sent} bytes accepted by the socket before the reset, {:?}",
        started.elapsed()
    );
    assert!(rest.is_empty(), "reply to a million-byte line");
    assert!(
        sent < 1_000_000,
        "the agent kept reading a million-byte line"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(agent.metric(&outcome("too_long")), 3.0);
    assert_eq!(agent.check("be_web/srv1\n").as_deref(), Some("ready 100%"));
}

#[test]
fn http_and_tls_to_the_agent_port() {
    let (agent, _kv) = dev_agent(&["-read-timeout", "2s"]);
    let addr = agent.listen();
    // The first line `GET / HTTP/1.1\r` is a valid identity (the `\r` is
    // stripped, inner spaces kept): an unknown one, answered as absent.
    let (got, closed) = send_raw(
        addr,
        b"GET / HTTP/1.1\r\nHost: agent\r\nUser-Agent: curl\r\n\r\n",
        Duration::from_secs(2),
    );
    assert_eq!(
        (String::from_utf8_lossy(&got).as_ref(), closed),
        ("ready 100%\n", true)
    );
    // A ClientHello: binary, past the line limit before any newline: no reply.
    let hello = client_hello();
    assert!(hello.len() > 256);
    let (got, closed) = send_raw(addr, &hello, Duration::from_secs(3));
    assert!(
        got.is_empty() && closed,
        "ClientHello to the agent port: {got:?} closed={closed}"
    );
    // Its first 100 bytes (no newline, control bytes): closed at the read
    // timeout, no reply.
    let (got, closed) = send_raw(addr, &hello[..100], Duration::from_secs(4));
    assert!(
        got.is_empty() && closed,
        "partial ClientHello: {got:?} closed={closed}"
    );
    // (Which reason depends on where its first 0x0a byte falls.)
    let reasons: f64 = ["too_long", "control_byte", "no_newline"]
        .iter()
        .map(|o| agent.metric(&outcome(o)))
        .sum();
    assert_eq!(reasons, 2.0);
}

#[test]
fn tls_client_hello_to_every_http_listener_gets_400_or_close() {
    let (mut agent, _kv) = dev_agent(&[]);
    let hello = client_hello();
    for (name, addr) in [
        ("monitoring", agent.monitoring),
        ("pprof", agent.pprof),
        ("dev KV", agent.dev_kv),
    ] {
        let addr = addr.unwrap_or_else(|| panic!("{name} listener"));
        let (got, closed) = send_raw(addr, &hello, Duration::from_secs(3));
        assert!(closed, "{name}: ClientHello left the connection open");
        assert!(
            got.is_empty() || got.starts_with(b"HTTP/1.1 400"),
            "{name}: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    alive(&mut agent);
}

#[test]
fn half_open_connections_get_no_reply_and_are_counted() {
    let (agent, _kv) = dev_agent(&[]);
    let addr = agent.listen();
    for (sent, _) in [
        (&b""[..], "peer_closed"),
        (&b"be_web/srv1"[..], "no_newline"),
    ] {
        for _ in 0..20 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(sent).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            assert!(out.is_empty(), "half-open after {sent:?} got {out:?}");
        }
    }
    wait_for(Duration::from_secs(2), "half-open outcomes counted", || {
        (agent.metric(&outcome("peer_closed")) >= 20.0
            && agent.metric(&outcome("no_newline")) >= 20.0)
            .then_some(())
    });
}

#[test]
fn rst_storm_of_1000_connections_leaves_the_agent_answering() {
    let (mut agent, _kv) = dev_agent(&[]);
    let addr = agent.listen();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                for j in 0..250 {
                    let s = TcpStream::connect(addr).unwrap();
                    if (i + j) % 2 == 0 {
                        // Half of them send part of a line first.
                        let _ = (&s).write_all(b"be_web/s");
                    }
                    socket2::SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(s);
                }
            })
        })
        .collect();
    let t = Instant::now();
    for th in threads {
        th.join().unwrap();
    }
    eprintln!("RST storm: 1000 resets in {:?}", t.elapsed());
    alive(&mut agent);
    wait_for(
        Duration::from_secs(3),
        "every reset connection closed",
        || (agent.metric("gitlab_haproxy_agent_open_connections") == 0.0).then_some(()),
    );
    let ended: f64 = ["peer_closed", "no_newline", "io_error"]
        .iter()
        .map(|o| agent.metric(&outcome(o)))
        .sum();
    assert!(ended >= 1000.0, "only {ended} reset connections counted");
}
