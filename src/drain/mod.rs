//! `wait-drained`'s judgement: what haproxy (over its stats sockets, or
//! through Prometheus) says of some servers -> whether each is drained,
//! and why not.
//!
//! In: the servers each identity names, and one [`Reading`] per source for
//! one poll. Out: a [`Poll`]: one [`Row`] per server and source, each
//! drained or not with the reason.
//!
//! Always holds:
//! - pure;
//! - drained means every source reports the server with 0 sessions and 0
//!   queued, and nothing else does: a source that fails, does not list the
//!   server, or (for Prometheus) has no series or fewer instances than
//!   asked for leaves the server **not drained**, saying why.
//!
//! A status other than `DRAIN` or `MAINT` is a warning (the server may
//! reach 0 by chance while still taking new sessions), and under
//! [`Rules::require_drain`] not drained.
//!
//! [`stat`] reads `show stat`, [`prom`] Prometheus's answer; [`show`]
//! renders a poll (table, lines, JSON), `poll.rs` holds its types. The
//! command around them (flags, sockets, the polling) is `crate::cli`'s.

mod poll;
pub mod process;
pub mod prom;
pub mod seen;
pub mod show;
pub mod stat;

pub use poll::{Poll, Reading, Row, Rules, Target, WorkerAnswer, WorkerCount};
use process::{Process, Worker};
use prom::Instance;
pub use seen::Seen;
use stat::{ServerKey, ServerStat};

/// The poll's rows: every server of every target at every source, in that
/// order. `seen` is what earlier polls saw (updated with this one's
/// readings first), `now` the Unix time.
pub fn judge(
    targets: &[Target],
    sources: &[(String, Reading)],
    rules: &Rules,
    seen: &mut Seen,
    now: u64,
) -> Poll {
    for (source, reading) in sources {
        seen.observe(source, reading);
    }
    let mut rows = Vec::new();
    for target in targets {
        for key in &target.servers {
            for (source, reading) in sources {
                let mut row = Row::new(&target.identity, key, source);
                match reading {
                    Reading::Failed(why) => row.problem = Some(why.clone()),
                    Reading::Socket { process, servers } => {
                        socket_row(&mut row, servers.get(key));
                        if let Some(why) = seen.reloaded(source) {
                            row.problem = Some(why);
                            row.settled = true;
                        } else if let Some(note) = young(&process[1], rules, now) {
                            row.notes.push(note);
                        }
                    }
                    Reading::Master(workers) => master_row(&mut row, key, workers),
                    Reading::Prometheus(reading) => {
                        let instances = reading.servers.get(key).map_or(&[][..], Vec::as_slice);
                        prometheus_row(&mut row, instances, rules);
                        seen.prometheus_problems(&mut row, (source, key), reading, (rules, now));
                    }
                }
                rows.push(row);
            }
        }
    }
    Poll { rows }
}

/// Fills `row` from a stats socket's line for it.
fn socket_row(row: &mut Row, stat: Option<&ServerStat>) {
    match stat {
        Some(s) => {
            row.sessions = Some(s.sessions);
            row.queued = Some(s.queued);
            row.status = s.status.clone();
            row.admin = s.admin;
        }
        None => {
            row.problem = Some("not reported: this haproxy lists no such server".into());
            row.unlisted = true;
        }
    }
}

/// The warning for a stats socket whose process started recently.
fn young(process: &Process, rules: &Rules, now: u64) -> Option<String> {
    let age = now.saturating_sub(process.start?);
    (age < rules.young_secs).then(|| {
        format!(
            "haproxy process {} started less than {} ago: an older process left by a reload may still hold sessions this socket cannot see (give -haproxy-master-socket)",
            process.pid,
            show::duration(std::time::Duration::from_secs(rules.young_secs))
        )
    })
}

/// Fills `row` from every worker of a master socket: the counts summed
/// over them all (old ones included), the status and admin state of the
/// current ones.
fn master_row(row: &mut Row, key: &ServerKey, workers: &[(Worker, WorkerAnswer)]) {
    let mut listing: Vec<(&Worker, &ServerStat)> = Vec::new();
    for (worker, answer) in workers {
        match answer {
            Err(why) => {
                let old = if worker.old { " (old)" } else { "" };
                row.problem
                    .get_or_insert_with(|| format!("worker {}{old}: {why}", worker.pid));
            }
            Ok(servers) => listing.extend(servers.get(key).map(|s| (worker, s))),
        }
    }
    if listing.is_empty() {
        if row.problem.is_none() {
            row.problem =
                Some("not reported: no worker of this haproxy lists such a server".into());
            row.unlisted = true;
        }
        return;
    }
    row.sessions = Some(
        listing
            .iter()
            .fold(0u64, |n, (_, s)| n.saturating_add(s.sessions)),
    );
    row.queued = Some(
        listing
            .iter()
            .fold(0u64, |n, (_, s)| n.saturating_add(s.queued)),
    );
    // The current workers say how the server is held; an old worker's
    // state is the configuration it was started with.
    let current = listing.iter().find(|(w, _)| !w.old).unwrap_or(&listing[0]);
    row.status = current.1.status.clone();
    row.admin = current.1.admin;
    for (worker, stat) in &listing {
        row.workers.push(WorkerCount {
            pid: worker.pid,
            old: worker.old,
            sessions: stat.sessions,
            queued: stat.queued,
        });
        if stat.sessions.max(stat.queued) > 0 {
            let old = if worker.old { " (old)" } else { "" };
            row.holders.push(format!(
                "worker {}{old}: {}, {} queued",
                worker.pid,
                show::plural(stat.sessions, "session", "sessions"),
                stat.queued
            ));
        }
    }
}

/// Fills `row` from the instances Prometheus has for it.
fn prometheus_row(row: &mut Row, instances: &[Instance], rules: &Rules) {
    let reporting: Vec<&Instance> = instances.iter().filter(|i| i.sessions.is_some()).collect();
    row.instances = Some(reporting.len());
    if reporting.is_empty() {
        row.problem = Some(format!(
            "no data: Prometheus has no {} series for it",
            prom::SESSIONS
        ));
        return;
    }
    let count = |v: Option<f64>| v.map_or(0, |v| v.ceil() as u64);
    // Saturating: a gauge of 1e300 is garbage, not a reason to panic.
    let total = |f: fn(&Instance) -> Option<f64>| {
        reporting
            .iter()
            .fold(0u64, |sum, i| sum.saturating_add(count(f(i))))
    };
    row.sessions = Some(total(|i| i.sessions));
    row.queued = Some(total(|i| i.queued));
    let mut statuses: Vec<&str> = reporting
        .iter()
        .map(|i| i.status.as_deref().unwrap_or("?"))
        .collect();
    statuses.sort();
    statuses.dedup();
    row.status = statuses.join(",");
    row.holders = reporting
        .iter()
        .filter(|i| count(i.sessions).max(count(i.queued)) > 0)
        .map(|i| {
            format!(
                "{}: {}, {} queued",
                i.name,
                show::plural(count(i.sessions), "session", "sessions"),
                count(i.queued)
            )
        })
        .collect();
    let down = row.status.split(',').any(|s| s.starts_with("DOWN"));
    if let Some(i) = reporting.iter().find(|i| i.queued.is_none()) {
        row.problem = Some(format!("instance {} reports no {}", i.name, prom::QUEUE));
    } else if reporting.len() < rules.expect_instances {
        row.problem = Some(format!(
            "{} instances report it, fewer than -expect-instances {}",
            reporting.len(),
            rules.expect_instances
        ));
    } else if down && rules.require_drain {
        row.problem = Some(
            "DOWN, and Prometheus exports no admin state for a DOWN server: -require-drain cannot tell whether it is held in drain or maint (ask its -haproxy-socket)".into(),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn key(b: &str, s: &str) -> ServerKey {
        (b.into(), s.into())
    }

    fn target(id: &str) -> Target {
        let (b, s) = id.split_once('/').unwrap();
        Target {
            identity: id.into(),
            servers: vec![key(b, s)],
        }
    }

    fn stats(rows: &[(&str, u64, u64, &str)]) -> HashMap<ServerKey, ServerStat> {
        rows.iter()
            .map(|(id, s, q, st)| {
                let (b, srv) = id.split_once('/').unwrap();
                let stat = ServerStat {
                    sessions: *s,
                    queued: *q,
                    status: st.to_string(),
                    admin: None,
                };
                (key(b, srv), stat)
            })
            .collect()
    }

    fn socket(rows: &[(&str, u64, u64, &str)]) -> Reading {
        let process = Process {
            pid: 1,
            start: None,
        };
        Reading::Socket {
            process: [process; 2],
            servers: stats(rows),
        }
    }

    /// Prometheus with `servers` now, every instance started long ago.
    fn prometheus(servers: HashMap<ServerKey, Vec<Instance>>) -> Reading {
        let starts = servers
            .values()
            .flatten()
            .map(|i| (i.name.clone(), 5.0))
            .collect();
        Reading::Prometheus(prom::Reading {
            servers,
            starts,
            ..prom::Reading::default()
        })
    }

    /// One poll with nothing seen before.
    fn judge(targets: &[Target], sources: &[(String, Reading)], rules: &Rules) -> Poll {
        super::judge(targets, sources, rules, &mut Seen::default(), 1_000_000_000)
    }

    fn instance(name: &str, sessions: Option<f64>, queued: Option<f64>, status: &str) -> Instance {
        Instance {
            name: name.into(),
            sessions,
            queued,
            status: Some(status.into()),
        }
    }

    const RULES: Rules = Rules {
        require_drain: false,
        expect_instances: 0,
        young_secs: 3600,
    };

    #[test]
    fn drained_only_when_every_source_reports_zero_sessions_and_queue() {
        let targets = [target("app/s1")];
        let a = ("a".to_owned(), socket(&[("app/s1", 0, 0, "DRAIN")]));
        let poll = judge(&targets, std::slice::from_ref(&a), &RULES);
        assert!(poll.drained(&RULES));
        assert_eq!(poll.rows[0].warning(), None);
        for other in [
            socket(&[("app/s1", 1, 0, "DRAIN")]),
            socket(&[("app/s1", 0, 1, "DRAIN")]),
            socket(&[("app/s2", 0, 0, "DRAIN")]),
            Reading::Failed("cannot connect: refused".into()),
        ] {
            let poll = judge(&targets, &[a.clone(), ("b".into(), other.clone())], &RULES);
            assert!(!poll.drained(&RULES), "{other:?}");
            assert!(poll.rows[0].drained(&RULES));
            assert!(!poll.rows[1].drained(&RULES));
        }
        let poll = judge(&targets, &[("b".into(), socket(&[]))], &RULES);
        assert_eq!(
            poll.rows[0].problem.as_deref(),
            Some("not reported: this haproxy lists no such server")
        );
        assert!(
            !judge(&[], &[a], &RULES).drained(&RULES),
            "nothing asked is not drained"
        );
    }

    #[test]
    fn a_server_not_draining_is_a_warning_and_under_require_drain_not_drained() {
        let targets = [target("app/s1")];
        let strict = Rules {
            require_drain: true,
            ..RULES
        };
        for (status, down) in [
            ("UP", false),
            ("UP 1/3", false),
            ("no check", false),
            ("NOLB", false),
            ("DRAIN (agent)", true),
            ("MAINT (via app/s0)", true),
            ("MAINT", true),
        ] {
            let poll = judge(
                &targets,
                &[("a".into(), socket(&[("app/s1", 0, 0, status)]))],
                &RULES,
            );
            assert!(poll.drained(&RULES), "{status}");
            assert_eq!(poll.rows[0].warning().is_none(), down, "{status}");
            assert_eq!(poll.drained(&strict), down, "{status}");
        }
    }

    #[test]
    fn prometheus_sums_instances_and_needs_data_and_enough_of_them() {
        let targets = [target("app/s1")];
        let prom = |instances: Vec<Instance>| {
            vec![(
                "p".to_owned(),
                prometheus([(key("app", "s1"), instances)].into()),
            )]
        };
        let two = vec![
            instance("lb1", Some(0.0), Some(0.0), "DRAIN"),
            instance("lb2", Some(0.0), Some(0.0), "MAINT"),
        ];
        let poll = judge(&targets, &prom(two.clone()), &RULES);
        assert!(poll.drained(&RULES));
        assert_eq!(poll.rows[0].status, "DRAIN,MAINT");
        assert_eq!(poll.rows[0].instances, Some(2));
        let three = Rules {
            expect_instances: 3,
            ..RULES
        };
        let poll = judge(&targets, &prom(two), &three);
        assert!(!poll.drained(&three));
        assert_eq!(
            poll.rows[0].problem.as_deref(),
            Some("2 instances report it, fewer than -expect-instances 3")
        );

        let holding = vec![
            instance("lb1", Some(2.0), Some(1.0), "DRAIN"),
            instance("lb2", Some(0.0), Some(0.0), "UP"),
        ];
        let poll = judge(&targets, &prom(holding), &RULES);
        let row = &poll.rows[0];
        assert_eq!((row.sessions, row.queued), (Some(2), Some(1)));
        assert_eq!(row.holders, ["lb1: 2 sessions, 1 queued"]);
        assert_eq!(row.status, "DRAIN,UP");
        assert!(row.warning().is_some(), "one instance is not draining");

        let poll = judge(&targets, &prom(Vec::new()), &RULES);
        assert!(!poll.drained(&RULES));
        assert_eq!(
            poll.rows[0].problem.as_deref(),
            Some("no data: Prometheus has no haproxy_server_current_sessions series for it")
        );
        let no_queue = vec![instance("lb1", Some(0.0), None, "DRAIN")];
        let poll = judge(&targets, &prom(no_queue), &RULES);
        assert_eq!(
            poll.rows[0].problem.as_deref(),
            Some("instance lb1 reports no haproxy_server_current_queue")
        );
        // Another server's series say nothing of this one.
        let other = vec![(
            "p".to_owned(),
            prometheus(
                [(
                    key("app", "s2"),
                    vec![instance("lb1", Some(0.0), Some(0.0), "DRAIN")],
                )]
                .into(),
            ),
        )];
        assert!(!judge(&targets, &other, &RULES).drained(&RULES));
    }

    #[test]
    fn huge_gauges_saturate_instead_of_overflowing() {
        let huge = vec![
            instance("lb1", Some(1e300), Some(1e300), "DRAIN"),
            instance("lb2", Some(1e300), Some(0.0), "DRAIN"),
        ];
        let sources = [(
            "p".to_owned(),
            prometheus([(key("app", "s1"), huge)].into()),
        )];
        let poll = judge(&[target("app/s1")], &sources, &RULES);
        assert_eq!(poll.rows[0].sessions, Some(u64::MAX));
        assert!(!poll.drained(&RULES));
    }

    #[test]
    fn every_server_of_an_identity_is_judged_at_every_source() {
        let targets = [Target {
            identity: "web-1".into(),
            servers: vec![key("app", "s1"), key("api", "s1")],
        }];
        let sources = [
            (
                "a".to_owned(),
                socket(&[("app/s1", 0, 0, "DRAIN"), ("api/s1", 0, 0, "DRAIN")]),
            ),
            (
                "b".to_owned(),
                socket(&[("app/s1", 0, 0, "DRAIN"), ("api/s1", 4, 0, "DRAIN")]),
            ),
        ];
        let poll = judge(&targets, &sources, &RULES);
        let seen: Vec<(&str, &str, bool)> = poll
            .rows
            .iter()
            .map(|r| (r.server.as_str(), r.source.as_str(), r.drained(&RULES)))
            .collect();
        assert_eq!(
            seen,
            [
                ("app/s1", "a", true),
                ("app/s1", "b", true),
                ("api/s1", "a", true),
                ("api/s1", "b", false)
            ]
        );
        assert!(poll.rows.iter().all(|r| r.identity == "web-1"));
    }

    fn socket_of(pid: u64, start: u64, rows: &[(&str, u64, u64, &str)], admin: u64) -> Reading {
        let mut servers = stats(rows);
        servers.values_mut().for_each(|s| s.admin = Some(admin));
        let process = Process {
            pid,
            start: Some(start),
        };
        Reading::Socket {
            process: [process; 2],
            servers,
        }
    }

    #[test]
    fn a_down_server_held_in_drain_is_drained_by_its_admin_state() {
        let targets = [target("app/s1")];
        let strict = Rules {
            require_drain: true,
            ..RULES
        };
        // `show stat` says DOWN; `show servers state` says forced drain (8).
        let drained = [(
            "a".to_owned(),
            socket_of(1, 0, &[("app/s1", 0, 0, "DOWN")], 8),
        )];
        let poll = judge(&targets, &drained, &strict);
        assert!(poll.drained(&strict), "{poll:?}");
        assert_eq!(poll.rows[0].warning(), None);
        // DOWN and not held: taking none now, but it would when it is up.
        let ready = [(
            "a".to_owned(),
            socket_of(1, 0, &[("app/s1", 0, 0, "DOWN")], 0),
        )];
        assert!(!judge(&targets, &ready, &strict).drained(&strict));
        assert!(judge(&targets, &ready, &RULES).rows[0].warning().is_some());
        // Prometheus exports no admin state for a DOWN server.
        let down = vec![instance("lb1", Some(0.0), Some(0.0), "DOWN")];
        let prom = [(
            "p".to_owned(),
            prometheus([(key("app", "s1"), down)].into()),
        )];
        let poll = judge(&targets, &prom, &strict);
        assert!(!poll.drained(&strict));
        assert!(
            poll.rows[0]
                .problem
                .as_deref()
                .unwrap()
                .contains("-require-drain cannot tell"),
            "{poll:?}"
        );
        assert!(judge(&targets, &prom, &RULES).drained(&RULES));
    }

    #[test]
    fn a_reload_behind_a_stats_socket_is_not_drained_for_the_rest_of_the_run() {
        let targets = [target("app/s1")];
        let mut seen = Seen::default();
        let now = 100_000;
        let at = |pid, start| {
            [(
                "a".to_owned(),
                socket_of(pid, start, &[("app/s1", 0, 0, "DRAIN")], 8),
            )]
        };
        let poll = super::judge(&targets, &at(10, 1_000), &RULES, &mut seen, now);
        assert!(poll.drained(&RULES));
        assert!(!poll.settled());
        assert_eq!(poll.rows[0].warning(), None, "started long ago");
        let poll = super::judge(&targets, &at(20, 99_000), &RULES, &mut seen, now);
        assert!(!poll.drained(&RULES));
        assert!(poll.settled(), "no wait changes it: the run ends at once");
        assert!(poll.rows[0]
            .problem
            .as_deref()
            .unwrap()
            .starts_with("haproxy reloaded during the wait (process 10 is now 20)"));
        let poll = super::judge(&targets, &at(20, 99_000), &RULES, &mut seen, now);
        assert!(!poll.drained(&RULES), "a reload stays a reload");
        // A young process: drained, with a warning naming the blind spot.
        let poll = super::judge(
            &targets,
            &at(30, now - 60),
            &RULES,
            &mut Seen::default(),
            now,
        );
        assert!(poll.drained(&RULES));
        let warning = poll.rows[0].warning().unwrap();
        assert!(
            warning.contains("started less than 1h0m0s ago")
                && warning.contains("-haproxy-master-socket"),
            "{warning}"
        );
    }

    #[test]
    fn a_prometheus_instance_that_stopped_reporting_or_restarted_is_not_drained() {
        let targets = [target("app/s1")];
        // Each instance's (start time, changes within the lookback).
        type Starts<'a> = &'a [(&'a str, f64, f64)];
        let reading = |now: Vec<Instance>, seen: &[&str], starts: Starts| {
            vec![(
                "p".to_owned(),
                Reading::Prometheus(prom::Reading {
                    servers: [(key("app", "s1"), now)].into(),
                    seen: [(
                        key("app", "s1"),
                        seen.iter().map(|s| s.to_string()).collect(),
                    )]
                    .into(),
                    starts: starts.iter().map(|(n, t, _)| (n.to_string(), *t)).collect(),
                    restarts: starts.iter().map(|(n, _, c)| (n.to_string(), *c)).collect(),
                }),
            )]
        };
        let lb1 = || instance("lb1", Some(0.0), Some(0.0), "DRAIN");
        let lb2 = || instance("lb2", Some(0.0), Some(0.0), "DRAIN");
        let old: Starts = &[("lb1", 5.0, 0.0), ("lb2", 5.0, 0.0)];
        let problem = |poll: &Poll| poll.rows[0].problem.clone().unwrap_or_default();
        // lb2 reported within the lookback, not now: its scrape failed.
        let poll = judge(
            &targets,
            &reading(vec![lb1()], &["lb1", "lb2"], old),
            &RULES,
        );
        assert!(!poll.drained(&RULES));
        assert!(
            problem(&poll).starts_with("lb2: reported it during the wait"),
            "{poll:?}"
        );
        // Seen during the run, gone from the lookback too: still expected.
        let mut seen = Seen::default();
        let both = reading(vec![lb1(), lb2()], &["lb1", "lb2"], old);
        let now = 1_000_000;
        assert!(super::judge(&targets, &both, &RULES, &mut seen, now).drained(&RULES));
        let one = reading(vec![lb1()], &["lb1"], old);
        assert!(!super::judge(&targets, &one, &RULES, &mut seen, now).drained(&RULES));
        // lb1's process restarted during the run (a reload): its old
        // process is not exported; for the rest of the run.
        let restarted: Starts = &[("lb1", 9.0, 0.0), ("lb2", 5.0, 0.0)];
        let restarted = reading(vec![lb1(), lb2()], &["lb1", "lb2"], restarted);
        for _ in 0..2 {
            let poll = super::judge(&targets, &restarted, &RULES, &mut seen, now);
            assert!(
                problem(&poll)
                    .starts_with("lb1: reloaded or restarted within the lookback or the wait"),
                "{poll:?}"
            );
            assert!(poll.settled(), "no wait changes it: the run ends at once");
        }
        // A reload shortly before the run: the start time changed within
        // the lookback (`changes`), not during the run.
        let before: Starts = &[("lb1", 5.0, 1.0), ("lb2", 5.0, 0.0)];
        let poll = judge(
            &targets,
            &reading(vec![lb1(), lb2()], &["lb1", "lb2"], before),
            &RULES,
        );
        assert!(
            problem(&poll).starts_with("lb1: reloaded or restarted"),
            "{poll:?}"
        );
        assert!(poll.settled());
        // No start time exported (a scrape with scope=server): a reload
        // could not be seen.
        let blind: Starts = &[("lb1", 5.0, 0.0)];
        let poll = judge(
            &targets,
            &reading(vec![lb1(), lb2()], &["lb1", "lb2"], blind),
            &RULES,
        );
        assert!(!poll.settled(), "a scrape may export it later");
        assert!(
            problem(&poll).starts_with("lb2: exports no haproxy_process_start_time_seconds"),
            "{poll:?}"
        );
        // A process younger than the young window: drained, with a warning.
        let young: Starts = &[("lb1", 999_990.0, 0.0), ("lb2", 5.0, 0.0)];
        let poll = super::judge(
            &targets,
            &reading(vec![lb1(), lb2()], &["lb1", "lb2"], young),
            &RULES,
            &mut Seen::default(),
            now,
        );
        assert!(poll.drained(&RULES), "{poll:?}");
        let warning = poll.rows[0].warning().unwrap();
        assert!(
            warning.starts_with("haproxy at lb1 started less than 1h0m0s ago"),
            "{warning}"
        );
        // No instance now or within the lookback: unlisted.
        let none = reading(Vec::new(), &[], old);
        let poll = judge(&targets, &none, &RULES);
        assert_eq!(poll.unlisted(), ["app/s1"]);
    }

    #[test]
    fn a_server_is_unlisted_only_when_every_source_answers_without_it() {
        let targets = [target("app/typo")];
        let answered = ("a".to_owned(), socket(&[("app/s1", 0, 0, "DRAIN")]));
        let failed = ("b".to_owned(), Reading::Failed("cannot connect".into()));
        assert_eq!(
            judge(&targets, std::slice::from_ref(&answered), &RULES).unlisted(),
            ["app/typo"]
        );
        assert!(
            judge(&targets, &[answered, failed], &RULES)
                .unlisted()
                .is_empty(),
            "b may list it"
        );
    }
}
