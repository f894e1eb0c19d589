//! `wait-drained`'s judgement: what haproxy (over its stats sockets, or
//! through Prometheus) says of some servers -> whether each is drained,
//! and why not.
//!
//! In: the servers each identity names, and one [`Reading`] per source for
//! one poll. Out: a [`Poll`]: one [`Row`] per server and source, each
//! drained or not with the reason. Always holds: pure; drained means every
//! source reports the server with 0 sessions and 0 queued, and nothing
//! else does: a source that fails, does not list the server, or (for
//! Prometheus) has no series or fewer instances than asked for leaves the
//! server **not drained**, saying why. A status other than `DRAIN` or
//! `MAINT` is a warning (the server may reach 0 by chance while still
//! taking new sessions), and under [`Rules::require_drain`] not drained.
//!
//! [`stat`] reads `show stat`, [`prom`] Prometheus's answer; [`show`]
//! renders a poll (table, lines, JSON). The command around them (flags,
//! sockets, the polling) is `crate::cli`'s.

pub mod prom;
pub mod show;
pub mod stat;

use std::collections::HashMap;

use prom::Instance;
use stat::{ServerKey, ServerStat};

/// What one source answered in one poll.
#[derive(Debug, Clone)]
pub enum Reading {
    /// It could not be asked, or answered garbage: the reason.
    Failed(String),
    /// A stats socket's `show stat`, for the servers asked about.
    Socket(HashMap<ServerKey, ServerStat>),
    /// Prometheus: each server's haproxy instances.
    Prometheus(HashMap<ServerKey, Vec<Instance>>),
}

/// One identity and the servers that send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub identity: String,
    pub servers: Vec<ServerKey>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// A status other than DRAIN or MAINT is not drained.
    pub require_drain: bool,
    /// Prometheus must have at least this many instances reporting a server.
    pub expect_instances: usize,
}

/// One server as one source sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub identity: String,
    /// `backend/server`.
    pub server: String,
    pub source: String,
    pub sessions: Option<u64>,
    pub queued: Option<u64>,
    /// haproxy's status (`DRAIN`, `UP 1/3`, `MAINT (via b/s)`, …); for
    /// Prometheus each instance's, distinct ones joined by `,`; `?` unknown.
    pub status: String,
    /// Prometheus: the instances reporting the server's sessions.
    pub instances: Option<usize>,
    /// Prometheus: the instances holding sessions or a queue, as
    /// `name: N sessions, M queued`.
    pub holders: Vec<String>,
    /// Why the counts cannot be trusted (not reported, no answer, …).
    pub problem: Option<String>,
}

impl Row {
    /// Every status it has is DRAIN or MAINT (any variant).
    pub fn admin_down(&self) -> bool {
        self.status
            .split(',')
            .all(|s| s.starts_with("DRAIN") || s.starts_with("MAINT"))
    }

    pub fn drained(&self, rules: &Rules) -> bool {
        self.problem.is_none()
            && self.sessions == Some(0)
            && self.queued == Some(0)
            && (self.admin_down() || !rules.require_drain)
    }

    /// Reported, and taking new sessions as far as haproxy's status goes.
    pub fn warning(&self) -> Option<String> {
        (self.problem.is_none() && !self.admin_down()).then(|| {
            format!(
                "status {} is not DRAIN or MAINT: it may reach 0 sessions by chance while still taking new ones",
                self.status
            )
        })
    }
}

/// One poll of every source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    pub rows: Vec<Row>,
}

impl Poll {
    pub fn drained(&self, rules: &Rules) -> bool {
        !self.rows.is_empty() && self.rows.iter().all(|r| r.drained(rules))
    }
}

/// The poll's rows: every server of every target at every source, in that
/// order.
pub fn judge(targets: &[Target], sources: &[(String, Reading)], rules: &Rules) -> Poll {
    let mut rows = Vec::new();
    for target in targets {
        for key in &target.servers {
            for (source, reading) in sources {
                let mut row = Row {
                    identity: target.identity.clone(),
                    server: format!("{}/{}", key.0, key.1),
                    source: source.clone(),
                    sessions: None,
                    queued: None,
                    status: "?".into(),
                    instances: None,
                    holders: Vec::new(),
                    problem: None,
                };
                match reading {
                    Reading::Failed(why) => row.problem = Some(why.clone()),
                    Reading::Socket(servers) => match servers.get(key) {
                        Some(s) => {
                            row.sessions = Some(s.sessions);
                            row.queued = Some(s.queued);
                            row.status = s.status.clone();
                        }
                        None => {
                            row.problem =
                                Some("not reported: this haproxy lists no such server".into())
                        }
                    },
                    Reading::Prometheus(servers) => {
                        prometheus_row(&mut row, servers.get(key).map_or(&[], Vec::as_slice), rules)
                    }
                }
                rows.push(row);
            }
        }
    }
    Poll { rows }
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
                "{}: {} sessions, {} queued",
                i.name,
                count(i.sessions),
                count(i.queued)
            )
        })
        .collect();
    if let Some(i) = reporting.iter().find(|i| i.queued.is_none()) {
        row.problem = Some(format!("instance {} reports no {}", i.name, prom::QUEUE));
    } else if reporting.len() < rules.expect_instances {
        row.problem = Some(format!(
            "{} instances report it, fewer than -expect-instances {}",
            reporting.len(),
            rules.expect_instances
        ));
    }
}

#[cfg(test)]
mod tests {
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

    fn socket(rows: &[(&str, u64, u64, &str)]) -> Reading {
        Reading::Socket(
            rows.iter()
                .map(|(id, s, q, st)| {
                    let (b, srv) = id.split_once('/').unwrap();
                    let stat = ServerStat {
                        sessions: *s,
                        queued: *q,
                        status: st.to_string(),
                    };
                    (key(b, srv), stat)
                })
                .collect(),
        )
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
                Reading::Prometheus([(key("app", "s1"), instances)].into()),
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
            Reading::Prometheus(
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
            Reading::Prometheus([(key("app", "s1"), huge)].into()),
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
}
