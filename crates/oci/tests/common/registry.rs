//! A CNCF distribution registry on 127.0.0.1 with filesystem storage in a temp dir, plus a
//! tiny HTTP/1.1 client for the requests skopeo cannot make (indexes, tampered manifests).

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::http::{http, Response};
use super::token::{self, TokenServer};
use super::{base64, require_tools, run, sha256_digest};

/// How clients must authenticate to the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// Anonymous pull and push.
    None,
    /// htpasswd (bcrypt) Basic auth, the common self-hosted setup.
    Basic { user: String, password: String },
    /// Bearer tokens from a separate token server, as Docker Hub and most clouds do.
    Token { user: String, password: String },
}

impl Auth {
    /// Basic auth with the given account.
    pub fn basic(user: &str, password: &str) -> Self {
        Auth::Basic {
            user: user.into(),
            password: password.into(),
        }
    }

    /// Token auth with the given account.
    pub fn token(user: &str, password: &str) -> Self {
        Auth::Token {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The account, if any, to hand to the client under test.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        match self {
            Auth::None => None,
            Auth::Basic { user, password } | Auth::Token { user, password } => {
                Some((user, password))
            }
        }
    }
}

/// A running registry; killed, and its storage removed, on drop.
pub struct Registry {
    port: u16,
    auth: Auth,
    child: Child,
    token: Option<TokenServer>,
    dir: TempDir,
}

impl Registry {
    /// Starts a registry with the given auth and waits until `/v2/` answers.
    pub fn start(auth: Auth) -> Result<Registry, String> {
        require_tools(&["docker-registry"])?;
        match auth {
            Auth::None => {}
            Auth::Basic { .. } => require_tools(&["htpasswd"])?,
            Auth::Token { .. } => require_tools(&["openssl"])?,
        }
        let dir = tempfile::Builder::new()
            .prefix("zygote-registry-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let (auth_yaml, token) = match &auth {
            Auth::None => (String::new(), None),
            Auth::Basic { user, password } => {
                let out = run(Command::new("htpasswd").args(["-Bbn", user, password]))?;
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, out.stdout).map_err(|e| e.to_string())?;
                (
                    format!(
                        "auth:\n  htpasswd:\n    realm: zygote-test\n    path: {}\n",
                        q(&path)
                    ),
                    None,
                )
            }
            Auth::Token { user, password } => {
                let server = TokenServer::start(dir.path(), user, password)?;
                let yaml = format!(
                    "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    \
                     rootcertbundle: {}\n",
                    q(&server.realm()),
                    token::SERVICE,
                    token::ISSUER,
                    q(&server.cert)
                );
                (yaml, Some(server))
            }
        };
        let mut last_err = String::new();
        // A free port can be taken between probing and binding: retry a few times.
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("no free port: {e}"))?
                .port();
            let config = dir.path().join("config.yml");
            let yaml = format!(
                "version: 0.1\n\
                 log:\n  level: info\n  formatter: text\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 http:\n  addr: 127.0.0.1:{port}\n  secret: zygote-test-secret\n\
                 {auth_yaml}",
                q(&dir.path().join("storage"))
            );
            std::fs::write(&config, yaml).map_err(|e| e.to_string())?;
            let log = |name: &str| File::create(dir.path().join(name)).map_err(|e| e.to_string());
            let mut cmd = Command::new("docker-registry");
            cmd.arg("serve").arg(&config).stdin(Stdio::null());
            cmd.stdout(log("access.log")?).stderr(log("registry.log")?);
            // REGISTRY_* variables override the config file; keep the test hermetic.
            for (k, _) in
                std::env::vars_os().filter(|(k, _)| k.to_string_lossy().starts_with("REGISTRY_"))
            {
                cmd.env_remove(k);
            }
            let mut child = cmd.spawn().map_err(|e| format!("docker-registry: {e}"))?;
            let log_path = dir.path().join("registry.log");
            match wait_ready(port, &mut child, Duration::from_secs(15)) {
                Ok(()) => {
                    return Ok(Registry {
                        port,
                        auth,
                        child,
                        token,
                        dir,
                    })
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = std::fs::read_to_string(log_path).unwrap_or_default();
                    last_err = format!("{e}; registry log:\n{log}");
                    if !log.contains("address already in use") {
                        break;
                    }
                }
            }
        }
        Err(last_err)
    }

    /// `127.0.0.1:PORT`, the registry part of image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The auth mode, so tests can hand the same account to the client under test.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// `user:password` for skopeo's `--creds`, `None` when anonymous.
    pub fn creds(&self) -> Option<String> {
        self.auth.credentials().map(|(u, p)| format!("{u}:{p}"))
    }

    /// The registry's own (stderr) log, for error messages and `response completed` lines.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Access-log lines (`"METHOD /v2/... HTTP/1.1" STATUS ...`), to assert what a client sent.
    pub fn request_log(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// Counts `method` requests whose path contains `path_part` (did a re-push upload anything?).
    pub fn count_requests(&self, method: &str, path_part: &str) -> usize {
        let prefix = format!("\"{method} ");
        self.request_log()
            .iter()
            .filter_map(|l| l.split_once(&prefix))
            .filter(|(_, rest)| {
                rest.split(' ')
                    .next()
                    .is_some_and(|p| p.contains(path_part))
            })
            .count()
    }

    /// `http://127.0.0.1:PORT/token` in [`Auth::Token`] mode, to call the token server directly.
    pub fn token_realm(&self) -> Option<String> {
        self.token.as_ref().map(TokenServer::realm)
    }

    /// Token-server request lines (empty unless [`Auth::Token`]), to assert token reuse.
    pub fn token_requests(&self) -> Vec<String> {
        self.token
            .as_ref()
            .map(TokenServer::requests)
            .unwrap_or_default()
    }

    /// The storage root (`docker/registry/v2/...` lives below it).
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Where the registry keeps a blob's bytes (layers, configs and manifests alike).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        let prefix = hex.get(..2).unwrap_or(hex);
        self.storage_dir().join(format!(
            "docker/registry/v2/blobs/sha256/{prefix}/{hex}/data"
        ))
    }

    /// Number of stored blobs (layers, configs and manifests), to see whether a push added any.
    pub fn blob_count(&self) -> usize {
        let root = self.storage_dir().join("docker/registry/v2/blobs/sha256");
        let dirs = |p: PathBuf| {
            std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
        };
        dirs(root)
            .flat_map(dirs)
            .filter(|d| d.join("data").is_file())
            .count()
    }

    /// Edits a stored blob in place; the registry serves it as is under its old digest.
    pub fn rewrite_blob(
        &self,
        digest: &str,
        edit: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), String> {
        let path = self.blob_path(digest);
        let mut data = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        edit(&mut data);
        std::fs::write(&path, data).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Flips one bit mid-blob (same size, wrong digest) to test a client's digest verification.
    pub fn corrupt_blob(&self, digest: &str) -> Result<(), String> {
        self.rewrite_blob(digest, |d| {
            let mid = d.len() / 2;
            if let Some(b) = d.get_mut(mid) {
                *b ^= 0x01;
            }
        })
    }

    /// An authenticated request (Basic, or a token minted for `path`'s repo) skopeo can't make.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, String> {
        let mut all: Vec<(&str, String)> =
            headers.iter().map(|(k, v)| (*k, v.to_string())).collect();
        match &self.auth {
            Auth::None => {}
            Auth::Basic { user, password } => {
                all.push((
                    "Authorization",
                    format!("Basic {}", base64(format!("{user}:{password}").as_bytes())),
                ));
            }
            Auth::Token { .. } => {
                let repo = repo_of(path).ok_or_else(|| format!("no repository in {path}"))?;
                let token = self
                    .token
                    .as_ref()
                    .unwrap()
                    .mint(repo, &["pull", "push", "delete"])?;
                all.push(("Authorization", format!("Bearer {token}")));
            }
        }
        http(self.port, method, path, &all, body)
    }

    /// Uploads a blob (POST then PUT) and returns its digest.
    pub fn push_blob(&self, repo: &str, data: &[u8]) -> Result<String, String> {
        let digest = sha256_digest(data);
        let r = self.request("POST", &format!("/v2/{repo}/blobs/uploads/"), &[], &[])?;
        let location = r
            .header("Location")
            .filter(|_| r.status == 202)
            .ok_or_else(|| status_err("POST upload", &r))?;
        // Distribution answers with an absolute URL; keep only the path and query.
        let path = location
            .split_once("://")
            .map_or(location, |(_, rest)| &rest[rest.find('/').unwrap_or(0)..]);
        let sep = if path.contains('?') { '&' } else { '?' };
        let r = self.request(
            "PUT",
            &format!("{path}{sep}digest={digest}"),
            &[("Content-Type", "application/octet-stream")],
            data,
        )?;
        if r.status != 201 {
            return Err(status_err("PUT blob", &r));
        }
        Ok(digest)
    }

    /// PUTs a manifest (or index) verbatim under `reference` and returns its digest.
    pub fn put_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        body: &[u8],
    ) -> Result<String, String> {
        let r = self.request(
            "PUT",
            &format!("/v2/{repo}/manifests/{reference}"),
            &[("Content-Type", media_type)],
            body,
        )?;
        if r.status != 201 {
            return Err(status_err("PUT manifest", &r));
        }
        Ok(sha256_digest(body))
    }

    /// GETs a manifest accepting OCI and Docker types; returns (media type, bytes).
    pub fn get_manifest(&self, repo: &str, reference: &str) -> Result<(String, Vec<u8>), String> {
        let accept = [
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
        ]
        .join(", ");
        let r = self.request(
            "GET",
            &format!("/v2/{repo}/manifests/{reference}"),
            &[("Accept", &accept)],
            &[],
        )?;
        if r.status != 200 {
            return Err(status_err("GET manifest", &r));
        }
        Ok((
            r.header("Content-Type").unwrap_or_default().to_owned(),
            r.body,
        ))
    }

    /// Re-publishes an edited manifest (e.g. wrong layer size) as `new_tag`, for bad-input tests.
    pub fn tamper_manifest(
        &self,
        repo: &str,
        reference: &str,
        new_tag: &str,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> Result<String, String> {
        let (media_type, body) = self.get_manifest(repo, reference)?;
        let mut json: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        edit(&mut json);
        self.put_manifest(repo, new_tag, &media_type, json.to_string().as_bytes())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The token server and the temp dir go with the remaining fields.
    }
}

/// Quotes a string for YAML (a JSON string is a valid YAML double-quoted scalar).
fn q(s: &(impl AsRef<std::ffi::OsStr> + ?Sized)) -> String {
    serde_json::Value::from(s.as_ref().to_string_lossy()).to_string()
}

/// The repository name in a `/v2/<name>/{manifests,blobs,tags}/...` path.
fn repo_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v2/")?;
    ["/manifests/", "/blobs/", "/tags/"]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .map(|i| &rest[..i])
}

/// Polls `GET /v2/` until it answers 200 or 401 (auth modes), or the registry exits.
fn wait_ready(port: u16, child: &mut Child, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("docker-registry exited ({status})"));
        }
        if let Ok(r) = http(port, "GET", "/v2/", &[], &[]) {
            if r.status == 200 || r.status == 401 {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("docker-registry not up after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn status_err(what: &str, r: &Response) -> String {
    format!(
        "{what}: HTTP {}: {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    )
}
