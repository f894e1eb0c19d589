//! Command line and environment -> validated [`Config`], in two steps like
//! ripgrep's low/high args: `lex` turns argv and the environment into
//! `LowArgs`, one typed field of raw text per setting; `validate` checks and
//! types each one. Pure except for reading the token file, the TLS
//! certificate and key files, and resolving a hostname once, all in step
//! two.
//!
//! - `flags.rs`: the table of every flag and variable, and the usage text;
//! - `lex.rs`: step one, the one Go-flag walker (the commands' too) and
//!   the one read of the environment;
//! - `addr.rs`: listener and consul address forms (and the DNS lookup);
//! - `validate.rs`: step two, into [`Config`] (and the token file read);
//! - `tls.rs`: the consul TLS settings, into a rustls configuration (the
//!   certificate and key files read, the system's roots when needed).
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
//!   own dev KV, and the consul client environment (`CONSUL_*`) is ignored:
//!   it describes a real consul (and a `-consul-*` TLS flag is refused);
//! - each consul TLS setting comes from its flag, else its
//!   `GITLAB_HAPROXY_AGENT_*` variable, else consul's `CONSUL_*` variable
//!   (the address's precedence); its files are read once, in step two
//!   (`tls.rs`).

mod addr;
mod flags;
mod lex;
mod tls;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

use std::net::SocketAddr;
use std::time::Duration;

pub use addr::{
    loopback_if_unspecified, parse_http_url, parse_listen_addr, parse_stats_socket, ConsulEndpoint,
    ListenAddr, StatsSocket,
};
pub use flags::usage;
/// `daemon_flag`: how the daemon's flag takes its value; the writers and
/// `status` pass the daemon's flags on to [`parse`], so they need to know
/// which word is a flag's value.
pub use lex::{go_flags, takes as daemon_flag, Given, GoFlags, Takes, Word};
pub use tls::{ConsulTls, SharedConfig};
pub use validate::max_line_bytes;

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
    /// TLS on the connection (`https://`, `CONSUL_HTTP_SSL`), or `None`.
    pub tls: Option<ConsulTls>,
    /// Blocking-query wait, 1s..=10m.
    pub wait: Duration,
    pub max_body_bytes: usize,
    /// `-consul-gzip`: whether to ask for gzip ([`ConsulConfig::asks_gzip`]).
    pub gzip: GzipMode,
    /// `-consul-max-stale`: zero is off (the leader answers).
    pub max_stale: Duration,
}

/// `-consul-gzip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GzipMode {
    /// Ask unless consul is on a loopback address or a unix socket, where
    /// compressing only costs both sides CPU.
    Auto,
    Always,
    Never,
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
    /// `-listen-allow`: sources served on the agent port (empty: all).
    pub listen_allow: crate::agent::allow::Allow,
    pub monitoring_addr: Option<ListenAddr>,
    pub pprof_addr: Option<ListenAddr>,
    pub consul: ConsulConfig,
    /// Without leading/trailing `/`.
    pub kv_prefix: String,
    pub read_timeout: Duration,
    pub max_line_bytes: usize,
    /// `-reply-up`: every reply ends in ` up` (`ready 100% up`).
    pub reply_up: bool,
    pub max_connections: usize,
    /// `-state-file`: `None` when empty.
    pub state_file: Option<std::path::PathBuf>,
    pub state_max_age: Duration,
    /// `-unasked-after`: at least a second.
    pub unasked_after: Duration,
    /// `-max-unknown-identities`: bound of the asked-without-a-key set.
    pub max_unknown_identities: usize,
    /// `-dev`: serve the in-memory KV on this address too.
    pub dev_kv_addr: Option<ListenAddr>,
    pub log_format: LogFormat,
    pub log_level: log::LevelFilter,
    /// systemd's `NOTIFY_SOCKET` and watchdog, when it set them.
    pub notify: Option<crate::notify::Settings>,
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

/// Parses argv (without the program name) and the environment (`env` looks a
/// variable up; it is called only by `lex::read_env`) into a [`Command`].
pub fn parse(
    args: Vec<std::ffi::OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Command, UsageError> {
    let mut low = match lex::lex(args)? {
        lex::Lexed::Help => return Ok(Command::Help(usage())),
        lex::Lexed::Version => return Ok(Command::Version(crate::build_info::version_line())),
        lex::Lexed::Run(low) => low,
    };
    lex::read_env(&mut low, env);
    Ok(Command::Run(Box::new(validate::config(&low)?)))
}

impl ConsulConfig {
    /// What must never be shown of an error body: the token, the basic
    /// auth as sent (base64) and decoded (`user:password`, the password).
    pub fn secrets(&self) -> Vec<Vec<u8>> {
        use base64::Engine as _;
        let mut secrets: Vec<Vec<u8>> = self.token.iter().map(|t| t.clone().into_bytes()).collect();
        if let Some(auth) = &self.basic_auth {
            secrets.push(auth.clone().into_bytes());
            if let Ok(pair) = base64::engine::general_purpose::STANDARD.decode(auth) {
                if let Some(at) = pair.iter().position(|&b| b == b':') {
                    secrets.push(pair[at + 1..].to_vec());
                }
                secrets.push(pair);
            }
        }
        // The longest first, so a secret inside another is not cut out of it.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets
    }

    /// Whether requests carry `Accept-Encoding: gzip`.
    pub fn asks_gzip(&self) -> bool {
        match (self.gzip, &self.endpoint) {
            (GzipMode::Always, _) => true,
            (GzipMode::Never, _) => false,
            (GzipMode::Auto, ConsulEndpoint::Unix(_)) => false,
            (GzipMode::Auto, ConsulEndpoint::Tcp(addr)) => !addr.ip().to_canonical().is_loopback(),
        }
    }

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
            Some(dev) => self.consul.endpoint == ConsulEndpoint::Tcp(dev.connect_addr()),
            None => false,
        }
    }
}
