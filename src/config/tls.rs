//! TLS to consul: the `-consul-*` TLS settings (else consul's own
//! `CONSUL_*` variables, as for the address) -> a rustls client
//! configuration, built once at start.
//!
//! In: step one's raw settings, and the parsed consul address (whether its
//! scheme is `https`, its host). Out: [`ConsulTls`] (or `None`: plain
//! HTTP), warnings for `main` to log, or the first error, one line naming
//! the setting. IO, all here and only at start: the CA file, the CA
//! directory (walked), the client certificate and key, and, when TLS is on
//! and verifies with no CA given, the system's roots (rustls-native-certs:
//! `SSL_CERT_FILE`/`SSL_CERT_DIR`, else the distribution's bundle).
//!
//! Always holds:
//! - a file that is named is read and checked even when the connection
//!   stays plain (as consul's Go client does), so a bad file fails now and
//!   not the day https is turned on;
//! - a client certificate needs its key and the key must match it;
//! - TLS with verification off is a warning naming the risk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::addr::{split_host_port, ConsulAddr};
use super::check::{boolean, credential, usage_error, UsageError};
use super::flags::{Flag, LowArgs, Raw};
use crate::gocompat::parse_go_bool;

/// TLS to consul, ready to connect with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulTls {
    /// The name consul's certificate is checked against (an IP address is
    /// checked as an IP SAN); also sent as SNI when it is a DNS name.
    pub server_name: ServerName<'static>,
    /// Whether consul's certificate chain and name are verified.
    pub verify: bool,
    /// Where the trusted roots come from, for the start-up log.
    pub roots: String,
    /// The client certificate file, when one is presented.
    pub client_cert: Option<String>,
    pub config: SharedConfig,
}

/// The rustls configuration, shared by every connection (and its session
/// cache, so a reconnect resumes the session). Equal only to itself.
#[derive(Debug, Clone)]
pub struct SharedConfig(pub Arc<rustls::ClientConfig>);

impl PartialEq for SharedConfig {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedConfig {}

/// The TLS settings as given: each flag (or its variable), else consul's
/// variable.
struct Settings {
    https: bool,
    verify: bool,
    ca_cert: Option<Raw>,
    ca_path: Option<Raw>,
    client_cert: Option<Raw>,
    client_key: Option<Raw>,
    server_name: Option<Raw>,
}

/// The flag (or its `GITLAB_HAPROXY_AGENT_*` variable), else consul's own
/// variable: the address's precedence.
fn pick(flag: &Flag, consul_var: &Option<Raw>) -> Option<Raw> {
    flag.explicit().or(consul_var.as_ref()).cloned()
}

/// A bool setting: the flag or its variable must be a bool; consul's
/// variable, unparsable, is passed over with a warning (as Go's client
/// does), leaving the default.
fn pick_bool(
    flag: &Flag,
    consul_var: &Option<Raw>,
    warnings: &mut Vec<String>,
) -> Result<bool, UsageError> {
    if let Some(raw) = flag.explicit() {
        return boolean(raw);
    }
    let default = boolean(&flag.value())?;
    let Some(raw) = consul_var else {
        return Ok(default);
    };
    Ok(parse_go_bool(&raw.value).unwrap_or_else(|| {
        warnings.push(format!(
            "{}={:?} is not a boolean: ignored (as consul's client does), {default} taken",
            raw.source, raw.value
        ));
        default
    }))
}

impl Settings {
    fn pick(low: &LowArgs, warnings: &mut Vec<String>) -> Result<Settings, UsageError> {
        Ok(Settings {
            https: pick_bool(&low.consul_http_ssl, &low.consul_http_ssl_env, warnings)?,
            verify: pick_bool(
                &low.consul_http_ssl_verify,
                &low.consul_http_ssl_verify_env,
                warnings,
            )?,
            ca_cert: pick(&low.consul_ca_cert, &low.consul_cacert_env),
            ca_path: pick(&low.consul_ca_path, &low.consul_capath_env),
            client_cert: pick(&low.consul_client_cert, &low.consul_client_cert_env)
                .or_else(|| credential(low, "consul-client-cert")),
            client_key: pick(&low.consul_client_key, &low.consul_client_key_env)
                .or_else(|| credential(low, "consul-client-key")),
            server_name: pick(&low.consul_tls_server_name, &low.consul_tls_server_name_env),
        })
    }

    /// The first TLS setting given, for the warning when TLS is off.
    fn first_given(&self) -> Option<&Raw> {
        [
            &self.ca_cert,
            &self.ca_path,
            &self.client_cert,
            &self.client_key,
            &self.server_name,
        ]
        .into_iter()
        .flatten()
        .next()
    }
}

/// The TLS configuration for the consul at `addr`, or `None` for plain
/// HTTP: TLS is on for an `https://` address or `-consul-http-ssl` /
/// `CONSUL_HTTP_SSL` true (which an explicit `http://` does not undo, as
/// in Go's client).
pub(super) fn consul_tls(
    low: &LowArgs,
    addr: &ConsulAddr,
    warnings: &mut Vec<String>,
) -> Result<Option<ConsulTls>, UsageError> {
    let s = Settings::pick(low, warnings)?;
    let on = addr.https || s.https;
    let client = client_auth(&s)?;
    let (roots, roots_from) = roots(&s, on && s.verify)?;
    if !on {
        if let Some(raw) = s.first_given() {
            warnings.push(format!(
                "{} is set, but consul is reached over plain HTTP: not used (use an https:// address or CONSUL_HTTP_SSL=true)",
                raw.source
            ));
        }
        return Ok(None);
    }
    let server_name = server_name(&s, addr)?;
    if !s.verify {
        warnings.push(format!(
            "consul's TLS certificate is not verified (CONSUL_HTTP_SSL_VERIFY=false or -consul-http-ssl-verify=false): anyone on the path to {} can pose as consul and set every server's state; give consul's CA instead (-consul-ca-cert)",
            addr.host
        ));
    }
    let config = client_config(roots, s.verify, client.as_ref().map(|c| &c.0))?;
    Ok(Some(ConsulTls {
        server_name,
        verify: s.verify,
        roots: if s.verify {
            roots_from
        } else {
            "none: verification off".into()
        },
        client_cert: client.map(|c| c.1),
        config: SharedConfig(Arc::new(config)),
    }))
}

/// `CONSUL_TLS_SERVER_NAME` (any port dropped, as Go's client does), else
/// the address's host.
fn server_name(s: &Settings, addr: &ConsulAddr) -> Result<ServerName<'static>, UsageError> {
    let (text, raw) = match &s.server_name {
        Some(raw) => {
            let host = split_host_port(&raw.value).map_err(|e| raw.invalid(e))?.0;
            (host.to_owned(), Some(raw))
        }
        None => (addr.host.clone(), None),
    };
    ServerName::try_from(text.clone()).map_err(|_| {
        let why = "not a DNS name or IP address to check consul's certificate against";
        match raw {
            Some(raw) => raw.invalid(why),
            None => usage_error(format!("consul address host {text:?}: {why}")),
        }
    })
}

/// A client certificate chain and key, both or neither.
type ClientAuth = (
    (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
    String,
);

fn client_auth(s: &Settings) -> Result<Option<ClientAuth>, UsageError> {
    let (cert, key) = match (&s.client_cert, &s.client_key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some(one), None) | (None, Some(one)) => {
            return Err(usage_error(format!(
                "{} is set without its pair: a client certificate needs its key (-consul-client-cert and -consul-client-key, or CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY)",
                one.source
            )))
        }
    };
    let chain = certificates(cert, &read(cert, Path::new(&cert.value))?)?;
    let bytes = read(key, Path::new(&key.value))?;
    let der = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound if contains(&bytes, b"ENCRYPTED PRIVATE KEY") => {
            key.invalid("the key is encrypted: give it unencrypted (openssl pkey -in KEY -out KEY.plain)")
        }
        pem::Error::NoItemsFound => {
            key.invalid("holds no PEM private key (PKCS#8 \"PRIVATE KEY\", PKCS#1 \"RSA PRIVATE KEY\" or SEC1 \"EC PRIVATE KEY\")")
        }
        e => key.invalid(format!("bad PEM: {e}")),
    })?;
    Ok(Some(((chain, der), cert.value.clone())))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The file's bytes (IO).
fn read(raw: &Raw, path: &Path) -> Result<Vec<u8>, UsageError> {
    crate::files::read_regular(path, crate::files::MAX_PEM_BYTES)
        .map_err(|e| raw.invalid(format!("cannot read {}: {e}", path.display())))
}

/// Every PEM certificate in `bytes` (read from `raw`'s file); at least one.
fn certificates(raw: &Raw, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, UsageError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| raw.invalid(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(raw.invalid("holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    Ok(certs)
}

/// The trusted roots: the CA file, else the CA directory, else (only when
/// `system`: TLS on and verifying) the system's; with a description.
fn roots(s: &Settings, system: bool) -> Result<(RootCertStore, String), UsageError> {
    let mut store = RootCertStore::empty();
    if let Some(raw) = &s.ca_cert {
        let certs = certificates(raw, &read(raw, Path::new(&raw.value))?)?;
        add_all(&mut store, raw, &raw.value, certs)?;
        return Ok((store, format!("{} {}", raw.source, raw.value)));
    }
    if let Some(raw) = &s.ca_path {
        let files = ca_dir_files(raw, Path::new(&raw.value))?;
        if files.is_empty() {
            return Err(raw.invalid("the directory holds no CA file"));
        }
        for file in &files {
            let certs = certificates(raw, &read(raw, file)?)
                .map_err(|e| usage_error(format!("{e} (in {})", file.display())))?;
            add_all(&mut store, raw, &file.display().to_string(), certs)?;
        }
        return Ok((store, format!("{} {}", raw.source, raw.value)));
    }
    if system {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found.errors.first().map(ToString::to_string);
            return Err(usage_error(format!(
                "no CA certificate given and none found in the system's store ({}): install ca-certificates, set SSL_CERT_FILE, or give -consul-ca-cert",
                why.as_deref().unwrap_or("it is empty")
            )));
        }
        return Ok((store, format!("the system's roots ({added} certificates)")));
    }
    Ok((store, String::new()))
}

fn add_all(
    store: &mut RootCertStore,
    raw: &Raw,
    file: &str,
    certs: Vec<CertificateDer<'static>>,
) -> Result<(), UsageError> {
    for (i, cert) in certs.into_iter().enumerate() {
        store.add(cert).map_err(|e| {
            raw.invalid(format!(
                "certificate {} in {file} is not a usable CA: {e}",
                i + 1
            ))
        })?;
    }
    Ok(())
}

/// Every file under `dir`, walked as Go's `filepath.Walk` does for
/// consul's `CAPath` (subdirectories too, a symlink read as what it points
/// to), in name order (IO).
fn ca_dir_files(raw: &Raw, dir: &Path) -> Result<Vec<PathBuf>, UsageError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| raw.invalid(format!("cannot read directory {}: {e}", dir.display())))?;
    let mut paths = entries
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| raw.invalid(format!("cannot read directory {}: {e}", dir.display())))?;
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if is_dir {
            files.extend(ca_dir_files(raw, &path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

/// The rustls configuration: the ring provider, TLS 1.2 and 1.3, the
/// roots (or no verification), the client certificate if any.
fn client_config(
    roots: RootCertStore,
    verify: bool,
    client: Option<&(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<rustls::ClientConfig, UsageError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| usage_error(format!("TLS setup: {e}")))?;
    let builder = if verify {
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(
                provider.signature_verification_algorithms,
            )))
    };
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => usage_error(
                    "the client key does not match the client certificate (-consul-client-key / CONSUL_CLIENT_KEY against -consul-client-cert / CONSUL_CLIENT_CERT)",
                ),
                e => usage_error(format!("the client certificate or key is not usable: {e}")),
            }),
    }
}

/// `CONSUL_HTTP_SSL_VERIFY=false`: any certificate for any name is taken,
/// as Go's `InsecureSkipVerify`; the handshake's signatures are still
/// checked (so the peer holds the key of the certificate it sent).
#[derive(Debug)]
struct NoVerification(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}
