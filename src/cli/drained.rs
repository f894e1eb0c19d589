//! `wait-drained IDENTITY… -timeout D`: polls haproxy (stats sockets,
//! Prometheus) until every server the identities name holds no session
//! and no queue anywhere, or the timeout.
//!
//! In: the identities, the sources, the timing flags. Out: a live table (a
//! terminal), a line per change (otherwise) or one JSON document (`-json`);
//! exit 0 drained, 1 at the timeout, 2 usage.
//!
//! Always holds:
//! - each poll asks every source at once and gives each at most the
//!   interval;
//! - what a source says is judged by [`crate::drain`], which never takes
//!   silence for 0.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::fetch::{cli, http_get, show_proc};
use super::lint::{config_env, read_config};
use super::{usage_error, Args, Io, FINDING, OK};
use crate::config::{parse_http_url, parse_stats_socket, StatsSocket};
use crate::drain::process::{InfoReader, Process, StateReader};
use crate::drain::stat::{ServerKey, ServerStat, StatReader};
use crate::drain::{judge, prom, show, Poll, Reading, Rules, Seen, Target};
use crate::gocompat::parse_go_duration;

pub(super) const HELP: &str = "\
usage: gitlab-haproxy-agent wait-drained IDENTITY... -timeout DURATION
           [-haproxy-master-socket ADDR]... [-haproxy-socket ADDR]...
           [-prometheus URL [-expect-instances N] [-prometheus-lookback 10m]]
           [-haproxy-config FILE]... [-interval 1s] [-require-drain] [-json]

Waits until no haproxy holds a session or a queued request for the servers
the identities name, asking haproxy itself:
  -haproxy-master-socket ADDR  the master CLI of a master-worker haproxy
                        (-S of its command line; repeatable): show proc, then
                        every worker, old ones left by a reload included,
                        summed. Give this one on a master-worker haproxy.
  -haproxy-socket ADDR  a worker's stats socket (repeatable): a unix path, or
                        ipv4@HOST:PORT / ipv6@[HOST]:PORT as haproxy writes
                        them; asked show info, show stat, show servers state.
                        It sees its own process only: a reload during the
                        wait is not drained and ends the wait at once, a
                        process younger than an hour (or hard-stop-after)
                        gets a warning
  -prometheus URL       http://HOST:PORT[/prefix] of a Prometheus scraping
                        haproxy's prometheus-exporter: sums
                        haproxy_server_current_sessions and _queue over
                        every instance; an instance that reported the server
                        within -prometheus-lookback (10m) and not now, or
                        whose process start time changed (a reload: ends
                        the wait at once) or is not exported, is not
                        drained; -expect-instances N
                        wants at least N instances reporting each server
An identity is backend/server (split at the first /), or with
-haproxy-config FILE (repeatable; a directory as haproxy reads it) the
agent-send of the agent-checked server lines that send it.
Drained: every source reports the server with 0 sessions and 0 queued. A
source that does not report it, cannot be reached, answers garbage, or a
Prometheus without data (or with fewer instances than asked) is not
drained, and the command says why; a server no source lists ends the wait
at once. A server taking new sessions (neither held in drain or maint by
its admin state, nor DRAIN or MAINT) gets a warning (0 sessions by chance);
-require-drain counts it as not drained. Polls every -interval (default
1s; each source gets at most that long to answer): a live table on a
terminal, else one line per change; -json prints the last poll as one
document. Exit 0: all drained; 1: the timeout (or at once: a server no
source lists, a reload a source cannot see behind), naming each server still holding sessions, where and how many; 2:
usage.
";

/// How far back Prometheus is asked which instances reported a server.
const DEFAULT_LOOKBACK: Duration = Duration::from_secs(600);
/// A stats socket's process younger than this gets a warning (unless the
/// configuration's `hard-stop-after` says how long old processes live).
const YOUNG: Duration = Duration::from_secs(3600);

/// The Unix time now, in seconds.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The largest Prometheus answer read: the query names only the servers
/// asked about (7 series per server per haproxy instance).
const MAX_PROMETHEUS_BODY: usize = 8 << 20;
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Where one poll asks.
enum Source {
    /// A worker's stats socket.
    Socket { label: String, at: StatsSocket },
    /// A master CLI socket: every worker it lists.
    Master { label: String, at: StatsSocket },
    Prometheus {
        label: String,
        addr: SocketAddr,
        host: String,
        prefix: String,
        lookback: Duration,
    },
}

impl Source {
    fn label(&self) -> &str {
        match self {
            Source::Socket { label, .. }
            | Source::Master { label, .. }
            | Source::Prometheus { label, .. } => label,
        }
    }

    /// Asks, by `deadline`.
    fn read(&self, servers: &[ServerKey], deadline: Instant) -> Reading {
        let got = match self {
            Source::Socket { at, .. } => stats_socket(at, servers, deadline),
            Source::Master { at, .. } => master(at, servers, deadline),
            Source::Prometheus {
                addr,
                host,
                prefix,
                lookback,
                ..
            } => {
                let ask = |target: String| http_json(*addr, host, &target, deadline);
                let reading = || -> Result<Reading, String> {
                    Ok(Reading::Prometheus(prom::Reading {
                        servers: prom::read_answer(&ask(prom::query_target(prefix, servers))?)?,
                        seen: prom::read_seen(&ask(prom::lookback_target(
                            prefix, servers, *lookback,
                        ))?)?,
                        starts: prom::read_starts(&ask(prom::start_times_target(prefix))?)?,
                        restarts: prom::read_starts(&ask(prom::restarts_target(
                            prefix, *lookback,
                        ))?)?,
                    }))
                };
                reading()
            }
        };
        got.unwrap_or_else(Reading::Failed)
    }
}

/// Everything the flags say.
struct Plan {
    targets: Vec<Target>,
    sources: Vec<Source>,
    rules: Rules,
    timeout: Duration,
    interval: Duration,
    json: bool,
}

pub(super) fn run(a: &Args, io: &mut Io<'_>) -> u8 {
    let plan = match plan(a, io) {
        Ok(plan) => plan,
        Err(e) => return usage_error(io, "wait-drained", &e),
    };
    wait(&plan, io)
}

fn plan(a: &super::Args, io: &Io<'_>) -> Result<Plan, String> {
    if a.positional.is_empty() {
        return Err("no IDENTITY given".into());
    }
    let duration = |flag: &str, default: Option<Duration>| match a.value(flag) {
        None => default.ok_or_else(|| format!("-{flag} is required (e.g. -{flag} 10m)")),
        Some(v) => match parse_go_duration(v) {
            Some(Some(d)) if !d.is_zero() => Ok(d),
            _ => Err(format!(
                "invalid value {v:?} for flag -{flag}: a positive duration, e.g. 10m"
            )),
        },
    };
    let timeout = duration("timeout", None)?;
    let interval = duration("interval", Some(Duration::from_secs(1)))?;
    if interval < MIN_INTERVAL {
        return Err(format!(
            "-interval {} is below {}",
            show::duration(interval),
            show::duration(MIN_INTERVAL)
        ));
    }
    let mut sources = Vec::new();
    for (flag, master) in [("haproxy-socket", false), ("haproxy-master-socket", true)] {
        for v in a.values(flag) {
            let at = parse_stats_socket(v)
                .map_err(|e| format!("invalid value {v:?} for flag -{flag}: {e}"))?;
            let label = v.to_owned();
            sources.push(match master {
                false => Source::Socket { label, at },
                true => Source::Master { label, at },
            });
        }
    }
    let urls = a.values("prometheus");
    let lookback = duration("prometheus-lookback", Some(DEFAULT_LOOKBACK))?;
    if a.value("prometheus-lookback").is_some() && urls.is_empty() {
        return Err("-prometheus-lookback needs -prometheus".into());
    }
    for v in &urls {
        let (addr, host, prefix) = parse_http_url(v).map_err(|e| {
            // Credentials in the URL: the value (a password) is not shown,
            // and consul's variable is no answer for Prometheus.
            let shown = match e.contains("not shown") {
                true => String::new(),
                false => format!(" {v:?}"),
            };
            let e = e.replace(" (use CONSUL_HTTP_AUTH)", "");
            format!("invalid value{shown} for flag -prometheus: {e}")
        })?;
        sources.push(Source::Prometheus {
            label: v.to_string(),
            addr,
            host,
            prefix,
            lookback,
        });
    }
    if sources.is_empty() {
        return Err(
            "no source: give -haproxy-master-socket ADDR, -haproxy-socket ADDR or -prometheus URL"
                .into(),
        );
    }
    let expect_instances = match a.value("expect-instances") {
        None => 0,
        Some(_) if urls.is_empty() => return Err("-expect-instances needs -prometheus".into()),
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| format!("invalid value {v:?} for flag -expect-instances: a count"))?,
    };
    let (targets, hard_stop_after) = targets(&a.positional, &a.values("haproxy-config"), io)?;
    Ok(Plan {
        targets,
        sources,
        rules: Rules {
            require_drain: a.flag("require-drain"),
            expect_instances,
            young_secs: hard_stop_after.unwrap_or(YOUNG).as_secs(),
        },
        timeout,
        interval,
        json: a.flag("json"),
    })
}

/// Each identity's servers: by the convention, or through the agent-send
/// of the configuration's server lines; and the configuration's
/// `hard-stop-after`, if it gives one.
fn targets(
    identities: &[String],
    configs: &[&str],
    io: &Io<'_>,
) -> Result<(Vec<Target>, Option<Duration>), String> {
    if configs.is_empty() {
        let targets = identities
            .iter()
            .map(|id| match id.split_once('/') {
                Some((b, s)) if !b.is_empty() && !s.is_empty() => Ok(Target {
                    identity: id.clone(),
                    servers: vec![(b.to_owned(), s.to_owned())],
                }),
                _ => Err(format!("identity {id:?} is not backend/server (give -haproxy-config to map it through agent-send)")),
            })
            .collect::<Result<_, _>>()?;
        return Ok((targets, None));
    }
    let mut files = Vec::new();
    for name in configs {
        read_config(name, &mut files)?;
    }
    let env = config_env(io.env);
    let sent = crate::lint::identities(&files, &env);
    let mut unknown = Vec::new();
    let mut targets = Vec::new();
    for id in identities {
        let servers: Vec<ServerKey> = sent
            .iter()
            .filter(|(sends, _, _)| sends == id.as_bytes())
            .map(|(_, b, s)| (b.clone(), s.clone()))
            .collect();
        if servers.is_empty() {
            unknown.push(format!("{id:?}"));
        }
        targets.push(Target {
            identity: id.clone(),
            servers,
        });
    }
    if !unknown.is_empty() {
        return Err(format!(
            "no agent-checked server line of {} sends {}",
            configs.join(", "),
            unknown.join(", ")
        ));
    }
    Ok((targets, crate::lint::hard_stop_after(&files, &env)))
}

/// How the polls are shown.
enum View {
    /// A terminal: the table redrawn in place (its line count so far).
    Table(usize),
    /// One line per row that changed: the last line of each row.
    Lines(HashMap<(String, String), String>),
    Json,
}

/// The polling loop.
fn wait(plan: &Plan, io: &mut Io<'_>) -> u8 {
    let start = Instant::now();
    let deadline = start + plan.timeout;
    let mut servers: Vec<ServerKey> = plan
        .targets
        .iter()
        .flat_map(|t| t.servers.clone())
        .collect();
    servers.sort();
    servers.dedup();
    let mut view = match (plan.json, io.tty) {
        (true, _) => View::Json,
        (false, true) => View::Table(0),
        (false, false) => View::Lines(HashMap::new()),
    };
    let mut seen = Seen::default();
    let mut first = true;
    loop {
        let polled = Instant::now();
        let readings = poll(&plan.sources, &servers, polled + plan.interval);
        let poll = judge(&plan.targets, &readings, &plan.rules, &mut seen, unix_now());
        let elapsed = start.elapsed();
        let drained = poll.drained(&plan.rules);
        // A server no source lists will not appear by waiting: said at once.
        let unlisted = first && !poll.unlisted().is_empty();
        first = false;
        // So is a reload that a worker's socket or Prometheus cannot see
        // behind: not drained for the rest of the run.
        let over = unlisted || poll.settled() || Instant::now() >= deadline;
        show_poll(&mut view, &poll, plan, elapsed, io);
        if drained || over {
            let text = match view {
                View::Json => {
                    let doc = show::json(&poll, &plan.rules, elapsed, plan.timeout);
                    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
                }
                _ => show::summary(&poll, &plan.rules, elapsed),
            };
            // haproxy's and Prometheus's answers are outside text (-json
            // too: the escapes are JSON's).
            let _ = io.out.write_all(crate::safe::output(&text).as_bytes());
            let _ = io.out.flush();
            return if drained { OK } else { FINDING };
        }
        let next = (polled + plan.interval).min(deadline);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

fn show_poll(view: &mut View, poll: &Poll, plan: &Plan, elapsed: Duration, io: &mut Io<'_>) {
    let text = match view {
        View::Json => return,
        View::Table(drawn) => {
            let progress = show::progress(poll, &plan.rules, elapsed, plan.timeout);
            let table = format!("{progress}\n{}", show::table(poll, &plan.rules));
            let table = crate::safe::output(&table).into_owned();
            // A wrapped line would take two rows and break the redraw.
            let table = match terminal_width() {
                Some(width) => clip(&table, width),
                None => table,
            };
            // Back to the first line drawn, and clear what was below it.
            let up = match *drawn {
                0 => String::new(),
                n => format!("\x1b[{n}F\x1b[J"),
            };
            *drawn = table.lines().count();
            up + &table
        }
        View::Lines(last) => {
            let mut text = String::new();
            for row in &poll.rows {
                let line = crate::safe::text(&show::line(row, &plan.rules)).into_owned();
                let key = (row.server.clone(), row.source.clone());
                if last.get(&key) != Some(&line) {
                    text += &format!("{:>6} {line}\n", show::duration(elapsed));
                    last.insert(key, line);
                }
            }
            text
        }
    };
    let _ = io.out.write_all(text.as_bytes());
    let _ = io.out.flush();
}

/// The width of the terminal on stdout, if it says.
fn terminal_width() -> Option<usize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills the winsize it is given.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (rc == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// Each line of `text` cut to fewer than `width` chars.
fn clip(text: &str, width: usize) -> String {
    text.lines()
        .map(|l| l.chars().take(width.saturating_sub(1)).collect::<String>() + "\n")
        .collect()
}

/// Asks every source at once, each by `deadline`.
fn poll(sources: &[Source], servers: &[ServerKey], deadline: Instant) -> Vec<(String, Reading)> {
    std::thread::scope(|scope| {
        let asks: Vec<_> = sources
            .iter()
            .map(|s| scope.spawn(move || s.read(servers, deadline)))
            .collect();
        sources
            .iter()
            .zip(asks)
            .map(|(s, ask)| {
                let reading = ask
                    .join()
                    .unwrap_or_else(|_| Reading::Failed("the reader panicked".into()));
                (s.label().to_owned(), reading)
            })
            .collect()
    })
}

/// A worker's stats socket (or a master's route to one: `route` is `@!PID `):
/// `show info` (when `info`), `show stat` and `show servers state` for
/// `servers`, one connection each.
fn worker(
    at: &StatsSocket,
    route: &str,
    servers: &[ServerKey],
    deadline: Instant,
) -> Result<HashMap<ServerKey, ServerStat>, String> {
    let wanted: HashSet<ServerKey> = servers.iter().cloned().collect();
    let mut stat = StatReader::new(wanted.clone());
    // -1 4 -1: every proxy's servers (type 4), no frontend or backend row.
    cli(at, &format!("{route}show stat -1 4 -1"), deadline, |d| {
        stat.feed(d)
    })?;
    let mut stats = stat.finish()?;
    let mut state = StateReader::new(wanted);
    cli(at, &format!("{route}show servers state"), deadline, |d| {
        state.feed(d)
    })?;
    for (key, admin) in state.finish()? {
        if let Some(s) = stats.get_mut(&key) {
            s.admin = Some(admin);
        }
    }
    Ok(stats)
}

/// A stats socket: the process answering it, and its servers.
fn stats_socket(
    at: &StatsSocket,
    servers: &[ServerKey],
    deadline: Instant,
) -> Result<Reading, String> {
    let before = show_info(at, deadline)?;
    let servers = worker(at, "", servers, deadline)?;
    // A reload between the questions would pass the new process's counts
    // for the old one's: asked again, a change is a reload.
    let after = show_info(at, deadline)?;
    Ok(Reading::Socket {
        process: [before, after],
        servers,
    })
}

/// Which process answers `at`.
fn show_info(at: &StatsSocket, deadline: Instant) -> Result<Process, String> {
    let mut info = InfoReader::default();
    cli(at, "show info", deadline, |d| info.feed(d))?;
    info.finish()
}

/// A master socket: `show proc`, then every worker's servers, old ones
/// included (each worker asked at once), then `show proc` again.
fn master(at: &StatsSocket, servers: &[ServerKey], deadline: Instant) -> Result<Reading, String> {
    let workers = show_proc(at, deadline)?;
    let answers = std::thread::scope(|scope| {
        let asks: Vec<_> = workers
            .iter()
            .map(|w| scope.spawn(move || worker(at, &format!("@!{} ", w.pid), servers, deadline)))
            .collect();
        asks.into_iter()
            .map(|ask| {
                ask.join()
                    .unwrap_or_else(|_| Err("the reader panicked".into()))
            })
            .collect::<Vec<_>>()
    });
    // A reload while the workers were asked leaves a worker unasked: this
    // poll cannot be trusted (the next one asks them all).
    if show_proc(at, deadline)? != workers {
        return Err(
            "the workers changed while they were asked (a reload): asked again at the next poll"
                .into(),
        );
    }
    Ok(Reading::Master(workers.into_iter().zip(answers).collect()))
}

/// A Prometheus API answer's body (status 200), or why not.
fn http_json(
    addr: SocketAddr,
    host: &str,
    target: &str,
    deadline: Instant,
) -> Result<Vec<u8>, String> {
    let (status, body) = http_get(addr, host, target, deadline, MAX_PROMETHEUS_BODY)?;
    if status == 200 {
        return Ok(body);
    }
    // Prometheus explains a refusal in the usual JSON.
    match prom::read_answer(&body) {
        Err(why) if why.starts_with("Prometheus answered") => {
            Err(format!("HTTP status {status}: {why}"))
        }
        _ => Err(format!("HTTP status {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// A loopback server running `serve` on each of its first `n`
    /// connections (each on its own thread).
    fn server(n: usize, serve: fn(TcpStream)) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in l.incoming().take(n).flatten() {
                std::thread::spawn(move || serve(conn));
            }
        });
        addr
    }

    fn socket_source(addr: SocketAddr) -> Source {
        Source::Socket {
            label: format!("ipv4@{addr}"),
            at: StatsSocket::Tcp(addr),
        }
    }

    fn servers() -> Vec<ServerKey> {
        vec![("app".into(), "s1".into())]
    }

    /// Reads the command line, as haproxy does, then the rest.
    fn read_request(s: &mut TcpStream) {
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
    }

    /// Reads the command, up to its newline.
    fn read_command<S: Read>(s: &mut S) -> String {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\n") && matches!(s.read(&mut byte), Ok(1)) {
            line.push(byte[0]);
        }
        String::from_utf8_lossy(&line).trim_end().to_owned()
    }

    const STAT: &[u8] = b"# pxname,svname,qcur,qmax,scur,status\napp,s1,0,0,2,DRAIN\n\n";
    const INFO: &[u8] = b"Name: HAProxy\nPid: 42\nStart_time_sec: 1000\n\n";
    const STATE: &[u8] = b"1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n2 app 1 s1 127.0.0.1 2 8\n\n";
    const STATE_READY: &[u8] = b"1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n2 app 1 s1 127.0.0.1 2 0\n\n";

    /// A stats socket's answer to `command`.
    fn answer(command: &str) -> &'static [u8] {
        match command {
            "show info" => INFO,
            "show stat -1 4 -1" => STAT,
            "show servers state" => STATE,
            _ => b"Unknown command.\n\n",
        }
    }

    /// A loopback stats socket answering [`answer`].
    fn stats_server() -> SocketAddr {
        server(30, |mut s| {
            let command = read_command(&mut s);
            let _ = s.write_all(answer(&command));
        })
    }

    #[test]
    fn a_stats_socket_answer_is_read_over_tcp_and_unix() {
        let addr = stats_server();
        let deadline = Instant::now() + Duration::from_secs(5);
        let Reading::Socket {
            process,
            servers: got,
        } = socket_source(addr).read(&servers(), deadline)
        else {
            panic!("not read");
        };
        assert_eq!(got[&servers()[0]].sessions, 2);
        assert_eq!(got[&servers()[0]].admin, Some(8));
        assert_eq!(
            process,
            [Process {
                pid: 42,
                start: Some(1000)
            }; 2]
        );

        let path = std::env::temp_dir().join(format!("gha-wd-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let mut commands = Vec::new();
            for _ in 0..4 {
                let (mut s, _) = l.accept().unwrap();
                let command = read_command(&mut s);
                // The command is followed by the client's half-close.
                assert_eq!(s.read(&mut [0u8; 8]).unwrap(), 0, "{command}");
                s.write_all(answer(&command)).unwrap();
                commands.push(command);
            }
            commands
        });
        let unix = Source::Socket {
            label: "x".into(),
            at: StatsSocket::Unix(path.clone()),
        };
        let Reading::Socket { servers: got, .. } = unix.read(&servers(), deadline) else {
            panic!("not read");
        };
        assert_eq!(got[&servers()[0]].status, "DRAIN");
        assert_eq!(
            t.join().unwrap(),
            [
                "show info",
                "show stat -1 4 -1",
                "show servers state",
                "show info"
            ]
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_master_socket_is_asked_for_every_worker_old_ones_too() {
        let addr = server(30, |mut s| {
            let command = read_command(&mut s);
            let reply: Vec<u8> = match command.split_once(' ') {
                _ if command == "show proc" => b"#<PID> <type> <reloads> <uptime> <version>\n1 master 1 0d 3.4.0\n# workers\n20 worker 0 0d 3.4.0\n# old workers\n10 worker 1 0d 3.4.0\n".to_vec(),
                Some(("@!20", rest)) => answer(rest).to_vec(),
                // The old worker holds 5 sessions and knows the server as ready.
                Some(("@!10", "show stat -1 4 -1")) => b"# pxname,svname,qcur,scur,status\napp,s1,0,5,UP\n\n".to_vec(),
                Some(("@!10", "show servers state")) => STATE_READY.to_vec(),
                _ => b"Unknown command.\n\n".to_vec(),
            };
            let _ = s.write_all(&reply);
        });
        let master = Source::Master {
            label: "master".into(),
            at: StatsSocket::Tcp(addr),
        };
        let reading = master.read(&servers(), Instant::now() + Duration::from_secs(5));
        let poll = judge(
            &[Target {
                identity: "app/s1".into(),
                servers: servers(),
            }],
            &[("master".into(), reading)],
            &Rules::default(),
            &mut Seen::default(),
            0,
        );
        let row = &poll.rows[0];
        assert_eq!(
            (row.sessions, row.status.as_str(), row.admin),
            (Some(7), "DRAIN", Some(8)),
            "{row:?}"
        );
        assert_eq!(
            row.holders,
            [
                "worker 20: 2 sessions, 0 queued",
                "worker 10 (old): 5 sessions, 0 queued"
            ]
        );
        assert_eq!(show::line(row, &Rules::default()), "app/s1 at master [20, 10 old]: 7 sessions, 0 queued, DRAIN: holding: worker 20: 2 sessions, 0 queued; worker 10 (old): 5 sessions, 0 queued");
    }

    /// A reload between the questions of one poll (show info answered by
    /// the old process, the rest by the new): a reload, not drained.
    #[test]
    fn a_reload_between_the_questions_of_one_poll_is_a_reload() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static INFOS: AtomicUsize = AtomicUsize::new(0);
        let addr = server(30, |mut s| {
            let command = read_command(&mut s);
            let reply: &[u8] = match command.as_str() {
                "show info" if INFOS.fetch_add(1, Ordering::SeqCst) == 0 => INFO,
                "show info" => b"Name: HAProxy\nPid: 43\nStart_time_sec: 1000\n\n",
                other => answer(other),
            };
            let _ = s.write_all(reply);
        });
        let reading = socket_source(addr).read(&servers(), Instant::now() + Duration::from_secs(5));
        let targets = [Target {
            identity: "app/s1".into(),
            servers: servers(),
        }];
        let poll = judge(
            &targets,
            &[("a".into(), reading)],
            &Rules::default(),
            &mut Seen::default(),
            0,
        );
        let problem = poll.rows[0].problem.clone().unwrap_or_default();
        assert!(
            problem.starts_with("haproxy reloaded during the wait (process 42 is now 43)"),
            "{poll:?}"
        );
    }

    /// A reload while a master's workers are asked (a worker left unasked):
    /// that poll fails.
    #[test]
    fn workers_that_change_while_asked_fail_the_poll() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static PROCS: AtomicUsize = AtomicUsize::new(0);
        let addr = server(30, |mut s| {
            let command = read_command(&mut s);
            let reply: Vec<u8> = match command.split_once(' ') {
                _ if command == "show proc" => {
                    let pid = 20 + PROCS.fetch_add(1, Ordering::SeqCst);
                    format!("#<PID> <type>\n1 master\n# workers\n{pid} worker\n").into_bytes()
                }
                Some((_, rest)) => answer(rest).to_vec(),
                None => Vec::new(),
            };
            let _ = s.write_all(&reply);
        });
        let master = Source::Master {
            label: "m".into(),
            at: StatsSocket::Tcp(addr),
        };
        let reading = master.read(&servers(), Instant::now() + Duration::from_secs(5));
        assert!(
            matches!(&reading, Reading::Failed(why) if why.starts_with("the workers changed while they were asked")),
            "{reading:?}"
        );
    }

    /// Fails within `limit` of asking, with `want`.
    fn fails_in_time(source: &Source, interval: Duration, want: &str) {
        let started = Instant::now();
        let reading = source.read(&servers(), started + interval);
        let took = started.elapsed();
        match reading {
            Reading::Failed(why) => assert_eq!(why, want),
            other => panic!("{other:?}"),
        }
        assert!(
            took >= interval.min(Duration::from_millis(1))
                && took < interval + Duration::from_millis(500),
            "took {took:?}"
        );
    }

    #[test]
    fn a_source_that_accepts_and_never_answers_costs_the_interval() {
        let sources: [fn(SocketAddr) -> Source; 2] = [socket_source, prometheus_source];
        for source in sources {
            let addr = server(1, |mut s| {
                read_request(&mut s);
                std::thread::sleep(Duration::from_secs(5));
            });
            fails_in_time(
                &source(addr),
                Duration::from_millis(300),
                "no complete answer in time",
            );
        }
    }

    #[test]
    fn a_socket_that_answers_without_end_costs_the_interval() {
        // Valid rows for ever: read as they come, none kept, until the
        // interval is over (the reader's memory is one record).
        let addr = server(2, |mut s| {
            if read_command(&mut s) == "show info" {
                let _ = s.write_all(INFO);
                return;
            }
            let _ = s.write_all(b"# pxname,svname,qcur,scur,status\n");
            let rows = b"app,other,0,0,UP\n".repeat(1000);
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && s.write_all(&rows).is_ok() {}
        });
        fails_in_time(
            &socket_source(addr),
            Duration::from_millis(300),
            "no complete answer in time",
        );
        // One line without end stops at the record limit.
        let addr = server(2, |mut s| {
            if read_command(&mut s) == "show info" {
                let _ = s.write_all(INFO);
                return;
            }
            let _ = s.write_all(b"# pxname,svname,qcur,scur,status\n");
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && s.write_all(&[b'x'; 4096]).is_ok() {}
        });
        let reading = socket_source(addr).read(&servers(), Instant::now() + Duration::from_secs(3));
        assert!(
            matches!(&reading, Reading::Failed(why) if why == "a line over 64 KiB"),
            "{reading:?}"
        );
    }

    #[test]
    fn a_refused_or_garbled_socket_is_a_failed_reading() {
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let reading =
            socket_source(closed).read(&servers(), Instant::now() + Duration::from_secs(2));
        assert!(
            matches!(&reading, Reading::Failed(why) if why.starts_with("cannot connect:")),
            "{reading:?}"
        );
        let addr = server(1, |mut s| {
            read_request(&mut s);
            let _ = s.write_all(b"Unknown command\n");
        });
        let reading = socket_source(addr).read(&servers(), Instant::now() + Duration::from_secs(2));
        assert!(
            matches!(&reading, Reading::Failed(why) if why == "not a show info answer: \"Unknown command\""),
            "{reading:?}"
        );
    }

    fn prometheus_source(addr: SocketAddr) -> Source {
        Source::Prometheus {
            label: format!("http://{addr}"),
            addr,
            host: addr.to_string(),
            prefix: String::new(),
            lookback: DEFAULT_LOOKBACK,
        }
    }

    #[test]
    fn prometheus_is_asked_for_the_servers_and_its_answers_read() {
        let addr = server(10, |mut s| {
            let mut req = [0u8; 4096];
            let n = s.read(&mut req).unwrap();
            let req = String::from_utf8_lossy(&req[..n]).into_owned();
            let (status, body) = if req.contains("changes%28haproxy_process_start_time_seconds") {
                (
                    "200 OK",
                    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"lb1"},"value":[1,"0"]}]}}"#,
                )
            } else if req.contains("haproxy_process_start_time_seconds") {
                (
                    "200 OK",
                    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"haproxy_process_start_time_seconds","instance":"lb1"},"value":[1,"1000"]}]}}"#,
                )
            } else if !req.contains("proxy%3D~%22app%22") {
                (
                    "400 Bad Request",
                    r#"{"status":"error","errorType":"bad_data","error":"wrong query"}"#,
                )
            } else if req.contains("GET /bad/") {
                ("503 Service Unavailable", "<html>down</html>")
            } else if req.contains("last_over_time") {
                (
                    "200 OK",
                    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"lb2","proxy":"app","server":"s1"},"value":[1,"0"]}]}}"#,
                )
            } else {
                (
                    "200 OK",
                    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"haproxy_server_current_sessions","instance":"lb1","proxy":"app","server":"s1"},"value":[1,"3"]}]}}"#,
                )
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let Reading::Prometheus(got) = prometheus_source(addr).read(&servers(), deadline) else {
            panic!("not read");
        };
        assert_eq!(got.servers[&servers()[0]][0].sessions, Some(3.0));
        assert_eq!(got.seen[&servers()[0]], ["lb2".to_owned()].into());
        assert_eq!(got.starts, [("lb1".to_owned(), 1000.0)].into());
        assert_eq!(got.restarts, [("lb1".to_owned(), 0.0)].into());
        let mut bad = prometheus_source(addr);
        if let Source::Prometheus { prefix, .. } = &mut bad {
            *prefix = "/bad".into();
        }
        let reading = bad.read(&servers(), deadline);
        assert!(
            matches!(&reading, Reading::Failed(why) if why == "HTTP status 503"),
            "{reading:?}"
        );
        let other = vec![("other".to_owned(), "s1".to_owned())];
        let reading = prometheus_source(addr).read(&other, deadline);
        assert!(
            matches!(&reading, Reading::Failed(why) if why == "HTTP status 400: Prometheus answered error: bad_data: wrong query"),
            "{reading:?}"
        );
    }

    /// `wait` over a loopback stats socket that reports 1 session on app/s1
    /// twice, then 0: (exit, stdout).
    fn waited(tty: bool, json: bool, timeout: Duration) -> (u8, String) {
        waited_with(tty, json, timeout, "DRAIN")
    }

    /// As [`waited`], the socket reporting `status` for the server.
    fn waited_with(tty: bool, json: bool, timeout: Duration, status: &'static str) -> (u8, String) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut stats = 0;
            for conn in l.incoming().take(300) {
                let Ok(mut s) = conn else { continue };
                let command = read_command(&mut s);
                if command != "show stat -1 4 -1" {
                    let _ = s.write_all(answer(&command));
                    continue;
                }
                let scur = if stats < 2 { 1 } else { 0 };
                stats += 1;
                let _ = write!(
                    s,
                    "# pxname,svname,qcur,scur,status\napp,s1,0,{scur},{status}\n\n"
                );
            }
        });
        let plan = Plan {
            targets: vec![Target {
                identity: "app/s1".into(),
                servers: servers(),
            }],
            sources: vec![socket_source(addr)],
            rules: Rules::default(),
            timeout,
            interval: MIN_INTERVAL,
            json,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = wait(
            &plan,
            &mut Io {
                out: &mut out,
                err: &mut err,
                env: &|_| None,
                stdin: &mut &b""[..],
                tty,
            },
        );
        (code, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_terminal_gets_the_table_redrawn_in_place_and_a_pipe_a_line_per_change() {
        let (code, out) = waited(true, false, Duration::from_secs(10));
        assert_eq!(code, OK, "{out}");
        // Three polls (1, 1, 0 sessions): drawn, then twice back up over
        // the 3 lines drawn (progress, header, row) before redrawing.
        assert_eq!(out.matches("\x1b[3F\x1b[J").count(), 2, "{out:?}");
        assert_eq!(out.matches("SERVER  SOURCE").count(), 3, "{out:?}");
        assert!(
            out.ends_with("(0 sessions, 0 queued at every source)\n"),
            "{out:?}"
        );

        let (code, out) = waited(false, false, Duration::from_secs(10));
        assert_eq!(code, OK, "{out}");
        assert!(!out.contains('\x1b'), "{out:?}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines.len(),
            3,
            "one line per change, then the verdict: {out}"
        );
        assert!(
            lines[0].ends_with(": 1 session, 0 queued, DRAIN: holding"),
            "{out}"
        );
        assert!(
            lines[1].ends_with(": 0 sessions, 0 queued, DRAIN: drained"),
            "{out}"
        );
    }

    /// Issue 39: haproxy's and Prometheus's answers were printed raw (ESC,
    /// OSC 52 clipboard writes, CR).
    #[test]
    fn hostile_answers_are_shown_escaped_in_every_view() {
        let status = "DR\x1b]52;c;ZXZpbA==\x07\rAIN\u{9b}\u{202e}";
        for (tty, json) in [(false, false), (true, false), (false, true)] {
            let (_, out) = waited_with(tty, json, Duration::from_secs(10), status);
            // The table view's own redraw sequence is the only ESC.
            let own = out.replace("\x1b[3F\x1b[J", "");
            let raw = own.chars().find(|&c| c != '\n' && crate::safe::hidden(c));
            assert_eq!(raw, None, "tty {tty} json {json}: {out:?}");
            assert!(own.contains("DR\\u001b]52;c;"), "{out:?}");
            if json {
                serde_json::from_str::<serde_json::Value>(&out).expect("-json stays JSON");
            }
        }
    }

    #[test]
    fn table_lines_are_clipped_to_the_terminal_so_none_wraps() {
        assert_eq!(clip("abcdef\nab\n\néé€x\n", 4), "abc\nab\n\néé€\n");
    }

    #[test]
    fn json_prints_only_the_last_poll() {
        let (code, out) = waited(false, true, Duration::from_millis(50));
        assert_eq!(code, FINDING, "{out}");
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(doc["drained"], false);
        assert_eq!(doc["servers"][0]["sessions"], 1);
    }
}
