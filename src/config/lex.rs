//! Step one: argv and the environment -> [`LowArgs`], still as text.
//!
//! In: the arguments (without the program name) and a function that looks a
//! variable up. Out: `-h`/`-version`, or every setting's raw value with its
//! source, or the first syntax error on the command line.
//!
//! The walk over Go's flag syntax ([`go_flags`]) is the commands' too
//! ([`crate::cli::Args`]).
//!
//! Always holds:
//! - flags take Go `flag` syntax (`-name value`, `-name=value`, `--name
//!   value`, `--name=value`; a bool flag never takes the next argument);
//! - a repeated flag keeps its last value;
//! - the environment is read in [`read_env`] and nowhere else, and a
//!   variable never overrides a flag.

use std::ffi::OsString;

use super::check::{boolean, usage_error, UsageError};
use super::flags::{Kind, LowArgs, Raw, Source, FLAGS};
use crate::gocompat::{go_flag, GoArg};

pub(super) enum Lexed {
    Help,
    Version,
    Run(Box<LowArgs>),
}

fn unexpected_argument(arg: &str) -> UsageError {
    usage_error(format!(
        "unexpected argument {arg:?}: this program takes flags only (see -help)"
    ))
}

/// How a flag takes its value: `Value` the next argument unless given
/// `=value`; `Bool` never the next argument.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Takes {
    Value,
    Bool,
}

/// A flag's value, as given.
#[derive(Debug, PartialEq, Eq)]
pub enum Given {
    /// `-name` alone: a bool flag, or one the walk does not know.
    Alone,
    /// `-name=value`.
    Inline(String),
    /// `-name value`: the next argument, as it is (maybe not UTF-8).
    Next(OsString),
}

/// One step of a walk over Go `flag` syntax.
#[derive(Debug, PartialEq, Eq)]
pub enum Word {
    /// `word` as written, its name without dashes, and its value.
    Flag {
        word: String,
        name: String,
        given: Given,
    },
    /// Not a flag: after `--`, a lone `-`, anything without a dash; with
    /// `digits` a dash and a digit (`-5%`).
    Positional(String),
}

/// The one walker over Go's `flag` syntax, for the daemon and the
/// commands: `-name value`, `-name=value`, `--name`, a bool only as
/// `-name` or `-name=false`; `--` ends the flags (and is not a word).
/// `takes` says which flags take the next argument, so that a value such
/// as `-1s` is never mistaken for a flag; a flag it does not know is
/// returned alone for the caller to refuse.
pub struct GoFlags<I, F> {
    args: I,
    takes: F,
    digits: bool,
    over: bool,
}

/// Walks `args`; `digits`: a dash and a digit is a positional word.
pub fn go_flags<I, F>(args: I, takes: F, digits: bool) -> GoFlags<I::IntoIter, F>
where
    I: IntoIterator<Item = OsString>,
    F: Fn(&str) -> Option<Takes>,
{
    GoFlags {
        args: args.into_iter(),
        takes,
        digits,
        over: false,
    }
}

impl<I: Iterator<Item = OsString>, F: Fn(&str) -> Option<Takes>> Iterator for GoFlags<I, F> {
    type Item = Result<Word, String>;

    fn next(&mut self) -> Option<Result<Word, String>> {
        let word = match self.args.next()?.into_string() {
            Ok(w) if w == "--" && !self.over => {
                self.over = true;
                return self.next();
            }
            Ok(w) => w,
            Err(w) => return Some(Err(format!("argument {w:?} is not valid UTF-8"))),
        };
        let (name, inline) = match go_flag(&word) {
            _ if self.over => return Some(Ok(Word::Positional(word))),
            GoArg::Flag(name, _)
                if self.digits && name.starts_with(|c: char| c.is_ascii_digit()) =>
            {
                return Some(Ok(Word::Positional(word)))
            }
            GoArg::Flag(name, inline) => (name.to_owned(), inline.map(str::to_owned)),
            GoArg::NotFlag => return Some(Ok(Word::Positional(word))),
            GoArg::BadSyntax => return Some(Err(format!("bad flag syntax: {word:?}"))),
        };
        let given = match (inline, (self.takes)(&name)) {
            (Some(v), _) => Given::Inline(v),
            (None, Some(Takes::Value)) => match self.args.next() {
                Some(v) => Given::Next(v),
                None => return Some(Err(format!("flag needs an argument: -{name}"))),
            },
            (None, _) => Given::Alone,
        };
        Some(Ok(Word::Flag { word, name, given }))
    }
}

/// The daemon's walk ([`go_flags`] over [`FLAGS`]). `-h`, `-help` and
/// `-version` stop it at once, whatever follows (as Go stops at `-h`).
pub(super) fn lex(args: Vec<OsString>) -> Result<Lexed, UsageError> {
    let mut low = LowArgs::new();
    // The first flag, in table order, that was given a value that is not
    // UTF-8; reported only once the whole command line is known good.
    let mut not_utf8: Option<usize> = None;
    for word in go_flags(args, takes, false) {
        let (name, given) = match word.map_err(usage_error)? {
            Word::Positional(arg) => return Err(unexpected_argument(&arg)),
            Word::Flag { name, given, .. } => (name, given),
        };
        match name.as_str() {
            "h" | "help" => return Ok(Lexed::Help),
            "version" => return Ok(Lexed::Version),
            _ => {}
        }
        let mut flags = low.flags_mut();
        let Some(row) = flags.iter().position(|f| f.spec.name == name) else {
            return Err(usage_error(format!(
                "unknown flag -{name} (see -help)",
                name = name.escape_debug()
            )));
        };
        let flag = &mut flags[row];
        let value = match given {
            Given::Inline(v) => v,
            // Only a bool flag is alone.
            Given::Alone => "true".to_owned(),
            Given::Next(v) => match v.into_string() {
                Ok(v) => v,
                Err(_) => {
                    not_utf8 = Some(not_utf8.map_or(row, |first| first.min(row)));
                    continue;
                }
            },
        };
        let raw = Raw {
            value,
            source: Source::Flag(flag.spec.name),
        };
        if flag.spec.kind == Kind::Bool {
            // Go's `flag` checks a bool where it stands.
            boolean(&raw)?;
        }
        flag.raw = Some(raw);
    }
    if let Some(row) = not_utf8 {
        return Err(usage_error(format!(
            "flag -{}: argument is not a UTF-8 string",
            FLAGS[row].name
        )));
    }
    Ok(Lexed::Run(Box::new(low)))
}

/// How the daemon's flag `name` takes its value, if it has one by that
/// name.
pub fn takes(name: &str) -> Option<Takes> {
    FLAGS.iter().find(|f| f.name == name).map(|f| match f.kind {
        Kind::Bool => Takes::Bool,
        _ => Takes::Value,
    })
}

/// The one read of the environment: each flag not given on the command line
/// from its `GITLAB_HAPROXY_AGENT_*` variable, and every other variable of
/// the table. A variable set to `""` counts as unset, except a listener's,
/// where it disables the listener.
pub(super) fn read_env(low: &mut LowArgs, env: &dyn Fn(&str) -> Option<String>) {
    for flag in low.flags_mut().into_iter().filter(|f| f.raw.is_none()) {
        let var = flag.spec.env_var();
        let value = env(&var).filter(|v| flag.spec.kind == Kind::Listener || !v.is_empty());
        flag.raw = value.map(|value| Raw {
            value,
            source: Source::Env(var),
        });
    }
    for (spec, slot) in low.variables_mut() {
        *slot = env(spec.name).filter(|v| !v.is_empty()).map(|value| Raw {
            value,
            source: Source::Env(spec.name.to_owned()),
        });
    }
}
