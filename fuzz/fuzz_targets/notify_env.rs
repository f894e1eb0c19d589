//! `notify::settings` (and through it `parse_socket` and `parse_watchdog`)
//! over any `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` systemd (or
//! whoever starts the agent) might set: never a panic, a socket only from
//! an absolute path or an `@` name that fits `sockaddr_un`, a watchdog only
//! above zero, and what is refused is a warning, never an error.
//!
//! Input: the three values, separated by NUL bytes (lossily UTF-8, as the
//! environment is read).
#![no_main]

use gitlab_haproxy_agent::notify::{settings, Target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let socket = parts.next();
    let usec = parts.next();
    let pid = parts.next();
    let mut warnings = Vec::new();
    let got = settings(socket, usec, pid, 4242, &mut warnings);
    let Some(s) = got else {
        assert!(socket.is_none() || warnings.len() == 1, "{warnings:?}");
        return;
    };
    let socket = socket.unwrap();
    match &s.target {
        Target::Path(p) => assert!(socket.starts_with('/') && p.as_os_str().len() <= 107),
        Target::Abstract(name) => {
            assert!(socket.starts_with('@') && !name.is_empty() && name.len() <= 107)
        }
    }
    if let Some(d) = s.watchdog {
        assert!(!d.is_zero());
        assert!(pid.is_none_or(|p| p.trim() == "4242"));
    }
    assert!(warnings.len() <= 1, "{warnings:?}");
});
