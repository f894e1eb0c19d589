//! `lint-haproxy`: reads haproxy configuration files the way haproxy does
//! and reports, for every server that runs `agent-check`, what keeps the
//! agent's answers from reaching it.
//!
//! In: the command's own arguments (after the word `lint-haproxy`), the
//! environment, the files. Out: findings on `out`, one per line,
//! `file:line: backend/server: error|warning: message`, sorted by file name
//! then line, then the summary line
//! `N servers with agent-check, E errors, W warnings`; the exit code: 0 no
//! error (warnings allowed), 1 at least one error, 2 usage (one line on
//! `err`). A line haproxy refuses is an error too:
//! `file:line: error: haproxy refuses this line: reason`.
//! Always holds: only reading the files touches the outside world; the rest
//! is [`lint`], pure: [`tokenize`] -> [`cond`] -> [`model`] -> [`rules`].

pub mod cond;
pub mod model;
pub mod rules;
pub mod tokenize;

use std::ffi::OsString;
use std::io::Write;

use crate::config::{parse_listen_addr, ListenAddr};
use rules::Severity;

const USAGE: &str = "\
usage: gitlab-haproxy-agent lint-haproxy FILE... [-listen-addr ADDR]

Reads haproxy configuration files as haproxy does and, for every server
with agent-check, reports what keeps the agent's replies from working.
Exit 0: no error (warnings allowed); 1: at least one error; 2: usage.

  -listen-addr addr
    \tthe agent's listen address (env GITLAB_HAPROXY_AGENT_LISTEN_ADDR) (default \":9777\")
";

const LISTEN_ENV: &str = "GITLAB_HAPROXY_AGENT_LISTEN_ADDR";

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
        text += &format!(
            "{} servers with agent-check, {} errors, {} warnings\n",
            self.agent_checked, self.errors, self.warnings
        );
        text
    }
}

/// The whole lint over files given as (name, bytes), pure.
pub fn lint(
    files: &[(String, Vec<u8>)],
    listen: &ListenAddr,
    env: &dyn Fn(&str) -> Option<String>,
) -> Report {
    let model = model::build(files, env);
    let names: Vec<String> = files.iter().map(|(name, _)| name.clone()).collect();
    let findings = rules::check(&model.servers, &names, listen);
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
        let rest = format!("error: haproxy refuses this line: {}", e.message);
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
        let rest = format!("{}/{}: {word}: {}", s.backend, s.name, f.message);
        report.lines.push((names[s.file].clone(), s.line, rest));
    }
    report
}

/// The command: 0 ok, 1 at least one error finding, 2 usage.
pub fn run(
    args: &[OsString],
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let outcome = parse_args(args, env).and_then(|parsed| match parsed {
        Parsed::Help => Ok(None),
        Parsed::Lint { files, listen } => Ok(Some((read_files(&files)?, listen))),
    });
    let written = match outcome {
        Ok(None) => out.write_all(USAGE.as_bytes()).map(|()| 0),
        Ok(Some((files, listen))) => {
            let report = lint(&files, &listen, env);
            let code = if report.errors > 0 { 1 } else { 0 };
            out.write_all(report.render().as_bytes()).map(|()| code)
        }
        Err(message) => writeln!(err, "gitlab-haproxy-agent lint-haproxy: {message}").map(|()| 2),
    };
    written.unwrap_or(2)
}

enum Parsed {
    Help,
    Lint {
        files: Vec<OsString>,
        listen: ListenAddr,
    },
}

/// Go-style flags (`-f v`, `-f=v`, `--f v`), anywhere among the files;
/// `--` ends the flags.
fn parse_args(args: &[OsString], env: &dyn Fn(&str) -> Option<String>) -> Result<Parsed, String> {
    let mut files = Vec::new();
    let mut listen = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy();
        let flag = text.strip_prefix("--").or_else(|| text.strip_prefix('-'));
        let Some(flag) = flag.filter(|f| !f.is_empty() && text != "-") else {
            if text == "--" {
                files.extend(rest.by_ref().cloned());
            } else {
                files.push(arg.clone());
            }
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag, None),
        };
        match name {
            "h" | "help" => return Ok(Parsed::Help),
            "listen-addr" => {
                let next = || rest.next().map(|v| v.to_string_lossy().into_owned());
                let value = inline.or_else(next);
                listen = Some(value.ok_or("flag needs an argument: -listen-addr")?);
            }
            _ => return Err(format!("flag provided but not defined: -{name}")),
        }
    }
    if files.is_empty() {
        return Err("no configuration file given (usage: gitlab-haproxy-agent lint-haproxy FILE... [-listen-addr ADDR])".into());
    }
    let listen = listen
        .or_else(|| env(LISTEN_ENV))
        .unwrap_or_else(|| ":9777".into());
    let listen = parse_listen_addr(&listen)
        .map_err(|e| format!("invalid value {listen:?} for -listen-addr: {e}"))?
        .ok_or("-listen-addr is empty: there is no agent address to check against")?;
    Ok(Parsed::Lint { files, listen })
}

fn read_files(paths: &[OsString]) -> Result<Vec<(String, Vec<u8>)>, String> {
    paths
        .iter()
        .map(|p| {
            let name = p.to_string_lossy().into_owned();
            match std::fs::read(p) {
                Ok(bytes) => Ok((name, bytes)),
                Err(e) => Err(format!("cannot read {name}: {e}")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the command: (code, out, err).
    fn command(args: &[&str], env: &[(&str, &str)]) -> (u8, String, String) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let lookup = |name: &str| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&args, &lookup, &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    fn config_file(name: &str, text: &str) -> String {
        let dir = std::env::temp_dir().join(format!("lint-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    }

    const CONFIG: &str = "backend be\n server s1 127.0.0.1:80 weight 100 slowstart 1s agent-check agent-port 9777 agent-inter 1s agent-send \"be/s1\\n\"\n";

    #[test]
    fn usage_errors_are_one_line_and_exit_2() {
        for (args, want) in [
            (&[][..], "no configuration file given"),
            (&["-nope", "f"][..], "flag provided but not defined: -nope"),
            (
                &["f", "-listen-addr"][..],
                "flag needs an argument: -listen-addr",
            ),
            (
                &["f", "-listen-addr", "x"][..],
                "invalid value \"x\" for -listen-addr",
            ),
            (
                &["/nonexistent/haproxy.cfg"][..],
                "cannot read /nonexistent/haproxy.cfg",
            ),
        ] {
            let (code, out, err) = command(args, &[]);
            assert_eq!((code, out.as_str()), (2, ""), "{args:?}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                err.starts_with("gitlab-haproxy-agent lint-haproxy: ") && err.contains(want),
                "{args:?}: {err}"
            );
        }
    }

    #[test]
    fn help_prints_usage_and_exits_0() {
        for flag in ["-h", "-help", "--help"] {
            let (code, out, err) = command(&[flag], &[]);
            assert_eq!((code, err.as_str()), (0, ""));
            assert!(
                out.starts_with("usage: gitlab-haproxy-agent lint-haproxy FILE..."),
                "{out}"
            );
        }
    }

    #[test]
    fn listen_addr_from_each_flag_form_then_the_environment_then_9777() {
        let file = config_file("listen.cfg", CONFIG);
        let ok = "1 servers with agent-check, 0 errors, 0 warnings\n";
        assert_eq!(command(&[&file], &[]), (0, ok.into(), String::new()));
        for args in [
            vec!["-listen-addr", ":9000", &file],
            vec![&file, "-listen-addr=:9000"],
            vec!["--listen-addr", ":9000", &file],
            vec!["--", &file],
        ] {
            let (code, out, _) = command(&args, &[(LISTEN_ENV, ":9000")]);
            assert_eq!(code, 1, "{args:?}");
            assert!(
                out.contains("agent-port 9777 does not reach the agent, which listens on :9000"),
                "{out}"
            );
        }
        let (code, ..) = command(&[&file, "-listen-addr", ":9777"], &[(LISTEN_ENV, ":9000")]);
        assert_eq!(code, 0, "the flag wins over the environment");
    }

    #[test]
    fn findings_are_sorted_by_file_then_line_then_summarised() {
        let b = config_file("b.cfg", "backend b2\n server s1 127.0.0.1:80 agent-check agent-port 9777 weight 1 slowstart 1s agent-inter 1s\n");
        let a = config_file("a.cfg", &format!("{CONFIG} server s2 127.0.0.1:80 weight 1 slowstart 1s agent-check agent-port 9777 agent-inter 1s agent-send 'be/s2\\n'\n"));
        let (code, out, _) = command(&[&b, &a], &[]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(code, 1);
        assert_eq!(lines.len(), 3, "{out}");
        assert!(
            lines[0].starts_with(&format!(
                "{a}:3: be/s2: error: agent-send 'be/s2\\n' is single-quoted"
            )),
            "{out}"
        );
        assert!(
            lines[1].starts_with(&format!("{b}:2: b2/s1: error: no agent-send")),
            "{out}"
        );
        assert_eq!(lines[2], "3 servers with agent-check, 2 errors, 0 warnings");
    }

    #[test]
    fn refused_lines_count_as_errors() {
        let file = config_file("refused.cfg", "backend be\n server s1 'x\n");
        let (code, out, _) = command(&[&file], &[]);
        assert_eq!(code, 1);
        assert_eq!(out, format!("{file}:2: error: haproxy refuses this line: unmatched quote\n0 servers with agent-check, 1 errors, 0 warnings\n"));
    }
}
