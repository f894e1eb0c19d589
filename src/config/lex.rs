//! Step one: argv and the environment -> [`LowArgs`], still as text.
//!
//! In: the arguments (without the program name) and a function that looks a
//! variable up. Out: `-h`/`-version`, or every setting's raw value with its
//! source, or the first syntax error on the command line.
//!
//! Always holds: flags take Go `flag` syntax (`-name value`, `-name=value`,
//! `--name value`, `--name=value`; a bool flag never takes the next
//! argument); a repeated flag keeps its last value; the environment is read
//! in [`read_env`] and nowhere else, and a variable never overrides a flag.

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

/// Walks argv in Go `flag` style. The walk knows which flags take a value,
/// so that a value such as `-1s` is never mistaken for a flag. `-h`, `-help`
/// and `-version` stop it at once, whatever follows (as Go stops at `-h`).
pub(super) fn lex(args: Vec<OsString>) -> Result<Lexed, UsageError> {
    let mut low = LowArgs::new();
    // The first flag, in table order, that was given a value that is not
    // UTF-8; reported only once the whole command line is known good.
    let mut not_utf8: Option<usize> = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| usage_error(format!("argument {a:?} is not valid UTF-8")))?;
        if arg == "--" {
            return match args.next() {
                Some(next) => Err(unexpected_argument(&next.to_string_lossy())),
                None => break,
            };
        }
        let (name, inline) = split_flag(&arg)?;
        match name {
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
        let value = match (flag.spec.kind, inline) {
            (_, Some(v)) => v.to_owned(),
            (Kind::Bool, None) => "true".to_owned(),
            (_, None) => match args.next().map(OsString::into_string) {
                Some(Ok(v)) => v,
                Some(Err(_)) => {
                    not_utf8 = Some(not_utf8.map_or(row, |first| first.min(row)));
                    continue;
                }
                None => return Err(usage_error(format!("flag needs an argument: -{name}"))),
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

/// `-name`, `--name`, `-name=value`, `--name=value` -> the name and the
/// value after `=`, if any.
fn split_flag(arg: &str) -> Result<(&str, Option<&str>), UsageError> {
    match go_flag(arg) {
        GoArg::Flag(name, value) => Ok((name, value)),
        GoArg::NotFlag => Err(unexpected_argument(arg)),
        GoArg::BadSyntax => Err(usage_error(format!("bad flag syntax: {arg:?}"))),
    }
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
