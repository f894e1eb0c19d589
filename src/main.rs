//! Wiring only: an operator command when the first word names one
//! ([`cli`]); else the daemon: parse the configuration, start logging,
//! raise the descriptor limit, bind, run the loop, map errors to exit codes
//! (0 clean shutdown, 1 fatal runtime error, 2 bad usage).

use std::process::ExitCode;

use gitlab_haproxy_agent::build_info;
use gitlab_haproxy_agent::cli;
use gitlab_haproxy_agent::config::{self, Command, Config, ListenAddr};
use gitlab_haproxy_agent::event_loop::{bind, EventLoop, Listeners};
use gitlab_haproxy_agent::logging;
use log::{error, info, warn};

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(word) = args
        .first()
        .and_then(|w| w.to_str())
        .filter(|w| cli::is_command(w))
    {
        let mut io = cli::Io {
            out: &mut std::io::stdout().lock(),
            err: &mut std::io::stderr().lock(),
            env: &|name| std::env::var(name).ok(),
            stdin: &mut std::io::stdin().lock(),
            tty: std::io::IsTerminal::is_terminal(&std::io::stdout()),
        };
        return ExitCode::from(cli::run(word, &args[1..], &mut io));
    }
    let command = match config::parse(args, &|name| std::env::var(name).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gitlab-haproxy-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let config = match command {
        Command::Help(text) => {
            print!("{text}\n{}", cli::commands_help());
            return ExitCode::SUCCESS;
        }
        Command::Version(line) => {
            println!("{line}");
            return ExitCode::SUCCESS;
        }
        Command::Run(c) => *c,
    };
    gitlab_haproxy_agent::slice::keep_big_buffers_mapped();
    logging::init(config.log_format, config.log_level);
    let code = match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = e.as_str(); "fatal");
            ExitCode::from(1)
        }
    };
    // Lines still queued for the writer thread (bounded wait).
    log::logger().flush();
    code
}

fn run(mut config: Config) -> Result<(), String> {
    for w in &config.warnings {
        warn!("{w}");
    }
    if let Some(limit) = raise_nofile_limit() {
        fit_connections(&mut config, limit);
    }
    let bind_one =
        |what: &str, addr: &Option<ListenAddr>| -> Result<Option<std::net::TcpListener>, String> {
            addr.as_ref()
                .map(|a| bind(a).map_err(|e| format!("cannot listen on {what} {a}: {e}")))
                .transpose()
        };
    let listeners = Listeners {
        agent: bind_one("-listen-addr", &config.listen_addr)?,
        monitoring: bind_one("-monitoring-addr", &config.monitoring_addr)?,
        pprof: bind_one("-pprof-addr", &config.pprof_addr)?,
        devkv: bind_one("-dev-kv-addr", &config.dev_kv_addr)?,
    };
    if let Some(devkv) = &listeners.devkv {
        warn!("-dev: serving an in-memory consul-compatible KV; never use this in production");
        // With port 0 only the bound socket knows the port the watcher
        // must use.
        if config.consul_follows_dev_kv() {
            let bound = devkv.local_addr().map_err(|e| e.to_string())?;
            config.consul.retarget(bound);
        }
    }
    if let Some(tls) = &config.consul.tls {
        info!(
            server_name = tls.server_name.to_str().as_ref(),
            verify = tls.verify,
            roots = tls.roots.as_str(),
            client_cert = tls.client_cert.as_deref().unwrap_or("none");
            "consul over TLS"
        );
    }
    let mut event_loop = EventLoop::new(&config, listeners)
        .map_err(|e| format!("cannot start the event loop: {e}"))?;
    let mut addrs: Vec<String> = event_loop
        .local_addrs()
        .iter()
        .map(|(n, a)| format!("{n}={a}"))
        .collect();
    addrs.push(format!("consul={}", config.consul.endpoint));
    info!(
        version = build_info::version_line().as_str(),
        addresses = addrs.join(" ").as_str(),
        kv_prefix = config.kv_prefix.as_str(),
        read_timeout_ms = config.read_timeout.as_millis() as u64,
        max_connections = config.max_connections,
        reply_up = config.reply_up;
        "listening"
    );
    event_loop
        .run()
        .map_err(|e| format!("event loop failed: {e}"))
}

/// Descriptors kept for all but agent connections: the listeners, consul,
/// the monitoring, debug and dev KV connections, the state file.
const RESERVED_FDS: u64 = 256;

/// `-max-connections` within the descriptor limit: past the limit accept
/// fails (EMFILE) before the cap is reached, and the oldest idle connection
/// is never evicted, so a flood of idle connections would keep haproxy's
/// checks out. Lowered, with a warning, when the limit is lower.
fn fit_connections(config: &mut Config, limit: u64) {
    let room = usize::try_from(limit.saturating_sub(RESERVED_FDS).max(1)).unwrap_or(usize::MAX);
    if config.max_connections > room {
        warn!(max_connections = config.max_connections, nofile = limit, using = room;
            "-max-connections is above what the file descriptor limit leaves for agent connections: using the lower value, so that at it a new connection evicts an idle one instead of failing to be accepted (raise LimitNOFILE / ulimit -n)");
        config.max_connections = room;
    }
}

/// Go programs raise the soft `RLIMIT_NOFILE` to the hard limit at start;
/// so does this (20,000 connections need more than the usual 1,024).
/// The soft limit in effect, if it can be read.
fn raise_nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        warn!("cannot read RLIMIT_NOFILE");
        return None;
    }
    let old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if old != lim.rlim_max && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        warn!(soft = old, hard = lim.rlim_max; "cannot raise RLIMIT_NOFILE");
        return Some(old);
    }
    info!(soft = lim.rlim_cur, hard = lim.rlim_max, was = old; "file descriptor limit");
    Some(lim.rlim_cur)
}
