//! The validated configuration: what step two ([`super::validate`]) makes
//! and the rest of the program reads.

use std::net::SocketAddr;
use std::time::Duration;

use super::addr::{loopback_if_unspecified, ConsulEndpoint, ListenAddr};
use super::tls::ConsulTls;
use crate::logging::LogFormat;

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
