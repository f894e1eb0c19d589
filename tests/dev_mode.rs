//! The README's first promise: `-dev` alone, one PUT, one check.

mod support;

use std::time::Duration;

use support::{http, Agent};

#[test]
fn dev_mode_answers_a_put_within_one_check() {
    let agent = Agent::start(&["-dev", "-dev-kv-addr", "127.0.0.1:0"], &[]);
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
