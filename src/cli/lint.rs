//! `lint-haproxy FILE…`: the files read, [`crate::lint`]'s report printed.

use super::{begin, listen_setting, usage_error, Io, FINDING, OK};

const HELP: &str = "\
usage: gitlab-haproxy-agent lint-haproxy FILE... [-listen-addr ADDR]

Reads haproxy configuration files as haproxy does (sections, defaults and
default-server inheritance, server-template, quoting, .if blocks) and, for
every server with agent-check, reports what keeps the agent's replies from
working: errors (no explicit weight; agent-send missing or without a real
newline; agent-port or agent-addr not reaching ADDR) and warnings (no
slowstart, no agent-inter, an identity that is not <backend>/<server>, two
servers sending the same identity). ADDR is the agent's -listen-addr:
default GITLAB_HAPROXY_AGENT_LISTEN_ADDR, else :9777. Exit 0: no error
(warnings allowed); 1: at least one error; 2: usage.
";

pub(super) fn run(args: &[std::ffi::OsString], io: &mut Io<'_>) -> u8 {
    let a = match begin(io, "lint-haproxy", HELP, args, (&["listen-addr"], &[])) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if a.positional.is_empty() {
        return usage_error(io, "lint-haproxy", "no configuration file given");
    }
    let listen = match listen_setting(&a, io, "listen-addr", ":9777") {
        Ok(listen) => listen,
        Err(e) => return usage_error(io, "lint-haproxy", &e),
    };
    let mut files = Vec::new();
    for name in &a.positional {
        match std::fs::read(name) {
            Ok(bytes) => files.push((name.clone(), bytes)),
            Err(e) => return usage_error(io, "lint-haproxy", &format!("cannot read {name}: {e}")),
        }
    }
    let report = crate::lint::lint(&files, &listen, io.env);
    let code = if report.errors > 0 { FINDING } else { OK };
    let _ = io.out.write_all(report.render().as_bytes());
    code
}
