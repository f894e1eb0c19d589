//! `cargo bench --bench parse`: the pure parsers and the hot-path lookup,
//! ns per call (median of 7 batches, each long enough to dwarf the clock).

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::*;
use gitlab_haproxy_agent::agent::request;
use gitlab_haproxy_agent::contract::parse_value;
use gitlab_haproxy_agent::kv::KvPair;
use gitlab_haproxy_agent::state::{Clock, Snapshot, Swapper};

fn ns_per_call(mut f: impl FnMut() -> usize) -> f64 {
    // Calibrate a batch to ~20 ms.
    let mut n = 1_000usize;
    loop {
        let t = Instant::now();
        for _ in 0..n {
            black_box(f());
        }
        if t.elapsed().as_millis() >= 20 || n >= 1 << 30 {
            break;
        }
        n *= 4;
    }
    let mut v: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                black_box(f());
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mut t = Table::new("parse", &["what", "input", "ns_per_call"]);
    for (label, input) in [
        ("request::parse", &b"be_web/srv1\n"[..]),
        ("request::parse", b"be_web/srv1\r\n"),
        (
            "request::parse",
            b"  be_very_long_backend_name_for_a_fleet/gitlab-web-srv-0123  \r\n",
        ),
        ("request::parse (partial)", b"be_web/srv"),
        ("request::parse (control byte)", b"be_web/\x01srv\n"),
    ] {
        let ns = ns_per_call(|| match request::parse(black_box(input), 256) {
            request::Request::Identity(id) => id.len(),
            _ => 0,
        });
        t.row(vec![
            label.into(),
            format!("{:?}", String::from_utf8_lossy(input)),
            format!("{ns:.1}"),
        ]);
    }
    for input in [
        &b"ready"[..],
        b"drain",
        b"MAINT",
        b" 50% \n",
        b"256%",
        b"up",
        b"garbage value",
    ] {
        let ns =
            ns_per_call(|| parse_value(black_box(input)).map_or(0, |d| d.weight_pct() as usize));
        t.row(vec![
            "contract::parse_value".into(),
            format!("{:?}", String::from_utf8_lossy(input)),
            format!("{ns:.1}"),
        ]);
    }
    // The hot-path lookup: identity -> precomputed reply bytes.
    for n in [1_000usize, 100_000] {
        let pairs: Vec<KvPair> = (0..n)
            .map(|i| KvPair {
                key: format!("gitlab-haproxy-agent/state/be_{}/srv_{}", i / 10, i % 10),
                value: b"ready".to_vec(),
                modify_index: i as u64,
                flags: 0,
            })
            .collect();
        let snap = Snapshot::build("gitlab-haproxy-agent/state", 1, pairs);
        let ids: Vec<Vec<u8>> = (0..n)
            .map(|i| format!("be_{}/srv_{}", i / 10, i % 10).into_bytes())
            .collect();
        let mut k = 0;
        let ns = ns_per_call(|| {
            k = (k + 7919) % ids.len();
            snap.reply(black_box(&ids[k])).len()
        });
        t.row(vec![
            format!("Snapshot::reply ({n} keys)"),
            "hit".into(),
            format!("{ns:.1}"),
        ]);
        let ns = ns_per_call(|| snap.reply(black_box(b"be_none/srv_none")).len());
        t.row(vec![
            format!("Snapshot::reply ({n} keys)"),
            "miss".into(),
            format!("{ns:.1}"),
        ]);
        answer_rows(&mut t, n, snap, &ids);
    }
    t.finish();
}

/// The hot path as the loop calls it: lookup and record the ask, in the
/// slot for a keyed identity, in the bounded set for one without a key
/// (the same `n` identities asked again and again, as haproxy does).
fn answer_rows(t: &mut Table, n: usize, snap: Snapshot, ids: &[Vec<u8>]) {
    let start = Instant::now();
    let mut state = Swapper::new("p", Clock::new(start, std::time::SystemTime::now()), 65_536);
    state.swap(snap, start);
    while state.busy() {
        state.step(&mut gitlab_haproxy_agent::slice::Slice::unlimited());
    }
    let mut k = 0;
    let ns = ns_per_call(|| {
        k = (k + 7919) % ids.len();
        state
            .answer(black_box(&ids[k]), start)
            .map_or(0, |d| d.reply().len())
    });
    t.row(vec![
        format!("Swapper::answer ({n} keys)"),
        "hit + record".into(),
        format!("{ns:.1}"),
    ]);
    let unkeyed: Vec<Vec<u8>> = (0..n.min(65_536))
        .map(|i| format!("be_none/srv_{i}").into_bytes())
        .collect();
    let ns = ns_per_call(|| {
        k = (k + 7919) % unkeyed.len();
        state
            .answer(black_box(&unkeyed[k]), start)
            .map_or(0, |d| d.reply().len())
    });
    t.row(vec![
        format!(
            "Swapper::answer ({n} keys, {} unkeyed asked)",
            unkeyed.len()
        ),
        "miss + record".into(),
        format!("{ns:.1}"),
    ]);
}
