//! The consul TLS settings through [`parse`]: which settings turn TLS on,
//! the precedence of flag, `GITLAB_HAPROXY_AGENT_*` and `CONSUL_*`, the
//! name checked, and every bad input refused with one line.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;

use rustls_pki_types::ServerName;

use super::*;
use crate::testpki::{file, Ca};

/// The variables of the TLS flags (the table test checks every flag has
/// one).
pub(super) const TLS_FLAG_VARIABLES: &[&str] = &[
    "GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL",
    "GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL_VERIFY",
    "GITLAB_HAPROXY_AGENT_CONSUL_CA_CERT",
    "GITLAB_HAPROXY_AGENT_CONSUL_CA_PATH",
    "GITLAB_HAPROXY_AGENT_CONSUL_CLIENT_CERT",
    "GITLAB_HAPROXY_AGENT_CONSUL_CLIENT_KEY",
    "GITLAB_HAPROXY_AGENT_CONSUL_TLS_SERVER_NAME",
];

fn run(a: &[&str], env: &[(&str, &str)]) -> Result<Config, UsageError> {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args = a.iter().map(OsString::from).collect();
    match parse(args, &|k| map.get(k).cloned())? {
        Command::Run(config) => Ok(*config),
        other => panic!("expected Run, got {other:?}"),
    }
}

fn ok(a: &[&str], env: &[(&str, &str)]) -> Config {
    run(a, env).unwrap_or_else(|e| panic!("{a:?} {env:?}: {e}"))
}

fn tls(a: &[&str], env: &[(&str, &str)]) -> ConsulTls {
    ok(a, env).consul.tls.expect("TLS on")
}

fn err(a: &[&str], env: &[(&str, &str)]) -> String {
    let e = run(a, env).expect_err("expected a usage error").0;
    assert!(!e.contains('\n'), "error is not one line: {e:?}");
    e
}

fn name(s: &str) -> ServerName<'static> {
    ServerName::try_from(s.to_owned()).unwrap()
}

/// Files of one PKI: a CA, a client certificate and its key.
struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Files {
    fn new() -> Files {
        let ca = Ca::new("ca");
        let client = ca.issue(&["agent"], false);
        Files {
            ca: file("ca.pem", ca.pem().as_bytes()),
            cert: file("cert.pem", client.cert_pem.as_bytes()),
            key: file("key.pem", client.key_pem.as_bytes()),
        }
    }

    fn ca(&self) -> &str {
        self.ca.to_str().unwrap()
    }
}

#[test]
fn an_https_address_turns_tls_on_and_its_host_is_the_name_checked() {
    let f = Files::new();
    let ca = ("CONSUL_CACERT", f.ca());
    let cases = [
        ("https://127.0.0.1:8501", "127.0.0.1:8501", "127.0.0.1"),
        ("HTTPS://localhost", "127.0.0.1:443", "localhost"),
        ("https://[::1]:8501/consul/", "[::1]:8501", "::1"),
    ];
    for (addr, endpoint, host) in cases {
        let c = ok(&[], &[("CONSUL_HTTP_ADDR", addr), ca]);
        assert_eq!(
            c.consul.endpoint,
            ConsulEndpoint::Tcp(endpoint.parse().unwrap()),
            "{addr}"
        );
        let t = c.consul.tls.expect(addr);
        assert_eq!(t.server_name, name(host), "{addr}");
        assert!(t.verify);
        assert_eq!(t.roots, format!("CONSUL_CACERT {}", f.ca()));
        let flag = tls(&["-consul-addr", addr], &[ca]);
        assert_eq!(flag.server_name, name(host), "{addr}");
    }
    let c = ok(
        &[],
        &[("CONSUL_HTTP_ADDR", "https://[::1]:8501/consul/"), ca],
    );
    assert_eq!(c.consul.path_prefix, "/consul");
    assert_eq!(c.consul.host_header, "[::1]:8501");
}

#[test]
fn consul_http_ssl_turns_tls_on_and_http_does_not_undo_it() {
    let f = Files::new();
    let ca = ("CONSUL_CACERT", f.ca());
    for addr in ["10.0.0.1:8501", "http://10.0.0.1:8501"] {
        for v in ["1", "t", "TRUE", "true"] {
            let t = tls(
                &[],
                &[("CONSUL_HTTP_ADDR", addr), ("CONSUL_HTTP_SSL", v), ca],
            );
            assert_eq!(t.server_name, name("10.0.0.1"), "{addr} {v}");
        }
        let t = tls(&["-consul-addr", addr, "-consul-http-ssl"], &[ca]);
        assert_eq!(t.server_name, name("10.0.0.1"));
    }
    // A unix socket under TLS checks `localhost`, its Host header.
    let t = tls(
        &[
            "-consul-addr",
            "unix:///run/consul.sock",
            "-consul-http-ssl",
        ],
        &[ca],
    );
    assert_eq!(t.server_name, name("localhost"));
    for v in ["0", "false", "F"] {
        let c = ok(&[], &[("CONSUL_HTTP_SSL", v)]);
        assert_eq!(c.consul.tls, None, "{v}");
    }
    // Go's client warns about a value it cannot parse and leaves TLS off.
    let c = ok(&[], &[("CONSUL_HTTP_SSL", "yes")]);
    assert_eq!(c.consul.tls, None);
    assert!(
        c.warnings[0].starts_with("CONSUL_HTTP_SSL=\"yes\" is not a boolean"),
        "{:?}",
        c.warnings
    );
    // Our own flag and variable must be booleans.
    let e = err(&[], &[("GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL", "yes")]);
    assert!(e.contains("GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL"), "{e}");
    // An explicit -consul-http-ssl=false does not undo https://.
    let t = tls(
        &[
            "-consul-addr",
            "https://10.0.0.1:1",
            "-consul-http-ssl=false",
        ],
        &[ca],
    );
    assert!(t.verify);
}

/// Flag, then `GITLAB_HAPROXY_AGENT_*`, then `CONSUL_*`: as the address.
#[test]
fn each_setting_takes_flag_then_our_variable_then_consuls() {
    let (a, b, c) = (Files::new(), Files::new(), Files::new());
    let https = ("CONSUL_HTTP_ADDR", "https://10.0.0.1:8501");
    let names = [
        ("-consul-tls-server-name=flag.test", "flag.test"),
        ("", "ours.test"),
    ];
    let env = [
        https,
        ("CONSUL_CACERT", c.ca()),
        ("CONSUL_TLS_SERVER_NAME", "consul.test:8501"),
        ("GITLAB_HAPROXY_AGENT_CONSUL_CA_CERT", b.ca()),
        ("GITLAB_HAPROXY_AGENT_CONSUL_TLS_SERVER_NAME", "ours.test"),
    ];
    for (flag, want) in names {
        let mut args = vec!["-consul-ca-cert", a.ca()];
        if !flag.is_empty() {
            args.push(flag);
        }
        let t = tls(&args, &env);
        assert_eq!(t.server_name, name(want));
        assert_eq!(t.roots, format!("flag -consul-ca-cert {}", a.ca()));
    }
    let t = tls(&[], &env);
    assert_eq!(
        t.roots,
        format!("GITLAB_HAPROXY_AGENT_CONSUL_CA_CERT {}", b.ca())
    );
    // consul's own variables alone; a port on the name is dropped.
    let t = tls(&[], &env[..3]);
    assert_eq!(t.roots, format!("CONSUL_CACERT {}", c.ca()));
    assert_eq!(t.server_name, name("consul.test"));
    // Verification off: the flag beats CONSUL_HTTP_SSL_VERIFY both ways.
    let off = ("CONSUL_HTTP_SSL_VERIFY", "false");
    assert!(!tls(&[], &[https, off]).verify);
    assert!(tls(&["-consul-http-ssl-verify"], &[https, off, env[1]]).verify);
    let t = tls(&["-consul-http-ssl-verify=false"], &[https, env[1]]);
    assert!(!t.verify);
    assert_eq!(t.roots, "none: verification off");
}

#[test]
fn verification_off_is_a_warning_naming_the_risk() {
    let c = ok(
        &[],
        &[
            ("CONSUL_HTTP_ADDR", "https://localhost:8501"),
            ("CONSUL_HTTP_SSL_VERIFY", "false"),
        ],
    );
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    let w = &c.warnings[0];
    assert!(
        w.starts_with("consul's TLS certificate is not verified")
            && w.contains("localhost can pose as consul and set every server's state"),
        "{w}"
    );
}

#[test]
fn a_client_certificate_is_presented_when_both_files_are_given() {
    let f = Files::new();
    let t = tls(
        &[],
        &[
            ("CONSUL_HTTP_ADDR", "https://10.0.0.1:8501"),
            ("CONSUL_CACERT", f.ca()),
            ("CONSUL_CLIENT_CERT", f.cert.to_str().unwrap()),
            ("CONSUL_CLIENT_KEY", f.key.to_str().unwrap()),
        ],
    );
    assert_eq!(t.client_cert.as_deref(), f.cert.to_str());
    assert!(t.config.0.client_auth_cert_resolver.has_certs());
}

/// systemd's `LoadCredential=consul-client-cert:…` and `…key:…`: the pair
/// in `$CREDENTIALS_DIRECTORY` is presented when none is given otherwise;
/// one given otherwise wins; one of the pair alone is refused, naming it.
#[test]
fn the_client_certificate_credentials_are_presented_when_none_is_given() {
    let f = Files::new();
    let dir = file("credentials", b"");
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&f.cert, dir.join("consul-client-cert")).unwrap();
    std::fs::copy(&f.key, dir.join("consul-client-key")).unwrap();
    let creds = ("CREDENTIALS_DIRECTORY", dir.to_str().unwrap());
    let https = ("CONSUL_HTTP_ADDR", "https://10.0.0.1:8501");
    let t = tls(&[], &[https, ("CONSUL_CACERT", f.ca()), creds]);
    let cert = dir.join("consul-client-cert");
    assert_eq!(t.client_cert.as_deref(), cert.to_str());
    assert!(t.config.0.client_auth_cert_resolver.has_certs());

    let other = Files::new();
    let t = tls(
        &[],
        &[
            https,
            ("CONSUL_CACERT", f.ca()),
            ("CONSUL_CLIENT_CERT", other.cert.to_str().unwrap()),
            ("CONSUL_CLIENT_KEY", other.key.to_str().unwrap()),
            creds,
        ],
    );
    assert_eq!(t.client_cert.as_deref(), other.cert.to_str());

    std::fs::remove_file(dir.join("consul-client-key")).unwrap();
    let e = err(&[], &[https, ("CONSUL_CACERT", f.ca()), creds]);
    assert!(
        e.starts_with(
            "CREDENTIALS_DIRECTORY credential consul-client-cert is set without its pair"
        ),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_ca_directory_is_walked_with_its_subdirectories() {
    let dir = file("capath", b"");
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("a.pem"), Ca::new("a").pem()).unwrap();
    std::fs::write(dir.join("sub/b.crt"), Ca::new("b").pem()).unwrap();
    let d = dir.to_str().unwrap();
    let t = tls(
        &["-consul-addr", "https://10.0.0.1:1", "-consul-ca-path", d],
        &[],
    );
    assert_eq!(t.roots, format!("flag -consul-ca-path {d}"));
    // The CA file wins over the directory, as in Go's client.
    let f = Files::new();
    let t = tls(
        &["-consul-addr", "https://10.0.0.1:1", "-consul-ca-path", d],
        &[("CONSUL_CACERT", f.ca())],
    );
    assert_eq!(t.roots, format!("CONSUL_CACERT {}", f.ca()));
    // A file that is not PEM in it is refused, naming the file.
    std::fs::write(dir.join("sub/readme.txt"), "hello").unwrap();
    let e = err(
        &["-consul-addr", "https://10.0.0.1:1", "-consul-ca-path", d],
        &[],
    );
    assert!(
        e.contains("holds no PEM certificate") && e.contains("readme.txt"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Each bad input: exit 2 with one line naming the setting and the cause.
#[test]
fn bad_tls_input_is_one_line_naming_the_setting() {
    let f = Files::new();
    let other = Files::new();
    let not_pem = file("not.pem", b"this is not a certificate\n");
    let empty_dir = file("empty-dir", b"");
    std::fs::remove_file(&empty_dir).unwrap();
    std::fs::create_dir(&empty_dir).unwrap();
    let encrypted = file(
        "enc.pem",
        b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
    );
    let p = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let (ca, cert, key) = (p(&f.ca), p(&f.cert), p(&f.key));
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        (
            vec![("CONSUL_CACERT", "/nonexistent/ca.pem".into())],
            "invalid value \"/nonexistent/ca.pem\" for CONSUL_CACERT: cannot read /nonexistent/ca.pem: No such file",
        ),
        (
            vec![("CONSUL_CACERT", p(&not_pem))],
            "for CONSUL_CACERT: holds no PEM certificate",
        ),
        (
            vec![("CONSUL_CAPATH", p(&empty_dir))],
            "for CONSUL_CAPATH: the directory holds no CA file",
        ),
        (
            vec![("CONSUL_CAPATH", "/nonexistent".into())],
            "for CONSUL_CAPATH: cannot read directory /nonexistent",
        ),
        (
            vec![("CONSUL_CLIENT_CERT", cert.clone())],
            "CONSUL_CLIENT_CERT is set without its pair",
        ),
        (
            vec![("CONSUL_CLIENT_KEY", key.clone())],
            "CONSUL_CLIENT_KEY is set without its pair",
        ),
        (
            vec![
                ("CONSUL_CLIENT_CERT", cert.clone()),
                ("CONSUL_CLIENT_KEY", p(&other.key)),
            ],
            "the client key does not match the client certificate",
        ),
        (
            vec![
                ("CONSUL_CLIENT_CERT", p(&not_pem)),
                ("CONSUL_CLIENT_KEY", key.clone()),
            ],
            "for CONSUL_CLIENT_CERT: holds no PEM certificate",
        ),
        (
            vec![
                ("CONSUL_CLIENT_CERT", cert.clone()),
                ("CONSUL_CLIENT_KEY", p(&not_pem)),
            ],
            "for CONSUL_CLIENT_KEY: holds no PEM private key (PKCS#8",
        ),
        (
            vec![
                ("CONSUL_CLIENT_CERT", cert.clone()),
                ("CONSUL_CLIENT_KEY", ca.clone()),
            ],
            "for CONSUL_CLIENT_KEY: holds no PEM private key",
        ),
        (
            vec![
                ("CONSUL_CLIENT_CERT", cert.clone()),
                ("CONSUL_CLIENT_KEY", p(&encrypted)),
            ],
            "the key is encrypted",
        ),
        (
            vec![("CONSUL_TLS_SERVER_NAME", "bad name!".into())],
            "for CONSUL_TLS_SERVER_NAME: not a DNS name or IP address",
        ),
    ];
    for (vars, want) in cases {
        let mut env: Vec<(&str, &str)> = vec![("CONSUL_HTTP_ADDR", "https://10.0.0.1:8501")];
        if !vars.iter().any(|(k, _)| k.starts_with("CONSUL_CA")) {
            env.push(("CONSUL_CACERT", &ca));
        }
        env.extend(vars.iter().map(|(k, v)| (*k, v.as_str())));
        let e = err(&[], &env);
        assert!(e.contains(want), "{vars:?}: {e}");
    }
    let _ = std::fs::remove_dir(empty_dir);
}

/// Settings for TLS with a plain connection: still read and checked (as
/// consul's Go client does), and a warning says they are not used.
#[test]
fn tls_settings_over_plain_http_are_checked_and_warned_about() {
    let f = Files::new();
    let c = ok(&[], &[("CONSUL_CACERT", f.ca())]);
    assert_eq!(c.consul.tls, None);
    assert!(
        c.warnings[0].starts_with("CONSUL_CACERT is set, but consul is reached over plain HTTP"),
        "{:?}",
        c.warnings
    );
    let e = err(&[], &[("CONSUL_CACERT", "/nonexistent")]);
    assert!(e.contains("cannot read"), "{e}");
}

#[test]
fn dev_mode_refuses_tls_flags_and_ignores_consuls_variables() {
    let f = Files::new();
    let e = err(&["-dev", "-consul-ca-cert", f.ca()], &[]);
    assert!(
        e.starts_with(
            "flag -consul-ca-cert is set, but with -dev the agent watches its own plain-HTTP KV"
        ),
        "{e}"
    );
    let e = err(
        &["-dev"],
        &[("GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL", "true")],
    );
    assert!(
        e.starts_with("GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL is set"),
        "{e}"
    );
    let c = ok(
        &["-dev"],
        &[("CONSUL_HTTP_SSL", "true"), ("CONSUL_CACERT", "/x")],
    );
    assert_eq!(c.consul.tls, None);
    // With -consul-addr the dev KV is not watched: the flags apply.
    let t = tls(
        &[
            "-dev",
            "-consul-addr",
            "https://10.0.0.1:1",
            "-consul-ca-cert",
            f.ca(),
        ],
        &[],
    );
    assert_eq!(t.server_name, name("10.0.0.1"));
}
