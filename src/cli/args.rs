//! The words after an operator command: Go-style flags as the daemon
//! takes them, walked by its own walker ([`crate::config::go_flags`]):
//! `-name value`, `-name=value`, `--name value`; a bool flag alone or
//! `-name=true|false`; anywhere among the positional words; `--` ends the
//! flags; a lone `-`, and a word like `-5%` (a dash and a digit), are
//! positional.

use std::ffi::OsString;

use crate::config::{go_flags, Given, Takes, Word};
use crate::gocompat::parse_go_bool;

/// The flags a command takes: a column of its row in the command table
/// (`cli::TABLE`), from which its words are walked.
#[derive(Debug, Clone, Copy)]
pub struct Flags {
    /// Those that take a value, in groups (the records' words are one
    /// group, shared by the writers).
    pub values: &'static [&'static [&'static str]],
    /// Those that do not need one.
    pub bools: &'static [&'static str],
    /// The daemon's flags pass through, with their values, to
    /// [`Args::daemon`]: the writers and `status` take its consul
    /// settings.
    pub daemon: bool,
}

impl Flags {
    /// No flag but `-h`.
    pub const NONE: Flags = Flags {
        values: &[],
        bools: &[],
        daemon: false,
    };
}

/// What a command was given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    pub positional: Vec<String>,
    /// `(flag, value)`, the last one given winning.
    values: Vec<(&'static str, String)>,
    bools: Vec<(&'static str, bool)>,
    /// Flags of the daemon's, as given (each with its value), for the
    /// daemon's parser: the writers take its consul settings.
    pub daemon: Vec<String>,
    /// `-h`, `-help` or `--help`.
    pub help: bool,
    /// The words as given, for a writer's record of its command line.
    pub words: Vec<OsString>,
}

impl Args {
    /// Splits `args` by the flags a command takes. Anything else starting
    /// with `-` is an error, one line.
    pub fn parse(args: &[OsString], flags: &Flags) -> Result<Args, String> {
        let mut a = Args {
            words: args.to_vec(),
            ..Args::default()
        };
        let value = |name: &str| {
            let mut all = flags.values.iter().flat_map(|g| g.iter());
            all.find(|&&n| n == name).copied()
        };
        let own = |name: &str| value(name).or(flags.bools.iter().find(|&&n| n == name).copied());
        let daemon = |name: &str| match flags.daemon {
            true => crate::config::daemon_flag(name),
            false => None,
        };
        let takes = |name: &str| match (value(name), own(name)) {
            (Some(_), _) => Some(Takes::Value),
            (None, Some(_)) => Some(Takes::Bool),
            (None, None) => daemon(name),
        };
        for word in go_flags(args.iter().cloned(), takes, true) {
            let (word, name, given) = match word? {
                Word::Positional(w) => {
                    a.positional.push(w);
                    continue;
                }
                Word::Flag { word, name, given } => (word, name, given),
            };
            let next = matches!(given, Given::Next(_));
            let given = match given {
                Given::Alone => None,
                Given::Inline(v) => Some(v),
                Given::Next(v) => Some(
                    v.into_string()
                        .map_err(|v| format!("argument {v:?} is not valid UTF-8"))?,
                ),
            };
            match (own(&name), given) {
                _ if matches!(name.as_str(), "h" | "help") => a.help = true,
                (Some(n), Some(v)) if value(n).is_some() => a.values.push((n, v)),
                (Some(n), None) => a.bools.push((n, true)),
                (Some(n), Some(v)) => match parse_go_bool(&v) {
                    Some(b) => a.bools.push((n, b)),
                    None => return Err(format!("invalid value {v:?} for flag -{n}")),
                },
                (None, v) if daemon(&name).is_some() => {
                    a.daemon.push(word);
                    a.daemon.extend(v.filter(|_| next));
                }
                (None, _) => return Err(format!("flag provided but not defined: -{name}")),
            }
        }
        Ok(a)
    }

    /// The value of a flag, if given.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeatable flag, in the order given.
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.values
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn flag(&self, name: &str) -> bool {
        self.bools
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .is_some_and(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Args, String> {
        let words: Vec<OsString> = words.iter().map(OsString::from).collect();
        let flags = Flags {
            values: &[&["listen-addr"]],
            bools: &["json"],
            daemon: false,
        };
        Args::parse(&words, &flags)
    }

    #[test]
    fn flags_in_every_go_form_anywhere_among_the_words() {
        for words in [
            &["be/s1", "-listen-addr", "a:1"][..],
            &["-listen-addr=a:1", "be/s1"],
            &["--listen-addr", "a:1", "be/s1"],
            &["--listen-addr=b:2", "be/s1", "-listen-addr", "a:1"],
        ] {
            let a = parse(words).unwrap();
            assert_eq!(a.positional, ["be/s1"], "{words:?}");
            assert_eq!(a.value("listen-addr"), Some("a:1"), "{words:?}");
            assert_eq!(a.values("listen-addr").last(), Some(&"a:1"), "{words:?}");
            assert!(!a.flag("json") && !a.help);
        }
        assert!(parse(&["-json"]).unwrap().flag("json"));
        assert!(!parse(&["-json", "-json=false"]).unwrap().flag("json"));
        assert!(parse(&["-h"]).unwrap().help);
        assert!(parse(&["--help"]).unwrap().help);
    }

    #[test]
    fn the_daemons_flags_pass_through_with_their_values() {
        let words: Vec<OsString> = [
            "-consul-addr",
            "http://c:8500",
            "be/a=drain",
            "-json",
            "--kv-prefix=x",
            "-dev",
            "be/b",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let flags = Flags {
            values: &[],
            bools: &["json"],
            daemon: true,
        };
        let a = Args::parse(&words, &flags).unwrap();
        assert_eq!(a.positional, ["be/a=drain", "be/b"]);
        assert_eq!(
            a.daemon,
            ["-consul-addr", "http://c:8500", "--kv-prefix=x", "-dev"]
        );
        assert!(a.flag("json"));
        let words = [OsString::from("-consul-addr")];
        assert_eq!(
            Args::parse(&words, &flags).unwrap_err(),
            "flag needs an argument: -consul-addr"
        );
    }

    #[test]
    fn a_lone_dash_and_words_after_double_dash_are_positional() {
        assert_eq!(parse(&["-"]).unwrap().positional, ["-"]);
        assert_eq!(parse(&["-5%", "-1"]).unwrap().positional, ["-5%", "-1"]);
        let a = parse(&["--", "-json", "-x"]).unwrap();
        assert_eq!(a.positional, ["-json", "-x"]);
        assert!(!a.flag("json"));
    }

    #[test]
    fn unknown_flags_missing_values_and_bad_bools_are_one_line() {
        assert_eq!(
            parse(&["-nope"]).unwrap_err(),
            "flag provided but not defined: -nope"
        );
        assert_eq!(
            parse(&["x", "-listen-addr"]).unwrap_err(),
            "flag needs an argument: -listen-addr"
        );
        assert_eq!(
            parse(&["---json"]).unwrap_err(),
            "bad flag syntax: \"---json\""
        );
        assert_eq!(parse(&["--", "---json"]).unwrap().positional, ["---json"]);
        assert_eq!(
            parse(&["-consul-addr", "c:8500"]).unwrap_err(),
            "flag provided but not defined: -consul-addr",
            "the daemon's flags pass only where the row says so"
        );
        assert_eq!(
            parse(&["-json=maybe"]).unwrap_err(),
            "invalid value \"maybe\" for flag -json"
        );
    }
}
