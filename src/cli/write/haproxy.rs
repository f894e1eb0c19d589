//! The haproxy configuration's word on weights: a backend with a static
//! algorithm ignores weights other than 0% and 100%, so a writer refuses
//! them for its servers (exit 2) before anything is written.
//!
//! - Read: `-haproxy-config` (repeatable), else [`HAPROXY_CONFIG_ENV`],
//!   else [`DEFAULT_HAPROXY_CONFIG`] when it exists.
//! - Checked by the linter's own model ([`crate::lint::static_senders`]).

use crate::cli::{Args, Io};

/// The flag naming the haproxy configuration that [`static_weights`]
/// checks (repeatable).
pub(super) const HAPROXY_CONFIG: &str = "haproxy-config";

/// The variable giving it when the flag is not given.
pub const HAPROXY_CONFIG_ENV: &str = "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG";

/// The configuration read when neither gives one, if it exists.
pub const DEFAULT_HAPROXY_CONFIG: &str = "/etc/haproxy/haproxy.cfg";

/// Weights other than 0% and 100% for `weighted` identities: refused for
/// a server of a static-algorithm backend (haproxy ignores them: "Backend
/// is using a static LB algorithm"), each named with its backend and
/// `balance`, as the configuration shows it: `-haproxy-config` (an
/// unreadable one is an error), else [`HAPROXY_CONFIG_ENV`], else
/// [`DEFAULT_HAPROXY_CONFIG`]; when neither of these can be read, one
/// warning naming the path tried.
pub(super) fn static_weights(
    w: &Args,
    io: &mut Io<'_>,
    command: &str,
    weighted: &[&str],
) -> Result<(), String> {
    if weighted.is_empty() {
        return Ok(());
    }
    let mut configs: Vec<String> = w
        .values(HAPROXY_CONFIG)
        .into_iter()
        .map(str::to_owned)
        .collect();
    if configs.is_empty() {
        let (path, from) = match (io.env)(HAPROXY_CONFIG_ENV).filter(|p| !p.is_empty()) {
            Some(p) => (p, HAPROXY_CONFIG_ENV),
            None => (DEFAULT_HAPROXY_CONFIG.to_owned(), "the default"),
        };
        let mut files = Vec::new();
        if let Err(e) = crate::cli::lint::read_config(&path, &mut files) {
            let _ = writeln!(
                io.err,
                "gitlab-haproxy-agent {command}: warning: no haproxy configuration read ({from}: {e}), so a backend with a static algorithm (balance static-rr, or hashing with hash-type map-based), which ignores weights other than 0% and 100%, cannot be checked; give -haproxy-config FILE"
            );
            return Ok(());
        }
        configs.push(path);
    }
    let mut files = Vec::new();
    for name in &configs {
        crate::cli::lint::read_config(name, &mut files)?;
    }
    let env = crate::cli::lint::config_env(io.env);
    let refused: Vec<String> = crate::lint::static_senders(&files, &env)
        .into_iter()
        .filter(|(identity, _)| weighted.iter().any(|w| w.as_bytes() == identity.as_slice()))
        .map(|(identity, what)| format!("{} ({what})", String::from_utf8_lossy(&identity)))
        .collect();
    match refused.as_slice() {
        [] => Ok(()),
        _ => Err(format!(
            "a static algorithm ignores weights other than 0% and 100%, so no ramp or N% reaches {}: give drain, maint, ready, 0% or 100%, or change the backend's balance (roundrobin, leastconn, or hash-type consistent)",
            refused.join(", ")
        )),
    }
}
