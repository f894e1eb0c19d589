//! What became of a transaction: the one reading of its answer that
//! `set`, `unset` and `ramp` share ([`deliver`]).
//!
//! - [`KeyWrite`]: one key's write (or its orphan record's delete), and
//!   its two operations ([`KeyWrite::ops`]).
//! - [`Answer`]: applied, a conflict (someone else wrote a key since it
//!   was read), refused (nothing applied), or lost and settled by reading
//!   the keys again ([`Settled`]).
//! - Each caller words the answer its own way; none reads consul's.

use serde_json::Value;

use super::change::Carried;
use super::key::{moved, Held, Target};
use super::kv::{Delivery, Kv};
use super::recorder::Recorder;
use crate::contract::txn::{self, TxnAnswer, PERMISSION_DENIED};

/// One key's part of a transaction: a state key and its record, two
/// operations.
#[derive(Debug)]
pub(crate) struct KeyWrite<'a> {
    pub identity: &'a str,
    /// What the key becomes; `None`: it is absent and stays so, and only
    /// its orphan record is deleted.
    pub target: Option<Target>,
    /// The ModifyIndex the write is guarded by (0: absent, or unseen).
    pub guard: u64,
    /// What its record and Flags carry.
    pub carried: Carried,
}

impl KeyWrite<'_> {
    /// Its two operations: the state key's check-and-set and its record's
    /// write (recorded at `now`), or an orphan record's delete while the
    /// key is absent.
    pub fn ops(&self, kv: &Kv, recorder: &Recorder, now: u64) -> [Value; 2] {
        let (key, record_key) = (kv.key(self.identity), kv.record_key(self.identity));
        let Some(target) = self.target else {
            return txn::orphan_ops(&key, &record_key);
        };
        let record = match target {
            Target::Set(d) => Some(recorder.record(&d, now, &self.carried)),
            Target::Unset => None,
        };
        [
            txn::op(&key, target.value(), self.guard, self.carried.until),
            txn::record_op(&record_key, record.as_deref()),
        ]
    }
}

/// What a transaction came to.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Applied whole: each written key's new ModifyIndex (0: deleted;
    /// `None`: consul withheld its result, for a token that cannot read
    /// it), orphans left out.
    Applied(Vec<Option<u64>>),
    /// Someone else changed a key since it was read (nothing applied): who
    /// holds what.
    Conflict(String),
    /// Nothing applied: a denial, another refusal, or never sent; one
    /// line each.
    Refused(Vec<String>),
    /// Sent, and no usable answer came: the keys were read again.
    Lost(Lost),
}

/// A lost answer, settled by reading the written keys again (orphans
/// left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lost {
    /// Why no answer came.
    pub why: String,
    /// The keys as read again, or why that failed.
    pub held: Result<Vec<Held>, String>,
    pub settled: Settled,
}

/// What a re-read after a lost answer shows. A transaction applies whole
/// or not at all (consul's `TxnRW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Every key holds its target at a new index: applied.
    Applied,
    /// This key moved elsewhere: the write can never commit.
    Moved(usize),
    /// Not applied yet (consul may still commit it), or the re-read
    /// failed.
    Unknown,
}

/// Sends `ops` (the operations of `keys`, in order) in one transaction,
/// and reads what became of it.
pub(crate) fn deliver(kv: &mut Kv, keys: &[KeyWrite<'_>], ops: &[Value]) -> Answer {
    let written: Vec<(&str, Target, u64)> = keys
        .iter()
        .filter_map(|k| Some((k.identity, k.target?, k.guard)))
        .collect();
    match kv.txn(ops) {
        Delivery::Answered(TxnAnswer::Applied(results)) => {
            let state_keys: Vec<String> = written.iter().map(|w| kv.key(w.0)).collect();
            let targets: Vec<Target> = written.iter().map(|w| w.1).collect();
            Answer::Applied(indexes_after(&results, &state_keys, &targets))
        }
        Delivery::Answered(TxnAnswer::Failed(errors)) => refusal(kv, keys, &errors),
        Delivery::Refused(e) | Delivery::NotSent(e) => Answer::Refused(vec![e]),
        Delivery::Lost(why) => {
            let ids: Vec<String> = written.iter().map(|w| w.0.to_owned()).collect();
            let targets: Vec<Target> = written.iter().map(|w| w.1).collect();
            let guards: Vec<u64> = written.iter().map(|w| w.2).collect();
            let held = kv.read(&ids);
            let settled = match &held {
                Ok(held) => settle(&targets, held, &guards),
                Err(_) => Settled::Unknown,
            };
            Answer::Lost(Lost { why, held, settled })
        }
    }
}

/// What the keys as read again say of a transaction whose answer was
/// lost: applied when every key holds its target at an index other than
/// its guard, never if one moved elsewhere ([`moved`]).
fn settle(targets: &[Target], held: &[Held], guards: &[u64]) -> Settled {
    let applied = targets
        .iter()
        .zip(held)
        .zip(guards)
        .all(|((t, h), &g)| t.is_held_in(h, g));
    match (applied, moved(targets, held, guards)) {
        (true, _) => Settled::Applied,
        (false, Some(k)) => Settled::Moved(k),
        (false, None) => Settled::Unknown,
    }
}

/// Reads a 409: a denial is matched on consul's `What` prefix (consul
/// answers it with the same 409 as a failed check-and-set); anything else
/// is a conflict only if the key's ModifyIndex moved since the guard.
fn refusal(kv: &mut Kv, keys: &[KeyWrite<'_>], errors: &[(usize, String)]) -> Answer {
    let name = |at: usize| keys.get(at / 2).map_or("?", |k| k.identity);
    let unseen = |at: usize| {
        match keys.get(at / 2).is_some_and(|k| k.guard == 0) {
        true => " (it read as absent, and consul hides from a listing the keys a token cannot read: it may exist unseen)",
        false => "",
    }
    };
    let denied: Vec<String> = errors
        .iter()
        .filter(|(_, what)| what.starts_with(PERMISSION_DENIED))
        .map(|(at, what)| match (*at % 2 == 1).then(|| kv.record_key(name(*at))) {
            Some(record) => format!(
                "consul refused: permission denied for the record {record}: the token cannot write the records of the keys it writes (nothing of that transaction was written); give it the README's policy: {} (consul: {what})",
                policy_line(kv.prefix(), kv.meta())
            ),
            None => format!(
                "consul refused: permission denied for {}: the token cannot write it{} (consul: {what})",
                name(*at),
                unseen(*at)
            ),
        })
        .collect();
    if !denied.is_empty() {
        return Answer::Refused(denied);
    }
    let Some((at, what)) = errors.first() else {
        return Answer::Refused(vec![
            "consul refused the transaction without saying why".into()
        ]);
    };
    let identity = name(*at);
    let guard = keys.get(*at / 2).map_or(0, |k| k.guard);
    match kv.read_one(identity) {
        Ok(Held::Absent) if guard != 0 => Answer::Conflict(format!(
            "{identity} was changed by someone else since it was read: it is now absent (ready 100%) (consul: {what})"
        )),
        Ok(held) if held.index() != guard => Answer::Conflict(format!(
            "{identity} was changed by someone else since it was read: it is now {} (index {}) (consul: {what})",
            held.render(),
            held.index()
        )),
        Ok(held) => Answer::Refused(vec![format!(
            "consul refused the write of {identity}, unchanged since it was read ({}, index {}): {what}",
            held.render(),
            held.index()
        )]),
        Err(e) => Answer::Refused(vec![format!(
            "consul refused the write of {identity}: {what} (and re-reading it failed: {e}){}",
            unseen(*at)
        )]),
    }
}

/// The ACL policy that lets the writers write both the state keys and
/// their records: one rule on the two prefixes' common parent.
fn policy_line(prefix: &str, meta: &str) -> String {
    let common: Vec<&str> = prefix
        .split('/')
        .zip(meta.split('/'))
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    let rule = |p: &str| format!("key_prefix \"{p}/\" {{ policy = \"write\" }}");
    match common.is_empty() {
        true => format!("{} {}", rule(prefix), rule(meta)),
        false => rule(&common.join("/")),
    }
}

/// The ModifyIndex each key holds after an applied transaction, from its
/// result (matched by key): `Some(0)` for a deleted key, `None` for a
/// written key consul returned no result for (a token that cannot read
/// it gets none: re-read it).
fn indexes_after(
    results: &[(String, u64)],
    keys: &[String],
    targets: &[Target],
) -> Vec<Option<u64>> {
    keys.iter()
        .zip(targets)
        .map(|(key, t)| match t {
            Target::Unset => Some(0),
            Target::Set(_) => results.iter().find(|(k, _)| k == key).map(|r| r.1),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::key::tests::pct;
    use super::*;
    use crate::contract::Desired;

    /// `Results` has no entry for a delete (`agent/consul/state/txn.go`
    /// `txnKVS` returns no result when `entry` is nil): indexes are matched
    /// by key, never by position.
    #[test]
    fn results_are_matched_by_key_not_position() {
        let keys = ["p/a".to_owned(), "p/b".to_owned(), "p/c".to_owned()];
        let targets = [Target::Unset, Target::Set(pct(50)), Target::Set(pct(50))];
        let results = [("p/c".to_owned(), 9), ("p/b".to_owned(), 8)];
        assert_eq!(
            indexes_after(&results, &keys, &targets),
            [Some(0), Some(8), Some(9)]
        );
        assert_eq!(
            indexes_after(&results[..1], &keys, &targets),
            [Some(0), None, Some(9)],
            "a withheld result is unknown, not another key's"
        );
    }

    #[test]
    fn one_policy_covers_the_keys_and_their_records() {
        assert_eq!(
            policy_line("gitlab-haproxy-agent/state", "gitlab-haproxy-agent/meta"),
            r#"key_prefix "gitlab-haproxy-agent/" { policy = "write" }"#
        );
        assert_eq!(
            policy_line("state", "meta"),
            r#"key_prefix "state/" { policy = "write" } key_prefix "meta/" { policy = "write" }"#
        );
    }

    /// A lost answer is settled by the keys as read again: all at their
    /// targets at new indexes is applied, one elsewhere can never commit,
    /// anything else is unknown.
    #[test]
    fn a_lost_answer_settles_as_the_re_read_shows() {
        let targets = [Target::Set(pct(50)), Target::Unset];
        let guards = [3, 4];
        let applied = [Held::Valid(pct(50), 9), Held::Absent];
        assert_eq!(settle(&targets, &applied, &guards), Settled::Applied);
        let not_yet = [Held::Valid(pct(25), 3), Held::Valid(pct(25), 4)];
        assert_eq!(settle(&targets, &not_yet, &guards), Settled::Unknown);
        let elsewhere = [Held::Valid(pct(25), 3), Held::Valid(Desired::DRAIN, 8)];
        assert_eq!(settle(&targets, &elsewhere, &guards), Settled::Moved(1));
        let half = [Held::Valid(pct(50), 9), Held::Valid(pct(25), 4)];
        assert_eq!(
            settle(&targets, &half, &guards),
            Settled::Unknown,
            "a transaction applies whole: one key at its target is not enough"
        );
    }
}
