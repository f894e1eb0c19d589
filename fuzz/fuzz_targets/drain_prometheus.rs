//! `drain::prom::read_answer` then `drain::judge`: a Prometheus
//! instant-query answer, as the server (or anything at its address) sends
//! it.
//!
//! Input: the answer body. Checks: never panics; every value read is a
//! finite count (not negative); the judgement of the servers read never
//! panics, and a server with sessions or a queue is never drained.
#![no_main]

use gitlab_haproxy_agent::drain::prom::read_answer;
use gitlab_haproxy_agent::drain::{judge, Reading, Rules, Target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(servers) = read_answer(data) else {
        return;
    };
    for instances in servers.values() {
        for i in instances {
            for v in [i.sessions, i.queued].into_iter().flatten() {
                assert!(v.is_finite() && v >= 0.0, "{v}");
            }
        }
    }
    let targets: Vec<Target> = servers
        .keys()
        .map(|k| Target {
            identity: format!("{}/{}", k.0, k.1),
            servers: vec![k.clone()],
        })
        .collect();
    let rules = Rules {
        require_drain: data.len() % 2 == 0,
        expect_instances: data.len() % 3,
    };
    let poll = judge(&targets, &[("p".into(), Reading::Prometheus(servers))], &rules);
    for row in &poll.rows {
        if row.drained(&rules) {
            assert_eq!((row.sessions, row.queued), (Some(0), Some(0)));
        }
    }
});
