//! The port proxy against local servers on 127.0.0.1 (no sandbox): routing by host
//! name and by path, auth, the headers a guest gets, bodies streamed both ways, an
//! upgraded connection, and the errors (401, 404, 502) in the API's format.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use zygote_daemon::proxy::{self, Proxy, Target};

const TOKEN: &str = "test-token";
const SANDBOX: &str = "sb-0123456789ab";
const TIMEOUT: Duration = Duration::from_secs(10);

/// A proxy whose sandbox `SANDBOX` has these ports exposed (port -> (server, public)).
async fn start_proxy(ports: HashMap<u16, (SocketAddr, bool)>) -> SocketAddr {
    let lookup = move |sandbox: &str, port: u16| {
        let (addr, public) = *ports.get(&port).filter(|_| sandbox == SANDBOX)?;
        Some(Target { addr, public })
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = Proxy::new(Arc::new(lookup), Arc::new(TOKEN.into()));
    tokio::spawn(proxy::serve(listener, proxy));
    addr
}

/// An HTTP server on 127.0.0.1 answering with `app`.
async fn start_upstream(app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Answers with what it was asked: method, path and query, headers.
async fn mirror(req: Request) -> axum::Json<Value> {
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap())))
        .collect();
    axum::Json(json!({
        "method": req.method().as_str(),
        "uri": req.uri().to_string(),
        "headers": headers,
    }))
}

/// Sends `req` to `addr` on a new connection.
async fn send<B>(addr: SocketAddr, req: hyper::Request<B>) -> Response<Incoming>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    tokio::time::timeout(TIMEOUT, sender.send_request(req))
        .await
        .expect("an answer in time")
        .unwrap()
}

fn request(
    method: Method,
    proxy: SocketAddr,
    host: Option<&str>,
    path: &str,
    token: Option<&str>,
) -> hyper::http::request::Builder {
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", host.map_or(proxy.to_string(), str::to_string));
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b
}

async fn get(
    proxy: SocketAddr,
    host: Option<&str>,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let req = request(Method::GET, proxy, host, path, token)
        .body(Body::empty())
        .unwrap();
    let resp = send(proxy, req).await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{path}: not JSON: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn routes_by_host_and_path_and_gives_the_guest_clean_headers() {
    let up = start_upstream(axum::Router::new().fallback(mirror)).await;
    let proxy = start_proxy(HashMap::from([(8080, (up, false)), (80, (up, true))])).await;

    // Path form: the prefix goes, the query stays.
    let req = request(
        Method::POST,
        proxy,
        None,
        &format!("/sandboxes/{SANDBOX}/ports/8080/api/x?q=1&r"),
        Some(TOKEN),
    )
    .header("x-app", "kept")
    .header("connection", "keep-alive, x-secret")
    .header("x-secret", "hop-by-hop")
    .header("proxy-authorization", "Basic x")
    .header("x-forwarded-for", "10.9.9.9")
    .body(Body::empty())
    .unwrap();
    let resp = send(proxy, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let seen: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let h = &seen["headers"];
    assert_eq!(
        (&seen["method"], &seen["uri"]),
        (&json!("POST"), &json!("/api/x?q=1&r"))
    );
    assert_eq!(h["x-app"], "kept");
    for gone in ["authorization", "x-secret", "proxy-authorization"] {
        assert!(h.get(gone).is_none(), "{gone} reached the guest: {h}");
    }
    assert_eq!(h["x-forwarded-for"], "10.9.9.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], proxy.to_string());
    assert_eq!(h["host"], proxy.to_string());
    assert_eq!(
        h["x-forwarded-prefix"],
        format!("/sandboxes/{SANDBOX}/ports/8080")
    );

    // Host form: the whole path is the guest's; any port after the name.
    let host = format!("8080-{SANDBOX}.localhost:1234");
    let (status, seen) = get(proxy, Some(&host), "/sandboxes/x?y", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["uri"], "/sandboxes/x?y");
    assert_eq!(seen["headers"]["host"], host);
    assert!(seen["headers"].get("x-forwarded-prefix").is_none());

    // A public port needs no token, and the guest's own credentials go through.
    let req = request(
        Method::GET,
        proxy,
        Some(&format!("80-{SANDBOX}.localhost")),
        "/",
        None,
    )
    .header("authorization", "Bearer the-guests-own")
    .body(Body::empty())
    .unwrap();
    let resp = send(proxy, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let seen: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(seen["headers"]["authorization"], "Bearer the-guests-own");
    // ...but ours never does.
    let (_, seen) = get(
        proxy,
        Some(&format!("80-{SANDBOX}.localhost")),
        "/",
        Some(TOKEN),
    )
    .await;
    assert!(seen["headers"].get("authorization").is_none(), "{seen}");
}

#[tokio::test]
async fn auth_and_errors_in_the_api_format() {
    let up = start_upstream(axum::Router::new().fallback(mirror)).await;
    // A port nothing listens on: bound, then closed.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    // A "server" that answers with something other than HTTP.
    let garbage = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage_addr = garbage.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"SSH-2.0-OpenSSH\r\n\r\n").await;
        }
    });
    let proxy = start_proxy(HashMap::from([
        (8080, (up, false)),
        (9, (closed, false)),
        (10, (garbage_addr, true)),
    ]))
    .await;
    let exposed = format!("/sandboxes/{SANDBOX}/ports/8080/");
    let unknown = format!("/sandboxes/{SANDBOX}/ports/8081/");

    // No or a wrong token: 401, whether or not the port is exposed.
    for path in [&exposed, &unknown] {
        for token in [None, Some("wrong"), Some("test-token-and-more")] {
            let (status, v) = get(proxy, None, path, token).await;
            assert_eq!(
                (status, code(&v)),
                (StatusCode::UNAUTHORIZED, "unauthorized"),
                "{path} {token:?}"
            );
        }
    }
    let req = request(Method::GET, proxy, None, &exposed, None)
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        send(proxy, req).await.headers()["www-authenticate"],
        "Bearer"
    );

    let (status, v) = get(proxy, None, &unknown, Some(TOKEN)).await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::NOT_FOUND, "not_found"),
        "{v}"
    );
    let host = format!("8081-{SANDBOX}.localhost");
    let (status, v) = get(proxy, Some(&host), "/", Some(TOKEN)).await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::NOT_FOUND, "not_found"),
        "{v}"
    );
    let (status, v) = get(proxy, Some("sb-x.localhost"), "/", Some(TOKEN)).await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::NOT_FOUND, "route_not_found"),
        "{v}"
    );
    let (status, v) = get(proxy, None, "/v1/info", None).await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::NOT_FOUND, "route_not_found"),
        "{v}"
    );

    // The guest does not answer, or not in HTTP: 502 saying so.
    let (status, v) = get(
        proxy,
        None,
        &format!("/sandboxes/{SANDBOX}/ports/9/"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::BAD_GATEWAY, "upstream_unreachable"),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("port 9 of sandbox") && message.contains("refused"),
        "{message}"
    );
    let (status, v) = get(
        proxy,
        None,
        &format!("/sandboxes/{SANDBOX}/ports/10/"),
        None,
    )
    .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::BAD_GATEWAY, "upstream_error"),
        "{v}"
    );

    // The bare prefix: to the slash, query kept.
    let bare = format!("/sandboxes/{SANDBOX}/ports/8080?a=b");
    let req = request(Method::GET, proxy, None, &bare, Some(TOKEN))
        .body(Body::empty())
        .unwrap();
    let resp = send(proxy, req).await;
    assert_eq!(resp.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(
        resp.headers()["location"],
        format!("/sandboxes/{SANDBOX}/ports/8080/?a=b")
    );
}

/// The guest's echo answers while the request is still being sent: neither direction
/// is buffered whole.
#[tokio::test]
async fn bodies_stream_both_ways() {
    async fn echo(req: Request) -> Body {
        Body::new(req.into_body())
    }
    async fn big(axum::extract::Path(n): axum::extract::Path<usize>) -> Vec<u8> {
        vec![b'z'; n]
    }
    let app = axum::Router::new()
        .route("/echo", axum::routing::post(echo))
        .route("/big/{n}", axum::routing::get(big));
    let up = start_upstream(app).await;
    let proxy = start_proxy(HashMap::from([(8080, (up, false))])).await;

    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let req = request(
        Method::POST,
        proxy,
        None,
        &format!("/sandboxes/{SANDBOX}/ports/8080/echo"),
        Some(TOKEN),
    )
    .body(body)
    .unwrap();
    tx.send(Ok(Frame::data(Bytes::from("ping-1"))))
        .await
        .unwrap();
    let resp = send(proxy, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut next = async || {
        let frame = tokio::time::timeout(TIMEOUT, body.frame())
            .await
            .expect("a chunk in time, before the request ended");
        frame.map(|f| f.unwrap().into_data().unwrap())
    };
    assert_eq!(next().await.unwrap(), "ping-1");
    tx.send(Ok(Frame::data(Bytes::from("ping-2"))))
        .await
        .unwrap();
    assert_eq!(next().await.unwrap(), "ping-2");
    drop(tx);
    assert_eq!(next().await, None);

    // A large answer arrives whole.
    let n = 16 << 20;
    let req = request(
        Method::GET,
        proxy,
        None,
        &format!("/sandboxes/{SANDBOX}/ports/8080/big/{n}"),
        Some(TOKEN),
    )
    .body(Body::empty())
    .unwrap();
    let resp = send(proxy, req).await;
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes.len(), n);
}

/// What a hand-written test server does once it has read and reported a request head.
#[derive(Clone, Copy)]
enum Then {
    /// Switches to an echo protocol after a 101 (what a WebSocket server does).
    Echo,
    /// Answers 200 with no body.
    Ok,
}

/// A hand-written server that reports each request head it gets, byte for byte (so
/// repeated headers show as sent), then does `then`.
async fn start_recorder(then: Then) -> (SocketAddr, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let head = read_head(&mut s).await;
                let _ = tx.send(head).await;
                match then {
                    Then::Ok => {
                        let ok =
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                        let _ = s.write_all(ok).await;
                    }
                    Then::Echo => echo(s).await,
                }
            });
        }
    });
    (addr, rx)
}

/// A 101, then every read comes back prefixed with `echo:`.
async fn echo(mut s: TcpStream) {
    s.write_all(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
          Upgrade: echo-protocol\r\nX-Guest: yes\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut reply = b"echo:".to_vec();
                reply.extend_from_slice(&buf[..n]);
                s.write_all(&reply).await.unwrap();
            }
        }
    }
}

/// Reads up to the end of an HTTP head (byte by byte: nothing after it is taken).
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

#[tokio::test]
async fn an_upgraded_connection_is_a_pipe_both_ways() {
    let (up, mut heads) = start_recorder(Then::Echo).await;
    let proxy = start_proxy(HashMap::from([(3000, (up, false))])).await;

    let mut s = TcpStream::connect(proxy).await.unwrap();
    let req = format!(
        "GET /sandboxes/{SANDBOX}/ports/3000/ws?room=1 HTTP/1.1\r\nHost: {proxy}\r\n\
         Authorization: Bearer {TOKEN}\r\nConnection: Upgrade\r\nUpgrade: echo-protocol\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let head = tokio::time::timeout(TIMEOUT, read_head(&mut s))
        .await
        .unwrap();
    let lower = head.to_ascii_lowercase();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(lower.contains("upgrade: echo-protocol"), "{head}");
    assert!(lower.contains("x-guest: yes"), "{head}");

    let guest_saw = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(
        guest_saw.starts_with("get /ws?room=1 http/1.1\r\n"),
        "{guest_saw}"
    );
    assert!(guest_saw.contains("upgrade: echo-protocol"), "{guest_saw}");
    assert!(guest_saw.contains("connection: upgrade"), "{guest_saw}");
    assert!(!guest_saw.contains("authorization"), "{guest_saw}");

    for msg in ["hello", "world"] {
        s.write_all(msg.as_bytes()).await.unwrap();
        let want = format!("echo:{msg}");
        let mut got = vec![0u8; want.len()];
        tokio::time::timeout(TIMEOUT, s.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), want);
    }
}

/// A sandbox that is "paused": waking it moves it to its new address (as a resume into a
/// new namespace may), or fails when `refuse` is set.
struct Sleeper {
    old: SocketAddr,
    new: SocketAddr,
    public: bool,
    refuse: bool,
    woken: std::sync::atomic::AtomicUsize,
}

impl proxy::Lookup for Sleeper {
    fn lookup(&self, sandbox: &str, port: u16) -> Option<Target> {
        (sandbox == SANDBOX && port == 8080).then(|| Target {
            addr: if self.woken.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                self.new
            } else {
                self.old
            },
            public: self.public,
        })
    }

    fn wake<'a>(&'a self, _sandbox: &'a str) -> proxy::WakeFuture<'a> {
        Box::pin(async move {
            if self.refuse {
                return Err(format!("sandbox {SANDBOX} is paused"));
            }
            self.woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_request_wakes_the_sandbox_only_when_allowed_and_goes_where_it_now_is() {
    let up = start_upstream(axum::Router::new().fallback(mirror)).await;
    // The address before the wake: nothing listens there.
    let old = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let path = format!("/sandboxes/{SANDBOX}/ports/8080/x");
    for refuse in [false, true] {
        let sleeper = Arc::new(Sleeper {
            old,
            new: up,
            public: false,
            refuse,
            woken: Default::default(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lookup: Arc<dyn proxy::Lookup> = sleeper.clone();
        tokio::spawn(proxy::serve(
            listener,
            Proxy::new(lookup, Arc::new(TOKEN.into())),
        ));

        // Without the token nothing is woken.
        let (status, _) = get(addr, None, &path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(sleeper.woken.load(std::sync::atomic::Ordering::SeqCst), 0);

        let (status, v) = get(addr, None, &path, Some(TOKEN)).await;
        if refuse {
            assert_eq!(
                (status, code(&v)),
                (StatusCode::BAD_GATEWAY, "upstream_unreachable")
            );
            let msg = v["error"]["message"].as_str().unwrap_or("");
            assert!(msg.contains("is paused"), "{v}");
        } else {
            assert_eq!(status, StatusCode::OK, "{v}");
            assert_eq!(v["uri"], "/x", "{v}");
            assert_eq!(sleeper.woken.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
    }
}

/// The API token in every form a client might send it, next to the guest's own
/// credentials: the guest gets its own, never ours (issue 33, defect 4).
#[tokio::test]
async fn our_token_reaches_no_guest_in_any_form() {
    let (guest, mut heads) = start_recorder(Then::Ok).await;
    let proxy = start_proxy(HashMap::from([(80, (guest, true)), (8080, (guest, false))])).await;
    let public = format!("80-{SANDBOX}.localhost");
    let private = format!("/sandboxes/{SANDBOX}/ports/8080/x");
    let upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let cases: [(&str, &str, String, &[&str]); 5] = [
        // Ours second: the first Authorization is the guest's own.
        (
            &public,
            "/",
            format!(
                "Authorization: Bearer the-guests-own\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Proxy-Authorization: Bearer {TOKEN}\r\n"
            ),
            &["authorization: bearer the-guests-own"],
        ),
        // Ours first, then in other schemes (a Basic password, a `token` scheme).
        (
            &public,
            "/",
            format!(
                "Authorization: Bearer {TOKEN}\r\nAuthorization: Basic dXNlcjp0ZXN0LXRva2Vu\r\n\
                 Authorization: token {TOKEN}\r\nAuthorization: Bearer the-guests-own\r\n"
            ),
            &["authorization: bearer the-guests-own"],
        ),
        // A browser's WebSocket: the token as a subprotocol, in one header or several.
        (
            &public,
            "/ws",
            format!(
                "{upgrade}Sec-WebSocket-Protocol: chat, zygote.bearer.{TOKEN}\r\n\
                 Sec-WebSocket-Protocol: zygote.bearer.{TOKEN}\r\n\
                 Sec-WebSocket-Protocol: zygote.bearer.not-even-ours\r\n"
            ),
            &["sec-websocket-protocol: chat\r\n", "upgrade: websocket"],
        ),
        // Only the subprotocol: the header goes altogether.
        (
            &public,
            "/ws",
            format!("{upgrade}Sec-WebSocket-Protocol: zygote.bearer.{TOKEN}\r\n"),
            &["upgrade: websocket"],
        ),
        // A private port: authorized by the first Authorization; none of ours follows.
        (
            "127.0.0.1",
            &private,
            format!(
                "Authorization: Bearer {TOKEN}\r\nAuthorization: Bearer the-guests-own\r\n\
                 {upgrade}Sec-WebSocket-Protocol: zygote.pty.v1, zygote.bearer.{TOKEN}\r\n"
            ),
            &[
                "authorization: bearer the-guests-own",
                "sec-websocket-protocol: zygote.pty.v1\r\n",
            ],
        ),
    ];
    for (host, path, headers, kept) in cases {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Probe: 1\r\n{headers}\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let answer = tokio::time::timeout(TIMEOUT, read_head(&mut s))
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{headers}: {answer}");
        let seen = heads.recv().await.unwrap().to_ascii_lowercase();
        assert!(seen.contains("x-probe: 1"), "{seen}");
        for ours in [
            TOKEN,
            "dxnlcjp0zxn0lxrva2vu",
            "zygote.bearer",
            "proxy-authorization",
        ] {
            assert!(
                !seen.contains(ours),
                "the guest got {ours:?} from\n{headers}\nas\n{seen}"
            );
        }
        for k in kept {
            assert!(seen.contains(k), "{k:?} did not reach the guest: {seen}");
        }
    }
}
