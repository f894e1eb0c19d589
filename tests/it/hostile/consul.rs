//! A hostile consul: deep or huge JSON, control bytes in keys, an answer that
//! never ends, every status class.

use super::*;

type Responder = Arc<dyn Fn(&mut TcpStream) + Send + Sync>;

/// A fake consul: answers every request on every connection with the next
/// scripted response, then repeats the last one. Returns its address.
fn fake_consul(script: Vec<Responder>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let script = Arc::new(script);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            let (next, script) = (Arc::clone(&next), Arc::clone(&script));
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    buf.drain(..end);
                    let i = next
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        .min(script.len() - 1);
                    script[i](&mut conn);
                }
            });
        }
    });
    addr
}

fn body_response(index: u64, body: Vec<u8>) -> Responder {
    Arc::new(move |c: &mut TcpStream| {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Consul-Index: {index}\r\nContent-Length: {}\r\n\r\n", body.len());
        let _ = c.write_all(head.as_bytes());
        let _ = c.write_all(&body);
    })
}

fn nested(depth: usize) -> Vec<u8> {
    let mut v = vec![b'['; depth];
    v.extend(std::iter::repeat_n(b']', depth));
    v
}

/// 60 MiB announced and streamed until the agent hangs up.
fn huge_response(index: u64) -> Responder {
    Arc::new(move |c: &mut TcpStream| {
        let total = 60usize << 20;
        let head = format!(
            "HTTP/1.1 200 OK\r\nX-Consul-Index: {index}\r\nContent-Length: {total}\r\n\r\n["
        );
        let _ = c.write_all(head.as_bytes());
        let filler = br#"{"Key":"fake/be/x","Value":"ZHJhaW4=","ModifyIndex":1},"#.repeat(1024);
        let mut sent = 1;
        while sent + filler.len() < total {
            if c.write_all(&filler).is_err() {
                return;
            }
            sent += filler.len();
        }
    })
}

#[test]
fn deep_or_huge_json_before_the_first_read_leaves_the_agent_up_and_not_ready() {
    let consul = fake_consul(vec![
        body_response(3, nested(100_000)),
        body_response(
            4,
            [
                b"{\"a\":".repeat(100_000),
                b"1".to_vec(),
                b"}".repeat(100_000),
            ]
            .concat(),
        ),
        huge_response(5),
    ]);
    let mut agent = Agent::with_consul(consul, "fake", &["-consul-max-body-bytes", "1048576"]);
    wait_for(
        Duration::from_secs(10),
        "bad_body x2 and too_large x2",
        || {
            (agent.metric("gitlab_haproxy_agent_consul_errors_total{reason=\"bad_body\"}") >= 2.0
                && agent.metric("gitlab_haproxy_agent_consul_errors_total{reason=\"too_large\"}")
                    >= 2.0)
                .then_some(())
        },
    );
    assert!(
        agent.proc.child.try_wait().unwrap().is_none(),
        "agent died on hostile JSON"
    );
    assert_eq!(agent.monitoring_get("/-/readiness").0, 503);
    assert_eq!(
        agent.check("be/srv1\n"),
        None,
        "answered before a first good read"
    );
    assert_eq!(agent.metric("gitlab_haproxy_agent_synced"), 0.0);
}

/// consul stores keys with any byte; the dev KV refuses control bytes in
/// keys, so a fake consul serves them (JSON `\u00XX` escapes).
#[test]
fn control_bytes_in_keys_from_consul_are_ignored_and_escaped_in_logs() {
    let mut entries = Vec::new();
    let mut bytes: Vec<u8> = (0..0x20).collect();
    bytes.push(0x7f);
    for &b in &bytes {
        entries.push(format!(
            r#"{{"Key":"fake/ctl\u{b:04x}key","Value":"ZHJhaW4=","ModifyIndex":5}}"#
        ));
        entries.push(format!(
            r#"{{"Key":"fake/\u{b:04x}","Value":"ZHJhaW4=","ModifyIndex":5}}"#
        ));
    }
    entries.push(r#"{"Key":"fake/be/srv1","Value":"bWFpbnQ=","ModifyIndex":5}"#.to_owned());
    let body = format!("[{}]", entries.join(",")).into_bytes();
    let consul = fake_consul(vec![body_response(5, body)]);
    let agent = Agent::with_consul(consul, "fake", &[]);
    agent.wait_reply("be/srv1", "maint 100%", Duration::from_secs(5));
    let bad = agent.metric("gitlab_haproxy_agent_state_invalid_keys{reason=\"bad_key\"}");
    // Whole-identity control bytes and embedded ones: all unaskable.
    assert_eq!(
        bad,
        2.0 * bytes.len() as f64,
        "keys with control bytes ignored"
    );
    assert_eq!(agent.metric("gitlab_haproxy_agent_state_keys"), 1.0);
    // Control byte shown escaped in the bad-key line (the log reaches us
    // through a queue, a thread and a pipe: after the metric, maybe).
    agent.proc.wait_log(r"ctl\\x01key", Duration::from_secs(5));
    logs_clean(&agent.proc.log());
}

#[test]
fn deep_or_huge_json_after_a_good_read_keeps_the_last_state() {
    let good = br#"[{"Key":"fake/be/srv1","Value":"ZHJhaW4=","ModifyIndex":5}]"#.to_vec();
    // Unknown fields are skipped (as consul clients do), even 100,000 levels deep: no
    // stack overflow, and the entry beside it applies.
    let deep_field = [
        br#"[{"Key":"fake/be/srv1","Value":"bWFpbnQ=","ModifyIndex":8,"Extra":"#.to_vec(),
        nested(100_000),
        b"}]".to_vec(),
    ]
    .concat();
    let consul = fake_consul(vec![
        body_response(5, good),
        body_response(6, nested(100_000)),
        huge_response(7),
        huge_response(7),
        body_response(8, deep_field),
    ]);
    let agent = Agent::with_consul(consul, "fake", &["-consul-max-body-bytes", "1048576"]);
    agent.wait_reply("be/srv1", "drain 100%", Duration::from_secs(5));
    wait_for(Duration::from_secs(10), "bad_body and too_large", || {
        (agent.metric("gitlab_haproxy_agent_consul_errors_total{reason=\"bad_body\"}") >= 1.0
            && agent.metric("gitlab_haproxy_agent_consul_errors_total{reason=\"too_large\"}")
                >= 2.0)
            .then_some(())
    });
    assert_eq!(agent.check("be/srv1\n").as_deref(), Some("drain 100%"));
    assert_eq!(agent.monitoring_get("/-/readiness").0, 200);
    agent.wait_reply("be/srv1", "maint 100%", Duration::from_secs(10));
    logs_clean(&agent.proc.log());
}

/// A response of this status (head only, `Content-Length: 0`).
fn status_response(status: &'static str) -> Responder {
    Arc::new(move |c: &mut TcpStream| {
        let head =
            format!("HTTP/1.1 {status}\r\nLocation: https://consul/\r\nContent-Length: 0\r\n\r\n");
        let _ = c.write_all(head.as_bytes());
    })
}

/// Regression (issue "No peer but haproxy can stop the answers", 6): the
/// whole-response deadline was skipped while the read budget kept running
/// out, so a consul (or a proxy) that never stops sending (here chunk
/// extensions: no body, endless framing) was read for gigabytes and never
/// timed out. Now it is cut by the deadline or, reading faster than that,
/// by the wire bound (2 × the body bound + 64 KiB), whichever comes first.
#[test]
fn a_consul_that_never_stops_sending_is_cut_by_the_deadline_or_the_wire_bound() {
    let good = br#"[{"Key":"fake/be/srv1","Value":"ZHJhaW4=","ModifyIndex":5}]"#.to_vec();
    let endless: Responder = Arc::new(|c: &mut TcpStream| {
        let head = "HTTP/1.1 200 OK\r\nX-Consul-Index: 6\r\nTransfer-Encoding: chunked\r\n\r\n";
        let _ = c.write_all(head.as_bytes());
        let ext = format!("1;{}\r\n \r\n", "e".repeat(1000)).repeat(64);
        let t = Instant::now();
        // Bounded here too: the test must stop by itself.
        while t.elapsed() < Duration::from_secs(30) {
            if c.write_all(ext.as_bytes()).is_err() {
                return;
            }
        }
    });
    let consul = fake_consul(vec![body_response(5, good), endless]);
    let agent = Agent::with_consul(consul, "fake", &["-consul-wait", "1s"]);
    agent.wait_reply("be/srv1", "drain 100%", Duration::from_secs(5));
    let t = Instant::now();
    let cut = || {
        ["timeout", "too_large"]
            .iter()
            .map(|r| {
                agent.metric(&format!(
                    "gitlab_haproxy_agent_consul_errors_total{{reason=\"{r}\"}}"
                ))
            })
            .sum::<f64>()
    };
    wait_for(Duration::from_secs(12), "the response cut", || {
        (cut() >= 1.0).then_some(())
    });
    // 1 s × 17/16 + 5 s from the request's start.
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
    assert_eq!(agent.check("be/srv1\n").as_deref(), Some("drain 100%"));
    assert_eq!(agent.monitoring_get("/-/readiness").0, 200);
}

/// Regression (issue 11, 9): `100 Continue` before the response was
/// `bad_body`, 3xx was `http_5xx`, and a 429 was logged at error level as
/// an ACL problem. Now 1xx is skipped, a redirect is a configuration error
/// (`http_4xx`, logged at error level), and 429 is throttling (`http_4xx`,
/// a warning).
#[test]
fn status_classes_from_consul() {
    let good = br#"[{"Key":"fake/be/srv1","Value":"ZHJhaW4=","ModifyIndex":5}]"#.to_vec();
    let interim_then_good: Responder = {
        let inner = body_response(
            6,
            br#"[{"Key":"fake/be/srv1","Value":"bWFpbnQ=","ModifyIndex":6}]"#.to_vec(),
        );
        Arc::new(move |c: &mut TcpStream| {
            let _ = c.write_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n");
            inner(c);
        })
    };
    let consul = fake_consul(vec![
        body_response(5, good),
        status_response("429 Too Many Requests"),
        interim_then_good,
        status_response("301 Moved Permanently"),
    ]);
    let agent = Agent::with_consul(consul, "fake", &["-consul-wait", "1s"]);
    agent.wait_reply("be/srv1", "maint 100%", Duration::from_secs(10));
    let errors = |r: &str| {
        agent.metric(&format!(
            "gitlab_haproxy_agent_consul_errors_total{{reason=\"{r}\"}}"
        ))
    };
    wait_for(Duration::from_secs(10), "the redirect counted", || {
        (errors("http_4xx") >= 2.0).then_some(())
    });
    assert_eq!(errors("bad_body"), 0.0, "1xx counted as a bad body");
    assert_eq!(errors("http_5xx"), 0.0, "3xx counted as http_5xx");
    // The line travels a queue, a thread and a pipe: after the metric, maybe.
    agent
        .proc
        .wait_log("consul refused the request", Duration::from_secs(5));
    let log = agent.proc.log();
    let refused: Vec<_> = log
        .iter()
        .filter(|l| l.contains("consul refused the request"))
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "only the redirect is a configuration error: {refused:?}"
    );
    assert!(refused[0].contains("HTTP 301"), "{}", refused[0]);
    assert!(refused[0].contains("\"level\":\"error\""), "{}", refused[0]);
}
