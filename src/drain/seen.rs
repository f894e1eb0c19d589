//! What earlier polls of a `wait-drained` run saw, so that one poll cannot
//! pass for drained by what it does not show: a stats socket whose process
//! changed (a reload: the old process, still serving, is out of its
//! sight), a Prometheus instance that reported a server and does not now
//! (a scrape gap, a stopped haproxy), an instance whose process restarted.
//!
//! In: each poll's readings, in order. Out: per source, why a row cannot be
//! trusted.
//!
//! Always holds:
//! - pure;
//! - what is seen is never forgotten during a run (a reload stays a reload
//!   until the command ends: the old process's sessions are not visible
//!   later either);
//! - memory is the sources, the servers asked for and their instances.

use std::collections::{BTreeSet, HashMap};

use super::process::Process;
use super::prom;
use super::stat::ServerKey;
use super::{Reading, Row, Rules};

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
                    .or_insert((process[0], None));
                if let Some(other) = process.iter().find(|p| *p != first) {
                    changed.get_or_insert(*other);
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
    /// instance that reported the server and does not now; one whose
    /// process restarted during the run or within the lookback (its old
    /// process's sessions are not exported), or that exports no start time
    /// (a restart could not be seen); and a server no instance ever
    /// reported. An instance whose process started less than
    /// `rules.young_secs` before `now` gets a warning.
    pub fn prometheus_problems(
        &self,
        row: &mut Row,
        (source, key): (&str, &ServerKey),
        reading: &prom::Reading,
        (rules, now): (&Rules, u64),
    ) {
        let expected = self.expected.get(&(source.to_owned(), key.clone()));
        let Some(expected) = expected.filter(|e| !e.is_empty()) else {
            row.unlisted = true;
            return;
        };
        let which = |bad: &dyn Fn(&str) -> bool| -> Vec<&str> {
            expected
                .iter()
                .map(String::as_str)
                .filter(|name| bad(name))
                .collect()
        };
        let changed = |name: &str| {
            let during = self.starts.get(&(source.to_owned(), name.to_owned()));
            during.is_some_and(|(_, changed)| changed.is_some())
                || reading.restarts.get(name).is_some_and(|&n| n > 0.0)
        };
        let now_reports = |name: &str| {
            let instances = reading.servers.get(key).map_or(&[][..], Vec::as_slice);
            instances
                .iter()
                .any(|i| i.sessions.is_some() && i.name == name)
        };
        let problems = [
            (
                which(&changed),
                format!("reloaded or restarted within the lookback or the wait ({} changed): an old process may hold sessions it no longer exports; give -haproxy-master-socket, or wait for the lookback to pass", prom::START_TIME),
            ),
            (
                which(&|name| !reading.starts.contains_key(name)),
                format!("exports no {}, so a reload cannot be seen: scrape its process metrics too (no scope=server alone), or give -haproxy-master-socket", prom::START_TIME),
            ),
            (
                which(&|name| !now_reports(name)),
                "reported it during the wait or the lookback before it, and not now (a scrape gap, or a stopped haproxy): cannot tell".to_owned(),
            ),
        ];
        // The first is a reload: no wait within the run changes it.
        let settled = !problems[0].0.is_empty();
        if let Some((names, why)) = problems.into_iter().find(|(names, _)| !names.is_empty()) {
            row.problem = Some(format!("{}: {why}", names.join(", ")));
            row.settled = settled;
            return;
        }
        let young = which(&|name| {
            let start = reading.starts.get(name).copied().unwrap_or(0.0) as u64;
            now.saturating_sub(start) < rules.young_secs
        });
        if !young.is_empty() {
            row.notes.push(format!(
                "haproxy at {} started less than {} ago: an older process left by a reload would not be exported (give -haproxy-master-socket)",
                young.join(", "),
                super::show::duration(std::time::Duration::from_secs(rules.young_secs))
            ));
        }
    }
}
