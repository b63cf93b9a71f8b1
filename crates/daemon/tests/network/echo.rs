//! Servers of the test's "remote" that record what arrives: HTTPS (with a CA of the
//! test's own, which the daemon is told to trust and the guest is not) and plain HTTP.
//! Each request head is kept; the answer is `ok-<label>` with an `X-Echo` header
//! repeating the request's `Authorization` (an echoing server, which the egress proxy
//! must not let carry a secret back to the guest).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio_rustls::rustls;

/// The test's CA.
pub struct TestCa {
    pub ca_pem: String,
    ca: rcgen::Certificate,
    key: KeyPair,
}

/// A TLS server's set-up: a certificate for some names, signed by a [`TestCa`].
pub type ServerTls = Arc<rustls::ServerConfig>;

impl TestCa {
    pub fn new() -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, "zygote test remote CA");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = p.self_signed(&key).unwrap();
        TestCa {
            ca_pem: ca.pem(),
            ca,
            key,
        }
    }

    /// A server certificate for `names` (wildcards allowed).
    pub fn server(&self, names: &[&str]) -> ServerTls {
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &self.ca, &self.key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone(), self.ca.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        Arc::new(server)
    }
}

/// The request heads a server received.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// Serves HTTPS (`tls`) or plain HTTP (None) on `listener`, forever, recording every
/// request head into the returned list.
pub fn serve(listener: TcpListener, tls: Option<ServerTls>, label: &str) -> Seen {
    let seen = Seen::default();
    let (config, label, record) = (tls, label.to_string(), seen.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (config, label, record) = (config.clone(), label.clone(), record.clone());
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                match config {
                    Some(config) => {
                        let Ok(tls) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        answer(rustls::StreamOwned::new(tls, conn), &label, &record);
                    }
                    None => answer(conn, &label, &record),
                }
            });
        }
    });
    seen
}

/// Reads one request head (and a body by Content-Length), records it, answers.
fn answer(stream: impl Read + Write, label: &str, seen: &Seen) {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    let mut body_len = 0usize;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                body_len = v.trim().parse().unwrap_or(0);
            }
        }
        let end = line == "\r\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let mut body = vec![0u8; body_len.min(1 << 20)];
    let _ = reader.read_exact(&mut body);
    let auth = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("authorization")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    seen.lock().unwrap().push(head);
    let text = format!("ok-{label}");
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Echo: {auth}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = stream.flush();
}
