//! What earlier polls of a `wait-drained` run saw, so that one poll cannot
//! pass for drained by what it does not show: a stats socket whose process
//! changed (a reload: the old process, still serving, is out of its
//! sight), a Prometheus instance that reported a server and does not now
//! (a scrape gap, a stopped haproxy), an instance whose process restarted.
//!
//! In: each poll's readings, in order. Out: per source, why a row cannot
//! be trusted. Always holds: pure; what is seen is never forgotten during
//! a run (a reload stays a reload until the command ends: the old
//! process's sessions are not visible later either); memory is the
//! sources, the servers asked for and their instances.

use std::collections::{BTreeSet, HashMap};

use super::process::Process;
use super::prom::Instance;
use super::stat::ServerKey;
use super::{Reading, Row};

/// Each source's history over one run.
#[derive(Debug, Default)]
pub struct Seen {
    /// A stats socket's first process, and the one that replaced it.
    processes: HashMap<String, (Process, Option<Process>)>,
    /// A Prometheus source's instances that reported each server during
    /// the run or within the lookback before it.
    expected: HashMap<(String, ServerKey), BTreeSet<String>>,
    /// A Prometheus source's instances: the first start time seen, and
    /// the one that replaced it.
    starts: HashMap<(String, String), (f64, Option<f64>)>,
}

impl Seen {
    /// Takes in one reading of `source`.
    pub fn observe(&mut self, source: &str, reading: &Reading) {
        match reading {
            Reading::Socket { process, .. } => {
                let (first, changed) = self
                    .processes
                    .entry(source.to_owned())
                    .or_insert((*process, None));
                if changed.is_none() && first != process {
                    *changed = Some(*process);
                }
            }
            Reading::Prometheus(p) => {
                for (key, instances) in &p.servers {
                    let names = instances
                        .iter()
                        .filter(|i| i.sessions.is_some())
                        .map(|i| i.name.clone());
                    self.expected
                        .entry((source.to_owned(), key.clone()))
                        .or_default()
                        .extend(names);
                }
                for (key, names) in &p.seen {
                    self.expected
                        .entry((source.to_owned(), key.clone()))
                        .or_default()
                        .extend(names.iter().cloned());
                }
                for (name, &start) in &p.starts {
                    let (first, changed) = self
                        .starts
                        .entry((source.to_owned(), name.clone()))
                        .or_insert((start, None));
                    if changed.is_none() && *first != start {
                        *changed = Some(start);
                    }
                }
            }
            Reading::Failed(_) | Reading::Master(_) => {}
        }
    }

    /// Why a stats socket's counts do not cover every process: it was
    /// answered by another process during the run.
    pub fn reloaded(&self, source: &str) -> Option<String> {
        let (first, Some(now)) = self.processes.get(source)? else {
            return None;
        };
        Some(format!(
            "haproxy reloaded during the wait (process {} is now {}): the old process may still hold sessions this stats socket cannot see (give -haproxy-master-socket)",
            first.pid, now.pid
        ))
    }

    /// Marks a Prometheus row that this poll cannot vouch for: an
    /// instance that reported the server and does not now, or whose
    /// process restarted; and a server no instance ever reported.
    pub fn prometheus_problems(
        &self,
        row: &mut Row,
        source: &str,
        key: &ServerKey,
        now: &[Instance],
    ) {
        let expected = self.expected.get(&(source.to_owned(), key.clone()));
        let Some(expected) = expected.filter(|e| !e.is_empty()) else {
            row.unlisted = true;
            return;
        };
        let restarted: Vec<&str> = expected
            .iter()
            .filter(|name| {
                self.starts
                    .get(&(source.to_owned(), (*name).clone()))
                    .is_some_and(|(_, changed)| changed.is_some())
            })
            .map(String::as_str)
            .collect();
        if !restarted.is_empty() {
            row.problem = Some(format!(
                "haproxy restarted or reloaded during the wait at {} ({} changed): an old process's sessions are not exported",
                restarted.join(", "),
                super::prom::START_TIME
            ));
            return;
        }
        let missing: Vec<&str> = expected
            .iter()
            .filter(|name| !now.iter().any(|i| i.sessions.is_some() && i.name == **name))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            row.problem = Some(format!(
                "{} reported it during the wait or the lookback before it, and not now (a scrape gap, or a stopped haproxy): cannot tell",
                missing.join(", ")
            ));
        }
    }
}
