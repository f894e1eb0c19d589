//! The README's first promise: `-dev` alone, one PUT, one check.

use std::time::Duration;

use crate::support::{http, Agent};

#[test]
fn dev_mode_answers_a_put_within_one_check() {
    let agent = Agent::dev(&[]);
    let kv = agent.dev_kv.expect("dev KV address logged");
    agent.wait_reply("be_web/srv1", "ready 100%", Duration::from_secs(5));
    let (st, body) = http(
        kv,
        "PUT",
        "/v1/kv/gitlab-haproxy-agent/state/be_web/srv1",
        b"drain",
    )
    .unwrap();
    assert_eq!((st, body.as_slice()), (200, &b"true"[..]));
    agent.wait_reply("be_web/srv1", "drain 100%", Duration::from_secs(2));
    assert_eq!(agent.check("be_web/srv2\n").as_deref(), Some("ready 100%"));
    agent
        .proc
        .wait_log("\"msg\":\"state change\"", Duration::from_secs(1));
}

/// A delete is logged with the index of the state it made, not the deleted
/// key's old ModifyIndex (a PUT at 10 and its DELETE both said 10); change
/// and invalid-value lines both name the identity.
#[test]
fn a_delete_is_logged_with_the_new_state_index_and_lines_name_the_identity() {
    let agent = Agent::dev(&[]);
    let kv = agent.dev_kv.expect("dev KV address logged");
    let key = "/v1/kv/gitlab-haproxy-agent/state/be_web/srv1";
    agent.wait_reply("be_web/srv1", "ready 100%", Duration::from_secs(5));
    assert_eq!(http(kv, "PUT", key, b"drain").unwrap().0, 200);
    agent.wait_reply("be_web/srv1", "drain 100%", Duration::from_secs(2));
    let put_index = agent.metric("gitlab_haproxy_agent_consul_index");
    assert_eq!(http(kv, "DELETE", key, b"").unwrap().0, 200);
    agent.wait_reply("be_web/srv1", "ready 100%", Duration::from_secs(2));
    let delete_index = agent.metric("gitlab_haproxy_agent_consul_index");
    assert!(delete_index > put_index);
    let want = format!(
        "\"msg\":\"state change\",\"identity\":\"be_web/srv1\",\"old\":\"drain\",\"new\":\"absent\",\"index\":{delete_index}"
    );
    agent.proc.wait_log(&want, Duration::from_secs(1));
    let bad = "/v1/kv/gitlab-haproxy-agent/state/be_web/srv2";
    assert_eq!(http(kv, "PUT", bad, b"up").unwrap().0, 200);
    let line = agent
        .proc
        .wait_log("invalid KV entry dropped", Duration::from_secs(2));
    assert!(
        line.contains("\"identity\":\"be_web/srv2\",\"key\":\"gitlab-haproxy-agent/state/be_web/srv2\",\"value\":\"up\",\"reason\":\"health_word\""),
        "{line}"
    );
}

/// Through the real process: a txn body cut short gets Go's decoder text,
/// and one past `txn_max_req_len` gets consul's 413 naming its
/// Content-Length (`agent/txn_endpoint.go` `convertOps`).
#[test]
fn a_txn_body_is_refused_in_consuls_words() {
    let agent = Agent::dev(&[]);
    let kv = agent.dev_kv.expect("dev KV address logged");
    let (st, body) = http(kv, "PUT", "/v1/txn", br#"[{"KV": {"Verb": "set""#).unwrap();
    assert_eq!(
        (st, String::from_utf8_lossy(&body).as_ref()),
        (400, "Failed to parse body: unexpected EOF")
    );
    let (st, body) = http(kv, "PUT", "/v1/txn", &vec![b' '; 600 * 1024]).unwrap();
    assert_eq!(
        (st, String::from_utf8_lossy(&body).as_ref()),
        (
            413,
            "Request body(614400 bytes) too large, max size: 524288 bytes. \
             See https://www.consul.io/docs/agent/config/config-files#txn_max_req_len."
        )
    );
}
