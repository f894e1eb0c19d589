//! Hostile HTTP peers (issue "No peer but haproxy can stop the answers"):
//! pipelining floods, slowloris, oversized bodies, clients that never read.

use super::*;

const DROPPED: &str = "gitlab_haproxy_agent_http_connections_dropped_total";

fn dropped(listener: &str, reason: &str) -> String {
    format!("{DROPPED}{{listener=\"{listener}\",reason=\"{reason}\"}}")
}

/// Lets this test process open thousands of sockets.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit on our own process with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// GET on a fresh connection, answered within a second.
fn get_within_1s(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Regression (issue 11, 2 and 3): one connection pipelining requests was
/// served request after request with no per-turn budget (agent checks
/// waited seconds), and every response pushed a timer record kept 60 s.
#[test]
fn a_pipelining_flood_on_monitoring_neither_delays_checks_nor_grows_memory() {
    let (agent, _kv) = dev_agent(&[]);
    let pid = agent.proc.pid();
    let mon = agent.monitoring.unwrap();
    let idle = rss_kib(pid);
    let checks = Checker::start(agent.listen());
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut w = connect(mon);
                let mut r = w.try_clone().unwrap();
                r.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                let reader = std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    let mut bytes = 0u64;
                    loop {
                        match r.read(&mut buf) {
                            Ok(0) => return bytes,
                            Ok(n) => bytes += n as u64,
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                            Err(e) if e.kind() == ErrorKind::TimedOut => {}
                            Err(_) => return bytes,
                        }
                    }
                });
                w.set_write_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                let batch = b"GET /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n".repeat(500);
                while !stop.load(Ordering::Relaxed) {
                    match w.write_all(&batch) {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == ErrorKind::TimedOut => {}
                        Err(_) => break,
                    }
                }
                let _ = w.shutdown(std::net::Shutdown::Both);
                reader.join().unwrap()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let live = get_within_1s(mon, "/-/liveness");
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let bytes: u64 = flooders.into_iter().map(|f| f.join().unwrap()).sum();
    let (p99, max) = checks.finish("pipelining flood");
    let grown = rss_kib(pid).saturating_sub(idle);
    // A liveness response is about 120 bytes.
    let served = bytes / 120;
    eprintln!("pipelining flood: ~{served} responses in 3 s; checks p99 {p99:?} max {max:?}; RSS +{grown} KiB");
    assert!(served > 20_000, "the flood was not one ({served})");
    assert_eq!(
        live,
        Some(200),
        "liveness on a new connection during the flood"
    );
    assert!(p99 < CHECK_P99, "checks p99 {p99:?}");
    assert!(max < CHECK_MAX, "a check waited {max:?}");
    assert!(grown < 4096, "RSS grew {grown} KiB");
}

/// Regression (issue 11, 5): the HTTP listeners shared 1,024 slots with
/// no head deadline: 1,024 connections each sending `G` refused liveness
/// for 60 s. Now each listener has its own pool; a full pool evicts the
/// oldest connection without a complete request; a head must be complete
/// within 5 s of its first byte.
#[test]
fn slowloris_on_every_http_listener_leaves_each_one_answering() {
    raise_nofile();
    let (agent, _kv) = dev_agent(&[]);
    let pid = agent.proc.pid();
    let idle = rss_kib(pid);
    let (mon, pprof, kv) = (
        agent.monitoring.unwrap(),
        agent.pprof.unwrap(),
        agent.dev_kv.unwrap(),
    );
    let checks = Checker::start(agent.listen());
    let mut held = Vec::new();
    for addr in [mon, pprof, kv] {
        for _ in 0..1100 {
            if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                let _ = s.write_all(b"G");
                held.push(s);
            }
        }
    }
    // Every listener answers a new client at once, several times over.
    for _ in 0..5 {
        assert_eq!(get_within_1s(mon, "/-/liveness"), Some(200), "liveness");
        assert_eq!(get_within_1s(pprof, "/debug/state"), Some(200), "pprof");
        assert!(matches!(get_within_1s(kv, "/v1/kv/x"), Some(404)), "dev KV");
    }
    let (p99, max) = checks.finish("slowloris");
    let grown = rss_kib(pid).saturating_sub(idle);
    let evicted = agent.metric(&dropped("monitoring", "evicted"));
    eprintln!("slowloris: {} held; checks p99 {p99:?} max {max:?}; RSS +{grown} KiB; {evicted} evicted on monitoring", held.len());
    assert!(evicted >= 800.0, "monitoring evictions: {evicted}");
    let warned = agent.proc.log();
    let warned: Vec<_> = warned
        .iter()
        .filter(|l| l.contains("HTTP connection pool full"))
        .collect();
    assert!(
        !warned.is_empty() && warned.len() <= 3,
        "pool-full warnings (rate-limited): {warned:?}"
    );
    assert!(p99 < CHECK_P99, "checks p99 {p99:?}");
    assert!(grown < 8192, "RSS grew {grown} KiB");
    // The head deadline closes what is left of them.
    wait_metric(
        &agent,
        &dropped("monitoring", "timeout"),
        |v| v >= 100.0,
        Duration::from_secs(10),
    );
    wait_metric(
        &agent,
        &dropped("dev_kv", "timeout"),
        |v| v >= 100.0,
        Duration::from_secs(2),
    );
}

/// Regression (issue 11, 4): GET-only listeners read request bodies up to
/// the dev KV's 1 MiB: 1,000 connections each one byte short of a 1 MiB
/// body on `/-/liveness` took RSS to 1 GB. Now a body past 1 KiB on a
/// route that takes none is refused at the head (413) and the connection
/// closed.
#[test]
fn oversized_bodies_on_get_routes_are_refused_at_the_head() {
    raise_nofile();
    let (agent, _kv) = dev_agent(&[]);
    let pid = agent.proc.pid();
    let idle = rss_kib(pid);
    let checks = Checker::start(agent.listen());
    let body = vec![b'x'; 64 * 1024];
    let mut held = Vec::new();
    let mut refused = 0;
    for (addr, req) in [
        (agent.monitoring.unwrap(), "POST /-/liveness"),
        (agent.dev_kv.unwrap(), "GET /v1/kv/x"),
    ] {
        for _ in 0..500 {
            let mut s = connect(addr);
            s.set_write_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let head = format!("{req} HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n");
            let _ = s.write_all(head.as_bytes());
            for _ in 0..16 {
                if s.write_all(&body).is_err() {
                    break;
                }
            }
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut status = [0u8; 12];
            if s.read_exact(&mut status).is_ok() && &status[9..12] == b"413" {
                refused += 1;
            }
            held.push(s);
        }
    }
    let (p99, max) = checks.finish("oversized bodies");
    let grown = rss_kib(pid).saturating_sub(idle);
    eprintln!("oversized bodies: {refused} of 1000 refused with 413; checks p99 {p99:?} max {max:?}; RSS +{grown} KiB");
    assert_eq!(refused, 1000);
    assert!(p99 < CHECK_P99, "checks p99 {p99:?}");
    assert!(grown < 8192, "RSS grew {grown} KiB");
    assert_eq!(
        get_within_1s(agent.monitoring.unwrap(), "/-/liveness"),
        Some(200)
    );
}

/// Reviewer's finding: the per-connection budget (16 requests a turn)
/// times a full monitoring pool let one turn render thousands of
/// `/-/metrics` (about 0.1 ms each): checks waited 0.4 s a turn. All HTTP
/// connections together now get 64 requests a turn.
#[test]
fn many_connections_pipelining_metrics_without_reading_do_not_stall_checks() {
    raise_nofile();
    let (agent, _kv) = dev_agent(&[]);
    let mon = agent.monitoring.unwrap();
    let checks = Checker::start(agent.listen());
    let batch = b"GET /-/metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(200);
    let mut held = Vec::new();
    for _ in 0..100 {
        let mut s = connect(mon);
        s.set_write_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let _ = s.write_all(&batch);
        held.push(s);
    }
    std::thread::sleep(Duration::from_secs(2));
    let live = get_within_1s(mon, "/-/liveness");
    let (p99, max) = checks.finish("metrics flood");
    eprintln!("metrics flood from 100 connections: checks p99 {p99:?} max {max:?}");
    assert!(p99 < CHECK_P99, "checks p99 {p99:?}");
    assert!(max < CHECK_MAX, "a check waited {max:?}");
    assert_eq!(live, Some(200));
}
