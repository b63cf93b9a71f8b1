//! The distribution spec's HTTP exchanges with one repository of one registry, every
//! answer read with a cap.
//!
//! A registry is hostile like an image: it can answer a manifest, token or error
//! request with an endless body, or a blob request with more than the manifest
//! declared. An HTTP client that reads a body in full before anyone checks its size
//! (as `oci-client`, used before, does for manifests, tokens and every error) lets
//! it exhaust the daemon's memory. So the exchanges are made here, on `reqwest`
//! directly, and no body is read but through [`read_capped`] (refused past its cap,
//! and before reading when `Content-Length` already says so), [`error_text`] (the
//! first [`MAX_ERROR_BYTES`] only) or, for blobs, a stream the caller stops at the
//! declared size (`registry.rs`).
//!
//! Authentication (`registry_auth.rs`) is answered when a request is refused with
//! 401, then the request is sent again once: a token that expires during a long
//! pull is renewed the same way. Credentials and tokens go only to the registry's own
//! host (never to the host of a redirect or of an upload location elsewhere:
//! CVE-2020-15157), and a challenge is only answered when it came from that host.
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::{Method, Request, Response, StatusCode, Url};

use crate::error::{OciError, Result};
use crate::reference::{ImageRef, Transport};
use crate::registry_auth::{parse_challenges, Challenge, Credentials, TokenAnswer};

/// A token service's answer is a small JSON document.
pub(crate) const MAX_TOKEN_BYTES: u64 = 1 << 20;
/// Of an error's body, only this much is read (for its message).
pub(crate) const MAX_ERROR_BYTES: usize = 64 << 10;
/// Of an error's message, only this much is shown.
const MAX_MESSAGE_CHARS: usize = 512;
/// A small answer (a document, a token) is whole within this, and an error's body is
/// given this long: a registry trickling bytes holds nothing up forever.
const SMALL_ANSWER_TIME: std::time::Duration = std::time::Duration::from_secs(300);
const ERROR_BODY_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// One repository of one registry, for pulling or (with `push`) pushing too.
pub(crate) struct Session {
    http: reqwest::Client,
    pub image: ImageRef,
    transport: Transport,
    credentials: Credentials,
    /// The token scope asked for: `repository:<name>:pull` (or `:pull,push`).
    scope: String,
    /// The `Authorization` value that worked last, sent with every request to the
    /// registry's host.
    authorization: std::sync::Mutex<Option<HeaderValue>>,
}

impl Session {
    pub fn new(
        transport: &Transport,
        image: ImageRef,
        credentials: Credentials,
        push: bool,
    ) -> Result<Session> {
        let http = transport.http_client().map_err(|e| OciError::Registry {
            registry: image.registry().to_string(),
            message: format!("setting up HTTP: {}", describe(&e)),
        })?;
        let scope = format!(
            "repository:{}:{}",
            image.inner.repository(),
            if push { "pull,push" } else { "pull" }
        );
        Ok(Session {
            http,
            image,
            transport: transport.clone(),
            credentials,
            scope,
            authorization: std::sync::Mutex::new(None),
        })
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The host (and port) requests go to (`docker.io` is `index.docker.io`).
    fn host(&self) -> &str {
        self.image.inner.resolve_registry()
    }

    /// `<scheme>://<host>/v2/<repository>/<tail>`.
    pub fn url(&self, tail: &str) -> Result<Url> {
        let scheme = if self.transport.is_plain_http(self.host()) {
            "http"
        } else {
            "https"
        };
        let text = format!(
            "{scheme}://{}/v2/{}/{tail}",
            self.host(),
            self.image.inner.repository()
        );
        Url::parse(&text).map_err(|e| self.registry_error(format!("bad URL {text}: {e}")))
    }

    /// The manifest URL of the reference (its digest, else its tag, else `latest`).
    pub fn manifest_url(&self, reference: &oci_spec::distribution::Reference) -> Result<Url> {
        let name = reference
            .digest()
            .or(reference.tag())
            .unwrap_or("latest")
            .to_string();
        self.url(&format!("manifests/{name}"))
    }

    /// Sends a request made by `build` (made again, once, after a 401 that could be
    /// answered); any status comes back, see [`Session::expect`].
    pub async fn send(
        &self,
        method: Method,
        url: Url,
        build: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<Response> {
        let make = || {
            build(self.http.request(method.clone(), url.clone()))
                .build()
                .map_err(|e| self.registry_error(describe(&e)))
        };
        let response = self.send_once(make()?).await?;
        if response.status() != StatusCode::UNAUTHORIZED || !self.on_registry(response.url()) {
            return Ok(response);
        }
        let challenges = parse_challenges(
            response
                .headers()
                .get_all(WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        );
        if !self.answer(&challenges).await? {
            return Ok(response);
        }
        self.send_once(make()?).await
    }

    /// Sends `request` as it is, with the session's authorization if it goes to the
    /// registry's host (a request whose body is a stream cannot be sent twice).
    pub async fn send_once(&self, mut request: Request) -> Result<Response> {
        if self.on_registry(request.url()) {
            if let Some(auth) = self.authorization.lock().unwrap().clone() {
                request.headers_mut().insert(AUTHORIZATION, auth);
            }
        }
        let (method, url) = (request.method().clone(), request.url().clone());
        self.http
            .execute(request)
            .await
            .map_err(|e| self.registry_error(format!("{method} {url}: {}", describe(&e))))
    }

    /// Whether `url` is on the registry's own host and port.
    fn on_registry(&self, url: &Url) -> bool {
        let Some(host) = url.host_str() else {
            return false;
        };
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        authority.eq_ignore_ascii_case(self.host())
    }

    /// Sets the authorization a challenge asks for; false when there is nothing to
    /// answer with (basic auth without credentials, a challenge not understood).
    async fn answer(&self, challenges: &[Challenge]) -> Result<bool> {
        let value = match challenges.first() {
            None => return Ok(false),
            Some(Challenge::Basic) => match self.basic_authorization()? {
                Some(basic) => basic,
                None => return Ok(false),
            },
            Some(Challenge::Bearer { realm, service }) => {
                let token = self.token(realm, service.as_deref()).await?;
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        self.unauthorized("its token cannot be sent in a header".into())
                    })?;
                value.set_sensitive(true);
                value
            }
        };
        *self.authorization.lock().unwrap() = Some(value);
        Ok(true)
    }

    /// The basic-auth `Authorization` value; None when anonymous. Encoded by reqwest
    /// on a request that is never sent (it marks the value sensitive, too).
    fn basic_authorization(&self) -> Result<Option<HeaderValue>> {
        let Credentials::Basic { user, password } = &self.credentials else {
            return Ok(None);
        };
        let probe = self
            .http
            .get(self.url("")?)
            .basic_auth(user, Some(password))
            .build()
            .map_err(|e| self.registry_error(describe(&e)))?;
        Ok(probe.headers().get(AUTHORIZATION).cloned())
    }

    /// A token for the session's scope from the token service at `realm`.
    async fn token(&self, realm: &str, service: Option<&str>) -> Result<String> {
        let mut url = Url::parse(realm).map_err(|e| {
            self.unauthorized(format!("its token service {realm:?} is not a URL: {e}"))
        })?;
        let plain_ok = url.host_str().is_some_and(|h| {
            let authority = url.port().map_or(h.to_string(), |p| format!("{h}:{p}"));
            self.transport.is_plain_http(&authority)
        });
        match url.scheme() {
            "https" => {}
            "http" if plain_ok => {}
            _ => {
                return Err(self.unauthorized(format!(
                    "its token service {realm} is not HTTPS: no credentials are sent there"
                )))
            }
        }
        url.query_pairs_mut().append_pair("scope", &self.scope);
        if let Some(service) = service {
            url.query_pairs_mut().append_pair("service", service);
        }
        let mut request = self.http.get(url.clone()).timeout(SMALL_ANSWER_TIME);
        if let Credentials::Basic { user, password } = &self.credentials {
            request = request.basic_auth(user, Some(password));
        }
        let response = request.send().await.map_err(|e| {
            self.registry_error(format!("asking {url} for a token: {}", describe(&e)))
        })?;
        let status = response.status();
        if !status.is_success() {
            let text = error_text(response).await;
            let message = format!("the token service answered {status}: {}", clean(&text));
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => self.unauthorized(message),
                _ => self.registry_error(message),
            });
        }
        let body = read_capped(response, MAX_TOKEN_BYTES, "the token service's answer").await?;
        serde_json::from_slice::<TokenAnswer>(&body)
            .ok()
            .and_then(TokenAnswer::into_token)
            .ok_or_else(|| self.registry_error("the token service's answer holds no token".into()))
    }

    /// `response` if its status is one of `ok`; else the registry's error, read with a
    /// cap and said as one of ours.
    pub async fn expect(&self, response: Response, ok: &[StatusCode]) -> Result<Response> {
        let status = response.status();
        if ok.contains(&status) {
            return Ok(response);
        }
        let url = response.url().clone();
        let text = error_text(response).await;
        Err(self.status_error(status, &url, &text))
    }

    /// A GET of a small document (a manifest, a config), at most `max` bytes.
    pub async fn get_document(
        &self,
        url: Url,
        accept: &[&str],
        max: u64,
        what: &str,
    ) -> Result<Vec<u8>> {
        let accept = HeaderValue::from_str(&accept.join(", ")).expect("media types are ASCII");
        let response = self
            .send(Method::GET, url, |r| {
                r.header(ACCEPT, accept.clone()).timeout(SMALL_ANSWER_TIME)
            })
            .await?;
        let response = self.expect(response, &[StatusCode::OK]).await?;
        read_capped(response, max, what).await
    }

    /// An error status as one of ours: refused credentials, a missing image or blob,
    /// or anything else the registry said.
    fn status_error(&self, status: StatusCode, url: &Url, text: &str) -> OciError {
        #[derive(serde::Deserialize)]
        struct Envelope {
            errors: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            code: String,
            #[serde(default)]
            message: String,
        }
        let errors = serde_json::from_str::<Envelope>(text)
            .map(|e| e.errors)
            .unwrap_or_default();
        let has = |codes: &[&str]| errors.iter().any(|e| codes.contains(&e.code.as_str()));
        let said = if errors.is_empty() {
            clean(text)
        } else {
            clean(
                &errors
                    .iter()
                    .map(|e| e.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        };
        let message = if said.is_empty() {
            format!("{status} for {url}")
        } else {
            format!("{said} ({status} for {url})")
        };
        if status == StatusCode::UNAUTHORIZED || has(&["UNAUTHORIZED", "DENIED"]) {
            self.unauthorized(message)
        } else if status == StatusCode::NOT_FOUND
            || has(&[
                "MANIFEST_UNKNOWN",
                "NAME_UNKNOWN",
                "BLOB_UNKNOWN",
                "NOT_FOUND",
            ])
        {
            OciError::NotFound {
                reference: self.image.name(),
                message,
            }
        } else {
            self.registry_error(message)
        }
    }

    pub fn unauthorized(&self, message: String) -> OciError {
        OciError::Unauthorized {
            registry: self.image.registry().to_string(),
            hint: if self.credentials.is_anonymous() {
                " (no credentials were found: pass them, or add them to ~/.docker/config.json)"
                    .into()
            } else {
                String::new()
            },
            message,
        }
    }

    pub fn registry_error(&self, message: String) -> OciError {
        OciError::Registry {
            registry: self.image.registry().to_string(),
            message,
        }
    }
}

/// A response's body, refused past `max` bytes: before reading when the response
/// says its length, else as soon as the bytes read pass it.
pub(crate) async fn read_capped(mut response: Response, max: u64, what: &str) -> Result<Vec<u8>> {
    let origin = response_origin(&response);
    let too_large = |size: u64| OciError::TooLarge {
        what: format!("{what} (from {origin})"),
        size,
        limit: max,
    };
    if let Some(len) = response.content_length().filter(|&len| len > max) {
        return Err(too_large(len));
    }
    let mut body = Vec::new();
    loop {
        let chunk = response.chunk().await.map_err(|e| OciError::Registry {
            registry: origin.clone(),
            message: format!("reading {what}: {}", describe(&e)),
        })?;
        let Some(chunk) = chunk else {
            return Ok(body);
        };
        let size = (body.len() + chunk.len()) as u64;
        if size > max {
            return Err(too_large(size));
        }
        body.extend_from_slice(&chunk);
    }
}

/// The first [`MAX_ERROR_BYTES`] of an error's body, as text: the rest is not read,
/// nor what has not come within [`ERROR_BODY_TIME`].
pub(crate) async fn error_text(mut response: Response) -> String {
    let mut body = Vec::new();
    let read = async {
        while body.len() < MAX_ERROR_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = MAX_ERROR_BYTES - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                Ok(None) | Err(_) => break,
            }
        }
    };
    let _ = tokio::time::timeout(ERROR_BODY_TIME, read).await;
    String::from_utf8_lossy(&body).into_owned()
}

/// Registry text fit for a message: control characters (a terminal's escapes) out,
/// and at most [`MAX_MESSAGE_CHARS`].
fn clean(text: &str) -> String {
    let mut out: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE_CHARS)
        .collect();
    if text.trim().chars().count() > MAX_MESSAGE_CHARS {
        out.push('…');
    }
    out
}

/// The host a response came from (after redirects), for messages.
fn response_origin(response: &Response) -> String {
    let url = response.url();
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => url.to_string(),
    }
}

/// An error with its causes (reqwest's own message hides e.g. "connection refused").
pub(crate) fn describe(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(reference: &str) -> Session {
        let image = ImageRef::parse(reference).unwrap();
        let credentials = Credentials::Basic {
            user: "u".into(),
            password: "p".into(),
        };
        Session::new(&Transport::default(), image, credentials, false).unwrap()
    }

    #[test]
    fn credentials_go_only_to_the_registrys_own_host_and_port() {
        let s = session("registry.example:5000/app:1");
        let on = |url: &str| s.on_registry(&Url::parse(url).unwrap());
        assert!(on("https://registry.example:5000/v2/app/blobs/x"));
        assert!(on("https://REGISTRY.example:5000/v2/"));
        assert!(!on("https://registry.example/v2/"), "another port");
        assert!(!on("https://cdn.example:5000/blob"), "a redirect elsewhere");
        assert!(!on("https://registry.example.evil:5000/v2/"));
        assert!(!on("https://u:p@registry.example.evil:5000/v2/"));
        // docker.io is reached as index.docker.io.
        let hub = session("alpine:3.20");
        assert!(hub.on_registry(&Url::parse("https://index.docker.io/v2/").unwrap()));
        assert!(!hub.on_registry(&Url::parse("https://auth.docker.io/token").unwrap()));
        assert_eq!(
            hub.url("manifests/3.20").unwrap().as_str(),
            "https://index.docker.io/v2/library/alpine/manifests/3.20"
        );
        let basic = s.basic_authorization().unwrap().unwrap();
        assert_eq!(basic, "Basic dTpw");
        assert!(basic.is_sensitive());
    }

    #[test]
    fn registry_text_in_messages_is_printable_and_short() {
        assert_eq!(clean(" a\x1b[31mred\r\nline "), "a [31mred  line");
        let long = "x".repeat(10_000);
        let cleaned = clean(&long);
        assert_eq!(cleaned.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert!(cleaned.ends_with('…'));
    }
}
