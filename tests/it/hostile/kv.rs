//! Hostile KV contents: control bytes in keys and values, values at and past
//! the size limit, a hundred thousand keys.

use super::*;

#[test]
fn control_bytes_in_kv_keys_and_values_are_ignored_and_escaped_in_logs() {
    let (agent, _kv) = dev_agent(&[]);
    let kv = agent.dev_kv.unwrap();
    let mut bytes: Vec<u8> = (0..0x20).collect();
    bytes.push(0x7f);
    let mut bad_keys = 0;
    for &b in &bytes {
        let (st, _) = http(
            kv,
            "PUT",
            &format!("/v1/kv/{PREFIX}/ctl%{b:02X}key"),
            b"drain",
        )
        .unwrap();
        assert!(st == 200 || st == 400, "key byte {b:#04x}: {st}");
        bad_keys += usize::from(st == 200);
        let value = [b'd', b'r', b, b'a', b'i', b'n'];
        let (st, _) = http(kv, "PUT", &format!("/v1/kv/{PREFIX}/val{b:02x}"), &value).unwrap();
        assert_eq!(st, 200, "value byte {b:#04x}");
    }
    // A key holding a value that is all control bytes, and a last, normal one.
    assert_eq!(
        http(kv, "PUT", &format!("/v1/kv/{PREFIX}/allctl"), &bytes)
            .unwrap()
            .0,
        200
    );
    assert_eq!(
        http(kv, "PUT", &format!("/v1/kv/{PREFIX}/be_web/last"), b"maint")
            .unwrap()
            .0,
        200
    );
    agent.wait_reply("be_web/last", "maint 100%", Duration::from_secs(3));
    let bad_key = agent.metric("gitlab_haproxy_agent_state_invalid_keys{reason=\"bad_key\"}");
    assert_eq!(bad_key, bad_keys as f64, "keys with control bytes ignored");
    for &b in &bytes {
        // Never answered: the value is invalid (absent), the key unaskable.
        assert_eq!(
            agent.check(&format!("val{b:02x}\n")).as_deref(),
            Some("ready 100%")
        );
    }
    assert_eq!(agent.check("allctl\n").as_deref(), Some("ready 100%"));
    let log = agent.proc.log();
    logs_clean(&log);
    assert!(
        log.iter().any(|l| l.contains(r"dr\\x01ain")),
        "control byte shown escaped in the invalid-value line"
    );
    eprintln!("{} keys and {} values with control bytes: {bad_keys} keys stored and ignored, {} log lines clean", bytes.len(), bytes.len() + 1, log.len());
}

#[test]
fn values_of_512_kib_are_accepted_and_one_byte_more_is_413() {
    let (mut agent, _kv) = dev_agent(&[]);
    let kv = agent.dev_kv.unwrap();
    let mut padded = b"drain".to_vec();
    padded.resize(512 * 1024, b' ');
    assert_eq!(
        http(
            kv,
            "PUT",
            &format!("/v1/kv/{PREFIX}/be_big/padded"),
            &padded
        )
        .unwrap(),
        (200, b"true".to_vec())
    );
    let junk = vec![b'z'; 512 * 1024];
    assert_eq!(
        http(kv, "PUT", &format!("/v1/kv/{PREFIX}/be_big/junk"), &junk)
            .unwrap()
            .0,
        200
    );
    let over = vec![b'z'; 512 * 1024 + 1];
    assert_eq!(
        http(kv, "PUT", &format!("/v1/kv/{PREFIX}/be_big/over"), &over)
            .unwrap()
            .0,
        413
    );
    agent.wait_reply("be_big/padded", "drain 100%", Duration::from_secs(3));
    assert_eq!(agent.check("be_big/junk\n").as_deref(), Some("ready 100%"));
    // The invalid value is logged truncated, not 512 KiB long.
    let line = agent.proc.wait_log("be_big/junk", Duration::from_secs(2));
    assert!(line.len() < 2048, "log line of {} bytes", line.len());
    alive(&mut agent);
}

#[test]
fn one_hundred_thousand_keys() {
    const N: usize = 100_000;
    const THREADS: usize = 4;
    let kv = Kv::dev();
    let prefix = support::unique_prefix("100k");
    let t = Instant::now();
    let writers: Vec<_> = (0..THREADS)
        .map(|w| {
            let (addr, prefix) = (kv.addr, prefix.clone());
            std::thread::spawn(move || {
                let values = ["drain", "maint", "50%", "ready"];
                support::put_many(
                    addr,
                    (w..N).step_by(THREADS).map(|i| {
                        (
                            format!("{prefix}/be_{}/srv_{}", i / 100, i % 100),
                            values[i % 4],
                        )
                    }),
                )
            })
        })
        .collect();
    let written: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let put_time = t.elapsed();
    assert_eq!(written, N);

    let t = Instant::now();
    let agent = Agent::with_consul(kv.addr, &prefix, &[]);
    let first = agent
        .proc
        .wait_log("first consul read complete", Duration::from_secs(30));
    let first_read = t.elapsed();
    assert!(first.contains("\"keys\":100000"), "{first}");
    assert_eq!(agent.metric("gitlab_haproxy_agent_state_keys"), N as f64);
    assert_eq!(agent.check("be_0/srv_0\n").as_deref(), Some("drain 100%"));
    assert_eq!(
        agent.check("be_999/srv_99\n").as_deref(),
        Some("ready 100%")
    );
    assert_eq!(agent.check("be_500/srv_2\n").as_deref(), Some("ready 50%"));

    // One change: the agent re-reads all 100k keys; checks go on meanwhile.
    let addr = agent.listen();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                assert!(check(addr, b"be_1/srv_1\n").is_some());
                worst = worst.max(t.elapsed());
                n += 1;
            }
            (n, worst)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    kv.put(&format!("{prefix}/be_0/srv_0"), "maint");
    agent.wait_reply("be_0/srv_0", "maint 100%", Duration::from_secs(30));
    let change = t.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (checks, worst) = checker.join().unwrap();
    eprintln!(
        "100k keys: PUT in {put_time:?} ({:.0}/s over {THREADS} keep-alive connections); first read (fetch+decode+swap) {first_read:?}; one change visible in {change:?}; {checks} checks meanwhile, slowest {worst:?}",
        N as f64 / put_time.as_secs_f64()
    );
    assert!(
        worst < Duration::from_secs(2),
        "a check waited {worst:?} during a 100k-key swap"
    );
}
