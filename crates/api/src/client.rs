//! A small async HTTP client for zygoted's API over `http://`, `https://`
//! (with a given CA certificate) or `unix://` URLs; used by the CLI and the
//! tests. One connection per request keeps it simple and stateless.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;

use crate::error::ErrorBody;

pub use hyper::Method;

/// Runs `fut` to completion on a fresh single-threaded runtime (for
/// synchronous callers such as the CLI).
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a tokio runtime")
        .block_on(fut)
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad daemon URL {0:?} (want http://HOST:PORT, https://HOST:PORT or unix:///PATH)")]
    Url(String),
    #[error("cannot connect to zygoted at {url}: {source} (is it running? `zygote serve`)")]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("unexpected answer from zygoted: {0}")]
    Decode(String),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// The API's error code, if the daemon answered with an error.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Target {
    Tcp { host: String, port: u16, tls: bool },
    Unix(PathBuf),
}

#[derive(Clone)]
pub struct Client {
    url: String,
    target: Target,
    token: Option<String>,
    tls: Option<tokio_rustls::TlsConnector>,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Client {
    pub fn new(url: &str, token: Option<String>) -> Result<Client, ClientError> {
        let bad = || ClientError::Url(url.to_string());
        let target = if let Some(path) = url.strip_prefix("unix://") {
            Target::Unix(PathBuf::from(path))
        } else {
            let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
                (true, r)
            } else if let Some(r) = url.strip_prefix("http://") {
                (false, r)
            } else {
                return Err(bad());
            };
            let hostport = rest.trim_end_matches('/');
            let (host, port) = hostport.rsplit_once(':').ok_or_else(bad)?;
            Target::Tcp {
                host: host.trim_matches(|c| c == '[' || c == ']').to_string(),
                port: port.parse().map_err(|_| bad())?,
                tls,
            }
        };
        Ok(Client {
            url: url.to_string(),
            target,
            token,
            tls: None,
        })
    }

    /// Trust this PEM CA certificate (e.g. the daemon's self-signed one) for https.
    pub fn with_ca_file(mut self, pem: &Path) -> Result<Client, ClientError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        for cert in
            CertificateDer::pem_file_iter(pem).map_err(|e| ClientError::Tls(e.to_string()))?
        {
            let cert = cert.map_err(|e| ClientError::Tls(e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| ClientError::Tls(e.to_string()))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        self.tls = Some(tokio_rustls::TlsConnector::from(Arc::new(config)));
        Ok(self)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    async fn connect(&self) -> Result<Box<dyn Io>, ClientError> {
        let err = |source| ClientError::Connect {
            url: self.url.clone(),
            source,
        };
        match &self.target {
            Target::Unix(path) => Ok(Box::new(
                tokio::net::UnixStream::connect(path).await.map_err(err)?,
            )),
            Target::Tcp { host, port, tls } => {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(err)?;
                if !tls {
                    return Ok(Box::new(tcp));
                }
                let connector = self.tls.clone().ok_or_else(|| {
                    ClientError::Tls("https needs a CA certificate (ZYGOTE_CA_CERT)".into())
                })?;
                let name = rustls_pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| ClientError::Tls(e.to_string()))?;
                let stream = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| ClientError::Tls(e.to_string()))?;
                Ok(Box::new(stream))
            }
        }
    }

    /// A new HTTP/1 connection to the daemon (upgradable, for WebSockets) sending bodies
    /// of type `B`.
    pub(crate) async fn open<B>(&self) -> Result<hyper::client::conn::http1::SendRequest<B>, ClientError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let io = self.connect().await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("connection: {e}");
            }
        });
        Ok(sender)
    }

    /// A request to `path` with the Host and Authorization headers set.
    pub(crate) fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let host = match &self.target {
            Target::Tcp { host, port, .. } => format!("{host}:{port}"),
            Target::Unix(_) => "localhost".into(),
        };
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, host);
        if let Some(t) = &self.token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        req
    }

    /// Sends one request; the response body is not read yet.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut sender = self.open().await?;
        let (bytes, ctype) = body.unwrap_or((Bytes::new(), "application/json"));
        let req = self
            .request(method, path)
            .header(hyper::header::CONTENT_TYPE, ctype)
            .body(Full::new(bytes))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        Ok(sender.send_request(req).await?)
    }

    /// Sends `req` (a GET asking for an upgrade) and hands back the upgraded
    /// connection; an answer other than 101 becomes its [`ClientError::Api`].
    pub(crate) async fn upgrade(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<(hyper::HeaderMap, hyper::upgrade::Upgraded), ClientError> {
        let mut sender = self.open().await?;
        let mut resp = sender.send_request(req).await?;
        let status = resp.status();
        if status != StatusCode::SWITCHING_PROTOCOLS {
            let bytes = resp.into_body().collect().await?.to_bytes();
            check(status, &bytes)?;
            return Err(ClientError::Decode(format!(
                "HTTP {status} instead of an upgrade"
            )));
        }
        let headers = resp.headers().clone();
        let upgraded = hyper::upgrade::on(&mut resp).await?;
        Ok((headers, upgraded))
    }

    /// Sends a request and reads the whole answer; error statuses become
    /// [`ClientError::Api`].
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<Bytes, ClientError> {
        whole_answer(self.send(method, path, body).await?).await
    }

    /// Sends the file at `file` as the body of a request to `path`, read while it is sent
    /// (a snapshot pack may be larger than memory) with its length announced up front.
    /// Reads the whole answer like [`Client::raw`].
    pub async fn upload(
        &self,
        method: Method,
        path: &str,
        file: &Path,
        ctype: &str,
    ) -> Result<Bytes, ClientError> {
        use futures_util::StreamExt;
        use tokio::io::AsyncReadExt;
        let read_err = |source| ClientError::Read {
            path: file.display().to_string(),
            source,
        };
        let f = tokio::fs::File::open(file).await.map_err(read_err)?;
        let len = f.metadata().await.map_err(read_err)?.len();
        // One chunk at a time; an error ends the body (the daemon then sees it short).
        let chunks = futures_util::stream::unfold(Some(f), |f| async move {
            let mut f = f?;
            let mut buf = vec![0u8; 256 << 10];
            match f.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(hyper::body::Frame::data(Bytes::from(buf))), Some(f)))
                }
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed();
        let mut sender = self.open().await?;
        let req = self
            .request(method, path)
            .header(hyper::header::CONTENT_TYPE, ctype)
            .header(hyper::header::CONTENT_LENGTH, len)
            .body(http_body_util::StreamBody::new(chunks))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        whole_answer(sender.send_request(req).await?).await
    }

    /// A GET whose body goes to `out` as it arrives (a snapshot pack); `on_bytes` gets
    /// the running total. Returns the bytes written.
    pub async fn download(
        &self,
        path: &str,
        out: &mut (dyn std::io::Write + Send),
        mut on_bytes: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        let resp = self.send(Method::GET, path, None).await?;
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            let bytes = body.collect().await?.to_bytes();
            check(status, &bytes)?;
            return Err(ClientError::Decode(format!("HTTP {status}")));
        }
        let mut total = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            if let Some(data) = frame.data_ref() {
                out.write_all(data)
                    .map_err(|e| ClientError::Decode(format!("writing the download: {e}")))?;
                total += data.len() as u64;
                on_bytes(total);
            }
        }
        Ok(total)
    }

    /// A JSON request (body optional) with a JSON answer.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let body = body.map(|b| {
            (
                Bytes::from(serde_json::to_vec(b).expect("request bodies serialize")),
                "application/json",
            )
        });
        let bytes = self.raw(method, path, body).await?;
        let bytes = if bytes.is_empty() {
            Bytes::from_static(b"null")
        } else {
            bytes
        };
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(format!("{e}")))
    }

    /// A request (JSON body optional) whose answer is NDJSON: each line is decoded and
    /// handed to `on_event` as soon as it arrives.
    pub async fn ndjson<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        mut on_event: impl FnMut(T),
    ) -> Result<(), ClientError> {
        let body = body.map(|b| {
            let bytes = serde_json::to_vec(b).expect("request bodies serialize");
            (Bytes::from(bytes), "application/json")
        });
        let resp = self.send(method, path, body).await?;
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            let bytes = body.collect().await?.to_bytes();
            check(status, &bytes)?;
            return Err(ClientError::Decode(format!("HTTP {status}")));
        }
        let mut buf: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            buf.extend_from_slice(data);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let ev = serde_json::from_slice(&line[..line.len() - 1])
                    .map_err(|e| ClientError::Decode(format!("stream line: {e}")))?;
                on_event(ev);
            }
        }
        Ok(())
    }
}

impl Client {
    /// Watch the guest directory `path` of sandbox `id`: each line of
    /// `GET /v1/sandboxes/{id}/files/watch` goes to `on_event` as it arrives, until the
    /// stream ends or `on_event` answers false (which ends the watch: the connection is
    /// closed).
    pub async fn watch_dir(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
        mut on_event: impl FnMut(crate::model::FileWatchEvent) -> bool,
    ) -> Result<(), ClientError> {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("path", path);
        if recursive {
            q.append_pair("recursive", "true");
        }
        let route = format!("/v1/sandboxes/{id}/files/watch?{}", q.finish());
        let go_on = std::cell::Cell::new(true);
        let watch = self.ndjson(Method::GET, &route, None::<&()>, |ev| {
            if go_on.get() && !on_event(ev) {
                go_on.set(false);
            }
        });
        tokio::pin!(watch);
        // Polled until the callback says stop; dropping the future closes the connection.
        std::future::poll_fn(|cx| {
            let polled = std::future::Future::poll(watch.as_mut(), cx);
            if !go_on.get() {
                return std::task::Poll::Ready(Ok(()));
            }
            polled
        })
        .await
    }
}

/// The whole body of `resp`; an error status becomes its [`ClientError::Api`].
async fn whole_answer(resp: Response<Incoming>) -> Result<Bytes, ClientError> {
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    check(status, &bytes)?;
    Ok(bytes)
}

pub(crate) fn check(status: StatusCode, bytes: &[u8]) -> Result<(), ClientError> {
    if status.is_success() {
        return Ok(());
    }
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(b) => Err(ClientError::Api {
            status: status.as_u16(),
            code: b.error.code,
            message: b.error.message,
        }),
        Err(_) => Err(ClientError::Api {
            status: status.as_u16(),
            code: "unknown".into(),
            message: String::from_utf8_lossy(bytes).into_owned(),
        }),
    }
}

impl Client {
    /// Sandbox `id`'s event log entries that `q` asks for
    /// (`GET /v1/sandboxes/{id}/events`).
    pub async fn events(
        &self,
        id: &str,
        q: &crate::model::EventsQuery,
    ) -> Result<crate::model::EventList, ClientError> {
        let mut query = form_urlencoded::Serializer::new(String::new());
        let numbers = [("since_ms", q.since_ms), ("until_ms", q.until_ms)];
        for (name, value) in numbers {
            if let Some(v) = value {
                query.append_pair(name, &v.to_string());
            }
        }
        if let Some(n) = q.limit {
            query.append_pair("limit", &n.to_string());
        }
        if let Some(order) = q.order {
            let order = match order {
                crate::model::EventOrder::Asc => "asc",
                crate::model::EventOrder::Desc => "desc",
            };
            query.append_pair("order", order);
        }
        if let Some(level) = q.level {
            query.append_pair("level", level.as_str());
        }
        if let Some(search) = &q.search {
            query.append_pair("search", search);
        }
        let route = format!("/v1/sandboxes/{id}/events?{}", query.finish());
        self.json(Method::GET, &route, None::<&()>).await
    }
}

impl Client {
    /// The last `limit` entries of sandbox `id`'s egress record
    /// (`GET /v1/sandboxes/{id}/egress`).
    pub async fn egress(
        &self,
        id: &str,
        limit: Option<u32>,
    ) -> Result<crate::model::EgressList, ClientError> {
        let route = match limit {
            Some(n) => format!("/v1/sandboxes/{id}/egress?limit={n}"),
            None => format!("/v1/sandboxes/{id}/egress"),
        };
        self.json(Method::GET, &route, None::<&()>).await
    }

    /// Follows sandbox `id`'s egress record: the last `limit` entries, then each new
    /// one as it happens, to `on_entry` (`?follow=true`), until the daemon ends it.
    pub async fn follow_egress(
        &self,
        id: &str,
        limit: Option<u32>,
        on_entry: impl FnMut(crate::model::EgressEntry),
    ) -> Result<(), ClientError> {
        let limit = limit.map(|n| format!("&limit={n}")).unwrap_or_default();
        let route = format!("/v1/sandboxes/{id}/egress?follow=true{limit}");
        self.ndjson(Method::GET, &route, None::<&()>, on_entry)
            .await
    }
}
