//! The one rendering of outside text for a terminal (SPEC §16): KV keys,
//! values and records, identities sent to the agent port, consul,
//! Prometheus and haproxy answers, configuration names.
//!
//! In: text (or bytes) from outside. Out: the same text with every
//! character a terminal would act on or not show replaced by a visible
//! escape: C0 controls, DEL, C1 controls (U+0080–U+009F), the bidi
//! overrides and isolates (U+202A–U+202E, U+2066–U+2069), the zero-width
//! and other format characters ([`invisible`]), U+2028/U+2029. Always
//! holds: the escape is JSON's (`\u001b`, `\u202e`; a pair of surrogate
//! escapes beyond the BMP), so the same rendering keeps `-json` output
//! valid JSON; bytes that are not UTF-8 become `\xNN`; text without such a
//! character is returned as it is, without copying.

use std::borrow::Cow;
use std::fmt::Write as _;

/// A character a terminal does not show, or shows elsewhere: the bidi
/// overrides and isolates, the zero-width spaces and joiners, the
/// left-to-right and right-to-left marks, the line and paragraph
/// separators, word joiners, the byte-order mark, soft hyphen, interlinear
/// annotations, tags.
pub fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

/// Whether `c` is shown escaped: a control character (C0, DEL, C1) or an
/// [`invisible`] one.
pub fn hidden(c: char) -> bool {
    c.is_control() || invisible(c)
}

/// Outside text as one piece of a line: every hidden character escaped,
/// newlines and tabs included (a key stays on its line).
pub fn text(s: &str) -> Cow<'_, str> {
    render(s, false)
}

/// A whole rendered output: as [`text`], but the output's own newlines
/// and tabs are kept.
pub fn output(s: &str) -> Cow<'_, str> {
    render(s, true)
}

/// Outside bytes (an identity read from the agent port): as [`text`],
/// with bytes that are not UTF-8 as `\xNN`.
pub fn bytes(b: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(b) {
        Ok(s) => text(s),
        Err(_) => {
            let mut out = String::with_capacity(b.len() + 8);
            for chunk in b.utf8_chunks() {
                out.push_str(&text(chunk.valid()));
                for byte in chunk.invalid() {
                    let _ = write!(out, "\\x{byte:02x}");
                }
            }
            Cow::Owned(out)
        }
    }
}

/// Escapes bytes for a log field: printable ASCII as is (`\` doubled),
/// `\n` `\r` `\t` as such, other bytes as `\xHH`; at most `max` input bytes
/// shown, then `...`.
pub fn escape(bytes: &[u8], max: usize) -> String {
    escape_with(bytes, max, "\\\\")
}

/// As [`escape`], but a backslash stays one backslash: for an agent-check
/// line with no newline in it, where a literal `\n` (a single-quoted
/// `agent-send`) should read as what haproxy sent, not doubled again on
/// top of the JSON escaping.
pub fn escape_keeping_backslashes(bytes: &[u8], max: usize) -> String {
    escape_with(bytes, max, "\\")
}

fn escape_with(bytes: &[u8], max: usize, backslash: &str) -> String {
    let shown = &bytes[..bytes.len().min(max)];
    let mut out = String::with_capacity(shown.len() + 3);
    for &b in shown {
        match b {
            b'\\' => out.push_str(backslash),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    if bytes.len() > max {
        out.push_str("...");
    }
    out
}

/// The most of an error body shown (log, `/debug/state`, `status`, the
/// writers' errors).
pub const ERROR_BODY_BYTES: usize = 200;

/// An error body from consul (or a proxy between) as it may be shown:
/// every `secret` (the ACL token, basic auth) replaced by `<redacted>`
/// wherever it appears (a server echoing request headers puts it there),
/// then trimmed, cut to [`ERROR_BODY_BYTES`] and escaped to printable
/// ASCII ([`escape`]).
pub fn error_body(body: &[u8], secrets: &[Vec<u8>]) -> String {
    let mut body = body.to_vec();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        let mut out = Vec::with_capacity(body.len());
        let mut rest = &body[..];
        while let Some(at) = rest.windows(secret.len()).position(|w| w == &secret[..]) {
            out.extend_from_slice(&rest[..at]);
            out.extend_from_slice(b"<redacted>");
            rest = &rest[at + secret.len()..];
        }
        out.extend_from_slice(rest);
        body = out;
    }
    escape(body.trim_ascii(), ERROR_BODY_BYTES)
}

fn render(s: &str, keep_layout: bool) -> Cow<'_, str> {
    let escaped = |c: char| hidden(c) && !(keep_layout && (c == '\n' || c == '\t'));
    let Some(first) = s.find(escaped) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if escaped(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_passes_printable_ascii() {
        assert_eq!(escape(b"be_web/srv1 x~", 100), "be_web/srv1 x~");
        assert_eq!(escape(b"", 10), "");
    }

    #[test]
    fn escape_control_bytes_newlines_and_backslash() {
        assert_eq!(escape(b"a\nb\rc\td", 100), "a\\nb\\rc\\td");
        assert_eq!(escape(b"\x00\x1b[0m\x7f", 100), "\\x00\\x1b[0m\\x7f");
        assert_eq!(escape(b"a\\nb", 100), "a\\\\nb");
        let out = escape(b"\n\r\t\x01", 100);
        assert!(!out.bytes().any(|b| b.is_ascii_control()), "{out}");
    }

    #[test]
    fn escape_non_utf8_and_utf8_bytes() {
        assert_eq!(escape(b"\xff\xfe", 100), "\\xff\\xfe");
        // Valid UTF-8 beyond ASCII is escaped byte by byte too.
        assert_eq!(escape("é".as_bytes(), 100), "\\xc3\\xa9");
    }

    #[test]
    fn escape_truncates_after_max_input_bytes() {
        assert_eq!(escape(b"abcdef", 3), "abc...");
        assert_eq!(escape(b"abc", 3), "abc");
        assert_eq!(escape(b"\n\n\n\n", 2), "\\n\\n...");
        assert_eq!(escape(b"abc", 0), "...");
    }

    #[test]
    fn plain_text_is_not_copied() {
        assert!(matches!(text("be_web/srv1 héllo ✓"), Cow::Borrowed(_)));
        assert!(matches!(output("a\tb\nc\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn every_class_the_spec_names_is_escaped() {
        let cases = [
            (
                "mallory\x1b[2J\x1b]52;c;eA==\x07",
                "mallory\\u001b[2J\\u001b]52;c;eA==\\u0007",
            ),
            ("a\rb", "a\\u000db"),
            ("del\x7f", "del\\u007f"),
            (
                "csi\u{9b}osc\u{9d}nel\u{85}",
                "csi\\u009bosc\\u009dnel\\u0085",
            ),
            ("be_web/\u{202E}1vrs\u{2066}", "be_web/\\u202e1vrs\\u2066"),
            (
                "a\u{200B}b\u{200D}c\u{2060}d\u{FEFF}",
                "a\\u200bb\\u200dc\\u2060d\\ufeff",
            ),
            ("l\u{2028}p\u{2029}", "l\\u2028p\\u2029"),
            ("tag\u{E0041}", "tag\\udb40\\udc41"),
        ];
        for (raw, want) in cases {
            assert_eq!(text(raw), want, "{raw:?}");
            assert_eq!(output(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn newlines_and_tabs_are_kept_only_as_the_outputs_own() {
        assert_eq!(text("a\nb\tc"), "a\\u000ab\\u0009c");
        assert_eq!(output("a\nb\tc"), "a\nb\tc");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_as_hex() {
        assert_eq!(bytes(b"srv\xff\x1b1"), "srv\\xff\\u001b1");
        assert_eq!(bytes(b"ok"), "ok");
        assert_eq!(bytes("\u{9b}".as_bytes()), "\\u009b");
    }

    /// Issue 39: a server (or proxy) echoing request headers put the ACL
    /// token into the log, `/debug/state`, `status` and the writers.
    #[test]
    fn error_bodies_lose_their_secrets_controls_and_length() {
        let token = b"0e3c5f1a-7e0e-4c44-9b2b-0c5a4e2d6f11".to_vec();
        let body = [
            &b"rpc error\r\nX-Consul-Token: "[..],
            &token,
            b"\x1b]52;c;eA==\x07 again:",
            &token,
        ]
        .concat();
        let shown = error_body(&body, std::slice::from_ref(&token));
        assert!(!shown.contains("0e3c5f1a"), "{shown}");
        assert_eq!(shown.matches("<redacted>").count(), 2, "{shown}");
        assert!(
            shown.chars().all(|c| c.is_ascii_graphic() || c == ' '),
            "{shown}"
        );
        let long = error_body(&[b'a'; 5000], &[]);
        assert!(long.len() <= ERROR_BODY_BYTES + 3, "{}", long.len());
        assert_eq!(error_body(b"  ok  ", &[Vec::new()]), "ok");
    }

    #[test]
    fn the_escapes_keep_json_valid() {
        let doc = serde_json::json!({ "k\u{9b}": "v\u{202e}\x1b\u{E0041}" }).to_string();
        let shown = output(&doc);
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["k\u{9b}"], "v\u{202e}\x1b\u{E0041}");
        assert!(!shown.chars().any(hidden), "{shown}");
    }
}
