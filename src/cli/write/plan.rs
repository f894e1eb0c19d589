//! The writers' pure half: what `set`/`unset` were asked (checked with the
//! agent's own rules), the change each key makes in reply terms, the
//! transaction that writes it guarded by check-and-set, what consul's
//! answer says, and the command line that undoes it.
//!
//! In: words or lines, the keys as read (value and ModifyIndex). Out:
//! [`Change`]s, transaction bodies, undo lines. Always holds: nothing here
//! does IO; a value is written in its canonical spelling.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use crate::contract::{parse_identity, parse_value, Desired};

/// consul before 1.14 refuses a transaction of more operations
/// (`agent/txn_endpoint.go` `maxTxnOps`, 128 since 1.14).
pub const BATCH: usize = 64;

/// consul refuses a transaction body over `txn_max_req_len` (512 KiB by
/// default) with 413 (`agent/txn_endpoint.go` `convertOps`).
pub const MAX_TXN_BYTES: usize = 512 * 1024;

/// How much of a value the writers show.
pub const SHOWN_VALUE_BYTES: usize = 80;

/// The text consul's denial starts with (`acl/errors.go`
/// `errPermissionDenied`); since 1.12 the token and the permission follow.
pub const PERMISSION_DENIED: &str = "Permission denied";

/// A key's state in KV, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    Absent,
    Valid(Desired, u64),
    /// A value the agent ignores (it answers `ready 100%`).
    Invalid(String, u64),
}

impl Held {
    pub fn of(value: Option<(&[u8], u64)>) -> Held {
        match value {
            None => Held::Absent,
            Some((raw, index)) => match parse_value(raw) {
                Ok(d) => Held::Valid(d, index),
                Err(_) => Held::Invalid(String::from_utf8_lossy(raw).into_owned(), index),
            },
        }
    }

    /// The ModifyIndex a check-and-set must name (0: must be absent).
    pub fn index(&self) -> u64 {
        match self {
            Held::Absent => 0,
            Held::Valid(_, i) | Held::Invalid(_, i) => *i,
        }
    }

    /// The reply the agent writes for it, with why when not the value's.
    pub fn render(&self) -> String {
        match self {
            Held::Absent => format!("{} (absent)", reply(Desired::READY)),
            Held::Valid(d, _) => reply(*d),
            Held::Invalid(raw, _) => format!(
                "{} (invalid value {:?})",
                reply(Desired::READY),
                cut(raw, SHOWN_VALUE_BYTES)
            ),
        }
    }

    /// The reply the agent writes for it.
    pub fn reply(&self) -> Desired {
        match self {
            Held::Valid(d, _) => *d,
            Held::Absent | Held::Invalid(..) => Desired::READY,
        }
    }

    /// The weight a ramp starts from: `None` for `maint` (no weight).
    pub fn weight(&self) -> Option<u16> {
        match self {
            Held::Valid(d, _) => match d.admin() {
                crate::contract::Admin::Ready => Some(d.weight_pct()),
                crate::contract::Admin::Drain => Some(0),
                crate::contract::Admin::Maint => None,
            },
            Held::Absent | Held::Invalid(..) => Some(100),
        }
    }
}

/// `text` cut to at most `max` bytes (on a character boundary), with `…`
/// when cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The reply line without its `\n`.
pub fn reply(d: Desired) -> String {
    String::from_utf8_lossy(d.reply()).trim_end().to_owned()
}

/// What one key is to become: a value, or deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Set(Desired),
    Unset,
}

impl Target {
    /// A weight other than 0% and 100%, which a static-algorithm backend
    /// ignores.
    pub fn intermediate(self) -> bool {
        matches!(self, Target::Set(d) if !matches!(d.weight_pct(), 0 | 100))
    }

    pub fn render(self) -> String {
        match self {
            Target::Set(d) => reply(d),
            Target::Unset => format!("{} (absent)", reply(Desired::READY)),
        }
    }

    /// Whether writing it over `held` changes nothing: a value whose reply
    /// is the reply of the valid value (or absence) held, or a delete of an
    /// absent key. A value over an invalid one is written: it fixes it.
    pub fn is_noop(self, held: &Held) -> bool {
        match (self, held) {
            (Target::Set(d), Held::Valid(..) | Held::Absent) => d.reply() == held.reply().reply(),
            (Target::Unset, Held::Absent) => true,
            _ => false,
        }
    }

    /// Whether `held` (read after the write) is this target, written at an
    /// index other than `guard` (the one the write was guarded by).
    pub fn is_held_in(self, held: &Held, guard: u64) -> bool {
        match (self, held) {
            (Target::Set(d), Held::Valid(h, i)) => d == *h && *i != guard,
            (Target::Unset, Held::Absent) => true,
            _ => false,
        }
    }
}

/// A key that a transaction's check-and-set can no longer match: its
/// ModifyIndex moved from the one the write is guarded by, to something
/// that is not the write's target. Consul never commits such a write
/// (`agent/consul/state/kvs.go` `kvsSetCASTxn`: a cas whose index differs
/// from the entry's "return false"; `txn.go` `TxnRW` applies all or
/// nothing), so after a lost answer it is a conflict, not an unknown: the
/// position of the first such key.
pub fn moved(targets: &[Target], held: &[Held], guards: &[u64]) -> Option<usize> {
    targets
        .iter()
        .zip(held)
        .zip(guards)
        .position(|((t, h), &g)| h.index() != g && !t.is_held_in(h, g))
}

/// What a write carries in its record and Flags: the reason and the
/// expiry (Unix seconds, 0: none), and whether each was kept from the key
/// it replaces (SPEC §13, "a record survives the runbook").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    pub reason: Option<String>,
    pub until: u32,
    pub kept_reason: bool,
    pub kept_until: bool,
}

impl Carried {
    /// `keeps reason "INC-123", until 2026-12-04T23:28:18Z`, or `None`
    /// when nothing was kept.
    pub fn keeps(&self) -> Option<String> {
        let mut kept = Vec::new();
        if let (true, Some(r)) = (self.kept_reason, &self.reason) {
            kept.push(format!("reason {r:?}"));
        }
        if self.kept_until {
            kept.push(format!("until {}", until(self.until)));
        }
        (!kept.is_empty()).then(|| format!("keeps {}", kept.join(", ")))
    }
}

/// An expiry as shown (Unix seconds, UTC).
fn until(e: u32) -> String {
    crate::logging::utc_seconds(u64::from(e))
}

/// One key's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub identity: String,
    pub before: Held,
    pub after: Target,
    /// The reason recorded before (none without a record, or for an
    /// absent key).
    pub reason: Option<String>,
    /// The expiry its Flags carry before (Unix seconds, 0: none).
    pub expiry: u32,
    /// What the write carries.
    pub carried: Carried,
}

impl Change {
    /// Nothing to write: the reply, the reason and the expiry stay as they
    /// are.
    pub fn is_noop(&self) -> bool {
        self.after.is_noop(&self.before)
            && self.expiry == self.carried.until
            && self.reason == self.carried.reason
    }

    /// `IDENTITY: before -> after`, or that it is unchanged; with what the
    /// write keeps of the record it replaces.
    pub fn line(&self) -> String {
        let after_until = |e: u32| match e {
            0 => String::new(),
            e => format!(" until {}", until(e)),
        };
        let before = format!("{}{}", self.before.render(), after_until(self.expiry));
        if self.is_noop() {
            return format!("{}: {before} (unchanged)", self.identity);
        }
        let c = &self.carried;
        let shown = match c.kept_until {
            true => 0,
            false => c.until,
        };
        let mut line = format!(
            "{}: {before} -> {}{}",
            self.identity,
            self.after.render(),
            after_until(shown)
        );
        if let Some(keeps) = c.keeps() {
            line.push_str(&format!(" ({keeps})"));
        }
        line
    }
}

/// Checks `set` words (`IDENTITY=VALUE`, split at the last `=`: values
/// never hold one) or `-f` lines (`IDENTITY VALUE` or `IDENTITY=VALUE`,
/// `#` comments, blank lines skipped): every bad one is named with its
/// reason. `max_line`: the longest identity haproxy can ask for.
pub fn parse_sets<'a>(
    items: impl Iterator<Item = (String, &'a str)>,
    max_line: usize,
) -> Result<Vec<(String, Target)>, Vec<String>> {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (place, text) in items {
        let line = place.starts_with("line");
        let Some((identity, value)) = split_set(text, line) else {
            bad.push(format!(
                "{place}: {:?} is not IDENTITY=VALUE (nor IDENTITY VALUE)",
                cut(text, SHOWN_VALUE_BYTES)
            ));
            continue;
        };
        match (check_identity(identity, Some(max_line)), parse_value(value.as_bytes())) {
            (Ok(()), Ok(d)) => good.push((identity.to_owned(), Target::Set(d))),
            (Err(why), _) => bad.push(format!("{place}: {why}")),
            (_, Err(e)) => bad.push(format!(
                "{place}: {identity}: value {:?} is invalid ({}): the agent would ignore it and answer ready 100%{}",
                cut(value, SHOWN_VALUE_BYTES),
                e.label(),
                meant(value)
            )),
        }
    }
    finish(good, bad)
}

/// A hint for a value a `%` short of a weight (`50`: did you mean 50%?).
fn meant(value: &str) -> String {
    let pct = format!("{}%", value.trim());
    match parse_value(pct.as_bytes()) {
        Ok(_) if !value.trim().is_empty() => format!("; did you mean {pct}?"),
        _ => String::new(),
    }
}

/// `IDENTITY=VALUE` at the last `=`; a file line may also be `IDENTITY
/// VALUE` (the first split whose value is valid wins, so `a=b drain` is
/// identity `a=b`).
fn split_set(text: &str, line: bool) -> Option<(&str, &str)> {
    let text = match line {
        true => text.trim(),
        false => text,
    };
    let at_eq = text.rsplit_once('=');
    let at_space = line.then(|| text.rsplit_once([' ', '\t'])).flatten();
    let splits = [at_eq, at_space];
    let mut splits = splits.iter().flatten().copied();
    let first = splits.clone().next()?;
    let (identity, value) = splits
        .find(|(_, v)| parse_value(v.as_bytes()).is_ok())
        .unwrap_or(first);
    Some((identity.trim_end_matches([' ', '\t']), value))
}

/// Checks `unset` words (any key under the prefix may be cleaned up).
pub fn parse_unsets(words: &[String]) -> Result<Vec<(String, Target)>, Vec<String>> {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for w in words {
        match check_identity(w, None) {
            Ok(()) => good.push((w.clone(), Target::Unset)),
            Err(why) => bad.push(why),
        }
    }
    finish(good, bad)
}

fn finish<T>(
    good: Vec<(String, T)>,
    mut bad: Vec<String>,
) -> Result<Vec<(String, T)>, Vec<String>> {
    let mut seen = std::collections::HashSet::new();
    for (identity, _) in &good {
        if !seen.insert(identity.as_str()) {
            bad.push(format!("{identity}: named twice"));
        }
    }
    match (bad.is_empty(), good.is_empty()) {
        (true, false) => Ok(good),
        (true, true) => Err(vec!["no IDENTITY given".to_owned()]),
        (false, _) => Err(bad),
    }
}

/// The agent's rule for an identity that can ever be asked for (SPEC §2),
/// and, given `max_line` (`-max-line-bytes`: a key to be written), no
/// longer than the longest request line the daemon reads and free of the
/// characters a terminal does not show (a zero-width space pasted from a
/// chat window would write a key no haproxy asks for, and the server
/// would go on taking traffic). `unset` takes any key, to clean it up.
pub fn check_identity(identity: &str, max_line: Option<usize>) -> Result<(), String> {
    let shown = cut(identity, SHOWN_VALUE_BYTES);
    if parse_identity(identity).is_none() {
        return Err(format!(
            "identity {shown:?} can never be asked for by haproxy (empty, ending in /, surrounded by whitespace, or holding control bytes)"
        ));
    }
    let invisible = identity.chars().find(|&c| crate::safe::hidden(c));
    if let (Some(c), Some(_)) = (invisible, max_line) {
        return Err(format!(
            "identity {shown:?} holds U+{:04X}, a control, invisible or bidi character (pasted text?): type it; a key that really holds one can be written with consul kv put",
            u32::from(c)
        ));
    }
    match max_line {
        Some(max) if identity.len() > max => Err(format!(
            "identity {shown:?} is {} bytes, longer than -max-line-bytes ({max}): the daemon can never be asked for it",
            identity.len()
        )),
        _ => Ok(()),
    }
}

/// Refuses an identity named twice (`ramp`'s words).
pub fn check_distinct(identities: &[String]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    match identities.iter().find(|i| !seen.insert(i.as_str())) {
        Some(i) => Err(format!("{i}: named twice")),
        None => Ok(()),
    }
}

/// One operation of a guarded transaction: `cas` (index 0 for a key that
/// must be absent) with `expires` in its Flags (0: cleared), or
/// `delete-cas`.
pub fn op(key: &str, target: Target, index: u64, expires: u32) -> serde_json::Value {
    match target {
        Target::Set(d) => {
            let value = base64::engine::general_purpose::STANDARD.encode(d.to_string());
            json!({"KV": {"Verb": "cas", "Key": key, "Value": value, "Flags": expires, "Index": index}})
        }
        Target::Unset => json!({"KV": {"Verb": "delete-cas", "Key": key, "Index": index}}),
    }
}

/// The operation on a key's record, beside its state key's in the same
/// transaction: `set` the record (`Some`), or `delete` it. Unguarded: the
/// state key's check-and-set guards the whole transaction.
pub fn record_op(key: &str, record: Option<&str>) -> serde_json::Value {
    match record {
        Some(r) => {
            let value = base64::engine::general_purpose::STANDARD.encode(r);
            json!({"KV": {"Verb": "set", "Key": key, "Value": value}})
        }
        None => json!({"KV": {"Verb": "delete", "Key": key}}),
    }
}

/// Deletes an orphan record (its state key gone) only while the key is
/// still absent.
pub fn orphan_ops(key: &str, record_key: &str) -> [serde_json::Value; 2] {
    [
        json!({"KV": {"Verb": "check-not-exists", "Key": key}}),
        record_op(record_key, None),
    ]
}

/// Splits groups of operations (each a key's: its operation count and
/// serialized length, in order) into transactions of at most [`BATCH`]
/// operations and at most [`MAX_TXN_BYTES`] of body (`[`, the operations,
/// `,` between, `]`), in order, never splitting a group (a key and its
/// record land together or not at all). A group too large alone is a
/// transaction alone (consul answers it 413, which is reported).
pub fn batches(groups: &[(usize, usize)]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut ops, mut bytes) = (0, 0, 2);
    for (i, &(n, size)) in groups.iter().enumerate() {
        // Each operation after the transaction's first follows a `,`.
        let more = size + n - 1 + usize::from(i > start);
        if i > start && (ops + n > BATCH || bytes + more > MAX_TXN_BYTES) {
            out.push(start..i);
            (start, ops, bytes) = (i, n, 2 + size + n - 1);
        } else {
            ops += n;
            bytes += more;
        }
    }
    if start < groups.len() {
        out.push(start..groups.len());
    }
    out
}

/// The ACL policy that lets the writers write both the state keys and
/// their records: one rule on the two prefixes' common parent.
pub fn policy_line(prefix: &str, meta: &str) -> String {
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

/// What consul said to a transaction.
#[derive(Debug, PartialEq, Eq)]
pub enum TxnAnswer {
    /// Applied: each written key's new ModifyIndex (deleted keys have none:
    /// consul's `Results` has no entry for a delete, so results are
    /// matched by key, never by position).
    Applied(Vec<(String, u64)>),
    /// 409: nothing applied; every failed operation (position, consul's
    /// reason), in order.
    Failed(Vec<(usize, String)>),
}

impl TxnAnswer {
    /// The operations consul denied for want of a permission (a 409 that
    /// is not a conflict), if any.
    pub fn denied(&self) -> Vec<usize> {
        match self {
            TxnAnswer::Applied(_) => Vec::new(),
            TxnAnswer::Failed(errors) => errors
                .iter()
                .filter(|(_, what)| what.starts_with(PERMISSION_DENIED))
                .map(|(at, _)| *at)
                .collect(),
        }
    }
}

/// The ModifyIndex each key holds after an applied transaction, from its
/// result (matched by key): `Some(0)` for a deleted key, `None` for a
/// written key consul returned no result for (a token that cannot read
/// it gets none: re-read it).
pub fn indexes_after(
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

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawAnswer {
    results: Option<Vec<RawResult>>,
    errors: Option<Vec<RawError>>,
}

#[derive(Deserialize)]
struct RawResult {
    #[serde(rename = "KV")]
    kv: Option<RawEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawEntry {
    key: String,
    modify_index: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawError {
    op_index: usize,
    what: String,
}

/// Reads consul's answer to `PUT /v1/txn` (status 200 or 409).
pub fn parse_answer(status: u16, body: &[u8]) -> Result<TxnAnswer, String> {
    let raw: RawAnswer =
        serde_json::from_slice(body).map_err(|e| format!("answer is not consul's: {e}"))?;
    match (status, raw.results, raw.errors) {
        (200, results, None) => Ok(TxnAnswer::Applied(
            results
                .unwrap_or_default()
                .into_iter()
                .filter_map(|r| r.kv)
                .map(|e| (e.key, e.modify_index))
                .collect(),
        )),
        (409, _, Some(mut errors)) if !errors.is_empty() => {
            errors.sort_by_key(|e| e.op_index);
            Ok(TxnAnswer::Failed(
                errors.into_iter().map(|e| (e.op_index, e.what)).collect(),
            ))
        }
        (409, _, _) => Err("409 without an error".to_owned()),
        _ => Err(format!("status {status} with an answer not matching it")),
    }
}

/// A word as a shell reads it back: quoted unless it is plain.
pub fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-/.:=%@+,".contains(&b));
    match plain {
        true => w.to_owned(),
        false => format!("'{}'", w.replace('\'', r"'\''")),
    }
}

/// The command line that puts every changed key back as it was: `set`s of
/// the earlier values, with the reason and the expiry each had where the
/// write changed them (`-reason`, `''` for none; `-until`, or `-for
/// none`), one `set` for each such pair; and an `unset` of the keys that
/// were absent (or held a value the agent ignored, which `set` refuses to
/// write: see [`unrestorable`]). `common`: the consul words the command
/// was given, repeated. It runs as printed: words are quoted for a shell,
/// and `--` comes before the identities when one starts with `-`.
pub fn undo_line(changed: &[&Change], common: &[String], max_line: usize) -> Option<String> {
    let mut sets: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut unsets = Vec::new();
    for c in changed {
        match &c.before {
            // `set` refuses an identity no haproxy can ask for:
            // [`unrestorable`] names it.
            Held::Valid(_, _) if check_identity(&c.identity, Some(max_line)).is_err() => {}
            Held::Valid(d, _) => {
                let flags = restoring(c, *d);
                let word = format!("{}={d}", c.identity);
                match sets.iter_mut().find(|(f, _)| *f == flags) {
                    Some((_, words)) => words.push(word),
                    None => sets.push((flags, vec![word])),
                }
            }
            Held::Absent | Held::Invalid(..) => unsets.push(c.identity.clone()),
        }
    }
    let mut lines: Vec<String> = sets
        .into_iter()
        .map(|(flags, words)| command_line("set", &[common, &flags].concat(), &words))
        .collect();
    if !unsets.is_empty() {
        lines.push(command_line("unset", common, &unsets));
    }
    (!lines.is_empty()).then(|| lines.join(" && "))
}

/// The record flags that put back the reason and the expiry `c` replaced
/// over `d` (its earlier value): none where the write kept them (a `set`
/// without them keeps what the key holds).
fn restoring(c: &Change, d: Desired) -> Vec<String> {
    let mut flags = Vec::new();
    if c.reason != c.carried.reason {
        flags.extend(["-reason".to_owned(), c.reason.clone().unwrap_or_default()]);
    }
    // A key answering ready 100% carries no expiry (`set` refuses one).
    let expiry = match d.reply() == Desired::READY.reply() {
        true => 0,
        false => c.expiry,
    };
    if expiry != c.carried.until {
        match expiry {
            0 => flags.extend(["-for".to_owned(), "none".to_owned()]),
            e => flags.extend(["-until".to_owned(), until(e)]),
        }
    }
    flags
}

/// `gitlab-haproxy-agent VERB COMMON... [--] WORDS...`, quoted for a shell.
pub fn command_line(verb: &str, common: &[String], words: &[String]) -> String {
    let mut line = format!("gitlab-haproxy-agent {verb}");
    for w in common {
        line.push(' ');
        line.push_str(&shell_word(w));
    }
    if words.iter().any(|w| w.starts_with('-')) {
        line.push_str(" --");
    }
    for w in words {
        line.push(' ');
        line.push_str(&shell_word(w));
    }
    line
}

/// The changed keys whose earlier value the undo cannot restore: a value
/// the agent ignored (`set` refuses to write it), said with the value.
pub fn unrestorable(changed: &[&Change], max_line: usize) -> Vec<String> {
    changed
        .iter()
        .filter_map(|c| match &c.before {
            Held::Invalid(raw, _) => Some(format!(
                "{} held {:?}, a value the agent ignores: the undo deletes it (the same answer, ready 100%) and cannot write it back",
                c.identity,
                cut(raw, SHOWN_VALUE_BYTES)
            )),
            Held::Valid(d, _) => check_identity(&c.identity, Some(max_line)).err().map(|why| {
                format!("{} held {d}, and set refuses it ({why}): the undo cannot write it back", cut(&c.identity, SHOWN_VALUE_BYTES))
            }),
            Held::Absent => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `unset` may delete a key no haproxy can ask for (cleanup), but the
    /// undo's `set` refuses its identity: the undo says it cannot restore
    /// it, and leaves it out instead of printing a line that fails.
    #[test]
    fn the_undo_of_an_identity_set_refuses_says_so_instead_of_failing() {
        let long = Change {
            identity: "L".repeat(300),
            before: Held::Valid(Desired::DRAIN, 7),
            after: Target::Unset,
            expiry: 0,
            reason: None,
            carried: Carried::default(),
        };
        let short = Change {
            identity: "be/a".into(),
            ..long.clone()
        };
        assert_eq!(
            undo_line(&[&long, &short], &[], 256).as_deref(),
            Some("gitlab-haproxy-agent set be/a=drain")
        );
        let note = unrestorable(&[&long, &short], 256);
        assert_eq!(note.len(), 1, "{note:?}");
        assert!(
            note[0].contains("held drain, and set refuses it"),
            "{note:?}"
        );
        assert_eq!(unrestorable(&[&long], 65536), Vec::<String>::new());
    }

    /// After a lost answer: a key moved elsewhere (another writer) is the
    /// one named; a key at our target at a new index (applied), or as it
    /// was (not applied yet), is not.
    #[test]
    fn a_key_moved_elsewhere_is_named_and_ours_or_unmoved_are_not() {
        let ready = |pct| Target::Set(Desired::ready_pct(pct).unwrap());
        let valid = |pct, i| Held::Valid(Desired::ready_pct(pct).unwrap(), i);
        let targets = [ready(50), ready(50), Target::Unset];
        let guards = [10, 11, 12];
        let unmoved = [valid(25, 10), valid(25, 11), valid(25, 12)];
        assert_eq!(moved(&targets, &unmoved, &guards), None);
        let applied = [valid(50, 20), valid(50, 20), Held::Absent];
        assert_eq!(moved(&targets, &applied, &guards), None);
        let operator = [
            valid(25, 10),
            Held::Valid(Desired::DRAIN, 15),
            valid(25, 12),
        ];
        assert_eq!(moved(&targets, &operator, &guards), Some(1));
        let deleted = [Held::Absent, valid(25, 11), valid(25, 12)];
        assert_eq!(moved(&targets, &deleted, &guards), Some(0));
    }

    fn words(w: &[&str]) -> Result<Vec<(String, Target)>, Vec<String>> {
        parse_sets(
            w.iter()
                .enumerate()
                .map(|(i, w)| (format!("argument {}", i + 1), *w)),
            256,
        )
    }

    fn pct(n: u16) -> Desired {
        Desired::ready_pct(n).unwrap()
    }

    #[test]
    fn values_and_identities_are_checked_with_the_agents_rules_and_every_bad_one_named() {
        let ok = words(&["be_web/srv1=drain", "be_api/x=050%", "b/y= MAINT\n"]).unwrap();
        assert_eq!(
            ok,
            [
                ("be_web/srv1".to_owned(), Target::Set(Desired::DRAIN)),
                ("be_api/x".to_owned(), Target::Set(pct(50))),
                ("b/y".to_owned(), Target::Set(Desired::MAINT)),
            ]
        );
        let bad = words(&[
            "be/a=drian",
            "be/b=up",
            "be/c=257%",
            "be/=drain",
            "be/d",
            "be/e=drain",
            "be/e=maint",
        ])
        .unwrap_err();
        assert_eq!(bad.len(), 6, "{bad:#?}");
        assert!(
            bad[0].starts_with("argument 1: be/a: value \"drian\" is invalid (syntax)"),
            "{}",
            bad[0]
        );
        assert!(bad[1].contains("(health_word)"));
        assert!(bad[2].contains("(out_of_range)"));
        assert!(bad[3].contains("identity \"be/\" can never be asked for"));
        assert!(bad[4].contains("is not IDENTITY=VALUE"));
        assert_eq!(bad[5], "be/e: named twice");
        assert!(parse_unsets(&[" be/x".to_owned()]).is_err());
        assert_eq!(words(&[]).unwrap_err(), ["no IDENTITY given"]);
    }

    #[test]
    fn file_lines_take_either_form() {
        let lines = ["be/a drain", "be/b=50%", "  be/c\tmaint  "];
        let got = parse_sets(
            lines
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("line {}", i + 1), *l)),
            256,
        )
        .unwrap();
        let ids: Vec<&str> = got.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(ids, ["be/a", "be/b", "be/c"]);
    }

    #[test]
    fn changes_render_in_reply_terms() {
        let c = |before, after| {
            Change {
                identity: "be/s1".into(),
                before,
                after,
                expiry: 0,
                reason: None,
                carried: Carried::default(),
            }
            .line()
        };
        assert_eq!(
            c(Held::Absent, Target::Set(Desired::DRAIN)),
            "be/s1: ready 100% (absent) -> drain 100%"
        );
        assert_eq!(
            c(Held::Valid(pct(50), 7), Target::Unset),
            "be/s1: ready 50% -> ready 100% (absent)"
        );
        assert_eq!(
            c(Held::Valid(Desired::DRAIN, 7), Target::Set(Desired::DRAIN)),
            "be/s1: drain 100% (unchanged)"
        );
        assert_eq!(
            c(Held::Absent, Target::Unset),
            "be/s1: ready 100% (absent) (unchanged)"
        );
        assert_eq!(
            c(Held::of(Some((b"drian", 3))), Target::Set(Desired::DRAIN)),
            "be/s1: ready 100% (invalid value \"drian\") -> drain 100%"
        );
        assert_eq!(Held::of(Some((b"maint", 1))).weight(), None);
        assert_eq!(Held::of(Some((b"drain", 1))).weight(), Some(0));
        assert_eq!(Held::of(Some((b"30%", 1))).weight(), Some(30));
        assert_eq!(Held::Absent.weight(), Some(100));
    }

    #[test]
    fn transactions_are_guarded_and_answers_read() {
        assert_eq!(
            op("p/a", Target::Set(pct(50)), 0, 0),
            json!({"KV": {"Verb": "cas", "Key": "p/a", "Value": "NTAl", "Flags": 0, "Index": 0}})
        );
        assert_eq!(
            op("p/a", Target::Unset, 9, 0),
            json!({"KV": {"Verb": "delete-cas", "Key": "p/a", "Index": 9}})
        );
        let ok = br#"{"Results":[{"KV":{"LockIndex":0,"Key":"p/a","Flags":0,"Value":null,"CreateIndex":5,"ModifyIndex":12}}],"Errors":null}"#;
        assert_eq!(
            parse_answer(200, ok),
            Ok(TxnAnswer::Applied(vec![("p/a".into(), 12)]))
        );
        let conflict =
            br#"{"Results":null,"Errors":[{"OpIndex":3,"What":"b"},{"OpIndex":1,"What":"a"}]}"#;
        assert_eq!(
            parse_answer(409, conflict),
            Ok(TxnAnswer::Failed(vec![(1, "a".into()), (3, "b".into())]))
        );
        assert!(parse_answer(200, conflict).is_err());
        assert!(parse_answer(409, b"nope").is_err());
    }

    #[test]
    fn the_undo_line_restores_every_changed_key() {
        let a = Change {
            identity: "be/a".into(),
            before: Held::Valid(pct(50), 3),
            after: Target::Set(Desired::DRAIN),
            expiry: 0,
            reason: None,
            carried: Carried::default(),
        };
        let b = Change {
            identity: "be/b b".into(),
            before: Held::Absent,
            after: Target::Set(Desired::DRAIN),
            expiry: 0,
            reason: None,
            carried: Carried::default(),
        };
        let c = Change {
            identity: "be/c".into(),
            before: Held::Valid(Desired::MAINT, 3),
            after: Target::Unset,
            expiry: 0,
            reason: None,
            carried: Carried::default(),
        };
        let common = ["-kv-prefix".to_owned(), "x y".to_owned()];
        assert_eq!(
            undo_line(&[&a, &b, &c], &common, 256).unwrap(),
            "gitlab-haproxy-agent set -kv-prefix 'x y' be/a=50% be/c=maint && gitlab-haproxy-agent unset -kv-prefix 'x y' 'be/b b'"
        );
        assert_eq!(undo_line(&[], &[], 256), None);
    }

    /// consul answers an ACL denial inside a transaction with the same 409
    /// as a failed check-and-set: `agent/consul/txn_endpoint.go` `preCheck`
    /// puts `kvsPreApply`'s error in `Errors` (`What: err.Error()`), and
    /// `acl/errors.go` `PermissionDeniedError.Error` starts it with
    /// "Permission denied" (1.12+ names the token and permission after it).
    #[test]
    fn a_denial_is_told_from_a_conflict_by_consuls_what_prefix() {
        let body = br#"{"Results":null,"Errors":[{"OpIndex":0,"What":"Permission denied: token with AccessorID 'abc' lacks permission 'key:write' on \"p/a\""},{"OpIndex":1,"What":"Permission denied"}]}"#;
        let answer = parse_answer(409, body).unwrap();
        assert_eq!(answer.denied(), [0, 1]);
        let stale = br#"{"Results":null,"Errors":[{"OpIndex":0,"What":"failed to set key \"p/a\", index is stale"}]}"#;
        assert_eq!(parse_answer(409, stale).unwrap().denied(), [] as [usize; 0]);
    }

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

    /// consul refuses a body over `txn_max_req_len` (512 KiB) with 413
    /// (`agent/txn_endpoint.go` `convertOps`): transactions are cut by
    /// bytes as well as by count, in order.
    #[test]
    fn transactions_are_cut_by_operations_and_by_bytes_in_order() {
        let one = |sizes: &[usize]| batches(&sizes.iter().map(|&s| (1, s)).collect::<Vec<_>>());
        assert_eq!(one(&[10; 130]), [0..64, 64..128, 128..130]);
        assert_eq!(one(&[]), [] as [std::ops::Range<usize>; 0]);
        // Three operations of 200 KiB: two fit (with `[`, `,`, `]`), not three.
        let big = 200 * 1024;
        assert_eq!(one(&[big; 3]), [0..2, 2..3]);
        // `[`, a, `,`, b, `]`: exactly the limit fits, a byte more does not.
        let (a, b) = (262_142, 262_143);
        assert_eq!(a + b + 3, MAX_TXN_BYTES);
        assert_eq!(one(&[a, b, 1]), [0..2, 2..3], "the limit itself fits");
        assert_eq!(one(&[a, b + 1]), [0..1, 1..2]);
        // A key and its record: 64 operations are 32 keys, never split.
        assert_eq!(batches(&[(2, 10); 65]), [0..32, 32..64, 64..65]);
        assert_eq!(
            batches(&[(2, 10); 33])[0],
            0..32,
            "33 keys: 66 operations, not in one"
        );
        // Their bytes count with the `,` between them: `[`, a, `,`, b, `]`.
        let fits = batches(&[(2, MAX_TXN_BYTES - 5), (1, 1)]);
        assert_eq!(
            (fits.len(), fits[0].clone()),
            (1, 0..2),
            "the limit itself fits"
        );
        assert_eq!(batches(&[(2, MAX_TXN_BYTES - 4), (1, 1)]), [0..1, 1..2]);
        assert_eq!(one(&[MAX_TXN_BYTES * 2, 5]), [0..1, 1..2]);
    }

    #[test]
    fn records_ride_with_their_key_and_one_policy_covers_both() {
        assert_eq!(
            record_op("m/a", Some("{}")),
            json!({"KV": {"Verb": "set", "Key": "m/a", "Value": "e30="}})
        );
        assert_eq!(
            record_op("m/a", None),
            json!({"KV": {"Verb": "delete", "Key": "m/a"}})
        );
        assert_eq!(
            op("p/a", Target::Set(Desired::DRAIN), 3, 1_800_000_000)["KV"]["Flags"],
            1_800_000_000
        );
        assert_eq!(
            orphan_ops("p/a", "m/a")[0]["KV"]["Verb"],
            "check-not-exists"
        );
        assert_eq!(
            policy_line("gitlab-haproxy-agent/state", "gitlab-haproxy-agent/meta"),
            r#"key_prefix "gitlab-haproxy-agent/" { policy = "write" }"#
        );
        assert_eq!(
            policy_line("state", "meta"),
            r#"key_prefix "state/" { policy = "write" } key_prefix "meta/" { policy = "write" }"#
        );
    }

    #[test]
    fn a_change_of_expiry_alone_is_written_and_shown() {
        let c = Change {
            identity: "be/a".into(),
            before: Held::Valid(Desired::DRAIN, 3),
            after: Target::Set(Desired::DRAIN),
            expiry: 0,
            reason: None,
            carried: Carried {
                until: 1_800_000_000,
                ..Carried::default()
            },
        };
        assert!(!c.is_noop());
        assert_eq!(
            c.line(),
            "be/a: drain 100% -> drain 100% until 2027-01-15T08:00:00Z"
        );
        let same = Change {
            expiry: 1_800_000_000,
            ..c
        };
        assert_eq!(
            same.line(),
            "be/a: drain 100% until 2027-01-15T08:00:00Z (unchanged)"
        );
    }

    /// The runbook: `set be/a=drain -reason INC-123 -for 2h`, then `set
    /// be/a=maint`: the second keeps the reason and the expiry, says so,
    /// and its undo puts back drain (keeping them too); a write that
    /// changed them has an undo that restores them.
    #[test]
    fn a_write_keeps_the_record_says_so_and_its_undo_restores_it() {
        let kept = Change {
            identity: "be/a".into(),
            before: Held::Valid(Desired::DRAIN, 3),
            after: Target::Set(Desired::MAINT),
            expiry: 1_800_000_000,
            reason: Some("INC-123".into()),
            carried: Carried {
                reason: Some("INC-123".into()),
                until: 1_800_000_000,
                kept_reason: true,
                kept_until: true,
            },
        };
        assert_eq!(
            kept.line(),
            "be/a: drain 100% until 2027-01-15T08:00:00Z -> maint 100% (keeps reason \"INC-123\", until 2027-01-15T08:00:00Z)"
        );
        assert_eq!(
            undo_line(&[&kept], &[], 256).as_deref(),
            Some("gitlab-haproxy-agent set be/a=drain")
        );
        let replaced = Change {
            carried: Carried {
                reason: Some("INC-9".into()),
                until: 0,
                ..Carried::default()
            },
            ..kept.clone()
        };
        assert_eq!(
            undo_line(&[&replaced], &[], 256).as_deref(),
            Some("gitlab-haproxy-agent set -reason INC-123 -until 2027-01-15T08:00:00Z be/a=drain")
        );
        let bare = Change {
            identity: "be/b".into(),
            expiry: 0,
            reason: None,
            carried: Carried {
                reason: Some("INC-9".into()),
                until: 1_800_000_000,
                ..Carried::default()
            },
            ..kept.clone()
        };
        assert_eq!(
            undo_line(&[&replaced, &bare, &kept], &[], 256).as_deref(),
            Some(concat!(
                "gitlab-haproxy-agent set -reason INC-123 -until 2027-01-15T08:00:00Z be/a=drain",
                " && gitlab-haproxy-agent set -reason '' -for none be/b=drain",
                " && gitlab-haproxy-agent set be/a=drain"
            ))
        );
    }

    #[test]
    fn a_number_without_its_percent_sign_gets_did_you_mean() {
        let bad = words(&["be/x=50", "be/y=drian"]).unwrap_err();
        assert!(
            bad[0].ends_with("answer ready 100%; did you mean 50%?"),
            "{bad:?}"
        );
        assert!(bad[1].ends_with("answer ready 100%"), "{bad:?}");
    }

    #[test]
    fn an_identity_holding_equals_signs_is_split_at_the_last_one() {
        let got = words(&["be/a=b=drain", "x==50%"]).unwrap();
        assert_eq!(
            got,
            [
                ("be/a=b".to_owned(), Target::Set(Desired::DRAIN)),
                ("x=".to_owned(), Target::Set(pct(50))),
            ]
        );
        let lines = ["be/a=b drain", "be/c d=maint"];
        let got = parse_sets(lines.iter().map(|l| ("line 1".to_owned(), *l)), 256).unwrap();
        assert_eq!(got[0], ("be/a=b".to_owned(), Target::Set(Desired::DRAIN)));
        assert_eq!(got[1], ("be/c d".to_owned(), Target::Set(Desired::MAINT)));
    }

    #[test]
    fn identities_the_daemon_can_never_be_asked_for_are_refused_by_set_not_unset() {
        let long = "b".repeat(257);
        let bad = words(&[&format!("{long}=drain")]).unwrap_err();
        assert!(
            bad[0].contains("257 bytes, longer than -max-line-bytes (256)"),
            "{bad:?}"
        );
        assert!(bad[0].len() < 300, "the identity is shown cut: {}", bad[0]);
        assert!(words(&[&format!("{}=drain", "b".repeat(256))]).is_ok());
        assert!(parse_unsets(&[long]).is_ok(), "unset may clean it up");
        // Pasted text: a zero-width space, a bidi override.
        for (id, code) in [
            ("be_web/srv1\u{200B}", "U+200B"),
            ("be_web/\u{202E}1vrs", "U+202E"),
            ("be_web/srv\u{9B}1", "U+009B"),
        ] {
            let bad = words(&[&format!("{id}=drain")]).unwrap_err();
            assert!(
                bad[0].contains(code) && bad[0].contains("pasted"),
                "{bad:?}"
            );
            assert!(!bad[0].contains('\u{200B}'), "shown escaped: {bad:?}");
            assert!(
                parse_unsets(&[id.to_owned()]).is_ok(),
                "unset may clean it up"
            );
        }
        assert_eq!(
            check_distinct(&["a".into(), "b".into(), "a".into()]).unwrap_err(),
            "a: named twice"
        );
    }

    #[test]
    fn a_write_answering_as_the_valid_value_held_is_unchanged_but_one_over_an_invalid_value_is_written(
    ) {
        assert!(Target::Set(Desired::READY).is_noop(&Held::Absent));
        assert!(Target::Set(pct(100)).is_noop(&Held::Absent));
        assert!(Target::Set(Desired::READY).is_noop(&Held::Valid(pct(100), 3)));
        assert!(!Target::Set(Desired::READY).is_noop(&Held::of(Some((b"drian", 3)))));
        assert!(!Target::Set(Desired::DRAIN).is_noop(&Held::Absent));
        assert!(!Target::Unset.is_noop(&Held::Valid(Desired::READY, 3)));
    }

    #[test]
    fn values_are_shown_cut_to_80_bytes() {
        let raw = "x".repeat(500 * 1024);
        let held = Held::of(Some((raw.as_bytes(), 3)));
        let shown = held.render();
        assert!(shown.len() < 140, "{shown}");
        assert!(shown.contains(&format!("{}…", "x".repeat(80))), "{shown}");
        assert_eq!(cut("héllo", 2), "h…", "on a character boundary");
    }

    #[test]
    fn the_undo_line_runs_as_printed_whatever_the_identities() {
        let change = |identity: &str, before| Change {
            identity: identity.into(),
            before,
            after: Target::Set(Desired::DRAIN),
            expiry: 0,
            reason: None,
            carried: Carried::default(),
        };
        let a = change("-x/a", Held::Valid(pct(50), 3));
        let b = change("be/a=b", Held::Valid(Desired::MAINT, 3));
        let c = change("it's", Held::Absent);
        let d = change("be/d", Held::of(Some((b"drian", 3))));
        assert_eq!(
            undo_line(&[&a, &b, &c, &d], &[], 256).unwrap(),
            r"gitlab-haproxy-agent set -- -x/a=50% be/a=b=maint && gitlab-haproxy-agent unset 'it'\''s' be/d"
        );
        let note = unrestorable(&[&a, &d], 256);
        assert_eq!(note.len(), 1);
        assert!(
            note[0].starts_with("be/d held \"drian\", a value the agent ignores"),
            "{note:?}"
        );
    }
}
