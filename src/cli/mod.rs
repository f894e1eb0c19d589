//! The operator commands, named by the first word of the command line
//! (without one, the command line is the daemon's, unchanged):
//!
//! - `ask IDENTITY`: ask the running agent exactly as haproxy does;
//! - `check-value VALUE|-`: the reply a KV value produces, before writing it;
//! - `status`: every diverted key, when this haproxy last asked for it, and
//!   the unasked ones with the identity probably meant;
//! - `lint-haproxy FILE…`: the agent-check settings of haproxy's config;
//! - `wait-drained IDENTITY…`: waits until haproxy holds no session for
//!   the servers named;
//! - `save-server-state`: haproxy's server state to its
//!   `server-state-file`, before a reload or stop.
//! - `set`, `unset`, `ramp`: write the desired state, checked, atomic,
//!   guarded against another writer ([`write`](mod@write)).
//!
//! Each is one row of `TABLE` (name, synopsis, summary, help, flags, run),
//! whence the top-level `-h`, the test of the first word, each command's
//! flag walk and `-h`, and the dispatch.
//!
//! In: the words after the command, the environment (for the same
//! `GITLAB_HAPROXY_AGENT_*` addresses the daemon reads), stdout and stderr.
//! Out: an exit code. Always holds: 0 ok, 1 a finding (no reply, an invalid
//! value, an unasked key, a lint error), 2 bad usage, with one line on
//! stderr saying what was wrong.

mod args;
mod ask;
mod drained;
mod fetch;
mod lint;
mod save_state;
pub(crate) mod status;
pub mod write;

use std::ffi::OsString;
use std::io::Write;

pub use args::{Args, Flags};

/// Where a command writes, and what it may read of the environment.
pub struct Io<'a> {
    pub out: &'a mut dyn Write,
    pub err: &'a mut dyn Write,
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// Standard input, for `check-value -`.
    pub stdin: &'a mut dyn std::io::Read,
    /// `out` is a terminal: live displays redraw in place.
    pub tty: bool,
}

/// Exit codes.
pub const OK: u8 = 0;
pub const FINDING: u8 = 1;
pub const USAGE: u8 = 2;

/// One operator command, a row of [`TABLE`]: the first word, its synopsis
/// and summary as the top-level `-h` lists them, its own `-h`, the flags
/// its words are walked by, and what runs it with them.
struct Command {
    name: &'static str,
    /// The words after the name (continuation lines indented).
    synopsis: &'static str,
    summary: &'static str,
    help: &'static str,
    flags: Flags,
    run: fn(&Args, &mut Io<'_>) -> u8,
}

/// The flags of `status` and the writers that name the record prefix.
const RECORDS: &[&str] = &write::RECORD_FLAGS;

/// The operator commands, in `-h` order: the top-level help, the test
/// of the first word, each command's flags and `-h`, and the dispatch all
/// come from here.
const TABLE: &[Command] = &[
    Command {
        name: "ask",
        synopsis: "IDENTITY [-listen-addr ADDR]",
        summary: "ask the running agent for IDENTITY exactly as haproxy does; print the reply line",
        help: ask::HELP,
        flags: Flags {
            values: &[&["listen-addr"]],
            bools: &[],
            daemon: false,
        },
        run: ask::run,
    },
    Command {
        name: "check-value",
        synopsis: "VALUE|-",
        summary: "print the reply a KV value produces, or why the agent would ignore it (- reads stdin)",
        help: CHECK_VALUE_HELP,
        flags: Flags::NONE,
        run: check_value,
    },
    Command {
        name: "status",
        synopsis: "[-pprof-addr ADDR] [-record-prefix PREFIX] [-json] [consul flags]",
        summary: "every diverted key: value, reply, when this haproxy last asked, BY, SINCE, REASON, UNTIL",
        help: status::HELP,
        flags: Flags {
            values: &[&[status::PPROF_ADDR, write::RECORD_PREFIX]],
            bools: &[status::JSON],
            daemon: true,
        },
        run: status::run,
    },
    Command {
        name: "lint-haproxy",
        synopsis: "FILE|DIR... [-listen-addr ADDR] [-max-line-bytes N] [-haproxy-version V | -haproxy-bin PATH] [-reply-up]",
        summary: "check the agent-check settings of haproxy configuration files, read as haproxy reads them",
        help: lint::HELP,
        flags: Flags {
            values: &[&["listen-addr", "max-line-bytes", "haproxy-version", "haproxy-bin"]],
            bools: &["reply-up"],
            daemon: false,
        },
        run: lint::run,
    },
    Command {
        name: "wait-drained",
        synopsis: "IDENTITY... -timeout DURATION [-haproxy-master-socket ADDR]... [-haproxy-socket ADDR]...
               [-prometheus URL] [-haproxy-config FILE]... [-require-drain] [-interval 1s] [-json]",
        summary: "wait until haproxy holds no session or queue for the servers named",
        help: drained::HELP,
        flags: Flags {
            values: &[&[
                "timeout",
                "interval",
                "haproxy-socket",
                "haproxy-master-socket",
                "prometheus",
                "prometheus-lookback",
                "expect-instances",
                "haproxy-config",
            ]],
            bools: &["json", "require-drain"],
            daemon: false,
        },
        run: drained::run,
    },
    Command {
        name: "save-server-state",
        synopsis: "(-haproxy-master-socket ADDR | -haproxy-socket ADDR) [-o FILE | -haproxy-config FILE] [-timeout 5s]",
        summary: "save haproxy's server state to its server-state-file, before every reload and stop",
        help: save_state::HELP,
        flags: Flags {
            values: &[&[
                "haproxy-master-socket",
                "haproxy-socket",
                "o",
                "haproxy-config",
                "timeout",
            ]],
            bools: &[],
            daemon: false,
        },
        run: save_state::run,
    },
    Command {
        name: "set",
        synopsis: "IDENTITY=VALUE... | -f FILE   [-reason TEXT] [-for DURATION|none | -until TIME] [-by WHO]
               [-haproxy-config FILE]... [-dry-run] [-json]",
        summary: "write servers' states, checked, in one guarded consul transaction, each with its record
        (a reason and an expiry not given are kept); prints the undo",
        help: write::SET_HELP,
        flags: Flags {
            values: &[&["f", "haproxy-config"], RECORDS],
            bools: &["dry-run", "json"],
            daemon: true,
        },
        run: write::set,
    },
    Command {
        name: "unset",
        synopsis: "IDENTITY... [-dry-run] [-json]",
        summary: "delete servers' keys (back to ready 100%), guarded as set",
        help: write::UNSET_HELP,
        flags: Flags {
            values: &[RECORDS],
            bools: &["dry-run", "json"],
            daemon: true,
        },
        run: write::unset,
    },
    Command {
        name: "ramp",
        synopsis: "IDENTITY... -to PCT -over DURATION [-from PCT] [-steps N|P1,P2,...] [-then drain|maint|unset]
               [-reason TEXT] [-for DURATION|none | -until TIME] [-haproxy-config FILE]... [-dry-run]",
        summary: "write intermediate weights on a schedule, stopping if anyone else writes",
        help: write::RAMP_HELP,
        flags: Flags {
            values: &[&["to", "over", "from", "steps", "then", "haproxy-config"], RECORDS],
            bools: &["dry-run"],
            daemon: true,
        },
        run: write::ramp,
    },
];

/// The commands, as `-h` lists them after the daemon's usage.
pub fn commands_help() -> String {
    let mut out =
        String::from("Operator commands (the first word; exit 0 ok, 1 a finding, 2 usage):\n");
    for c in TABLE {
        out.push_str(&format!(
            "  {} {}\n        {}\n",
            c.name, c.synopsis, c.summary
        ));
    }
    out.push_str("The writers take the daemon's consul flags and variables (-consul-addr, token, TLS, -kv-prefix).\n");
    out.push_str("Each takes -h for its own help.\n");
    out
}

/// Whether `word` names an operator command.
pub fn is_command(word: &str) -> bool {
    TABLE.iter().any(|c| c.name == word)
}

/// Runs the command `word` with the words after it, walked by its row's
/// flags: `-h` prints its help, a bad word is a usage error (one line,
/// exit 2).
pub fn run(word: &str, args: &[OsString], io: &mut Io<'_>) -> u8 {
    let Some(c) = TABLE.iter().find(|c| c.name == word) else {
        return usage_error(io, word, "not an operator command");
    };
    match Args::parse(args, &c.flags) {
        Ok(a) if a.help => {
            let _ = io.out.write_all(c.help.as_bytes());
            OK
        }
        Ok(a) => (c.run)(&a, io),
        Err(e) => usage_error(io, c.name, &e),
    }
}

/// The address to reach one of the agent's listeners, made loopback when
/// it names all interfaces.
fn target(
    a: &Args,
    io: &Io<'_>,
    flag: &str,
    default: &str,
) -> Result<std::net::SocketAddr, String> {
    listen_setting(a, io, flag, default).map(|addr| addr.connect_addr())
}

/// One of the daemon's settings as the daemon reads it: the flag, else its
/// variable, else the daemon's default; with where it came from, for an
/// error.
fn setting(a: &Args, io: &Io<'_>, flag: &str, default: &str) -> (String, String) {
    let var = format!(
        "GITLAB_HAPROXY_AGENT_{}",
        flag.to_uppercase().replace('-', "_")
    );
    match (a.value(flag), (io.env)(&var).filter(|v| !v.is_empty())) {
        (Some(v), _) => (v.to_owned(), format!("flag -{flag}")),
        (None, Some(v)) => (v, var),
        (None, None) => (default.to_owned(), format!("flag -{flag}")),
    }
}

/// One of the agent's listen addresses: the flag, else the daemon's
/// variable for it, else the daemon's default.
fn listen_setting(
    a: &Args,
    io: &Io<'_>,
    flag: &str,
    default: &str,
) -> Result<crate::config::ListenAddr, String> {
    let (text, from) = setting(a, io, flag, default);
    match crate::config::parse_listen_addr(&text) {
        Ok(Some(addr)) => Ok(addr),
        Ok(None) => Err(format!("{from} is empty: that listener is disabled")),
        Err(e) => Err(format!("invalid value {text:?} for {from}: {e}")),
    }
}

/// One line on stderr, exit 2.
fn usage_error(io: &mut Io<'_>, command: &str, message: &str) -> u8 {
    let _ = writeln!(
        io.err,
        "gitlab-haproxy-agent {command}: {message} (-h for help)"
    );
    USAGE
}

/// The largest value `check-value -` reads (consul's own limit is 512 KiB).
const MAX_STDIN_VALUE: u64 = 1 << 20;

const CHECK_VALUE_HELP: &str = "\
usage: gitlab-haproxy-agent check-value VALUE|-

Prints the reply line the agent writes for a KV value (ready 100%, drain 100%,
maint 100%, ready N%), or \"invalid: <reason>\" and exits 1 when the agent would
ignore the key (and answer ready 100%). - reads the value from standard input.
The same parser as the agent's: leading and trailing whitespace is trimmed,
words are case-insensitive.
";

/// `check-value VALUE|-`.
fn check_value(a: &Args, io: &mut Io<'_>) -> u8 {
    let [value] = &a.positional[..] else {
        return usage_error(
            io,
            "check-value",
            "give exactly one VALUE, or - to read it from stdin",
        );
    };
    let mut raw = Vec::new();
    if value == "-" {
        use std::io::Read;
        if let Err(e) = io.stdin.take(MAX_STDIN_VALUE + 1).read_to_end(&mut raw) {
            return usage_error(io, "check-value", &format!("cannot read stdin: {e}"));
        }
        if raw.len() as u64 > MAX_STDIN_VALUE {
            return usage_error(io, "check-value", "the value on stdin is over 1 MiB");
        }
    } else {
        raw = value.as_bytes().to_vec();
    }
    match crate::contract::parse_value(&raw) {
        Ok(d) => {
            let _ = io.out.write_all(d.reply());
            if d.admin() == crate::contract::Admin::Ready && d.weight_pct() < 100 {
                let _ = writeln!(io.err, "note: {}% is a share of the server line's weight: a server line without an explicit weight (default 1) gets weight 0", d.weight_pct());
            }
            OK
        }
        Err(reason) => {
            let _ = writeln!(io.out, "invalid: {}: {}", reason.label(), explain(reason));
            FINDING
        }
    }
}

fn explain(reason: crate::contract::InvalidValue) -> &'static str {
    use crate::contract::InvalidValue::*;
    match reason {
        Syntax => "not one of ready, drain, maint or N% (0 to 256); the agent ignores the key and answers ready 100%",
        HealthWord => "up, down, stopped and fail are health words: server health belongs to haproxy's own checks; the agent ignores the key and answers ready 100%",
        OutOfRange => "a weight past 256%; the agent ignores the key and answers ready 100%",
    }
}

#[cfg(test)]
mod tests;
