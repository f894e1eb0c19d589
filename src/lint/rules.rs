//! The lint rules over the servers that run `agent-check`, pure.
//!
//! In: the model's servers and the agent's listen address. Out: findings,
//! each an error or a warning about one server, in server order. Always
//! holds: a server without `agent-check` gets no finding; a server whose
//! settings are all right gets none either.
//!
//! Errors: no `weight` anywhere in the server's inheritance; no
//! `agent-send`, or one that does not end in a newline (a single-quoted
//! `…\n` named as such); no agent port, or one that is not the listen
//! port; an agent address (`agent-addr`, else `addr`, else the server's own)
//! that is not the listen IP, when a specific IP is listened on. A hostname
//! cannot be checked without resolving it, and is passed over in silence.
//! Warnings: no `slowstart`, no `agent-inter`, an identity (the first line
//! of `agent-send`, trimmed as the agent trims it) that is not
//! `<backend>/<server>` of its own server, an identity already sent by an
//! earlier server.

use std::collections::HashMap;
use std::net::IpAddr;

use super::model::{atol, Server};
use crate::config::ListenAddr;

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
pub fn check(servers: &[Server], files: &[String], listen: &ListenAddr) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut first_sender: HashMap<Vec<u8>, usize> = HashMap::new();
    for (index, server) in servers.iter().enumerate() {
        if !server.settings.agent_check {
            continue;
        }
        let mut add = |severity, message| {
            findings.push(Finding {
                server: index,
                severity,
                message,
            })
        };
        let s = &server.settings;
        if !s.weight {
            add(Severity::Error, NO_WEIGHT.to_owned());
        }
        let identity = match agent_send(server) {
            Ok(identity) => Some(identity),
            Err(message) => {
                add(Severity::Error, message);
                None
            }
        };
        for message in reach(server, listen) {
            add(Severity::Error, message);
        }
        if !s.slowstart {
            add(Severity::Warning, NO_SLOWSTART.to_owned());
        }
        if !s.agent_inter {
            add(Severity::Warning, NO_AGENT_INTER.to_owned());
        }
        let Some(identity) = identity else { continue };
        let own = format!("{}/{}", server.backend, server.name);
        if identity != own.as_bytes() {
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

pub const NO_WEIGHT: &str = "no weight: haproxy's default weight is 1 and an agent's N% is a share of it (50% of 1 is 0); set one, e.g. weight 100";
pub const NO_SLOWSTART: &str = "no slowstart: leaving maint will not ramp the weight up";
pub const NO_AGENT_INTER: &str =
    "no agent-inter: agent checks run at the health-check inter (2s unless set)";

/// The identity the server sends (its first line, trimmed as the agent
/// trims it), or why the agent cannot answer it.
fn agent_send(server: &Server) -> Result<Vec<u8>, String> {
    let Some(word) = &server.settings.agent_send else {
        let own = format!("{}/{}", server.backend, server.name);
        return Err(format!("no agent-send: haproxy sends nothing and the agent never answers; add agent-send \"{own}\\n\""));
    };
    // haproxy keeps the string with strdup: it ends at the first NUL.
    let text = word.text.split(|&b| b == 0).next().unwrap_or_default();
    if !text.ends_with(b"\n") {
        if word.single_quoted_tail && text.ends_with(b"\\n") {
            let shown = String::from_utf8_lossy(text);
            return Err(format!("agent-send '{shown}' is single-quoted: haproxy sends a literal backslash and n, not a newline; use double quotes"));
        }
        let shown = text.escape_ascii();
        return Err(format!("agent-send \"{shown}\" does not end in a newline: the agent answers complete lines only; end it with \\n inside double quotes"));
    }
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
    let end = line
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |e| e + 1);
    Ok(line[start..end].to_vec())
}

/// Whether the agent checks reach the listen address.
fn reach(server: &Server, listen: &ListenAddr) -> Vec<String> {
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
    let Some(want_ip) = want_ip else {
        return problems;
    };
    let (written, whose) = match &s.agent_addr {
        Some(addr) => (addr, "agent-addr"),
        None => (&server.address, "the server's address (no agent-addr)"),
    };
    if let Some(ip) = host_ip(written).filter(|ip| *ip != want_ip) {
        problems.push(format!(
            "agent checks go to {whose} {ip}, not to the agent, which listens on {listen}"
        ));
    }
    problems
}

/// The IP of an address word (`1.2.3.4`, `1.2.3.4:80`, `[::1]:80`, `::1`,
/// `ipv4@…`), or `None` for a hostname, a UNIX socket, a variable.
fn host_ip(word: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(word).ok()?;
    let text = text.rsplit_once('@').map_or(text, |(_, rest)| rest);
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    if let Some(bracketed) = text.strip_prefix('[') {
        return bracketed.split_once(']')?.0.parse().ok();
    }
    text.rsplit_once(':')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
}
