//! What both runtimes do with a VM that just started, was restored or branched: reach
//! its agent, authenticate (and give the agent the sandbox's own token: a child or a
//! restored snapshot wakes up holding its source's), and give the guest an identity of
//! its own (fresh entropy with an immediate CRNG reseed, its hostname, the host's clock).
use std::fs::File;
use std::time::{Duration, Instant};

use zygote_proto::client::{AgentClient, ClientError};
use zygote_proto::{
    NetIdentity, ReidentifyReport, ReidentifyRequest, ReidentifyTimes, SandboxIdentity, UnixTime,
};

use super::{GuestNet, RuntimeError};

/// Pause between attempts while the guest is not answering yet.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// The agent tokens of a VM being brought up (`crate::agent_key`).
#[derive(Clone, PartialEq, Eq)]
pub struct AgentAuth {
    /// The sandbox's own token: what the agent holds once up.
    pub token: String,
    /// The token the guest holds as it starts: its source sandbox's for a snapshot or
    /// branch; None for a fresh boot (the agent takes the first token it is shown).
    pub boot_token: Option<String>,
}

impl std::fmt::Debug for AgentAuth {
    // Secrets stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentAuth { .. }")
    }
}

/// Authenticates a new connection, moves the agent to the sandbox's own token and
/// reidentifies the guest, in one round trip.
fn authenticate_and_reidentify(
    client: &AgentClient,
    auth: &AgentAuth,
    who: &GuestWho,
) -> Result<ReidentifyReport, ClientError> {
    let shown = auth.boot_token.as_deref().unwrap_or(&auth.token);
    let req = reidentify_request(who)?;
    client.hello_and_reidentify(shown, Some(&auth.token), req)
}

/// Where a guest's bring-up spent its time.
#[derive(Debug, Clone, Copy)]
pub struct BringUpTimes {
    /// Until its agent took a connection (failed attempts and their pauses included).
    pub connect: Duration,
    /// Then hello and reidentify, answered.
    pub reidentify: Duration,
    /// The parts of reidentify inside the guest (agents that report them).
    pub guest: Option<ReidentifyTimes>,
}

/// Who the guest is to become: what `reidentify` tells it.
pub struct GuestWho<'a> {
    pub hostname: &'a str,
    pub net: &'a GuestNet,
    pub identity: &'a SandboxIdentity,
    /// The same guest resumed after a pause to disk: it keeps who it is (hostname,
    /// address, machine id; no forked.d hooks), only its clock and RNG are refreshed.
    pub resumed: bool,
}

/// Fresh entropy, hostname, clock and network address, so that siblings never share
/// RNG state or an address; the sandbox's ids for the guest's "you were forked" hooks.
/// A resumed guest gets the clock (it stood still while paused) and entropy only.
fn reidentify_request(who: &GuestWho) -> Result<ReidentifyRequest, ClientError> {
    let mut entropy = vec![0u8; 64];
    {
        use std::io::Read;
        File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut entropy))?;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let time = Some(UnixTime {
        secs: now.as_secs() as i64,
        nanos: now.subsec_nanos(),
    });
    if who.resumed {
        return Ok(ReidentifyRequest {
            entropy,
            time,
            ..Default::default()
        });
    }
    Ok(ReidentifyRequest {
        entropy,
        hostname: Some(who.hostname.to_string()),
        time,
        identity: Some(who.identity.clone()),
        net: net_identity(who.net),
    })
}

/// The guest's interface configuration on `net` (None: QEMU's user network, which
/// configures the guest itself).
pub fn net_identity(net: &GuestNet) -> Option<NetIdentity> {
    match net {
        GuestNet::Tap(t) => Some(NetIdentity {
            interface: "eth0".into(),
            address: format!("{}/{}", t.address, t.prefix),
            gateway: t.gateway.to_string(),
            mac: t.mac.clone(),
        }),
        GuestNet::User { .. } => None,
    }
}

/// Where a VM's agent is and how to tell that the VM is gone.
pub struct AgentTarget<'a> {
    /// A new connection to the agent (each attempt uses its own).
    pub connect: &'a dyn Fn() -> Result<AgentClient, ClientError>,
    /// False once the VM process is gone (no point in waiting).
    pub alive: &'a dyn Fn() -> bool,
    /// The VM process, for messages ("QEMU", "zygote's VMM").
    pub what: &'a str,
    /// Longest one attempt's request may wait for its answer: short where a
    /// connection fails fast until the guest listens (vsock), the whole boot where the
    /// channel accepts at once and holds the request until the agent runs
    /// (virtio-serial).
    pub attempt_limit: Duration,
}

/// Reach the agent and reidentify the guest, retrying while the transport fails before
/// the agent answers (the guest is still booting, or a connection was closed before any
/// reply) until `deadline`. An answer from the agent, even an error, is final.
pub fn bring_up(
    target: &AgentTarget,
    who: &GuestWho,
    auth: &AgentAuth,
    deadline: Instant,
) -> Result<(AgentClient, ReidentifyReport, BringUpTimes), RuntimeError> {
    let mut attempts = 0u32;
    let started = Instant::now();
    loop {
        attempts += 1;
        if !(target.alive)() {
            return Err(RuntimeError::Boot(format!("{} exited", target.what)));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = (target.connect)().and_then(|c| {
            let connected = Instant::now();
            // A booting guest answers nothing, health checks included: the attempt's
            // deadline is the only limit.
            let c = c
                .with_request_timeout(Some(left.min(target.attempt_limit)))
                .with_liveness(None);
            authenticate_and_reidentify(&c, auth, who).map(|r| {
                let times = BringUpTimes {
                    connect: connected - started,
                    reidentify: connected.elapsed(),
                    guest: r.took_us,
                };
                (c, r, times)
            })
        });
        match attempt {
            Ok((c, report, times)) => {
                if attempts > 1 {
                    tracing::debug!("agent answered on attempt {attempts}");
                }
                for h in report.hooks.iter().filter(|h| !h.succeeded()) {
                    tracing::warn!(
                        "sandbox {}: forked.d hook {} failed: {} {}",
                        who.identity.sandbox_id,
                        h.name,
                        h.error.as_deref().unwrap_or(""),
                        h.stderr_tail.trim()
                    );
                }
                let c = c
                    .with_request_timeout(Some(zygote_proto::client::DEFAULT_REQUEST_TIMEOUT))
                    .with_liveness(Some(Default::default()));
                return Ok((c, report, times));
            }
            Err(e) if e.is_transient() && Instant::now() + RETRY_PAUSE < deadline => {
                std::thread::sleep(RETRY_PAUSE);
            }
            Err(e) if e.is_transient() => {
                return Err(RuntimeError::Boot(format!(
                    "the agent did not answer within the time limit ({attempts} attempts): {e}"
                )))
            }
            Err(e) => {
                return Err(RuntimeError::Boot(format!(
                    "the agent refused to authenticate or reidentify the guest: {e}"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn refused() -> ClientError {
        ClientError::Connect {
            target: "test".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        }
    }

    #[test]
    fn transient_failures_are_retried_until_the_deadline() {
        let tries = Cell::new(0);
        let connect = || {
            tries.set(tries.get() + 1);
            Err(refused())
        };
        let err = bring_up(
            &AgentTarget {
                connect: &connect,
                alive: &|| true,
                what: "test VM",
                attempt_limit: Duration::from_secs(1),
            },
            &GuestWho {
                hostname: "h",
                net: &GuestNet::User { restrict: false },
                identity: &SandboxIdentity::default(),
                resumed: false,
            },
            &AgentAuth {
                token: "t".into(),
                boot_token: None,
            },
            Instant::now() + Duration::from_millis(300),
        )
        .err()
        .expect("fails");
        assert!(tries.get() >= 3, "retried: {}", tries.get());
        assert!(err.to_string().contains("did not answer"), "{err}");
    }

    #[test]
    fn a_dead_vm_ends_the_wait_at_once() {
        let connect = || Err(refused());
        let err = bring_up(
            &AgentTarget {
                connect: &connect,
                alive: &|| false,
                what: "QEMU",
                attempt_limit: Duration::from_secs(1),
            },
            &GuestWho {
                hostname: "h",
                net: &GuestNet::User { restrict: false },
                identity: &SandboxIdentity::default(),
                resumed: false,
            },
            &AgentAuth {
                token: "t".into(),
                boot_token: None,
            },
            Instant::now() + Duration::from_secs(60),
        )
        .err()
        .expect("fails");
        assert_eq!(err.to_string(), "VM failed to start: QEMU exited");
    }

    #[test]
    fn a_resumed_guest_keeps_its_identity_and_gets_the_clock() {
        let net = GuestNet::User { restrict: false };
        let identity = SandboxIdentity {
            sandbox_id: "sb-1".into(),
            ..Default::default()
        };
        let mut who = GuestWho {
            hostname: "h",
            net: &net,
            identity: &identity,
            resumed: true,
        };
        let req = reidentify_request(&who).expect("request");
        assert!(req.time.is_some() && !req.entropy.is_empty());
        assert_eq!((req.hostname, req.identity, req.net), (None, None, None));
        who.resumed = false;
        let req = reidentify_request(&who).expect("request");
        assert_eq!(req.hostname.as_deref(), Some("h"));
        assert_eq!(req.identity, Some(identity.clone()));
    }

    #[test]
    fn transient_means_no_answer_from_the_agent() {
        assert!(refused().is_transient());
        assert!(ClientError::Closed("agent closed the connection".into()).is_transient());
        assert!(!ClientError::Protocol("bad frame".into()).is_transient());
        assert!(!ClientError::Timeout {
            what: "reidentify",
            after: Duration::from_secs(1)
        }
        .is_transient());
    }
}
