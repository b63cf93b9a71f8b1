//! The daemon's egress CA and the TLS set-up of both ends of an intercepted
//! connection.
//!
//! The CA is made once per state directory (`<state>/egress-ca/`: `ca.pem` for guests,
//! `ca-key.pem` readable by root only; written to a temporary name and renamed, so a
//! crash leaves either no CA or a whole one). Its key never leaves the host. Leaf
//! certificates are issued in memory per host name, on demand, for a week, and kept
//! (bounded) for a day. The upstream end trusts the host's roots (`/etc/ssl/certs`)
//! plus the PEM certificates the operator adds (`zygote serve --egress-trust`), and
//! verifies the real server's certificate for the name the guest asked for.
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Leaf certificates kept at once (more: the cache starts over).
const MAX_LEAVES: usize = 1024;
/// How long an issued leaf is used before a new one is made.
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);
/// What every TLS end here speaks (hyper serves HTTP/1.1 only).
const ALPN: &[u8] = b"http/1.1";

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("egress CA in {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
    #[error("egress CA: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("egress TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("egress trust file {path}: {why}")]
    Trust { path: PathBuf, why: String },
}

/// The CA, its leaves, and the upstream trust.
pub struct EgressTls {
    key: KeyPair,
    ca: rcgen::Certificate,
    /// The CA certificate as written for guests.
    pub ca_pem: String,
    client: Arc<ClientConfig>,
    leaves: Mutex<HashMap<String, (Instant, Arc<ServerConfig>)>>,
}

/// The CA's parameters: always the same, so that the certificate remade from the
/// stored key at each start issues leaves that chain to the one guests hold (a leaf
/// names its issuer by subject and by key identifier, both fixed by these and the key).
fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "zygote");
    dn.push(DnType::CommonName, "zygote egress CA");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2044, 1, 1);
    Ok(p)
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl EgressTls {
    /// Loads the CA of `dir` or makes it, and the upstream trust (`extra_trust`: PEM
    /// certificates trusted next to the host's roots).
    pub fn open(dir: &Path, extra_trust: Option<&Path>) -> Result<EgressTls, CaError> {
        let io_err = |source| CaError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let key_path = dir.join("ca-key.pem");
        let key = match std::fs::read_to_string(&key_path) {
            Ok(pem) => KeyPair::from_pem(&pem)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let key = KeyPair::generate()?;
                write_new(&key_path, key.serialize_pem().as_bytes(), 0o600).map_err(io_err)?;
                key
            }
            Err(e) => return Err(io_err(e)),
        };
        let ca = ca_params()?.self_signed(&key)?;
        // The guests' copy: written again when missing or made with another key.
        let pem_path = dir.join("ca.pem");
        let ca_pem = match std::fs::read_to_string(&pem_path) {
            Ok(pem) if same_key(&pem, &key) => pem,
            _ => {
                let pem = ca.pem();
                write_new(&pem_path, pem.as_bytes(), 0o644).map_err(io_err)?;
                pem
            }
        };
        Ok(EgressTls {
            key,
            ca,
            ca_pem,
            client: Arc::new(client_config(extra_trust)?),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The TLS server end for the guest's connection to `host`: a leaf for `host`
    /// signed by the CA.
    pub fn server_for(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        let now = Instant::now();
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made, cfg)) = leaves.get(host) {
            if now.duration_since(*made) < LEAF_REUSE {
                return Ok(cfg.clone());
            }
        }
        let mut p = CertificateParams::new(vec![host.to_string()])?;
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, host);
        p.is_ca = IsCa::ExplicitNoCa;
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let start = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
        p.not_before = start;
        p.not_after = start + time::Duration::days(7);
        let leaf_key = KeyPair::generate()?;
        let leaf = p.signed_by(&leaf_key, &self.ca, &self.key)?;
        let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone(), self.ca.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let mut cfg = ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        let cfg = Arc::new(cfg);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), (now, cfg.clone()));
        Ok(cfg)
    }

    /// The TLS client end towards the real server.
    pub fn client(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}

/// Whether the certificate in `pem` carries `key`'s public key.
fn same_key(pem: &str, key: &KeyPair) -> bool {
    let Some(Ok(der)) = CertificateDer::pem_slice_iter(pem.as_bytes()).next() else {
        return false;
    };
    let public = rcgen::PublicKeyData::der_bytes(key);
    der.windows(public.len()).any(|w| w == public)
}

fn client_config(extra_trust: Option<&Path>) -> Result<ClientConfig, CaError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!("egress trust: {e}");
    }
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if let Some(path) = extra_trust {
        let trust = |why: String| CaError::Trust {
            path: path.to_path_buf(),
            why,
        };
        let text = std::fs::read_to_string(path).map_err(|e| trust(e.to_string()))?;
        let blocks = CertificateDer::pem_slice_iter(text.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| trust(e.to_string()))?;
        if blocks.is_empty() {
            return Err(trust("no PEM certificate in it".into()));
        }
        for der in blocks {
            roots.add(der).map_err(|e| trust(e.to_string()))?;
        }
    } else if added == 0 {
        tracing::warn!(
            "egress: no trusted roots on this host (/etc/ssl/certs): secrets bound to hosts \
             cannot be sent anywhere"
        );
    }
    let mut cfg = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn the_ca_is_made_once_and_its_leaves_chain_to_the_guests_copy() {
        let dir = tempfile::tempdir().unwrap();
        let first = EgressTls::open(dir.path(), None).unwrap();
        let again = EgressTls::open(dir.path(), None).unwrap();
        assert_eq!(
            first.ca_pem, again.ca_pem,
            "the guests' copy stays the same"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("ca-key.pem"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o077, 0, "the key is root's only");
        // A leaf issued after a restart verifies against the CA written before it.
        let mut roots = RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(first.ca_pem.as_bytes()) {
            roots.add(der.unwrap()).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(default_provider()),
        )
        .build()
        .unwrap();
        let leaf = chain_of(&again, "api.example.test");
        assert_eq!(leaf.len(), 2, "leaf and CA");
        let name = rustls::pki_types::ServerName::try_from("api.example.test").unwrap();
        let now = rustls::pki_types::UnixTime::now();
        verifier
            .verify_server_cert(&leaf[0], &leaf[1..], &name, &[], now)
            .expect("the leaf chains to the CA guests hold");
        let other = rustls::pki_types::ServerName::try_from("other.example.test").unwrap();
        assert!(verifier
            .verify_server_cert(&leaf[0], &leaf[1..], &other, &[], now)
            .is_err());
        // A CA file replaced by hand is written again from the key.
        std::fs::write(dir.path().join("ca.pem"), "junk").unwrap();
        let third = EgressTls::open(dir.path(), None).unwrap();
        assert!(same_key(&third.ca_pem, &third.key));
    }

    fn chain_of(tls: &EgressTls, host: &str) -> Vec<CertificateDer<'static>> {
        let cfg = tls.server_for(host).unwrap();
        let (client, server) = (
            rustls::ClientConnection::new(
                Arc::new(
                    ClientConfig::builder_with_provider(Arc::new(default_provider()))
                        .with_safe_default_protocol_versions()
                        .unwrap()
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AcceptAny))
                        .with_no_client_auth(),
                ),
                rustls::pki_types::ServerName::try_from(host.to_string()).unwrap(),
            )
            .unwrap(),
            rustls::ServerConnection::new(cfg).unwrap(),
        );
        let (mut client, mut server) = (client, server);
        for _ in 0..4 {
            // (An empty read_tls would tell the other end the peer closed.)
            let mut buf = Vec::new();
            client.write_tls(&mut buf).unwrap();
            if !buf.is_empty() {
                server.read_tls(&mut buf.as_slice()).unwrap();
                server.process_new_packets().unwrap();
            }
            let mut back = Vec::new();
            server.write_tls(&mut back).unwrap();
            if !back.is_empty() {
                client.read_tls(&mut back.as_slice()).unwrap();
                client.process_new_packets().unwrap();
            }
        }
        client
            .peer_certificates()
            .expect("the handshake gave the server's chain")
            .to_vec()
    }

    #[derive(Debug)]
    struct AcceptAny;

    impl rustls::client::danger::ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
}
