//! Command line and environment -> validated [`Config`], in two steps like
//! ripgrep's low/high args: `lex` turns argv and the environment into
//! `LowArgs`, one typed field of raw text per setting; `validate` checks and
//! types each one. Pure except for reading the token file, the TLS
//! certificate and key files, and resolving a hostname once, all in step
//! two.
//!
//! - `flags.rs`: the table of every flag and variable, and the usage text;
//! - `lex.rs`: step one, the one Go-flag walker (the commands' too) and
//!   the one read of the environment;
//! - `addr.rs`: listener and consul address forms (and the DNS lookup);
//! - `validate.rs`: step two, into [`Config`] (and the token file read);
//! - `model.rs`: the validated types ([`Config`], [`ConsulConfig`]);
//! - `check.rs`: what both validators share ([`UsageError`], a boolean, a
//!   systemd credential);
//! - `tls.rs`: the consul TLS settings, into a rustls configuration (the
//!   certificate and key files read, the system's roots when needed).
//!
//! What always holds:
//! - every flag `-name` may also come from `GITLAB_HAPROXY_AGENT_<NAME>`; the
//!   flag wins; a repeated flag takes its last value (as Go's `flag`);
//! - an environment variable set to the empty string counts as unset, except
//!   for the three listener addresses, where empty disables the listener
//!   just as an empty flag value does;
//! - every error is one line naming the flag or variable, and never holds a
//!   token or password;
//! - with `-dev` and no `-consul-addr` (nor its variable) the agent watches its
//!   own dev KV, and the consul client environment (`CONSUL_*`) is ignored:
//!   it describes a real consul (and a `-consul-*` TLS flag is refused);
//! - each consul TLS setting comes from its flag, else its
//!   `GITLAB_HAPROXY_AGENT_*` variable, else consul's `CONSUL_*` variable
//!   (the address's precedence); its files are read once, in step two
//!   (`tls.rs`).

mod addr;
mod check;
mod flags;
mod lex;
mod model;
mod tls;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

pub use crate::logging::LogFormat;
pub use addr::{
    loopback_if_unspecified, parse_http_url, parse_listen_addr, parse_stats_socket, ConsulEndpoint,
    ListenAddr, StatsSocket,
};
pub use check::UsageError;
pub use flags::usage;
/// `daemon_flag`: how the daemon's flag takes its value; the writers and
/// `status` pass the daemon's flags on to [`parse`], so they need to know
/// which word is a flag's value.
pub use lex::{go_flags, takes as daemon_flag, Given, GoFlags, Takes, Word};
pub use model::{Command, Config, ConsulConfig, GzipMode};
pub use tls::{ConsulTls, SharedConfig};
pub use validate::max_line_bytes;

/// Parses argv (without the program name) and the environment (`env` looks a
/// variable up; it is called only by `lex::read_env`) into a [`Command`].
pub fn parse(
    args: Vec<std::ffi::OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Command, UsageError> {
    let mut low = match lex::lex(args)? {
        lex::Lexed::Help => return Ok(Command::Help(usage())),
        lex::Lexed::Version => return Ok(Command::Version(crate::build_info::version_line())),
        lex::Lexed::Run(low) => low,
    };
    lex::read_env(&mut low, env);
    Ok(Command::Run(Box::new(validate::config(&low)?)))
}
