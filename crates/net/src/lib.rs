//! Sandbox networking: each sandbox in a network namespace of its own, with the
//! guest's NIC on a tap there, a veth pair to the host, NAT on the way out, and
//! nftables rules (in the namespace: the sandbox's policy; on the host: no way to the
//! host itself or to other sandboxes) in force before the guest's first packet.
//! The layout and the rules are in [`plan`]; [`host`] runs the tools; [`dns`] is each
//! sandbox's resolver, the daemon itself inside the sandbox's namespace.
//!
//! A crate of its own: the daemon runs it, and `zygote doctor` and the network benches
//! read the same plan and host facts without linking the daemon.
//!
//! Without root, `ip`, `nft` or /dev/net/tun the daemon falls back to the *user*
//! backend (QEMU's user-mode network, no isolation from the host; the kvm runtime
//! then gives guests no NIC) and says so in `GET /v1/info` and `zygote doctor`.
pub mod dns;
pub mod egress;
pub mod host;
pub mod netns;
pub mod plan;
mod spares;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use egress::ca::EgressTls;
use egress::secrets::{intercept_ports, SecretBinding};
use plan::SlotPlan;
use zygote_api::model::{NetworkInfo, NetworkMode, NetworkPolicy, NetworkView};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{what}: {message}")]
    Command { what: String, message: String },
    #[error("no free network slot among the {tried} tried (host links zyv1..zyv{max})", max = plan::MAX_SLOT)]
    NoSlot { tried: usize },
    #[error("isolated networking is unavailable: {0}")]
    Unavailable(String),
}

/// `--network` of `zygote serve`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// Isolated when this host can (root, iproute2, nftables, /dev/net/tun), else user.
    #[default]
    Auto,
    /// Namespaces + nftables; the daemon refuses to start without them.
    Isolated,
    /// QEMU user networking: no isolation from the host.
    User,
}

/// A sandbox's network as stored with it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetRecord {
    pub policy: NetworkPolicy,
    /// Its namespace and slot (None: user backend, or not made yet).
    #[serde(default)]
    pub attachment: Option<Attachment>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    pub slot: u32,
    /// Named namespace (`/run/netns/<netns>`).
    pub netns: String,
}

impl Attachment {
    pub fn plan(&self) -> SlotPlan {
        SlotPlan::new(self.slot)
    }
}

/// What a runtime gives the guest.
#[derive(Debug, Clone, PartialEq)]
pub enum GuestNet {
    /// QEMU user networking; `restrict`: no traffic at all. The kvm runtime gives such a
    /// guest no NIC.
    User { restrict: bool },
    /// A tap inside the sandbox's namespace; the VM process joins the namespace.
    Tap(TapNet),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TapNet {
    pub netns: PathBuf,
    pub tap: String,
    pub mac: String,
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
}

impl TapNet {
    /// The kernel's `ip=` parameter for a fresh boot.
    pub fn kernel_ip_param(&self) -> String {
        let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(self.prefix)));
        format!("ip={}::{}:{mask}::eth0:off", self.address, self.gateway)
    }
}

enum Backend {
    Isolated { dns: Option<Ipv4Addr> },
    User { reason: String },
}

/// The daemon's networking.
pub struct Network {
    backend: Backend,
    /// Each isolated sandbox's resolver.
    resolvers: dns::Resolvers,
    /// Names this daemon's namespaces (`zygote-<instance>-<sandbox>`), derived from its
    /// state directory: daemons sharing a host never touch each other's.
    instance: String,
    /// The egress CA (secrets bound to hosts), or why there is none.
    egress_tls: Result<std::sync::Arc<EgressTls>, String>,
    /// Namespaces made ahead.
    spares: std::sync::Arc<spares::Spares>,
}

impl Network {
    /// Picks the backend and, for the isolated one, enables IPv4 forwarding and installs
    /// the host's rules. `dns`: the upstream resolver of the sandboxes' resolvers (None:
    /// the host's). Called on a tokio runtime, whose tasks serve the resolvers.
    ///
    /// `egress_trust`: PEM certificates the egress proxy trusts, next to the host's
    /// roots, when it relays a secret to a server (`egress::ca`).
    pub fn start(
        choice: BackendChoice,
        state_dir: &Path,
        dns: Option<Ipv4Addr>,
        egress_trust: Option<&Path>,
    ) -> Result<Network, NetError> {
        let instance = instance_of(state_dir);
        let backend = match choice {
            BackendChoice::User => Backend::User {
                reason: "chosen with --network user".into(),
            },
            BackendChoice::Isolated | BackendChoice::Auto => match prepare_host() {
                Ok(()) => {
                    let dns = dns.or_else(|| {
                        host::upstream_dns(
                            &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
                        )
                    });
                    if dns.is_none() {
                        tracing::warn!(
                            "network: no non-loopback resolver in /etc/resolv.conf and no \
                             --dns: sandboxes get no DNS"
                        );
                    }
                    Backend::Isolated { dns }
                }
                Err(e) if choice == BackendChoice::Isolated => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        "network: {e}; sandboxes use QEMU user networking, NOT isolated \
                         from this host"
                    );
                    Backend::User {
                        reason: e.to_string(),
                    }
                }
            },
        };
        let upstream = match &backend {
            Backend::Isolated { dns } => *dns,
            Backend::User { .. } => None,
        };
        let resolvers = dns::Resolvers::new(upstream, tokio::runtime::Handle::try_current().ok());
        let mut egress_tls = Err("the network is not isolated".to_string());
        if let Backend::Isolated { .. } = backend {
            egress_tls = EgressTls::open(&state_dir.join("egress-ca"), egress_trust)
                .map(std::sync::Arc::new)
                .map_err(|e| e.to_string());
            match &egress_tls {
                Ok(tls) => resolvers.set_tls(tls.clone()),
                // A trust file named but unreadable is the operator's mistake: say so.
                Err(e) if egress_trust.is_some() => {
                    return Err(NetError::Unavailable(e.clone()));
                }
                Err(e) => tracing::warn!("network: {e}; secrets bound to hosts are refused"),
            }
        }
        Ok(Network {
            backend,
            resolvers,
            spares: spares::Spares::new(
                netns_prefix(&instance),
                Box::new(move |p| plan::ns_rules(p, &NetworkPolicy::default(), upstream, &[])),
            ),
            instance,
            egress_tls,
        })
    }

    /// The egress CA's certificate (PEM), which a sandbox with secrets bound to hosts
    /// must trust; Err says why such secrets cannot be had here.
    pub fn egress_ca(&self) -> Result<&str, String> {
        match &self.egress_tls {
            Ok(tls) => Ok(&tls.ca_pem),
            Err(e) => Err(e.clone()),
        }
    }

    /// Called with every entry of a sandbox's egress record.
    pub fn observe_egress(&self, observer: egress::proxy::EgressObserver) {
        self.resolvers.set_egress_observer(observer);
    }

    /// Called with every DNS question a sandbox's resolver handles.
    pub fn observe_dns(&self, observer: dns::DnsObserver) {
        self.resolvers.set_observer(observer);
    }

    pub fn isolated(&self) -> bool {
        matches!(self.backend, Backend::Isolated { .. })
    }

    pub fn info(&self) -> NetworkInfo {
        match &self.backend {
            Backend::Isolated { dns } => NetworkInfo {
                backend: "isolated".into(),
                reason: None,
                dns: dns.map(|d| d.to_string()),
            },
            Backend::User { reason } => NetworkInfo {
                backend: "user".into(),
                reason: Some(reason.clone()),
                dns: None,
            },
        }
    }

    /// Refuses policies the backend cannot enforce.
    pub fn check(&self, policy: &NetworkPolicy) -> Result<(), NetError> {
        match &self.backend {
            Backend::User { reason }
                if policy.allow_out.is_some()
                    || !policy.deny_out.is_empty()
                    || policy.has_names() =>
            {
                Err(NetError::Unavailable(format!(
                    "allow_out/deny_out need it ({reason})"
                )))
            }
            _ => Ok(()),
        }
    }

    fn netns_name(&self, sandbox: &str) -> String {
        format!("{}{sandbox}", netns_prefix(&self.instance))
    }

    /// Makes `sandbox`'s namespace, links, tap and rules (blocking; ~tens of ms), or
    /// takes a spare one made ahead and gives it the rules (`spares`). None under the
    /// user backend. On error nothing is left.
    pub fn attach(
        &self,
        sandbox: &str,
        policy: &NetworkPolicy,
        secrets: &[SecretBinding],
    ) -> Result<Option<Attachment>, NetError> {
        let Backend::Isolated { dns } = &self.backend else {
            return Ok(None);
        };
        let ports = intercept_ports(secrets);
        let rules = |p: &SlotPlan| plan::ns_rules(p, policy, *dns, &ports);
        let netns = self.netns_name(sandbox);
        // A leftover of an attempt a crash interrupted (and a resolver still holding a
        // namespace of that name).
        self.resolvers.stop(&netns);
        host::remove(&netns, None);
        let att = match self.spares.take() {
            Some(spare) => {
                self.spares.refill();
                // Named after its sandbox, as one made here would be; then its rules,
                // unless it holds them already.
                let att = Attachment {
                    slot: spare.att.slot,
                    netns,
                };
                let wanted = rules(&att.plan());
                let ready = host::rename_netns(&spare.att.netns, &att.netns)
                    .map_err(|e| (e, &spare.att))
                    .and_then(|()| match wanted == spare.rules {
                        true => Ok(()),
                        false => host::nft(Some(&att.netns), &wanted).map_err(|e| (e, &att)),
                    });
                if let Err((e, named)) = ready {
                    host::remove(&named.netns, Some(&named.plan().host_link));
                    return Err(e);
                }
                att
            }
            None => spares::build(&netns, &mut |p: &SlotPlan| rules(p))?,
        };
        let served = self
            .resolvers
            .serve(sandbox, &att, vec![policy.clone()], secrets.to_vec());
        match served {
            Ok(()) => Ok(Some(att)),
            Err(e) => {
                self.resolvers.stop(&att.netns);
                host::remove(&att.netns, Some(&att.plan().host_link));
                Err(e)
            }
        }
    }

    /// Keeps `n` namespaces made ahead for creates and branch children to take (0:
    /// none); made on a thread of their own. Call after [`Network::sweep`].
    pub fn keep_spares(&self, n: usize) {
        if self.isolated() {
            self.spares.keep(n);
        }
    }

    /// How many spare namespaces are ready.
    pub fn spares_ready(&self) -> usize {
        self.spares.ready_count()
    }

    /// Removes the spare namespaces (the daemon stops).
    pub fn release_spares(&self) {
        self.spares.keep(0);
    }

    /// After a daemon restart: the namespace is still there and its rules are the
    /// policy's (loaded again: idempotent); its resolver is made again (the sockets
    /// died with the daemon that made them).
    pub fn reattach(
        &self,
        sandbox: &str,
        rec: &NetRecord,
        secrets: &[SecretBinding],
    ) -> Result<(), NetError> {
        let (Backend::Isolated { dns }, Some(att)) = (&self.backend, &rec.attachment) else {
            return Ok(());
        };
        if !host::netns_path(&att.netns).exists() {
            return Err(NetError::Unavailable(format!(
                "namespace {} is gone (removed by hand?)",
                att.netns
            )));
        }
        let ports = intercept_ports(secrets);
        host::nft(
            Some(&att.netns),
            &plan::ns_rules(&att.plan(), &rec.policy, *dns, &ports),
        )?;
        self.resolvers
            .serve(sandbox, att, vec![rec.policy.clone()], secrets.to_vec())
    }

    /// Loads the rules of a policy change into `att`'s namespace: `new`'s alone, or
    /// (`old` given) what both `old` and `new` let out. Each load is one nftables
    /// transaction (the ruleset deletes and rebuilds the table in one `nft -f`), so no
    /// packet ever meets an empty table or a mix of two rulesets.
    pub fn load_policy(
        &self,
        att: &Attachment,
        old: Option<&NetworkPolicy>,
        new: &NetworkPolicy,
        secrets: &[SecretBinding],
    ) -> Result<(), NetError> {
        let Backend::Isolated { dns } = &self.backend else {
            return Ok(());
        };
        // The secrets' ports stay with the proxy whatever the policy.
        let ports = intercept_ports(secrets);
        let (rules, policies) = match old {
            Some(old) => (
                plan::ns_rules_between(&att.plan(), old, new, *dns, &ports),
                vec![old.clone(), new.clone()],
            ),
            None => (
                plan::ns_rules(&att.plan(), new, *dns, &ports),
                vec![new.clone()],
            ),
        };
        host::nft(Some(&att.netns), &rules)?;
        // The resolver follows the same steps: both policies, then the new one.
        self.resolvers.set_policies(&att.netns, policies);
        Ok(())
    }

    /// `rec`'s namespace, made unless it has a usable one (a restore reuses the
    /// sandbox's), and what the runtime gives the guest. Blocking.
    /// `secrets`: the sandbox's secrets bound to hosts, which its egress proxy swaps in.
    pub fn ensure(
        &self,
        sandbox: &str,
        rec: &mut NetRecord,
        secrets: &[SecretBinding],
    ) -> Result<GuestNet, NetError> {
        let usable = rec
            .attachment
            .as_ref()
            .is_some_and(|a| host::netns_path(&a.netns).exists());
        if !usable {
            if let Some(old) = rec.attachment.take() {
                self.detach(&old);
            }
            rec.attachment = self.attach(sandbox, &rec.policy, secrets)?;
        } else if let Some(att) = &rec.attachment {
            // A namespace reused (a resume, a restore: the same sandbox, so the same
            // secrets and rules): its resolver runs, or runs again.
            self.resolvers
                .serve(sandbox, att, vec![rec.policy.clone()], secrets.to_vec())?;
        }
        Ok(self.guest_net(rec))
    }

    pub fn detach(&self, att: &Attachment) {
        // Its sockets hold the namespace: they go first.
        self.resolvers.stop(&att.netns);
        host::remove(&att.netns, Some(&att.plan().host_link));
    }

    /// Removes this daemon's namespaces that no sandbox in `keep` owns (crash leftovers).
    pub fn sweep(&self, keep: &HashSet<String>) {
        let prefix = netns_prefix(&self.instance);
        let spares = self.spares.names();
        for name in host::netns_names() {
            if name.starts_with(&prefix) && !keep.contains(&name) && !spares.contains(&name) {
                tracing::info!("network: removing leftover namespace {name}");
                host::remove(&name, None);
            }
        }
    }

    /// What the runtime gives the guest of a sandbox with this record.
    pub fn guest_net(&self, rec: &NetRecord) -> GuestNet {
        match &rec.attachment {
            Some(att) => {
                let p = att.plan();
                GuestNet::Tap(TapNet {
                    netns: host::netns_path(&att.netns),
                    tap: plan::TAP.into(),
                    mac: p.guest_mac,
                    address: p.guest,
                    prefix: plan::GUEST_PREFIX,
                    gateway: plan::GATEWAY,
                })
            }
            None => GuestNet::User {
                restrict: rec.policy.mode == NetworkMode::None,
            },
        }
    }

    pub fn view(&self, rec: &NetRecord) -> NetworkView {
        let mut view = NetworkView::new(
            &rec.policy,
            rec.attachment.as_ref().map(|a| a.plan().guest.to_string()),
            rec.attachment.is_some(),
        );
        view.dns = rec
            .attachment
            .as_ref()
            .and_then(|a| self.resolvers.counts(&a.netns));
        view
    }

    /// The guest's address, for the port proxy (None: not reachable from the host).
    pub fn guest_address(rec: &NetRecord) -> Option<Ipv4Addr> {
        rec.attachment.as_ref().map(|a| a.plan().guest)
    }
}

fn instance_of(state_dir: &Path) -> String {
    hex::encode(&Sha256::digest(state_dir.as_os_str().as_encoded_bytes())[..4])
}

fn netns_prefix(instance: &str) -> String {
    format!("zygote-{instance}-")
}

/// The names of the namespaces of the daemon whose (canonical) state directory is
/// `state_dir` start with this.
pub fn netns_prefix_for(state_dir: &Path) -> String {
    netns_prefix(&instance_of(state_dir))
}

/// Creates the veth pair on a free slot: the kernel's "File exists" for `zyv<k>` means
/// another sandbox (of any daemon on this host) has it, so the next one is tried.
fn claim_slot(netns: &str) -> Result<SlotPlan, NetError> {
    let taken: HashSet<u32> = host::link_names()
        .iter()
        .filter_map(|l| SlotPlan::slot_of(l))
        .collect();
    let start = {
        let mut b = [0u8; 4];
        let _ = getrandom_fill(&mut b);
        u32::from_le_bytes(b) % plan::MAX_SLOT
    };
    let mut tried = 0;
    for i in 0..plan::MAX_SLOT {
        let slot = (start + i) % plan::MAX_SLOT + 1;
        if taken.contains(&slot) {
            continue;
        }
        tried += 1;
        let p = SlotPlan::new(slot);
        match host::run(
            "ip",
            &["-batch", "-"],
            Some(&plan::host_link_cmds(&p, netns)),
        ) {
            Ok(()) => return Ok(p),
            Err(NetError::Command { message, .. })
                if message.contains("File exists") && tried < 64 =>
            {
                continue
            }
            Err(e) => {
                // The link may exist half-configured (created, then an address failed).
                if !matches!(&e, NetError::Command { message, .. } if message.contains("File exists"))
                {
                    host::remove(netns, Some(&p.host_link));
                }
                return Err(e);
            }
        }
    }
    Err(NetError::NoSlot { tried })
}

fn getrandom_fill(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Root, the tools, /dev/net/tun, no clash with the host's routes; then forwarding on
/// and the host's table in place.
fn prepare_host() -> Result<(), NetError> {
    let unavailable = |m: String| Err(NetError::Unavailable(m));
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return unavailable("the daemon is not root (namespaces and nftables need it)".into());
    }
    for tool in ["ip", "nft"] {
        let found = std::process::Command::new(tool)
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok();
        if !found {
            return unavailable(format!(
                "`{tool}` is not installed (Debian: iproute2, nftables; scripts/setup.sh)"
            ));
        }
    }
    if !Path::new("/dev/net/tun").exists() {
        return unavailable("/dev/net/tun is missing".into());
    }
    if let Some(clash) = route_clash() {
        return unavailable(format!(
            "this host already routes {clash}, which overlaps the sandbox ranges \
             {}/{} and {}/{}",
            plan::GUEST_NET,
            plan::GUEST_PREFIX,
            plan::LINK_NET,
            plan::LINK_PREFIX
        ));
    }
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        .map_err(|e| NetError::Unavailable(format!("enabling IPv4 forwarding: {e}")))?;
    // Daemons starting together each replace the shared table, and a transaction that
    // meets another one's may be refused: they take turns (a lock no other program
    // holds), and still try again briefly, for other programs' transactions. Giving up
    // here means running without isolation, so the tries are worth their time.
    let _turn = host_rules_turn();
    let mut tries = 0;
    loop {
        tries += 1;
        match host::nft(None, &plan::host_rules()) {
            Err(e) if tries < 10 => {
                tracing::debug!("loading the host's rules (try {tries}): {e}");
                std::thread::sleep(std::time::Duration::from_millis(20 * tries));
            }
            other => return other,
        }
    }
}

/// An exclusive lock on a file in /run, held until the returned file is dropped; None
/// when the file cannot be opened or locked (then the retries alone must do).
fn host_rules_turn() -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/zygote-host-rules.lock")
        .map_err(|e| tracing::debug!("the host rules' lock: {e}"))
        .ok()?;
    // SAFETY: flock on a descriptor this function owns; it blocks until the lock is ours.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0;
    locked.then_some(file)
}

/// A host route (not one of ours) overlapping the sandbox ranges.
fn route_clash() -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .ok()?;
    route_clashes(&String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .next()
}

/// The lines of `ip -4 route show table all` output whose destination overlaps the
/// sandbox ranges, other than routes on sandboxes' own links (`zygote doctor` shows them
/// too). Lines that start with a route type (local, broadcast, unreachable, ...) or
/// `default` name no destination of their own and are skipped.
pub fn route_clashes(routes: &str) -> Vec<String> {
    let ours = [
        ipnet::Ipv4Net::new(plan::GUEST_NET, plan::GUEST_PREFIX).expect("a valid prefix"),
        ipnet::Ipv4Net::new(plan::LINK_NET, plan::LINK_PREFIX).expect("a valid prefix"),
    ];
    let own_links = format!("dev {}", plan::HOST_LINK_PREFIX);
    routes
        .lines()
        .filter(|line| !line.contains(&own_links))
        .filter(|line| {
            let Some(dst) = line.split_whitespace().next() else {
                return false;
            };
            let net: Option<ipnet::Ipv4Net> = if dst.contains('/') {
                dst.parse().ok()
            } else {
                dst.parse::<Ipv4Addr>().ok().map(ipnet::Ipv4Net::from)
            };
            net.is_some_and(|net| {
                ours.iter()
                    .any(|o| o.contains(&net.network()) || net.contains(&o.network()))
            })
        })
        .map(|line| line.trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::route_clashes;

    #[test]
    fn routes_overlapping_the_sandbox_ranges_are_found() {
        let table = "default via 192.0.2.1 dev eth0 \n\
                     10.0.0.0/8 dev wg0 scope link \n\
                     10.213.42.177 via 10.214.170.194 dev zyv10928 \n\
                     10.214.170.192/30 dev zyv10928 proto kernel scope link src 10.214.170.193 \n\
                     10.214.9.0/24 dev eth1 table 100 \n\
                     10.215.0.0/16 dev eth2 \n\
                     unreachable 10.213.0.0/16 \n\
                     local 10.213.0.1 dev eth3 table local proto kernel scope host \n\
                     broadcast 10.214.255.255 dev eth1 table local \n\
                     192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2 \n";
        assert_eq!(
            route_clashes(table),
            vec![
                "10.0.0.0/8 dev wg0 scope link",
                "10.214.9.0/24 dev eth1 table 100"
            ]
        );
        // The host's real table, with a running daemon's links only: no clash.
        let ours = "10.213.1.2 via 10.214.0.6 dev zyv1 \n10.214.0.4/30 dev zyv1 scope link \n";
        assert!(route_clashes(ours).is_empty());
        assert!(route_clashes("0.0.0.0/0 dev tun0\n").len() == 1);
        assert!(route_clashes("10.213.0.0/33 dev x\n").is_empty());
    }
}
