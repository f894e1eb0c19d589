//! `save-server-state`: writes haproxy's `show servers state` to the
//! `server-state-file` haproxy loads at its next start, so a reload or
//! restart starts each server as haproxy left it (drain, maint, the agent's
//! weight) instead of ready at full weight until its first agent check.
//!
//! In: one source (a master socket: the current worker of `show proc`,
//! never an old one; or a worker's stats socket), the file (`-o`, else the
//! configuration's `server-state-file`), a timeout. Out: the file replaced
//! atomically and one line; exit 0 saved, 1 not saved, 2 usage. Always
//! holds: the file is the old one, byte for byte, or a complete answer
//! ([`DumpReader`]), never a part; no temporary file is left.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::fetch::{cli, show_proc};
use super::lint::{config_env, read_config};
use super::{usage_error, Args, Io, FINDING, OK};
use crate::config::{parse_stats_socket, StatsSocket};
use crate::drain::process::{Dump, DumpReader, InfoReader};
use crate::drain::show::plural;
use crate::gocompat::parse_go_duration;
use crate::persist::Keep;

pub(super) const HELP: &str = "\
usage: gitlab-haproxy-agent save-server-state
           (-haproxy-master-socket ADDR | -haproxy-socket ADDR)
           [-o FILE | -haproxy-config FILE] [-timeout 5s]

Saves haproxy's server state (show servers state) to the server-state-file
haproxy loads when it starts, so that a reload or a restart keeps each
server's admin state (drain, maint) and the agent's weight: without it, the
new worker starts every server ready at full weight until that server's
first agent check, and drained and maint servers take traffic. Run it right
before every reload and stop (packaging/haproxy.service.d/ does, for
systemd), with haproxy configured to load the file:
    global
        server-state-file /var/lib/haproxy/server-state
    defaults
        load-server-state-from-file global

  -haproxy-master-socket ADDR  the master CLI (-S of haproxy's command line):
                        asks the current worker of show proc, never an old one
  -haproxy-socket ADDR  a worker's stats socket: a unix path, or
                        ipv4@HOST:PORT / ipv6@[HOST]:PORT (exactly one source)
  -o FILE               the file to write; else the server-state-file of
  -haproxy-config FILE  (default /etc/haproxy/haproxy.cfg; a directory as
                        haproxy reads it), joined to server-state-base when
                        relative
  -timeout DURATION     for the whole exchange (default 5s)
The file is replaced atomically (a temporary file beside it, fsync, rename),
its mode kept (0644 for a new file). Exit 0: saved, one line; 1: not saved
(the socket cannot be reached or answers too late, the answer is not a
complete show servers state or lists no server, the file cannot be
written), the file left as it was; 2: usage.
";

/// The configuration read when neither `-o` nor `-haproxy-config` is given.
const DEFAULT_CONFIG: &str = "/etc/haproxy/haproxy.cfg";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// A new file's mode: haproxy (often another user than the one saving)
/// reads it.
const NEW_FILE_MODE: u32 = 0o644;

/// Where the state comes from.
enum Source {
    Master(StatsSocket),
    Socket(StatsSocket),
}

struct Plan {
    source: Source,
    label: String,
    file: PathBuf,
    timeout: Duration,
}

pub(super) fn run(a: &Args, io: &mut Io<'_>) -> u8 {
    let plan = match plan(a, io) {
        Ok(plan) => plan,
        Err(e) => return usage_error(io, "save-server-state", &e),
    };
    let start = Instant::now();
    let saved = fetch(&plan.source, start + plan.timeout)
        .map_err(|why| format!("{}: {why}", plan.label))
        .and_then(|(dump, worker)| {
            write(&plan.file, &dump.bytes)?;
            Ok((dump, worker))
        });
    match saved {
        Ok((dump, worker)) => {
            let _ = writeln!(
                io.out,
                "saved {} of {} from haproxy worker {worker} ({}) to {} in {} ms",
                plural(dump.servers, "server", "servers"),
                plural(dump.backends, "backend", "backends"),
                plan.label,
                shown(&plan.file),
                start.elapsed().as_millis(),
            );
            OK
        }
        Err(why) => {
            let _ = writeln!(
                io.err,
                "gitlab-haproxy-agent save-server-state: {why}; {} left as it was",
                shown(&plan.file)
            );
            FINDING
        }
    }
}

fn plan(a: &super::Args, io: &Io<'_>) -> Result<Plan, String> {
    if let Some(word) = a.positional.first() {
        return Err(format!("unexpected argument {word:?}: it takes flags only"));
    }
    let masters = a.values("haproxy-master-socket");
    let sockets = a.values("haproxy-socket");
    let (flag, value) = match (&masters[..], &sockets[..]) {
        ([m], []) => ("haproxy-master-socket", *m),
        ([], [s]) => ("haproxy-socket", *s),
        _ => return Err("give exactly one source: -haproxy-master-socket ADDR (a master-worker haproxy) or -haproxy-socket ADDR".into()),
    };
    let at = parse_stats_socket(value)
        .map_err(|e| format!("invalid value {value:?} for flag -{flag}: {e}"))?;
    let source = match flag {
        "haproxy-master-socket" => Source::Master(at),
        _ => Source::Socket(at),
    };
    let timeout = match a.value("timeout") {
        None => DEFAULT_TIMEOUT,
        Some(v) => match parse_go_duration(v) {
            Some(Some(d)) if !d.is_zero() => d,
            _ => {
                return Err(format!(
                    "invalid value {v:?} for flag -timeout: a positive duration, e.g. 5s"
                ))
            }
        },
    };
    let file = match (a.value("o"), a.value("haproxy-config")) {
        (Some(_), Some(_)) => {
            return Err("give -o FILE or -haproxy-config FILE, not both".into());
        }
        (Some(""), None) => return Err("-o is empty".into()),
        (Some(o), None) => PathBuf::from(o),
        (None, config) => state_file_of(config.unwrap_or(DEFAULT_CONFIG), io)?,
    };
    Ok(Plan {
        source,
        label: value.to_owned(),
        file,
        timeout,
    })
}

/// A file name for the terminal: it may come from the configuration
/// (outside text).
fn shown(file: &Path) -> String {
    crate::safe::text(&file.to_string_lossy()).into_owned()
}

/// The `server-state-file` a configuration loads (joined to its
/// `server-state-base`).
fn state_file_of(config: &str, io: &Io<'_>) -> Result<PathBuf, String> {
    let mut files = Vec::new();
    read_config(config, &mut files).map_err(|e| format!("{e} (give -o FILE)"))?;
    let env = config_env(io.env);
    let path = crate::lint::server_state_path(&files, &env)
        .map_err(|why| format!("{config}: {why}: give -o FILE"))?;
    let path = path.ok_or_else(|| {
        format!("{config} sets no server-state-file in global: give -o FILE, or add server-state-file to global and load-server-state-from-file global to defaults")
    })?;
    if path.is_relative() {
        // haproxy opens it from its own working directory, not ours.
        return Err(format!("{config}'s server-state-file {} is relative and no server-state-base makes it absolute: haproxy opens it from its own working directory; give -o FILE, or an absolute name", path.display()));
    }
    Ok(path)
}

/// The answer, and the worker that gave it.
fn fetch(source: &Source, deadline: Instant) -> Result<(Dump, u64), String> {
    let state = |at: &StatsSocket, route: &str| {
        let mut reader = DumpReader::default();
        cli(at, &format!("{route}show servers state"), deadline, |d| {
            reader.feed(d)
        })?;
        reader.finish()
    };
    match source {
        Source::Socket(at) => {
            let mut info = InfoReader::default();
            cli(at, "show info", deadline, |d| info.feed(d))?;
            let pid = info.finish()?.pid;
            Ok((state(at, "")?, pid))
        }
        Source::Master(at) => {
            let current = |workers: Vec<crate::drain::process::Worker>| {
                let current: Vec<u64> = workers.iter().filter(|w| !w.old).map(|w| w.pid).collect();
                match current[..] {
                    [pid] => Ok(pid),
                    [] => {
                        Err("show proc lists only old workers (a reload in progress?)".to_owned())
                    }
                    _ => Err(format!("show proc lists {} current workers", current.len())),
                }
            };
            let pid = current(show_proc(at, deadline)?)?;
            let dump = state(at, &format!("@!{pid} "))?;
            // A reload while asking: the answer is the old worker's.
            let after = current(show_proc(at, deadline)?)?;
            if after != pid {
                return Err(format!(
                    "a reload while saving: worker {pid} answered, {after} is current now"
                ));
            }
            Ok((dump, pid))
        }
    }
}

/// Replaces `file` with `bytes`, keeping its mode and owner (haproxy, not
/// the saver, reads it).
fn write(file: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let keep = match std::fs::metadata(file) {
        Ok(m) => Keep {
            mode: m.permissions().mode() & 0o7777,
            owner: Some((m.uid(), m.gid())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Keep {
            mode: NEW_FILE_MODE,
            owner: None,
        },
        Err(e) => return Err(format!("cannot read {}: {e}", shown(file))),
    };
    crate::persist::write_atomically(file, bytes, Some(keep))
        .map_err(|e| format!("cannot write {}: {e}", shown(file)))
}
