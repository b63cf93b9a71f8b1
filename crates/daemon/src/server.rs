//! Running the daemon: state directory and token, runtime selection,
//! re-attachment, and serving the API on TCP (optionally TLS) or a Unix socket.
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::api::{self, AppState};
use crate::cgroup::Cgroups;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::ids::random_hex;
use crate::manager::{Dirs, Manager};
use crate::model::RuntimeInfo;
use crate::network::{BackendChoice, Network};
use crate::runtime;
use zygote_api::defaults::TOKEN_FILE;

pub use zygote_api::defaults::{state_dir, DEFAULT_LISTEN};

/// `zygoted` / `zygote serve` options.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// TCP address to listen on.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// Listen on this Unix socket instead of TCP (clients: ZYGOTE_URL=unix:///path).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub unix: Option<PathBuf>,
    /// State directory (database, token, VM files); default $ZYGOTE_STATE_DIR,
    /// else $XDG_STATE_HOME/zygote, else ~/.local/state/zygote.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Force a runtime (`qemu` or `kvm`) instead of picking the best one.
    #[arg(long)]
    pub runtime: Option<String>,
    /// Parent cgroup v2 directory for VM cgroups (default: <our cgroup>/zygote;
    /// $ZYGOTE_CGROUP_ROOT also works).
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,
    /// Sandbox networking: `isolated` (a network namespace per sandbox, nftables policy,
    /// no way to the host; needs root), `user` (QEMU user networking, NOT isolated from
    /// the host) or `auto` (isolated when possible).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub network: BackendChoice,
    /// Where the port proxy serving exposed sandbox ports listens, or `none` [default:
    /// 127.0.0.1:7421; if that is taken the daemon runs without the proxy]. Port 0 picks
    /// a free port: `GET /v1/info` shows it (`proxy.url`).
    #[arg(long, value_name = "ADDR|none")]
    pub proxy_listen: Option<String>,
    /// The upstream resolver each sandbox's resolver (the daemon itself, inside the
    /// sandbox's namespace) asks for the names its policy allows (isolated networking;
    /// default: the first non-loopback nameserver in /etc/resolv.conf). `--dns` is the
    /// old name.
    #[arg(long = "dns-upstream", alias = "dns", value_name = "IPV4")]
    pub dns: Option<std::net::Ipv4Addr>,
    /// PEM certificates the egress proxy trusts, next to this host's roots
    /// (/etc/ssl/certs), when it relays a secret bound to hosts to their server (for a
    /// private CA; secrets go only to servers that prove their name).
    #[arg(long, value_name = "PEM")]
    pub egress_trust: Option<std::path::PathBuf>,
    /// Network namespaces kept made ahead (isolated network), so that a create or a
    /// branch child only loads its rules: each is a namespace with a veth pair, a tap and
    /// rules that let nothing through. 0: each is made when needed.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub network_spares: usize,
    /// kvm runtime: warm spawners each sandbox's VMM keeps, so that branching into one
    /// child needs no fork and no VM build on its path (`zygote vm serve
    /// --warm-spawners`). Each holds a KVM VM and the parent's memory as it was at its
    /// fork, kept caught up. 0 (the default until measured with Linux guests): branches
    /// fork.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub warm_spawners: usize,
    /// Pull from this registry (`host[:port]`) over plain HTTP, as docker's
    /// insecure-registries (loopback registries always are); repeatable. Also
    /// $ZYGOTE_INSECURE_REGISTRIES, comma-separated.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// Seconds between two metrics samples of each running sandbox (1..=3600; 0 turns
    /// sampling off) [default: 5; $ZYGOTE_METRICS_INTERVAL also works]. The history is
    /// kept in memory (720 samples per sandbox) and lost when the daemon restarts.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub metrics_interval: Option<u64>,
}

/// The metrics sampling interval: the flag, else $ZYGOTE_METRICS_INTERVAL, else the
/// default; None: sampling is off.
fn metrics_interval(flag: Option<u64>) -> Result<Option<Duration>> {
    let secs = match flag {
        Some(s) => s,
        None => match std::env::var("ZYGOTE_METRICS_INTERVAL") {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|s| *s <= 3600)
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "ZYGOTE_METRICS_INTERVAL must be whole seconds in 0..=3600, got {v:?}"
                    ))
                })?,
            _ => return Ok(Some(crate::manager::DEFAULT_METRICS_INTERVAL)),
        },
    };
    Ok((secs > 0).then(|| Duration::from_secs(secs)))
}

/// The API token: `<state>/token`, created (0600) on first start.
pub fn load_or_create_token(state: &Path) -> Result<String> {
    let path = state.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("reading {}", path.display()))(e)),
    }
    let token = random_hex(32);
    let tmp = state.join(format!("token.tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(Error::io(format!("creating {}", tmp.display())))?;
    f.write_all(format!("{token}\n").as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(Error::io("writing the token"))?;
    std::fs::rename(&tmp, &path).map_err(Error::io(format!("creating {}", path.display())))?;
    Ok(token)
}

/// Restrict `path` to the daemon's user.
fn private(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(Error::io(
        format!("restricting {} to its owner", path.display()),
    ))
}

/// Opens state, picks the runtime, re-attaches to VMs of a previous run.
pub async fn build_state(args: &ServeArgs) -> Result<AppState> {
    let state = state_dir(args.state_dir.as_deref());
    std::fs::create_dir_all(&state).map_err(Error::io(format!("creating {}", state.display())))?;
    // Only the daemon's user may enter: the state holds the API token, the database and
    // every VM's control and agent sockets (the agent channel's protection).
    private(&state, 0o700)?;
    let token = load_or_create_token(&state)?;
    let db_path = state.join("zygote.db");
    // Private (0600) with its WAL files: `Db::open` sees to it.
    let db = Db::open(&db_path)?;
    let dirs = Dirs::new(state.clone())?;
    let forced = args.runtime.as_deref();
    let selected = runtime::select(forced, args.warm_spawners)?;
    let info = RuntimeInfo {
        name: selected.runtime.name().into(),
        reason: selected.reason.clone(),
        branch: selected.runtime.branch_mechanism().into(),
        snapshot_kinds: selected.runtime.snapshot_kinds(),
        unavailable: selected.unavailable.into_iter().collect(),
    };
    tracing::info!("runtime {}: {}", info.name, info.reason);
    let cgroup_root = args
        .cgroup_root
        .clone()
        .or_else(|| std::env::var_os("ZYGOTE_CGROUP_ROOT").map(PathBuf::from));
    let cgroups = Cgroups::detect(cgroup_root);
    for l in &cgroups.info().limitations {
        tracing::warn!("cgroups: {l}");
    }
    let network = Network::start(
        args.network,
        &dirs.state,
        args.dns,
        args.egress_trust.as_deref(),
    )
    .map_err(|e| Error::Internal(e.to_string()))?;
    tracing::info!("network: {:?}", network.info());
    let manager = Arc::new(
        Manager::new(db, selected.runtime, info, cgroups, dirs, network)
            .with_insecure_registries(args.insecure_registries.clone()),
    );
    manager.reattach_all().await?;
    // After the start-up sweep, which removes every namespace no sandbox owns.
    manager.network.keep_spares(args.network_spares);
    tokio::spawn(manager.clone().watch());
    tokio::spawn(manager.clone().reap_expired());
    match metrics_interval(args.metrics_interval)? {
        Some(every) => {
            tokio::spawn(manager.clone().sample_metrics(every));
        }
        None => tracing::info!("metrics sampling is off"),
    }
    Ok(AppState {
        manager,
        token: Arc::new(token),
        proxy: None,
        logins: Arc::new(crate::ui::LoginCodes::default()),
    })
}

/// Serves until SIGINT/SIGTERM. VMs keep running when the daemon stops; the
/// next start re-attaches to them.
pub async fn serve(args: ServeArgs) -> Result<()> {
    if !crate::ui::built() {
        tracing::warn!("this zygoted was built without the web console: /ui says how to build it");
    }
    let mut state = build_state(&args).await?;
    // Before the API: once the API's line is out, the proxy answers too.
    // E2B's envd is answered on the proxy (crate::e2b).
    let envd = crate::e2b::envd::Envd::new(
        state.manager.clone(),
        crate::e2b::EnvdKeys::new(state.token.clone()),
    );
    state.proxy = crate::proxy::start(
        args.proxy_listen.as_deref(),
        state.manager.clone(),
        state.token.clone(),
        Some(Arc::new(envd)),
    )
    .await?;
    let network = state.manager.network.clone();
    let manager = state.manager.clone();
    let app = api::app(state);
    let shutdown = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down (VMs keep running)");
        network.release_spares();
        manager.event_hub().close();
    };
    if let Some(path) = &args.unix {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)
            .map_err(Error::io(format!("binding {}", path.display())))?;
        announce(&format!("unix://{}", path.display()));
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    } else {
        let tcp = TcpListener::bind(&args.listen)
            .await
            .map_err(Error::io(format!("binding {}", args.listen)))?;
        let addr = tcp.local_addr().map_err(Error::io("local address"))?;
        match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => {
                let listener = TlsListener::new(tcp, tls_acceptor(cert, key)?);
                announce(&format!("https://{addr}"));
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
            _ => {
                announce(&format!("http://{addr}"));
                axum::serve(tcp, app).with_graceful_shutdown(shutdown).await
            }
        }
    }
    .map_err(Error::io("serving"))
}

/// One line on stdout with the URL, so scripts and tests can find the
/// daemon (with `--listen 127.0.0.1:0` the port is chosen by the kernel).
fn announce(url: &str) {
    println!("zygoted listening on {url}");
    let _ = std::io::stdout().flush();
    tracing::info!("listening on {url}");
}

fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let bad =
        |what: &Path, e: &dyn std::fmt::Display| Error::invalid(format!("{}: {e}", what.display()));
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, &e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, &e))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, &e))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Internal(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| Error::invalid(format!("TLS certificate/key: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// TLS on top of a TCP listener. Handshakes run in their own tasks (with a
/// deadline), so one slow client cannot hold up the others.
struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        let addr = tcp.local_addr().expect("bound listener has an address");
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake with {peer}: {e}"),
                        Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
                    }
                });
            }
        });
        TlsListener { rx, addr }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// [`serve`] on its own multi-threaded runtime (for synchronous callers
/// such as `zygote serve`).
pub fn serve_blocking(args: ServeArgs) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting the async runtime"))?
        .block_on(serve(args))
}
