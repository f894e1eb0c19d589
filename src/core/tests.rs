//! The core's behaviour where its rooms meet, on a virtual clock and
//! without a socket: the held state file and consul's first answers,
//! renders and parked queries whose connection left, the dev KV's writes
//! waking the queries they concern.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use super::{ConnId, ConsulView, Core};
use crate::config::{Command, Config};
use crate::consul::error::{ErrorReason, Failure};
use crate::consul::watch::Update;
use crate::http::server::{Reply, Role};
use crate::http::{parse_request_head, Parse, RequestHead};
use crate::notify::Answering;
use crate::state::{Snapshot, Source};

const PREFIX: &str = "gitlab-haproxy-agent/state";

fn config(extra: &[&str]) -> Config {
    let args = extra.iter().map(|a| a.into()).collect();
    match crate::config::parse(args, &|_| None) {
        Ok(Command::Run(c)) => *c,
        _ => panic!("bad test flags {extra:?}"),
    }
}

fn core(extra: &[&str], devkv: bool) -> (Core, Instant) {
    let start = Instant::now();
    let core = Core::new(&config(extra), start, SystemTime::now(), devkv).unwrap();
    (core, start)
}

fn snapshot(index: u64, pairs: &[(&str, &str)]) -> Snapshot {
    crate::state::test_snapshot(PREFIX, index, pairs)
}

fn reply(core: &mut Core, identity: &str, now: Instant) -> Option<String> {
    let (bytes, _) = core.answer(identity.as_bytes(), now)?;
    Some(String::from_utf8_lossy(bytes).into_owned())
}

fn request(text: &str) -> RequestHead {
    match parse_request_head(text.as_bytes(), 8192) {
        Parse::Done(head, _) => head,
        other => panic!("bad test request {text:?}: {other:?}"),
    }
}

fn get(path: &str) -> RequestHead {
    request(&format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"))
}

fn status_of(answer: &Reply) -> u16 {
    match answer {
        Reply::Full { resp, .. } | Reply::Shared { resp, .. } => resp.status,
    }
}

fn header<'a>(answer: &'a Reply, name: &str) -> Option<&'a str> {
    let Reply::Full { resp, .. } = answer else {
        return None;
    };
    let found = resp
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name));
    found.map(|(_, v)| v.as_str())
}

fn id(key: usize) -> ConnId {
    ConnId { key, gen: 1 }
}

/// A state file holding `snapshot`, in a directory of its own.
fn state_file(name: &str, snapshot: &Snapshot) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gha-core-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state");
    let bytes = crate::state::file::encode(snapshot, PREFIX, SystemTime::now());
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn no_state_no_answer_and_systemd_hears_consuls_last_error() {
    let (mut core, t0) = core(&[], false);
    assert_eq!(reply(&mut core, "web-1", t0), None);
    let failed = Failure::new(ErrorReason::Connect, "connection refused");
    core.on_consul(Update::Failed(failed), t0);
    match core.answering() {
        Answering::Not { last_error } => {
            assert!(last_error.is_some_and(|e| e.contains("connection refused")))
        }
        _ => panic!("answering without a state"),
    }
    core.on_consul(Update::Swap(snapshot(7, &[("web-1", "drain")])), t0);
    assert!(reply(&mut core, "web-1", t0).unwrap().contains("drain"));
    assert!(matches!(core.answering(), Answering::FromConsul));
}

#[test]
fn a_held_state_file_answers_after_the_grace_and_consuls_swap_replaces_it() {
    let path = state_file("held", &snapshot(3, &[("web-1", "maint")]));
    let flag = format!("-state-file={}", path.display());
    let (mut core, t0) = core(&[&flag], false);
    // Held: not answered until the first consul read fails or the grace ends.
    assert_eq!(reply(&mut core, "web-1", t0), None);
    let grace = core.poll_timeout(t0).expect("the grace is a deadline");
    assert!(grace > t0 && grace <= t0 + Duration::from_secs(5));
    core.on_time(grace, &ConsulView::default());
    assert!(reply(&mut core, "web-1", grace).unwrap().contains("maint"));
    assert!(matches!(core.answering(), Answering::FromStateFile));
    // Consul answers: its state replaces the file's at once.
    let later = grace + Duration::from_millis(10);
    core.on_consul(Update::Swap(snapshot(9, &[("web-1", "ready")])), later);
    assert!(reply(&mut core, "web-1", later).unwrap().contains("ready"));
    assert!(matches!(core.answering(), Answering::FromConsul));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn a_swap_while_the_file_is_held_discards_the_file_for_good() {
    let path = state_file("swap-held", &snapshot(3, &[("web-1", "maint")]));
    let flag = format!("-state-file={}", path.display());
    let (mut core, t0) = core(&[&flag], false);
    core.on_consul(Update::Swap(snapshot(9, &[("web-1", "drain")])), t0);
    // Past the grace, and after a failure: the file is not taken back.
    let late = t0 + Duration::from_secs(30);
    core.on_time(late, &ConsulView::default());
    let failed = Failure::new(ErrorReason::Timeout, "no answer");
    core.on_consul(Update::Failed(failed), late);
    assert!(reply(&mut core, "web-1", late).unwrap().contains("drain"));
    assert_eq!(core.state.source(), Some(Source::Consul));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn a_render_is_answered_later_and_never_to_a_connection_that_left() {
    let (mut core, t0) = core(&[], false);
    core.on_consul(Update::Swap(snapshot(7, &[("web-1", "drain")])), t0);
    let view = ConsulView::default();
    let metrics = get("/-/metrics");
    // Two connections wait for the same render; one leaves.
    for key in [1, 2] {
        let now = core.on_request(id(key), Role::Monitoring, &metrics, b"", t0, &view);
        assert!(now.is_none(), "the first scrape waits for its render");
    }
    core.on_http_closed(id(1));
    assert_eq!(core.poll_timeout(t0), Some(t0), "a render is waited for");
    let mut t = t0;
    let mut answered = Vec::new();
    while core.renders.busy() {
        t += Duration::from_millis(1);
        core.on_time(t, &view);
        while let Some((conn, answer)) = core.poll_answer() {
            answered.push((conn, status_of(&answer)));
        }
    }
    assert_eq!(answered, vec![(id(2), 200)]);
    // Within FRESH_FOR, the same body at once.
    let again = core.on_request(id(3), Role::Monitoring, &metrics, b"", t, &view);
    assert!(matches!(again, Some(Reply::Shared { .. })));
}

#[test]
fn a_dev_kv_write_wakes_the_parked_query_behind_its_own_answer() {
    let (mut core, t0) = core(&[], true);
    let view = ConsulView::default();
    let list = get("/v1/kv/p/?recurse");
    let first = core
        .on_request(id(1), Role::DevKv, &list, b"", t0, &view)
        .unwrap();
    let index = header(&first, "X-Consul-Index").unwrap().to_owned();
    let blocking = get(&format!("/v1/kv/p/?recurse&index={index}&wait=5s"));
    for key in [2, 3] {
        let parked = core.on_request(id(key), Role::DevKv, &blocking, b"", t0, &view);
        assert!(
            parked.is_none(),
            "a blocking query at the current index waits"
        );
    }
    core.on_http_closed(id(3));
    let put = request("PUT /v1/kv/p/web-1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n");
    let wrote = core
        .on_request(id(4), Role::DevKv, &put, b"drain", t0, &view)
        .unwrap();
    assert_eq!(status_of(&wrote), 200);
    let (conn, woken) = core.poll_answer().expect("the parked query is woken");
    assert_eq!(conn, id(2));
    assert_eq!(status_of(&woken), 200);
    assert_ne!(header(&woken, "X-Consul-Index"), Some(index.as_str()));
    assert!(
        core.poll_answer().is_none(),
        "the closed connection is not answered"
    );
}

#[test]
fn a_parked_query_is_answered_when_its_wait_is_over() {
    let (mut core, t0) = core(&[], true);
    let view = ConsulView::default();
    let first = core
        .on_request(
            id(1),
            Role::DevKv,
            &get("/v1/kv/p/?recurse"),
            b"",
            t0,
            &view,
        )
        .unwrap();
    let index = header(&first, "X-Consul-Index").unwrap().to_owned();
    let blocking = get(&format!("/v1/kv/p/?recurse&index={index}&wait=2s"));
    assert!(core
        .on_request(id(2), Role::DevKv, &blocking, b"", t0, &view)
        .is_none());
    let due = core.poll_timeout(t0).unwrap();
    assert!(due > t0 && due <= t0 + Duration::from_secs(3));
    core.on_time(due - Duration::from_millis(1), &view);
    assert!(core.poll_answer().is_none(), "not before its wait is over");
    let deadline = core.parking.next_deadline().unwrap();
    core.on_time(deadline, &view);
    let (conn, answer) = core.poll_answer().expect("answered at its deadline");
    assert_eq!(
        (conn, header(&answer, "X-Consul-Index")),
        (id(2), Some(index.as_str()))
    );
}
