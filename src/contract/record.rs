//! A writer's record in KV (SPEC §13), pure: who, when, why, until when,
//! the value, the command line; a JSON value under the records' prefix,
//! written in the same transaction as its state key.
//!
//! - [`Record::encode`] writes one, [`decode`] is the one parser of one
//!   read back (any bytes: anyone may `consul kv put` there).
//! - `by` and `reason` are at most [`MAX_TEXT`] bytes (the writers check
//!   them); the command line is cut to [`MAX_COMMAND`] bytes, the whole
//!   record to [`MAX_RECORD`].
//! - No token and no environment variable is ever in it (the writers mask
//!   a consul address's user and password in the command line).

use serde::{Deserialize, Serialize};

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

/// `text` cut to at most `max` bytes (on a character boundary), with `…`
/// when cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
    fn anything_else_is_not_a_record() {
        for bad in [&b""[..], b"drain", b"{}", b"{\"by\":1}", b"\xff", b"[]"] {
            assert!(decode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(decode(&vec![b' '; MAX_READ + 1])
            .unwrap_err()
            .contains("bytes"));
    }
    #[test]
    fn a_record_is_bounded_however_its_text_escapes() {
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
        assert_eq!(cut("héllo", 2), "h…", "on a character boundary");
    }
}
