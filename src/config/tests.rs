//! End-to-end tests of [`parse`]: argv and an environment in, a
//! [`Config`] or the exact error out.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::flags::{FlagSpec, FLAGS};
use super::*;
use crate::build_info::version_line;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn args(a: &[&str]) -> Vec<OsString> {
    a.iter().map(OsString::from).collect()
}

fn run(a: &[&str], env: &[(&str, &str)]) -> Result<Config, UsageError> {
    match parse(args(a), &env_of(env))? {
        Command::Run(config) => Ok(*config),
        other => panic!("expected Run, got {other:?}"),
    }
}

fn ok(a: &[&str], env: &[(&str, &str)]) -> Config {
    run(a, env).unwrap_or_else(|e| panic!("{a:?} {env:?}: {e}"))
}

/// The error, checked to be one line.
fn err(a: &[&str], env: &[(&str, &str)]) -> String {
    let e = run(a, env).expect_err("expected a usage error").0;
    assert!(!e.contains('\n'), "error is not one line: {e:?}");
    e
}

fn v4(a: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::from((a, port))
}

fn tcp(a: [u8; 4], port: u16) -> ConsulEndpoint {
    ConsulEndpoint::Tcp(v4(a, port))
}

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("gha-config-test-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).expect("write temp file");
    path
}

#[test]
fn defaults() {
    let c = ok(&[], &[]);
    assert_eq!(c.listen_addr, Some(ListenAddr::AnyDualStack(9777)));
    assert_eq!(c.monitoring_addr, Some(ListenAddr::AnyDualStack(9778)));
    assert_eq!(
        c.pprof_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 9779)))
    );
    assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8500));
    assert_eq!(c.consul.host_header, "127.0.0.1:8500");
    assert_eq!(c.consul.path_prefix, "");
    assert_eq!(c.consul.token, None);
    assert_eq!(c.consul.basic_auth, None);
    assert_eq!(c.consul.namespace, None);
    assert_eq!(c.consul.partition, None);
    assert_eq!(c.consul.wait, Duration::from_secs(300));
    assert_eq!(c.consul.max_body_bytes, 64 << 20);
    assert_eq!(c.kv_prefix, "gitlab-haproxy-agent/state");
    assert_eq!(c.read_timeout, Duration::from_secs(5));
    assert_eq!(c.max_line_bytes, 256);
    assert_eq!(c.max_connections, 20000);
    assert_eq!(c.state_file, None, "off unless asked for");
    assert_eq!(c.state_max_age, Duration::from_secs(86_400));
    assert_eq!(c.unasked_after, Duration::from_secs(60));
    assert_eq!(c.max_unknown_identities, 65_536);
    assert_eq!(c.dev_kv_addr, None);
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.log_level, log::LevelFilter::Info);
    assert!(!c.consul_follows_dev_kv());
}

/// Every flag set on the command line, in all four syntaxes.
const ALL_FLAGS: &[&str] = &[
    "-listen-addr",
    "127.0.0.1:1001",
    "-monitoring-addr=127.0.0.1:1002",
    "--pprof-addr",
    "127.0.0.1:1003",
    "-listen-allow",
    "10.0.0.0/8",
    "--consul-addr=10.0.0.1:1004",
    "-kv-prefix",
    "/a/b/",
    "-read-timeout=1500ms",
    "--max-line-bytes",
    "100",
    "-reply-up",
    "--max-connections=7",
    "-consul-wait",
    "1m30s",
    "-consul-max-body-bytes",
    "2048",
    "-consul-gzip=false",
    "--consul-max-stale",
    "2s",
    "-state-file",
    "/var/lib/x/state.json",
    "-state-max-age=90m",
    "-unasked-after",
    "30s",
    "--max-unknown-identities=10",
    "-dev",
    "-dev-kv-addr",
    "127.0.0.1:1005",
];

fn assert_all_flags(c: &Config) {
    assert_eq!(
        c.listen_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1001)))
    );
    assert_eq!(
        c.monitoring_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1002)))
    );
    assert_eq!(
        c.pprof_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1003)))
    );
    assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 1], 1004));
    assert!(c.listen_allow.permits([10, 9, 9, 9].into()));
    assert!(!c.listen_allow.permits([192, 0, 2, 1].into()));
    assert_eq!(c.kv_prefix, "a/b");
    assert_eq!(c.read_timeout, Duration::from_millis(1500));
    assert_eq!(c.max_line_bytes, 100);
    assert!(
        c.reply_up,
        "-reply-up beats GITLAB_HAPROXY_AGENT_REPLY_UP=false"
    );
    assert_eq!(c.max_connections, 7);
    assert_eq!(c.consul.wait, Duration::from_secs(90));
    assert_eq!(c.consul.max_body_bytes, 2048);
    assert_eq!(c.consul.gzip, GzipMode::Never);
    assert_eq!(c.consul.max_stale, Duration::from_secs(2));
    assert_eq!(c.state_file, Some("/var/lib/x/state.json".into()));
    assert_eq!(c.state_max_age, Duration::from_secs(5400));
    assert_eq!(c.unasked_after, Duration::from_secs(30));
    assert_eq!(c.max_unknown_identities, 10);
    assert_eq!(
        c.dev_kv_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 1005)))
    );
}

const ALL_ENV: &[(&str, &str)] = &[
    ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "127.0.0.1:2001"),
    ("GITLAB_HAPROXY_AGENT_MONITORING_ADDR", "127.0.0.1:2002"),
    ("GITLAB_HAPROXY_AGENT_PPROF_ADDR", "127.0.0.1:2003"),
    ("GITLAB_HAPROXY_AGENT_LISTEN_ALLOW", "192.0.2.1"),
    ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "10.0.0.2:2004"),
    ("GITLAB_HAPROXY_AGENT_KV_PREFIX", "env/prefix"),
    ("GITLAB_HAPROXY_AGENT_READ_TIMEOUT", "2s"),
    ("GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES", "200"),
    ("GITLAB_HAPROXY_AGENT_REPLY_UP", "false"),
    ("GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS", "8"),
    ("GITLAB_HAPROXY_AGENT_CONSUL_WAIT", "2m"),
    ("GITLAB_HAPROXY_AGENT_CONSUL_MAX_BODY_BYTES", "4096"),
    ("GITLAB_HAPROXY_AGENT_CONSUL_GZIP", "true"),
    ("GITLAB_HAPROXY_AGENT_CONSUL_MAX_STALE", "1m"),
    ("GITLAB_HAPROXY_AGENT_STATE_FILE", "env-state.json"),
    ("GITLAB_HAPROXY_AGENT_STATE_MAX_AGE", "1h"),
    ("GITLAB_HAPROXY_AGENT_UNASKED_AFTER", "2m"),
    ("GITLAB_HAPROXY_AGENT_MAX_UNKNOWN_IDENTITIES", "20"),
    ("GITLAB_HAPROXY_AGENT_DEV", "true"),
    ("GITLAB_HAPROXY_AGENT_DEV_KV_ADDR", "127.0.0.1:2005"),
];

#[test]
fn every_flag_on_the_command_line() {
    assert_all_flags(&ok(ALL_FLAGS, &[]));
}

#[test]
fn every_flag_from_the_environment() {
    let c = ok(&[], ALL_ENV);
    assert_eq!(
        c.listen_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2001)))
    );
    assert_eq!(
        c.monitoring_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2002)))
    );
    assert_eq!(
        c.pprof_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2003)))
    );
    assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 2], 2004));
    assert!(c.listen_allow.permits([192, 0, 2, 1].into()));
    assert!(!c.listen_allow.permits([10, 9, 9, 9].into()));
    assert_eq!(c.kv_prefix, "env/prefix");
    assert_eq!(c.read_timeout, Duration::from_secs(2));
    assert_eq!(c.max_line_bytes, 200);
    assert_eq!(c.max_connections, 8);
    assert_eq!(c.consul.wait, Duration::from_secs(120));
    assert_eq!(c.consul.max_body_bytes, 4096);
    assert_eq!(c.consul.gzip, GzipMode::Always);
    assert_eq!(c.consul.max_stale, Duration::from_secs(60));
    assert_eq!(c.state_file, Some("env-state.json".into()));
    assert_eq!(c.state_max_age, Duration::from_secs(3600));
    assert_eq!(c.unasked_after, Duration::from_secs(120));
    assert_eq!(c.max_unknown_identities, 20);
    assert_eq!(
        c.dev_kv_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 2005)))
    );
}

#[test]
fn every_flag_beats_its_variable() {
    assert_all_flags(&ok(ALL_FLAGS, ALL_ENV));
    // -dev=false beats GITLAB_HAPROXY_AGENT_DEV=true.
    let c = ok(&["-dev=false"], &[("GITLAB_HAPROXY_AGENT_DEV", "true")]);
    assert_eq!(c.dev_kv_addr, None);
}

#[test]
fn the_table_names_each_variable() {
    let names: Vec<String> = FLAGS.iter().map(FlagSpec::env_var).collect();
    let tls = super::tls_tests::TLS_FLAG_VARIABLES;
    for var in ALL_ENV.iter().map(|(var, _)| var).chain(tls) {
        assert!(names.iter().any(|n| n == var), "{var}");
    }
    assert_eq!(names.len(), ALL_ENV.len() + tls.len());
}

#[test]
fn four_flag_syntaxes() {
    for a in [
        &["-read-timeout", "7s"][..],
        &["-read-timeout=7s"],
        &["--read-timeout", "7s"],
        &["--read-timeout=7s"],
    ] {
        assert_eq!(ok(a, &[]).read_timeout, Duration::from_secs(7), "{a:?}");
    }
}

#[test]
fn a_value_may_start_with_a_dash() {
    // Go's flag package takes the next argument whatever it looks like.
    let e = err(&["-read-timeout", "-1s"], &[]);
    assert!(
        e.contains("\"-1s\"") && e.contains("flag -read-timeout"),
        "{e}"
    );
    assert_eq!(ok(&["-kv-prefix", "-x-"], &[]).kv_prefix, "-x-");
}

#[test]
fn repeated_flag_takes_the_last_value() {
    assert_eq!(
        ok(&["-max-line-bytes", "10", "-max-line-bytes=20"], &[]).max_line_bytes,
        20
    );
    assert_eq!(ok(&["-dev", "-dev=false"], &[]).dev_kv_addr, None);
}

#[test]
fn unknown_flags() {
    let e = err(&["-nope"], &[]);
    assert!(e.contains("unknown flag -nope"), "{e}");
    let e = err(&["--nope=1"], &[]);
    assert!(e.contains("unknown flag -nope"), "{e}");
    let e = err(&["---listen-addr", ":1"], &[]);
    assert!(e.contains("bad flag syntax"), "{e}");
    let e = err(&["-=x"], &[]);
    assert!(e.contains("bad flag syntax"), "{e}");
}

#[test]
fn leftover_positional_arguments() {
    for a in [
        &["extra"][..],
        &["-listen-addr", ":1", "extra"],
        &["-dev", "true"],
        &["--", "extra"],
        &["-"],
    ] {
        let e = err(a, &[]);
        assert!(e.contains("unexpected argument"), "{a:?}: {e}");
    }
    // A lone `--` ends the flags and is fine.
    assert_eq!(ok(&["-max-line-bytes", "9", "--"], &[]).max_line_bytes, 9);
}

/// The walk once handed its pairs to pico-args, which looked every flag up
/// anywhere in them: a value spelled like another flag was taken for it.
#[test]
fn a_value_spelled_like_a_flag_is_a_value() {
    let c = ok(&["-kv-prefix", "--listen-addr", "-listen-addr", ":5"], &[]);
    assert_eq!(c.kv_prefix, "--listen-addr");
    assert_eq!(c.listen_addr, Some(ListenAddr::AnyDualStack(5)));
}

#[test]
fn non_utf8_value_names_the_first_such_flag_in_table_order() {
    use std::os::unix::ffi::OsStringExt;
    let bad = || OsString::from_vec(vec![0xff]);
    let argv = vec![
        OsString::from("-monitoring-addr"),
        bad(),
        OsString::from("-listen-addr"),
        bad(),
    ];
    let e = parse(argv, &env_of(&[])).expect_err("non-UTF-8").0;
    assert_eq!(e, "flag -listen-addr: argument is not a UTF-8 string");
    // A later syntax error is reported first.
    let argv = vec![
        OsString::from("-listen-addr"),
        bad(),
        OsString::from("-nope"),
    ];
    let e = parse(argv, &env_of(&[])).expect_err("unknown flag").0;
    assert_eq!(e, "unknown flag -nope (see -help)");
}

#[test]
fn flag_without_its_value() {
    let e = err(&["-listen-addr", ":1", "-read-timeout"], &[]);
    assert_eq!(e, "flag needs an argument: -read-timeout");
}

#[test]
fn help_and_version() {
    for a in ["-h", "-help", "--help", "--h", "-help=x"] {
        match parse(args(&[a]), &env_of(&[])) {
            Ok(Command::Help(text)) => assert_eq!(text, usage()),
            other => panic!("{a}: {other:?}"),
        }
    }
    for a in ["-version", "--version"] {
        match parse(args(&[a]), &env_of(&[])) {
            Ok(Command::Version(line)) => assert_eq!(line, version_line()),
            other => panic!("{a}: {other:?}"),
        }
    }
    // Help wins over a later bad value (Go stops at -h).
    assert!(matches!(
        parse(args(&["-h", "-read-timeout", "x"]), &env_of(&[])),
        Ok(Command::Help(_))
    ));
}

#[test]
fn usage_names_every_flag_default_and_variable_on_one_line() {
    let text = usage();
    for f in FLAGS {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("-{} ", f.name)))
            .unwrap_or_else(|| panic!("no usage line for -{}", f.name));
        assert!(line.contains(&format!("{:?}", f.default)), "{line}");
        assert!(line.contains(&f.env_var()), "{line}");
    }
    for var in [
        "CONSUL_HTTP_ADDR",
        "CONSUL_HTTP_TOKEN_FILE",
        "CONSUL_HTTP_TOKEN",
        "GITLAB_LOG_FORMAT",
        "GITLAB_LOG_LEVEL",
    ] {
        assert!(text.contains(var), "{var}");
    }
    assert!(text.contains("-version") && text.contains("-h, -help"));
}

#[test]
fn bad_values_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["-read-timeout", "abc"], "invalid value \"abc\" for flag -read-timeout: not a duration (use Go syntax like 5s, 100ms, 1m30s)"),
        (&["-read-timeout", "0s"], "invalid value \"0s\" for flag -read-timeout: must be more than 0"),
        (&["-read-timeout", "-1s"], "invalid value \"-1s\" for flag -read-timeout: must not be negative"),
        (&["-consul-wait", "-5m"], "invalid value \"-5m\" for flag -consul-wait: must not be negative"),
        (&["-read-timeout", "2h"], "invalid value \"2h\" for flag -read-timeout: must be at most 1h"),
        (&["-unasked-after", "500ms"], "invalid value \"500ms\" for flag -unasked-after: must be at least 1s"),
        (&["-max-unknown-identities", "x"], "invalid value \"x\" for flag -max-unknown-identities: not a whole number"),
        (&["-max-line-bytes", "0"], "invalid value \"0\" for flag -max-line-bytes: must be between 1 and 65536"),
        (&["-max-line-bytes", "65537"], "invalid value \"65537\" for flag -max-line-bytes: must be between 1 and 65536"),
        (&["-max-line-bytes", "abc"], "invalid value \"abc\" for flag -max-line-bytes: not a whole number"),
        (&["-max-line-bytes", "-1"], "invalid value \"-1\" for flag -max-line-bytes: not a whole number"),
        (&["-max-line-bytes", "+5"], "invalid value \"+5\" for flag -max-line-bytes: not a whole number"),
        (&["-max-connections", "0"], "invalid value \"0\" for flag -max-connections: must be between 1 and 10000000"),
        (&["-listen-allow", "10.0.0.0/8,10.1.0.0/33"], "invalid value \"10.0.0.0/8,10.1.0.0/33\" for flag -listen-allow: \"10.1.0.0/33\": prefix length longer than the address"),
        (&["-listen-allow", "haproxy1"], "invalid value \"haproxy1\" for flag -listen-allow: \"haproxy1\": not an IP address or CIDR (like 10.0.0.0/8 or fd00::/8)"),
        (&["-max-connections", "1e3"], "invalid value \"1e3\" for flag -max-connections: not a whole number"),
        (&["-consul-wait", "x"], "invalid value \"x\" for flag -consul-wait: not a duration (use Go syntax like 5s, 100ms, 1m30s)"),
        (&["-consul-max-body-bytes", "1023"], "invalid value \"1023\" for flag -consul-max-body-bytes: must be at least 1024"),
        (&["-consul-max-body-bytes", ""], "invalid value \"\" for flag -consul-max-body-bytes: not a whole number"),
        (&["-consul-gzip", "yes"], "invalid value \"yes\" for flag -consul-gzip: use auto, true or false"),
        (&["-consul-max-stale", "-1s"], "invalid value \"-1s\" for flag -consul-max-stale: must not be negative"),
        (&["-consul-max-stale", "5"], "invalid value \"5\" for flag -consul-max-stale: not a duration (use Go syntax like 5s, 100ms, 1m30s)"),
        (&["-kv-prefix", "///"], "invalid value \"///\" for flag -kv-prefix: must not be empty (that would watch the whole KV store)"),
        (&["-kv-prefix", ""], "invalid value \"\" for flag -kv-prefix: must not be empty (that would watch the whole KV store)"),
        (&["-kv-prefix", "a\nb"], "invalid value \"a\\nb\" for flag -kv-prefix: holds a control character"),
        (&["-dev=maybe"], "invalid value \"maybe\" for flag -dev: not a boolean (use true or false)"),
        (&["-state-max-age", "0s"], "invalid value \"0s\" for flag -state-max-age: must be more than 0"),
        (&["-state-max-age", "1d"], "invalid value \"1d\" for flag -state-max-age: not a duration (use Go syntax like 5s, 100ms, 1m30s)"),
        (&["-consul-addr", ""], "invalid value \"\" for flag -consul-addr: must not be empty"),
        (&["-dev", "-dev-kv-addr", ""], "invalid value \"\" for flag -dev-kv-addr: must not be empty with -dev"),
    ];
    for (a, want) in cases {
        assert_eq!(err(a, &[]), *want, "{a:?}");
    }
    for (flag, value) in [
        ("-listen-addr", "nope"),
        ("-listen-addr", ":99999"),
        ("-listen-addr", ":abc"),
        ("-listen-addr", "1.2.3.4"),
        ("-listen-addr", "::1:80"),
        ("-monitoring-addr", "[::1"),
        ("-pprof-addr", "[zz]:1"),
        ("-consul-addr", "1.2.3.4:x"),
        ("-dev-kv-addr", "x"),
    ] {
        let mut a = vec![flag, value];
        if flag == "-dev-kv-addr" {
            a.push("-dev");
        }
        let e = err(&a, &[]);
        assert!(
            e.starts_with(&format!("invalid value {value:?} for flag {flag}: ")),
            "{e}"
        );
    }
}

#[test]
fn bad_values_name_the_variable() {
    let cases: &[(&str, &str)] = &[
        ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "nope"),
        ("GITLAB_HAPROXY_AGENT_MONITORING_ADDR", "nope"),
        ("GITLAB_HAPROXY_AGENT_PPROF_ADDR", "nope"),
        ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "ftp://x"),
        ("GITLAB_HAPROXY_AGENT_KV_PREFIX", "/"),
        ("GITLAB_HAPROXY_AGENT_READ_TIMEOUT", "abc"),
        ("GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES", "x"),
        ("GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS", "0"),
        ("GITLAB_HAPROXY_AGENT_CONSUL_WAIT", "11m"),
        ("GITLAB_HAPROXY_AGENT_CONSUL_MAX_BODY_BYTES", "1"),
        ("GITLAB_HAPROXY_AGENT_DEV", "yes"),
    ];
    for (var, value) in cases {
        let e = err(&[], &[(var, value)]);
        assert!(
            e.starts_with(&format!("invalid value {value:?} for {var}: ")),
            "{e}"
        );
    }
    let e = err(&["-dev"], &[("GITLAB_HAPROXY_AGENT_DEV_KV_ADDR", "x")]);
    assert!(
        e.starts_with("invalid value \"x\" for GITLAB_HAPROXY_AGENT_DEV_KV_ADDR: "),
        "{e}"
    );
    assert_eq!(
        err(&["-read-timeout", "abc"], &[]),
        "invalid value \"abc\" for flag -read-timeout: not a duration (use Go syntax like 5s, 100ms, 1m30s)"
    );
}

#[test]
fn empty_variables_count_as_unset_except_for_listeners() {
    let c = ok(
        &[],
        &[
            ("GITLAB_HAPROXY_AGENT_READ_TIMEOUT", ""),
            ("GITLAB_HAPROXY_AGENT_KV_PREFIX", ""),
            ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", ""),
            ("GITLAB_HAPROXY_AGENT_DEV", ""),
        ],
    );
    assert_eq!(c.read_timeout, Duration::from_secs(5));
    assert_eq!(c.kv_prefix, "gitlab-haproxy-agent/state");
    assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8500));
    assert_eq!(c.dev_kv_addr, None);
}

#[test]
fn empty_listen_addresses_disable() {
    let c = ok(
        &["-listen-addr", "", "-monitoring-addr=", "--pprof-addr="],
        &[],
    );
    assert_eq!(
        (c.listen_addr, c.monitoring_addr, c.pprof_addr),
        (None, None, None)
    );
    let c = ok(
        &[],
        &[
            ("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", ""),
            ("GITLAB_HAPROXY_AGENT_MONITORING_ADDR", ""),
            ("GITLAB_HAPROXY_AGENT_PPROF_ADDR", ""),
        ],
    );
    assert_eq!(
        (c.listen_addr, c.monitoring_addr, c.pprof_addr),
        (None, None, None)
    );
    // A flag re-enables what the variable disabled.
    let c = ok(
        &["-listen-addr", ":5"],
        &[("GITLAB_HAPROXY_AGENT_LISTEN_ADDR", "")],
    );
    assert_eq!(c.listen_addr, Some(ListenAddr::AnyDualStack(5)));
}

#[test]
fn consul_gzip_auto_asks_unless_consul_is_on_loopback_or_a_unix_socket() {
    let asks = |args: &[&str]| ok(args, &[]).consul.asks_gzip();
    // Defaults: auto, 127.0.0.1:8500.
    assert_eq!(ok(&[], &[]).consul.gzip, GzipMode::Auto);
    assert!(!asks(&[]));
    for (addr, remote) in [
        ("10.0.0.1:8500", true),
        ("http://[2001:db8::1]:8500", true),
        ("127.0.0.2:8500", false),
        ("[::1]:8500", false),
        ("[::ffff:127.0.0.1]:8500", false),
        ("unix:///run/consul.sock", false),
    ] {
        assert_eq!(asks(&["-consul-addr", addr]), remote, "{addr}");
        assert!(
            asks(&["-consul-addr", addr, "-consul-gzip", "true"]),
            "{addr}"
        );
        assert!(
            !asks(&["-consul-addr", addr, "-consul-gzip", "0"]),
            "{addr}"
        );
        assert_eq!(
            asks(&["-consul-addr", addr, "-consul-gzip", "AUTO"]),
            remote,
            "{addr}"
        );
    }
    // -dev watches its own KV on loopback.
    assert!(!asks(&["-dev"]));
    assert_eq!(ok(&[], &[]).consul.max_stale, Duration::ZERO);
}

#[test]
fn consul_wait_bounds() {
    for bad in ["999ms", "11m", "10m1ns", "0"] {
        let e = err(&["-consul-wait", bad], &[]);
        assert_eq!(
            e,
            format!("invalid value {bad:?} for flag -consul-wait: must be between 1s and 10m")
        );
    }
    assert_eq!(
        ok(&["-consul-wait", "1s"], &[]).consul.wait,
        Duration::from_secs(1)
    );
    assert_eq!(
        ok(&["-consul-wait", "10m"], &[]).consul.wait,
        Duration::from_secs(600)
    );
}

#[test]
fn consul_address_precedence() {
    let flag = ["-consul-addr", "10.0.0.1:1"];
    let own = ("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "10.0.0.2:2");
    let consul = ("CONSUL_HTTP_ADDR", "10.0.0.3:3");
    assert_eq!(
        ok(&flag, &[own, consul]).consul.endpoint,
        tcp([10, 0, 0, 1], 1)
    );
    assert_eq!(
        ok(&[], &[own, consul]).consul.endpoint,
        tcp([10, 0, 0, 2], 2)
    );
    assert_eq!(ok(&[], &[consul]).consul.endpoint, tcp([10, 0, 0, 3], 3));
    assert_eq!(ok(&[], &[]).consul.endpoint, tcp([127, 0, 0, 1], 8500));
    assert_eq!(
        ok(&[], &[("CONSUL_HTTP_ADDR", "")]).consul.endpoint,
        tcp([127, 0, 0, 1], 8500)
    );
}

#[test]
fn dev_mode_watches_the_dev_kv_unless_told_otherwise() {
    let c = ok(&["-dev"], &[("CONSUL_HTTP_ADDR", "10.0.0.3:3")]);
    assert_eq!(
        c.dev_kv_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 8500)))
    );
    assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8500));
    assert!(c.consul_follows_dev_kv());

    let c = ok(&["-dev", "-dev-kv-addr", "127.0.0.1:8600"], &[]);
    assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 8600));
    assert_eq!(c.consul.host_header, "127.0.0.1:8600");

    let c = ok(&["-dev", "-dev-kv-addr", "[::1]:0"], &[]);
    assert_eq!(
        c.consul.endpoint,
        ConsulEndpoint::Tcp("[::1]:0".parse().unwrap())
    );
    assert!(c.consul_follows_dev_kv());

    let c = ok(&["-dev", "-consul-addr", "10.0.0.1:1"], &[]);
    assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 1], 1));
    assert!(!c.consul_follows_dev_kv());
    let c = ok(
        &["-dev"],
        &[("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", "10.0.0.2:2")],
    );
    assert_eq!(c.consul.endpoint, tcp([10, 0, 0, 2], 2));

    // -dev-kv-addr without -dev is not used.
    assert_eq!(ok(&["-dev-kv-addr", "x"], &[]).dev_kv_addr, None);
}

/// Issue 39: `-dev -dev-kv-addr 0.0.0.0:P` served a KV without ACLs to
/// the network; the agent and monitoring ports listened on every
/// interface in -dev too.
#[test]
fn dev_mode_stays_local() {
    for addr in [":8600", "0.0.0.0:8600", "[::]:0", "192.0.2.1:8500"] {
        let e = err(&["-dev", "-dev-kv-addr", addr], &[]);
        assert_eq!(e, format!("invalid value {addr:?} for flag -dev-kv-addr: must be a loopback address (127.0.0.1:PORT or [::1]:PORT): the dev KV has no ACLs"));
    }
    let c = ok(&["-dev"], &[]);
    assert_eq!(
        c.listen_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 9777)))
    );
    assert_eq!(
        c.monitoring_addr,
        Some(ListenAddr::Addr(v4([127, 0, 0, 1], 9778)))
    );
    let c = ok(
        &["-dev", "-listen-addr", ":9777"],
        &[("GITLAB_HAPROXY_AGENT_MONITORING_ADDR", ":1")],
    );
    assert_eq!(
        c.listen_addr,
        Some(ListenAddr::AnyDualStack(9777)),
        "given: kept"
    );
    assert_eq!(
        c.monitoring_addr,
        Some(ListenAddr::AnyDualStack(1)),
        "given: kept"
    );
    assert_eq!(
        ok(&[], &[]).listen_addr,
        Some(ListenAddr::AnyDualStack(9777))
    );
}

/// Issue 39: a token sent in clear to a non-loopback consul got no word.
#[test]
fn a_token_going_in_clear_to_a_remote_consul_gets_one_warning() {
    let clear = |env: &[(&str, &str)]| {
        let c = ok(&[], env);
        c.warnings.iter().filter(|w| w.contains("in clear")).count()
    };
    let token = ("CONSUL_HTTP_TOKEN", "t0k3n");
    assert_eq!(clear(&[token, ("CONSUL_HTTP_ADDR", "10.0.0.5:8500")]), 1);
    assert_eq!(clear(&[token]), 0, "loopback");
    assert_eq!(
        clear(&[token, ("CONSUL_HTTP_ADDR", "unix:///run/consul.sock")]),
        0
    );
    assert_eq!(
        clear(&[("CONSUL_HTTP_ADDR", "10.0.0.5:8500")]),
        0,
        "no token"
    );
    assert_eq!(
        clear(&[token, ("CONSUL_HTTP_ADDR", "https://10.0.0.5:8501")]),
        0
    );
    let c = ok(&[], &[token, ("CONSUL_HTTP_ADDR", "10.0.0.5:8500")]);
    assert!(
        !c.warnings.iter().any(|w| w.contains("t0k3n")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn dev_mode_ignores_the_consul_client_environment() {
    let env = [
        ("CONSUL_CACERT", "/ca.pem"),
        ("CONSUL_HTTP_TOKEN", "secret"),
        ("CONSUL_NAMESPACE", "ns"),
    ];
    let c = ok(&["-dev"], &env);
    assert_eq!((c.consul.token, c.consul.namespace), (None, None));
    // ... but not when the agent watches a real consul.
    let e = err(&["-dev", "-consul-addr", "10.0.0.1:1"], &env);
    assert!(
        e.starts_with("invalid value \"/ca.pem\" for CONSUL_CACERT: cannot read"),
        "{e}"
    );
}

#[test]
fn dev_flag_and_variable_values() {
    for (a, want) in [
        (&["-dev"][..], true),
        (&["-dev=true"], true),
        (&["--dev=1"], true),
        (&["-dev=false"], false),
        (&["-dev=0"], false),
    ] {
        assert_eq!(ok(a, &[]).dev_kv_addr.is_some(), want, "{a:?}");
    }
    for (v, want) in [
        ("true", true),
        ("1", true),
        ("false", false),
        ("0", false),
        ("True", true),
    ] {
        assert_eq!(
            ok(&[], &[("GITLAB_HAPROXY_AGENT_DEV", v)])
                .dev_kv_addr
                .is_some(),
            want,
            "{v}"
        );
    }
}

#[test]
fn retarget_to_the_bound_dev_kv() {
    let mut c = ok(&["-dev", "-dev-kv-addr", "127.0.0.1:0"], &[]);
    assert!(c.consul_follows_dev_kv());
    c.consul.retarget(v4([0, 0, 0, 0], 40000));
    assert_eq!(c.consul.endpoint, tcp([127, 0, 0, 1], 40000));
    assert_eq!(c.consul.host_header, "127.0.0.1:40000");
}

fn consul_from_env(value: &str) -> Result<ConsulConfig, UsageError> {
    run(&[], &[("CONSUL_HTTP_ADDR", value)]).map(|c| c.consul)
}

#[test]
fn consul_address_forms() {
    let cases: &[(&str, ConsulEndpoint, &str, &str)] = &[
        (
            "10.1.2.3:8501",
            tcp([10, 1, 2, 3], 8501),
            "10.1.2.3:8501",
            "",
        ),
        (
            "http://10.1.2.3:8501",
            tcp([10, 1, 2, 3], 8501),
            "10.1.2.3:8501",
            "",
        ),
        (
            "HTTP://10.1.2.3:8501/",
            tcp([10, 1, 2, 3], 8501),
            "10.1.2.3:8501",
            "",
        ),
        (
            "http://10.1.2.3:8501/consul/",
            tcp([10, 1, 2, 3], 8501),
            "10.1.2.3:8501",
            "/consul",
        ),
        (
            "http://10.1.2.3:8501/a/b",
            tcp([10, 1, 2, 3], 8501),
            "10.1.2.3:8501",
            "/a/b",
        ),
        ("http://10.1.2.3", tcp([10, 1, 2, 3], 80), "10.1.2.3", ""),
        ("10.1.2.3", tcp([10, 1, 2, 3], 80), "10.1.2.3", ""),
        (
            "[::1]:8500",
            ConsulEndpoint::Tcp("[::1]:8500".parse().unwrap()),
            "[::1]:8500",
            "",
        ),
        (
            "http://[::1]:8500",
            ConsulEndpoint::Tcp("[::1]:8500".parse().unwrap()),
            "[::1]:8500",
            "",
        ),
        (
            "unix:///run/consul/consul.sock",
            ConsulEndpoint::Unix("/run/consul/consul.sock".into()),
            "localhost",
            "",
        ),
    ];
    for (addr, endpoint, host, prefix) in cases {
        for c in [
            consul_from_env(addr).expect(addr),
            ok(&["-consul-addr", addr], &[]).consul,
        ] {
            assert_eq!(&c.endpoint, endpoint, "{addr}");
            assert_eq!(c.host_header, *host, "{addr}");
            assert_eq!(c.path_prefix, *prefix, "{addr}");
        }
    }
    let c = consul_from_env("localhost:8500").expect("localhost");
    match c.endpoint {
        ConsulEndpoint::Tcp(a) => assert!(a.ip().is_loopback() && a.port() == 8500, "{a}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.host_header, "localhost:8500");
}

#[test]
fn bad_consul_addresses() {
    let cases: &[(&str, &str)] = &[
        ("ftp://x:1", "unknown protocol scheme \"ftp\""),
        ("unix://", "missing socket path"),
        ("http://", "missing host"),
        (":8500", "missing host"),
        ("h:1/x", "a path needs the http:// form"),
        ("http://h:1/?x=1", "a query or fragment is not allowed"),
        ("http://h:99999", "out of range"),
        ("1:2:3", "needs brackets"),
    ];
    for (addr, want) in cases {
        let e = consul_from_env(addr).expect_err(addr).0;
        assert!(
            e.starts_with(&format!("invalid value {addr:?} for CONSUL_HTTP_ADDR: ")),
            "{e}"
        );
        assert!(e.contains(want), "{addr}: {e}");
    }
    let e = consul_from_env("http://user:hunter2@h:1")
        .expect_err("userinfo")
        .0;
    assert!(
        e.starts_with("invalid value for CONSUL_HTTP_ADDR: credentials"),
        "{e}"
    );
    assert!(!e.contains("hunter2"), "{e}");
}

#[test]
fn token_file_beats_token() {
    let path = temp_file("token-beats", "  file-token\n");
    let c = ok(
        &[],
        &[
            ("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap()),
            ("CONSUL_HTTP_TOKEN", "env-token"),
        ],
    );
    assert_eq!(c.consul.token.as_deref(), Some("file-token"));
    let _ = std::fs::remove_file(path);
}

/// Issue 39: `/dev/zero` as the token file ran out of memory, a FIFO
/// blocked start-up, a world-writable token file got no word.
#[test]
fn a_token_file_is_read_only_as_a_small_regular_file_and_a_loose_mode_is_named() {
    use std::os::unix::fs::PermissionsExt;
    let e = err(&[], &[("CONSUL_HTTP_TOKEN_FILE", "/dev/zero")]);
    assert!(e.contains("\"/dev/zero\": not a regular file"), "{e}");
    let path = temp_file("token-mode", "tok\n");
    let file = ("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let c = ok(&[], &[file]);
    assert_eq!(c.consul.token.as_deref(), Some("tok"));
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("has mode 666"), "{:?}", c.warnings);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(ok(&[], &[file]).warnings.is_empty());
    std::fs::write(&path, vec![b'a'; 70_000]).unwrap();
    let e = err(&[], &[file]);
    assert!(e.contains("70000 bytes, more than 65536"), "{e}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn empty_token_file_is_ignored() {
    let path = temp_file("token-empty", " \n\t\n");
    let file = ("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap());
    assert_eq!(
        ok(&[], &[file, ("CONSUL_HTTP_TOKEN", "env-token")])
            .consul
            .token
            .as_deref(),
        Some("env-token")
    );
    let c = ok(&[], &[file]);
    assert_eq!(c.consul.token, None);
    assert_eq!(
        c.warnings,
        [format!(
            "CONSUL_HTTP_TOKEN_FILE {path:?} is empty: sending no ACL token"
        )]
    );
    assert_eq!(
        ok(&[], &[file, ("CONSUL_HTTP_TOKEN", "t")]).warnings,
        [format!(
            "CONSUL_HTTP_TOKEN_FILE {path:?} is empty: using CONSUL_HTTP_TOKEN"
        )]
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn unreadable_token_file_names_the_variable_not_the_token() {
    let e = err(
        &[],
        &[
            ("CONSUL_HTTP_TOKEN_FILE", "/nonexistent/gha-token"),
            ("CONSUL_HTTP_TOKEN", "s3cr3t-token"),
        ],
    );
    assert!(
        e.starts_with("CONSUL_HTTP_TOKEN_FILE: cannot read \"/nonexistent/gha-token\""),
        "{e}"
    );
    assert!(!e.contains("s3cr3t"), "{e}");
}

/// A directory standing in for systemd's `$CREDENTIALS_DIRECTORY`, with
/// these files; removed when dropped.
struct Credentials(PathBuf);

impl Credentials {
    fn new(tag: &str, files: &[(&str, &str)]) -> Credentials {
        let dir = std::env::temp_dir().join(format!("gha-creds-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        Credentials(dir)
    }

    fn var(&self) -> (&'static str, &str) {
        ("CREDENTIALS_DIRECTORY", self.0.to_str().unwrap())
    }
}

impl Drop for Credentials {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_consul_token_credential_is_the_token_when_none_is_given() {
    let creds = Credentials::new("token", &[("consul-token", "cred-token\n")]);
    assert_eq!(
        ok(&[], &[creds.var()]).consul.token.as_deref(),
        Some("cred-token")
    );
    // A token given otherwise wins, as a file or as a value.
    let path = temp_file("token-over-cred", "file-token");
    for (var, value, want) in [
        ("CONSUL_HTTP_TOKEN", "env-token", "env-token"),
        (
            "CONSUL_HTTP_TOKEN_FILE",
            path.to_str().unwrap(),
            "file-token",
        ),
    ] {
        let c = ok(&[], &[creds.var(), (var, value)]);
        assert_eq!(c.consul.token.as_deref(), Some(want), "{var}");
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_credentials_directory_without_the_token_sends_none() {
    let creds = Credentials::new("other", &[("something-else", "x")]);
    let c = ok(&[], &[creds.var()]);
    assert_eq!(c.consul.token, None);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn a_bad_token_credential_names_it_and_not_the_token() {
    let creds = Credentials::new("bad", &[("consul-token", "s3cr3t with space")]);
    let e = err(&[], &[creds.var()]);
    assert!(
        e.starts_with("CREDENTIALS_DIRECTORY credential consul-token: ") && !e.contains("s3cr3t"),
        "{e}"
    );
    let empty = Credentials::new("empty", &[("consul-token", "\n")]);
    let c = ok(&[], &[empty.var()]);
    assert_eq!(c.consul.token, None);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(
        c.warnings[0].starts_with("CREDENTIALS_DIRECTORY credential consul-token ")
            && c.warnings[0].ends_with("is empty: sending no ACL token"),
        "{:?}",
        c.warnings
    );
}

#[test]
fn tokens_are_trimmed_and_checked() {
    assert_eq!(
        ok(&[], &[("CONSUL_HTTP_TOKEN", " \tabc-123\n")])
            .consul
            .token
            .as_deref(),
        Some("abc-123")
    );
    assert_eq!(ok(&[], &[("CONSUL_HTTP_TOKEN", "   ")]).consul.token, None);
    let e = err(&[], &[("CONSUL_HTTP_TOKEN", "s3cr3t with space")]);
    assert!(
        e.starts_with("CONSUL_HTTP_TOKEN: ") && !e.contains("s3cr3t"),
        "{e}"
    );
    let path = temp_file("token-bad", "s3cr3t\r\nX-Evil: 1\n");
    let e = err(&[], &[("CONSUL_HTTP_TOKEN_FILE", path.to_str().unwrap())]);
    assert!(
        e.starts_with("CONSUL_HTTP_TOKEN_FILE: ") && !e.contains("s3cr3t"),
        "{e}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn basic_auth_is_base64() {
    let auth = |v: &str| ok(&[], &[("CONSUL_HTTP_AUTH", v)]).consul.basic_auth;
    assert_eq!(auth("user:pass").as_deref(), Some("dXNlcjpwYXNz"));
    assert_eq!(auth("user:pa:ss").as_deref(), Some("dXNlcjpwYTpzcw=="));
    // No ':' is a user without a password, as Go's client.
    assert_eq!(auth("user").as_deref(), Some("dXNlcjo="));
    assert_eq!(auth(""), None);
}

#[test]
fn namespace_and_partition_only_when_set() {
    let c = ok(
        &[],
        &[
            ("CONSUL_NAMESPACE", "team-a"),
            ("CONSUL_PARTITION", "part_1"),
        ],
    );
    assert_eq!(c.consul.namespace.as_deref(), Some("team-a"));
    assert_eq!(c.consul.partition.as_deref(), Some("part_1"));
    let c = ok(&[], &[("CONSUL_NAMESPACE", ""), ("CONSUL_PARTITION", "")]);
    assert_eq!((c.consul.namespace, c.consul.partition), (None, None));
    let e = err(&[], &[("CONSUL_NAMESPACE", "a&b")]);
    assert!(
        e.starts_with("invalid value \"a&b\" for CONSUL_NAMESPACE"),
        "{e}"
    );
    let e = err(&[], &[("CONSUL_PARTITION", "a b")]);
    assert!(
        e.starts_with("invalid value \"a b\" for CONSUL_PARTITION"),
        "{e}"
    );
}

#[test]
fn log_settings_from_the_environment() {
    let c = ok(
        &[],
        &[("GITLAB_LOG_FORMAT", "text"), ("GITLAB_LOG_LEVEL", "debug")],
    );
    assert_eq!(
        (c.log_format, c.log_level),
        (LogFormat::Text, log::LevelFilter::Debug)
    );
    for (v, want) in [
        ("trace", log::LevelFilter::Trace),
        ("info", log::LevelFilter::Info),
        ("WARN", log::LevelFilter::Warn),
        ("error", log::LevelFilter::Error),
    ] {
        assert_eq!(ok(&[], &[("GITLAB_LOG_LEVEL", v)]).log_level, want, "{v}");
    }
    assert_eq!(
        ok(&[], &[("GITLAB_LOG_FORMAT", "json")]).log_format,
        LogFormat::Json
    );
    assert_eq!(
        err(&[], &[("GITLAB_LOG_FORMAT", "xml")]),
        "invalid value \"xml\" for GITLAB_LOG_FORMAT: use json or text"
    );
    assert_eq!(
        err(&[], &[("GITLAB_LOG_LEVEL", "loud")]),
        "invalid value \"loud\" for GITLAB_LOG_LEVEL: use trace, debug, info, warn or error"
    );
}

#[test]
fn non_utf8_argument() {
    use std::os::unix::ffi::OsStringExt;
    let e = parse(vec![OsString::from_vec(vec![b'-', 0xff])], &env_of(&[]))
        .expect_err("non-UTF-8")
        .0;
    assert!(e.contains("not valid UTF-8"), "{e}");
}
