//! `ask IDENTITY`: one agent check, as haproxy makes it (connect, send the
//! identity and a newline, read the reply line, the agent closes).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::{target, usage_error, Args, Io, FINDING, OK};

/// How long the agent has to accept and to answer (its own read timeout
/// is for the peer; an answer takes microseconds).
const TIMEOUT: Duration = Duration::from_secs(5);

pub(super) const HELP: &str = "\
usage: gitlab-haproxy-agent ask IDENTITY [-listen-addr ADDR]

Asks the running agent for IDENTITY exactly as haproxy's agent-check does
(IDENTITY and a newline) and prints the reply line. ADDR defaults to
GITLAB_HAPROXY_AGENT_LISTEN_ADDR, else :9777 (all interfaces: asked on
loopback). Exits 1 when the agent answers nothing, and says why that happens.
";

/// Why the agent may close without a reply, for the operator.
const NO_REPLY_WHY: &str = "\
The agent closes without a reply (and haproxy then leaves the server as it is) when:
  - it has no state yet: no complete consul read, and no state file answered (one is, once the first read failed or took over 1s) (see /-/readiness, or `gitlab-haproxy-agent status`);
  - the line is empty, longer than -max-line-bytes (default 256), or holds a control byte;
  - it is shutting down.";

pub(super) fn run(a: &Args, io: &mut Io<'_>) -> u8 {
    let [identity] = &a.positional[..] else {
        return usage_error(
            io,
            "ask",
            "give exactly one IDENTITY (as agent-send sends it, without the newline)",
        );
    };
    if identity.contains('\n') {
        return usage_error(
            io,
            "ask",
            "IDENTITY holds a newline: the agent would answer for what comes before it",
        );
    }
    let addr = match target(a, io, "listen-addr", ":9777") {
        Ok(addr) => addr,
        Err(e) => return usage_error(io, "ask", &e),
    };
    match ask(addr, identity) {
        Ok(Some(line)) => {
            let _ = writeln!(io.out, "{}", crate::safe::text(&line));
            OK
        }
        Ok(None) => {
            let _ = writeln!(io.err, "no reply from the agent at {addr} for {identity:?}: it closed without answering.\n{NO_REPLY_WHY}");
            FINDING
        }
        Err(e) => {
            let _ = writeln!(
                io.err,
                "no reply from the agent at {addr} for {identity:?}: {e}"
            );
            FINDING
        }
    }
}

/// `ready|drain|maint N%`, as the agent writes them.
fn is_agent_reply(line: &[u8]) -> bool {
    let Some((admin, weight)) = std::str::from_utf8(line)
        .ok()
        .and_then(|l| l.split_once(' '))
    else {
        return false;
    };
    // As the agent writes them: 0..=256, no leading zero.
    let digits = weight.strip_suffix('%').unwrap_or("");
    let number = digits.parse::<u16>().ok();
    let number = number.filter(|n| *n <= 256 && n.to_string() == digits);
    matches!(admin, "ready" | "drain" | "maint") && number.is_some()
}

/// The reply line (without its newline), or `None` when the agent closed
/// without one.
fn ask(addr: SocketAddr, identity: &str) -> Result<Option<String>, String> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| {
        format!("cannot connect: {e} (is the agent running, and is -listen-addr its address?)")
    })?;
    s.set_read_timeout(Some(TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(TIMEOUT)))
        .and_then(|()| s.write_all(format!("{identity}\n").as_bytes()))
        .map_err(|e| format!("cannot send: {e}"))?;
    let mut got = Vec::new();
    let read = s.take(4096).read_to_end(&mut got);
    let shown = |b: &[u8]| crate::safe::escape(b, 200);
    match (read, got.iter().position(|&b| b == b'\n')) {
        (_, Some(end)) if is_agent_reply(&got[..end]) => {
            Ok(Some(String::from_utf8_lossy(&got[..end]).into_owned()))
        }
        (_, Some(end)) => Err(format!(
            "not an agent's reply (is {addr} the agent's -listen-addr?): \"{}\"",
            shown(&got[..end])
        )),
        (Ok(_), None) if got.is_empty() => Ok(None),
        (Ok(_), None) => Err(format!("a reply without a newline: \"{}\"", shown(&got))),
        (Err(e), None) if got.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
            Ok(None)
        }
        (Err(e), None) => Err(format!("no reply line within {}s: {e}", TIMEOUT.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_reply_grammar_is_a_reply() {
        for ok in [
            "ready 100%",
            "drain 100%",
            "maint 100%",
            "ready 0%",
            "ready 256%",
        ] {
            assert!(is_agent_reply(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "ready 257%",
            "ready 00%",
            "ready +5%",
            "HTTP/1.1 400 Bad Request",
            "up",
            "ready",
            "ready 100",
            "ready 1000%",
            "down 100%",
            "",
        ] {
            assert!(!is_agent_reply(bad.as_bytes()), "{bad}");
        }
    }
}
