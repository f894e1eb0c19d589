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
//!   guarded against another writer ([`write`]).
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

pub use args::Args;

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

/// The commands, as `-h` lists them.
pub const COMMANDS: &str = "\
Operator commands (the first word; exit 0 ok, 1 a finding, 2 usage):
  ask IDENTITY [-listen-addr ADDR]
        ask the running agent for IDENTITY exactly as haproxy does; print the reply line
  check-value VALUE|-
        print the reply a KV value produces, or why the agent would ignore it (- reads stdin)
  status [-pprof-addr ADDR] [-record-prefix PREFIX] [-json] [consul flags]
        every diverted key: value, reply, when this haproxy last asked, BY, SINCE, REASON, UNTIL
  lint-haproxy FILE|DIR... [-listen-addr ADDR] [-max-line-bytes N] [-haproxy-version V | -haproxy-bin PATH] [-reply-up]
        check the agent-check settings of haproxy configuration files, read as haproxy reads them
  wait-drained IDENTITY... -timeout DURATION [-haproxy-master-socket ADDR]... [-haproxy-socket ADDR]...
               [-prometheus URL] [-haproxy-config FILE]... [-require-drain] [-interval 1s] [-json]
        wait until haproxy holds no session or queue for the servers named
  save-server-state (-haproxy-master-socket ADDR | -haproxy-socket ADDR) [-o FILE | -haproxy-config FILE] [-timeout 5s]
        save haproxy's server state to its server-state-file, before every reload and stop
  set IDENTITY=VALUE... | -f FILE   [-reason TEXT] [-for DURATION|none | -until TIME] [-by WHO]
               [-haproxy-config FILE]... [-dry-run] [-json]
        write servers' states, checked, in one guarded consul transaction, each with its record
        (a reason and an expiry not given are kept); prints the undo
  unset IDENTITY... [-dry-run] [-json]
        delete servers' keys (back to ready 100%), guarded as set
  ramp IDENTITY... -to PCT -over DURATION [-from PCT] [-steps N|P1,P2,...] [-then drain|maint|unset]
               [-reason TEXT] [-for DURATION|none | -until TIME] [-haproxy-config FILE]... [-dry-run]
        write intermediate weights on a schedule, stopping if anyone else writes
The writers take the daemon's consul flags and variables (-consul-addr, token, TLS, -kv-prefix).
Each takes -h for its own help.
";

/// Whether `word` names an operator command.
pub fn is_command(word: &str) -> bool {
    matches!(
        word,
        "ask"
            | "check-value"
            | "status"
            | "lint-haproxy"
            | "wait-drained"
            | "save-server-state"
            | "set"
            | "unset"
            | "ramp"
    )
}

/// Runs the command `word` with the words after it.
pub fn run(word: &str, args: &[OsString], io: &mut Io<'_>) -> u8 {
    match word {
        "ask" => ask::run(args, io),
        "check-value" => check_value(args, io),
        "status" => status::run(args, io),
        "lint-haproxy" => lint::run(args, io),
        "wait-drained" => drained::run(args, io),
        "save-server-state" => save_state::run(args, io),
        "set" => write::set(args, io),
        "unset" => write::unset(args, io),
        "ramp" => write::ramp(args, io),
        _ => usage_error(io, word, "not an operator command"),
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

/// A command's words, parsed: `Err(exit code)` once `-h` printed `help`
/// or a usage error was reported.
fn begin(
    io: &mut Io<'_>,
    command: &str,
    help: &str,
    args: &[OsString],
    flags: (&[&'static str], &[&'static str]),
) -> Result<Args, u8> {
    match Args::parse(args, flags.0, flags.1) {
        Ok(a) if a.help => {
            let _ = io.out.write_all(help.as_bytes());
            Err(OK)
        }
        Ok(a) => Ok(a),
        Err(e) => Err(usage_error(io, command, &e)),
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
fn check_value(args: &[OsString], io: &mut Io<'_>) -> u8 {
    let a = match begin(io, "check-value", CHECK_VALUE_HELP, args, (&[], &[])) {
        Ok(a) => a,
        Err(code) => return code,
    };
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
