//! The writer's words for the records: `-by`, `-reason`, `-for` or
//! `-until`, and the command line; what each write carries of the record
//! it replaces; the record it writes ([`crate::contract::record`]).
//!
//! - `Recorder::of`: the words checked (exit 2 otherwise; `-by` and
//!   `-reason` by [`check_text`]: a terminal shows what was written).
//! - `Recorder::expiry`, `Recorder::carry`: the expiry and reason a
//!   write puts or keeps.
//! - [`who`], [`command_line`]: who writes, and the command line as
//!   kept (a URL's `user:password@` masked, cut to [`MAX_COMMAND`] bytes).

use std::collections::HashMap;

use super::change::Carried;
use super::key::{Held, Target};
use super::kv::RECORD_PREFIX;
use crate::cli::Args;
use crate::contract::expiry::{of_flags, parse_until};
use crate::contract::record::{cut, Record, MAX_COMMAND, MAX_TEXT};
use crate::contract::Desired;
use crate::kv::KvPair;

/// The writer's words for its records: `-by`, `-reason`, `-for` or
/// `-until`, and the command line, checked (exit 2 otherwise).
pub(crate) struct Recorder {
    by: String,
    /// `-reason`: `None` keeps the reason recorded, `Some(None)` (`-reason
    /// ''`) clears it.
    reason: Option<Option<String>>,
    /// `-for` or `-until`.
    pub(crate) until: Until,
    command: String,
}

impl Recorder {
    pub(crate) fn of(
        w: &Args,
        env: &dyn Fn(&str) -> Option<String>,
        verb: &str,
    ) -> Result<Recorder, String> {
        for flag in ["by", "reason"] {
            if let Some(text) = w.value(flag) {
                check_text(flag, text)?;
            }
        }
        let until = match (w.value("for"), w.value("until")) {
            (Some(_), Some(_)) => return Err("give -for or -until, not both".into()),
            (None, None) => Until::Keep,
            (Some("none"), None) => Until::Clear,
            (Some(text), None) => match crate::gocompat::parse_go_duration(text) {
                Some(Some(d)) if d.as_secs() > 0 => Until::For(d),
                _ => {
                    return Err(format!(
                    "-for {text:?} is not a positive duration of a second or more (2h, 30m, 1h30m), nor none"
                ))
                }
            },
            (None, Some(text)) => Until::At(parse_until(text)?),
        };
        let mut words = vec!["gitlab-haproxy-agent".to_owned(), verb.to_owned()];
        words.extend(w.words.iter().map(|a| a.to_string_lossy().into_owned()));
        let login = login_name();
        Ok(Recorder {
            by: who(w.value("by"), env, login.as_deref(), &host_name()),
            reason: w
                .value("reason")
                .map(|r| (!r.is_empty()).then(|| r.to_owned())),
            until,
            command: command_line(&words),
        })
    }

    /// The expiry a write at `now` gives: `None` keeps the key's, `Some(0)`
    /// clears it; refused when it is not one the daemon would read as such
    /// (2020..2100).
    pub(crate) fn expiry(&self, now: u64) -> Result<Option<u32>, String> {
        match self.until {
            Until::Keep => Ok(None),
            Until::Clear => Ok(Some(0)),
            Until::At(at) => Ok(Some(at)),
            Until::For(d) => match of_flags(now.saturating_add(d.as_secs())) {
                0 => Err(format!(
                    "-for {}s from now ends past 2100-01-01, which consul Flags cannot say here",
                    d.as_secs()
                )),
                e => Ok(Some(e)),
            },
        }
    }

    /// What a write of `target` carries over from the key it replaces (its
    /// recorded reason, its expiry `was`), given the expiry asked for
    /// (`new`, from [`Recorder::expiry`]).
    pub(crate) fn carry(
        &self,
        target: Target,
        reason: Option<String>,
        was: u32,
        new: Option<u32>,
    ) -> Carried {
        let Target::Set(d) = target else {
            return Carried::default();
        };
        let kept_reason = self.reason.is_none() && reason.is_some();
        let reason = match &self.reason {
            None => reason,
            Some(given) => given.clone(),
        };
        // A key answering ready 100% has nothing to expire.
        let diverted = d.reply() != Desired::READY.reply();
        let (until, kept_until) = match new {
            _ if !diverted => (0, false),
            Some(e) => (e, false),
            None => (was, was != 0),
        };
        Carried {
            reason,
            until,
            kept_reason,
            kept_until,
        }
    }

    /// The record of writing `value` at `now` with what it carries.
    pub(crate) fn record(&self, value: &Desired, now: u64, carried: &Carried) -> String {
        Record {
            by: self.by.clone(),
            when: now,
            reason: carried.reason.clone(),
            until: (carried.until != 0).then_some(u64::from(carried.until)),
            value: value.to_string(),
            command: self.command.clone(),
        }
        .encode()
    }
}

/// What a write does to a key's expiry (its consul Flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Neither `-for` nor `-until`: the expiry the key holds stays.
    Keep,
    /// `-for none`.
    Clear,
    /// `-for DURATION`, from the write.
    For(std::time::Duration),
    /// `-until TIME` (Unix seconds, within the window of [`crate::contract::expiry::of_flags`]).
    At(u32),
}

impl Until {
    /// A new expiry is given (`-for DURATION` or `-until`).
    pub(crate) fn sets(self) -> bool {
        matches!(self, Until::For(_) | Until::At(_))
    }
}

/// The writers' flags for the records.
pub(crate) const RECORD_FLAGS: [&str; 5] = ["by", "reason", "for", "until", RECORD_PREFIX];

/// The reason recorded for a key held as `held` (none for an absent key:
/// its record, if any, is an orphan).
pub(crate) fn recorded_reason(
    records: &HashMap<String, KvPair>,
    identity: &str,
    held: &Held,
) -> Option<String> {
    if *held == Held::Absent {
        return None;
    }
    let pair = records.get(identity)?;
    crate::contract::record::decode(&pair.value).ok()?.reason
}

/// The login name of this process's uid, for the records' `by` when
/// neither `$SUDO_USER` nor `$USER` is set.
fn login_name() -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: an all-zero passwd is a valid value for getpwuid_r to fill.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; buf outlives pwd's use.
    let rc = unsafe {
        libc::getpwuid_r(
            libc::getuid(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded: pw_name is a C string inside buf.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned()).filter(|n| !n.is_empty())
}

/// This host's name, for the records' `by`.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match rc {
        0 => String::from_utf8_lossy(&buf[..end]).into_owned(),
        _ => String::new(),
    }
}

/// Refuses text an operator could not read as written in a terminal:
/// over [`MAX_TEXT`] bytes, C0 or C1 control characters (and DEL), the
/// bidi overrides and isolates U+202A–U+202E, U+2066–U+2069, and the
/// other characters a terminal does not show (format characters: soft
/// hyphen, Arabic letter mark, zero-width spaces and joiners, the
/// left-to-right and right-to-left marks, line and paragraph separators,
/// word joiners, the byte-order mark, interlinear annotations, tags), so
/// `ali\u{200B}ce` cannot pass for `alice`.
pub fn check_text(flag: &str, text: &str) -> Result<(), String> {
    if text.len() > MAX_TEXT {
        return Err(format!(
            "-{flag} is {} bytes, more than {MAX_TEXT}",
            text.len()
        ));
    }
    let bad = text.chars().find(|&c| crate::safe::hidden(c));
    match bad {
        Some(c) => Err(format!(
            "-{flag} holds U+{:04X}, a control, bidi or invisible character: a terminal would not show what was written",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

/// Who writes: `-by`, else `$SUDO_USER`, else `$USER`, else `login` (the
/// uid's login name); then `@host` unless it already names one.
pub fn who(
    by: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    login: Option<&str>,
    host: &str,
) -> String {
    let user = by
        .filter(|b| !b.is_empty())
        .map(str::to_owned)
        .or_else(|| env("SUDO_USER").filter(|u| !u.is_empty()))
        .or_else(|| env("USER").filter(|u| !u.is_empty()))
        .or_else(|| login.map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    match user.contains('@') || host.is_empty() {
        true => user,
        false => format!("{user}@{host}"),
    }
}

/// A word of the command line as kept: a URL's `user:password@` masked.
fn masked(word: &str) -> String {
    let Some(scheme) = word.find("://") else {
        return word.to_owned();
    };
    let rest = &word[scheme + 3..];
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.rfind('@') {
        Some(at) => format!("{}***{}", &word[..scheme + 3], &rest[at..]),
        None => word.to_owned(),
    }
}

/// The command line as kept: words quoted for a shell, URLs masked, cut to
/// [`MAX_COMMAND`] bytes.
pub fn command_line(words: &[String]) -> String {
    let line: Vec<String> = words
        .iter()
        .map(|w| super::undo::shell_word(&masked(w)))
        .collect();
    cut(&line.join(" "), MAX_COMMAND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_an_operator_reads_is_bounded_and_free_of_controls_and_bidi_overrides() {
        assert!(check_text("reason", "INC-123: db failover, 5xx spike — ask @bob").is_ok());
        assert!(check_text("reason", &"é".repeat(256)).is_ok(), "512 bytes");
        assert!(check_text("reason", &"x".repeat(513))
            .unwrap_err()
            .contains("513 bytes"));
        for bad in [
            "a\nb",
            "a\tb",
            "\x1b[31mred",
            "a\u{7f}",
            "a\u{85}",
            "a\u{9b}1m",
        ] {
            assert!(check_text("by", bad).is_err(), "{bad:?}");
        }
        for c in ['\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}'] {
            let e = check_text("reason", &format!("INC{c}321")).unwrap_err();
            assert!(e.contains(&format!("U+{:04X}", u32::from(c))), "{e}");
        }
        // Invisible in a terminal: `ali\u{200B}ce` would pass for `alice`.
        for c in [
            '\u{00AD}',
            '\u{061C}',
            '\u{200B}',
            '\u{200D}',
            '\u{200E}',
            '\u{200F}',
            '\u{2028}',
            '\u{2029}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{E0041}',
        ] {
            assert!(
                check_text("by", &format!("ali{c}ce")).is_err(),
                "U+{:04X}",
                u32::from(c)
            );
        }
        assert!(
            check_text("reason", "a\u{2070}b\u{202F}c\u{2030}").is_ok(),
            "neighbours are fine"
        );
    }

    #[test]
    fn who_is_by_else_sudo_user_else_user_at_the_host() {
        let env = |k: &str| match k {
            "SUDO_USER" => Some("alice".to_owned()),
            "USER" => Some("root".to_owned()),
            _ => None,
        };
        assert_eq!(who(None, &env, None, "lb1"), "alice@lb1");
        assert_eq!(
            who(Some(""), &env, None, "lb1"),
            "alice@lb1",
            "an empty -by is none"
        );
        assert_eq!(who(Some("bob"), &env, None, "lb1"), "bob@lb1");
        assert_eq!(who(Some("bob@ops"), &env, None, "lb1"), "bob@ops");
        let user = |k: &str| (k == "USER").then(|| "root".to_owned());
        assert_eq!(who(None, &user, Some("ops"), "lb1"), "root@lb1");
        // Neither variable (cron, systemd): the uid's login name.
        assert_eq!(who(None, &|_| None, Some("ops"), "lb1"), "ops@lb1");
        assert_eq!(who(None, &|_| None, None, "lb1"), "unknown@lb1");
    }

    #[test]
    fn the_command_line_is_cut_masked_and_the_record_bounded() {
        let words: Vec<String> = [
            "set",
            "-consul-addr",
            "https://u:s3cret@consul:8501/x",
            "be/a=drain",
        ]
        .map(String::from)
        .to_vec();
        let line = command_line(&words);
        assert_eq!(
            line,
            "set -consul-addr 'https://***@consul:8501/x' be/a=drain"
        );
        assert!(!line.contains("s3cret"));
        let long = command_line(&["x".repeat(5000)]);
        assert!(long.len() <= MAX_COMMAND + 3, "{}", long.len());
    }
}
