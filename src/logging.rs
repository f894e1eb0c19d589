//! Logs on stderr (SPEC §7): JSON lines by default (`time` RFC 3339 UTC with
//! ms, `level`, `msg`, then the record's key-values), or human text through
//! simplelog with `GITLAB_LOG_FORMAT=text`. Structured fields come from the
//! `log` crate's key-values (`info!(key = k, old = o; "msg")`).
//!
//! Always holds: bytes from outside (KV keys, request lines) are passed
//! through [`escape`] before they reach a log field, so no line break or
//! control byte is ever written raw.

use crate::config::LogFormat;

/// Installs the global logger.
pub fn init(format: LogFormat, level: log::LevelFilter) {
    todo!("{format:?} {level}")
}

/// Escapes bytes for a log field: printable ASCII as is (`\` doubled),
/// `\n` `\r` `\t` as such, other bytes as `\xHH`; at most `max` input bytes
/// shown, then `...`.
pub fn escape(bytes: &[u8], max: usize) -> String {
    todo!("{bytes:?} {max}")
}
