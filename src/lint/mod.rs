//! `lint-haproxy`'s rules: reads haproxy configuration files the way
//! haproxy does and reports, for every server that runs `agent-check`, what
//! keeps the agent's answers from reaching it.
//!
//! In: the files as (name, bytes), the agent's listen address and
//! `-max-line-bytes` ([`Agent`]), the addresses of the host the lint runs
//! on (for a wildcard listen address), the environment (for haproxy's
//! `${VAR}` and `.if defined(VAR)`; the variables haproxy sets itself
//! before reading its configuration are added, see [`haproxy_variable`]).
//! Out: a [`Report`]: findings `file:line: backend/server: error|warning:
//! message`, sorted by file name then line, then the summary line `N
//! servers with agent-check, E errors, W warnings`. A line haproxy refuses
//! is an error too: `file:line: error: haproxy refuses this line: reason`,
//! and the line where the lint stopped making servers
//! ([`model::MAX_SERVERS`]) is `file:line: error: the lint stops here:
//! reason`.
//!
//! Always holds:
//! - pure, [`tokenize`] -> [`cond`] -> [`model`] -> [`rules`];
//! - the command around it (flags, reading the files, the exit code) is
//!   [`crate::cli`]'s.

pub mod cond;
pub mod model;
pub mod rules;
pub mod tokenize;

use std::net::IpAddr;

pub use rules::Agent;
use rules::Severity;

/// haproxy's own variables, set before it reads the configuration (2.6
/// and 3.0 `init_early`, 3.0 around `readcfgfile` in `src/haproxy.c`):
/// `HAPROXY_LOCALPEER` (the host name, overwritten: the caller's `env`
/// gives it), `HAPROXY_STARTUP_VERSION` (kept when set); 3.0 adds
/// `HAPROXY_BRANCH` and `HAPROXY_{HTTP,HTTPS,TCP}_LOG_FMT`. They count as
/// defined; their values are unknown here and read as empty.
/// `HAPROXY_CFGFILES` and `HAPROXY_MWORKER` are set only after the
/// configuration is read, so `.if` does not see them.
pub fn haproxy_variable(name: &str) -> Option<String> {
    const SET: &[&str] = &[
        "HAPROXY_LOCALPEER",
        "HAPROXY_STARTUP_VERSION",
        "HAPROXY_BRANCH",
        "HAPROXY_HTTP_LOG_FMT",
        "HAPROXY_HTTPS_LOG_FMT",
        "HAPROXY_TCP_LOG_FMT",
    ];
    SET.contains(&name).then(String::new)
}

/// One output line, before sorting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub lines: Vec<(String, usize, String)>,
    pub agent_checked: usize,
    pub errors: usize,
    pub warnings: usize,
}

impl Report {
    /// The findings sorted by file name then line, then the summary line.
    pub fn render(mut self) -> String {
        self.lines.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let mut text = String::new();
        for (file, line, rest) in &self.lines {
            text += &format!("{file}:{line}: {rest}\n");
        }
        if self.agent_checked == 0 {
            text += "no server with agent-check here: the agent is asked by none of these servers (add agent-check, agent-port and agent-send to those it drives)\n";
        }
        let counted = crate::columns::counted;
        text += &format!(
            "{}, {}, {}\n",
            counted(
                self.agent_checked,
                "server with agent-check",
                "servers with agent-check"
            ),
            counted(self.errors, "error", "errors"),
            counted(self.warnings, "warning", "warnings")
        );
        text
    }
}

/// The whole lint over files given as (name, bytes), pure. `local` holds
/// this host's addresses (loopback always counts as local).
pub fn lint(
    files: &[(String, Vec<u8>)],
    agent: &Agent<'_>,
    local: &[IpAddr],
    env: &dyn Fn(&str) -> Option<String>,
) -> Report {
    let model = build(files, env);
    let names: Vec<String> = files.iter().map(|(name, _)| name.clone()).collect();
    let mut findings = rules::check(&model.servers, &names, agent, local);
    findings.extend(rules::server_state(&model));
    let mut report = Report {
        lines: Vec::new(),
        agent_checked: model
            .servers
            .iter()
            .filter(|s| s.settings.agent_check)
            .count(),
        errors: model.errors.len(),
        warnings: 0,
    };
    for e in &model.errors {
        let why = if e.refused {
            "haproxy refuses this line"
        } else {
            "the lint stops here"
        };
        let rest = format!("error: {why}: {}", e.message);
        report.lines.push((names[e.file].clone(), e.line, rest));
    }
    for f in findings {
        let s = &model.servers[f.server];
        let word = match f.severity {
            Severity::Error => {
                report.errors += 1;
                "error"
            }
            Severity::Warning => {
                report.warnings += 1;
                "warning"
            }
        };
        // A template's finding names the slots of its line.
        let name = match &s.template {
            Some(last) if *last != s.name => format!("{}..{last}", s.name),
            _ => s.name.clone(),
        };
        let rest = format!("{}/{name}: {word}: {}", s.backend, f.message);
        report.lines.push((names[s.file].clone(), s.line, rest));
    }
    report
}

/// The servers haproxy builds from `files`, with its own variables
/// defined ([`haproxy_variable`]).
fn build(files: &[(String, Vec<u8>)], env: &dyn Fn(&str) -> Option<String>) -> model::Model {
    let env = |name: &str| env(name).or_else(|| haproxy_variable(name));
    model::build(files, &env)
}

/// `global`'s `hard-stop-after` of `files`, if they give one.
pub fn hard_stop_after(
    files: &[(String, Vec<u8>)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<std::time::Duration> {
    build(files, env).hard_stop_after
}

/// The file haproxy loads server state from at start (`global`'s
/// `server-state-file`, joined to `server-state-base`), if `files` name
/// one; `Err` when its lines sit under a `.if` the lint cannot evaluate
/// (`feature(…)`, `version_atleast(…)`, …), so the name may not be
/// haproxy's.
pub fn server_state_path(
    files: &[(String, Vec<u8>)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<std::path::PathBuf>, &'static str> {
    let model = build(files, env);
    match model.server_state_guessed {
        true => Err("its server-state-file or server-state-base is under an .if the lint cannot evaluate (feature, version, enabled)"),
        false => Ok(model.server_state_path()),
    }
}

/// Every agent-checked server of `files` whose `agent-send` the agent
/// answers, with the identity it sends, in file order.
fn senders(
    files: &[(String, Vec<u8>)],
    env: &dyn Fn(&str) -> Option<String>,
) -> impl Iterator<Item = (Vec<u8>, model::Server)> {
    build(files, env)
        .servers
        .into_iter()
        .filter(|s| s.settings.agent_check)
        .filter_map(|s| Some((rules::agent_send(&s, usize::MAX).ok()?, s)))
}

/// Every agent-checked server of `files` whose `agent-send` the agent
/// answers: (the identity it sends, backend, server), in file order.
pub fn identities(
    files: &[(String, Vec<u8>)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<(Vec<u8>, String, String)> {
    senders(files, env)
        .map(|(identity, s)| (identity, s.backend, s.name))
        .collect()
}

/// The agent-checked servers of `files` in a backend whose algorithm is
/// static (it ignores agent weights other than 0% and 100%): (the identity
/// sent, `backend/server uses balance …`), in file order.
pub fn static_senders(
    files: &[(String, Vec<u8>)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<(Vec<u8>, String)> {
    senders(files, env)
        .filter(|(_, s)| s.balance.is_static())
        .map(|(identity, s)| {
            let what = format!("{}/{} uses {}", s.backend, s.name, s.balance.describe());
            (identity, what)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ListenAddr;

    /// The report of `files` for an agent on `:9777`.
    fn report(files: &[(&str, &str)]) -> String {
        let files: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(n, t)| (n.to_string(), t.as_bytes().to_vec()))
            .collect();
        let agent = Agent {
            listen: &ListenAddr::AnyDualStack(9777),
            max_line: 256,
            reply_up: false,
            haproxy: Some((2, 6)),
        };
        lint(&files, &agent, &[], &|_| None).render()
    }

    /// A backend's line that loads server state across reloads (else the
    /// lint warns about it).
    const STATE: &str = " load-server-state-from-file local\n";

    const CONFIG: &str = "backend be\n load-server-state-from-file local\n server s1 127.0.0.1:80 weight 100 slowstart 1s agent-check agent-port 9777 agent-inter 1s agent-send \"be/s1\\n\"\n";

    #[test]
    fn identities_are_what_each_agent_checked_server_sends() {
        let config = format!("{CONFIG} server s2 127.0.0.1:80 agent-check agent-send \"web-2\\n\"\n server s3 127.0.0.1:80 agent-send \"web-3\\n\"\n server s4 127.0.0.1:80 agent-check agent-send 'x\\n'\n");
        let files = vec![("a.cfg".to_owned(), config.into_bytes())];
        let got = identities(&files, &|_| None);
        let want = [("be/s1", "s1"), ("web-2", "s2")]
            .map(|(id, s)| (id.as_bytes().to_vec(), "be".to_owned(), s.to_owned()));
        assert_eq!(
            got, want,
            "not agent-checked (s3) and unanswerable (s4) are left out"
        );
    }

    #[test]
    fn a_clean_server_has_no_line_but_the_summary() {
        let ok = "1 server with agent-check, 0 errors, 0 warnings\n";
        assert_eq!(report(&[("a.cfg", CONFIG)]), ok);
    }

    #[test]
    fn findings_are_sorted_by_file_then_line_then_summarised() {
        let b = "backend b2\n load-server-state-from-file local\n server s1 127.0.0.1:80 agent-check agent-port 9777 weight 1 slowstart 1s agent-inter 1s\n";
        let a = format!("{CONFIG} server s2 127.0.0.1:80 weight 1 slowstart 1s agent-check agent-port 9777 agent-inter 1s agent-send 'be/s2\\n'\n");
        let out = report(&[("b.cfg", b), ("a.cfg", &a)]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(
            lines[0].starts_with("a.cfg:4: be/s2: error: agent-send 'be/s2\\n' is single-quoted"),
            "{out}"
        );
        assert!(
            lines[1].starts_with("b.cfg:3: b2/s1: error: no agent-send"),
            "{out}"
        );
        assert_eq!(lines[2], "3 servers with agent-check, 2 errors, 0 warnings");
    }

    const NONE: &str = "no server with agent-check here: the agent is asked by none of these servers (add agent-check, agent-port and agent-send to those it drives)";

    #[test]
    fn refused_lines_count_as_errors() {
        let out = report(&[("refused.cfg", "backend be\n server s1 'x\n")]);
        let want = format!("refused.cfg:2: error: haproxy refuses this line: unmatched quote\n{NONE}\n0 servers with agent-check, 1 error, 0 warnings\n");
        assert_eq!(out, want);
    }

    #[test]
    fn variables_haproxy_sets_itself_count_as_defined() {
        let config =
            ".if defined(HAPROXY_LOCALPEER) && defined(HAPROXY_STARTUP_VERSION)\n{CONFIG}.endif\n\
                      .if defined(HAPROXY_CFGFILES) || defined(HAPROXY_MWORKER)\n{CONFIG}.endif\n";
        let out = report(&[("v.cfg", &config.replace("{CONFIG}", CONFIG))]);
        assert_eq!(out, "1 server with agent-check, 0 errors, 0 warnings\n");
    }

    /// haproxy applies `global`'s setenv, presetenv, unsetenv and resetenv
    /// in order before expanding `${VAR}` on the lines after them; a
    /// variable set nowhere is named, not what it does to the line.
    #[test]
    fn global_environment_lines_apply_in_order_and_an_unset_variable_is_named() {
        let server = " server s1 127.0.0.1:80 weight 100 slowstart 1s agent-check agent-port \"${AGENT_PORT}\" agent-inter 1s agent-send \"be/s1\\n\"\n";
        let ok = "1 server with agent-check, 0 errors, 0 warnings\n";
        for global in [
            "global\n setenv AGENT_PORT 9777\n",
            "global\n presetenv AGENT_PORT 9777\n",
            "global\n setenv AGENT_PORT 1\n unsetenv AGENT_PORT\n presetenv AGENT_PORT 9777\n",
            "global\n setenv AGENT_PORT 9777\n resetenv AGENT_PORT\n",
        ] {
            let config = format!("{global}backend be\n{STATE}{server}");
            assert_eq!(report(&[("e.cfg", &config)]), ok, "{global}");
        }
        for global in [
            "",
            "global\n setenv AGENT_PORT 9777\n unsetenv AGENT_PORT\n",
            "global\n setenv AGENT_PORT 9777\n resetenv OTHER\n",
        ] {
            let config = format!("{global}backend be\n{STATE}{server}");
            let out = report(&[("e.cfg", &config)]);
            let line = global.lines().count() + 3;
            let want = format!("e.cfg:{line}: be/s1: error: ${{AGENT_PORT}} is not set here: haproxy would read \"\" (setenv it in global, or export it to haproxy)\n1 server with agent-check, 1 error, 0 warnings\n");
            assert_eq!(out, want, "{global}");
        }
        // On a default-server line (the README's shape), or its defaults'
        // one, the variable is named on each server that inherits it.
        let inherited = "backend be\n load-server-state-from-file local\n default-server weight 100 slowstart 1s agent-check agent-port \"${AGENT_PORT}\" agent-inter 1s\n server s1 127.0.0.1:80 agent-send \"be/s1\\n\"\n";
        let want = "e.cfg:4: be/s1: error: ${AGENT_PORT} is not set here: haproxy would read \"\" (setenv it in global, or export it to haproxy)\n1 server with agent-check, 1 error, 0 warnings\n";
        assert_eq!(report(&[("e.cfg", inherited)]), want);
        let from_defaults = inherited
            .replace(
                "backend be\n load-server-state-from-file local\n default-server",
                "defaults\n default-server",
            )
            .replace(
                " server s1",
                "backend be\n load-server-state-from-file local\n server s1",
            );
        assert_eq!(
            report(&[("e.cfg", &from_defaults)]),
            want.replace("e.cfg:4", "e.cfg:5")
        );
        // A later file sees an earlier file's global (conf.d).
        let global = ("00-global.cfg", "global\n setenv AGENT_PORT 9777\n");
        let backend = format!("backend be\n{STATE}{server}");
        assert_eq!(report(&[global, ("10-be.cfg", &backend)]), ok);
    }

    #[test]
    fn a_near_miss_of_an_agent_keyword_gets_did_you_mean() {
        let config = CONFIG.replace("agent-send", "agent-sned");
        let out = report(&[("t.cfg", &config)]);
        assert_eq!(out, "t.cfg:3: be/s1: error: unknown keyword 'agent-sned': did you mean 'agent-send'? (haproxy refuses the line)\n1 server with agent-check, 1 error, 0 warnings\n");
        let config = CONFIG.replace("agent-inter", "agent-intre");
        assert!(report(&[("t.cfg", &config)]).contains("did you mean 'agent-inter'?"));
    }

    #[test]
    fn a_server_template_gets_one_finding_a_line_naming_its_slots() {
        let config = "backend be\n load-server-state-from-file local\n server-template web 1-5 127.0.0.1:80 weight 100 agent-check agent-port 9777 agent-inter 1s agent-send \"be/web\\n\"\n";
        let out = report(&[("t.cfg", config)]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(
            lines[0].starts_with("t.cfg:3: be/web1..web5: warning: no slowstart"),
            "{out}"
        );
        assert!(lines[1].starts_with("t.cfg:3: be/web1..web5: warning: every slot of this server-template sends \"be/web\""), "{out}");
        assert_eq!(lines[2], "5 servers with agent-check, 0 errors, 2 warnings");
    }

    #[test]
    fn the_server_cap_is_its_own_kind_of_error() {
        let config = "backend be\n server-template x 10000 a:1\n".repeat(11);
        let out = report(&[("big.cfg", &config)]);
        let want = format!("big.cfg:22: error: the lint stops here: more than {0} servers in all: the lint checks the first {0} and makes none past them\n", model::MAX_SERVERS);
        assert!(out.starts_with(&want), "{out}");
    }

    #[test]
    fn a_server_out_of_section_and_a_trailing_backslash_are_refused() {
        let out = report(&[(
            "r.cfg",
            "server s0 a:1\nbackend be\n server s1 a:1 check \\\n",
        )]);
        let want = "r.cfg:1: error: haproxy refuses this line: unknown keyword 'server' out of section\n\
                    r.cfg:3: error: haproxy refuses this line: unknown keyword '\\' (haproxy has no line continuation: a trailing \\ is a word)\n\
                    no server with agent-check here: the agent is asked by none of these servers (add agent-check, agent-port and agent-send to those it drives)\n\
                    0 servers with agent-check, 2 errors, 0 warnings\n";
        assert_eq!(out, want);
    }
}
