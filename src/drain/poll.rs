//! What a poll reads from each source ([`Reading`]) and what it concludes
//! for each server ([`Row`], [`Poll`]) under the [`Rules`]: the types
//! [`super::judge`] fills, [`super::seen`] remembers and [`super::show`]
//! renders.

use std::collections::HashMap;

use super::process::{Process, Worker};
use super::prom;
use super::stat::{ServerKey, ServerStat};

/// What one worker behind a master socket answered, or why not.
pub type WorkerAnswer = Result<HashMap<ServerKey, ServerStat>, String>;

/// What one source answered in one poll.
#[derive(Debug, Clone)]
pub enum Reading {
    /// It could not be asked, or answered garbage: the reason.
    Failed(String),
    /// A stats socket: the process answering it (`show info`, asked before
    /// and after the rest: a reload in between is two processes, and
    /// [`super::Seen`] takes it as one) and its `show stat` (with `show servers
    /// state`'s admin bits) for the servers asked about.
    Socket {
        process: [Process; 2],
        servers: HashMap<ServerKey, ServerStat>,
    },
    /// A master socket: every worker it lists (old ones too) and what each
    /// answered.
    Master(Vec<(Worker, WorkerAnswer)>),
    /// Prometheus: each server's haproxy instances now and within the
    /// lookback, and each instance's process start time.
    Prometheus(prom::Reading),
}

/// One identity and the servers that send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub identity: String,
    pub servers: Vec<ServerKey>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// Only a server held in drain or maint (its admin state) is drained.
    pub require_drain: bool,
    /// Prometheus must have at least this many instances reporting a server.
    pub expect_instances: usize,
    /// A stats socket's process younger than this (seconds) gets a warning:
    /// an older process, left by a reload, may still serve sessions that
    /// its socket does not see (an hour, or the config's `hard-stop-after`).
    pub young_secs: u64,
}

/// One worker of a master socket, as it counts in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCount {
    pub pid: u64,
    pub old: bool,
    pub sessions: u64,
    pub queued: u64,
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
    /// `show servers state`'s `srv_admin_state` (a stats or master
    /// socket): non-zero is held in drain or maint, whatever `status`.
    pub admin: Option<u64>,
    /// Prometheus: the instances reporting the server's sessions.
    pub instances: Option<usize>,
    /// A master socket: every worker listing the server.
    pub workers: Vec<WorkerCount>,
    /// The instances or workers holding sessions or a queue, as
    /// `name: N sessions, M queued`.
    pub holders: Vec<String>,
    /// Why the counts cannot be trusted (not reported, no answer, …).
    pub problem: Option<String>,
    /// The source answered and does not list the server.
    pub unlisted: bool,
    /// The problem cannot go away within the run: a reload seen through a
    /// worker's stats socket, or Prometheus's within its lookback.
    pub settled: bool,
    /// Warnings about what this source cannot see.
    pub notes: Vec<String>,
}

impl Row {
    pub(crate) fn new(identity: &str, key: &ServerKey, source: &str) -> Row {
        Row {
            identity: identity.to_owned(),
            server: format!("{}/{}", key.0, key.1),
            source: source.to_owned(),
            sessions: None,
            queued: None,
            status: "?".into(),
            admin: None,
            instances: None,
            workers: Vec::new(),
            holders: Vec::new(),
            problem: None,
            unlisted: false,
            settled: false,
            notes: Vec::new(),
        }
    }

    /// Held out of balancing: its admin state where the source tells it,
    /// else every status it has is DRAIN or MAINT (any variant).
    pub fn admin_down(&self) -> bool {
        match self.admin {
            Some(admin) => admin != 0,
            None => self
                .status
                .split(',')
                .all(|s| s.starts_with("DRAIN") || s.starts_with("MAINT")),
        }
    }

    pub fn drained(&self, rules: &Rules) -> bool {
        self.problem.is_none()
            && self.sessions == Some(0)
            && self.queued == Some(0)
            && (self.admin_down() || !rules.require_drain)
    }

    /// Reported, and taking new sessions as far as haproxy's state goes;
    /// and what the source cannot see.
    pub fn warning(&self) -> Option<String> {
        let status = (self.problem.is_none() && !self.admin_down()).then(|| {
            format!(
                "status {} is not DRAIN or MAINT: it may reach 0 sessions by chance while still taking new ones",
                self.status
            )
        });
        let all: Vec<String> = status.into_iter().chain(self.notes.clone()).collect();
        (!all.is_empty()).then(|| all.join("; "))
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

    /// A row whose "not drained" no wait can change (a reload a stats
    /// socket or Prometheus cannot see behind): the run ends at once.
    pub fn settled(&self) -> bool {
        self.rows.iter().any(|r| r.settled)
    }

    /// The servers that every source answered without listing (a typo,
    /// or a server no haproxy has): no wait will change that.
    pub fn unlisted(&self) -> Vec<&str> {
        let mut servers: Vec<&str> = self.rows.iter().map(|r| r.server.as_str()).collect();
        servers.dedup();
        servers.retain(|s| {
            self.rows
                .iter()
                .filter(|r| r.server == *s)
                .all(|r| r.unlisted)
        });
        servers
    }
}
