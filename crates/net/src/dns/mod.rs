//! The guests' DNS under the sandbox's policy: each isolated sandbox's resolver is the
//! daemon itself, listening inside the sandbox's namespace on the guest's gateway
//! ([`crate::plan::GATEWAY`]:53; the address images are built with, 10.0.2.3, is
//! rewritten to it by the namespace's rules), so no port of the host is involved.
//! Each question is judged by name ([`policy`]) before anything leaves, and only the
//! question goes upstream ([`message`]), through a socket made in the namespace
//! ([`crate::netns`]), so the host's rules for sandboxes and its NAT apply to it.
//!
//! State: only the sockets (in the namespace) and the recorded policy. A daemon
//! killed at any point leaves nothing to clean; the next one makes the sockets again
//! when it re-attaches the sandbox's namespace (`Network::reattach`). Counters live in
//! memory and start again at zero with the daemon.
pub mod message;
pub mod policy;
pub mod server;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;
use tokio::task::AbortHandle;
use zygote_api::model::{DnsCounts, NetworkPolicy};

use crate::egress::ca::EgressTls;
use crate::egress::proxy::{self, EgressObserver, PROXY_PORT};
use crate::egress::secrets::SecretBinding;
use crate::netns::in_netns;
use crate::plan::GATEWAY;
use crate::{Attachment, NetError};
use server::Resolver;

/// One question the resolver handled, for the sandbox's event log.
#[derive(Debug)]
pub struct DnsLogEntry<'a> {
    pub sandbox: &'a str,
    /// Empty when the message could not be read.
    pub name: &'a str,
    pub qtype: &'a str,
    /// `forwarded`, `empty` (answered without asking), `refused` or `failed`.
    pub verdict: &'static str,
    pub detail: &'a str,
}

/// Called for every question (the daemon writes them to the sandbox's event log).
pub type DnsObserver = Arc<dyn Fn(&DnsLogEntry<'_>) + Send + Sync>;

/// A sandbox's running resolver; its tasks (and so its sockets) end when it is dropped.
struct Running {
    resolver: Arc<Resolver>,
    tasks: Vec<AbortHandle>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // Spliced connections run in tasks of their own: cut them too, so that none
        // outlives the sandbox's network (or keeps its namespace alive).
        self.resolver.live.cut_all();
    }
}

/// The daemon's resolvers, one per sandbox namespace.
pub struct Resolvers {
    upstream: Option<SocketAddrV4>,
    runtime: Option<Handle>,
    observer: Mutex<Option<DnsObserver>>,
    egress_observer: Mutex<Option<EgressObserver>>,
    running: Mutex<HashMap<String, Running>>,
    /// The egress CA (None until set: secrets bound to hosts go out as placeholders).
    tls: Mutex<Option<Arc<EgressTls>>>,
}

impl Resolvers {
    /// `runtime`: where the resolvers' tasks run (None: no resolver is ever started,
    /// as in tools that only read the plan).
    pub fn new(upstream: Option<Ipv4Addr>, runtime: Option<Handle>) -> Resolvers {
        Resolvers {
            upstream: upstream.map(|a| SocketAddrV4::new(a, 53)),
            runtime,
            observer: Mutex::new(None),
            egress_observer: Mutex::new(None),
            running: Mutex::new(HashMap::new()),
            tls: Mutex::new(None),
        }
    }

    pub fn upstream(&self) -> Option<Ipv4Addr> {
        self.upstream.map(|a| *a.ip())
    }

    pub fn set_observer(&self, observer: DnsObserver) {
        *self.observer.lock().unwrap_or_else(|e| e.into_inner()) = Some(observer);
    }

    pub fn set_egress_observer(&self, observer: EgressObserver) {
        *self
            .egress_observer
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(observer);
    }

    pub fn set_tls(&self, tls: Arc<EgressTls>) {
        *self.tls.lock().unwrap_or_else(|e| e.into_inner()) = Some(tls);
    }

    /// Starts `sandbox`'s resolver and egress proxy in `att`'s namespace under
    /// `policies` with `secrets`, or, when they run already, gives them `policies` and
    /// `secrets`. Blocking (the sockets are made on a thread in the namespace).
    pub fn serve(
        &self,
        sandbox: &str,
        att: &Attachment,
        policies: Vec<NetworkPolicy>,
        secrets: Vec<SecretBinding>,
    ) -> Result<(), NetError> {
        let Some(runtime) = &self.runtime else {
            return Ok(());
        };
        if self.set_policies(&att.netns, policies.clone()) {
            self.set_secrets(&att.netns, secrets);
            return Ok(());
        }
        let netns = crate::host::netns_path(&att.netns);
        let at = SocketAddrV4::new(GATEWAY, 53);
        let (udp, tcp, egress) = in_netns(&netns, || {
            let udp = std::net::UdpSocket::bind(at)?;
            udp.set_nonblocking(true)?;
            let tcp = std::net::TcpListener::bind(at)?;
            tcp.set_nonblocking(true)?;
            let egress = std::net::TcpListener::bind(SocketAddrV4::new(GATEWAY, PROXY_PORT))?;
            egress.set_nonblocking(true)?;
            Ok((udp, tcp, egress))
        })
        .map_err(|e| NetError::Command {
            what: format!("the resolver of {sandbox} on {at}"),
            message: e.to_string(),
        })?;
        let observer = self
            .observer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut resolver = Resolver::new(
            sandbox.to_string(),
            netns,
            self.upstream,
            policies,
            observer,
        );
        resolver.tls = self.tls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        *resolver
            .secrets
            .get_mut()
            .unwrap_or_else(|e| e.into_inner()) = secrets;
        let resolver = Arc::new(resolver);
        let _enter = runtime.enter();
        let egress_observer = self
            .egress_observer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (udp, tcp, egress) = tokio::net::UdpSocket::from_std(udp)
            .and_then(|u| {
                Ok((
                    u,
                    tokio::net::TcpListener::from_std(tcp)?,
                    tokio::net::TcpListener::from_std(egress)?,
                ))
            })
            .map_err(|e| NetError::Command {
                what: format!("the resolver of {sandbox}"),
                message: e.to_string(),
            })?;
        let tasks = vec![
            runtime
                .spawn(server::serve_udp(udp, resolver.clone()))
                .abort_handle(),
            runtime
                .spawn(server::serve_tcp(tcp, resolver.clone()))
                .abort_handle(),
            runtime
                .spawn(proxy::serve(egress, resolver.clone(), egress_observer))
                .abort_handle(),
        ];
        let old = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(att.netns.clone(), Running { resolver, tasks });
        drop(old);
        Ok(())
    }

    /// Gives a running resolver and proxy `policies`, cutting the proxied connections
    /// they refuse; false if none runs for `netns`.
    pub fn set_policies(&self, netns: &str, policies: Vec<NetworkPolicy>) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(netns) {
            Some(r) => {
                // The policies first, so that a connection judged from now on meets
                // them; then the open ones are judged again.
                *r.resolver
                    .policies
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = policies.clone();
                let cut = r.resolver.live.recheck(&policies);
                if cut > 0 {
                    tracing::info!(
                        sandbox = %r.resolver.sandbox,
                        "egress: {cut} connection(s) cut by a policy change"
                    );
                }
                true
            }
            None => false,
        }
    }

    /// Gives a running egress proxy `secrets` (those it held no longer go out); false
    /// if none runs for `netns`.
    pub fn set_secrets(&self, netns: &str, secrets: Vec<SecretBinding>) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(netns) {
            Some(r) => {
                *r.resolver
                    .secrets
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = secrets;
                true
            }
            None => false,
        }
    }

    /// Stops the resolver of `netns` (its sockets close, so the namespace can go).
    pub fn stop(&self, netns: &str) {
        let gone = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(netns);
        drop(gone);
    }

    pub fn counts(&self, netns: &str) -> Option<DnsCounts> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.get(netns).map(|r| r.resolver.counters.snapshot())
    }
}
