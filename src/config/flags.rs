//! The table of every setting: each flag once (field, name, kind, default,
//! help) and each other environment variable read once (field, name, help).
//! From it the `settings!` macro makes the usage text, the flags'
//! `GITLAB_HAPROXY_AGENT_*` variable names, and [`LowArgs`], the typed
//! step-one struct with one field per setting, so that a misspelt setting is
//! a compile error.
//!
//! Adding a flag is one row here plus its check in `validate.rs`.
//!
//! Always holds:
//! - each setting has exactly one row;
//! - the usage text lists the rows in table order.

/// What a flag takes, and so what the usage text calls its value (as Go's
/// `flag` does) and how its variable is read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    /// A listener address: an empty variable disables the listener, just as
    /// an empty flag value does, rather than counting as unset.
    Listener,
    Addr,
    Duration,
    Int,
    Text,
    /// A file or directory, read once at start.
    Path,
    /// `-flag` / `-flag=true|false`; never takes the next argument.
    Bool,
}

impl Kind {
    fn value_name(self) -> Option<&'static str> {
        match self {
            Kind::Listener | Kind::Addr => Some("addr"),
            Kind::Duration => Some("duration"),
            Kind::Int => Some("int"),
            Kind::Text => Some("string"),
            Kind::Path => Some("path"),
            Kind::Bool => None,
        }
    }
}

/// One flag's row.
#[derive(Debug)]
pub(super) struct FlagSpec {
    /// Without dashes: `listen-addr`.
    pub name: &'static str,
    pub kind: Kind,
    pub default: &'static str,
    pub help: &'static str,
}

impl FlagSpec {
    /// `GITLAB_HAPROXY_AGENT_<NAME>`, `-` as `_`.
    pub fn env_var(&self) -> String {
        format!(
            "GITLAB_HAPROXY_AGENT_{}",
            self.name.to_ascii_uppercase().replace('-', "_")
        )
    }
}

/// How the usage text shows a variable that is not a flag's.
#[derive(Debug)]
pub(super) enum VarHelp {
    /// A line of its own, under its name.
    Line(&'static str),
}

/// One environment variable's row (a variable that is not a flag's).
#[derive(Debug)]
pub(super) struct VarSpec {
    pub name: &'static str,
    pub help: VarHelp,
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    Flag(&'static str),
    Env(String),
    Default(&'static str),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(name) => write!(f, "flag -{name}"),
            Source::Env(var) => f.write_str(var),
            Source::Default(name) => write!(f, "the default of -{name}"),
        }
    }
}

/// A setting's text as given, and where it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Raw {
    pub value: String,
    pub source: Source,
}

/// One flag's slot in [`LowArgs`]: its row, and its value once argv or its
/// variable gave one.
#[derive(Debug)]
pub(super) struct Flag {
    pub spec: &'static FlagSpec,
    pub raw: Option<Raw>,
}

impl Flag {
    /// The value from argv or the flag's variable, if either set it.
    pub fn explicit(&self) -> Option<&Raw> {
        self.raw.as_ref()
    }

    /// The value from argv, the variable, or else the default.
    pub fn value(&self) -> Raw {
        self.raw.clone().unwrap_or_else(|| Raw {
            value: self.spec.default.to_owned(),
            source: Source::Default(self.spec.name),
        })
    }
}

macro_rules! settings {
    (
        flags { $( $flag:ident: $name:literal, $kind:ident, $default:expr, $help:literal; )* }
        variables { $( $var:ident: $var_name:literal, $var_help:expr; )* }
    ) => {
        /// Positions in [`FLAGS`].
        #[allow(non_camel_case_types)]
        enum FlagRow { $( $flag, )* }

        /// Positions in [`VARIABLES`].
        #[allow(non_camel_case_types)]
        enum VarRow { $( $var, )* }

        /// The flags, in usage order.
        pub(super) const FLAGS: &[FlagSpec] = &[
            $( FlagSpec { name: $name, kind: Kind::$kind, default: $default, help: $help }, )*
        ];

        /// The other variables read, in usage order.
        pub(super) const VARIABLES: &[VarSpec] = &[
            $( VarSpec { name: $var_name, help: $var_help }, )*
        ];

        /// Step one's result: what argv and the environment said, one field
        /// per row of the table, still as text. A flag's field holds its
        /// last value on the command line, else its variable's; a variable's
        /// field its value when set and not empty.
        #[derive(Debug)]
        pub(super) struct LowArgs {
            $( pub $flag: Flag, )*
            $( pub $var: Option<Raw>, )*
        }

        impl LowArgs {
            /// Nothing given yet.
            pub(super) fn new() -> LowArgs {
                LowArgs {
                    $( $flag: Flag { spec: &FLAGS[FlagRow::$flag as usize], raw: None }, )*
                    $( $var: None, )*
                }
            }

            /// Every flag's slot, in table order: the lexer's name -> field
            /// lookup and the environment pass walk this.
            pub(super) fn flags_mut(&mut self) -> [&mut Flag; FLAGS.len()] {
                [ $( &mut self.$flag, )* ]
            }

            /// Every variable's slot with its row, in table order.
            pub(super) fn variables_mut(
                &mut self,
            ) -> [(&'static VarSpec, &mut Option<Raw>); VARIABLES.len()] {
                [ $( (&VARIABLES[VarRow::$var as usize], &mut self.$var), )* ]
            }
        }
    };
}

settings! {
    flags {
        listen_addr: "listen-addr", Listener, ":9777", "agent-check listener (haproxy agent-port); empty disables";
        listen_allow: "listen-allow", Text, "", "CIDR[,CIDR...]: only these source addresses get agent answers (others are closed at accept, unanswered); empty: everyone";
        monitoring_addr: "monitoring-addr", Listener, ":9778", "/-/metrics, /-/liveness, /-/readiness listener; empty disables";
        pprof_addr: "pprof-addr", Listener, "127.0.0.1:9779", "debugging endpoints (/debug/state); empty disables";
        consul_addr: "consul-addr", Addr, "127.0.0.1:8500", "consul agent: host:port, http://host:port[/prefix] or unix:///path; else CONSUL_HTTP_ADDR";
        consul_http_ssl: "consul-http-ssl", Bool, "false", "talk https to consul, as an https:// address does; else CONSUL_HTTP_SSL";
        consul_http_ssl_verify: "consul-http-ssl-verify", Bool, "true", "verify consul's certificate and name (false is insecure); else CONSUL_HTTP_SSL_VERIFY";
        consul_ca_cert: "consul-ca-cert", Path, "", "PEM file of the CAs consul's certificate must chain to; else CONSUL_CACERT, else the system's roots";
        consul_ca_path: "consul-ca-path", Path, "", "directory of PEM CA files (when -consul-ca-cert is unset); else CONSUL_CAPATH";
        consul_client_cert: "consul-client-cert", Path, "", "PEM client certificate chain, for consul's verify_incoming; else CONSUL_CLIENT_CERT";
        consul_client_key: "consul-client-key", Path, "", "PEM key of the client certificate (PKCS#8, PKCS#1 or SEC1); else CONSUL_CLIENT_KEY";
        consul_tls_server_name: "consul-tls-server-name", Text, "", "name consul's certificate must hold; else CONSUL_TLS_SERVER_NAME, else the address's host";
        kv_prefix: "kv-prefix", Text, "gitlab-haproxy-agent/state", "KV prefix to watch; the key below it is the server identity";
        read_timeout: "read-timeout", Duration, "5s", "time a connection has to send its request line (Go duration)";
        max_line_bytes: "max-line-bytes", Int, "256", "longest request line accepted, 1..65536";
        reply_up: "reply-up", Bool, "false", "append \" up\" to every reply (the agent's health vote): needed on haproxy 3.3/3.4 for a server without a default-server line before it";
        max_connections: "max-connections", Int, "20000", "open agent connections; at the limit a new one evicts the oldest without a complete line";
        consul_wait: "consul-wait", Duration, "5m", "consul blocking-query wait, 1s..10m";
        consul_max_body_bytes: "consul-max-body-bytes", Int, "67108864", "largest consul response body accepted (inflated, for a gzip body), at least 1024";
        consul_gzip: "consul-gzip", Text, "auto", "ask consul for gzip bodies: auto (unless consul is on loopback or a unix socket), true or false";
        consul_max_stale: "consul-max-stale", Duration, "0", "let any consul server answer (?stale) if it heard from the leader within this (Go duration); 0: the leader answers";
        state_file: "state-file", Text, "", "file keeping the last consul state across restarts (written after every change, answered from at start if the first consul read fails or takes over 1s, until consul answers); empty disables";
        state_max_age: "state-max-age", Duration, "24h", "oldest state file answered from at start";
        unasked_after: "unasked-after", Duration, "1m", "a diverted key no check asked for this long (since its write or the start) is reported unasked; at least 1s";
        max_unknown_identities: "max-unknown-identities", Int, "65536", "asked identities without a key whose last ask is remembered; more are counted, not kept";
        dev: "dev", Bool, "false", "also serve an in-memory consul-compatible KV on -dev-kv-addr and watch it; never for production";
        dev_kv_addr: "dev-kv-addr", Addr, "127.0.0.1:8500", "dev KV listener (used only with -dev)";
    }
    variables {
        consul_http_addr: "CONSUL_HTTP_ADDR", VarHelp::Line("consul address when -consul-addr and its variable are unset (same forms)");
        consul_http_token_file: "CONSUL_HTTP_TOKEN_FILE", VarHelp::Line("file holding the ACL token, read once at start (beats CONSUL_HTTP_TOKEN)");
        consul_http_token: "CONSUL_HTTP_TOKEN", VarHelp::Line("ACL token, sent as X-Consul-Token");
        consul_http_auth: "CONSUL_HTTP_AUTH", VarHelp::Line("user:password for HTTP basic auth");
        consul_namespace: "CONSUL_NAMESPACE", VarHelp::Line("Enterprise namespace (?ns=)");
        consul_partition: "CONSUL_PARTITION", VarHelp::Line("Enterprise admin partition (?partition=)");
        consul_http_ssl_env: "CONSUL_HTTP_SSL", VarHelp::Line("https to consul when -consul-http-ssl and its variable are unset");
        consul_http_ssl_verify_env: "CONSUL_HTTP_SSL_VERIFY", VarHelp::Line("false: do not verify consul's certificate (insecure), when -consul-http-ssl-verify is unset");
        consul_cacert_env: "CONSUL_CACERT", VarHelp::Line("CA file when -consul-ca-cert and its variable are unset");
        consul_capath_env: "CONSUL_CAPATH", VarHelp::Line("CA directory when -consul-ca-path and its variable are unset");
        consul_client_cert_env: "CONSUL_CLIENT_CERT", VarHelp::Line("client certificate when -consul-client-cert and its variable are unset");
        consul_client_key_env: "CONSUL_CLIENT_KEY", VarHelp::Line("client key when -consul-client-key and its variable are unset");
        consul_tls_server_name_env: "CONSUL_TLS_SERVER_NAME", VarHelp::Line("name to verify when -consul-tls-server-name and its variable are unset (a port is dropped)");
        notify_socket: "NOTIFY_SOCKET", VarHelp::Line("set by systemd for Type=notify: READY=1 once the agent answers (or after 10s), STATUS= lines, STOPPING=1");
        watchdog_usec: "WATCHDOG_USEC", VarHelp::Line("set by systemd's WatchdogSec=: WATCHDOG=1 from the loop at half this interval");
        watchdog_pid: "WATCHDOG_PID", VarHelp::Line("set by systemd: the watchdog is this process's only when it names its pid");
        credentials_directory: "CREDENTIALS_DIRECTORY", VarHelp::Line("systemd's credentials (LoadCredential=): its consul-token, consul-client-cert and consul-client-key files are used when no token or client certificate is given otherwise");
        gitlab_log_format: "GITLAB_LOG_FORMAT", VarHelp::Line("json (default) or text");
        gitlab_log_level: "GITLAB_LOG_LEVEL", VarHelp::Line("trace, debug, info (default), warn or error");
    }
}

/// The usage text printed by `-h`: every flag with its default and its
/// environment variable, one line each, then the other variables read.
pub fn usage() -> String {
    let mut out = String::new();
    out.push_str("Usage: gitlab-haproxy-agent [flags]\n\n");
    out.push_str("HAProxy agent-check responder answering each server's desired admin state from consul KV.\n");
    out.push_str("Flags take Go syntax (-flag value, -flag=value, --flag value); a flag beats its environment variable.\n\n");
    out.push_str("Flags:\n");
    for f in FLAGS {
        let left = match f.kind.value_name() {
            Some(value) => format!("-{} {value}", f.name),
            None => format!("-{}", f.name),
        };
        out.push_str(&format!(
            "  {left:<31} {} (default {:?}; env {})\n",
            f.help,
            f.default,
            f.env_var()
        ));
    }
    out.push_str(&format!("  {:<31} print this help and exit\n", "-h, -help"));
    out.push_str(&format!(
        "  {:<31} print the version and exit\n",
        "-version"
    ));
    out.push_str("\nEnvironment:\n");
    for var in VARIABLES {
        let VarHelp::Line(help) = var.help;
        out.push_str(&format!("  {:<31} {help}\n", var.name));
    }
    out.push_str("\nWith -dev and no consul address given, the agent watches its own dev KV and ignores CONSUL_*.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_starts_a_line() {
        let text = usage();
        for var in VARIABLES {
            let line = format!("\n  {:<31} ", var.name);
            assert!(text.contains(&line), "{}", var.name);
        }
    }

    #[test]
    fn each_row_is_in_its_own_field() {
        let mut low = LowArgs::new();
        let names: Vec<&str> = low.flags_mut().iter().map(|f| f.spec.name).collect();
        let table: Vec<&str> = FLAGS.iter().map(|f| f.name).collect();
        assert_eq!(names, table);
        let vars: Vec<&str> = low.variables_mut().iter().map(|(v, _)| v.name).collect();
        let table: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        assert_eq!(vars, table);
    }
}
