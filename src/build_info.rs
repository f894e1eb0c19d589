//! What this binary is: the release version and the git commit it was built
//! from, for `-version`, the start-up log line, the `User-Agent` sent to
//! consul, the build-info metric and `/debug/state`.
//!
//! In: `GITLAB_HAPROXY_AGENT_VERSION` and `GIT_COMMIT`, read at compile time
//! (the latter set by `build.rs`). Always holds: the same answers for the
//! whole life of the process.

/// The release version: `GITLAB_HAPROXY_AGENT_VERSION` at build time (set by
/// `scripts/release.sh` from the tag), else Cargo.toml's.
pub fn version() -> &'static str {
    match option_env!("GITLAB_HAPROXY_AGENT_VERSION") {
        Some(v) if !v.is_empty() => v,
        _ => env!("CARGO_PKG_VERSION"),
    }
}

/// The git commit baked in by `build.rs` (`unknown` outside a checkout).
pub fn commit() -> &'static str {
    option_env!("GIT_COMMIT").unwrap_or("unknown")
}

/// The version line: `gitlab-haproxy-agent <version> (<git commit>)`.
pub fn version_line() -> String {
    format!("gitlab-haproxy-agent {} ({})", version(), commit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_line_shape() {
        let line = version_line();
        let rest = line
            .strip_prefix(&format!(
                "gitlab-haproxy-agent {} (",
                env!("CARGO_PKG_VERSION")
            ))
            .expect(&line);
        let commit = rest.strip_suffix(')').expect(&line);
        assert!(
            !commit.is_empty()
                && commit
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b)),
            "{line}"
        );
    }
}
