//! What both validators (the settings in [`super::validate`], the TLS
//! ones in [`super::tls`]) share: the one-line usage error, a raw value's
//! error naming its flag or variable, a Go boolean, a systemd credential.

use std::path::Path;

use super::flags::{LowArgs, Raw, Source};
use crate::gocompat::parse_go_bool;

/// A bad flag, value or environment variable: one line, exit code 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub(super) fn usage_error(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

impl Raw {
    pub(super) fn invalid(&self, reason: impl std::fmt::Display) -> UsageError {
        usage_error(format!(
            "invalid value {:?} for {}: {reason}",
            self.value, self.source
        ))
    }
}

/// A Go bool; called by the lexer too, for a bool flag where it stands.
pub(super) fn boolean(raw: &Raw) -> Result<bool, UsageError> {
    parse_go_bool(&raw.value).ok_or_else(|| raw.invalid("not a boolean (use true or false)"))
}

/// The file `name` in systemd's `$CREDENTIALS_DIRECTORY` (`LoadCredential=`),
/// when the variable is set and the file exists (IO: one `stat`), with the
/// variable as its source: a unit hands the agent a root-only secret with
/// `LoadCredential=` alone, on every systemd that has it (247), where the
/// `%d` specifier a path would need came only in 251.
pub(super) fn credential(low: &LowArgs, name: &str) -> Option<Raw> {
    let dir = low.credentials_directory.as_ref()?;
    let path = Path::new(&dir.value).join(name);
    path.is_file().then(|| Raw {
        value: path.to_string_lossy().into_owned(),
        source: Source::Env(format!("{} credential {name}", dir.source)),
    })
}
