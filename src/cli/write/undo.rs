//! The command lines the writers print, pure: the undo of what was
//! written, and any command line quoted so that it runs as printed.
//!
//! - [`undo_line`]: `set`s of the earlier values (with the reason and
//!   expiry they had), an `unset` of the keys that were absent.
//! - [`unrestorable`]: what the undo cannot put back, said.
//! - [`command_line`], [`shell_word`]: quoted for a shell, `--` before an
//!   identity starting with `-`.

use super::change::{until, Change};
use super::key::{Held, SHOWN_VALUE_BYTES};
use super::words::check_identity;
use crate::contract::record::cut;
use crate::contract::Desired;

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
    use super::super::change::Carried;
    use super::super::key::tests::pct;
    use super::super::key::Target;
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
