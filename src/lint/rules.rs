//! The lint rules over the servers that run `agent-check`, pure.
//!
//! In: the model's servers, the agent (its listen address and
//! `-max-line-bytes`) and this host's addresses. Out: findings,
//! each an error or a warning about one server, in server order. Always
//! holds: a server without `agent-check` gets no finding; a server whose
//! settings are all right gets none either.
//!
//! Errors: no `weight` anywhere in the server's inheritance; no
//! `agent-send`, or one that does not end in a newline (a single-quoted
//! `…\n` named as such), or whose first line the agent answers nothing
//! for (empty, a control byte, longer than `-max-line-bytes`: the rule of
//! [`crate::agent::request::parse`]); no agent port, or one that is not the
//! listen port; an agent address (`agent-addr`, else `addr`, else the
//! server's own) that is not the listen IP when a specific IP is listened
//! on, or not an address of this host (given, or loopback) when the listen
//! address is a wildcard (`:P`, `0.0.0.0:P`, `[::]:P`): the agent runs
//! beside haproxy. A hostname cannot be checked without resolving it, and
//! an unspecified address (`0.0.0.0`) is haproxy's "the client's
//! destination"; both are passed over in silence.
//! Warnings: no `slowstart`, no `agent-inter`, an identity (the first line
//! of `agent-send`, trimmed as the agent trims it) that is not
//! `<backend>/<server>` of its own server, an identity already sent by an
//! earlier server; and once per backend, no server state loaded across a
//! reload ([`server_state`]).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::model::{atol, LoadState, Model, Server};
use crate::agent::request::{self, Reject, Request};
use crate::config::ListenAddr;

/// The agent as it runs, which the servers' settings must reach.
#[derive(Debug, Clone, Copy)]
pub struct Agent<'a> {
    /// Its `-listen-addr`.
    pub listen: &'a ListenAddr,
    /// Its `-max-line-bytes`: a longer first line gets no reply.
    pub max_line: usize,
    /// Its `-reply-up`: haproxy 3.3/3.4's agent health trap is avoided.
    pub reply_up: bool,
    /// The haproxy line linted for (major, minor), if known.
    pub haproxy: Option<(u32, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

/// One finding about one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Index into the model's servers.
    pub server: usize,
    pub severity: Severity,
    pub message: String,
}

/// Every finding about every agent-checked server.
/// `files` names the model's file indexes.
/// `local` is this host's addresses, for a wildcard listen address.
pub fn check(
    servers: &[Server],
    files: &[String],
    agent: &Agent<'_>,
    local: &[IpAddr],
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut first_sender: HashMap<Vec<u8>, usize> = HashMap::new();
    for (index, server) in servers.iter().enumerate() {
        if !server.settings.agent_check {
            continue;
        }
        // A template's slots share their line: its first slot speaks for
        // them all ([`crate::lint::lint`] names the line's slots).
        let earlier = index.checked_sub(1).map(|i| &servers[i]);
        if server.template.is_some()
            && earlier.is_some_and(|e| (e.file, e.line) == (server.file, server.line))
        {
            continue;
        }
        let mut add = |severity, message| {
            findings.push(Finding {
                server: index,
                severity,
                message,
            })
        };
        // A variable set nowhere shifts or empties the words after it:
        // said instead of what that makes of them.
        if !server.unset.is_empty() {
            for name in &server.unset {
                add(Severity::Error, format!("${{{name}}} is not set here: haproxy would read \"\" (setenv it in global, or export it to haproxy)"));
            }
            continue;
        }
        let s = &server.settings;
        for (word, meant) in &s.near_misses {
            add(
                Severity::Error,
                format!(
                    "unknown keyword '{word}': did you mean '{meant}'? (haproxy refuses the line)"
                ),
            );
        }
        let meant = |k: &str| s.near_misses.iter().any(|(_, m)| *m == k);
        if !s.weight {
            add(Severity::Error, NO_WEIGHT.to_owned());
        }
        let identity = match agent_send(server, agent.max_line) {
            Ok(identity) => Some(identity),
            Err(_) if meant("agent-send") => None,
            Err(message) => {
                add(Severity::Error, message);
                None
            }
        };
        for message in reach(server, agent.listen, local) {
            if !(meant("agent-port") && message.starts_with("no agent-port")) {
                add(Severity::Error, message);
            }
        }
        if !s.slowstart {
            add(Severity::Warning, NO_SLOWSTART.to_owned());
        }
        if !s.agent_inter && !meant("agent-inter") {
            add(Severity::Warning, NO_AGENT_INTER.to_owned());
        }
        if let Some((severity, message)) = agent_health_trap(server, agent) {
            add(severity, message);
        }
        if server.balance.is_static() {
            add(Severity::Warning, static_algorithm(server));
        }
        let Some(identity) = identity else { continue };
        let own = format!("{}/{}", server.backend, server.name);
        if server.template.is_some() {
            let shown = identity.escape_ascii();
            add(Severity::Warning, format!("every slot of this server-template sends \"{shown}\": the agent gives them one reply, so no slot can be drained or weighted alone; write one server line per server to drive them one by one"));
        } else if identity != own.as_bytes() {
            let shown = identity.escape_ascii();
            add(Severity::Warning, format!("agent-send identity \"{shown}\" is not \"{own}\", this server's <backend>/<server>"));
        }
        match first_sender.get(&identity) {
            Some(&first) => {
                let f = &servers[first];
                let shown = identity.escape_ascii();
                add(
                    Severity::Warning,
                    format!(
                        "identity \"{shown}\" is also sent by {}/{} ({}:{}): both get the same reply",
                        f.backend, f.name, files[f.file], f.line
                    ),
                );
            }
            None => {
                first_sender.insert(identity, index);
            }
        }
    }
    findings
}

/// One warning per backend whose agent-checked servers start a reload or
/// restart as configured (ready, full weight) instead of as haproxy left
/// them: no `load-server-state-from-file global|local` in effect, or
/// `global` with no `server-state-file` in `global`. On the backend's
/// first agent-checked server.
pub fn server_state(model: &Model) -> Vec<Finding> {
    let mut seen = HashSet::new();
    let mut findings = Vec::new();
    for (index, server) in model.servers.iter().enumerate() {
        if !server.settings.agent_check || !seen.insert(server.backend.as_str()) {
            continue;
        }
        let why = match server.load_state {
            LoadState::Local => continue,
            LoadState::Global if model.server_state_file.is_some() => continue,
            LoadState::Global => "loads server state from the global server-state-file, which global does not set",
            LoadState::None => "loads no server state (no load-server-state-from-file global in its defaults or its section)",
        };
        findings.push(Finding {
            server: index,
            severity: Severity::Warning,
            message: format!("backend {} {why}: after a haproxy reload or restart its servers take traffic ready at full weight, drained and maint ones too, until each one's first agent check; set server-state-file in global, load-server-state-from-file global in defaults, and run gitlab-haproxy-agent save-server-state before each reload and stop", server.backend),
        });
    }
    findings
}

pub const NO_WEIGHT: &str = "no weight: haproxy's default weight is 1 and an agent's N% is a share of it (50% of 1 is 0); set one, e.g. weight 100";
pub const NO_SLOWSTART: &str = "no slowstart: leaving maint will not ramp the weight up";
pub const NO_AGENT_INTER: &str =
    "no agent-inter: agent checks run at the health-check inter (2s unless set)";

/// haproxy 3.3 and 3.4 (upstream 49a619aca; fixed by 7aec1e6d9 in 3.5)
/// start a server with no `default-server` line before it at agent health
/// 0: leaving maint or a failed health check leaves it `DOWN (agent)`
/// until an agent reply says `up`. An error on those lines, a warning when
/// the line is not known, nothing with `-reply-up`.
fn agent_health_trap(server: &Server, agent: &Agent<'_>) -> Option<(Severity, String)> {
    if server.settings.default_server || agent.reply_up {
        return None;
    }
    let (severity, on) = match agent.haproxy {
        Some((3, minor @ (3 | 4))) => (Severity::Error, format!("haproxy 3.{minor}")),
        Some(_) => return None,
        None => (
            Severity::Warning,
            "haproxy 3.3 and 3.4 (give -haproxy-version to lint for one line)".to_owned(),
        ),
    };
    Some((severity, format!("{on} starts a server with no default-server line before it at agent health 0: after maint or a failed health check it stays DOWN (agent) for good, as this agent never replies up (haproxy bug, fixed upstream by 7aec1e6d9); add a default-server line before it (in its backend or defaults), or run the agent with -reply-up")))
}

/// The finding for a server of a static-algorithm backend.
fn static_algorithm(server: &Server) -> String {
    format!(
        "backend {} uses {}, a static algorithm: haproxy accepts agent weights of 0% and 100% only (ready N% and ramps are ignored: \"agent warns : Backend is using a static LB algorithm\") and slowstart does not ramp; use roundrobin, leastconn or hash-type consistent to ramp",
        server.backend,
        server.balance.describe()
    )
}

/// The identity the server sends (its first line, trimmed as the agent
/// trims it), or why an agent reading lines of at most `max_line` bytes
/// cannot answer it.
pub fn agent_send(server: &Server, max_line: usize) -> Result<Vec<u8>, String> {
    let Some(word) = &server.settings.agent_send else {
        let own = format!("{}/{}", server.backend, server.name);
        return Err(format!("no agent-send: haproxy sends nothing and the agent never answers; add agent-send \"{own}\\n\""));
    };
    // haproxy keeps the string with strdup: it ends at the first NUL.
    let text = word.text.split(|&b| b == 0).next().unwrap_or_default();
    // The agent answers the first line: a newline anywhere completes it.
    if !text.contains(&b'\n') {
        if word.single_quoted_tail && text.ends_with(b"\\n") {
            let shown = String::from_utf8_lossy(text);
            return Err(format!("agent-send '{shown}' is single-quoted: haproxy sends a literal backslash and n, not a newline; use double quotes"));
        }
        let shown = text.escape_ascii();
        return Err(format!("agent-send \"{shown}\" does not end in a newline: the agent answers complete lines only; end it with \\n inside double quotes"));
    }
    let why = match request::parse(text, max_line) {
        Request::Identity(identity) => return Ok(identity.to_vec()),
        Request::Partial => unreachable!("the text holds a newline"),
        Request::Reject(Reject::Empty) => "its first line is empty once trimmed".to_owned(),
        Request::Reject(Reject::ControlByte) => {
            "its first line holds a control byte (below 0x20, or 0x7f)".to_owned()
        }
        Request::Reject(Reject::TooLong) => {
            let len = text.iter().position(|&b| b == b'\n').unwrap_or_default();
            format!("its first line is {len} bytes, over the agent's -max-line-bytes {max_line}")
        }
    };
    let shown = text.escape_ascii();
    Err(format!(
        "agent-send \"{shown}\": the agent answers nothing for this line ({why}), so this server never changes"
    ))
}

/// Whether the agent checks reach the listen address.
fn reach(server: &Server, listen: &ListenAddr, local: &[IpAddr]) -> Vec<String> {
    let mut problems = Vec::new();
    let s = &server.settings;
    let (want_port, want_ip) = match listen {
        ListenAddr::AnyDualStack(port) => (*port, None),
        ListenAddr::Addr(a) => (a.port(), Some(a.ip()).filter(|ip| !ip.is_unspecified())),
    };
    match s.agent_port.as_deref().map(atol) {
        None | Some(0) => problems.push(
            "no agent-port: haproxy refuses an agent-check without one (\"does not have agent port\")".to_owned(),
        ),
        Some(port) if port != i64::from(want_port) => problems.push(format!(
            "agent-port {port} does not reach the agent, which listens on {listen}"
        )),
        Some(_) => {}
    }
    let (ip, whose) = match &s.agent_addr {
        Some(addr) => (host_ip(addr, false), "agent-addr"),
        None if is_socket(&server.address) => {
            let shown = server.address.escape_ascii();
            problems.push(format!("agent checks go to the server's socket {shown} (no agent-addr), not to the agent, which listens on TCP {listen}"));
            return problems;
        }
        None => (
            host_ip(&server.address, true),
            "the server's address (no agent-addr)",
        ),
    };
    let Some(ip) = ip.filter(|ip| !ip.is_unspecified()) else {
        return problems;
    };
    let v4_only = matches!(listen, ListenAddr::Addr(a) if a.ip() == IpAddr::from([0, 0, 0, 0]));
    match want_ip {
        Some(want_ip) if ip != want_ip => problems.push(format!(
            "agent checks go to {whose} {ip}, not to the agent, which listens on {listen}"
        )),
        None if v4_only && ip.to_canonical().is_ipv6() => problems.push(format!(
            "agent checks go to {whose} {ip}, an IPv6 address, but the agent listens on {listen}, IPv4 only"
        )),
        None if !is_local(ip, local) => problems.push(format!(
            "agent checks go to {whose} {ip}, not to this host, where the agent listens on {listen}"
        )),
        _ => {}
    }
    problems
}

/// A server address that is a socket, not an IP: `/path`, `unix@`,
/// `abns@`, `sockpair@`.
fn is_socket(word: &[u8]) -> bool {
    word.starts_with(b"/")
        || [&b"unix@"[..], b"abns@", b"sockpair@", b"fd@"]
            .iter()
            .any(|p| word.starts_with(p))
}

/// Loopback, or one of this host's addresses (an IPv4-mapped IPv6
/// address as its IPv4 one).
fn is_local(ip: IpAddr, local: &[IpAddr]) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || local.iter().any(|l| l.to_canonical() == ip)
}

/// The IP of an address word (`1.2.3.4`, `[::1]`, `ipv6@…`), or `None` for
/// a hostname, a UNIX socket, a variable. With `port` (a server address),
/// an unbracketed word's last `:` starts the port, as haproxy's
/// `str2sa_range` reads it (`::1:80` is `::1` port 80); without (an
/// `agent-addr`), the word is the address.
fn host_ip(word: &[u8], port: bool) -> Option<IpAddr> {
    let text = std::str::from_utf8(word).ok()?;
    let text = text.rsplit_once('@').map_or(text, |(_, rest)| rest);
    if let Some(bracketed) = text.strip_prefix('[') {
        return bracketed.split_once(']')?.0.parse().ok();
    }
    if let Ok(ip @ IpAddr::V4(_)) = text.parse() {
        return Some(ip);
    }
    match (port, text.rsplit_once(':')) {
        (true, Some((host, _))) => host.parse().ok(),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lint::model;

    const GOOD: &str = r#"weight 100 slowstart 10s agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s"#;

    /// Findings for servers declared in `be` with these lines (`$GOOD`
    /// stands for a correct set of keywords), as "server: severity: message".
    fn lint(lines: &str, listen: &str) -> Vec<String> {
        lint_lines(lines, listen, 256)
    }

    /// [`lint`] for an agent run with `-max-line-bytes max_line`.
    fn lint_lines(lines: &str, listen: &str, max_line: usize) -> Vec<String> {
        let config = format!("backend be\n{}", lines.replace("$GOOD", GOOD));
        let files = [("h.cfg".to_owned(), config.into_bytes())];
        let m = model::build(&files, &|_| None);
        assert_eq!(m.errors, []);
        let listen = crate::config::parse_listen_addr(listen).unwrap().unwrap();
        let names = ["h.cfg".to_owned()];
        let local = ["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()];
        let agent = Agent {
            listen: &listen,
            max_line,
            reply_up: false,
            haproxy: Some((2, 6)),
        };
        check(&m.servers, &names, &agent, &local)
            .into_iter()
            .map(|f| {
                format!(
                    "{}: {:?}: {}",
                    m.servers[f.server].name, f.severity, f.message
                )
            })
            .collect()
    }

    fn clean(lines: &str) {
        assert_eq!(lint(lines, ":9777"), Vec::<String>::new(), "{lines}");
    }

    #[test]
    fn a_correct_server_and_servers_without_agent_check_get_nothing() {
        clean(r#" server s1 127.0.0.1:80 $GOOD agent-send "be/s1\n""#);
        clean(" server s2 127.0.0.1:80");
        clean(r#" server s3 127.0.0.1:80 $GOOD agent-send "be/s3\n" no-agent-check"#);
    }

    #[test]
    fn weight_missing_is_an_error_found_anywhere_in_the_inheritance() {
        let line = r#" server s1 127.0.0.1:80 $GOOD agent-send "be/s1\n""#.replace("$GOOD", GOOD);
        let line = line.replace("weight 100 ", "");
        assert_eq!(lint(&line, ":9777"), [format!("s1: Error: {NO_WEIGHT}")]);
        clean(&format!(" default-server weight 50\n{line}"));
    }

    #[test]
    fn agent_send_missing_is_an_error() {
        let got = lint(" server s1 127.0.0.1:80 $GOOD", ":9777");
        assert_eq!(
            got,
            [
                r#"s1: Error: no agent-send: haproxy sends nothing and the agent never answers; add agent-send "be/s1\n""#
            ]
        );
    }

    #[test]
    fn single_quoted_backslash_n_is_called_out_by_name() {
        let got = lint(
            r" server s1 127.0.0.1:80 $GOOD agent-send 'be/s1\n'",
            ":9777",
        );
        assert_eq!(
            got,
            [
                r"s1: Error: agent-send 'be/s1\n' is single-quoted: haproxy sends a literal backslash and n, not a newline; use double quotes"
            ]
        );
    }

    #[test]
    fn agent_send_without_a_newline_is_an_error() {
        let got = lint(
            r#" server s1 127.0.0.1:80 $GOOD agent-send "be/s1""#,
            ":9777",
        );
        assert_eq!(
            got,
            [
                r#"s1: Error: agent-send "be/s1" does not end in a newline: the agent answers complete lines only; end it with \n inside double quotes"#
            ]
        );
        let nul = lint(
            r#" server s1 127.0.0.1:80 $GOOD agent-send "be/s1\x00\n""#,
            ":9777",
        );
        assert_eq!(
            nul.len(),
            1,
            "haproxy keeps the string up to its NUL: {nul:?}"
        );
        clean(r#" server s1 127.0.0.1:80 $GOOD agent-send be/s1\n"#);
    }

    #[test]
    fn agent_port_must_be_the_listen_port() {
        let got = lint(
            r#" server s1 127.0.0.1:80 $GOOD agent-send "be/s1\n""#,
            ":9000",
        );
        assert_eq!(
            got,
            ["s1: Error: agent-port 9777 does not reach the agent, which listens on :9000"]
        );
        let none = r#" server s1 127.0.0.1:80 $GOOD agent-send "be/s1\n""#.replace("$GOOD", GOOD);
        let none = none.replace("agent-port 9777", "");
        assert_eq!(
            lint(&none, ":9777"),
            [
                r#"s1: Error: no agent-port: haproxy refuses an agent-check without one ("does not have agent port")"#
            ]
        );
        clean(&none.replace("agent-check", "agent-check port 9777"));
    }

    #[test]
    fn agent_addr_must_be_the_listen_ip_when_one_is_given() {
        let line = &r#" server s1 10.0.0.1:80 $GOOD agent-send "be/s1\n""#.replace("$GOOD", GOOD);
        assert_eq!(lint(line, "127.0.0.1:9777"), Vec::<String>::new());
        assert_eq!(
            lint(line, "0.0.0.0:9777"),
            Vec::<String>::new(),
            "any address: port only"
        );
        assert_eq!(lint(line, "10.0.0.2:9777"), ["s1: Error: agent checks go to agent-addr 127.0.0.1, not to the agent, which listens on 10.0.0.2:9777"]);
        let own = line.replace("agent-addr 127.0.0.1 ", "");
        assert_eq!(lint(&own, "127.0.0.1:9777"), ["s1: Error: agent checks go to the server's address (no agent-addr) 10.0.0.1, not to the agent, which listens on 127.0.0.1:9777"]);
        assert_eq!(lint(&own, "10.0.0.1:9777"), Vec::<String>::new());
        let host = own.replace("10.0.0.1:80", "web.example:80");
        assert_eq!(
            lint(&host, "127.0.0.1:9777"),
            Vec::<String>::new(),
            "a hostname is not checked"
        );
    }

    #[test]
    fn a_socket_server_without_agent_addr_checks_the_socket_not_the_agent() {
        let line = &r#" server s1 /run/x.sock $GOOD agent-send "be/s1\n""#.replace("$GOOD", GOOD);
        assert_eq!(
            lint(line, ":9777"),
            Vec::<String>::new(),
            "agent-addr given"
        );
        for socket in ["/run/x.sock", "unix@/run/x.sock", "abns@x"] {
            let own = line
                .replace("agent-addr 127.0.0.1 ", "")
                .replace("/run/x.sock", socket);
            assert_eq!(
                lint(&own, ":9777"),
                [format!("s1: Error: agent checks go to the server's socket {socket} (no agent-addr), not to the agent, which listens on TCP :9777")]
            );
        }
    }

    #[test]
    fn an_unbracketed_ipv6_server_address_ends_at_its_last_colon() {
        let line = r#" server s1 ipv6@::1:80 weight 100 slowstart 10s agent-check agent-port 9777 agent-inter 2s agent-send "be/s1\n""#;
        assert_eq!(lint(line, ":9777"), Vec::<String>::new());
    }

    #[test]
    fn a_newline_anywhere_completes_the_line_the_agent_answers() {
        let line = &r#" server s1 10.0.0.1:80 $GOOD agent-send "be/s1\nxx""#.replace("$GOOD", GOOD);
        assert_eq!(lint(line, ":9777"), Vec::<String>::new());
    }

    #[test]
    fn with_a_wildcard_listen_address_the_target_must_be_this_host() {
        let line = &r#" server s1 10.0.0.1:80 $GOOD agent-send "be/s1\n""#.replace("$GOOD", GOOD);
        let own = line.replace("agent-addr 127.0.0.1 ", "");
        for listen in [":9777", "0.0.0.0:9777", "[::]:9777"] {
            assert_eq!(
                lint(line, listen),
                Vec::<String>::new(),
                "loopback is local"
            );
            assert_eq!(
                lint(&own, listen),
                [format!("s1: Error: agent checks go to the server's address (no agent-addr) 10.0.0.1, not to this host, where the agent listens on {listen}")]
            );
            let far = line.replace("127.0.0.1", "10.9.9.9");
            assert_eq!(
                lint(&far, listen),
                [format!("s1: Error: agent checks go to agent-addr 10.9.9.9, not to this host, where the agent listens on {listen}")]
            );
            for here in [
                "192.0.2.7",
                "::ffff:192.0.2.7",
                "2001:db8::7",
                "::1",
                "127.0.0.2",
            ] {
                let line = line.replace("agent-addr 127.0.0.1", &format!("agent-addr {here}"));
                let v6 = here.parse::<IpAddr>().unwrap().to_canonical().is_ipv6();
                let want: Vec<String> = match (listen, v6) {
                    ("0.0.0.0:9777", true) => vec![format!("s1: Error: agent checks go to agent-addr {here}, an IPv6 address, but the agent listens on 0.0.0.0:9777, IPv4 only")],
                    _ => vec![],
                };
                assert_eq!(lint(&line, listen), want, "{here} {listen}");
            }
            let host = own.replace("10.0.0.1:80", "web.example:80");
            assert_eq!(
                lint(&host, listen),
                Vec::<String>::new(),
                "a hostname is not checked"
            );
        }
    }

    #[test]
    fn an_identity_the_agent_never_answers_is_an_error() {
        let long = "x".repeat(257);
        for (send, shown, why) in [
            (
                r"\nbe/s1\n",
                r"\nbe/s1\n",
                "its first line is empty once trimmed",
            ),
            (
                r" \t\r\n",
                r" \t\r\n",
                "its first line is empty once trimmed",
            ),
            (
                r"be/s1\t1\n",
                r"be/s1\t1\n",
                "its first line holds a control byte (below 0x20, or 0x7f)",
            ),
            (
                r"be/s1\x7f\n",
                r"be/s1\x7f\n",
                "its first line holds a control byte (below 0x20, or 0x7f)",
            ),
            (
                &format!(r"{long}\n"),
                &format!(r"{long}\n"),
                "its first line is 257 bytes, over the agent's -max-line-bytes 256",
            ),
        ] {
            let got = lint(
                &format!(r#" server s1 127.0.0.1:80 $GOOD agent-send "{send}""#),
                ":9777",
            );
            assert_eq!(
                got,
                [format!(
                    r#"s1: Error: agent-send "{shown}": the agent answers nothing for this line ({why}), so this server never changes"#
                )],
                "{send}"
            );
        }
        let fits = format!(r"{}\r\n", "x".repeat(255));
        let got = lint(
            &format!(r#" server s1 127.0.0.1:80 $GOOD agent-send "{fits}""#),
            ":9777",
        );
        assert_eq!(got.len(), 1, "answered, only the identity warning: {got:?}");
        assert!(got[0].contains("Warning: agent-send identity"), "{got:?}");
    }

    /// Regression (issue 27): the line was checked against 256 bytes
    /// whatever the agent's -max-line-bytes.
    #[test]
    fn the_line_is_checked_against_the_agents_max_line_bytes() {
        let line = |n: usize| {
            let send = format!(r"be/{}\n", "x".repeat(n - 3));
            format!(r#" server s1 127.0.0.1:80 $GOOD agent-send "{send}""#)
        };
        let warned =
            |got: Vec<String>| got.len() == 1 && got[0].contains("Warning: agent-send identity");
        assert!(warned(lint_lines(&line(300), ":9777", 300)), "fits 300");
        assert!(warned(lint_lines(&line(8), ":9777", 8)), "fits 8");
        let got = lint_lines(&line(301), ":9777", 300);
        assert!(
            got[0].contains("its first line is 301 bytes, over the agent's -max-line-bytes 300"),
            "{got:?}"
        );
        let got = lint_lines(&line(9), ":9777", 8);
        assert!(
            got[0].contains("9 bytes, over the agent's -max-line-bytes 8"),
            "{got:?}"
        );
    }

    #[test]
    fn missing_slowstart_and_agent_inter_are_warnings() {
        let line = r#" server s1 127.0.0.1:80 $GOOD agent-send "be/s1\n""#.replace("$GOOD", GOOD);
        let got = lint(
            &line
                .replace("slowstart 10s ", "")
                .replace(" agent-inter 2s", ""),
            ":9777",
        );
        assert_eq!(
            got,
            [
                format!("s1: Warning: {NO_SLOWSTART}"),
                format!("s1: Warning: {NO_AGENT_INTER}")
            ]
        );
    }

    #[test]
    fn an_identity_not_its_own_backend_server_is_a_warning() {
        let got = lint(
            r#" server s1 127.0.0.1:80 $GOOD agent-send "be/srv01\n""#,
            ":9777",
        );
        assert_eq!(
            got,
            [
                r#"s1: Warning: agent-send identity "be/srv01" is not "be/s1", this server's <backend>/<server>"#
            ]
        );
        clean(r#" server s1 127.0.0.1:80 $GOOD agent-send " be/s1 \r\n""#);
    }

    #[test]
    fn two_servers_sending_one_identity_is_a_warning_on_the_second() {
        let lines = " server s1 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"\n server s2 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"";
        let got = lint(lines, ":9777");
        assert_eq!(
            got,
            [
                r#"s2: Warning: agent-send identity "be/s1" is not "be/s2", this server's <backend>/<server>"#,
                r#"s2: Warning: identity "be/s1" is also sent by be/s1 (h.cfg:2): both get the same reply"#,
            ]
        );
    }

    #[test]
    fn host_ip_reads_haproxy_address_forms() {
        for (word, port, want) in [
            ("10.0.0.1", true, Some("10.0.0.1")),
            ("10.0.0.1:80", true, Some("10.0.0.1")),
            ("ipv4@10.0.0.1:80", true, Some("10.0.0.1")),
            ("[::1]:80", true, Some("::1")),
            ("ipv6@::1:80", true, Some("::1")),
            ("fd00::2:80", true, Some("fd00::2")),
            ("::1", false, Some("::1")),
            ("fd00::2", false, Some("fd00::2")),
            ("web:80", true, None),
            ("unix@/run/x.sock", true, None),
        ] {
            let want = want.map(|w| w.parse::<IpAddr>().unwrap());
            assert_eq!(host_ip(word.as_bytes(), port), want, "{word}");
        }
    }

    /// The findings of the two new rules for `config` on haproxy `line`
    /// (with `-reply-up` when `up`).
    fn line_findings(config: &str, line: Option<(u32, u32)>, up: bool) -> Vec<String> {
        let files = [(
            "h.cfg".to_owned(),
            config.replace("$GOOD", GOOD).into_bytes(),
        )];
        let m = model::build(&files, &|_| None);
        let listen = crate::config::parse_listen_addr(":9777").unwrap().unwrap();
        let agent = Agent {
            listen: &listen,
            max_line: 256,
            reply_up: up,
            haproxy: line,
        };
        check(&m.servers, &["h.cfg".to_owned()], &agent, &[])
            .into_iter()
            .filter(|f| !f.message.starts_with("agent-send identity"))
            .map(|f| {
                let s = &m.servers[f.server];
                let first = f.message.split(':').next().unwrap_or_default();
                format!("{}/{}: {:?}: {first}", s.backend, s.name, f.severity)
            })
            .collect()
    }

    #[test]
    fn the_agent_health_trap_is_named_on_3_3_and_3_4_unless_avoided() {
        let bare = "backend be\n server s1 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"\n";
        let error = ["be/s1: Error: haproxy 3.4 starts a server with no default-server line before it at agent health 0"];
        assert_eq!(line_findings(bare, Some((3, 4)), false), error);
        assert_eq!(line_findings(bare, Some((3, 3)), false).len(), 1);
        assert_eq!(line_findings(bare, None, false), ["be/s1: Warning: haproxy 3.3 and 3.4 (give -haproxy-version to lint for one line) starts a server with no default-server line before it at agent health 0"]);
        for line in [(2, 6), (2, 8), (3, 0), (3, 2), (3, 5)] {
            assert_eq!(
                line_findings(bare, Some(line), false),
                Vec::<String>::new(),
                "{line:?}"
            );
        }
        assert_eq!(
            line_findings(bare, Some((3, 4)), true),
            Vec::<String>::new(),
            "-reply-up"
        );
        // Any default-server line before the server, in the backend or in
        // the defaults it inherits, avoids it; one after it does not.
        let shapes = [
            ("backend be\n default-server check\n server s1 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"\n", true),
            ("defaults\n default-server inter 2s\nbackend be\n server s1 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"\n", true),
            ("defaults d\n default-server $GOOD\nbackend be from d\n server s1 127.0.0.1:80 agent-send \"be/s1\\n\"\n", true),
            ("defaults d\n default-server $GOOD\ndefaults\n mode tcp\nbackend be\n server s1 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"\n", false),
            ("backend be\n server s1 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"\n default-server check\n", false),
        ];
        for (config, avoided) in shapes {
            assert_eq!(
                line_findings(config, Some((3, 4)), false).is_empty(),
                avoided,
                "{config}"
            );
        }
    }

    #[test]
    fn a_static_algorithm_is_named_with_its_backend() {
        let server = " server s1 127.0.0.1:80 $GOOD agent-send \"be/s1\\n\"\n";
        let warning = "be/s1: Warning: backend be uses balance static-rr, a static algorithm";
        for (head, found) in [
            ("backend be\n balance static-rr\n", Some(warning)),
            ("defaults\n balance static-rr\nbackend be\n", Some(warning)),
            ("backend be\n balance source\n", Some("be/s1: Warning: backend be uses balance source (hash-type map-based), a static algorithm")),
            ("backend be\n balance hdr(host)\n", Some("be/s1: Warning: backend be uses balance hdr(host) (hash-type map-based), a static algorithm")),
            ("backend be\n balance uri\n hash-type consistent\n", None),
            ("defaults\n hash-type consistent\nbackend be\n balance source\n", None),
            ("backend be\n balance roundrobin\n", None),
            ("backend be\n balance leastconn\n", None),
            ("backend be\n balance first\n", None),
            ("backend be\n balance random\n", None),
            ("backend be\n", None),
        ] {
            let config = format!("{head}{server}");
            assert_eq!(line_findings(&config, Some((3, 0)), false), found.map(str::to_owned).into_iter().collect::<Vec<_>>(), "{head}");
        }
        // A balance line after the servers sets the whole backend's.
        let after = format!("backend be\n{server} balance static-rr\n");
        assert_eq!(line_findings(&after, Some((3, 0)), false), [warning]);
    }

    /// The server-state warnings of `config`, as "backend/server: message start".
    fn state_findings(config: &str) -> Vec<String> {
        let files = [("h.cfg".to_owned(), config.as_bytes().to_vec())];
        let m = model::build(&files, &|_| None);
        assert_eq!(m.errors, [], "{config}");
        server_state(&m)
            .into_iter()
            .map(|f| {
                let s = &m.servers[f.server];
                let head = f.message.split(':').next().unwrap_or_default();
                format!("{}/{}: {:?}: {head}", s.backend, s.name, f.severity)
            })
            .collect()
    }

    #[test]
    fn a_backend_that_loads_no_server_state_is_warned_once() {
        let servers = format!(" server s1 a:1 {GOOD}\n server s2 a:1 {GOOD}\n server s3 a:1\n");
        let none = "be/s1: Warning: backend be loads no server state (no load-server-state-from-file global in its defaults or its section)";
        let no_file = "be/s1: Warning: backend be loads server state from the global server-state-file, which global does not set";
        let global = "global\n server-state-file /var/lib/haproxy/server-state\n";
        let cases: [(String, Option<&str>); 8] = [
            (format!("backend be\n{servers}"), Some(none)),
            (format!("{global}backend be\n{servers}"), Some(none)),
            (format!("defaults\n load-server-state-from-file global\nbackend be\n{servers}"), Some(no_file)),
            (format!("{global}defaults\n load-server-state-from-file global\nbackend be\n{servers}"), None),
            // The section's own line wins, wherever it is written.
            (format!("{global}backend be\n{servers} load-server-state-from-file global\n"), None),
            (format!("{global}defaults\n load-server-state-from-file global\nbackend be\n load-server-state-from-file none\n{servers}"), Some(none)),
            (format!("defaults\n load-server-state-from-file local\nbackend be\n{servers}"), None),
            // A later anonymous defaults starts empty.
            (format!("{global}defaults\n load-server-state-from-file global\ndefaults\nbackend be\n{servers}"), Some(none)),
        ];
        for (config, want) in &cases {
            let want: Vec<String> = want.iter().map(|w| w.to_string()).collect();
            assert_eq!(state_findings(config), want, "{config}");
        }
        // A backend without agent-checked servers needs nothing.
        assert_eq!(
            state_findings("backend be\n server s1 a:1\n"),
            Vec::<String>::new()
        );
        let two = format!("backend b1\n{servers}backend b2\n server x a:1 {GOOD}\n");
        let got = state_findings(&two);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[1].starts_with("b2/x: Warning: backend b2 loads no"),
            "{got:?}"
        );
    }

    #[test]
    fn the_warning_names_both_lines_and_the_command() {
        let m = model::build(
            &[(
                "h.cfg".to_owned(),
                format!("backend be\n server s1 a:1 {GOOD}\n").into_bytes(),
            )],
            &|_| None,
        );
        let message = &server_state(&m)[0].message;
        for needed in [
            "server-state-file",
            "load-server-state-from-file global",
            "save-server-state",
            "drained and maint",
        ] {
            assert!(message.contains(needed), "{needed}: {message}");
        }
    }
}
