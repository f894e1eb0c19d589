//! `drain::prom::read_answer`, `read_seen` and `read_starts`, then
//! `drain::judge`: a Prometheus instant-query answer, as the server (or
//! anything at its address) sends it, read as each of the queries
//! wait-drained makes.
//!
//! Input: the answer body. Checks: never panics; every value read is a
//! finite count (not negative); the judgement of the servers read never
//! panics, and a server with sessions or a queue is never drained.
#![no_main]

use gitlab_haproxy_agent::drain::prom::{self, read_answer, read_seen, read_starts};
use gitlab_haproxy_agent::drain::{judge, Reading, Rules, Seen, Target};
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
        young_secs: 3600,
    };
    let starts = read_starts(data).unwrap_or_default();
    for v in starts.values() {
        assert!(v.is_finite() && *v >= 0.0, "{v}");
    }
    let reading = prom::Reading {
        servers,
        seen: read_seen(data).unwrap_or_default(),
        restarts: starts.clone(),
        starts,
    };
    let sources = [("p".into(), Reading::Prometheus(reading))];
    let now = data.len() as u64 * 1_000_000;
    let poll = judge(&targets, &sources, &rules, &mut Seen::default(), now);
    for row in &poll.rows {
        if row.drained(&rules) {
            assert_eq!((row.sessions, row.queued), (Some(0), Some(0)));
        }
    }
});
