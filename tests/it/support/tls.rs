//! TLS for the integration tests: certificates made by the `openssl` CLI
//! (CAs, server and client certificates, keys in PKCS#8, PKCS#1 or SEC1,
//! an expired certificate) and a real haproxy terminating TLS in front of
//! a plain KV (`bind … ssl crt … [verify required ca-file …]`, `mode
//! tcp`): a TLS server nobody here wrote.
//!
//! Each [`Pki`] owns a temp dir, removed when dropped; each [`TlsFront`]
//! an haproxy process (killed by PID when dropped) and its config file.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::haproxy::haproxy_bin;
use super::{free_port, wait_for, Proc};

/// Runs `openssl` with `args` in `dir`; panics with its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl not found ({e}): apt-get install -y openssl"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How a key is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// EC P-256, `PRIVATE KEY`.
    Pkcs8,
    /// RSA 2048, `RSA PRIVATE KEY`.
    Pkcs1,
    /// EC P-256, `EC PRIVATE KEY`.
    Sec1,
}

/// A certificate file and its key file.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Issued {
    pub fn cert(&self) -> &str {
        self.cert.to_str().unwrap()
    }

    pub fn key(&self) -> &str {
        self.key.to_str().unwrap()
    }

    /// Certificate then key in one file, as haproxy's `crt` takes them.
    pub fn bundle(&self) -> PathBuf {
        let path = self.cert.with_extension("bundle.pem");
        let mut pem = std::fs::read(&self.cert).unwrap();
        pem.extend(std::fs::read(&self.key).unwrap());
        std::fs::write(&path, pem).unwrap();
        path
    }
}

/// A temp dir of certificates: CA `ca` (the trusted one) and CA `other`.
pub struct Pki {
    pub dir: PathBuf,
    n: AtomicUsize,
}

impl Pki {
    pub fn new(test: &str) -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gha-pki-{}-{}-{test}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("db")).unwrap();
        std::fs::write(dir.join("db/index.txt"), "").unwrap();
        std::fs::write(dir.join("db/serial"), "01\n").unwrap();
        std::fs::write(dir.join("ca.cnf"), CA_CNF).unwrap();
        let pki = Pki {
            dir,
            n: AtomicUsize::new(0),
        };
        for ca in ["ca", "other"] {
            openssl(
                &pki.dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                    "-nodes",
                    "-days",
                    "3650",
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.pem"),
                    "-subj",
                    &format!("/CN=test {ca}"),
                ],
            );
        }
        pki
    }

    /// A CA's certificate file: `ca` or `other`.
    pub fn ca(&self, ca: &str) -> String {
        self.dir
            .join(format!("{ca}.pem"))
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// A certificate signed by CA `ca` for `sans` (`DNS:x`, `IP:1.2.3.4`),
    /// its key of `kind`; `expired`: valid only on 1 January 2020.
    pub fn issue(&self, ca: &str, sans: &str, kind: KeyKind, expired: bool) -> Issued {
        let n = self.n.fetch_add(1, Ordering::Relaxed);
        let (key, csr, cert, ext) = (
            format!("c{n}.key"),
            format!("c{n}.csr"),
            format!("c{n}.pem"),
            format!("c{n}.ext"),
        );
        let d = &self.dir;
        match kind {
            KeyKind::Pkcs8 => openssl(
                d,
                &[
                    "genpkey",
                    "-algorithm",
                    "EC",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                    "-out",
                    &key,
                ],
            ),
            KeyKind::Pkcs1 => openssl(d, &["genrsa", "-traditional", "-out", &key, "2048"]),
            KeyKind::Sec1 => openssl(
                d,
                &[
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    &key,
                ],
            ),
        }
        openssl(
            d,
            &[
                "req", "-new", "-key", &key, "-out", &csr, "-subj", "/CN=test",
            ],
        );
        std::fs::write(d.join(&ext), format!("subjectAltName={sans}\n")).unwrap();
        let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
        if expired {
            openssl(
                d,
                &[
                    "ca",
                    "-batch",
                    "-config",
                    "ca.cnf",
                    "-cert",
                    &ca_pem,
                    "-keyfile",
                    &ca_key,
                    "-in",
                    &csr,
                    "-out",
                    &cert,
                    "-notext",
                    "-extfile",
                    &ext,
                    "-startdate",
                    "20200101000000Z",
                    "-enddate",
                    "20200102000000Z",
                ],
            );
        } else {
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_pem,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-days",
                    "365",
                    "-extfile",
                    &ext,
                    "-out",
                    &cert,
                ],
            );
        }
        let head = std::fs::read_to_string(d.join(&key)).unwrap();
        let want = match kind {
            KeyKind::Pkcs8 => "-----BEGIN PRIVATE KEY-----",
            KeyKind::Pkcs1 => "-----BEGIN RSA PRIVATE KEY-----",
            KeyKind::Sec1 => "-----BEGIN EC PRIVATE KEY-----",
        };
        assert!(head.starts_with(want), "{kind:?} key: {head}");
        Issued {
            cert: d.join(cert),
            key: d.join(key),
        }
    }

    /// A file in the PKI's dir.
    pub fn file(&self, name: &str, contents: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `openssl ca`, only for the expired certificate's dates.
const CA_CNF: &str = "[ca]\ndefault_ca = d\n[d]\ndatabase = db/index.txt\nserial = db/serial\nnew_certs_dir = db\ndefault_md = sha256\npolicy = p\nunique_subject = no\n[p]\ncommonName = supplied\n";

/// haproxy terminating TLS on `127.0.0.1:<port>` (or a unix socket) in
/// front of a plain upstream.
pub struct TlsFront {
    /// The TCP address (`None` on a unix socket).
    pub addr: Option<SocketAddr>,
    proc: Proc,
    dir: PathBuf,
}

impl TlsFront {
    /// Serves `server` (certificate and key) on a free port; with
    /// `client_ca`, requires a client certificate signed by it.
    pub fn start(upstream: SocketAddr, server: &Issued, client_ca: Option<&str>) -> TlsFront {
        TlsFront::start_at(free_port(), upstream, server, client_ca)
    }

    /// The same on a given port (to restart it with another certificate).
    pub fn start_at(
        port: u16,
        upstream: SocketAddr,
        server: &Issued,
        client_ca: Option<&str>,
    ) -> TlsFront {
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut front = TlsFront::spawn(&addr.to_string(), upstream, Some(server), client_ca);
        front.addr = Some(addr);
        front.wait_until(|| TcpStream::connect(addr).is_ok());
        front
    }

    /// The same haproxy, port and upstream without TLS (`mode tcp`): the
    /// plaintext twin of a [`TlsFront::start`].
    pub fn plain(upstream: SocketAddr) -> TlsFront {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut front = TlsFront::spawn(&addr.to_string(), upstream, None, None);
        front.addr = Some(addr);
        front.wait_until(|| TcpStream::connect(addr).is_ok());
        front
    }

    /// The same on a unix socket.
    pub fn start_unix(path: &Path, upstream: SocketAddr, server: &Issued) -> TlsFront {
        let front = TlsFront::spawn(
            &format!("unix@{}", path.display()),
            upstream,
            Some(server),
            None,
        );
        front.wait_until(|| std::os::unix::net::UnixStream::connect(path).is_ok());
        front
    }

    /// `server`: `None` for a plain listener.
    fn spawn(
        bind: &str,
        upstream: SocketAddr,
        server: Option<&Issued>,
        client_ca: Option<&str>,
    ) -> TlsFront {
        let bin = haproxy_bin();
        let vv = Command::new(&bin).arg("-vv").output().unwrap();
        assert!(
            String::from_utf8_lossy(&vv.stdout).contains("Built with OpenSSL"),
            "{} has no TLS (not built with OpenSSL): the TLS tests need Debian's haproxy (apt-get install -y haproxy) or HAPROXY_BIN naming one built with USE_OPENSSL=1",
            bin.display()
        );
        let ssl = match server {
            Some(server) => format!(" ssl crt {}", server.bundle().display()),
            None => String::new(),
        };
        let verify = client_ca
            .map(|ca| format!(" verify required ca-file {ca}"))
            .unwrap_or_default();
        // Blocking queries are held up to -consul-wait × 17/16: the tests
        // use 1 s; a minute of idle is plenty.
        let cfg = format!(
            "global\n    log stderr format raw local0 info\n\ndefaults\n    mode tcp\n    log global\n    option tcplog\n    timeout connect 1s\n    timeout client 1m\n    timeout server 1m\n\n\
             frontend tls\n    bind {bind}{ssl}{verify}\n    default_backend kv\n\n\
             backend kv\n    server kv {upstream}\n"
        );
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gha-front-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let mut cmd = Command::new(&bin);
        cmd.arg("-db").arg("-f").arg(&path);
        TlsFront {
            addr: None,
            proc: Proc::spawn(cmd),
            dir,
        }
    }

    fn wait_until(&self, mut up: impl FnMut() -> bool) {
        wait_for(Duration::from_secs(10), "haproxy's TLS listener", || {
            if self.proc.log().iter().any(|l| l.contains("[ALERT]")) {
                panic!("haproxy failed: {:#?}", self.proc.log());
            }
            up().then_some(())
        });
    }

    /// https://127.0.0.1:<port>
    pub fn url(&self) -> String {
        format!("https://{}", self.addr.expect("a TCP listener"))
    }

    /// haproxy's log so far (one line per TLS connection, with errors).
    pub fn log(&self) -> Vec<String> {
        self.proc.log()
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
