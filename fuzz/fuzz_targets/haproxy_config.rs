//! `lint::lint` (tokenizer, conditional blocks, model, rules) on arbitrary
//! bytes as a configuration file.
//!
//! Input: byte 0 picks the listen address (bit 0: any address or
//! 127.0.0.1, port 9777) and `-max-line-bytes` (bit 1: 256 or 16), the
//! rest is the file; the host's addresses are 10.0.0.1 and
//! ::1. Checks: nothing panics, loops or overflows the stack (deep `.if`);
//! the summary counts match the finding lines; a server count never exceeds
//! what the file's lines could declare nor the total cap.
#![no_main]

use gitlab_haproxy_agent::config::ListenAddr;
use gitlab_haproxy_agent::lint::{
    lint,
    model::{MAX_SERVERS, MAX_TEMPLATE},
    Agent,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, text)) = data.split_first() else {
        return;
    };
    let listen = if first & 1 == 0 {
        ListenAddr::AnyDualStack(9777)
    } else {
        ListenAddr::Addr("127.0.0.1:9777".parse().unwrap())
    };
    let env = |name: &str| (name == "SET").then(|| "a b".to_owned());
    let files = [("f.cfg".to_owned(), text.to_vec())];
    let local = ["10.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    let agent = Agent {
        listen: &listen,
        // Short or the default: long identities and short lines both met.
        max_line: if first & 2 == 0 { 256 } else { 16 },
        // The line-specific rules: unknown (a warning), 3.4 (an error), 2.6.
        reply_up: first & 4 != 0,
        haproxy: match first >> 3 & 3 {
            0 => None,
            1 => Some((3, 4)),
            _ => Some((2, 6)),
        },
    };
    let report = lint(&files, &agent, &local, &env);
    let lines = text.split(|&b| b == b'\n').count() as u64;
    assert!(report.agent_checked as u64 <= lines * MAX_TEMPLATE);
    assert!(report.agent_checked <= MAX_SERVERS);
    let errors = report
        .lines
        .iter()
        .filter(|l| l.2.contains(": error: ") || l.2.starts_with("error: "))
        .count();
    assert_eq!(errors, report.errors);
    assert_eq!(report.lines.len(), report.errors + report.warnings);
    // The summary line counts in the singular for one ("1 warning").
    let last = if report.warnings == 1 { " warning\n" } else { " warnings\n" };
    let rendered = report.render();
    assert!(rendered.ends_with(last), "{rendered:?}");
});
