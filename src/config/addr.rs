//! The address forms: listeners (`:port`, `host:port`, `[v6]:port`, empty
//! to disable) and consul (`host[:port]`, `http://host[:port][/prefix]`,
//! `https://host[:port][/prefix]`, `unix:///path`).
//!
//! In: the text of a flag or variable. Out: a [`ListenAddr`] or a
//! [`ConsulEndpoint`] with its `Host` header and path prefix, or the reason
//! the text is refused, one line.
//!
//! Always holds:
//! - pure except [`resolve_host`], the one DNS lookup, made once at start
//!   for a hostname (never for an IP literal);
//! - a refused consul address that holds a password is flagged so the
//!   caller does not echo it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::decimal::{parse_uint, UintError};

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

impl ListenAddr {
    /// The address to connect to, on this host, for a listener bound here
    /// (the dev KV's, or the agent's for the operator commands).
    pub fn connect_addr(&self) -> SocketAddr {
        match self {
            ListenAddr::AnyDualStack(port) => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), *port),
            ListenAddr::Addr(addr) => loopback_if_unspecified(*addr),
        }
    }
}

/// Splits `host[:port]` / `[v6][:port]`; the host comes back without brackets.
pub(super) fn split_host_port(s: &str) -> Result<(&str, Option<u16>), String> {
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

/// An IP literal as is; a hostname resolved now, once (IO: DNS), to its
/// first address.
pub(super) fn resolve_host(host: &str, port: u16) -> Result<SocketAddr, String> {
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
pub fn parse_listen_addr(s: &str) -> Result<Option<ListenAddr>, String> {
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
        (host, Some(port)) => Ok(Some(ListenAddr::Addr(resolve_host(host, port)?))),
    }
}

/// Why a consul address was refused; `secret` when the value must not be
/// echoed (it holds a password).
pub(super) struct AddrError {
    pub reason: String,
    pub secret: bool,
}

impl From<String> for AddrError {
    fn from(reason: String) -> Self {
        AddrError {
            reason,
            secret: false,
        }
    }
}

impl From<&str> for AddrError {
    fn from(reason: &str) -> Self {
        AddrError::from(reason.to_owned())
    }
}

/// A consul address, parsed: where to connect, the `Host` header (`host:port`
/// as given; `localhost` for unix), the path prefix (no trailing `/`;
/// empty, or starting with `/` as Go's `PathPrefix`), whether the scheme
/// asks for TLS, and the host a TLS certificate is checked against.
pub(super) struct ConsulAddr {
    pub endpoint: ConsulEndpoint,
    pub host_header: String,
    pub path_prefix: String,
    /// `https://`: TLS whatever `CONSUL_HTTP_SSL` says.
    pub https: bool,
    /// The host as written, without brackets or port (`localhost` for
    /// unix): the default TLS server name.
    pub host: String,
}

/// The forms of `CONSUL_HTTP_ADDR`: `host[:port]`, `http://host[:port][/prefix]`,
/// `https://host[:port][/prefix]`, `unix:///path`.
pub(super) fn parse_consul_addr(s: &str) -> Result<ConsulAddr, AddrError> {
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
        None => (None, s),
    };
    match scheme.as_deref() {
        None if rest.contains('/') => Err("a path needs the http:// form".into()),
        None | Some("http") => parse_http_authority_and_path(rest, 80),
        Some("https") => Ok(ConsulAddr {
            https: true,
            ..parse_http_authority_and_path(rest, 443)?
        }),
        Some("unix") if rest.is_empty() => {
            Err("missing socket path (use unix:///path/to/consul.sock)".into())
        }
        Some("unix") => Ok(ConsulAddr {
            endpoint: ConsulEndpoint::Unix(PathBuf::from(rest)),
            host_header: "localhost".into(),
            path_prefix: String::new(),
            https: false,
            host: "localhost".into(),
        }),
        Some(other) => Err(format!(
            "unknown protocol scheme {other:?} (use host:port, http://, https:// or unix://)"
        )
        .into()),
    }
}

/// `host[:port][/prefix]` of an `http://`, `https://` (or scheme-less)
/// consul address; Go's client takes `default_port` when none is given.
fn parse_http_authority_and_path(s: &str, default_port: u16) -> Result<ConsulAddr, AddrError> {
    if s.contains(['?', '#']) {
        return Err("a query or fragment is not allowed".into());
    }
    let (authority, path) = match s.find('/') {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    if authority.contains('@') {
        return Err(AddrError {
            reason: "credentials in the address are not supported (use CONSUL_HTTP_AUTH); the value is not shown"
                .into(),
            secret: true,
        });
    }
    if authority.chars().any(|c| c.is_control() || c == ' ') {
        return Err("the host holds a space or control character".into());
    }
    if path.chars().any(|c| c.is_control() || c == ' ') {
        return Err("the path holds a space or control character".into());
    }
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err("missing host".into());
    }
    let addr = resolve_host(host, port.unwrap_or(default_port))?;
    Ok(ConsulAddr {
        endpoint: ConsulEndpoint::Tcp(addr),
        host_header: authority.to_string(),
        path_prefix: path.trim_end_matches('/').to_string(),
        https: false,
        host: host.to_string(),
    })
}

/// A haproxy stats socket, as haproxy's `stats socket` line writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsSocket {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// `/path`, `unix@/path`, `ipv4@HOST:PORT`, `ipv6@[HOST]:PORT` (haproxy's
/// `ipv6@::1:PORT`, the port after the last colon, too) or `HOST:PORT`;
/// a word without a colon is a unix path.
pub fn parse_stats_socket(s: &str) -> Result<StatsSocket, String> {
    let tcp = |host: &str, port: Option<u16>, v6: bool| {
        let port = port.ok_or("missing port")?;
        match host.parse::<IpAddr>() {
            Ok(ip) if ip.is_ipv6() != v6 => Err(format!(
                "{host} is not an IPv{} address",
                if v6 { 6 } else { 4 }
            )),
            _ => Ok(StatsSocket::Tcp(resolve_host(host, port)?)),
        }
    };
    if let Some(rest) = s.strip_prefix("ipv4@") {
        let (host, port) = split_host_port(rest)?;
        return tcp(host, port, false);
    }
    if let Some(rest) = s.strip_prefix("ipv6@") {
        if rest.starts_with('[') {
            let (host, port) = split_host_port(rest)?;
            return tcp(host, port, true);
        }
        let (host, port) = rest.rsplit_once(':').ok_or("missing port")?;
        return tcp(host, Some(parse_port(port)?), true);
    }
    if let Some(path) = s.strip_prefix("unix@") {
        return Ok(StatsSocket::Unix(PathBuf::from(path)));
    }
    if let Some((kind, _)) = s.split_once('@').filter(|(k, _)| !k.contains('/')) {
        return Err(format!("{kind}@ sockets are not supported (use a unix path, ipv4@HOST:PORT or ipv6@[HOST]:PORT)"));
    }
    if s.is_empty() {
        return Err("empty".into());
    }
    if s.contains('/') || !s.contains(':') {
        return Ok(StatsSocket::Unix(PathBuf::from(s)));
    }
    let (host, port) = split_host_port(s)?;
    tcp(host, port, host.contains(':'))
}

/// An `http://host[:port][/prefix]` URL (or `host[:port]`, as
/// `CONSUL_HTTP_ADDR` reads it): the address to connect to, the `Host`
/// header and the path prefix (no trailing `/`).
pub fn parse_http_url(s: &str) -> Result<(SocketAddr, String, String), String> {
    let a = parse_consul_addr(s).map_err(|e| e.reason)?;
    match a.endpoint {
        ConsulEndpoint::Tcp(addr) if !a.https => Ok((addr, a.host_header, a.path_prefix)),
        _ => Err("only http:// is supported".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((a, port))
    }

    #[test]
    fn stats_socket_forms_as_haproxy_writes_them() {
        let unix = |p: &str| Ok(StatsSocket::Unix(PathBuf::from(p)));
        let tcp = |a: &str| Ok(StatsSocket::Tcp(a.parse().unwrap()));
        for (s, want) in [
            ("/run/haproxy/admin.sock", unix("/run/haproxy/admin.sock")),
            ("admin.sock", unix("admin.sock")),
            ("unix@/run/a.sock", unix("/run/a.sock")),
            ("ipv4@127.0.0.1:9999", tcp("127.0.0.1:9999")),
            ("ipv6@[::1]:9999", tcp("[::1]:9999")),
            ("ipv6@::1:9999", tcp("[::1]:9999")),
            ("127.0.0.1:9999", tcp("127.0.0.1:9999")),
            ("[::1]:9", tcp("[::1]:9")),
        ] {
            assert_eq!(parse_stats_socket(s), want, "{s}");
        }
        for (bad, why) in [
            ("ipv4@127.0.0.1", "missing port"),
            ("ipv4@[::1]:9", "::1 is not an IPv4 address"),
            ("ipv6@127.0.0.1:9", "127.0.0.1 is not an IPv6 address"),
            ("ipv4@1.2.3.4:x", "bad port \"x\""),
            ("abns@haproxy", "abns@ sockets are not supported (use a unix path, ipv4@HOST:PORT or ipv6@[HOST]:PORT)"),
            ("", "empty"),
        ] {
            assert_eq!(parse_stats_socket(bad), Err(why.to_owned()), "{bad}");
        }
    }

    #[test]
    fn http_urls_for_an_http_peer() {
        let (addr, host, prefix) = parse_http_url("http://127.0.0.1:9090/prom/").unwrap();
        assert_eq!(
            (addr, host.as_str(), prefix.as_str()),
            ("127.0.0.1:9090".parse().unwrap(), "127.0.0.1:9090", "/prom")
        );
        assert_eq!(parse_http_url("127.0.0.1:9090").unwrap().2, "");
        assert_eq!(
            parse_http_url("https://127.0.0.1:9090").unwrap_err(),
            "only http:// is supported"
        );
        assert_eq!(
            parse_http_url("unix:///x").unwrap_err(),
            "only http:// is supported"
        );
        assert!(parse_http_url("ftp://x").is_err());
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
    fn ports() {
        assert_eq!(parse_port("0"), Ok(0));
        assert_eq!(parse_port("65535"), Ok(65535));
        assert_eq!(
            parse_port("65536"),
            Err("port 65536 is out of range (0..65535)".into())
        );
        assert_eq!(
            parse_port("99999999999999999999999"),
            Err("port 99999999999999999999999 is out of range (0..65535)".into())
        );
        for bad in ["", "+1", "x", " 1"] {
            assert_eq!(parse_port(bad), Err(format!("bad port {bad:?}")), "{bad:?}");
        }
    }
}
