//! A Docker-Hub-like bearer token server on 127.0.0.1: checks Basic credentials (GET) or an
//! OAuth2 password grant (POST form) and issues RS256 JWTs whose `x5c` header carries the
//! self-signed certificate that the registry trusts through `rootcertbundle`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{base64_decode, base64url, run};

/// The `service` (JWT audience) the registry expects.
pub const SERVICE: &str = "zygote-test-registry";
/// The JWT issuer the registry expects.
pub const ISSUER: &str = "zygote-test-token-server";
/// Lifetime of issued tokens, as announced in `expires_in`.
pub const TTL_SECS: u64 = 300;

/// Signing material and the one account the server knows.
struct Signer {
    key: PathBuf,
    /// Base64 DER of the certificate: the PEM body, which is what `x5c` wants.
    cert_b64: String,
    user: String,
    password: String,
    serial: AtomicU64,
}

/// The running token server; stops (and joins its accept thread) on drop.
pub struct TokenServer {
    addr: SocketAddr,
    /// PEM certificate to give the registry as `rootcertbundle`.
    pub cert: PathBuf,
    signer: Arc<Signer>,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TokenServer {
    /// Makes an RSA key and certificate in `dir` and starts serving `/token`.
    pub fn start(dir: &Path, user: &str, password: &str) -> Result<Self, String> {
        let (key, cert) = (dir.join("token-key.pem"), dir.join("token-cert.pem"));
        run(Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=zygote-test-token"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert))?;
        let pem = std::fs::read_to_string(&cert).map_err(|e| format!("{}: {e}", cert.display()))?;
        let cert_b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let signer = Arc::new(Signer {
            key,
            cert_b64,
            user: user.to_owned(),
            password: password.to_owned(),
            serial: AtomicU64::new(0),
        });
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("token server: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (log, stop) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicBool::new(false)),
        );
        let thread = {
            let (signer, log, stop) = (signer.clone(), log.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (signer, log) = (signer.clone(), log.clone());
                    std::thread::spawn(move || serve(conn, &signer, &log));
                }
            })
        };
        Ok(TokenServer {
            addr,
            cert,
            signer,
            log,
            stop,
            thread: Some(thread),
        })
    }

    /// The realm URL the registry sends clients to.
    pub fn realm(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// Request lines seen so far (`GET /token?...`), to assert how often clients fetch tokens.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Issues a token for `repository:<repo>:<actions>`, for the fixture's own HTTP calls.
    pub fn mint(&self, repo: &str, actions: &[&str]) -> Result<String, String> {
        let access = serde_json::json!([{"type": "repository", "name": repo, "actions": actions}]);
        self.signer.mint(&self.signer.user, access)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Signer {
    /// Builds and signs a JWT with `openssl dgst` (no crypto dev-dependency).
    fn mint(&self, sub: &str, access: serde_json::Value) -> Result<String, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = serde_json::json!({"typ": "JWT", "alg": "RS256", "x5c": [self.cert_b64]});
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": sub, "aud": SERVICE,
            "exp": now + TTL_SECS, "nbf": now - 10, "iat": now,
            "jti": format!("{now}-{}", self.serial.fetch_add(1, Ordering::SeqCst)),
            "access": access,
        });
        let input = format!(
            "{}.{}",
            base64url(header.to_string().as_bytes()),
            base64url(claims.to_string().as_bytes())
        );
        let mut child = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign"])
            .arg(&self.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("openssl dgst: {e}"))?;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() || out.stdout.is_empty() {
            return Err(format!(
                "openssl dgst: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(format!("{input}.{}", base64url(&out.stdout)))
    }
}

/// Answers one token request, then closes the connection.
fn serve(mut conn: TcpStream, signer: &Signer, log: &Mutex<Vec<String>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let Some((head, body)) = read_request(&mut conn) else {
        return;
    };
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default().to_owned();
    log.lock().unwrap().push(request_line.clone());
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let mut params = parse_form(query);
    if method == "POST" {
        params.extend(parse_form(&String::from_utf8_lossy(&body)));
    }
    let basic = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .and_then(|(_, v)| v.trim().strip_prefix("Basic ").map(str::to_owned))
        .and_then(|b| base64_decode(&b))
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned())));
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let creds = basic.or_else(|| Some((param("username")?, param("password")?)));
    let (status, body) = match creds {
        Some((u, p)) if u != signer.user || p != signer.password => (
            401,
            r#"{"details":"incorrect username or password"}"#.to_owned(),
        ),
        creds => {
            // Like Docker Hub: anonymous callers get a valid token that grants nothing.
            let access: Vec<serde_json::Value> = match &creds {
                None => Vec::new(),
                Some(_) => params
                    .iter()
                    .filter(|(k, _)| k == "scope")
                    .filter_map(|(_, s)| scope(s))
                    .collect(),
            };
            let sub = creds.as_ref().map_or("", |(u, _)| u.as_str());
            match signer.mint(sub, serde_json::Value::Array(access)) {
                Ok(t) => (
                    200,
                    serde_json::json!({
                        "token": t, "access_token": t, "expires_in": TTL_SECS,
                    })
                    .to_string(),
                ),
                Err(e) => (500, serde_json::json!({ "details": e }).to_string()),
            }
        }
    };
    let reason = if status == 200 { "OK" } else { "Error" };
    let _ = write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Turns `repository:name:pull,push` into a JWT access entry granting what was asked.
fn scope(s: &str) -> Option<serde_json::Value> {
    let (kind, rest) = s.split_once(':')?;
    let (name, actions) = rest.rsplit_once(':')?;
    let actions: Vec<&str> = actions.split(',').filter(|a| !a.is_empty()).collect();
    Some(serde_json::json!({"type": kind, "name": name, "actions": actions}))
}

/// Reads headers and a Content-Length body; `None` if the peer went away.
fn read_request(conn: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = conn.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 1 << 16 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let len = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[end + 4..].to_vec();
    while body.len() < len.min(1 << 16) {
        let n = conn.read(&mut chunk).ok().filter(|&n| n > 0)?;
        body.extend_from_slice(&chunk[..n]);
    }
    Some((head, body))
}

/// Splits `a=b&c=d` with percent and `+` decoding (query strings and form bodies).
fn parse_form(s: &str) -> Vec<(String, String)> {
    let decode = |v: &str| {
        let v = v.replace('+', " ");
        let b = v.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
                (b'%', Some(c)) => {
                    out.push(c);
                    i += 3;
                }
                (c, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}
