//! Certificates for the TLS unit tests, made fresh in memory by every run
//! (rcgen, ECDSA P-256 keys in PKCS#8): a CA, certificates it signs (for
//! names or IP addresses, current or long expired), and files holding them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate and its key.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap()
    }
}

/// A certificate authority.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// A certificate for `names` (DNS names or IP addresses); `expired`:
    /// valid only in January 2020.
    pub fn issue(&self, names: &[&str], expired: bool) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 2);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A rustls server presenting `leaf`; with `clients`, it requires a
    /// client certificate signed by that CA.
    pub fn server(leaf: &Issued, clients: Option<&Ca>) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match clients {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.der()).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        };
        Arc::new(builder.with_single_cert(leaf.chain(), leaf.key()).unwrap())
    }
}

/// Writes `contents` to a fresh file in the temp dir.
pub fn file(name: &str, contents: &[u8]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "gha-pki-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, contents).unwrap();
    path
}
