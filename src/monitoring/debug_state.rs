//! `/debug/state`: the snapshot the agent answers from, who asks for what,
//! and the watcher, as one JSON document rendered a slice of the loop's
//! time at a time (its parts and how each resumes: `docs/LIFECYCLE.md`,
//! "`/debug/state` render"). Its rows are the types of
//! [`crate::debug_doc`], which `status` reads.
//!
//! - In: a [`Status`] view when the render starts (the scalar fields, and
//!   the state, shared), then each slice the asks ([`Asking`]) and a
//!   [`Slice`]. Out: the document.
//! - One identity per line (sorted): a 20,000-key state is a few hundred
//!   slices of well under a millisecond, never one turn.
//! - `age_seconds` is the time since the last successful consul read; the
//!   consul token is not in [`Status`], so it cannot appear here.
//! - With `only_diverted` (`?diverted`, what `status` asks for), the
//!   identities are the diverted ones only, and those asked without a key
//!   are counted, not listed.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::json;

use super::status::{Status, MAX_UNKNOWN_SHOWN};
use crate::contract::Desired;
use crate::debug_doc::{self as doc, Asked, Head, IdentityRow, InvalidRow, UnaskedRow};
use crate::slice::Slice;
use crate::state::unasked::{Asking, Finding};
use crate::state::{shown_identity, Snapshot, Source, Tick};

/// A `/debug/state` document being rendered.
#[derive(Debug)]
pub struct DebugStateRender {
    out: String,
    state: Option<Arc<Snapshot>>,
    only_diverted: bool,
    now: Instant,
    part: Part,
}

#[derive(Debug)]
enum Part {
    CollectIdentities {
        pos: usize,
        ids: BTreeSet<Box<str>>,
    },
    Identities {
        ids: BTreeSet<Box<str>>,
        first: bool,
    },
    Invalid {
        pos: usize,
    },
    CollectUnasked {
        pos: usize,
        keys: BTreeMap<Box<str>, Finding>,
    },
    Unasked {
        keys: BTreeMap<Box<str>, Finding>,
        first: bool,
    },
    CollectUnknown {
        pos: usize,
        recent: BinaryHeap<Recent>,
    },
    Unknown {
        rows: Vec<Recent>,
        first: bool,
    },
    Done,
}

/// An identity asked without a key, ranked for the heap: the top is the
/// one to drop first (the oldest ask, then the greatest name).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Recent {
    ago: std::cmp::Reverse<Tick>,
    identity: Box<[u8]>,
}

impl DebugStateRender {
    /// Writes the head (everything but the lists) from `st`; `state` is
    /// `st`'s snapshot, shared for the slices to come.
    pub fn new(st: &Status<'_>, state: Option<Arc<Snapshot>>, only_diverted: bool) -> Self {
        let mut out = String::with_capacity(64 * 1024);
        out.push_str(&doc::head_lines(&head(st)));
        let part = match &state {
            Some(s) => {
                let shown = if only_diverted { "diverted" } else { "all" };
                let _ = write!(
                    out,
                    "\"state\": {{\"index\": {}, \"keys\": {}, \"identities_shown\": \"{shown}\", \"identities\": {{",
                    s.index(),
                    s.len()
                );
                Part::CollectIdentities {
                    pos: 0,
                    ids: BTreeSet::new(),
                }
            }
            None => {
                out.push_str("\"state\": null,\n");
                Part::CollectUnasked {
                    pos: 0,
                    keys: BTreeMap::new(),
                }
            }
        };
        DebugStateRender {
            out,
            state,
            only_diverted,
            now: st.now,
            part,
        }
    }

    /// Renders on until the slice is spent; `true` once the document is
    /// complete ([`DebugStateRender::finish`]).
    pub fn step(&mut self, asking: Option<Asking<'_>>, slice: &mut Slice) -> bool {
        loop {
            let part = std::mem::replace(&mut self.part, Part::Done);
            self.part = self.advance(part, asking, slice);
            if matches!(self.part, Part::Done) {
                return true;
            }
            if slice.is_over() {
                return false;
            }
        }
    }

    pub fn finish(self) -> String {
        self.out
    }

    /// One step of the part the render is in: each part is its own
    /// function, which returns the part to resume with (itself when the
    /// slice ran out, else the next).
    fn advance(&mut self, part: Part, asking: Option<Asking<'_>>, slice: &mut Slice) -> Part {
        match part {
            Part::CollectIdentities { pos, ids } => self.collect_identities(pos, ids, slice),
            Part::Identities { ids, first } => self.identities(ids, first, asking, slice),
            Part::Invalid { pos } => self.invalid(pos, slice),
            Part::CollectUnasked { pos, keys } => self.collect_unasked(pos, keys, asking, slice),
            Part::Unasked { keys, first } => self.unasked(keys, first, asking, slice),
            Part::CollectUnknown { pos, recent } => collect_unknown(pos, recent, asking, slice),
            Part::Unknown { rows, first } => self.unknown(rows, first, asking, slice),
            Part::Done => Part::Done,
        }
    }

    fn collect_identities(
        &mut self,
        mut pos: usize,
        mut ids: BTreeSet<Box<str>>,
        slice: &mut Slice,
    ) -> Part {
        let Some(s) = self.state.as_deref() else {
            return Part::Done;
        };
        let done = if self.only_diverted {
            collect(
                s.diverted_from(&mut pos).map(|d| d.identity),
                &mut ids,
                slice,
            )
        } else {
            collect(s.asks_from(&mut pos).map(|(id, _)| id), &mut ids, slice)
        };
        match done && pos >= s.len() {
            true => Part::Identities { ids, first: true },
            false => Part::CollectIdentities { pos, ids },
        }
    }

    fn identities(
        &mut self,
        mut ids: BTreeSet<Box<str>>,
        mut first: bool,
        asking: Option<Asking<'_>>,
        slice: &mut Slice,
    ) -> Part {
        let Some(s) = self.state.as_deref() else {
            return Part::Done;
        };
        while let Some(id) = ids.pop_first() {
            // The ids are the snapshot's own: each has its entry.
            let Some(row) = identity_row(s, &id, asking, self.now) else {
                continue;
            };
            let row = doc::row(&row);
            push_row(
                &mut self.out,
                &mut first,
                format_args!("{}: {row}", json!(&*id)),
            );
            if slice.spent(row.len()) {
                return Part::Identities { ids, first };
            }
        }
        self.out.push_str("\n}, \"invalid\": [");
        Part::Invalid { pos: 0 }
    }

    fn invalid(&mut self, mut pos: usize, slice: &mut Slice) -> Part {
        let Some(s) = self.state.as_deref() else {
            return Part::Done;
        };
        while let Some(k) = s.invalid().get(pos) {
            let row = doc::row(&InvalidRow {
                key: k.key.clone(),
                modify_index: k.modify_index,
                reason: k.reason.label().to_owned(),
                value: k.value.clone(),
            });
            push_row(&mut self.out, &mut (pos == 0), format_args!("{row}"));
            pos += 1;
            if slice.spent(row.len()) {
                return Part::Invalid { pos };
            }
        }
        self.out.push_str("\n]},\n");
        Part::CollectUnasked {
            pos: 0,
            keys: BTreeMap::new(),
        }
    }

    fn collect_unasked(
        &mut self,
        mut pos: usize,
        mut keys: BTreeMap<Box<str>, Finding>,
        asking: Option<Asking<'_>>,
        slice: &mut Slice,
    ) -> Part {
        let Some(a) = asking else {
            self.out.push_str("\"asking\": null\n}\n");
            return Part::Done;
        };
        // The unasked keys may change between slices (a sweep): a
        // key then missed or shown twice is the sweep's news.
        for (id, f) in a.unasked.iter().skip(pos) {
            pos += 1;
            keys.insert(id.into(), f.clone());
            if slice.spent(id.len()) {
                break;
            }
        }
        if pos < a.unasked.len() {
            return Part::CollectUnasked { pos, keys };
        }
        let _ = write!(
            self.out,
            "\"asking\": {{\"unasked_after_seconds\": {}, \"unknown_identities_count\": {}, \"unknown_identities_overflow\": {}, \"unasked\": [",
            a.unasked.after().as_secs(),
            a.strangers.len(),
            a.strangers.overflow()
        );
        Part::Unasked { keys, first: true }
    }

    fn unasked(
        &mut self,
        mut keys: BTreeMap<Box<str>, Finding>,
        mut first: bool,
        asking: Option<Asking<'_>>,
        slice: &mut Slice,
    ) -> Part {
        let Some(a) = asking else { return Part::Done };
        while let Some((id, f)) = keys.pop_first() {
            let row = doc::row(&unasked_row(a, &id, &f, self.now));
            push_row(&mut self.out, &mut first, format_args!("{row}"));
            if slice.spent(row.len()) {
                return Part::Unasked { keys, first };
            }
        }
        self.out.push_str("\n], \"unknown_identities\": {");
        if self.only_diverted {
            return Part::Unknown {
                rows: Vec::new(),
                first: true,
            };
        }
        Part::CollectUnknown {
            pos: 0,
            recent: BinaryHeap::new(),
        }
    }

    fn unknown(
        &mut self,
        mut rows: Vec<Recent>,
        mut first: bool,
        asking: Option<Asking<'_>>,
        slice: &mut Slice,
    ) -> Part {
        let Some(a) = asking else { return Part::Done };
        while let Some(r) = rows.pop() {
            let row = doc::row(&asked(a, r.ago.0, self.now));
            push_row(
                &mut self.out,
                &mut first,
                format_args!("{}: {row}", json!(shown_identity(&r.identity))),
            );
            if slice.spent(r.identity.len() + 64) {
                return Part::Unknown { rows, first };
            }
        }
        self.out.push_str("\n}}\n}\n");
        Part::Done
    }
}

/// The 1,000 most recently asked identities without a key, kept in a heap
/// by position.
fn collect_unknown(
    mut pos: usize,
    mut recent: BinaryHeap<Recent>,
    asking: Option<Asking<'_>>,
    slice: &mut Slice,
) -> Part {
    let Some(a) = asking else { return Part::Done };
    for (id, t) in a.strangers.iter().skip(pos) {
        pos += 1;
        let r = Recent {
            ago: std::cmp::Reverse(t),
            identity: id.into(),
        };
        if recent.len() < MAX_UNKNOWN_SHOWN || recent.peek().is_some_and(|top| r < *top) {
            recent.push(r);
            if recent.len() > MAX_UNKNOWN_SHOWN {
                recent.pop();
            }
        }
        if slice.spent(id.len()) {
            break;
        }
    }
    if pos < a.strangers.len() {
        return Part::CollectUnknown { pos, recent };
    }
    // The strangers may grow between slices, which reorders
    // them: an identity seen twice is shown once (at most
    // 1,000 rows, a bounded sort).
    let mut rows = recent.into_vec();
    rows.sort_by(|a, b| (&a.identity, a.ago).cmp(&(&b.identity, b.ago)));
    rows.dedup_by(|a, b| a.identity == b.identity);
    // Most recent first; written from the back.
    rows.sort_unstable_by(|a, b| b.cmp(a));
    Part::Unknown { rows, first: true }
}

/// Appends one row of a JSON list or object: a separator first, unless it
/// is the first row.
fn push_row(out: &mut String, first: &mut bool, row: std::fmt::Arguments<'_>) {
    out.push_str(if std::mem::take(first) { "\n" } else { ",\n" });
    let _ = out.write_fmt(row);
}

/// Adds identities to `ids` until the slice is spent; `true` if the
/// iterator ran out.
fn collect<'a>(
    it: impl Iterator<Item = &'a str>,
    ids: &mut BTreeSet<Box<str>>,
    slice: &mut Slice,
) -> bool {
    for id in it {
        ids.insert(id.into());
        if slice.spent(id.len()) {
            return false;
        }
    }
    true
}

/// The document's head.
fn head(st: &Status<'_>) -> Head {
    let unix = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).ok();
    let state_file = st.state_file.as_ref().map(|f| {
        let written = match st.source {
            Some(Source::File { written }) => Some(written),
            _ => None,
        };
        doc::StateFile {
            age_seconds: written
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .map(|d| d.as_secs_f64()),
            answering_from_it: written.is_some(),
            path: f.path.display().to_string(),
            write_errors: f.write_errors,
            writes: f.writes,
            written_unix_seconds: written.and_then(unix).map(|d| d.as_secs_f64()),
        }
    });
    Head {
        version: crate::build_info::version_line(),
        synced: st.source == Some(Source::Consul),
        source: st.source.map(|s| match s {
            Source::Consul => doc::Source::Consul,
            Source::File { .. } => doc::Source::StateFile,
        }),
        state_file,
        kv_prefix: st.kv_prefix.to_owned(),
        age_seconds: st
            .metrics
            .last_success
            .map(|t| st.now.saturating_duration_since(t).as_secs_f64()),
        last_change_unix_seconds: st
            .metrics
            .last_change
            .and_then(unix)
            .map(|d| d.as_secs_f64()),
        absent_reply: "ready 100%".to_owned(),
        expiry: doc::Expiry {
            expired_keys: st.expiry.expired as u64,
            next_unix_seconds: st.expiry.next.map(u64::from),
            now_unix_seconds: unix(SystemTime::now()).map_or(0, |d| d.as_secs()),
        },
        watcher: doc::Watcher {
            backing_off: st.watch.failures > 0 && st.watch.next_request_in.is_some(),
            consecutive_failures: u64::from(st.watch.failures),
            index: st.watch.index,
            last_error: st.watch.last_error.map(str::to_owned),
            next_request_in_seconds: st.watch.next_request_in.map(|d| d.as_secs_f64()),
            phase: st.watch.phase.to_owned(),
            request_deadline_in_seconds: st.watch.request_deadline_in.map(|d| d.as_secs_f64()),
        },
    }
}

/// One identity of the state, with its asks; `None` if the state has no
/// such identity.
fn identity_row(
    s: &Snapshot,
    id: &str,
    asking: Option<Asking<'_>>,
    now: Instant,
) -> Option<IdentityRow> {
    let e = s.get(id.as_bytes())?;
    let asks = asking.and_then(|a| Some((a, s.asks(id.as_bytes(), a.previous)?)));
    Some(IdentityRow {
        asked_since_write: asks.map(|(_, (_, _, asked_since))| asked_since),
        expires_unix_seconds: (e.expires != 0).then_some(e.expires),
        last_asked: asks.and_then(|(a, (last, _, _))| asked(a, last, now)),
        modify_index: e.modify_index,
        reply: reply_text(e.desired),
        unasked: asking.is_some_and(|a| a.unasked.get(id).is_some()),
        unchanged_since_unix_seconds: asks.map(|(a, (_, since, _))| a.clock.unix_seconds(since)),
        value: e.desired.to_string(),
    })
}

fn unasked_row(a: Asking<'_>, id: &str, f: &Finding, now: Instant) -> UnaskedRow {
    UnaskedRow {
        did_you_mean: f.suggestion.clone().flatten(),
        identity: id.to_owned(),
        last_asked: asked(a, f.last_asked, now),
        modify_index: f.entry.modify_index,
        reply: reply_text(f.entry.desired),
        unchanged_since_unix_seconds: a.clock.unix_seconds(f.since),
        value: f.entry.desired.to_string(),
    }
}

fn reply_text(d: Desired) -> String {
    String::from_utf8_lossy(d.reply()).trim_end().to_owned()
}

/// A last ask: when (Unix seconds) and how long ago; `None` for never.
fn asked(a: Asking<'_>, t: Tick, now: Instant) -> Option<Asked> {
    (!t.is_never()).then(|| Asked {
        seconds_ago: u64::from(t.secs_until(a.clock.tick(now))),
        unix_seconds: a.clock.unix_seconds(t),
    })
}

/// The whole document at once (tests).
#[cfg(test)]
pub fn debug_state(st: &Status<'_>, state: Option<Arc<Snapshot>>, only_diverted: bool) -> String {
    let mut r = DebugStateRender::new(st, state, only_diverted);
    while !r.step(st.asking, &mut Slice::unlimited()) {}
    r.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPair;
    use crate::monitoring::metrics::Metrics;
    use crate::monitoring::status::{StateFileStatus, WatchStatus};
    use crate::state::unasked::Unasked;
    use crate::state::{Clock, Swapper};
    use std::time::Duration;

    /// A state of every kind of row: diverted and ready keys, one with an
    /// expiry in its Flags, an invalid key, asks, an unasked key with the
    /// identity meant, an identity asked without a key; and the document
    /// the daemon renders of it.
    fn rendered(only_diverted: bool) -> String {
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut state = Swapper::new("p", Clock::new(t0, wall), 8);
        let kv = |key: &str, value: &str, modify_index: u64, flags: u64| KvPair {
            key: format!("p/{key}"),
            value: value.as_bytes().to_vec(),
            modify_index,
            flags,
        };
        let pairs = vec![
            kv("be_web/srv01", "drain", 7, 0),
            kv("be_web/srv2", "50%", 8, 1_700_000_030),
            kv("be_web/srv3", "ready", 8, 0),
            kv("be_web/srv4", "maint", 9, 0),
            kv("be_web/srv5", "up", 9, 0),
        ];
        state.swap(Snapshot::build("p", 9, pairs), t0);
        let at = t0 + Duration::from_secs(50);
        for id in ["be_web/srv1", "be_web/srv2", "be_web/srv3"] {
            state.answer(id.as_bytes(), at);
        }
        let mut unasked = Unasked::new(Duration::from_secs(60), t0);
        let now = t0 + Duration::from_secs(61);
        unasked.step(&mut state, now, &mut Slice::unlimited());
        let metrics = Metrics {
            last_success: Some(now - Duration::from_secs(2)),
            ..Default::default()
        };
        let st = Status {
            metrics: &metrics,
            snapshot: state.current(),
            watch: WatchStatus {
                phase: "awaiting_head",
                index: 9,
                failures: 0,
                requests: 3,
                traffic: Default::default(),
                last_error: None,
                next_request_in: None,
                request_deadline_in: Some(Duration::from_secs(300)),
            },
            now,
            started: wall,
            max_connections: 100,
            kv_prefix: "p",
            source: Some(Source::Consul),
            state_file: Some(StateFileStatus {
                path: std::path::Path::new("/var/lib/agent/state.json"),
                writes: 4,
                write_errors: 1,
            }),
            asking: Some(Asking {
                clock: state.clock(),
                strangers: state.strangers(),
                unasked: &unasked,
                previous: None,
            }),
            expiry: crate::state::expiry::Shown {
                expired: 1,
                next: None,
            },
        };
        debug_state(&st, state.shared(), only_diverted)
    }

    /// `status` reads the daemon's own render, every row typed: what it
    /// prints is what the state holds.
    #[test]
    fn status_reads_the_daemons_render() {
        let body = rendered(true);
        let mut doc = crate::cli::status::read(body.as_bytes()).expect("status reads it");
        let all = crate::cli::status::read(rendered(false).as_bytes()).unwrap();
        assert_eq!(all.state.unwrap().identities.len(), 4);
        // The fixture's clock, not the wall's: srv2 expired 70s ago.
        doc.head.expiry.now_unix_seconds = 1_700_000_100;
        let (text, code) = crate::cli::status::printed(&doc, Ok(Default::default()), false);
        assert_eq!(code, crate::cli::FINDING);
        assert_eq!(
            text,
            "answering from consul: index 9, watching: a blocking query is held open and consul answers it at the next change (last answer 2s ago)\n\
             IDENTITY      VALUE  REPLY       LAST ASKED  BY  SINCE  REASON  UNTIL\n\
             be_web/srv01  drain  drain 100%  never       -   -      -       -               UNASKED: did you mean be_web/srv1?; no record\n\
             be_web/srv2   50%    ready 50%   11s ago     -   -      -       EXPIRED 1m ago  no record\n\
             be_web/srv4   maint  maint 100%  never       -   -      -       -               UNASKED: did you mean be_web/srv1?; no record\n\
             3 diverted of 4 keys; 2 unasked (no check within 60s), 0 waiting for a first check since the write; 1 past its expiry; 1 identity asked without a key\n"
        );
    }
}
