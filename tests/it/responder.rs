//! The responder protocol and the KV contract (README), end to end
//! over real sockets: the binary in `-dev` mode, written to through its own
//! dev KV, asked over TCP like haproxy asks.

use crate::support;
use crate::support::metrics::{self, SWAPS};

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use crate::support::{check, dev_agent, wait_for, Agent, Kv};

use crate::support::STATE_PREFIX as PREFIX;

/// Writes `value` for `identity` (already percent-encoded where needed)
/// and waits until the agent's state has swapped past it.
fn put_and_sync(agent: &Agent, kv: &Kv, identity: &str, value: &str) {
    let swaps = agent.metric(SWAPS);
    kv.put(&format!("{PREFIX}/{identity}"), value);
    wait_for(Duration::from_secs(5), "the write to be swapped in", || {
        (agent.metric(SWAPS) > swaps).then_some(())
    });
}

fn outcome(agent: &Agent, o: &str) -> f64 {
    agent.metric(&metrics::outcome(o))
}

/// Asserts that `f` closes the connection without a reply and counts it as
/// `reason`.
#[track_caller]
fn no_reply(agent: &Agent, reason: &str, request: &[u8]) {
    let before = outcome(agent, reason);
    assert_eq!(
        check(agent.listen(), request),
        None,
        "{:?}",
        String::from_utf8_lossy(request)
    );
    wait_for(
        Duration::from_secs(2),
        &format!("outcome {reason} counted"),
        || (outcome(agent, reason) > before).then_some(()),
    );
}

/// Connects, runs `talk` on the stream, then reads until the agent closes:
/// (bytes received, time until EOF).
fn session(agent: &Agent, talk: impl FnOnce(&mut TcpStream)) -> (Vec<u8>, Duration) {
    let mut s = TcpStream::connect(agent.listen()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = Instant::now();
    talk(&mut s);
    let mut out = Vec::new();
    // A close with our bytes still unread is a reset: closed all the same.
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the agent closes the connection: {e}"),
    }
    (out, start.elapsed())
}

// ---- the responder protocol ----

#[test]
fn identity_is_matched_byte_for_byte() {
    let (agent, kv) = dev_agent(&[]);
    put_and_sync(&agent, &kv, "be_web/Srv%201", "drain");
    assert_eq!(agent.check("be_web/Srv 1\n").as_deref(), Some("drain 100%"));
    // Case-sensitive, inner spaces kept as they are.
    for other in [
        "be_web/srv 1\n",
        "BE_WEB/Srv 1\n",
        "be_web/Srv  1\n",
        "be_web/Srv1\n",
        "be_web/Srv 1/\n",
    ] {
        assert_eq!(
            agent.check(other).as_deref(),
            Some("ready 100%"),
            "{other:?}"
        );
    }
}

#[test]
fn unknown_identity_gets_the_absent_key_reply() {
    let (agent, _kv) = dev_agent(&[]);
    assert_eq!(
        agent.check("be_web/never-written\n").as_deref(),
        Some("ready 100%")
    );
    assert!(outcome(&agent, "ready") >= 1.0);
}

#[test]
fn crlf_and_surrounding_spaces_and_tabs() {
    let (agent, kv) = dev_agent(&[]);
    put_and_sync(&agent, &kv, "be/s1", "maint");
    for line in ["be/s1\r\n", "  be/s1\n", "be/s1 \t\n", "\t be/s1 \t\r\n"] {
        assert_eq!(agent.check(line).as_deref(), Some("maint 100%"), "{line:?}");
    }
}

#[test]
fn line_length_limit_is_on_the_line_without_its_newline() {
    let (agent, kv) = dev_agent(&[]);
    let id = format!("be/{}", "a".repeat(253));
    assert_eq!(id.len(), 256);
    put_and_sync(&agent, &kv, &id, "drain");
    assert_eq!(
        agent.check(&format!("{id}\n")).as_deref(),
        Some("drain 100%"),
        "256 bytes is fine"
    );
    no_reply(&agent, "too_long", format!("{id}x\n").as_bytes());
    // The length is checked before the `\r` is stripped.
    no_reply(&agent, "too_long", format!("{id}\r\n").as_bytes());
    // Past the limit with no newline yet: no need to wait for one.
    let (out, took) = session(&agent, |s| s.write_all("y".repeat(300).as_bytes()).unwrap());
    assert!(
        out.is_empty() && took < Duration::from_secs(2),
        "{out:?} after {took:?}"
    );
}

#[test]
fn max_line_bytes_flag_moves_the_limit() {
    let (agent, _kv) = dev_agent(&["-max-line-bytes", "8"]);
    assert_eq!(agent.check("12345678\n").as_deref(), Some("ready 100%"));
    no_reply(&agent, "too_long", b"123456789\n");
}

#[test]
fn control_byte_and_empty_lines_get_no_reply() {
    let (agent, _kv) = dev_agent(&[]);
    no_reply(&agent, "control_byte", b"be/s\x001\n");
    no_reply(&agent, "control_byte", b"be/s1\r\r\n");
    no_reply(&agent, "control_byte", b"be/\x7fs1\n");
    no_reply(&agent, "control_byte", b"be\t/s1\n");
    no_reply(&agent, "empty", b"\n");
    no_reply(&agent, "empty", b"\r\n");
    no_reply(&agent, "empty", b" \t \r\n");
}

#[test]
fn bytes_then_close_without_newline_is_no_newline_with_a_hint() {
    let (agent, _kv) = dev_agent(&[]);
    let before = outcome(&agent, "no_newline");
    let (out, _) = session(&agent, |s| {
        s.write_all(b"be_web/srv1\x01").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
    });
    assert!(out.is_empty());
    wait_for(Duration::from_secs(2), "no_newline counted", || {
        (outcome(&agent, "no_newline") > before).then_some(())
    });
    let hint = agent
        .proc
        .wait_log("but no newline", Duration::from_secs(2));
    assert!(hint.contains("\"level\":\"warn\""), "{hint}");
    assert!(
        hint.contains(r#""received":"be_web/srv1\\x01""#),
        "the bytes received, escaped: {hint}"
    );
}

#[test]
fn bytes_then_reset_without_newline_is_no_newline() {
    let (agent, _kv) = dev_agent(&[]);
    let before = outcome(&agent, "no_newline");
    let mut s = TcpStream::connect(agent.listen()).unwrap();
    s.write_all(b"be_web/srv1").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
    wait_for(Duration::from_secs(2), "no_newline counted", || {
        (outcome(&agent, "no_newline") > before).then_some(())
    });
}

#[test]
fn nothing_then_close_is_peer_closed() {
    let (agent, _kv) = dev_agent(&[]);
    let before = outcome(&agent, "peer_closed");
    let (out, took) = session(&agent, |s| s.shutdown(Shutdown::Write).unwrap());
    assert!(
        out.is_empty() && took < Duration::from_secs(2),
        "{out:?} after {took:?}"
    );
    wait_for(Duration::from_secs(2), "peer_closed counted", || {
        (outcome(&agent, "peer_closed") > before).then_some(())
    });
}

#[test]
fn read_timeout_closes_without_reply() {
    let (agent, _kv) = dev_agent(&["-read-timeout", "300ms"]);
    let before = (outcome(&agent, "timeout"), outcome(&agent, "no_newline"));
    let (out, took) = session(&agent, |_| {});
    assert!(out.is_empty());
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
    // Part of a line, then the timeout: the missing-newline reason.
    let (out, took) = session(&agent, |s| s.write_all(b"be_web/srv1").unwrap());
    assert!(out.is_empty());
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
    wait_for(
        Duration::from_secs(2),
        "timeout and no_newline counted",
        || {
            (outcome(&agent, "timeout") > before.0 && outcome(&agent, "no_newline") > before.1)
                .then_some(())
        },
    );
}

#[test]
fn bytes_after_the_first_line_are_ignored() {
    let (agent, kv) = dev_agent(&[]);
    put_and_sync(&agent, &kv, "be/s1", "drain");
    put_and_sync(&agent, &kv, "be/s2", "maint");
    let (out, _) = session(&agent, |s| {
        s.write_all(b"be/s1\nbe/s2\ngarbage\x00\xff").unwrap()
    });
    assert_eq!(out, b"drain 100%\n");
}

#[test]
fn a_line_split_across_writes_is_reassembled() {
    let (agent, kv) = dev_agent(&[]);
    put_and_sync(&agent, &kv, "be_web/srv%201", "25%");
    let (out, _) = session(&agent, |s| {
        s.set_nodelay(true).unwrap();
        for piece in [&b"  be_"[..], b"web/s", b"rv", b" 1", b"\r", b"\n"] {
            s.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    assert_eq!(out, b"ready 25%\n");
}

#[test]
fn reply_is_written_whole_and_the_agent_closes() {
    let (agent, kv) = dev_agent(&[]);
    put_and_sync(&agent, &kv, "be/s1", "maint");
    // The client never closes its side: EOF can only come from the agent.
    let (out, took) = session(&agent, |s| s.write_all(b"be/s1\n").unwrap());
    assert_eq!(out, b"maint 100%\n");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

// ---- the KV contract ----

/// Every valid value and what the agent answers for it.
const VALID: [(&str, &str, &str); 16] = [
    ("ready", "v_ready", "ready 100%"),
    ("drain", "v_drain", "drain 100%"),
    ("maint", "v_maint", "maint 100%"),
    ("50%", "v_50", "ready 50%"),
    ("050%", "v_050", "ready 50%"),
    ("0%", "v_0", "ready 0%"),
    ("1%", "v_1", "ready 1%"),
    ("100%", "v_100", "ready 100%"),
    ("256%", "v_256", "ready 256%"),
    ("DRAIN", "v_upper_drain", "drain 100%"),
    ("Maint", "v_mixed_maint", "maint 100%"),
    ("READY", "v_upper_ready", "ready 100%"),
    ("drain\n", "v_drain_newline", "drain 100%"),
    (" maint \t", "v_maint_spaces", "maint 100%"),
    ("\t7%\r\n", "v_7_ws", "ready 7%"),
    ("000%", "v_000", "ready 0%"),
];

/// Invalid values (answered as absent) and the reason they are counted by.
const INVALID: [(&str, &str, &str); 17] = [
    ("257%", "i_257", "out_of_range"),
    ("999%", "i_999", "out_of_range"),
    ("1000%", "i_1000", "out_of_range"),
    ("up", "i_up", "health_word"),
    ("DOWN", "i_down", "health_word"),
    ("stopped", "i_stopped", "health_word"),
    ("fail", "i_fail", "health_word"),
    ("maxconn:5", "i_maxconn", "syntax"),
    ("drain now", "i_two_words", "syntax"),
    ("ready 50%", "i_ready_50", "syntax"),
    ("+5%", "i_plus", "syntax"),
    ("-5%", "i_minus", "syntax"),
    ("5.5%", "i_fraction", "syntax"),
    ("50", "i_no_percent", "syntax"),
    ("%", "i_percent_only", "syntax"),
    ("dr\u{0}ain", "i_nul", "syntax"),
    ("", "i_empty", "syntax"),
];

#[test]
fn kv_contract_values() {
    let (agent, kv) = dev_agent(&[]);
    let syncs_before = agent.metric(SWAPS);
    for (value, id, _) in VALID {
        kv.put(&format!("{PREFIX}/be/{id}"), value);
    }
    for (value, id, _) in INVALID {
        kv.put(&format!("{PREFIX}/be/{id}"), value);
    }
    // Not UTF-8: invalid too.
    let (st, _) = support::http(
        kv.addr,
        "PUT",
        &format!("/v1/kv/{PREFIX}/be/i_not_utf8"),
        b"dr\xffain",
    )
    .unwrap();
    assert_eq!(st, 200);
    // The empty PUT is stored as `Value: null`, as consul does.
    let (_, body) =
        support::http(kv.addr, "GET", &format!("/v1/kv/{PREFIX}/be/i_empty"), b"").unwrap();
    assert!(
        String::from_utf8_lossy(&body).contains("\"Value\":null")
            || String::from_utf8_lossy(&body).contains("\"Value\": null")
    );
    wait_for(Duration::from_secs(5), "every write swapped in", || {
        let (_, state) = agent.monitoring_get("/-/metrics");
        let keys = support::metric_value(&state, "gitlab_haproxy_agent_state_keys")?;
        let invalid: f64 = ["syntax", "health_word", "out_of_range"]
            .iter()
            .filter_map(|r| {
                support::metric_value(
                    &state,
                    &format!("gitlab_haproxy_agent_state_invalid_keys{{reason=\"{r}\"}}"),
                )
            })
            .sum();
        (keys == VALID.len() as f64 && invalid == INVALID.len() as f64 + 1.0).then_some(())
    });
    assert!(agent.metric(SWAPS) > syncs_before);
    for (value, id, want) in VALID {
        assert_eq!(
            agent.check(&format!("be/{id}\n")).as_deref(),
            Some(want),
            "value {value:?}"
        );
    }
    for (value, id, _) in INVALID {
        assert_eq!(
            agent.check(&format!("be/{id}\n")).as_deref(),
            Some("ready 100%"),
            "invalid value {value:?}"
        );
    }
    assert_eq!(
        agent.check("be/i_not_utf8\n").as_deref(),
        Some("ready 100%")
    );
    for reason in ["syntax", "health_word", "out_of_range"] {
        let not_utf8 = if reason == "syntax" { 1.0 } else { 0.0 };
        let n = INVALID.iter().filter(|(_, _, r)| *r == reason).count() as f64 + not_utf8;
        let counted = agent.metric(&format!(
            "gitlab_haproxy_agent_invalid_values_total{{reason=\"{reason}\"}}"
        ));
        assert_eq!(counted, n, "invalid_values_total{{reason={reason}}}");
    }
}

#[test]
fn keys_that_can_never_be_asked_for_are_ignored_and_counted() {
    let (agent, kv) = dev_agent(&[]);
    // Identity empty, ending in `/`, surrounding whitespace. (Keys with
    // control bytes cannot be written over HTTP: consul and the dev KV
    // refuse unprintable paths with 400; the state's unit tests cover them.)
    for key in ["", "be/dir/", "%20be/s1", "be/s1%20"] {
        kv.put(&format!("{PREFIX}/{key}"), "drain");
    }
    put_and_sync(&agent, &kv, "be/ok", "maint");
    wait_for(Duration::from_secs(5), "bad keys counted", || {
        (agent.metric("gitlab_haproxy_agent_state_invalid_keys{reason=\"bad_key\"}") == 4.0)
            .then_some(())
    });
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_invalid_values_total{reason=\"bad_key\"}"),
        4.0
    );
    assert_eq!(agent.metric("gitlab_haproxy_agent_state_keys"), 1.0);
    assert_eq!(agent.check("be/ok\n").as_deref(), Some("maint 100%"));
    // The trimmed request line never matches a key with whitespace in it.
    assert_eq!(agent.check(" be/s1\n").as_deref(), Some("ready 100%"));
    assert_eq!(agent.check("be/s1\n").as_deref(), Some("ready 100%"));
    assert_eq!(agent.check("be/dir/\n").as_deref(), Some("ready 100%"));
}

#[test]
fn changes_are_logged_per_key_and_invalid_values_once_per_change() {
    let (agent, kv) = dev_agent(&[]);
    put_and_sync(&agent, &kv, "be/s1", "drain");
    let change = |key: &str| {
        let needle = format!("\"identity\":\"{key}\"");
        agent
            .proc
            .log()
            .into_iter()
            .filter(|l| l.contains("\"msg\":\"state change\"") && l.contains(&needle))
            .collect::<Vec<_>>()
    };
    let first = wait_for(Duration::from_secs(2), "state change line", || {
        change("be/s1").pop()
    });
    assert!(
        first.contains("\"old\":\"absent\"") && first.contains("\"new\":\"drain\""),
        "{first}"
    );
    assert!(first.contains("\"index\":"), "{first}");
    put_and_sync(&agent, &kv, "be/s1", "50%");
    let lines = wait_for(Duration::from_secs(2), "second state change", || {
        let l = change("be/s1");
        (l.len() == 2).then_some(l)
    });
    assert!(
        lines[1].contains("\"old\":\"drain\"") && lines[1].contains("\"new\":\"50%\""),
        "{}",
        lines[1]
    );

    let invalid = |value: &str| {
        let needle = format!("\"value\":\"{value}\"");
        agent
            .proc
            .log()
            .iter()
            .filter(|l| {
                l.contains("invalid KV entry dropped")
                    && l.contains("be/bad")
                    && l.contains(&needle)
            })
            .count()
    };
    // Log lines reach us through a pipe, after the metrics move: wait for
    // each expected line, and judge "only once" after a later line.
    let logged = |what: &str, n: usize| {
        wait_for(Duration::from_secs(2), what, || {
            (invalid(what) == n).then_some(())
        })
    };
    put_and_sync(&agent, &kv, "be/bad", "up");
    logged("up", 1);
    // Asked many times, another key changed: still logged once.
    for _ in 0..20 {
        assert_eq!(agent.check("be/bad\n").as_deref(), Some("ready 100%"));
    }
    put_and_sync(&agent, &kv, "be/s2", "maint");
    wait_for(Duration::from_secs(2), "be/s2 change line", || {
        change("be/s2").pop()
    });
    assert_eq!(invalid("up"), 1);
    // A new invalid value is a new change: logged once more.
    put_and_sync(&agent, &kv, "be/bad", "257%");
    logged("257%", 1);
    put_and_sync(&agent, &kv, "be/s2", "drain");
    wait_for(Duration::from_secs(2), "second be/s2 change line", || {
        (change("be/s2").len() == 2).then_some(())
    });
    assert_eq!(invalid("up"), 1);
    assert_eq!(invalid("257%"), 1);
    let line = agent
        .proc
        .log()
        .into_iter()
        .find(|l| l.contains("invalid KV entry dropped") && l.contains("257%"))
        .unwrap();
    assert!(
        line.contains("\"reason\":\"out_of_range\"") && line.contains("\"level\":\"warn\""),
        "{line}"
    );
    assert_eq!(
        change("be/s1").len(),
        2,
        "no line for keys that did not change"
    );
    // Never a line per request at info.
    let per_request = agent
        .proc
        .log()
        .iter()
        .filter(|l| l.contains("be/bad") && !l.contains("invalid KV entry"))
        .count();
    assert!(per_request <= 2, "{per_request}");
}

/// Sends `bytes` and closes the sending side, as an `agent-send` without
/// its `\n` does: no reply.
fn send_without_newline(agent: &Agent, bytes: &[u8]) {
    let (out, _) = session(agent, |s| {
        s.write_all(bytes).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
    });
    assert!(out.is_empty());
}

/// The hint named one sample per window, always the first connection: with
/// two misconfigured servers only one was ever named. And a single-quoted
/// `agent-send '...\n'` (haproxy sends a literal backslash-n) now says so.
#[test]
fn the_newline_hint_names_each_distinct_string_and_spots_single_quotes() {
    let (agent, _kv) = dev_agent(&[]);
    let send = |bytes: &[u8]| send_without_newline(&agent, bytes);
    // At most one hint line a second across all peers: a second apart,
    // each distinct string is named.
    for bytes in [&b"be_a/s1"[..], b"be_b/s2", b"be_a/s1", b"be_bad/sq\\n"] {
        send(bytes);
        std::thread::sleep(Duration::from_millis(1100));
    }
    let plain = "\"msg\":\"agent connection sent bytes but no newline: does the haproxy agent-send end in \\\\n? (e.g. agent-send \\\"be_web/srv1\\\\n\\\")\"";
    for name in ["be_a/s1", "be_b/s2"] {
        let want = format!(
            "{plain},\"received\":\"{name}\",\"similar_suppressed\":0,\"others_suppressed\":0}}"
        );
        agent.proc.wait_log(&want, Duration::from_secs(2));
    }
    let quoted = "\"msg\":\"agent connection sent a literal backslash-n but no newline: the haproxy agent-send is in single quotes, which haproxy does not unescape; use double quotes (agent-send \\\"be_web/srv1\\\\n\\\")\"";
    let line = agent.proc.wait_log(quoted, Duration::from_secs(2));
    // What haproxy sent, a backslash and an n: one JSON escape, no more.
    assert!(line.contains(r#""received":"be_bad/sq\\n""#), "{line}");
    // A burst of distinct strings: one line, then one naming the first
    // held back and saying how many others were.
    for i in 0..20 {
        send(format!("be_burst/s{i}").as_bytes());
    }
    let held = agent
        .proc
        .wait_log("\"received\":\"be_burst/s1\"", Duration::from_secs(3));
    assert!(held.contains("\"others_suppressed\":18"), "{held}");
    let named_a = agent
        .proc
        .log()
        .iter()
        .filter(|l| l.contains("\"received\":\"be_a/s1\""))
        .count();
    assert_eq!(named_a, 1, "the repeat within the window is held back");
}

/// Issue 34: two servers misconfigured at once (`agent-send "be_bad/one"`,
/// and `agent-send 'be_bad/two\n'` in single quotes), each checked every
/// 0.5 s for 3 s: only `be_bad/one` was named, every later line only
/// counted the others. Both are named, each with its own advice, and still
/// at most one hint line a second.
#[test]
fn two_misconfigured_servers_at_once_are_both_named() {
    let (agent, _kv) = dev_agent(&[]);
    let send = |bytes: &[u8]| send_without_newline(&agent, bytes);
    let started = Instant::now();
    for _ in 0..6 {
        send(b"be_bad/one");
        send(b"be_bad/two\\n");
        std::thread::sleep(Duration::from_millis(500));
    }
    agent
        .proc
        .wait_log("\"received\":\"be_bad/one\"", Duration::from_secs(2));
    let two = agent
        .proc
        .wait_log("\"received\":\"be_bad/two\\\\n\"", Duration::from_secs(2));
    assert!(two.contains("single quotes"), "{two}");
    let hints = agent
        .proc
        .log()
        .iter()
        .filter(|l| l.contains("without a newline") || l.contains("but no newline"))
        .count();
    let seconds = started.elapsed().as_secs();
    assert!(
        hints as u64 <= seconds + 2,
        "one line a second at most: {hints} in {seconds} s"
    );
}
