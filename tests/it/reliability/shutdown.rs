//! Shutdown and restart: SIGTERM and SIGINT finish what is in flight, a
//! restart answers nothing before its first consul read, memory per idle
//! connection, no CPU spent in an accept pause.

use super::*;

#[test]
fn sigterm_stops_accepting_finishes_in_flight_and_exits_0() {
    shutdown_with_in_flight(libc::SIGTERM, false);
}

#[test]
fn sigint_stops_accepting_finishes_in_flight_and_exits_0() {
    shutdown_with_in_flight(libc::SIGINT, true);
}

#[test]
fn restarted_agent_answers_nothing_until_its_first_consul_read() {
    let port = free_port();
    let kv_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let prefix = support::unique_prefix("restart");
    let key = format!("{prefix}/be_web/srv1");
    let kv = Kv::dev_at(kv_addr);
    kv.put(&key, "drain");
    let first = Agent::with_consul(kv_addr, &prefix, &[]);
    first.wait_reply("be_web/srv1", "drain 100%", Duration::from_secs(5));
    drop(first);
    drop(kv);

    // Restarted while consul is down: no reply (never a guessed
    // `ready 100%`), not ready.
    let agent = Agent::with_consul(kv_addr, &prefix, &[]);
    for _ in 0..5 {
        assert_eq!(agent.check("be_web/srv1\n"), None);
        assert_eq!(agent.check("be_web/other\n"), None);
    }
    assert_eq!(agent.monitoring_get("/-/readiness").0, 503);
    assert!(agent.metric(NOT_SYNCED) >= 10.0);

    let kv = Kv::dev_at(kv_addr);
    kv.put(&key, "drain");
    agent.wait_reply("be_web/srv1", "drain 100%", Duration::from_secs(10));
    assert_eq!(agent.monitoring_get("/-/readiness").0, 200);
    assert_eq!(agent.check("be_web/other\n").as_deref(), Some("ready 100%"));
}

#[test]
fn memory_per_idle_connection_is_under_1_kib() {
    const N: usize = 1000;
    let (agent, _kv) = dev_agent(&["-read-timeout", "60s"]);
    let pid = agent.proc.pid();
    let addr = agent.listen();
    // Warm up the monitoring path so its buffers are not counted.
    agent.metric(OPEN);
    let rss0 = rss_kib(pid);
    let _silent = open_idle(addr, N, b"");
    wait_metric(&agent, OPEN, |v| v == N as f64, Duration::from_secs(5));
    let rss1 = rss_kib(pid);
    // Partial lines allocate their buffer: 200 bytes each.
    let _partial = open_idle(addr, N, &[b'x'; 200]);
    wait_metric(
        &agent,
        OPEN,
        |v| v == 2.0 * N as f64,
        Duration::from_secs(5),
    );
    let rss2 = rss_kib(pid);
    let silent_each = (rss1.saturating_sub(rss0)) * 1024 / N as u64;
    let partial_each = (rss2.saturating_sub(rss1)) * 1024 / N as u64;
    eprintln!("RSS {rss0} KiB idle; +{N} silent: {rss1} KiB ({silent_each} B each); +{N} with 200-byte partial lines: {rss2} KiB ({partial_each} B each)");
    assert!(silent_each < 1024, "{silent_each} B per silent connection");
    assert!(
        partial_each < 1024,
        "{partial_each} B per partial-line connection"
    );
    let (st, _) = http(agent.monitoring.unwrap(), "GET", "/-/liveness", b"").unwrap();
    assert_eq!(st, 200);
}

/// Regression (issue "No peer but haproxy can stop the answers", 7): a
/// SIGTERM during an accept pause (EMFILE) left the pause's past instant as
/// the poll deadline, and the loop spun for the whole shutdown grace.
#[test]
fn sigterm_during_an_accept_pause_costs_no_cpu() {
    let (mut agent, _kv) = dev_agent(&["-read-timeout", "30s"]);
    let pid = agent.proc.pid();
    let limit = limit_fds(pid, fd_count(pid) + 8);
    let _conns = open_idle(agent.listen(), 20, b"be_web/sr");
    wait_for(
        Duration::from_secs(5),
        "agent to run out of descriptors",
        || (fd_count(pid) as u64 >= limit).then_some(()),
    );
    // Connections still in the backlog: accept fails, accepting pauses.
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(pid).unwrap();
    agent.proc.signal(libc::SIGTERM);
    agent.proc.wait_log("shutting down", Duration::from_secs(2));
    // The idle connections hold the exit until the grace (5 s) ends.
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(pid).unwrap() - before;
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    eprintln!("{used} of {} ticks of CPU in 3 s of shutdown", ticks * 3);
    assert!(
        used * 5 < ticks * 3,
        "{used} ticks of CPU in 3 s of shutdown: a busy loop"
    );
    let status = agent
        .proc
        .wait_exit(Duration::from_secs(5))
        .expect("exits after the grace");
    assert_eq!(status.code(), Some(0));
}
