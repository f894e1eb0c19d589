//! An identity, pure: the key suffix below the state prefix that an
//! agent-send line names (SPEC §2).
//!
//! - [`parse_identity`]: a suffix that can ever be asked for, or `None`.
//! - [`is_control`]: the bytes no identity holds (the agent's request
//!   reader refuses them too).
//! - [`state_key`]: the KV key an identity's desired state is under.

/// Checks a key suffix (the part below `prefix/`) can ever be asked for by an
/// agent-send line: non-empty, not ending in `/`, no leading or trailing ASCII
/// whitespace, no control bytes (incl. CR, LF, DEL). Returns it as the identity.
pub fn parse_identity(suffix: &str) -> Option<&str> {
    let bytes = suffix.as_bytes();
    let (&first, &last) = (bytes.first()?, bytes.last()?);
    let usable = last != b'/'
        && !first.is_ascii_whitespace()
        && !last.is_ascii_whitespace()
        && !bytes.iter().copied().any(is_control);
    usable.then_some(suffix)
}

/// A byte that cannot be in an agent-send identity: C0 controls and DEL.
pub fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

/// The KV key of `identity`'s desired state: `prefix/identity`, or the
/// identity itself for an empty prefix (the whole store).
pub fn state_key(prefix: &str, identity: &str) -> String {
    match prefix.is_empty() {
        true => identity.to_owned(),
        false => format!("{prefix}/{identity}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities() {
        assert_eq!(parse_identity("be_web/srv1"), Some("be_web/srv1"));
        assert_eq!(parse_identity("srv1"), Some("srv1"));
        assert_eq!(parse_identity("a b/c d"), Some("a b/c d"));
        assert_eq!(parse_identity("/srv"), Some("/srv"));
        assert_eq!(parse_identity("é/ü"), Some("é/ü"));
    }

    #[test]
    fn identities_that_can_never_be_asked_for() {
        for bad in [
            "", "be_web/", "/", " srv1", "srv1 ", "\tsrv1", "srv1\t", "srv1\n", "srv\r1",
            "srv\x001", "srv\x7f1", "srv\x1b1",
        ] {
            assert_eq!(parse_identity(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_state_key_is_the_identity_under_the_prefix() {
        assert_eq!(state_key("p/state", "be/a"), "p/state/be/a");
        assert_eq!(state_key("", "be/a"), "be/a");
    }
}
