//! Command line and environment -> validated [`Config`] (SPEC §6), in two
//! steps like ripgrep's low/high args: raw strings from argv and env, then
//! checked, typed values. Pure except for reading the token file and
//! resolving a consul hostname once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where to listen. `:port` is all interfaces, dual-stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `:port`: `[::]` with IPv6-only off, falling back to `0.0.0.0`.
    AnyDualStack(u16),
    Addr(SocketAddr),
}

/// How to reach consul.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsulEndpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Everything the consul client needs, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulConfig {
    pub endpoint: ConsulEndpoint,
    /// `Host` header value (`host:port` as given; `localhost` for unix).
    pub host_header: String,
    /// Path prefix from `http://host:port/prefix` (no trailing `/`; empty if none).
    pub path_prefix: String,
    /// ACL token (trimmed), sent as `X-Consul-Token`. Never logged.
    pub token: Option<String>,
    /// `CONSUL_HTTP_AUTH`, already base64-encoded for `Authorization: Basic`.
    pub basic_auth: Option<String>,
    pub namespace: Option<String>,
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
    /// `-dev` without an explicit consul address: the watcher follows the
    /// dev KV's bound address (which only the bound socket knows for port 0).
    pub consul_follows_dev_kv: bool,
    pub log_format: LogFormat,
    pub log_level: log::LevelFilter,
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

/// Parses argv (without the program name) and the environment (`env` looks a
/// variable up) into a [`Command`].
pub fn parse(args: Vec<std::ffi::OsString>, env: &dyn Fn(&str) -> Option<String>) -> Result<Command, UsageError> {
    todo!("{args:?} {:?}", env("X"))
}

/// Parses a Go duration (`300ms`, `1.5s`, `1m30s`, `2h`; units ns us µs ms s m h).
pub fn parse_duration(s: &str) -> Option<Duration> {
    todo!("{s}")
}

/// The version line: `gitlab-haproxy-agent <Cargo version> (<git commit>)`,
/// the commit baked in at build time when built from a checkout.
pub fn version_line() -> String {
    todo!()
}
