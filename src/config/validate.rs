//! Step two: [`LowArgs`] -> [`Config`]: each raw value checked and typed.
//!
//! In: step one's text and where each piece came from. Out: the validated
//! [`Config`], or the first error, one line naming the flag or variable.
//!
//! Always holds:
//! - settings are checked in one fixed order (the listeners, the limits,
//!   `-dev`, consul, logging), so a command line with several mistakes
//!   always reports the same one;
//! - no error holds a token or a password;
//! - the only IO is [`read_token_file`], the look for a systemd credential
//!   ([`super::check::credential`]) and the DNS lookup of a hostname
//!   (`addr::resolve_host`);
//! - the environment is not read here.

use std::time::Duration;

use base64::Engine as _;

use super::addr::{parse_consul_addr, parse_listen_addr, ConsulAddr, ConsulEndpoint, ListenAddr};
use super::check::{boolean, credential, usage_error, UsageError};
use super::flags::{LowArgs, Raw};
use super::model::{Config, ConsulConfig, GzipMode};
use super::tls::consul_tls;
use crate::agent::allow::Allow;
use crate::decimal::parse_uint;
use crate::gocompat::{parse_go_bool, parse_signed_duration};
use crate::logging::LogFormat;

/// Checks every setting, in the order that decides which error is reported.
pub(super) fn config(low: &LowArgs) -> Result<Config, UsageError> {
    let mut listen_addr = listen(&low.listen_addr.value())?;
    let raw = low.listen_allow.value();
    let listen_allow = Allow::parse(&raw.value).map_err(|e| raw.invalid(e))?;
    let mut monitoring_addr = listen(&low.monitoring_addr.value())?;
    let pprof_addr = listen(&low.pprof_addr.value())?;
    let kv_prefix = kv_prefix(&low.kv_prefix.value())?;
    let read_timeout = read_timeout(&low.read_timeout.value())?;
    let raw = low.max_line_bytes.value();
    let max_line_bytes = max_line_bytes(&raw.value).map_err(|e| raw.invalid(e))?;
    let reply_up = boolean(&low.reply_up.value())?;
    let max_connections = number(&low.max_connections.value(), 1, 10_000_000)?;
    let wait = consul_wait(&low.consul_wait.value())?;
    let max_body_bytes = number(&low.consul_max_body_bytes.value(), 1024, usize::MAX)?;
    let state_file = Some(low.state_file.value().value)
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from);
    let state_max_age = positive_duration(&low.state_max_age.value())?;
    let unasked_after = unasked_after(&low.unasked_after.value())?;
    let max_unknown_identities = number(&low.max_unknown_identities.value(), 0, 10_000_000)?;
    let gzip = gzip_mode(&low.consul_gzip.value())?;
    let max_stale = duration(&low.consul_max_stale.value())?;
    let dev_kv_addr = dev_kv_addr(low)?;
    if dev_kv_addr.is_some() {
        // -dev stays local: listeners not given bind to loopback.
        for (addr, flag) in [
            (&mut listen_addr, &low.listen_addr),
            (&mut monitoring_addr, &low.monitoring_addr),
        ] {
            if let (Some(ListenAddr::AnyDualStack(port)), None) = (&addr, flag.explicit()) {
                *addr = Some(ListenAddr::Addr(
                    (std::net::Ipv4Addr::LOCALHOST, *port).into(),
                ));
            }
        }
    }
    let mut warnings = Vec::new();
    let limits = (wait, max_body_bytes);
    let mut consul = consul_config(low, dev_kv_addr.as_ref(), limits, &mut warnings)?;
    if let (Some(_), None, ConsulEndpoint::Tcp(at)) = (&consul.token, &consul.tls, &consul.endpoint)
    {
        if !at.ip().is_loopback() {
            warnings.push(format!("the ACL token goes to consul at {at} in clear (http, not loopback): use https (-consul-http-ssl, an https:// address) or a local consul agent"));
        }
    }
    consul.gzip = gzip;
    consul.max_stale = max_stale;
    let (log_format, log_level) = log_settings(low)?;
    let text = |raw: &Option<Raw>| raw.as_ref().map(|r| r.value.clone());
    let notify = crate::notify::settings(
        text(&low.notify_socket).as_deref(),
        text(&low.watchdog_usec).as_deref(),
        text(&low.watchdog_pid).as_deref(),
        std::process::id(),
        &mut warnings,
    );
    Ok(Config {
        listen_addr,
        listen_allow,
        monitoring_addr,
        pprof_addr,
        consul,
        kv_prefix,
        read_timeout,
        max_line_bytes,
        reply_up,
        max_connections,
        state_file,
        state_max_age,
        unasked_after,
        max_unknown_identities,
        dev_kv_addr,
        log_format,
        log_level,
        notify,
        warnings,
    })
}

fn duration(raw: &Raw) -> Result<Duration, UsageError> {
    match parse_signed_duration(&raw.value) {
        None => Err(raw.invalid("not a duration (use Go syntax like 5s, 100ms, 1m30s)")),
        Some((true, d)) if !d.is_zero() => Err(raw.invalid("must not be negative")),
        Some((_, d)) => Ok(d),
    }
}

fn positive_duration(raw: &Raw) -> Result<Duration, UsageError> {
    let d = duration(raw)?;
    if d.is_zero() {
        return Err(raw.invalid("must be more than 0"));
    }
    Ok(d)
}

fn read_timeout(raw: &Raw) -> Result<Duration, UsageError> {
    let d = positive_duration(raw)?;
    if d > Duration::from_secs(3600) {
        return Err(raw.invalid("must be at most 1h"));
    }
    Ok(d)
}

/// `-unasked-after`: whole seconds count (asks are recorded per second).
fn unasked_after(raw: &Raw) -> Result<Duration, UsageError> {
    let d = duration(raw)?;
    if d < Duration::from_secs(1) {
        return Err(raw.invalid("must be at least 1s"));
    }
    Ok(d)
}

fn consul_wait(raw: &Raw) -> Result<Duration, UsageError> {
    let d = duration(raw)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(600) {
        return Err(raw.invalid("must be between 1s and 10m"));
    }
    Ok(d)
}

/// `-consul-gzip`: `auto`, or a Go bool.
fn gzip_mode(raw: &Raw) -> Result<GzipMode, UsageError> {
    if raw.value.eq_ignore_ascii_case("auto") {
        return Ok(GzipMode::Auto);
    }
    match parse_go_bool(&raw.value) {
        Some(true) => Ok(GzipMode::Always),
        Some(false) => Ok(GzipMode::Never),
        None => Err(raw.invalid("use auto, true or false")),
    }
}

fn number(raw: &Raw, min: usize, max: usize) -> Result<usize, UsageError> {
    bounded(&raw.value, min, max).map_err(|e| raw.invalid(e))
}

/// `-max-line-bytes` (also read by `lint-haproxy`): 1 to 65536, or why not.
pub fn max_line_bytes(text: &str) -> Result<usize, String> {
    bounded(text, 1, 65536)
}

fn bounded(text: &str, min: usize, max: usize) -> Result<usize, String> {
    let n = parse_uint(text.as_bytes())
        .ok()
        .and_then(|n| usize::try_from(n).ok());
    match n {
        None => Err("not a whole number".to_owned()),
        Some(n) if n < min || n > max => {
            if max == usize::MAX {
                Err(format!("must be at least {min}"))
            } else {
                Err(format!("must be between {min} and {max}"))
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

fn listen(raw: &Raw) -> Result<Option<ListenAddr>, UsageError> {
    parse_listen_addr(&raw.value).map_err(|reason| raw.invalid(reason))
}

/// `-dev-kv-addr`, only with `-dev`.
fn dev_kv_addr(low: &LowArgs) -> Result<Option<ListenAddr>, UsageError> {
    if !boolean(&low.dev.value())? {
        return Ok(None);
    }
    let raw = low.dev_kv_addr.value();
    match listen(&raw)? {
        Some(ListenAddr::Addr(at)) if at.ip().is_loopback() => Ok(Some(ListenAddr::Addr(at))),
        Some(_) => Err(raw.invalid(
            "must be a loopback address (127.0.0.1:PORT or [::1]:PORT): the dev KV has no ACLs",
        )),
        None => Err(raw.invalid("must not be empty with -dev")),
    }
}

fn log_settings(low: &LowArgs) -> Result<(LogFormat, log::LevelFilter), UsageError> {
    let format = match &low.gitlab_log_format {
        None => LogFormat::Json,
        Some(raw) => match raw.value.to_ascii_lowercase().as_str() {
            "json" => LogFormat::Json,
            "text" => LogFormat::Text,
            _ => return Err(raw.invalid("use json or text")),
        },
    };
    let level = match &low.gitlab_log_level {
        None => log::LevelFilter::Info,
        Some(raw) => match raw.value.to_ascii_lowercase().as_str() {
            "trace" => log::LevelFilter::Trace,
            "debug" => log::LevelFilter::Debug,
            "info" => log::LevelFilter::Info,
            "warn" | "warning" => log::LevelFilter::Warn,
            "error" => log::LevelFilter::Error,
            _ => return Err(raw.invalid("use trace, debug, info, warn or error")),
        },
    };
    Ok((format, level))
}

// ---------------------------------------------------------------------------
// Consul.

fn consul_addr(raw: &Raw) -> Result<ConsulAddr, UsageError> {
    parse_consul_addr(&raw.value).map_err(|e| {
        if e.secret {
            usage_error(format!("invalid value for {}: {}", raw.source, e.reason))
        } else {
            raw.invalid(e.reason)
        }
    })
}

/// Where consul is and how to talk to it. `-consul-addr` (or its
/// variable) wins; else with `-dev` the agent watches its own dev KV and the
/// `CONSUL_*` client variables, which describe a real consul, are ignored;
/// else `CONSUL_HTTP_ADDR`, else the default.
fn consul_config(
    low: &LowArgs,
    dev_kv: Option<&ListenAddr>,
    (wait, max_body_bytes): (Duration, usize),
    warnings: &mut Vec<String>,
) -> Result<ConsulConfig, UsageError> {
    let at = |addr: ConsulAddr| ConsulConfig {
        endpoint: addr.endpoint,
        host_header: addr.host_header,
        path_prefix: addr.path_prefix,
        token: None,
        basic_auth: None,
        namespace: None,
        partition: None,
        tls: None,
        wait,
        max_body_bytes,
        gzip: GzipMode::Auto,
        max_stale: Duration::ZERO,
    };
    let explicit = low.consul_addr.explicit();
    if let Some(raw) = explicit.filter(|raw| raw.value.is_empty()) {
        return Err(raw.invalid("must not be empty"));
    }
    let addr = match (explicit, dev_kv) {
        (Some(raw), _) => consul_addr(raw)?,
        (None, Some(dev)) => {
            let addr = dev.connect_addr();
            refuse_tls_flags(low)?;
            return Ok(at(ConsulAddr {
                endpoint: ConsulEndpoint::Tcp(addr),
                host_header: addr.to_string(),
                path_prefix: String::new(),
                https: false,
                host: addr.ip().to_string(),
            }));
        }
        (None, None) => consul_addr(
            &low.consul_http_addr
                .clone()
                .unwrap_or_else(|| low.consul_addr.value()),
        )?,
    };
    let tls = consul_tls(low, &addr, warnings)?;
    Ok(ConsulConfig {
        tls,
        token: token(low, warnings)?,
        basic_auth: low
            .consul_http_auth
            .as_ref()
            .map(|raw| basic_auth(&raw.value)),
        namespace: enterprise_name(&low.consul_namespace)?,
        partition: enterprise_name(&low.consul_partition)?,
        ..at(addr)
    })
}

/// With `-dev` watching its own (plain HTTP) KV, a TLS flag would be
/// ignored: refused instead, never silently dropped. (Consul's `CONSUL_*`
/// variables describe a real consul and are ignored in that mode.)
fn refuse_tls_flags(low: &LowArgs) -> Result<(), UsageError> {
    let flags = [
        &low.consul_http_ssl,
        &low.consul_http_ssl_verify,
        &low.consul_ca_cert,
        &low.consul_ca_path,
        &low.consul_client_cert,
        &low.consul_client_key,
        &low.consul_tls_server_name,
    ];
    match flags.into_iter().find_map(|f| f.explicit()) {
        Some(raw) => Err(usage_error(format!(
            "{} is set, but with -dev the agent watches its own plain-HTTP KV: give -consul-addr too, or unset it",
            raw.source
        ))),
        None => Ok(()),
    }
}

/// `CONSUL_HTTP_AUTH` for `Authorization: Basic`. Go's client splits at
/// the first `:`; no `:` means a user without a password.
fn basic_auth(auth: &str) -> String {
    let pair = if auth.contains(':') {
        auth.to_owned()
    } else {
        format!("{auth}:")
    };
    base64::engine::general_purpose::STANDARD.encode(pair)
}

/// A token must fit in an HTTP header as is.
fn check_token(token: &str, raw: &Raw) -> Result<(), UsageError> {
    if token.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(usage_error(format!(
            "{}: the token holds a space, control or non-ASCII character (the value is not shown)",
            raw.source
        )))
    }
}

/// `CONSUL_HTTP_TOKEN_FILE` (read once, trimmed) before `CONSUL_HTTP_TOKEN`
/// (trimmed), else the `consul-token` credential. An empty file is passed
/// over, as consul's own client does, with a warning (a secret that was not
/// mounted looks like this).
fn token(low: &LowArgs, warnings: &mut Vec<String>) -> Result<Option<String>, UsageError> {
    let given = low.consul_http_token_file.is_some() || low.consul_http_token.is_some();
    let file = if given {
        low.consul_http_token_file.clone()
    } else {
        credential(low, "consul-token")
    };
    if let Some(file) = &file {
        let text = read_token_file(file)?;
        let token = text.trim();
        if !token.is_empty() {
            check_token(token, file)?;
            if let Some(mode) = crate::files::loose_mode(std::path::Path::new(&file.value)) {
                warnings.push(format!(
                    "{} {:?} has mode {mode:o}: others can read or write the ACL token (chmod 600, or 640 for a group)",
                    file.source, file.value
                ));
            }
            return Ok(Some(token.to_string()));
        }
        let instead = match &low.consul_http_token {
            Some(var) => format!("using {}", var.source),
            None => "sending no ACL token".to_owned(),
        };
        warnings.push(format!(
            "{} {:?} is empty: {instead}",
            file.source, file.value
        ));
    }
    match low
        .consul_http_token
        .as_ref()
        .map(|raw| (raw, raw.value.trim()))
    {
        Some((raw, token)) if !token.is_empty() => {
            check_token(token, raw)?;
            Ok(Some(token.to_string()))
        }
        _ => Ok(None),
    }
}

/// The token file's text (IO: reads the file named by `file`).
fn read_token_file(file: &Raw) -> Result<String, UsageError> {
    let path = &file.value;
    let data = crate::files::read_regular(path.as_ref(), crate::files::MAX_TOKEN_BYTES)
        .map_err(|e| usage_error(format!("{}: cannot read {path:?}: {e}", file.source)))?;
    String::from_utf8(data)
        .map_err(|_| usage_error(format!("{}: {path:?} is not UTF-8 text", file.source)))
}

/// `CONSUL_NAMESPACE` / `CONSUL_PARTITION`: only when set; consul allows
/// letters, digits, `-` and `_` there, so the value needs no escaping.
fn enterprise_name(raw: &Option<Raw>) -> Result<Option<String>, UsageError> {
    match raw {
        None => Ok(None),
        Some(raw)
            if raw
                .value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            Ok(Some(raw.value.clone()))
        }
        Some(raw) => Err(raw.invalid("use letters, digits, '-' and '_' only")),
    }
}
