//! Command line and environment -> validated [`Config`], in two
//! steps like ripgrep's low/high args: raw strings from argv and env, then
//! checked, typed values. Pure except for reading the token file and
//! resolving a hostname once.
//!
//! What always holds:
//! - every flag `-name` may also come from `GITLAB_HAPROXY_AGENT_<NAME>`; the
//!   flag wins; a repeated flag takes its last value (as Go's `flag`);
//! - an environment variable set to the empty string counts as unset, except
//!   for the three listener addresses, where empty disables the listener
//!   just as an empty flag value does;
//! - every error is one line naming the flag or variable, and never holds a
//!   token or password;
//! - with `-dev` and no `-consul-addr` (nor its variable) the agent watches its
//!   own dev KV, and the consul client environment (`CONSUL_*`) is not read at
//!   all: it describes a real consul. Otherwise settings that need TLS are
//!   refused. `CONSUL_HTTP_SSL_VERIFY` is ignored: it only matters with TLS.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;

use crate::build_info::version_line;
use crate::gocompat::{parse_go_bool, parse_signed_duration, parse_uint, UintError};

/// Where to listen. `:port` is all interfaces, dual-stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `:port`: `[::]` with IPv6-only off, falling back to `0.0.0.0`.
    AnyDualStack(u16),
    Addr(SocketAddr),
}

/// As the flag takes it: `:9777`, `127.0.0.1:9777`, `[::1]:9777`.
impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::AnyDualStack(port) => write!(f, ":{port}"),
            ListenAddr::Addr(a) => write!(f, "{a}"),
        }
    }
}

/// How to reach consul.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsulEndpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// As logged: `127.0.0.1:8500`, `unix:///run/consul.sock`.
impl std::fmt::Display for ConsulEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConsulEndpoint::Tcp(a) => write!(f, "{a}"),
            ConsulEndpoint::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// Everything the consul client needs, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulConfig {
    pub endpoint: ConsulEndpoint,
    /// `Host` header value (`host:port` as given; `localhost` for unix).
    pub host_header: String,
    /// Path prefix from `http://host:port/prefix` (no trailing `/`; empty if none).
    /// When not empty it starts with `/` (as Go's `PathPrefix`), so a request
    /// path is `format!("{path_prefix}/v1/kv/...")`.
    pub path_prefix: String,
    /// ACL token (trimmed), sent as `X-Consul-Token`. Never logged.
    pub token: Option<String>,
    /// `CONSUL_HTTP_AUTH`, already base64-encoded for `Authorization: Basic`.
    pub basic_auth: Option<String>,
    /// `CONSUL_NAMESPACE`: only ASCII letters, digits, `-` and `_`, so it
    /// goes into `?ns=` without percent-encoding.
    pub namespace: Option<String>,
    /// `CONSUL_PARTITION`: same characters as `namespace`.
    pub partition: Option<String>,
    /// Blocking-query wait, 1s..=10m.
    pub wait: Duration,
    pub max_body_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// The validated configuration of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `None`: agent listener disabled (empty `-listen-addr`).
    pub listen_addr: Option<ListenAddr>,
    pub monitoring_addr: Option<ListenAddr>,
    pub pprof_addr: Option<ListenAddr>,
    pub consul: ConsulConfig,
    /// Without leading/trailing `/`.
    pub kv_prefix: String,
    pub read_timeout: Duration,
    pub max_line_bytes: usize,
    pub max_connections: usize,
    /// `-dev`: serve the in-memory KV on this address too.
    pub dev_kv_addr: Option<ListenAddr>,
    pub log_format: LogFormat,
    pub log_level: log::LevelFilter,
    /// Settings accepted but worth a warning at start (logged by `main`).
    pub warnings: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    /// `-h`/`-help`: print this usage text to stdout, exit 0.
    Help(String),
    /// `-version`: print this line to stdout, exit 0.
    Version(String),
}

/// A bad flag, value or environment variable: one line, exit code 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage_error(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

impl ConsulConfig {
    /// Points the client at `bound`, the address the dev KV listener really
    /// bound (needed when `-dev-kv-addr` has port 0). An unspecified address
    /// (`0.0.0.0`, `[::]`) becomes the loopback of its family.
    pub fn retarget(&mut self, bound: SocketAddr) {
        let addr = loopback_if_unspecified(bound);
        self.endpoint = ConsulEndpoint::Tcp(addr);
        self.host_header = addr.to_string();
        self.path_prefix.clear();
    }
}

impl Config {
    /// True when the consul client watches this process's own dev KV (`-dev`
    /// without an explicit consul address): after binding the dev KV, call
    /// [`ConsulConfig::retarget`] with the bound address.
    pub fn consul_follows_dev_kv(&self) -> bool {
        match &self.dev_kv_addr {
            Some(dev) => self.consul.endpoint == ConsulEndpoint::Tcp(dev_connect_addr(dev)),
            None => false,
        }
    }
}

/// `0.0.0.0:p` -> `127.0.0.1:p`, `[::]:p` -> `[::1]:p`, others unchanged:
/// the address to connect to for a listener bound on `addr`.
pub fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

fn dev_connect_addr(dev: &ListenAddr) -> SocketAddr {
    match dev {
        ListenAddr::AnyDualStack(port) => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), *port),
        ListenAddr::Addr(addr) => loopback_if_unspecified(*addr),
    }
}

// ---------------------------------------------------------------------------
// The flag table: one row per flag, used by the lexer, the env fallback and
// the usage text.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// `-flag value` / `-flag=value`.
    Value,
    /// `-flag` / `-flag=true|false`; never takes the next argument.
    Bool,
}

struct FlagSpec {
    /// The normalised form pico-args sees: `--name`.
    key: &'static str,
    kind: Kind,
    default: &'static str,
    /// An environment value of `""` means "empty value" (disables a
    /// listener), not "unset".
    empty_env_is_value: bool,
    help: &'static str,
}

impl FlagSpec {
    fn name(&self) -> &'static str {
        &self.key[2..]
    }

    fn env_var(&self) -> String {
        format!(
            "GITLAB_HAPROXY_AGENT_{}",
            self.name().to_ascii_uppercase().replace('-', "_")
        )
    }
}

const fn value_flag(key: &'static str, default: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec {
        key,
        kind: Kind::Value,
        default,
        empty_env_is_value: false,
        help,
    }
}

const fn listener_flag(key: &'static str, default: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec {
        key,
        kind: Kind::Value,
        default,
        empty_env_is_value: true,
        help,
    }
}

const DEFAULT_CONSUL_ADDR: &str = "127.0.0.1:8500";

const FLAGS: &[FlagSpec] = &[
    listener_flag("--listen-addr", ":9777", "agent-check listener (haproxy agent-port); empty disables"),
    listener_flag("--monitoring-addr", ":9778", "/-/metrics, /-/liveness, /-/readiness listener; empty disables"),
    listener_flag("--pprof-addr", "127.0.0.1:9779", "debugging endpoints (/debug/state); empty disables"),
    value_flag(
        "--consul-addr",
        DEFAULT_CONSUL_ADDR,
        "consul agent: host:port, http://host:port[/prefix] or unix:///path; else CONSUL_HTTP_ADDR",
    ),
    value_flag("--kv-prefix", "gitlab-haproxy-agent/state", "KV prefix to watch; the key below it is the server identity"),
    value_flag("--read-timeout", "5s", "time a connection has to send its request line (Go duration)"),
    value_flag("--max-line-bytes", "256", "longest request line accepted, 1..65536"),
    value_flag("--max-connections", "20000", "open agent connections before accepting pauses"),
    value_flag("--consul-wait", "5m", "consul blocking-query wait, 1s..10m"),
    value_flag("--consul-max-body-bytes", "67108864", "largest consul response body accepted, at least 1024"),
    FlagSpec {
        key: "--dev",
        kind: Kind::Bool,
        default: "false",
        empty_env_is_value: false,
        help: "also serve an in-memory consul-compatible KV on -dev-kv-addr and watch it; never for production",
    },
    value_flag("--dev-kv-addr", "127.0.0.1:8500", "dev KV listener (used only with -dev)"),
];

fn flag_spec(name: &str) -> Option<&'static FlagSpec> {
    FLAGS.iter().find(|f| f.name() == name)
}

fn spec(name: &str) -> &'static FlagSpec {
    flag_spec(name).unwrap_or_else(|| unreachable!("flag -{name} is not in FLAGS"))
}

/// What the usage text calls a flag's value, as Go's `flag` does.
fn value_name(flag: &str) -> &'static str {
    match flag {
        "read-timeout" | "consul-wait" => "duration",
        "max-line-bytes" | "max-connections" | "consul-max-body-bytes" => "int",
        "kv-prefix" => "string",
        _ => "addr",
    }
}

/// The usage text printed by `-h`: every flag with its default and its
/// environment variable, one line each, then the other variables read.
pub fn usage() -> String {
    let mut out = String::new();
    out.push_str("Usage: gitlab-haproxy-agent [flags]\n\n");
    out.push_str("HAProxy agent-check responder answering each server's desired admin state from consul KV.\n");
    out.push_str("Flags take Go syntax (-flag value, -flag=value, --flag value); a flag beats its environment variable.\n\n");
    out.push_str("Flags:\n");
    for f in FLAGS {
        let left = match f.kind {
            Kind::Value => format!("-{} {}", f.name(), value_name(f.name())),
            Kind::Bool => format!("-{}", f.name()),
        };
        out.push_str(&format!(
            "  {left:<31} {} (default {:?}; env {})\n",
            f.help,
            f.default,
            f.env_var()
        ));
    }
    out.push_str(&format!("  {:<31} print this help and exit\n", "-h, -help"));
    out.push_str(&format!(
        "  {:<31} print the version and exit\n",
        "-version"
    ));
    out.push_str("\nEnvironment:\n");
    let env: &[(&str, &str)] = &[
        ("CONSUL_HTTP_ADDR", "consul address when -consul-addr and its variable are unset (same forms)"),
        ("CONSUL_HTTP_TOKEN_FILE", "file holding the ACL token, read once at start (beats CONSUL_HTTP_TOKEN)"),
        ("CONSUL_HTTP_TOKEN", "ACL token, sent as X-Consul-Token"),
        ("CONSUL_HTTP_AUTH", "user:password for HTTP basic auth"),
        ("CONSUL_NAMESPACE", "Enterprise namespace (?ns=)"),
        ("CONSUL_PARTITION", "Enterprise admin partition (?partition=)"),
        ("CONSUL_HTTP_SSL, CONSUL_CACERT", "refused at start, as are CONSUL_CAPATH, CONSUL_CLIENT_CERT/KEY, CONSUL_TLS_SERVER_NAME: no TLS in this build"),
        ("GITLAB_LOG_FORMAT", "json (default) or text"),
        ("GITLAB_LOG_LEVEL", "trace, debug, info (default), warn or error"),
    ];
    for (name, help) in env {
        out.push_str(&format!("  {name:<31} {help}\n"));
    }
    out.push_str("\nWith -dev and no consul address given, the agent watches its own dev KV and ignores CONSUL_*.\n");
    out
}

// ---------------------------------------------------------------------------
// Step 1: argv -> raw strings (the "low" args).

enum Lexed {
    Help,
    Version,
    Run(LowArgs),
}

/// What argv said, still as strings.
struct LowArgs {
    /// Flag name (without dashes) -> its last value on the command line.
    values: HashMap<&'static str, String>,
    /// `-dev` / `-dev=<bool>`, last one wins.
    dev: Option<bool>,
}

fn unexpected_argument(arg: &str) -> UsageError {
    usage_error(format!(
        "unexpected argument {arg:?}: this program takes flags only (see -help)"
    ))
}

/// Walks argv in Go `flag` style, normalising every `-long-flag[=v]` to
/// `--long-flag v` (pico-args knows only one-letter single-dash keys), and
/// hands the result to pico-args. The walk must know which flags take a
/// value, so that a value such as `-1s` is never mistaken for a flag.
fn lex(args: Vec<OsString>) -> Result<Lexed, UsageError> {
    let mut normalised: Vec<OsString> = Vec::with_capacity(args.len());
    let mut dev = None;
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
        let body = match arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) {
            Some(body) if !body.is_empty() => body,
            _ => return Err(unexpected_argument(&arg)),
        };
        if body.starts_with('-') || body.starts_with('=') {
            return Err(usage_error(format!("bad flag syntax: {arg:?}")));
        }
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        match name {
            "h" | "help" => return Ok(Lexed::Help),
            "version" => return Ok(Lexed::Version),
            _ => {}
        }
        let Some(spec) = flag_spec(name) else {
            return Err(usage_error(format!(
                "unknown flag -{name} (see -help)",
                name = name.escape_debug()
            )));
        };
        match spec.kind {
            Kind::Bool => {
                let value = match inline {
                    None => true,
                    Some(v) => parse_go_bool(v).ok_or_else(|| {
                        usage_error(format!("invalid value {v:?} for flag -{name}: not a boolean (use true or false)"))
                    })?,
                };
                dev = Some(value);
            }
            Kind::Value => {
                let value = match inline {
                    Some(v) => OsString::from(v),
                    None => args
                        .next()
                        .ok_or_else(|| usage_error(format!("flag needs an argument: -{name}")))?,
                };
                normalised.push(OsString::from(spec.key));
                normalised.push(value);
            }
        }
    }

    let mut parser = pico_args::Arguments::from_vec(normalised);
    let mut values = HashMap::new();
    for spec in FLAGS.iter().filter(|f| f.kind == Kind::Value) {
        let mut all: Vec<String> = parser
            .values_from_str(spec.key)
            .map_err(|e| usage_error(format!("flag -{}: {e}", spec.name())))?;
        if let Some(last) = all.pop() {
            values.insert(spec.name(), last);
        }
    }
    if let Some(left) = parser.finish().first() {
        return Err(unexpected_argument(&left.to_string_lossy()));
    }
    Ok(Lexed::Run(LowArgs { values, dev }))
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone)]
enum Source {
    Flag(&'static str),
    Env(String),
    Default(&'static str),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(name) => write!(f, "flag -{name}"),
            Source::Env(var) => f.write_str(var),
            Source::Default(name) => write!(f, "the default of -{name}"),
        }
    }
}

struct Raw {
    value: String,
    source: Source,
}

impl Raw {
    fn invalid(&self, reason: impl std::fmt::Display) -> UsageError {
        usage_error(format!(
            "invalid value {:?} for {}: {reason}",
            self.value, self.source
        ))
    }
}

type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A variable set to a non-empty value.
fn env_nonempty(env: Env<'_>, var: &str) -> Option<String> {
    env(var).filter(|v| !v.is_empty())
}

impl LowArgs {
    /// The flag's value from argv, else from its variable, if either is set.
    fn explicit(&self, name: &'static str, env: Env<'_>) -> Option<Raw> {
        let spec = spec(name);
        if let Some(v) = self.values.get(name) {
            return Some(Raw {
                value: v.clone(),
                source: Source::Flag(name),
            });
        }
        let var = spec.env_var();
        let value = if spec.empty_env_is_value {
            env(&var)
        } else {
            env_nonempty(env, &var)
        };
        value.map(|value| Raw {
            value,
            source: Source::Env(var),
        })
    }

    /// The flag's value from argv, its variable, or its default.
    fn get(&self, name: &'static str, env: Env<'_>) -> Raw {
        self.explicit(name, env).unwrap_or_else(|| Raw {
            value: spec(name).default.to_string(),
            source: Source::Default(name),
        })
    }
}

// ---------------------------------------------------------------------------
// Step 2: raw strings -> checked, typed values.

/// Parses argv (without the program name) and the environment (`env` looks a
/// variable up) into a [`Command`].
pub fn parse(
    args: Vec<std::ffi::OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Command, UsageError> {
    let low = match lex(args)? {
        Lexed::Help => return Ok(Command::Help(usage())),
        Lexed::Version => return Ok(Command::Version(version_line())),
        Lexed::Run(low) => low,
    };

    let listen_addr = listen(&low.get("listen-addr", env))?;
    let monitoring_addr = listen(&low.get("monitoring-addr", env))?;
    let pprof_addr = listen(&low.get("pprof-addr", env))?;

    let kv_prefix = kv_prefix(&low.get("kv-prefix", env))?;

    let read_timeout = {
        let raw = low.get("read-timeout", env);
        let d = duration(&raw)?;
        if d.is_zero() {
            return Err(raw.invalid("must be more than 0"));
        }
        if d > Duration::from_secs(3600) {
            return Err(raw.invalid("must be at most 1h"));
        }
        d
    };
    let max_line_bytes = number(&low.get("max-line-bytes", env), 1, 65536)?;
    let max_connections = number(&low.get("max-connections", env), 1, 10_000_000)?;
    let wait = {
        let raw = low.get("consul-wait", env);
        let d = duration(&raw)?;
        if d < Duration::from_secs(1) || d > Duration::from_secs(600) {
            return Err(raw.invalid("must be between 1s and 10m"));
        }
        d
    };
    let max_body_bytes = number(&low.get("consul-max-body-bytes", env), 1024, usize::MAX)?;

    let dev = match low.dev {
        Some(dev) => dev,
        None => {
            let var = spec("dev").env_var();
            match env_nonempty(env, &var) {
                None => false,
                Some(v) => parse_go_bool(&v).ok_or_else(|| {
                    usage_error(format!(
                        "invalid value {v:?} for {var}: not a boolean (use true or false)"
                    ))
                })?,
            }
        }
    };
    let dev_kv_addr = if dev {
        let raw = low.get("dev-kv-addr", env);
        match listen(&raw)? {
            Some(addr) => Some(addr),
            None => return Err(raw.invalid("must not be empty with -dev")),
        }
    } else {
        None
    };

    let mut warnings = Vec::new();
    let consul = consul_config(
        &low,
        env,
        dev_kv_addr.as_ref(),
        (wait, max_body_bytes),
        &mut warnings,
    )?;
    let (log_format, log_level) = log_settings(env)?;

    Ok(Command::Run(Box::new(Config {
        listen_addr,
        monitoring_addr,
        pprof_addr,
        consul,
        kv_prefix,
        read_timeout,
        max_line_bytes,
        max_connections,
        dev_kv_addr,
        log_format,
        log_level,
        warnings,
    })))
}

fn duration(raw: &Raw) -> Result<Duration, UsageError> {
    match parse_signed_duration(&raw.value) {
        None => Err(raw.invalid("not a duration (use Go syntax like 5s, 100ms, 1m30s)")),
        Some((true, d)) if !d.is_zero() => Err(raw.invalid("must not be negative")),
        Some((_, d)) => Ok(d),
    }
}

fn number(raw: &Raw, min: usize, max: usize) -> Result<usize, UsageError> {
    let n = parse_uint(raw.value.as_bytes())
        .ok()
        .and_then(|n| usize::try_from(n).ok());
    match n {
        None => Err(raw.invalid("not a whole number")),
        Some(n) if n < min || n > max => {
            if max == usize::MAX {
                Err(raw.invalid(format!("must be at least {min}")))
            } else {
                Err(raw.invalid(format!("must be between {min} and {max}")))
            }
        }
        Some(n) => Ok(n),
    }
}

fn kv_prefix(raw: &Raw) -> Result<String, UsageError> {
    let prefix = raw.value.trim_matches('/');
    if prefix.is_empty() {
        return Err(raw.invalid("must not be empty (that would watch the whole KV store)"));
    }
    if prefix.chars().any(char::is_control) {
        return Err(raw.invalid("holds a control character"));
    }
    Ok(prefix.to_string())
}

fn log_settings(env: Env<'_>) -> Result<(LogFormat, log::LevelFilter), UsageError> {
    let format = match env_nonempty(env, "GITLAB_LOG_FORMAT") {
        None => LogFormat::Json,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "json" => LogFormat::Json,
            "text" => LogFormat::Text,
            _ => {
                return Err(usage_error(format!(
                    "invalid value {v:?} for GITLAB_LOG_FORMAT: use json or text"
                )))
            }
        },
    };
    let level = match env_nonempty(env, "GITLAB_LOG_LEVEL") {
        None => log::LevelFilter::Info,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "trace" => log::LevelFilter::Trace,
            "debug" => log::LevelFilter::Debug,
            "info" => log::LevelFilter::Info,
            "warn" | "warning" => log::LevelFilter::Warn,
            "error" => log::LevelFilter::Error,
            _ => {
                return Err(usage_error(format!(
                "invalid value {v:?} for GITLAB_LOG_LEVEL: use trace, debug, info, warn or error"
            )))
            }
        },
    };
    Ok((format, level))
}

// ---------------------------------------------------------------------------
// Addresses.

/// Splits `host[:port]` / `[v6][:port]`; the host comes back without brackets.
fn split_host_port(s: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("missing ']' after an IPv6 address")?;
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err("unexpected text after ']'".into()),
            },
        }
    } else {
        match s.matches(':').count() {
            0 => (s, None),
            1 => {
                let (host, port) = s.split_once(':').unwrap_or((s, ""));
                (host, Some(port))
            }
            _ => return Err("an IPv6 address needs brackets, as in [::1]:8500".into()),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(parse_port(p)?),
    };
    Ok((host, port))
}

fn parse_port(p: &str) -> Result<u16, String> {
    let out_of_range = || format!("port {p} is out of range (0..65535)");
    match parse_uint(p.as_bytes()) {
        Ok(n) => u16::try_from(n).map_err(|_| out_of_range()),
        Err(UintError::Range) => Err(out_of_range()),
        Err(UintError::Syntax) => Err(format!("bad port {p:?}")),
    }
}

/// An IP literal, or a hostname resolved once now (first address).
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if host.is_empty() {
        return Err("missing host".into());
    }
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("host {host:?} has no address")),
        Err(e) => Err(format!("cannot resolve host {host:?}: {e}")),
    }
}

/// `""` -> disabled, `:port` -> all interfaces, `host:port` -> that address.
fn parse_listen_addr(s: &str) -> Result<Option<ListenAddr>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    if let Some(port) = s.strip_prefix(':') {
        if !port.contains(':') {
            return Ok(Some(ListenAddr::AnyDualStack(parse_port(port)?)));
        }
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(Some(ListenAddr::Addr(addr)));
    }
    match split_host_port(s)? {
        (_, None) => Err("missing port (use host:port, :port, or empty to disable)".into()),
        (host, Some(port)) => Ok(Some(ListenAddr::Addr(resolve(host, port)?))),
    }
}

fn listen(raw: &Raw) -> Result<Option<ListenAddr>, UsageError> {
    parse_listen_addr(&raw.value).map_err(|reason| raw.invalid(reason))
}

/// Why a consul address was refused; `secret` when the value must not be
/// echoed (it holds a password).
struct AddrError {
    reason: String,
    secret: bool,
}

impl From<String> for AddrError {
    fn from(reason: String) -> Self {
        AddrError {
            reason,
            secret: false,
        }
    }
}

const NO_TLS: &str =
    "this build does not support TLS: use http:// to the local consul agent or a unix:// socket";

/// The forms of `CONSUL_HTTP_ADDR`: `host[:port]`, `http://host[:port][/prefix]`,
/// `unix:///path`. Returns the endpoint, the `Host` header and the path prefix.
fn parse_consul_addr(s: &str) -> Result<(ConsulEndpoint, String, String), AddrError> {
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
        None => (None, s),
    };
    let authority_and_path = match scheme.as_deref() {
        None => {
            if rest.contains('/') {
                return Err(String::from("a path needs the http:// form").into());
            }
            rest
        }
        Some("http") => rest,
        Some("https") => return Err(format!("https is not supported: {NO_TLS}").into()),
        Some("unix") => {
            if rest.is_empty() {
                return Err(
                    String::from("missing socket path (use unix:///path/to/consul.sock)").into(),
                );
            }
            return Ok((
                ConsulEndpoint::Unix(PathBuf::from(rest)),
                "localhost".into(),
                String::new(),
            ));
        }
        Some(other) => {
            return Err(format!(
                "unknown protocol scheme {other:?} (use host:port, http:// or unix://)"
            )
            .into())
        }
    };
    if authority_and_path.contains(['?', '#']) {
        return Err(String::from("a query or fragment is not allowed").into());
    }
    let (authority, path) = match authority_and_path.find('/') {
        Some(i) => authority_and_path.split_at(i),
        None => (authority_and_path, ""),
    };
    if authority.contains('@') {
        return Err(AddrError {
            reason: "credentials in the address are not supported (use CONSUL_HTTP_AUTH); the value is not shown"
                .into(),
            secret: true,
        });
    }
    if authority.chars().any(|c| c.is_control() || c == ' ') {
        return Err(String::from("the host holds a space or control character").into());
    }
    if path.chars().any(|c| c.is_control() || c == ' ') {
        return Err(String::from("the path holds a space or control character").into());
    }
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err(String::from("missing host").into());
    }
    // Go's client: `http://host` without a port means port 80.
    let addr = resolve(host, port.unwrap_or(80))?;
    let path_prefix = path.trim_end_matches('/').to_string();
    Ok((
        ConsulEndpoint::Tcp(addr),
        authority.to_string(),
        path_prefix,
    ))
}

fn consul_addr(raw: &Raw) -> Result<(ConsulEndpoint, String, String), UsageError> {
    parse_consul_addr(&raw.value).map_err(|e| {
        if e.secret {
            usage_error(format!("invalid value for {}: {}", raw.source, e.reason))
        } else {
            raw.invalid(e.reason)
        }
    })
}

/// `(wait, max_body_bytes)` are validated by the caller.
fn consul_config(
    low: &LowArgs,
    env: Env<'_>,
    dev_kv: Option<&ListenAddr>,
    (wait, max_body_bytes): (Duration, usize),
    warnings: &mut Vec<String>,
) -> Result<ConsulConfig, UsageError> {
    let explicit = low.explicit("consul-addr", env);
    if let Some(raw) = &explicit {
        if raw.value.is_empty() {
            return Err(raw.invalid("must not be empty"));
        }
    }
    let mut consul = ConsulConfig {
        endpoint: ConsulEndpoint::Tcp(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 8500)),
        host_header: String::new(),
        path_prefix: String::new(),
        token: None,
        basic_auth: None,
        namespace: None,
        partition: None,
        wait,
        max_body_bytes,
    };
    let (endpoint, host_header, path_prefix) = match (explicit, dev_kv) {
        (Some(raw), _) => consul_addr(&raw)?,
        (None, Some(dev)) => {
            // Our own dev KV: the CONSUL_* client environment describes a
            // real consul, so none of it applies.
            let addr = dev_connect_addr(dev);
            consul.endpoint = ConsulEndpoint::Tcp(addr);
            consul.host_header = addr.to_string();
            return Ok(consul);
        }
        (None, None) => {
            let raw = match env_nonempty(env, "CONSUL_HTTP_ADDR") {
                Some(value) => Raw {
                    value,
                    source: Source::Env("CONSUL_HTTP_ADDR".into()),
                },
                None => Raw {
                    value: DEFAULT_CONSUL_ADDR.into(),
                    source: Source::Default("consul-addr"),
                },
            };
            consul_addr(&raw)?
        }
    };
    consul.endpoint = endpoint;
    consul.host_header = host_header;
    consul.path_prefix = path_prefix;

    refuse_tls(env)?;
    consul.token = token(env, warnings)?;
    consul.basic_auth = env_nonempty(env, "CONSUL_HTTP_AUTH").map(|auth| {
        // Go's client: split at the first ':'; no ':' means a user without password.
        let pair = if auth.contains(':') {
            auth
        } else {
            format!("{auth}:")
        };
        base64::engine::general_purpose::STANDARD.encode(pair)
    });
    consul.namespace = enterprise_name(env, "CONSUL_NAMESPACE")?;
    consul.partition = enterprise_name(env, "CONSUL_PARTITION")?;
    Ok(consul)
}

/// Settings that need TLS fail at start, never silently.
fn refuse_tls(env: Env<'_>) -> Result<(), UsageError> {
    if let Some(v) = env_nonempty(env, "CONSUL_HTTP_SSL") {
        // Go's client warns about an unparsable value and leaves TLS off; so do we.
        if parse_go_bool(&v) == Some(true) {
            return Err(usage_error(format!(
                "CONSUL_HTTP_SSL={v:?} asks for https, but {NO_TLS}"
            )));
        }
    }
    for var in [
        "CONSUL_CACERT",
        "CONSUL_CAPATH",
        "CONSUL_CLIENT_CERT",
        "CONSUL_CLIENT_KEY",
        "CONSUL_TLS_SERVER_NAME",
    ] {
        if env_nonempty(env, var).is_some() {
            return Err(usage_error(format!("{var} is set, but {NO_TLS}; unset it")));
        }
    }
    Ok(())
}

/// A token must fit in an HTTP header as is.
fn check_token(token: &str, var: &str) -> Result<(), UsageError> {
    if token.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(usage_error(format!(
            "{var}: the token holds a space, control or non-ASCII character (the value is not shown)"
        )))
    }
}

/// `CONSUL_HTTP_TOKEN_FILE` (read once, trimmed) before `CONSUL_HTTP_TOKEN`
/// (trimmed). An empty file is passed over, as consul's own client does,
/// with a warning (a secret that was not mounted looks like this).
fn token(env: Env<'_>, warnings: &mut Vec<String>) -> Result<Option<String>, UsageError> {
    const FILE_VAR: &str = "CONSUL_HTTP_TOKEN_FILE";
    if let Some(path) = env_nonempty(env, FILE_VAR) {
        let data = std::fs::read(&path)
            .map_err(|e| usage_error(format!("{FILE_VAR}: cannot read {path:?}: {e}")))?;
        let text = String::from_utf8(data)
            .map_err(|_| usage_error(format!("{FILE_VAR}: {path:?} is not UTF-8 text")))?;
        let token = text.trim();
        if !token.is_empty() {
            check_token(token, FILE_VAR)?;
            return Ok(Some(token.to_string()));
        }
        let instead = match env_nonempty(env, "CONSUL_HTTP_TOKEN") {
            Some(_) => "using CONSUL_HTTP_TOKEN",
            None => "sending no ACL token",
        };
        warnings.push(format!("{FILE_VAR} {path:?} is empty: {instead}"));
    }
    const VAR: &str = "CONSUL_HTTP_TOKEN";
    match env(VAR).as_deref().map(str::trim) {
        Some(token) if !token.is_empty() => {
            check_token(token, VAR)?;
            Ok(Some(token.to_string()))
        }
        _ => Ok(None),
    }
}

/// `CONSUL_NAMESPACE` / `CONSUL_PARTITION`: only when set; consul allows
/// letters, digits, `-` and `_` there, so the value needs no escaping.
fn enterprise_name(env: Env<'_>, var: &str) -> Result<Option<String>, UsageError> {
    match env_nonempty(env, var) {
        None => Ok(None),
        Some(v)
            if v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            Ok(Some(v))
        }
        Some(v) => Err(usage_error(format!(
            "invalid value {v:?} for {var}: use letters, digits, '-' and '_' only"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    fn run(a: &[&str], env: &[(&str, &str)]) -> Result<Config, UsageError> {
        match parse(args(a), &env_of(env))? {
            Command::Run(config) => Ok(*config),
            other => panic!("expected Run, got {other:?}"),
        }
    }

    fn ok(a: &[&str], env: &[(&str, &str)]) -> Config {
        run(a, env).unwrap_or_else(|e| panic!("{a:?} {env:?}: {e}"))
    }

    /// The error, checked to be one line.
    fn err(a: &[&str], env: &[(&str, &str)]) -> String {
        let e = run(a, env).expect_err("expected a usage error").0;
        assert!(!e.contains('\n'), "error is not one line: {e:?}");
        e
    }

    fn v4(a: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((a, port))
    }

    fn tcp(a: [u8; 4], port: u16) -> ConsulEndpoint {
        ConsulEndpoint::Tcp(v4(a, port))
    }

    fn temp_file(name: &str, contents: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("gha-config-test-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).expect("write temp file");
        path
    }

    #[test]
    fn defaults() {
        let c = ok(&[], &[]);
        assert_eq!(c.listen_addr, Some(ListenAddr::AnyDualStack(9777)));
        assert_eq!(c.monitoring_addr, Some(ListenAddr::AnyDualStack(9778)));
        assert_eq!(
            c.pprof_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 9779)))
        );
        assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8500));
        assert_eq!(c.consul.host_header, "127.0.0.1:8500");
        assert_eq!(c.consul.path_prefix, "");
        assert_eq!(c.consul.token, None);
        assert_eq!(c.consul.basic_auth, None);
        assert_eq!(c.consul.namespace, None);
        assert_eq!(c.consul.partition, None);
        assert_eq!(c.consul.wait, Duration::from_secs(300));
        assert_eq!(c.consul.max_body_bytes, 64 << 20);
        assert_eq!(c.kv_prefix, "gitlab-haproxy-agent/state");
        assert_eq!(c.read_timeout, Duration::from_secs(5));
        assert_eq!(c.max_line_bytes, 256);
        assert_eq!(c.max_connections, 20000);
        assert_eq!(c.dev_kv_addr, None);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.log_level, log::LevelFilter::Info);
        assert!(!c.consul_follows_dev_kv());
    }

    /// Every flag set on the command line, in all four syntaxes.
    const ALL_FLAGS: &[&str] = &[
        "-listen-addr",
        "127.0.0.1:1001",
        "-monitoring-addr=127.0.0.1:1002",
        "--pprof-addr",
        "127.0.0.1:1003",
        "--consul-addr=10.0.0.1:1004",
        "-kv-prefix",
        "/a/b/",
        "-read-timeout=1500ms",
        "--max-line-bytes",
        "100",
        "--max-connections=7",
        "-consul-wait",
        "1m30s",
        "-consul-max-body-bytes",
        "2048",
        "-dev",
        "-dev-kv-addr",
        "127.0.0.1:1005",
    ];

    fn assert_all_flags(c: &Config) {
        assert_eq!(
            c.listen_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1001)))
        );
        assert_eq!(
            c.monitoring_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1002)))
        );
        assert_eq!(
            c.pprof_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1003)))
        );
        assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 1], 1004));
        assert_eq!(c.kv_prefix, "a/b");
        assert_eq!(c.read_timeout, Duration::from_millis(1500));
        assert_eq!(c.max_line_bytes, 100);
        assert_eq!(c.max_connections, 7);
        assert_eq!(c.consul.wait, Duration::from_secs(90));
        assert_eq!(c.consul.max_body_bytes, 2048);
        assert_eq!(
            c.dev_kv_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1005)))
        );
    }

    const ALL_ENV: &[(&str, &str)] = &[
        ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "127.0.0.1:2001"),
        ("GITLAB_HAPROXY_AGENT_MONITORING_ADDR", "127.0.0.1:2002"),
        ("GITLAB_HAPROXY_AGENT_PPROF_ADDR", "127.0.0.1:2003"),
        ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "10.0.0.2:2004"),
        ("GITLAB_HAPROXY_AGENT_KV_PREFIX", "env/prefix"),
        ("GITLAB_HAPROXY_AGENT_READ_TIMEOUT", "2s"),
        ("GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES", "200"),
        ("GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS", "8"),
        ("GITLAB_HAPROXY_AGENT_CONSUL_WAIT", "2m"),
        ("GITLAB_HAPROXY_AGENT_CONSUL_MAX_BODY_BYTES", "4096"),
        ("GITLAB_HAPROXY_AGENT_DEV", "true"),
        ("GITLAB_HAPROXY_AGENT_DEV_KV_ADDR", "127.0.0.1:2005"),
    ];

    #[test]
    fn every_flag_on_the_command_line() {
        assert_all_flags(&ok(ALL_FLAGS, &[]));
    }

    #[test]
    fn every_flag_from_the_environment() {
        let c = ok(&[], ALL_ENV);
        assert_eq!(
            c.listen_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2001)))
        );
        assert_eq!(
            c.monitoring_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2002)))
        );
        assert_eq!(
            c.pprof_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2003)))
        );
        assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 2], 2004));
        assert_eq!(c.kv_prefix, "env/prefix");
        assert_eq!(c.read_timeout, Duration::from_secs(2));
        assert_eq!(c.max_line_bytes, 200);
        assert_eq!(c.max_connections, 8);
        assert_eq!(c.consul.wait, Duration::from_secs(120));
        assert_eq!(c.consul.max_body_bytes, 4096);
        assert_eq!(
            c.dev_kv_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2005)))
        );
    }

    #[test]
    fn every_flag_beats_its_variable() {
        assert_all_flags(&ok(ALL_FLAGS, ALL_ENV));
        // -dev=false beats GITLAB_HAPROXY_AGENT_DEV=true.
        let c = ok(&["-dev=false"], &[("GITLAB_HAPROXY_AGENT_DEV", "true")]);
        assert_eq!(c.dev_kv_addr, None);
    }

    #[test]
    fn the_table_names_each_variable() {
        let names: Vec<String> = FLAGS.iter().map(FlagSpec::env_var).collect();
        for (var, _) in ALL_ENV {
            assert!(names.iter().any(|n| n == var), "{var}");
        }
        assert_eq!(names.len(), ALL_ENV.len());
    }

    #[test]
    fn four_flag_syntaxes() {
        for a in [
            &["-read-timeout", "7s"][..],
            &["-read-timeout=7s"],
            &["--read-timeout", "7s"],
            &["--read-timeout=7s"],
        ] {
            assert_eq!(ok(a, &[]).read_timeout, Duration::from_secs(7), "{a:?}");
        }
    }

    #[test]
    fn a_value_may_start_with_a_dash() {
        // Go's flag package takes the next argument whatever it looks like.
        let e = err(&["-read-timeout", "-1s"], &[]);
        assert!(
            e.contains("\"-1s\"") && e.contains("flag -read-timeout"),
            "{e}"
        );
        assert_eq!(ok(&["-kv-prefix", "-x-"], &[]).kv_prefix, "-x-");
    }

    #[test]
    fn repeated_flag_takes_the_last_value() {
        assert_eq!(
            ok(&["-max-line-bytes", "10", "-max-line-bytes=20"], &[]).max_line_bytes,
            20
        );
        assert_eq!(ok(&["-dev", "-dev=false"], &[]).dev_kv_addr, None);
    }

    #[test]
    fn unknown_flags() {
        let e = err(&["-nope"], &[]);
        assert!(e.contains("unknown flag -nope"), "{e}");
        let e = err(&["--nope=1"], &[]);
        assert!(e.contains("unknown flag -nope"), "{e}");
        let e = err(&["---listen-addr", ":1"], &[]);
        assert!(e.contains("bad flag syntax"), "{e}");
        let e = err(&["-=x"], &[]);
        assert!(e.contains("bad flag syntax"), "{e}");
    }

    #[test]
    fn leftover_positional_arguments() {
        for a in [
            &["extra"][..],
            &["-listen-addr", ":1", "extra"],
            &["-dev", "true"],
            &["--", "extra"],
            &["-"],
        ] {
            let e = err(a, &[]);
            assert!(e.contains("unexpected argument"), "{a:?}: {e}");
        }
        // A lone `--` ends the flags and is fine.
        assert_eq!(ok(&["-max-line-bytes", "9", "--"], &[]).max_line_bytes, 9);
    }

    #[test]
    fn flag_without_its_value() {
        let e = err(&["-listen-addr", ":1", "-read-timeout"], &[]);
        assert_eq!(e, "flag needs an argument: -read-timeout");
    }

    #[test]
    fn help_and_version() {
        for a in ["-h", "-help", "--help", "--h", "-help=x"] {
            match parse(args(&[a]), &env_of(&[])) {
                Ok(Command::Help(text)) => assert_eq!(text, usage()),
                other => panic!("{a}: {other:?}"),
            }
        }
        for a in ["-version", "--version"] {
            match parse(args(&[a]), &env_of(&[])) {
                Ok(Command::Version(line)) => assert_eq!(line, version_line()),
                other => panic!("{a}: {other:?}"),
            }
        }
        // Help wins over a later bad value (Go stops at -h).
        assert!(matches!(
            parse(args(&["-h", "-read-timeout", "x"]), &env_of(&[])),
            Ok(Command::Help(_))
        ));
    }

    #[test]
    fn usage_names_every_flag_default_and_variable_on_one_line() {
        let text = usage();
        for f in FLAGS {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("-{} ", f.name())))
                .unwrap_or_else(|| panic!("no usage line for -{}", f.name()));
            assert!(line.contains(&format!("{:?}", f.default)), "{line}");
            assert!(line.contains(&f.env_var()), "{line}");
        }
        for var in [
            "CONSUL_HTTP_ADDR",
            "CONSUL_HTTP_TOKEN_FILE",
            "CONSUL_HTTP_TOKEN",
            "GITLAB_LOG_FORMAT",
            "GITLAB_LOG_LEVEL",
        ] {
            assert!(text.contains(var), "{var}");
        }
        assert!(text.contains("-version") && text.contains("-h, -help"));
    }

    #[test]
    fn bad_values_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["-read-timeout", "abc"], "invalid value \"abc\" for flag -read-timeout: not a duration (use Go syntax like 5s, 100ms, 1m30s)"),
            (&["-read-timeout", "0s"], "invalid value \"0s\" for flag -read-timeout: must be more than 0"),
            (&["-read-timeout", "-1s"], "invalid value \"-1s\" for flag -read-timeout: must not be negative"),
            (&["-consul-wait", "-5m"], "invalid value \"-5m\" for flag -consul-wait: must not be negative"),
            (&["-read-timeout", "2h"], "invalid value \"2h\" for flag -read-timeout: must be at most 1h"),
            (&["-max-line-bytes", "0"], "invalid value \"0\" for flag -max-line-bytes: must be between 1 and 65536"),
            (&["-max-line-bytes", "65537"], "invalid value \"65537\" for flag -max-line-bytes: must be between 1 and 65536"),
            (&["-max-line-bytes", "abc"], "invalid value \"abc\" for flag -max-line-bytes: not a whole number"),
            (&["-max-line-bytes", "-1"], "invalid value \"-1\" for flag -max-line-bytes: not a whole number"),
            (&["-max-line-bytes", "+5"], "invalid value \"+5\" for flag -max-line-bytes: not a whole number"),
            (&["-max-connections", "0"], "invalid value \"0\" for flag -max-connections: must be between 1 and 10000000"),
            (&["-max-connections", "1e3"], "invalid value \"1e3\" for flag -max-connections: not a whole number"),
            (&["-consul-wait", "x"], "invalid value \"x\" for flag -consul-wait: not a duration (use Go syntax like 5s, 100ms, 1m30s)"),
            (&["-consul-max-body-bytes", "1023"], "invalid value \"1023\" for flag -consul-max-body-bytes: must be at least 1024"),
            (&["-consul-max-body-bytes", ""], "invalid value \"\" for flag -consul-max-body-bytes: not a whole number"),
            (&["-kv-prefix", "///"], "invalid value \"///\" for flag -kv-prefix: must not be empty (that would watch the whole KV store)"),
            (&["-kv-prefix", ""], "invalid value \"\" for flag -kv-prefix: must not be empty (that would watch the whole KV store)"),
            (&["-kv-prefix", "a\nb"], "invalid value \"a\\nb\" for flag -kv-prefix: holds a control character"),
            (&["-dev=maybe"], "invalid value \"maybe\" for flag -dev: not a boolean (use true or false)"),
            (&["-consul-addr", ""], "invalid value \"\" for flag -consul-addr: must not be empty"),
            (&["-dev", "-dev-kv-addr", ""], "invalid value \"\" for flag -dev-kv-addr: must not be empty with -dev"),
        ];
        for (a, want) in cases {
            assert_eq!(err(a, &[]), *want, "{a:?}");
        }
        for (flag, value) in [
            ("-listen-addr", "nope"),
            ("-listen-addr", ":99999"),
            ("-listen-addr", ":abc"),
            ("-listen-addr", "1.2.3.4"),
            ("-listen-addr", "::1:80"),
            ("-monitoring-addr", "[::1"),
            ("-pprof-addr", "[zz]:1"),
            ("-consul-addr", "1.2.3.4:x"),
            ("-dev-kv-addr", "x"),
        ] {
            let mut a = vec![flag, value];
            if flag == "-dev-kv-addr" {
                a.push("-dev");
            }
            let e = err(&a, &[]);
            assert!(
                e.starts_with(&format!("invalid value {value:?} for flag {flag}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases: &[(&str, &str)] = &[
            ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "nope"),
            ("GITLAB_HAPROXY_AGENT_MONITORING_ADDR", "nope"),
            ("GITLAB_HAPROXY_AGENT_PPROF_ADDR", "nope"),
            ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "ftp://x"),
            ("GITLAB_HAPROXY_AGENT_KV_PREFIX", "/"),
            ("GITLAB_HAPROXY_AGENT_READ_TIMEOUT", "abc"),
            ("GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES", "x"),
            ("GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS", "0"),
            ("GITLAB_HAPROXY_AGENT_CONSUL_WAIT", "11m"),
            ("GITLAB_HAPROXY_AGENT_CONSUL_MAX_BODY_BYTES", "1"),
            ("GITLAB_HAPROXY_AGENT_DEV", "yes"),
        ];
        for (var, value) in cases {
            let e = err(&[], &[(var, value)]);
            assert!(
                e.starts_with(&format!("invalid value {value:?} for {var}: ")),
                "{e}"
            );
        }
        let e = err(&["-dev"], &[("GITLAB_HAPROXY_AGENT_DEV_KV_ADDR", "x")]);
        assert!(
            e.starts_with("invalid value \"x\" for GITLAB_HAPROXY_AGENT_DEV_KV_ADDR: "),
            "{e}"
        );
        assert_eq!(
            err(&["-read-timeout", "abc"], &[]),
            "invalid value \"abc\" for flag -read-timeout: not a duration (use Go syntax like 5s, 100ms, 1m30s)"
        );
    }

    #[test]
    fn empty_variables_count_as_unset_except_for_listeners() {
        let c = ok(
            &[],
            &[
                ("GITLAB_HAPROXY_AGENT_READ_TIMEOUT", ""),
                ("GITLAB_HAPROXY_AGENT_KV_PREFIX", ""),
                ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", ""),
                ("GITLAB_HAPROXY_AGENT_DEV", ""),
            ],
        );
        assert_eq!(c.read_timeout, Duration::from_secs(5));
        assert_eq!(c.kv_prefix, "gitlab-haproxy-agent/state");
        assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8500));
        assert_eq!(c.dev_kv_addr, None);
    }

    #[test]
    fn empty_listen_addresses_disable() {
        let c = ok(
            &["-listen-addr", "", "-monitoring-addr=", "--pprof-addr="],
            &[],
        );
        assert_eq!(
            (c.listen_addr, c.monitoring_addr, c.pprof_addr),
            (None, None, None)
        );
        let c = ok(
            &[],
            &[
                ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", ""),
                ("GITLAB_HAPROXY_AGENT_MONITORING_ADDR", ""),
                ("GITLAB_HAPROXY_AGENT_PPROF_ADDR", ""),
            ],
        );
        assert_eq!(
            (c.listen_addr, c.monitoring_addr, c.pprof_addr),
            (None, None, None)
        );
        // A flag re-enables what the variable disabled.
        let c = ok(
            &["-listen-addr", ":5"],
            &[("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "")],
        );
        assert_eq!(c.listen_addr, Some(ListenAddr::AnyDualStack(5)));
    }

    #[test]
    fn listen_address_forms() {
        let cases: &[(&str, ListenAddr)] = &[
            (":0", ListenAddr::AnyDualStack(0)),
            (":65535", ListenAddr::AnyDualStack(65535)),
            ("[::1]:0", ListenAddr::Addr("[::1]:0".parse().unwrap())),
            ("[::]:9", ListenAddr::Addr("[::]:9".parse().unwrap())),
            ("127.0.0.1:0", ListenAddr::Addr(v4([127, 0, 0, 1], 0))),
            ("0.0.0.0:80", ListenAddr::Addr(v4([0, 0, 0, 0], 80))),
        ];
        for (s, want) in cases {
            assert_eq!(parse_listen_addr(s), Ok(Some(want.clone())), "{s}");
        }
        match parse_listen_addr("localhost:0") {
            Ok(Some(ListenAddr::Addr(a))) => assert!(a.ip().is_loopback() && a.port() == 0, "{a}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(parse_listen_addr(""), Ok(None));
        for bad in [
            "1.2.3.4", ":", ":-1", ":65536", "[::1]", "[::1]x", "a:b:c", "host:",
        ] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn consul_wait_bounds() {
        for bad in ["999ms", "11m", "10m1ns", "0"] {
            let e = err(&["-consul-wait", bad], &[]);
            assert_eq!(
                e,
                format!("invalid value {bad:?} for flag -consul-wait: must be between 1s and 10m")
            );
        }
        assert_eq!(
            ok(&["-consul-wait", "1s"], &[]).consul.wait,
            Duration::from_secs(1)
        );
        assert_eq!(
            ok(&["-consul-wait", "10m"], &[]).consul.wait,
            Duration::from_secs(600)
        );
    }

    #[test]
    fn consul_address_precedence() {
        let flag = ["-consul-addr", "10.0.0.1:1"];
        let own = ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "10.0.0.2:2");
        let consul = ("CONSUL_HTTP_ADDR", "10.0.0.3:3");
        assert_eq!(
            ok(&flag, &[own, consul]).consul.endpoint,
            tcp([10, 0, 0, 1], 1)
        );
        assert_eq!(
            ok(&[], &[own, consul]).consul.endpoint,
            tcp([10, 0, 0, 2], 2)
        );
        assert_eq!(ok(&[], &[consul]).consul.endpoint, tcp([10, 0, 0, 3], 3));
        assert_eq!(ok(&[], &[]).consul.endpoint, tcp([127, 0, 0, 1], 8500));
        assert_eq!(
            ok(&[], &[("CONSUL_HTTP_ADDR", "")]).consul.endpoint,
            tcp([127, 0, 0, 1], 8500)
        );
    }

    #[test]
    fn dev_mode_watches_the_dev_kv_unless_told_otherwise() {
        let c = ok(&["-dev"], &[("CONSUL_HTTP_ADDR", "10.0.0.3:3")]);
        assert_eq!(
            c.dev_kv_addr,
            Some(ListenAddr::Addr(v4([127, 0, 0, 1], 8500)))
        );
        assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8500));
        assert!(c.consul_follows_dev_kv());

        let c = ok(&["-dev", "-dev-kv-addr", ":8600"], &[]);
        assert_eq!(c.dev_kv_addr, Some(ListenAddr::AnyDualStack(8600)));
        assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8600));
        assert_eq!(c.consul.host_header, "127.0.0.1:8600");

        let c = ok(&["-dev", "-dev-kv-addr", "[::]:0"], &[]);
        assert_eq!(
            c.consul.endpoint,
            ConsulEndpoint::Tcp("[::1]:0".parse().unwrap())
        );
        assert!(c.consul_follows_dev_kv());

        let c = ok(&["-dev", "-consul-addr", "10.0.0.1:1"], &[]);
        assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 1], 1));
        assert!(!c.consul_follows_dev_kv());
        let c = ok(
            &["-dev"],
            &[("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "10.0.0.2:2")],
        );
        assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 2], 2));

        // -dev-kv-addr without -dev is not used.
        assert_eq!(ok(&["-dev-kv-addr", "x"], &[]).dev_kv_addr, None);
    }

    #[test]
    fn dev_mode_ignores_the_consul_client_environment() {
        let env = [
            ("CONSUL_CACERT", "/ca.pem"),
            ("CONSUL_HTTP_TOKEN", "secret"),
            ("CONSUL_NAMESPACE", "ns"),
        ];
        let c = ok(&["-dev"], &env);
        assert_eq!((c.consul.token, c.consul.namespace), (None, None));
        // ... but not when the agent watches a real consul.
        let e = err(&["-dev", "-consul-addr", "10.0.0.1:1"], &env);
        assert!(e.starts_with("CONSUL_CACERT"), "{e}");
    }

    #[test]
    fn dev_flag_and_variable_values() {
        for (a, want) in [
            (&["-dev"][..], true),
            (&["-dev=true"], true),
            (&["--dev=1"], true),
            (&["-dev=false"], false),
            (&["-dev=0"], false),
        ] {
            assert_eq!(ok(a, &[]).dev_kv_addr.is_some(), want, "{a:?}");
        }
        for (v, want) in [
            ("true", true),
            ("1", true),
            ("false", false),
            ("0", false),
            ("True", true),
        ] {
            assert_eq!(
                ok(&[], &[("GITLAB_HAPROXY_AGENT_DEV", v)])
                    .dev_kv_addr
                    .is_some(),
                want,
                "{v}"
            );
        }
    }

    #[test]
    fn retarget_to_the_bound_dev_kv() {
        let mut c = ok(&["-dev", "-dev-kv-addr", "127.0.0.1:0"], &[]);
        assert!(c.consul_follows_dev_kv());
        c.consul.retarget(v4([0, 0, 0, 0], 40000));
        assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 40000));
        assert_eq!(c.consul.host_header, "127.0.0.1:40000");
    }

    fn consul_from_env(value: &str) -> Result<ConsulConfig, UsageError> {
        run(&[], &[("CONSUL_HTTP_ADDR", value)]).map(|c| c.consul)
    }

    #[test]
    fn consul_address_forms() {
        let cases: &[(&str, ConsulEndpoint, &str, &str)] = &[
            (
                "10.1.2.3:8501",
                tcp([10, 1, 2, 3], 8501),
                "10.1.2.3:8501",
                "",
            ),
            (
                "http://10.1.2.3:8501",
                tcp([10, 1, 2, 3], 8501),
                "10.1.2.3:8501",
                "",
            ),
            (
                "HTTP://10.1.2.3:8501/",
                tcp([10, 1, 2, 3], 8501),
                "10.1.2.3:8501",
                "",
            ),
            (
                "http://10.1.2.3:8501/consul/",
                tcp([10, 1, 2, 3], 8501),
                "10.1.2.3:8501",
                "/consul",
            ),
            (
                "http://10.1.2.3:8501/a/b",
                tcp([10, 1, 2, 3], 8501),
                "10.1.2.3:8501",
                "/a/b",
            ),
            ("http://10.1.2.3", tcp([10, 1, 2, 3], 80), "10.1.2.3", ""),
            ("10.1.2.3", tcp([10, 1, 2, 3], 80), "10.1.2.3", ""),
            (
                "[::1]:8500",
                ConsulEndpoint::Tcp("[::1]:8500".parse().unwrap()),
                "[::1]:8500",
                "",
            ),
            (
                "http://[::1]:8500",
                ConsulEndpoint::Tcp("[::1]:8500".parse().unwrap()),
                "[::1]:8500",
                "",
            ),
            (
                "unix:///run/consul/consul.sock",
                ConsulEndpoint::Unix("/run/consul/consul.sock".into()),
                "localhost",
                "",
            ),
        ];
        for (addr, endpoint, host, prefix) in cases {
            for c in [
                consul_from_env(addr).expect(addr),
                ok(&["-consul-addr", addr], &[]).consul,
            ] {
                assert_eq!(&c.endpoint, endpoint, "{addr}");
                assert_eq!(c.host_header, *host, "{addr}");
                assert_eq!(c.path_prefix, *prefix, "{addr}");
            }
        }
        let c = consul_from_env("localhost:8500").expect("localhost");
        match c.endpoint {
            ConsulEndpoint::Tcp(a) => assert!(a.ip().is_loopback() && a.port() == 8500, "{a}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.host_header, "localhost:8500");
    }

    #[test]
    fn bad_consul_addresses() {
        let cases: &[(&str, &str)] = &[
            ("ftp://x:1", "unknown protocol scheme \"ftp\""),
            ("unix://", "missing socket path"),
            ("http://", "missing host"),
            (":8500", "missing host"),
            ("h:1/x", "a path needs the http:// form"),
            ("http://h:1/?x=1", "a query or fragment is not allowed"),
            ("http://h:99999", "out of range"),
            ("1:2:3", "needs brackets"),
        ];
        for (addr, want) in cases {
            let e = consul_from_env(addr).expect_err(addr).0;
            assert!(
                e.starts_with(&format!("invalid value {addr:?} for CONSUL_HTTP_ADDR: ")),
                "{e}"
            );
            assert!(e.contains(want), "{addr}: {e}");
        }
        let e = consul_from_env("http://user:hunter2@h:1")
            .expect_err("userinfo")
            .0;
        assert!(
            e.starts_with("invalid value for CONSUL_HTTP_ADDR: credentials"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn https_is_refused_naming_the_setting() {
        let e = consul_from_env("https://10.0.0.1:8501")
            .expect_err("https")
            .0;
        assert!(e.starts_with("invalid value \"https://10.0.0.1:8501\" for CONSUL_HTTP_ADDR: https is not supported"), "{e}");
        assert!(e.contains("TLS"), "{e}");
        let e = err(&["-consul-addr", "https://h:1"], &[]);
        assert!(
            e.contains("for flag -consul-addr: https is not supported"),
            "{e}"
        );
        let e = err(&[], &[("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "https://h:1")]);
        assert!(
            e.contains("for GITLAB_HAPROXY_AGENT_CONSUL_ADDR: https is not supported"),
            "{e}"
        );
    }

    #[test]
    fn tls_variables_are_refused_naming_them() {
        for var in [
            "CONSUL_CACERT",
            "CONSUL_CAPATH",
            "CONSUL_CLIENT_CERT",
            "CONSUL_CLIENT_KEY",
            "CONSUL_TLS_SERVER_NAME",
        ] {
            let e = err(&[], &[(var, "x")]);
            assert!(
                e.starts_with(&format!(
                    "{var} is set, but this build does not support TLS"
                )),
                "{e}"
            );
            // Empty means unset.
            ok(&[], &[(var, "")]);
        }
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            let e = err(&[], &[("CONSUL_HTTP_SSL", v)]);
            assert!(
                e.starts_with(&format!("CONSUL_HTTP_SSL={v:?} asks for https")),
                "{e}"
            );
        }
        for v in ["0", "false", "no", ""] {
            ok(&[], &[("CONSUL_HTTP_SSL", v)]);
        }
        ok(&[], &[("CONSUL_HTTP_SSL_VERIFY", "false")]);
    }

    #[test]
    fn token_file_beats_token() {
        let path = temp_file("token-beats", "  file-token\n");
        let c = ok(
            &[],
            &[
                ("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap()),
                ("CONSUL_HTTP_TOKEN", "env-token"),
            ],
        );
        assert_eq!(c.consul.token.as_deref(), Some("file-token"));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn empty_token_file_is_ignored() {
        let path = temp_file("token-empty", " \n\t\n");
        let file = ("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap());
        assert_eq!(
            ok(&[], &[file, ("CONSUL_HTTP_TOKEN", "env-token")])
                .consul
                .token
                .as_deref(),
            Some("env-token")
        );
        let c = ok(&[], &[file]);
        assert_eq!(c.consul.token, None);
        assert_eq!(
            c.warnings,
            [format!(
                "CONSUL_HTTP_TOKEN_FILE {path:?} is empty: sending no ACL token"
            )]
        );
        assert_eq!(
            ok(&[], &[file, ("CONSUL_HTTP_TOKEN", "t")]).warnings,
            [format!(
                "CONSUL_HTTP_TOKEN_FILE {path:?} is empty: using CONSUL_HTTP_TOKEN"
            )]
        );
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn unreadable_token_file_names_the_variable_not_the_token() {
        let e = err(
            &[],
            &[
                ("CONSUL_HTTP_TOKEN_FILE", "/nonexistent/gha-token"),
                ("CONSUL_HTTP_TOKEN", "s3cr3t-token"),
            ],
        );
        assert!(
            e.starts_with("CONSUL_HTTP_TOKEN_FILE: cannot read \"/nonexistent/gha-token\""),
            "{e}"
        );
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn tokens_are_trimmed_and_checked() {
        assert_eq!(
            ok(&[], &[("CONSUL_HTTP_TOKEN", " \tabc-123\n")])
                .consul
                .token
                .as_deref(),
            Some("abc-123")
        );
        assert_eq!(ok(&[], &[("CONSUL_HTTP_TOKEN", "   ")]).consul.token, None);
        let e = err(&[], &[("CONSUL_HTTP_TOKEN", "s3cr3t with space")]);
        assert!(
            e.starts_with("CONSUL_HTTP_TOKEN: ") && !e.contains("s3cr3t"),
            "{e}"
        );
        let path = temp_file("token-bad", "s3cr3t\r\nX-Evil: 1\n");
        let e = err(&[], &[("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap())]);
        assert!(
            e.starts_with("CONSUL_HTTP_TOKEN_FILE: ") && !e.contains("s3cr3t"),
            "{e}"
        );
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn basic_auth_is_base64() {
        let auth = |v: &str| ok(&[], &[("CONSUL_HTTP_AUTH", v)]).consul.basic_auth;
        assert_eq!(auth("user:pass").as_deref(), Some("dXNlcjpwYXNz"));
        assert_eq!(auth("user:pa:ss").as_deref(), Some("dXNlcjpwYTpzcw=="));
        // No ':' is a user without a password, as Go's client.
        assert_eq!(auth("user").as_deref(), Some("dXNlcjo="));
        assert_eq!(auth(""), None);
    }

    #[test]
    fn namespace_and_partition_only_when_set() {
        let c = ok(
            &[],
            &[
                ("CONSUL_NAMESPACE", "team-a"),
                ("CONSUL_PARTITION", "part_1"),
            ],
        );
        assert_eq!(c.consul.namespace.as_deref(), Some("team-a"));
        assert_eq!(c.consul.partition.as_deref(), Some("part_1"));
        let c = ok(&[], &[("CONSUL_NAMESPACE", ""), ("CONSUL_PARTITION", "")]);
        assert_eq!((c.consul.namespace, c.consul.partition), (None, None));
        let e = err(&[], &[("CONSUL_NAMESPACE", "a&b")]);
        assert!(
            e.starts_with("invalid value \"a&b\" for CONSUL_NAMESPACE"),
            "{e}"
        );
        let e = err(&[], &[("CONSUL_PARTITION", "a b")]);
        assert!(
            e.starts_with("invalid value \"a b\" for CONSUL_PARTITION"),
            "{e}"
        );
    }

    #[test]
    fn log_settings_from_the_environment() {
        let c = ok(
            &[],
            &[("GITLAB_LOG_FORMAT", "text"), ("GITLAB_LOG_LEVEL", "debug")],
        );
        assert_eq!(
            (c.log_format, c.log_level),
            (LogFormat::Text, log::LevelFilter::Debug)
        );
        for (v, want) in [
            ("trace", log::LevelFilter::Trace),
            ("info", log::LevelFilter::Info),
            ("WARN", log::LevelFilter::Warn),
            ("error", log::LevelFilter::Error),
        ] {
            assert_eq!(ok(&[], &[("GITLAB_LOG_LEVEL", v)]).log_level, want, "{v}");
        }
        assert_eq!(
            ok(&[], &[("GITLAB_LOG_FORMAT", "json")]).log_format,
            LogFormat::Json
        );
        assert_eq!(
            err(&[], &[("GITLAB_LOG_FORMAT", "xml")]),
            "invalid value \"xml\" for GITLAB_LOG_FORMAT: use json or text"
        );
        assert_eq!(
            err(&[], &[("GITLAB_LOG_LEVEL", "loud")]),
            "invalid value \"loud\" for GITLAB_LOG_LEVEL: use trace, debug, info, warn or error"
        );
    }

    #[test]
    fn non_utf8_argument() {
        use std::os::unix::ffi::OsStringExt;
        let e = parse(vec![OsString::from_vec(vec![b'-', 0xff])], &env_of(&[]))
            .expect_err("non-UTF-8")
            .0;
        assert!(e.contains("not valid UTF-8"), "{e}");
    }
}
