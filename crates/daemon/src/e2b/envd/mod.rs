//! envd, E2B's in-sandbox daemon, served by zygoted itself on the port proxy.
//!
//! E2B's SDKs address envd at `E2B_SANDBOX_URL` with two routing headers,
//! `E2b-Sandbox-Id` and `E2b-Sandbox-Port: 49983`, and the sandbox's envd access token
//! in `X-Access-Token`. The proxy lets [`Envd`] look at each request first (it is the
//! proxy's [`Gate`]): one that carries either routing header is envd's, answered here
//! and never forwarded; any other goes on to the proxy's port rules.
//!
//! Order of checks, as E2B's proxy and envd do them: both routing headers (400
//! `Missing header: ...`); the sandbox exists and runs (502 `The sandbox was not
//! found`, which the SDK turns into "sandbox not running"); `GET /health` needs no
//! token; everything else needs the sandbox's own token (401 with envd's message,
//! before the path is even looked at); then the path: `/files`, `/envs`, `/metrics`, a Connect procedure,
//! or 404 `404 page not found` (text, as envd's Go mux answers).
//!
//! The token is this daemon's HMAC of the sandbox id ([`EnvdKeys`]): it never enters
//! the guest, and [`Gate::guest_secrets`] makes the proxy strip it from whatever it
//! forwards to the sandbox's other ports.
mod book;
mod connect;
mod files;
mod filesystem;
mod metrics;
mod process;
mod process_ctl;
mod pty;
mod selector;
mod signature;
mod stream_input;
pub(crate) mod users;
mod watch;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::codeint::{self, CODE_INTERPRETER_PORT};
use super::{EnvdKeys, ENVD_PORT};
use crate::error::Error;
use crate::manager::Manager;
use crate::model::MAX_JSON_BODY_BYTES;
use crate::proxy::{Gate, GateFuture};
use crate::token::token_matches;
use connect::{Code, ConnectError, Form};

const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// envd's plain-HTTP answers (everything but Connect errors), as
/// `{"code": <status>, "message": ...}`.
#[derive(Debug, thiserror::Error)]
pub enum EnvdError {
    #[error("Missing header: {0}")]
    MissingHeader(&'static str),
    #[error("E2b-Sandbox-Port {0:?} is not a port number")]
    BadPort(String),
    #[error(
        "zygote serves only envd's port {ENVD_PORT} and the code interpreter's \
         {CODE_INTERPRETER_PORT} by E2B's routing headers; reach port \
         {0} at http://{0}-<sandbox>.localhost:<proxy port>/ once exposed (POST \
         /v1/sandboxes/<sandbox>/ports)"
    )]
    OtherPort(u16),
    #[error("The sandbox was not found")]
    SandboxNotFound(String),
    #[error(
        "unauthorized access, please provide a valid access token or method signing if supported"
    )]
    Unauthorized,
    #[error("404 page not found")]
    NoRoute,
    #[error("a query parameter is malformed")]
    BadQuery,
    #[error("the path parameter is missing")]
    MissingPath,
    #[error("the path is over 4096 bytes or has a NUL byte")]
    BadPath,
    #[error(transparent)]
    User(#[from] users::UserError),
    #[error(transparent)]
    Signature(#[from] signature::SignatureError),
    #[error("{0} is not supported by zygote's envd yet")]
    Unsupported(&'static str),
    #[error("unsupported Content-Type {0:?}: multipart/form-data or application/octet-stream")]
    BadContentType(String),
    #[error("malformed multipart body: {0}")]
    BadMultipart(&'static str),
    #[error("more than {0} files in one upload")]
    TooManyFiles(usize),
    #[error("path '{0}' does not exist")]
    FileNotFound(String),
    #[error("not enough disk space available")]
    NoSpace,
    #[error("{1}")]
    Zygote(StatusCode, String),
}

impl EnvdError {
    fn status(&self) -> StatusCode {
        use EnvdError as E;
        match self {
            E::SandboxNotFound(_) => StatusCode::BAD_GATEWAY,
            E::Unauthorized | E::Signature(_) => StatusCode::UNAUTHORIZED,
            E::User(users::UserError::Accounts { .. }) => StatusCode::INTERNAL_SERVER_ERROR,
            E::User(_) => StatusCode::UNAUTHORIZED,
            E::NoRoute | E::FileNotFound(_) => StatusCode::NOT_FOUND,
            E::TooManyFiles(_) => StatusCode::PAYLOAD_TOO_LARGE,
            E::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
            E::Zygote(status, _) => *status,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// A failed file call on `path`: a missing file or a full disk in envd's words.
    fn file(path: &str, e: Error) -> EnvdError {
        // ENOSPC, EDQUOT: the guest's disk (or quota) is full.
        if let Error::Guest(zygote_proto::client::ClientError::Agent(body)) = &e {
            if matches!(body.errno, Some(28 | 122)) {
                return EnvdError::NoSpace;
            }
        }
        match e.status_code() {
            (StatusCode::NOT_FOUND, "guest_not_found") => EnvdError::FileNotFound(path.into()),
            (status, _) => EnvdError::Zygote(status, e.to_string()),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody {
    code: u16,
    message: String,
    #[serde(rename = "sandboxId", skip_serializing_if = "Option::is_none")]
    sandbox_id: Option<String>,
}

impl IntoResponse for EnvdError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let EnvdError::NoRoute = self {
            return (
                status,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "404 page not found\n",
            )
                .into_response();
        }
        let body = ErrorBody {
            code: status.as_u16(),
            message: self.to_string(),
            sandbox_id: match self {
                EnvdError::SandboxNotFound(id) => Some(id),
                _ => None,
            },
        };
        (status, axum::Json(body)).into_response()
    }
}

/// The in-daemon envd: the proxy's [`Gate`].
pub struct Envd {
    manager: Arc<Manager>,
    keys: EnvdKeys,
    watchers: Arc<watch::Watchers>,
    ptys: Arc<pty::Ptys>,
    book: book::ProcessBook,
}

impl Envd {
    pub fn new(manager: Arc<Manager>, keys: EnvdKeys) -> Envd {
        Envd {
            manager,
            keys,
            watchers: Arc::default(),
            ptys: Default::default(),
            book: Default::default(),
        }
    }

    fn alive(&self, id: &str) -> bool {
        self.manager
            .get(id)
            .is_ok_and(|s| !matches!(s.state.as_str(), "dead" | "deleting" | "creating"))
    }

    async fn handle(&self, req: Request) -> Result<Response, EnvdError> {
        let (id, port) = routed_sandbox(req.headers())?;
        if !self.alive(&id) {
            return Err(EnvdError::SandboxNotFound(id));
        }
        if port == CODE_INTERPRETER_PORT {
            let expected = self.keys.access_token(&id);
            let token = match req.headers().get(ACCESS_TOKEN_HEADER) {
                None => codeint::Token::Absent,
                Some(given) if token_matches(given.as_bytes(), expected.as_bytes()) => {
                    codeint::Token::Valid
                }
                Some(_) => return Err(EnvdError::Unauthorized),
            };
            return Ok(codeint::serve(&self.manager, &id, token, req).await);
        }
        let path = req.uri().path().to_string();
        if req.method() == Method::GET && path == "/health" {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let expected = self.keys.access_token(&id);
        match req.headers().get(ACCESS_TOKEN_HEADER) {
            Some(given) if token_matches(given.as_bytes(), expected.as_bytes()) => {}
            // `/files` takes a signed URL instead of the token (envd's rule).
            None if path == "/files" && signature::Signed::of(req.uri()).is_some() => {
                let signed = signature::Signed::of(req.uri()).ok_or(EnvdError::Unauthorized)?;
                signed.check(req.method(), &expected, signature::now_unix())?;
            }
            _ => return Err(EnvdError::Unauthorized),
        }
        self.serve_routed(&id, req).await
    }

    /// A signed `/files` URL without routing headers: the sandbox is the live one whose
    /// token makes the signature match.
    async fn handle_signed(&self, req: Request) -> Result<Response, EnvdError> {
        let signed = signature::Signed::of(req.uri()).ok_or(EnvdError::Unauthorized)?;
        let sandboxes = self
            .manager
            .list(&[])
            .map_err(|e| EnvdError::Zygote(e.status_code().0, e.to_string()))?;
        let now = signature::now_unix();
        for s in sandboxes.iter().filter(|s| self.alive(&s.id)) {
            match signed.check(req.method(), &self.keys.access_token(&s.id), now) {
                Ok(()) => return self.serve_routed(&s.id, req).await,
                Err(signature::SignatureError::Invalid) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(signature::SignatureError::Invalid.into())
    }

    /// A request whose sandbox and credentials are settled.
    async fn serve_routed(&self, id: &str, req: Request) -> Result<Response, EnvdError> {
        let path = req.uri().path().to_string();
        let id = id.to_string();
        match (req.method().clone(), path.as_str()) {
            (Method::GET, "/files") => files::read(&self.manager, &id, req).await,
            (Method::GET, "/envs") => self.envs(&id),
            (Method::GET, "/metrics") => metrics::metrics(&self.manager, &id).await,
            (Method::POST, "/files") => files::write(&self.manager, &id, req).await,
            (Method::POST, p) => match Procedure::of(p) {
                Some(procedure) => Ok(self.rpc(&id, req, procedure).await),
                None => Err(EnvdError::NoRoute),
            },
            _ => Err(EnvdError::NoRoute),
        }
    }

    /// `GET /envs`: the variables every process starts with (the image's, then the
    /// sandbox's `envVars`); secrets' values are never shown, as everywhere in zygote.
    fn envs(&self, id: &str) -> Result<Response, EnvdError> {
        let env = self
            .manager
            .sandbox_row(id)
            .map_err(|e| EnvdError::Zygote(e.status_code().0, e.to_string()))?
            .env;
        let mut vars = env.image.env.clone();
        vars.extend(env.vars);
        Ok(axum::Json(vars).into_response())
    }

    /// A Connect call: the content type is checked, the body read (bounded), then the
    /// procedure served (every procedure of envd's process and filesystem services).
    async fn rpc(&self, id: &str, req: Request, procedure: Procedure) -> Response {
        let Some(form) = connect::form(req.headers()) else {
            return connect::unsupported_media_type();
        };
        let fail = |e: ConnectError| match form {
            Form::Stream => e.stream_response(),
            Form::Unary => e.unary_response(),
        };
        if form != procedure.form() {
            // connect-go takes only its procedure's own form (unary or stream): 415.
            return connect::unsupported_media_type();
        }
        let headers: HeaderMap = req.headers().clone();
        let procs = selector::Procs {
            manager: &self.manager,
            ptys: &self.ptys,
            book: &self.book,
            id,
        };
        if procedure == Procedure::StreamInput {
            // A client stream: read as it comes, never whole.
            return stream_input::serve(procs, &headers, req.into_body()).await;
        }
        let body = match crate::api::read_body(req, MAX_JSON_BODY_BYTES, "a Connect request").await
        {
            Ok((_, body)) => body,
            Err(e) => return fail(ConnectError::new(Code::ResourceExhausted, e.to_string())),
        };
        match procedure {
            Procedure::Start => process::start(procs, &headers, &body).await,
            Procedure::Connect => process::connect(procs, &headers, &body).await,
            // Read as it comes above; a body already read is served the same way.
            Procedure::StreamInput => {
                stream_input::serve(procs, &headers, axum::body::Body::from(body)).await
            }
            Procedure::WatchDir => watch::watch_dir(&self.manager, id, &headers, &body).await,
            Procedure::Watcher(unary) => {
                match self.watchers.serve(&self.manager, id, unary, &body).await {
                    Ok(answer) => connect::unary_ok(&answer),
                    Err(e) => e.unary_response(),
                }
            }
            Procedure::Unary(unary) => match process_ctl::serve(procs, unary, &body).await {
                Ok(answer) => connect::unary_ok(&answer),
                Err(e) => e.unary_response(),
            },
            Procedure::Filesystem(unary) => {
                match filesystem::serve(&self.manager, id, unary, &headers, &body).await {
                    Ok(answer) => connect::unary_ok(&answer),
                    Err(e) => e.unary_response(),
                }
            }
        }
    }
}

/// A Connect procedure zygote's envd serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Procedure {
    Start,
    Connect,
    StreamInput,
    Unary(process_ctl::Unary),
    WatchDir,
    Watcher(watch::Unary),
    Filesystem(filesystem::Unary),
}

impl Procedure {
    fn of(path: &str) -> Option<Procedure> {
        use filesystem::Unary as F;
        use process_ctl::Unary as U;
        use watch::Unary as W;
        Some(match path {
            "/process.Process/Start" => Procedure::Start,
            "/process.Process/Connect" => Procedure::Connect,
            "/process.Process/StreamInput" => Procedure::StreamInput,
            "/process.Process/List" => Procedure::Unary(U::List),
            "/process.Process/SendInput" => Procedure::Unary(U::SendInput),
            "/process.Process/SendSignal" => Procedure::Unary(U::SendSignal),
            "/process.Process/CloseStdin" => Procedure::Unary(U::CloseStdin),
            "/process.Process/Update" => Procedure::Unary(U::Update),
            "/filesystem.Filesystem/WatchDir" => Procedure::WatchDir,
            "/filesystem.Filesystem/CreateWatcher" => Procedure::Watcher(W::CreateWatcher),
            "/filesystem.Filesystem/GetWatcherEvents" => Procedure::Watcher(W::GetWatcherEvents),
            "/filesystem.Filesystem/RemoveWatcher" => Procedure::Watcher(W::RemoveWatcher),
            "/filesystem.Filesystem/Stat" => Procedure::Filesystem(F::Stat),
            "/filesystem.Filesystem/ListDir" => Procedure::Filesystem(F::ListDir),
            "/filesystem.Filesystem/MakeDir" => Procedure::Filesystem(F::MakeDir),
            "/filesystem.Filesystem/Move" => Procedure::Filesystem(F::Move),
            "/filesystem.Filesystem/Remove" => Procedure::Filesystem(F::Remove),
            _ => return None,
        })
    }

    fn form(self) -> Form {
        match self {
            Procedure::Start
            | Procedure::Connect
            | Procedure::StreamInput
            | Procedure::WatchDir => Form::Stream,
            Procedure::Unary(_) | Procedure::Watcher(_) | Procedure::Filesystem(_) => Form::Unary,
        }
    }
}

/// The request's Host is an IP literal or `localhost` (any port): the proxy itself, not
/// a sandbox's `{port}-{id}.` name (E2B's proxy reads its routing headers only then).
fn bare_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// The sandbox a request with E2B's routing headers names, and the port (envd's or the
/// code interpreter's).
fn routed_sandbox(headers: &HeaderMap) -> Result<(String, u16), EnvdError> {
    let get = |name: &'static str, shown: &'static str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .ok_or(EnvdError::MissingHeader(shown))
    };
    let id = get(SANDBOX_ID_HEADER, "E2b-Sandbox-Id")?;
    let port = get(SANDBOX_PORT_HEADER, "E2b-Sandbox-Port")?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| EnvdError::BadPort(port.to_string()))?;
    if port != ENVD_PORT && port != CODE_INTERPRETER_PORT {
        return Err(EnvdError::OtherPort(port));
    }
    // Ids are `sb-` and hex: anything else names no sandbox.
    let valid = id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !valid {
        return Err(EnvdError::SandboxNotFound(String::new()));
    }
    Ok((id.to_ascii_lowercase(), port))
}

impl Gate for Envd {
    fn serve(&self, req: Request) -> GateFuture<'_> {
        Box::pin(async move {
            let ours = req.headers().contains_key(SANDBOX_ID_HEADER)
                || req.headers().contains_key(SANDBOX_PORT_HEADER);
            if !ours {
                // Only on the proxy's own address: a `{port}-{id}.` host is a guest's.
                let signed_files = req.uri().path() == "/files"
                    && bare_host(req.headers())
                    && matches!(*req.method(), Method::GET | Method::POST)
                    && signature::Signed::of(req.uri()).is_some();
                if !signed_files {
                    return Err(req);
                }
                return Ok(self
                    .handle_signed(req)
                    .await
                    .unwrap_or_else(IntoResponse::into_response));
            }
            Ok(self
                .handle(req)
                .await
                .unwrap_or_else(IntoResponse::into_response))
        })
    }

    fn scrub(&self, sandbox: &str, headers: &mut HeaderMap) {
        scrub(&self.keys, sandbox, headers);
    }
}

/// E2B's token header, whoever's token it holds, and the sandbox's token in any other
/// header (an `Authorization: Basic` value's decoded credentials included).
fn scrub(keys: &EnvdKeys, sandbox: &str, headers: &mut HeaderMap) {
    headers.remove(ACCESS_TOKEN_HEADER);
    crate::token::remove_token(headers, &keys.access_token(sandbox));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_requests_lose_every_envd_token() {
        let keys = EnvdKeys::new(Arc::new("daemon".into()));
        let token = keys.access_token("sb-a");
        let mut h = HeaderMap::new();
        h.insert(ACCESS_TOKEN_HEADER, "another sandbox's".parse().unwrap());
        h.insert("x-mine", format!("k={token}").parse().unwrap());
        h.insert("x-guest", "kept".parse().unwrap());
        scrub(&keys, "sb-a", &mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-guest"], "kept");
    }

    #[test]
    fn signed_urls_are_taken_on_the_proxy_address_only() {
        let with_host = |h: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::HOST, h.parse().unwrap());
            m
        };
        for ok in [
            "127.0.0.1:7421",
            "localhost:1",
            "LOCALHOST",
            "[::1]:80",
            "10.0.0.1",
        ] {
            assert!(bare_host(&with_host(ok)), "{ok}");
        }
        for guest in ["8080-sb-12.localhost:7421", "example.com", "[zz]:1"] {
            assert!(!bare_host(&with_host(guest)), "{guest}");
        }
        assert!(!bare_host(&HeaderMap::new()));
    }

    #[test]
    fn routing_headers_name_envd_of_one_sandbox() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        let ok = headers(&[
            (SANDBOX_ID_HEADER, "SB-AB12"),
            (SANDBOX_PORT_HEADER, "49983"),
        ]);
        assert_eq!(routed_sandbox(&ok).unwrap(), ("sb-ab12".into(), ENVD_PORT));
        let code = headers(&[
            (SANDBOX_ID_HEADER, "sb-ab12"),
            (SANDBOX_PORT_HEADER, "49999"),
        ]);
        assert_eq!(routed_sandbox(&code).unwrap().1, CODE_INTERPRETER_PORT);
        let missing = headers(&[(SANDBOX_ID_HEADER, "sb-ab12")]);
        assert!(matches!(
            routed_sandbox(&missing),
            Err(EnvdError::MissingHeader(_))
        ));
        for port in ["+49983", "0", "70000", "x"] {
            let bad = headers(&[(SANDBOX_ID_HEADER, "sb-ab12"), (SANDBOX_PORT_HEADER, port)]);
            assert!(
                matches!(routed_sandbox(&bad), Err(EnvdError::BadPort(_))),
                "{port}"
            );
        }
        let other = headers(&[
            (SANDBOX_ID_HEADER, "sb-ab12"),
            (SANDBOX_PORT_HEADER, "8080"),
        ]);
        assert!(matches!(
            routed_sandbox(&other),
            Err(EnvdError::OtherPort(8080))
        ));
        let odd = headers(&[(SANDBOX_ID_HEADER, "../x"), (SANDBOX_PORT_HEADER, "49983")]);
        assert!(matches!(
            routed_sandbox(&odd),
            Err(EnvdError::SandboxNotFound(_))
        ));
    }
}
