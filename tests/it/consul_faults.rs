//! Failure behaviour (README), the rows that need only the agent and consul: the agent never
//! guesses. Each fault is injected by the proxy between the agent and the KV
//! (the dev KV, or a real consul when one is available), so the same tests
//! run against both; killing and restarting "consul" needs the dev KV.
//!
//! Every agent here runs with `-consul-wait 1s`: blocking queries return
//! within about a second, so a fault set on the proxy applies within one,
//! and the whole-response deadline is 1 s × 17/16 + 5 s ≈ 6.1 s.

use crate::support;
use crate::support::metrics::{errors, outcome, SWAPS};

use std::time::{Duration, Instant};

use crate::support::proxy::{After, Mode, Wire};
use crate::support::rig::Rig;
use crate::support::{unique_prefix, wait_for, Agent, Kv};
use gitlab_haproxy_agent::consul::error::ErrorReason;

const SYNC: Duration = Duration::from_secs(10);
/// Long enough for any backoff the faults below can build up (a few
/// failures: at most a few seconds) plus one read.
const RECOVER: Duration = Duration::from_secs(20);

const UNCHANGED: &str = "gitlab_haproxy_agent_consul_unchanged_total";
const RESETS: &str = "gitlab_haproxy_agent_consul_index_resets_total";
const INDEX: &str = "gitlab_haproxy_agent_consul_index";
const AGE: &str = "gitlab_haproxy_agent_consul_last_success_age_seconds";

/// Synced on two keys (`be/s1` drain, `be/s2` 50%).
impl Rig {
    fn two_keys(kv: Kv, test: &str, extra: &[&str]) -> Rig {
        let prefix = unique_prefix(test);
        kv.put(&format!("{prefix}/be/s1"), "drain");
        kv.put(&format!("{prefix}/be/s2"), "50%");
        let rig = Rig::start(kv, prefix, Mode::Pass, extra);
        rig.agent.wait_reply("be/s1", "drain 100%", SYNC);
        rig
    }

    fn readiness(&self) -> u16 {
        self.agent.monitoring_get("/-/readiness").0
    }

    /// The state synced in [`Rig::two_keys`] is what the agent answers.
    fn assert_last_state(&self) {
        assert_eq!(self.agent.check("be/s1\n").as_deref(), Some("drain 100%"));
        assert_eq!(self.agent.check("be/s2\n").as_deref(), Some("ready 50%"));
        assert_eq!(
            self.agent.check("be/other\n").as_deref(),
            Some("ready 100%")
        );
        assert_eq!(
            self.readiness(),
            200,
            "readiness stays 200 on the last known state"
        );
    }

    /// Injects `mode` until `reason` is counted, checks the last state is
    /// still answered, then heals the proxy and checks a write made during the
    /// fault is seen.
    fn fault_keeps_state(&self, mode: Mode, reason: &str) {
        let before = self.metric(&errors(reason));
        self.proxy.set_mode(mode);
        self.wait_metric(&errors(reason), before + 1.0, Duration::from_secs(10));
        self.assert_last_state();
        let after_error = self.proxy.requests();
        self.recovers();
        // The read after an error is non-blocking (index 0), so a change
        // made during the outage is seen at once, not after a wait. (From
        // the request before the count was taken: a retry sent just before
        // it may be the one `Pass` answers, and the read after that success
        // rightly blocks. An agent that blocked after errors sends no
        // non-blocking read at all.)
        let next = self
            .proxy
            .request_heads_since(after_error.saturating_sub(1));
        let targets: Vec<&str> = next.iter().filter_map(|h| h.lines().next()).collect();
        assert!(
            targets.iter().any(|t| !t.contains("index=")),
            "every read after an error blocks: {targets:?}"
        );
    }

    /// Back to `Pass`: a write made while the agent could not read is applied
    /// (the read after an error is non-blocking, so it is seen at once).
    fn recovers(&self) {
        self.put("be/s1", "maint");
        self.proxy.set_mode(Mode::Pass);
        self.agent.wait_reply("be/s1", "maint 100%", RECOVER);
        assert_eq!(self.readiness(), 200);
        // And the watch goes on: a write after recovery is applied too.
        self.put("be/s2", "drain");
        self.agent
            .wait_reply("be/s2", "drain 100%", Duration::from_secs(5));
    }
}

// ---- started, no complete consul read yet ----

#[test]
fn before_the_first_read_no_reply_and_not_ready() {
    let prefix = unique_prefix("not_synced");
    let kv = Kv::any();
    kv.put(&format!("{prefix}/be/s1"), "drain");
    let rig = Rig::start(kv, prefix, Mode::Refuse, &[]);
    rig.wait_metric(&errors("connect"), 1.0, Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(
            rig.agent.check("be/s1\n"),
            None,
            "no reply before the first read"
        );
    }
    assert!(rig.metric(&outcome("not_synced")) >= 3.0);
    assert_eq!(rig.readiness(), 503);
    assert_eq!(rig.metric("gitlab_haproxy_agent_synced"), 0.0);
    rig.proxy.set_mode(Mode::Pass);
    rig.agent.wait_reply("be/s1", "drain 100%", RECOVER);
    assert_eq!(rig.readiness(), 200);
    assert_eq!(rig.metric("gitlab_haproxy_agent_synced"), 1.0);
}

#[test]
fn before_the_first_read_a_stalled_consul_stays_not_ready() {
    let prefix = unique_prefix("not_synced_hold");
    let kv = Kv::any();
    kv.put(&format!("{prefix}/be/s1"), "drain");
    let rig = Rig::start(kv, prefix, Mode::Hold, &[]);
    wait_for(
        Duration::from_secs(5),
        "the first request to reach the proxy",
        || (rig.proxy.requests() > 0).then_some(()),
    );
    assert_eq!(rig.agent.check("be/s1\n"), None);
    assert_eq!(rig.readiness(), 503);
    assert!(rig.metric(&outcome("not_synced")) >= 1.0);
}

// ---- consul unreachable / refused / reset / timed out after the first read ----

#[test]
fn refused_after_sync_answers_last_state_and_recovers() {
    let rig = Rig::two_keys(Kv::any(), "refused", &[]);
    let outage_at = Instant::now();
    rig.proxy.set_mode(Mode::Refuse);
    rig.wait_metric(&errors("connect"), 2.0, Duration::from_secs(10));
    rig.assert_last_state();
    // Staleness is visible: no success since the fault began.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(outage_at.elapsed()));
    assert!(
        rig.metric(AGE) >= 1.0,
        "last success age grows during the outage"
    );
    rig.recovers();
    // One line when the outage starts, one when it ends; none per retry.
    let log = rig.agent.proc.log();
    let failed: Vec<_> = log
        .iter()
        .filter(|l| l.contains("\"msg\":\"consul read failed:"))
        .collect();
    assert_eq!(failed.len(), 1, "{log:#?}");
    // It names the address it could not reach, and why: `connect`, or
    // `reset` when the mode changed while a blocking query was held (the
    // proxy then withholds its answer and closes: a drop, not a refusal).
    // Which one depends on when the test thread runs, not on the agent.
    let want = format!(
        "\"msg\":\"consul read failed: answering from the last known state; retrying with backoff\",\"consul\":\"{}\",\"reason\":",
        rig.proxy.addr
    );
    assert!(failed[0].contains(&want), "{}", failed[0]);
    assert!(
        ["connect", "reset"]
            .iter()
            .any(|r| failed[0].contains(&format!("{want}\"{r}\""))),
        "{}",
        failed[0]
    );
    rig.agent.proc.wait_log(
        "\"msg\":\"consul reads succeed again\"",
        Duration::from_secs(1),
    );
}

#[test]
fn reset_after_sync_answers_last_state_and_recovers() {
    let rig = Rig::two_keys(Kv::any(), "reset", &[]);
    rig.fault_keeps_state(Mode::Reset, "reset");
}

#[test]
fn stalled_consul_times_out_after_wait_17_16_plus_5s() {
    let rig = Rig::two_keys(Kv::any(), "hold", &[]);
    let held_at = Instant::now();
    rig.proxy.set_mode(Mode::Hold);
    // The held request was sent at most one wait (1 s + 1/16) before the
    // mode changed: its deadline is 1 s × 17/16 + 5 s after it was sent.
    rig.wait_metric(&errors("timeout"), 1.0, Duration::from_secs(10));
    let took = held_at.elapsed();
    assert!(
        took >= Duration::from_millis(4900) && took <= Duration::from_secs(9),
        "timed out after {took:?}"
    );
    rig.assert_last_state();
    assert!(rig.metric(AGE) >= 4.0, "staleness visible");
    rig.recovers();
}

#[test]
fn slow_dripping_body_is_caught_by_the_whole_response_deadline() {
    let rig = Rig::two_keys(Kv::any(), "slowdrip", &[]);
    let start = Instant::now();
    // Any listing is over 100 bytes: more than 10 s at 100 ms a byte.
    rig.proxy
        .set_mode(Mode::SlowDrip(Duration::from_millis(100)));
    rig.wait_metric(&errors("timeout"), 1.0, Duration::from_secs(10));
    assert!(
        start.elapsed() <= Duration::from_secs(9),
        "{:?}",
        start.elapsed()
    );
    rig.assert_last_state();
    rig.recovers();
}

#[test]
fn consul_killed_then_restarted_empty_resets_the_index_and_converges() {
    // Needs the dev KV: "consul down" is killing its process.
    let mut kv = Kv::dev();
    let prefix = unique_prefix("restart");
    // Several writes, so the index is well above a fresh store's.
    for (id, v) in [
        ("be/s1", "drain"),
        ("be/s2", "50%"),
        ("be/s3", "maint"),
        ("be/s4", "ready"),
    ] {
        kv.put(&format!("{prefix}/{id}"), v);
    }
    let addr = kv.addr;
    let agent = Agent::with_consul(addr, &prefix, &["-consul-wait", "1s"]);
    agent.wait_reply("be/s1", "drain 100%", SYNC);
    let index = agent.metric(INDEX);
    assert!(index >= 4.0, "index {index}");

    drop(kv.proc.take());
    wait_for(Duration::from_secs(10), "connect errors", || {
        (agent.metric(&errors("connect")) >= 1.0).then_some(())
    });
    assert_eq!(agent.check("be/s1\n").as_deref(), Some("drain 100%"));
    assert_eq!(agent.check("be/s3\n").as_deref(), Some("maint 100%"));
    assert_eq!(agent.monitoring_get("/-/readiness").0, 200);

    // "consul" comes back on the same port with an empty KV: its index is
    // lower than the agent's, so the agent resets to 0 and re-reads.
    let kv = Kv::dev_at(addr);
    agent.wait_reply("be/s1", "ready 100%", RECOVER);
    assert_eq!(agent.check("be/s3\n").as_deref(), Some("ready 100%"));
    assert!(agent.metric(RESETS) >= 1.0);
    assert_eq!(agent.metric("gitlab_haproxy_agent_state_keys"), 0.0);
    agent.proc.wait_log(
        "\"msg\":\"X-Consul-Index went backwards",
        Duration::from_secs(1),
    );
    kv.put(&format!("{prefix}/be/s2"), "drain");
    agent.wait_reply("be/s2", "drain 100%", Duration::from_secs(5));
}

// ---- consul answers 4xx/5xx, garbage JSON, a truncated body, a bad index ----

#[test]
fn http_500_keeps_last_state() {
    let rig = Rig::two_keys(Kv::any(), "http500", &[]);
    rig.fault_keeps_state(Mode::Status(500), "http_5xx");
}

#[test]
fn http_429_keeps_last_state() {
    let rig = Rig::two_keys(Kv::any(), "http429", &[]);
    rig.fault_keeps_state(Mode::Status(429), "http_4xx");
}

#[test]
fn http_403_keeps_last_state_and_is_logged_as_a_configuration_error() {
    let rig = Rig::two_keys(Kv::any(), "http403", &[]);
    // 403 is retried no faster than every 10 s: recovery takes that long.
    rig.fault_keeps_state(Mode::Status(403), "http_4xx");
    let line = rig.agent.proc.wait_log(
        "\"msg\":\"consul refused the request",
        Duration::from_secs(1),
    );
    assert!(
        line.contains("\"level\":\"error\"") && line.contains("ACL not found"),
        "{line}"
    );
}

#[test]
fn garbage_json_keeps_last_state() {
    let rig = Rig::two_keys(Kv::any(), "garbage", &[]);
    let swaps = rig.metric(SWAPS);
    rig.proxy.set_mode(Mode::GarbageBody);
    rig.wait_metric(&errors("bad_body"), 1.0, Duration::from_secs(10));
    rig.assert_last_state();
    assert_eq!(
        rig.metric(SWAPS),
        swaps,
        "a body that does not decode is never swapped in"
    );
    rig.recovers();
}

#[test]
fn truncated_body_keeps_last_state() {
    let rig = Rig::two_keys(Kv::any(), "truncate", &[]);
    rig.fault_keeps_state(Mode::Truncate, "bad_body");
}

#[test]
fn missing_index_keeps_last_state() {
    let rig = Rig::two_keys(Kv::any(), "noindex", &[]);
    rig.fault_keeps_state(Mode::MissingIndex, "bad_index");
}

#[test]
fn non_numeric_index_keeps_last_state() {
    let rig = Rig::two_keys(Kv::any(), "badindex", &[]);
    rig.fault_keeps_state(Mode::IndexValue("12abc"), "bad_index");
}

#[test]
fn body_past_max_body_bytes_is_too_large_and_keeps_last_state() {
    let rig = Rig::two_keys(Kv::any(), "too_large", &["-consul-max-body-bytes", "65536"]);
    rig.fault_keeps_state(Mode::OversizeBody(1 << 20), "too_large");
}

#[test]
fn body_past_max_body_bytes_before_the_first_read_stays_not_ready() {
    let prefix = unique_prefix("too_large_first");
    let kv = Kv::any();
    kv.put(&format!("{prefix}/be/s1"), "drain");
    let rig = Rig::start(
        kv,
        prefix,
        Mode::OversizeBody(1 << 20),
        &["-consul-max-body-bytes", "65536"],
    );
    rig.wait_metric(&errors("too_large"), 1.0, Duration::from_secs(10));
    assert_eq!(rig.agent.check("be/s1\n"), None);
    assert_eq!(rig.readiness(), 503);
    rig.proxy.set_mode(Mode::Pass);
    rig.agent.wait_reply("be/s1", "drain 100%", RECOVER);
}

#[test]
fn a_real_listing_past_max_body_bytes_is_too_large() {
    // No proxy trick: the KV itself holds more than the bound.
    let rig = Rig::two_keys(
        Kv::any(),
        "too_large_real",
        &["-consul-max-body-bytes", "2048"],
    );
    let before = rig.metric(&errors("too_large"));
    rig.put("be/big", &"x".repeat(4096));
    rig.wait_metric(&errors("too_large"), before + 1.0, Duration::from_secs(10));
    rig.assert_last_state();
}

// ---- X-Consul-Index goes backwards / stays the same ----

#[test]
fn index_backwards_resets_to_zero_and_refetches() {
    let rig = Rig::two_keys(Kv::any(), "backwards", &[]);
    let seen = rig.proxy.requests();
    rig.proxy.set_mode(Mode::BackwardsIndex);
    rig.wait_metric(RESETS, 1.0, Duration::from_secs(10));
    // After the reset the agent re-reads at once, non-blocking (no index),
    // and takes the lower index as its own.
    wait_for(
        Duration::from_secs(5),
        "index 1 taken after the reset",
        || (rig.metric(INDEX) == 1.0).then_some(()),
    );
    // The blocking query in flight got the lower index; the next read is
    // non-blocking; then the agent blocks on the lower index.
    wait_for(
        Duration::from_secs(5),
        "a blocking query on index 1",
        || {
            let lines: Vec<String> = rig
                .proxy
                .request_heads_since(seen)
                .iter()
                .map(|h| h.lines().next().unwrap_or("").to_owned())
                .collect();
            let reread = lines.iter().position(|l| !l.contains("index="))?;
            lines[reread..]
                .iter()
                .any(|l| l.contains("index=1&"))
                .then_some(())
        },
    );
    rig.assert_last_state();
    rig.recovers();
    assert!(rig.metric(INDEX) > 1.0, "the real index is taken again");
}

#[test]
fn index_unchanged_does_not_swap_and_does_not_spin() {
    let rig = Rig::two_keys(Kv::any(), "unchanged", &[]);
    let swaps = rig.metric(SWAPS);
    let unchanged = rig.metric(UNCHANGED);
    rig.proxy.set_mode(Mode::Immediate);
    // Let a request already held upstream come back, then count.
    std::thread::sleep(Duration::from_millis(1200));
    let requests = rig.proxy.requests();
    std::thread::sleep(Duration::from_secs(2));
    let during = rig.proxy.requests() - requests;
    eprintln!("requests in 2 s against an always-returning consul: {during}");
    // At least 100 ms apart and a token bucket (burst 5, 1/s): a consul
    // answering every blocking query at once gets a handful, not thousands.
    assert!(during <= 30, "{during} requests in 2 s: hot loop");
    assert!(during >= 1, "{during} requests in 2 s: the loop stopped");
    assert!(rig.metric(UNCHANGED) >= unchanged + 2.0);
    assert_eq!(rig.metric(SWAPS), swaps, "an unchanged index never swaps");
    assert_eq!(rig.metric(&errors("bad_index")), 0.0);
    rig.assert_last_state();
    rig.recovers();
}

// ---- prefix has no keys / one invalid value ----

#[test]
fn empty_prefix_is_a_valid_empty_state() {
    let prefix = unique_prefix("empty");
    let rig = Rig::start(Kv::any(), prefix, Mode::Pass, &[]);
    rig.agent.wait_reply("be/s1", "ready 100%", SYNC);
    assert_eq!(
        rig.agent.check("anything at all\n").as_deref(),
        Some("ready 100%")
    );
    assert_eq!(rig.readiness(), 200);
    assert_eq!(rig.metric("gitlab_haproxy_agent_state_keys"), 0.0);
    assert_eq!(
        rig.metric("gitlab_haproxy_agent_consul_errors_total{reason=\"http_4xx\"}"),
        0.0,
        "404 is not an error"
    );
    // Keys come, then all go (404 again, with a higher index): ready again.
    rig.put("be/s1", "drain");
    rig.agent
        .wait_reply("be/s1", "drain 100%", Duration::from_secs(5));
    rig.kv.delete_tree(&format!("{}/", rig.prefix));
    rig.agent
        .wait_reply("be/s1", "ready 100%", Duration::from_secs(5));
    assert_eq!(rig.metric("gitlab_haproxy_agent_state_keys"), 0.0);
}

#[test]
fn one_invalid_value_drops_only_that_key() {
    let prefix = unique_prefix("one_invalid");
    let kv = Kv::any();
    kv.put(&format!("{prefix}/be/s1"), "drain");
    kv.put(&format!("{prefix}/be/bad"), "up");
    kv.put(&format!("{prefix}/be/s3"), "maint");
    let rig = Rig::start(kv, prefix, Mode::Pass, &[]);
    rig.agent.wait_reply("be/s1", "drain 100%", SYNC);
    assert_eq!(rig.agent.check("be/bad\n").as_deref(), Some("ready 100%"));
    assert_eq!(rig.agent.check("be/s3\n").as_deref(), Some("maint 100%"));
    assert_eq!(
        rig.metric("gitlab_haproxy_agent_invalid_values_total{reason=\"health_word\"}"),
        1.0
    );
    assert_eq!(
        rig.metric("gitlab_haproxy_agent_state_invalid_keys{reason=\"health_word\"}"),
        1.0
    );
    assert_eq!(rig.metric("gitlab_haproxy_agent_state_keys"), 2.0);
    // Fixing it applies it.
    rig.put("be/bad", "50%");
    rig.agent
        .wait_reply("be/bad", "ready 50%", Duration::from_secs(5));
    assert_eq!(
        rig.metric("gitlab_haproxy_agent_state_invalid_keys{reason=\"health_word\"}"),
        0.0
    );
}

// ---- a large state over every framing, closed or reset after ----

/// Past 4,096 entries a listing is decoded in slices over several loop
/// turns (and past 1 MiB read over several): the rows of the issue "No
/// peer but haproxy can stop the answers" (1). On the old client
/// `Connection: close`, HTTP/1.0 and a stray byte aborted the process, and
/// a close after a keep-alive response threw the listing away forever.
const LARGE: usize = 12_000;

/// An agent synced on [`LARGE`] keys (`be/sN` = ready) through the proxy.
fn large_rig(test: &str) -> Rig {
    let kv = Kv::any();
    let prefix = unique_prefix(test);
    let written = support::put_many(
        kv.addr,
        (0..LARGE).map(|i| (format!("{prefix}/be/s{i}"), "ready")),
    );
    assert_eq!(written, LARGE);
    let rig = Rig::start(kv, prefix, Mode::Pass, &[]);
    let line = rig
        .agent
        .proc
        .wait_log("first consul read complete", Duration::from_secs(30));
    assert!(line.contains(&format!("\"keys\":{LARGE}")), "{line}");
    rig
}

fn all_errors(rig: &Rig) -> f64 {
    ErrorReason::ALL
        .iter()
        .map(|r| rig.metric(&errors(r.label())))
        .sum()
}

/// Every ending after a `wire` response of the whole large state: each
/// change is applied, nothing is counted as an error, the agent stays up
/// and ready. A close-delimited body ends only at the close: a reset there
/// is a `reset` error (last state kept), and the next read converges.
fn large_state_over(wire: Wire) {
    let rig = large_rig(&format!("large_{wire:?}"));
    let afters: &[After] = if wire == Wire::CloseDelimited {
        &[After::Fin, After::Reset]
    } else {
        &[After::Keep, After::Fin, After::Reset, After::StrayByte]
    };
    let values = [
        ("drain", "drain 100%"),
        ("maint", "maint 100%"),
        ("50%", "ready 50%"),
    ];
    for (step, &after) in afters.iter().enumerate() {
        let errors_before = all_errors(&rig);
        rig.proxy.set_mode(Mode::Reframe(wire, after));
        let (value, reply) = values[step % values.len()];
        let identity = format!("be/s{}", step * 1000 + 7);
        rig.put(&identity, value);
        if (wire, after) == (Wire::CloseDelimited, After::Reset) {
            rig.wait_metric(&errors("reset"), 1.0, Duration::from_secs(10));
            assert_eq!(rig.readiness(), 200);
            rig.proxy.set_mode(Mode::Pass);
            rig.agent.wait_reply(&identity, reply, RECOVER);
            continue;
        }
        rig.agent
            .wait_reply(&identity, reply, Duration::from_secs(15));
        assert_eq!(
            all_errors(&rig),
            errors_before,
            "{wire:?} then {after:?}: counted as an error"
        );
        assert_eq!(rig.readiness(), 200, "{wire:?} then {after:?}");
        assert_eq!(rig.metric("gitlab_haproxy_agent_state_keys"), LARGE as f64);
    }
    // And the watch goes on over a plain connection.
    rig.proxy.set_mode(Mode::Pass);
    rig.put("be/s1", "maint");
    rig.agent
        .wait_reply("be/s1", "maint 100%", Duration::from_secs(15));
}

#[test]
fn large_state_content_length_then_keep_fin_rst_or_stray_byte() {
    large_state_over(Wire::ContentLength);
}

#[test]
fn large_state_chunked_with_extensions_and_trailers_then_keep_fin_rst_or_stray_byte() {
    large_state_over(Wire::Chunked);
}

#[test]
fn large_state_close_delimited_then_fin_or_rst() {
    large_state_over(Wire::CloseDelimited);
}

#[test]
fn large_state_http10_then_keep_fin_rst_or_stray_byte() {
    large_state_over(Wire::Http10);
}

#[test]
fn large_state_connection_close_then_keep_fin_rst_or_stray_byte() {
    large_state_over(Wire::ConnectionClose);
}

#[test]
fn large_state_after_100_continue_and_103_early_hints_then_keep_fin_rst_or_stray_byte() {
    large_state_over(Wire::InterimFirst);
}
