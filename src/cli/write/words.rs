//! What `set`, `unset` and `ramp` were asked, checked with the agent's
//! own rules before anything is read or written, pure.
//!
//! - [`parse_sets`]: `IDENTITY=VALUE` words or `-f` lines.
//! - [`parse_unsets`], [`check_distinct`]: identities alone.
//! - [`check_identity`]: an identity a writer may write; every bad one is
//!   named with why.

use super::key::{Target, SHOWN_VALUE_BYTES};
use crate::contract::record::cut;
use crate::contract::{parse_identity, parse_value};

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

#[cfg(test)]
mod tests {
    use super::super::key::tests::pct;
    use super::*;
    use crate::contract::Desired;

    fn words(w: &[&str]) -> Result<Vec<(String, Target)>, Vec<String>> {
        parse_sets(
            w.iter()
                .enumerate()
                .map(|(i, w)| (format!("argument {}", i + 1), *w)),
            256,
        )
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
}
