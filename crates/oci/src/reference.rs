//! Image references and which registries are reached how.
use oci_spec::distribution::Reference;

use crate::error::{OciError, Result};
use crate::registry_auth::Credentials;

/// A parsed reference, normalized the way docker does (`alpine:3.20` is
/// `docker.io/library/alpine:3.20`).
#[derive(Debug, Clone)]
pub struct ImageRef {
    pub(crate) inner: Reference,
}

impl ImageRef {
    pub fn parse(s: &str) -> Result<ImageRef> {
        let bad = || OciError::BadReference(s.to_string());
        if s.is_empty() || s.len() > 512 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad());
        }
        let inner = Reference::try_from(s).map_err(|_| bad())?;
        Ok(ImageRef { inner })
    }

    /// The full normalized form: the image's name in the store.
    pub fn name(&self) -> String {
        self.inner.whole()
    }

    /// The registry's host (and port), as in the reference.
    pub fn registry(&self) -> &str {
        self.inner.registry()
    }

    /// Whether a name given to `create`/`run` means an OCI image rather than a
    /// recipe: recipes are plain names, references have a tag, digest or path.
    pub fn looks_like_reference(s: &str) -> bool {
        s.contains([':', '/', '@'])
    }
}

/// How registries are reached: plain HTTP only for loopback and for the registries
/// named insecure (docker's `insecure-registries`), HTTPS for every other.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    /// `host[:port]` of registries reached over plain HTTP although not on loopback.
    pub insecure: Vec<String>,
}

impl Transport {
    /// Reads `ZYGOTE_INSECURE_REGISTRIES` (comma-separated `host[:port]`).
    pub fn from_env() -> Transport {
        let insecure = std::env::var("ZYGOTE_INSECURE_REGISTRIES")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        Transport { insecure }
    }

    /// Whether `registry` is reached over plain HTTP.
    pub fn is_plain_http(&self, registry: &str) -> bool {
        is_loopback(registry) || self.insecure.iter().any(|r| r == registry)
    }

    /// The HTTP client registries are reached with (`registry_http.rs` chooses the
    /// scheme per registry with [`Transport::is_plain_http`]).
    pub(crate) fn http_client(&self) -> reqwest::Result<reqwest::Client> {
        install_crypto_provider();
        reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .read_timeout(std::time::Duration::from_secs(120))
            .user_agent(concat!("zygote/", env!("CARGO_PKG_VERSION")))
            .build()
    }
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.rsplit_once(':').map_or(registry, |(h, _)| h)
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// rustls needs one process-wide crypto provider; the workspace uses ring.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Credentials for `registry`: the ones given, else `~/.docker/config.json` (or
/// `$DOCKER_CONFIG/config.json`, credential helpers included), else anonymous.
pub fn credentials(registry: &str, given: Option<(String, String)>) -> Result<Credentials> {
    if let Some((user, password)) = given {
        return Ok(Credentials::Basic { user, password });
    }
    use docker_credential::{CredentialRetrievalError as E, DockerCredential};
    match docker_credential::get_credential(registry) {
        Ok(DockerCredential::UsernamePassword(user, password)) => {
            Ok(Credentials::Basic { user, password })
        }
        Ok(DockerCredential::IdentityToken(_)) => Err(OciError::Unauthorized {
            registry: registry.to_string(),
            hint: String::new(),
            message: "the docker config holds an identity token for it, which zygote \
                      cannot use: log in with a username and password"
                .into(),
        }),
        Err(E::ConfigNotFound | E::ConfigReadError | E::NoCredentialConfigured) => {
            Ok(Credentials::Anonymous)
        }
        Err(e) => Err(OciError::Unauthorized {
            registry: registry.to_string(),
            hint: String::new(),
            message: format!("reading its credentials from the docker config: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalize_like_docker() {
        assert_eq!(
            ImageRef::parse("alpine:3.20").unwrap().name(),
            "docker.io/library/alpine:3.20"
        );
        let r = ImageRef::parse("127.0.0.1:5000/team/app:1.4").unwrap();
        assert_eq!(r.name(), "127.0.0.1:5000/team/app:1.4");
        assert_eq!(r.registry(), "127.0.0.1:5000");
        let d = format!("localhost:5000/app@sha256:{}", "a".repeat(64));
        assert_eq!(ImageRef::parse(&d).unwrap().name(), d);
        for bad in ["", "Upper:1", "a b", "app:tag with space", "app@sha256:xyz"] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ImageRef::looks_like_reference("alpine:3.20"));
        assert!(!ImageRef::looks_like_reference("minimal"));
    }

    #[test]
    fn plain_http_only_for_loopback_and_named_registries() {
        let t = Transport {
            insecure: vec!["registry.lan:5000".into()],
        };
        for yes in [
            "127.0.0.1:5000",
            "localhost",
            "localhost:80",
            "[::1]:5000",
            "127.9.9.9",
        ] {
            assert!(t.is_plain_http(yes), "{yes}");
        }
        for no in [
            "docker.io",
            "registry.lan",
            "10.0.0.1:5000",
            "localhost.evil.com:5000",
        ] {
            assert!(!t.is_plain_http(no), "{no}");
        }
        assert!(t.is_plain_http("registry.lan:5000"));
    }
}
