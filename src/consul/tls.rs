//! TLS on the consul connection: a rustls client session over any
//! nonblocking byte stream, driven by the loop's readiness (no thread, no
//! blocking handshake).
//!
//! In: the stream's bytes (`read_tls`), the client's plaintext ([`Write`]).
//! Out: plaintext for the client ([`Read`]), TLS records for the stream
//! (`write_tls`), and the interest the session needs
//! ([`Transport::wants_write`]: records the stream has not taken yet).
//!
//! Always holds:
//! - every call returns `WouldBlock` only when the stream does, so the
//!   loop's edge-triggered readiness stays correct;
//! - records of our own (the handshake, an alert, a key update) are sent
//!   before any more plaintext, and a read sends what is queued first;
//! - a TLS failure is an [`io::Error`] carrying a [`TlsError`], whose text
//!   names the cause an operator can act on (unknown CA, name mismatch,
//!   expired, client certificate required).
//!
//! Ends map to their plaintext twins: a `close_notify` is the end of the
//! stream, as a FIN is; so is a FIN without `close_notify` (a truncated
//! record too): the HTTP framing then decides, exactly as over plain TCP
//! (a body cut short is `bad_body`; consul never sends a close-delimited
//! body to an HTTP/1.1 request, and a cut JSON listing does not decode).
//! A reset is a reset.

use std::io::{self, Read, Write};
use std::sync::Arc;

use rustls::{AlertDescription, CertificateError, ClientConfig, ClientConnection};
use rustls_pki_types::ServerName;

use super::stream::Transport;

/// A TLS failure: what went wrong, in an operator's words, then rustls's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError(pub String);

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

impl TlsError {
    /// The TLS failure an IO error carries, if it is one.
    pub fn of(e: &io::Error) -> Option<&TlsError> {
        e.get_ref()?.downcast_ref()
    }

    fn io(detail: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, TlsError(detail))
    }
}

/// The cause of a rustls error, as an operator reads it.
pub fn describe(e: &rustls::Error) -> String {
    use rustls::Error as E;
    let cause = match e {
        E::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => "unknown CA: consul's certificate does not chain to a trusted CA (-consul-ca-cert, CONSUL_CACERT, CONSUL_CAPATH, else the system's roots)",
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => "name mismatch: consul's certificate does not hold the name checked (the address's host, or -consul-tls-server-name / CONSUL_TLS_SERVER_NAME)",
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "expired: consul's certificate is past its notAfter date",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => "not yet valid: consul's certificate starts later (is this host's clock right?)",
            _ => "consul's certificate was refused",
        },
        E::AlertReceived(AlertDescription::CertificateRequired) => "client certificate required: consul asks for one (verify_incoming); give -consul-client-cert and -consul-client-key",
        E::AlertReceived(AlertDescription::HandshakeFailure) => "consul refused the handshake (with TLS 1.2 also what a missing client certificate looks like: verify_incoming needs -consul-client-cert and -consul-client-key)",
        E::AlertReceived(
            AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::AccessDenied,
        ) => "consul refused our client certificate",
        E::AlertReceived(_) => "consul ended the TLS session with an alert",
        E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => "consul did not answer in TLS (is this its HTTPS port? a plain-HTTP port needs http://)",
        E::PeerIncompatible(_) | E::NoCertificatesPresented => "consul and this agent share no TLS version, cipher or key type",
        _ => "TLS failed",
    };
    format!("TLS: {cause} ({e})")
}

/// A rustls client session over `S`.
pub struct TlsStream<S: Read + Write> {
    sock: S,
    tls: ClientConnection,
    /// The stream said EOF.
    eof: bool,
}

impl<S: Read + Write> TlsStream<S> {
    /// A session with `name` over `sock`; the handshake starts at the
    /// first [`Transport::handshake`].
    pub fn new(
        sock: S,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<TlsStream<S>> {
        let tls = ClientConnection::new(config, name).map_err(|e| TlsError::io(describe(&e)))?;
        Ok(TlsStream {
            sock,
            tls,
            eof: false,
        })
    }

    pub fn socket(&mut self) -> &mut S {
        &mut self.sock
    }

    /// Sends the records rustls has queued, until none is left (`Ok`) or
    /// the stream would block (`WouldBlock`).
    fn send_queued(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// [`Self::send_queued`], where a full stream is no error: the records
    /// wait (and [`Transport::wants_write`] says so).
    fn send_some(&mut self) -> io::Result<()> {
        match self.send_queued() {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }

    /// One read of records from the stream, processed: `Ok(false)` when
    /// the stream had nothing (would block).
    fn receive(&mut self) -> io::Result<bool> {
        loop {
            match self.tls.read_tls(&mut self.sock) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
            break;
        }
        if let Err(e) = self.tls.process_new_packets() {
            // The alert rustls queued goes out (best effort), so consul
            // logs why too.
            let _ = self.send_queued();
            return Err(TlsError::io(describe(&e)));
        }
        Ok(true)
    }
}

impl<S: Read + Write> Read for TlsStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.send_some()?;
        loop {
            match self.tls.reader().read(buf) {
                // Ok(0): close_notify.
                Ok(n) => return Ok(n),
                // A FIN without close_notify: as the plaintext FIN.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !self.receive()? {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }
}

impl<S: Read + Write> Write for TlsStream<S> {
    /// Takes plaintext only when no record of ours still waits, so a full
    /// socket is `WouldBlock` as over plain TCP.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send_queued()?;
        let n = self.tls.writer().write(buf)?;
        self.send_some()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<S: Transport> Transport for TlsStream<S> {
    fn connected(&mut self) -> io::Result<bool> {
        self.sock.connected()
    }

    fn handshake(&mut self) -> io::Result<bool> {
        loop {
            match self.send_queued() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
            if !self.tls.is_handshaking() {
                return Ok(true);
            }
            if self.eof {
                return Err(TlsError::io(
                    "TLS: consul closed the connection during the handshake (is this its HTTPS port?)".into(),
                ));
            }
            if !self.receive()? {
                return Ok(false);
            }
        }
    }

    fn wants_write(&self) -> bool {
        self.tls.wants_write()
    }
}

impl<S: Read + Write> Drop for TlsStream<S> {
    /// A `close_notify` when the connection is retired, if the socket
    /// takes it at once (never waited for).
    fn drop(&mut self) {
        if self.eof || self.tls.is_handshaking() {
            return;
        }
        self.tls.send_close_notify();
        let _ = self.send_queued();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::consul::client::{Client, Connect};
    use crate::consul::error::ErrorReason;
    use crate::consul::memstream::{
        config as settings, pump, Act, MemConnector, MemStream, Scripted,
    };
    use crate::consul::watch::Update;
    use crate::testpki::{file, Ca, Issued};

    const NAME: &str = "consul.test";
    const TURN: Duration = Duration::from_millis(1);

    /// How the peer ends the session when its script reaches FIN.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Close {
        /// `close_notify`, then FIN.
        Notify,
        /// FIN alone.
        Fin,
        /// Half of one more record, then FIN.
        TruncatedRecord,
    }

    /// How the peer's stream ended.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum End {
        Eof,
        Reset,
    }

    /// consul behind a rustls server: the client's TLS bytes go to the
    /// server, whose plaintext is a scripted peer ([`MemStream`]), and the
    /// peer's acts come back as records (each act's bytes in their own).
    struct TlsPeer {
        server: rustls::ServerConnection,
        app: MemStream,
        /// TLS bytes on their way to the client.
        out: VecDeque<u8>,
        close: Close,
        end: Option<End>,
        /// Writes refused (`WouldBlock`) while set: a full socket.
        stalled: bool,
    }

    impl TlsPeer {
        fn new(config: Arc<rustls::ServerConfig>, app: MemStream, close: Close) -> TlsPeer {
            TlsPeer {
                server: rustls::ServerConnection::new(config).unwrap(),
                app,
                out: VecDeque::new(),
                close,
                end: None,
                stalled: false,
            }
        }

        fn send_records(&mut self) {
            let mut buf = Vec::new();
            while self.server.wants_write() {
                self.server.write_tls(&mut buf).unwrap();
            }
            self.out.extend(buf);
        }

        /// Moves the peer's acts into records, up to a pause.
        fn fill(&mut self) {
            self.send_records();
            let mut tmp = vec![0; 16 * 1024];
            while self.end.is_none() && self.out.is_empty() {
                match self.app.read(&mut tmp) {
                    Ok(0) => self.finish(),
                    Ok(n) => {
                        self.server.writer().write_all(&tmp[..n]).unwrap();
                        self.send_records();
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(_) => self.end = Some(End::Reset),
                }
            }
        }

        fn finish(&mut self) {
            match self.close {
                Close::Notify => {
                    self.server.send_close_notify();
                    self.send_records();
                }
                Close::Fin => {}
                Close::TruncatedRecord => {
                    self.server.writer().write_all(&[b'x'; 100]).unwrap();
                    let mut record = Vec::new();
                    self.server.write_tls(&mut record).unwrap();
                    self.out.extend(&record[..record.len() / 2]);
                }
            }
            self.end = Some(End::Eof);
        }
    }

    impl Read for TlsPeer {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.fill();
            if !self.out.is_empty() {
                let n = buf.len().min(self.out.len());
                for (dst, src) in buf.iter_mut().zip(self.out.drain(..n)) {
                    *dst = src;
                }
                return Ok(n);
            }
            match self.end {
                Some(End::Eof) => Ok(0),
                Some(End::Reset) => Err(io::ErrorKind::ConnectionReset.into()),
                None => Err(io::ErrorKind::WouldBlock.into()),
            }
        }
    }

    impl Write for TlsPeer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.stalled {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if self.end == Some(End::Reset) {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            let mut rest = buf;
            while !rest.is_empty() {
                self.server.read_tls(&mut rest)?;
                if self.server.process_new_packets().is_err() {
                    // The server's alert goes out; it hangs up.
                    self.send_records();
                    self.end = Some(End::Eof);
                    return Ok(buf.len());
                }
            }
            let mut plain = vec![0; 16 * 1024];
            while let Ok(n @ 1..) = self.server.reader().read(&mut plain) {
                self.app.write_all(&plain[..n])?;
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Transport for TlsPeer {
        fn connected(&mut self) -> io::Result<bool> {
            Ok(true)
        }
    }

    impl Scripted for TlsStream<TlsPeer> {
        fn pending(&mut self) -> bool {
            let peer = self.socket();
            peer.fill();
            !peer.out.is_empty() || peer.end.is_some()
        }
    }

    /// Hands out the prepared peers under TLS; refuses once they are used.
    struct TlsConnector {
        peers: VecDeque<TlsPeer>,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    }

    impl Connect for TlsConnector {
        type Stream = TlsStream<TlsPeer>;

        fn connect(&mut self) -> io::Result<TlsStream<TlsPeer>> {
            let peer = self
                .peers
                .pop_front()
                .ok_or(io::ErrorKind::ConnectionRefused)?;
            TlsStream::new(peer, Arc::clone(&self.config), self.name.clone())
        }
    }

    fn client_config(ca: &Ca, client: Option<&Issued>) -> Arc<ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der()).unwrap();
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        Arc::new(match client {
            None => builder.with_no_client_auth(),
            Some(c) => builder.with_client_auth_cert(c.chain(), c.key()).unwrap(),
        })
    }

    fn listing_response(index: u64) -> Vec<u8> {
        let body = br#"[{"Key":"p/be/s1","Value":"ZHJhaW4=","ModifyIndex":3}]"#;
        let mut w = format!(
            "HTTP/1.1 200 OK\r\nX-Consul-Index: {index}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        w.extend_from_slice(body);
        w
    }

    /// A client over TLS to one peer per script list.
    fn tls_client(
        server: Arc<rustls::ServerConfig>,
        config: Arc<ClientConfig>,
        answers: Vec<Vec<Vec<Act>>>,
        close: Close,
    ) -> Client<TlsConnector> {
        let peers = answers
            .into_iter()
            .map(|a| TlsPeer::new(Arc::clone(&server), MemStream::answering(a), close))
            .collect();
        let connector = TlsConnector {
            peers,
            config,
            name: ServerName::try_from(NAME).unwrap(),
        };
        Client::new(&settings(64 << 20), connector, "p", 7)
    }

    /// The first update of a client, with the failure's detail.
    fn first<C: Connect>(c: &mut Client<C>, now: &mut Instant) -> Result<u64, (ErrorReason, String)>
    where
        C::Stream: Scripted,
    {
        match pump(c, now, Duration::from_secs(30), TURN) {
            Some(Update::Swap(s)) => Ok(s.index()),
            Some(Update::Failed(f)) => Err((f.reason, f.detail)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_listing_over_tls_and_the_next_on_the_same_session() {
        let ca = Ca::new("ca");
        let server = Ca::server(&ca.issue(&[NAME], false), None);
        let answers = vec![vec![
            vec![Act::Data(listing_response(5))],
            vec![Act::Data(listing_response(6))],
        ]];
        let mut c = tls_client(server, client_config(&ca, None), answers, Close::Notify);
        let mut now = Instant::now();
        assert_eq!(first(&mut c, &mut now), Ok(5));
        assert_eq!(first(&mut c, &mut now), Ok(6), "kept alive: no second peer");
    }

    /// Each certificate problem is a `tls` failure naming its cause.
    #[test]
    fn certificate_failures_name_their_cause() {
        let ca = Ca::new("ca");
        let other = Ca::new("other");
        let client = ca.issue(&["agent"], false);
        let cases: [(&str, Issued, Option<&Ca>, Option<&Issued>); 5] = [
            ("unknown CA", other.issue(&[NAME], false), None, None),
            (
                "name mismatch",
                ca.issue(&["elsewhere.test"], false),
                None,
                None,
            ),
            ("expired", ca.issue(&[NAME], true), None, None),
            (
                "client certificate required",
                ca.issue(&[NAME], false),
                Some(&ca),
                None,
            ),
            (
                "refused our client certificate",
                ca.issue(&[NAME], false),
                Some(&other),
                Some(&client),
            ),
        ];
        for (cause, leaf, clients, given) in cases {
            let server = Ca::server(&leaf, clients);
            let answers = vec![vec![vec![Act::Data(listing_response(5))]]];
            let mut c = tls_client(server, client_config(&ca, given), answers, Close::Notify);
            let mut now = Instant::now();
            match first(&mut c, &mut now) {
                Err((ErrorReason::Tls, detail)) => {
                    assert!(detail.contains(cause), "{cause}: {detail}")
                }
                other => panic!("{cause}: {other:?}"),
            }
        }
        // And the client certificate the server asks for, given: a listing.
        let server = Ca::server(&ca.issue(&[NAME], false), Some(&ca));
        let answers = vec![vec![vec![Act::Data(listing_response(5))]]];
        let mut c = tls_client(
            server,
            client_config(&ca, Some(&client)),
            answers,
            Close::Notify,
        );
        assert_eq!(first(&mut c, &mut Instant::now()), Ok(5));
    }

    #[test]
    fn a_plain_http_server_is_named_as_such() {
        // The ClientHello is a request head to nobody: the "server" answers
        // HTTP at once.
        let peer = MemStream::default();
        peer.0
            .borrow_mut()
            .script
            .push_back(Act::Data(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()));
        let ca = Ca::new("ca");
        let connector = PlainUnderTls(
            MemConnector {
                peers: [peer].into(),
                connects: 0,
            },
            client_config(&ca, None),
        );
        let mut c = Client::new(&settings(1 << 20), connector, "p", 7);
        match first(&mut c, &mut Instant::now()) {
            Err((ErrorReason::Tls, d)) => assert!(d.contains("did not answer in TLS"), "{d}"),
            other => panic!("{other:?}"),
        }
    }

    /// TLS over the plain scripted peer.
    struct PlainUnderTls(MemConnector, Arc<ClientConfig>);

    impl Connect for PlainUnderTls {
        type Stream = TlsStream<MemStream>;

        fn connect(&mut self) -> io::Result<TlsStream<MemStream>> {
            let s = self.0.connect()?;
            TlsStream::new(s, Arc::clone(&self.1), ServerName::try_from(NAME).unwrap())
        }
    }

    impl Scripted for TlsStream<MemStream> {
        fn pending(&mut self) -> bool {
            self.socket().pending()
        }
    }

    /// A client whose one peer refuses writes (a full socket) from the
    /// start; the client's first request starts at the returned time.
    fn stalled_client() -> (Client<TlsConnector>, Instant) {
        let ca = Ca::new("ca");
        let server = Ca::server(&ca.issue(&[NAME], false), None);
        let mut peer = TlsPeer::new(
            server,
            MemStream::answering([vec![Act::Data(listing_response(5))]]),
            Close::Notify,
        );
        peer.stalled = true;
        let connector = TlsConnector {
            peers: [peer].into(),
            config: client_config(&ca, None),
            name: ServerName::try_from(NAME).unwrap(),
        };
        let mut c = Client::new(&settings(64 << 20), connector, "p", 7);
        let t0 = Instant::now();
        let start = c.poll_at(t0);
        c.on_timer(start, &mut Vec::new());
        assert_eq!(c.phase_name(), "handshaking");
        (c, start)
    }

    #[test]
    fn a_full_socket_during_the_handshake_waits_for_writable_then_goes_on() {
        let (mut c, now) = stalled_client();
        let (_, _, interest) = c.wants().unwrap();
        assert!(
            interest.is_readable() && interest.is_writable(),
            "the ClientHello waits: {interest:?}"
        );
        c.wants().unwrap().0.socket().stalled = false;
        // Writable: the in-memory server answers at once, so the one event
        // carries the handshake, the request and the response.
        let mut out = Vec::new();
        c.on_event(now, &mut out);
        assert!(
            matches!(out.as_slice(), [Update::Swap(s)] if s.index() == 5),
            "{out:?}"
        );
        let (_, _, interest) = c.wants().unwrap();
        assert_eq!(
            interest,
            mio::Interest::READABLE,
            "kept, nothing left to send"
        );
    }

    #[test]
    fn a_silent_server_fails_the_handshake_at_its_deadline() {
        let (mut c, t0) = stalled_client();
        let mut now = t0;
        match first(&mut c, &mut now) {
            Err((ErrorReason::Tls, d)) => assert!(d.contains("handshake not done"), "{d}"),
            other => panic!("{other:?}"),
        }
        let took = now - t0;
        assert!(
            took >= crate::consul::client::HANDSHAKE_TIMEOUT
                && took < crate::consul::client::HANDSHAKE_TIMEOUT + Duration::from_millis(50),
            "{took:?}"
        );
    }

    /// How a response is framed, for the twin runs.
    fn framed(kind: usize, body: &[u8]) -> Vec<u8> {
        let head = match kind {
            0 => format!(
                "HTTP/1.1 200 OK\r\nX-Consul-Index: 9\r\nContent-Length: {}\r\n\r\n",
                body.len()
            ),
            1 => {
                "HTTP/1.1 200 OK\r\nX-Consul-Index: 9\r\nTransfer-Encoding: chunked\r\n\r\n".into()
            }
            _ => "HTTP/1.1 200 OK\r\nX-Consul-Index: 9\r\n\r\n".into(),
        };
        let mut w = head.into_bytes();
        if kind == 1 {
            for chunk in body.chunks(7) {
                w.extend(format!("{:x}\r\n", chunk.len()).into_bytes());
                w.extend_from_slice(chunk);
                w.extend_from_slice(b"\r\n");
            }
            w.extend_from_slice(b"0\r\n\r\n");
        } else {
            w.extend_from_slice(body);
        }
        w
    }

    type Outcome = (Result<u64, ErrorReason>, bool);

    fn outcome<C: Connect>(mut c: Client<C>) -> Outcome
    where
        C::Stream: Scripted,
    {
        let mut now = Instant::now();
        let got = first(&mut c, &mut now).map_err(|(r, _)| r);
        for _ in 0..4 {
            c.on_event(now, &mut Vec::new());
        }
        (got, c.wants().is_some())
    }

    /// A close_notify, a FIN without one, a truncated record and a reset,
    /// after a whole response or mid-body, come to what their plaintext
    /// twins (a FIN, a FIN, a FIN, a reset) come to: the same update, and
    /// the connection kept or not alike.
    #[test]
    fn tls_endings_are_handled_as_their_plaintext_twins() {
        let ca = Ca::new("ca");
        let server = Ca::server(&ca.issue(&[NAME], false), None);
        let config = client_config(&ca, None);
        let body = br#"[{"Key":"p/be/s1","Value":"ZHJhaW4=","ModifyIndex":3},{"Key":"p/be/s2","Value":null}]"#;
        for kind in 0..3 {
            let wire = framed(kind, body);
            for cut in [wire.len(), wire.len() - 10, wire.len() / 2] {
                for (close, plain_end) in [
                    (Close::Notify, Act::Fin),
                    (Close::Fin, Act::Fin),
                    (Close::TruncatedRecord, Act::Fin),
                    (Close::Notify, Act::Reset),
                    (Close::Notify, Act::Pause),
                ] {
                    let script = vec![
                        Act::Data(wire[..cut / 2].to_vec()),
                        Act::Pause,
                        Act::Data(wire[cut / 2..cut].to_vec()),
                        plain_end.clone(),
                    ];
                    let plain = outcome(Client::new(
                        &settings(64 << 20),
                        MemConnector {
                            peers: [MemStream::answering([script.clone()])].into(),
                            connects: 0,
                        },
                        "p",
                        7,
                    ));
                    let tls = outcome(tls_client(
                        Arc::clone(&server),
                        Arc::clone(&config),
                        vec![vec![script]],
                        close,
                    ));
                    assert_eq!(
                        tls, plain,
                        "framing {kind}, cut at {cut}, {close:?} / {plain_end:?}"
                    );
                }
            }
        }
    }

    /// The configuration built from the settings, end to end: verification
    /// off takes a certificate from an unknown CA for another name (and
    /// warns); on, the same server is refused.
    #[test]
    fn verification_off_from_the_environment_takes_any_certificate() {
        let stranger = Ca::new("stranger");
        let server = Ca::server(&stranger.issue(&["elsewhere.test"], false), None);
        let ca_file = file("ca.pem", Ca::new("ours").pem().as_bytes());
        let ca = ca_file.to_str().unwrap();
        for (verify, want_ok) in [("false", true), ("true", false)] {
            let env = [
                ("CONSUL_HTTP_ADDR", "https://127.0.0.1:8501"),
                ("CONSUL_HTTP_SSL_VERIFY", verify),
                ("CONSUL_CACERT", ca),
            ];
            let cfg = crate::config::parse(vec![], &|k| {
                env.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            })
            .unwrap();
            let crate::config::Command::Run(cfg) = cfg else {
                panic!()
            };
            assert_eq!(
                cfg.warnings.iter().any(|w| w.contains("not verified")),
                want_ok
            );
            let tls = cfg.consul.tls.expect("TLS on");
            let answers = vec![vec![vec![Act::Data(listing_response(5))]]];
            let mut c = tls_client(Arc::clone(&server), tls.config.0, answers, Close::Notify);
            let got = first(&mut c, &mut Instant::now());
            assert_eq!(got.is_ok(), want_ok, "verify={verify}: {got:?}");
        }
    }
}

#[cfg(test)]
mod measure {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rustls::{ClientConnection, ServerConnection};
    use rustls_pki_types::ServerName;

    use crate::testpki::Ca;

    /// One handshake in memory; returns the time spent in the client's calls.
    fn handshake(client: &mut ClientConnection, server: &mut ServerConnection) -> Duration {
        let mut spent = Duration::ZERO;
        while client.is_handshaking() || server.is_handshaking() || client.wants_write() {
            let t = Instant::now();
            let mut buf = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            spent += t.elapsed();
            server.read_tls(&mut &buf[..]).unwrap();
            server.process_new_packets().unwrap();
            let mut back = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut back).unwrap();
            }
            let t = Instant::now();
            if !back.is_empty() {
                client.read_tls(&mut &back[..]).unwrap();
                client.process_new_packets().unwrap();
            }
            spent += t.elapsed();
            if back.is_empty() && buf.is_empty() {
                break;
            }
        }
        spent
    }

    #[test]
    #[ignore]
    fn handshake_cost() {
        let ca = Ca::new("ca");
        let server_config = Ca::server(&ca.issue(&["consul.test"], false), None);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der()).unwrap();
        let fresh = || {
            Arc::new(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots.clone())
                .with_no_client_auth(),
            )
        };
        let n = 300;
        let name = ServerName::try_from("consul.test").unwrap();
        let mut full = Duration::ZERO;
        for _ in 0..n {
            let mut c = ClientConnection::new(fresh(), name.clone()).unwrap();
            let mut s = ServerConnection::new(Arc::clone(&server_config)).unwrap();
            full += handshake(&mut c, &mut s);
        }
        let shared = fresh();
        let mut resumed = Duration::ZERO;
        for i in 0..=n {
            let mut c = ClientConnection::new(Arc::clone(&shared), name.clone()).unwrap();
            let mut s = ServerConnection::new(Arc::clone(&server_config)).unwrap();
            let d = handshake(&mut c, &mut s);
            // Read the tickets the server sent after its handshake.
            let mut back = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut back).unwrap();
            }
            c.read_tls(&mut &back[..]).unwrap();
            c.process_new_packets().unwrap();
            if i > 0 {
                resumed += d;
            }
        }
        eprintln!(
            "client CPU per handshake (ECDSA P-256, TLS 1.3, ring): full {:?}, resumed {:?}",
            full / n,
            resumed / n
        );
    }
}
