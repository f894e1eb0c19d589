//! The record a writer keeps with every write (SPEC §13): who, when, why,
//! until when, the value, the command line: a JSON value under the
//! metadata prefix, written in the same transaction as its state key.
//!
//! In: the writer's words (`-by`, `-reason`, `-for`), the environment, the
//! command line; or a record's bytes as KV holds them ([`decode`], the one
//! parser of them: any bytes, anyone may `consul kv put` there). Out: the
//! record's JSON ([`Record::encode`]) or the record read back. Always
//! holds: pure; `by` and `reason` are at most [`MAX_TEXT`] bytes of UTF-8
//! without control characters or bidi overrides, so a terminal shows what
//! was written; the command line is cut to [`MAX_COMMAND`] bytes and the
//! whole record to [`MAX_RECORD`]; no token and no environment variable is
//! ever in it (the token only comes from the environment or a file, and a
//! consul address's user and password are masked).

use serde::{Deserialize, Serialize};

use super::plan::cut;

/// The longest `-by` or `-reason`, in bytes.
pub const MAX_TEXT: usize = 512;
/// The longest command line kept, in bytes.
pub const MAX_COMMAND: usize = 1024;
/// The longest record, in bytes.
pub const MAX_RECORD: usize = 4096;
/// The longest record [`decode`] reads (a raw write may put anything there).
const MAX_READ: usize = 64 * 1024;

/// One record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// `user@host`.
    pub by: String,
    /// Unix seconds of the write, on the writer's clock.
    pub when: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Unix seconds, the expiry also written in the key's Flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    /// The value written, in its canonical spelling.
    pub value: String,
    pub command: String,
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

/// `-until TIME`: RFC 3339 (`2026-12-04T23:28:18Z`, or with an offset,
/// `+02:00`) to Unix seconds, within the window the daemon reads as an
/// expiry (2020-01-01 to 2100-01-01).
pub fn parse_until(text: &str) -> Result<u32, String> {
    let format = &time::format_description::well_known::Rfc3339;
    let at = time::OffsetDateTime::parse(text, format).map_err(|e| {
        format!("-until {text:?} is not an RFC 3339 time (2026-12-04T23:28:18Z, or with an offset: +02:00): {e}")
    })?;
    let secs = u64::try_from(at.unix_timestamp()).unwrap_or(0);
    match crate::state::expiry::of_flags(secs) {
        0 => Err(format!(
            "-until {text:?} is outside 2020-01-01..2100-01-01, which the agent reads as an expiry"
        )),
        e => Ok(e),
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
        .map(|w| super::plan::shell_word(&masked(w)))
        .collect();
    cut(&line.join(" "), MAX_COMMAND)
}

impl Record {
    /// The JSON written: at most [`MAX_RECORD`] bytes (the command line is
    /// cut further if escaping made it longer).
    pub fn encode(&self) -> String {
        let mut r = self.clone();
        loop {
            let text = serde_json::to_string(&r).unwrap_or_default();
            if text.len() <= MAX_RECORD || r.command.is_empty() {
                return text;
            }
            let keep = r.command.len().saturating_sub(text.len() - MAX_RECORD + 8);
            r.command = cut(&r.command, keep);
        }
    }
}

/// A record read back from KV: `Err` says why it is not one (too long, not
/// JSON, a field missing or of another type).
pub fn decode(bytes: &[u8]) -> Result<Record, String> {
    if bytes.len() > MAX_READ {
        return Err(format!("{} bytes, not a record", bytes.len()));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("not a record: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            by: "alice@lb1".into(),
            when: 1_800_000_000,
            reason: Some("INC-123".into()),
            until: Some(1_800_007_200),
            value: "drain".into(),
            command: "gitlab-haproxy-agent set be/a=drain -reason INC-123 -for 2h".into(),
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = record();
        let text = r.encode();
        assert_eq!(
            text,
            r#"{"by":"alice@lb1","when":1800000000,"reason":"INC-123","until":1800007200,"value":"drain","command":"gitlab-haproxy-agent set be/a=drain -reason INC-123 -for 2h"}"#
        );
        assert_eq!(decode(text.as_bytes()), Ok(r));
        let bare = Record {
            reason: None,
            until: None,
            ..record()
        };
        assert!(!bare.encode().contains("\"reason\""));
        assert_eq!(decode(bare.encode().as_bytes()), Ok(bare));
    }

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
    fn until_is_rfc3339_with_an_offset_inside_the_expiry_window() {
        assert_eq!(parse_until("2026-12-04T23:28:18Z"), Ok(1_796_426_898));
        assert_eq!(parse_until("2026-12-05T01:28:18+02:00"), Ok(1_796_426_898));
        assert_eq!(parse_until("2026-12-04T23:28:18.5Z"), Ok(1_796_426_898));
        for bad in [
            "2026-12-04",
            "2026-12-04 23:28:18",
            "2h",
            "",
            "2126-01-01T00:00:00Z",
        ] {
            assert!(parse_until(bad).is_err(), "{bad:?}");
        }
        assert!(parse_until("2019-12-31T23:59:59Z")
            .unwrap_err()
            .contains("outside 2020-01-01..2100-01-01"));
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
        // Quotes double when escaped: the record still fits.
        let r = Record {
            by: "\"".repeat(MAX_TEXT),
            reason: Some("\"".repeat(MAX_TEXT)),
            command: "\"".repeat(MAX_COMMAND),
            ..record()
        };
        let text = r.encode();
        assert!(text.len() <= MAX_RECORD, "{}", text.len());
        assert_eq!(decode(text.as_bytes()).unwrap().by, r.by);
    }

    #[test]
    fn anything_else_is_not_a_record() {
        for bad in [&b""[..], b"drain", b"{}", b"{\"by\":1}", b"\xff", b"[]"] {
            assert!(decode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(decode(&vec![b' '; MAX_READ + 1])
            .unwrap_err()
            .contains("bytes"));
    }
}
