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

/// consul before 1.14 refuses a transaction of more operations.
pub const BATCH: usize = 64;

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
            Held::Invalid(raw, _) => format!("{} (invalid value {raw:?})", reply(Desired::READY)),
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
    pub fn render(self) -> String {
        match self {
            Target::Set(d) => reply(d),
            Target::Unset => format!("{} (absent)", reply(Desired::READY)),
        }
    }

    /// Whether writing it over `held` changes nothing.
    pub fn is_noop(self, held: &Held) -> bool {
        match (self, held) {
            (Target::Set(d), Held::Valid(h, _)) => d == *h,
            (Target::Unset, Held::Absent) => true,
            _ => false,
        }
    }
}

/// One key's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub identity: String,
    pub before: Held,
    pub after: Target,
}

impl Change {
    /// `IDENTITY: before -> after`, or that it is unchanged.
    pub fn line(&self) -> String {
        match self.after.is_noop(&self.before) {
            true => format!("{}: {} (unchanged)", self.identity, self.before.render()),
            false => format!(
                "{}: {} -> {}",
                self.identity,
                self.before.render(),
                self.after.render()
            ),
        }
    }
}

/// Checks `set` words (`IDENTITY=VALUE`) or `-f` lines (`IDENTITY VALUE`
/// or `IDENTITY=VALUE`, `#` comments, blank lines skipped): every bad one
/// is named with its reason.
pub fn parse_sets<'a>(
    items: impl Iterator<Item = (String, &'a str)>,
) -> Result<Vec<(String, Target)>, Vec<String>> {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (place, text) in items {
        let split = text
            .split_once('=')
            .or_else(|| text.trim().rsplit_once([' ', '\t']));
        let Some((identity, value)) = split else {
            bad.push(format!(
                "{place}: {text:?} is not IDENTITY=VALUE (nor IDENTITY VALUE)"
            ));
            continue;
        };
        let identity = identity.trim_end_matches([' ', '\t']);
        let identity = match place.starts_with("line") {
            true => identity.trim_start(),
            false => identity,
        };
        match (check_identity(identity), parse_value(value.as_bytes())) {
            (Ok(()), Ok(d)) => good.push((identity.to_owned(), Target::Set(d))),
            (Err(why), _) => bad.push(format!("{place}: {why}")),
            (_, Err(e)) => bad.push(format!(
                "{place}: {identity}: value {value:?} is invalid ({}): the agent would ignore it and answer ready 100%",
                e.label()
            )),
        }
    }
    finish(good, bad)
}

/// Checks `unset` words.
pub fn parse_unsets(words: &[String]) -> Result<Vec<(String, Target)>, Vec<String>> {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for w in words {
        match check_identity(w) {
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

/// The agent's rule for an identity that can ever be asked for.
pub fn check_identity(identity: &str) -> Result<(), String> {
    match parse_identity(identity) {
        Some(_) => Ok(()),
        None => Err(format!(
            "identity {identity:?} can never be asked for by haproxy (empty, ending in /, surrounded by whitespace, or holding control bytes)"
        )),
    }
}

/// One operation of a guarded transaction: `cas` (index 0 for a key that
/// must be absent) or `delete-cas`.
pub fn op(key: &str, target: Target, index: u64) -> serde_json::Value {
    match target {
        Target::Set(d) => {
            let value = base64::engine::general_purpose::STANDARD.encode(d.to_string());
            json!({"KV": {"Verb": "cas", "Key": key, "Value": value, "Index": index}})
        }
        Target::Unset => json!({"KV": {"Verb": "delete-cas", "Key": key, "Index": index}}),
    }
}

/// What consul said to a transaction.
#[derive(Debug, PartialEq, Eq)]
pub enum TxnAnswer {
    /// Applied: each written key's new ModifyIndex (deleted keys have none).
    Applied(Vec<(String, u64)>),
    /// 409: the first failed operation's position and consul's reason.
    Conflict(usize, String),
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
        (409, _, Some(errors)) => match errors.into_iter().min_by_key(|e| e.op_index) {
            Some(e) => Ok(TxnAnswer::Conflict(e.op_index, e.what)),
            None => Err("409 without an error".to_owned()),
        },
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

/// The command line that puts every changed key back as it was: a `set`
/// of the earlier values and an `unset` of the keys that were absent (or
/// held a value the agent ignored, which `set` refuses to write).
/// `common`: the consul words the command was given, repeated.
pub fn undo_line(changed: &[&Change], common: &[String]) -> Option<String> {
    let mut sets = Vec::new();
    let mut unsets = Vec::new();
    for c in changed {
        match &c.before {
            Held::Valid(d, _) => sets.push(format!("{}={d}", c.identity)),
            Held::Absent | Held::Invalid(..) => unsets.push(c.identity.clone()),
        }
    }
    let common: String = common
        .iter()
        .map(|w| format!(" {}", shell_word(w)))
        .collect();
    let command = |verb: &str, words: &[String]| {
        let words: Vec<String> = words.iter().map(|w| shell_word(w)).collect();
        format!("gitlab-haproxy-agent {verb}{common} {}", words.join(" "))
    };
    let lines: Vec<String> = [("set", sets), ("unset", unsets)]
        .iter()
        .filter(|(_, w)| !w.is_empty())
        .map(|(verb, w)| command(verb, w))
        .collect();
    (!lines.is_empty()).then(|| lines.join(" && "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Result<Vec<(String, Target)>, Vec<String>> {
        parse_sets(
            w.iter()
                .enumerate()
                .map(|(i, w)| (format!("argument {}", i + 1), *w)),
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
            op("p/a", Target::Set(pct(50)), 0),
            json!({"KV": {"Verb": "cas", "Key": "p/a", "Value": "NTAl", "Index": 0}})
        );
        assert_eq!(
            op("p/a", Target::Unset, 9),
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
            Ok(TxnAnswer::Conflict(1, "a".into()))
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
        };
        let b = Change {
            identity: "be/b b".into(),
            before: Held::Absent,
            after: Target::Set(Desired::DRAIN),
        };
        let c = Change {
            identity: "be/c".into(),
            before: Held::Valid(Desired::MAINT, 3),
            after: Target::Unset,
        };
        let common = ["-kv-prefix".to_owned(), "x y".to_owned()];
        assert_eq!(
            undo_line(&[&a, &b, &c], &common).unwrap(),
            "gitlab-haproxy-agent set -kv-prefix 'x y' be/a=50% be/c=maint && gitlab-haproxy-agent unset -kv-prefix 'x y' 'be/b b'"
        );
        assert_eq!(undo_line(&[], &[]), None);
    }
}
