//! Secrets bound to hosts, on the daemon's side: the bindings each sandbox's egress
//! proxy gets (from its stored env), the check at create, and the daemon's egress CA
//! put into the guest's trust store once its VM runs (branch children have it on their
//! disk already). The mechanism is in
//! `zygote_net::egress::{secrets, intercept}`.
use zygote_proto::client::AgentClient;
use zygote_proto::WriteFileRequest;

use super::Manager;
use crate::error::{Error, Result};
use crate::model::{NetworkMode, SandboxEnv, GUEST_CA_BUNDLE, GUEST_EGRESS_CA};
use crate::network::egress::secrets::SecretBinding;
use crate::runtime::VmRecord;

/// Largest CA bundle read from a guest (Debian's is ~200 KiB).
const MAX_BUNDLE: u64 = 8 << 20;

/// What a sandbox's egress proxy swaps in.
pub(crate) fn secret_bindings(env: &SandboxEnv) -> Vec<SecretBinding> {
    env.bound_secrets()
        .filter_map(|(name, s)| {
            Some(SecretBinding {
                name: name.clone(),
                placeholder: s.placeholder.clone()?,
                value: s.value.clone(),
                hosts: s.hosts.clone(),
            })
        })
        .collect()
}

impl Manager {
    /// Refuses secrets bound to hosts where no proxy could swap them in.
    pub(super) fn check_bound_secrets(&self, env: &SandboxEnv, mode: NetworkMode) -> Result<()> {
        if !env.has_bound_secrets() {
            return Ok(());
        }
        if mode == NetworkMode::None {
            return Err(Error::invalid(
                "secrets bound to hosts need network egress (this sandbox has none)",
            ));
        }
        self.network.egress_ca().map(drop).map_err(|why| {
            Error::Unsupported(format!(
                "secrets bound to hosts need the isolated network and its egress CA: {why}"
            ))
        })
    }

    /// Puts the egress CA into a new guest's trust store (once: a snapshot's guest may
    /// hold it), when its sandbox has secrets bound to hosts; on failure the VM is
    /// stopped (the create fails).
    pub(super) async fn install_egress_ca(
        &self,
        id: &str,
        env: &SandboxEnv,
        vm: VmRecord,
    ) -> Result<VmRecord> {
        if !env.has_bound_secrets() {
            return Ok(vm);
        }
        let ca = self
            .network
            .egress_ca()
            .map_err(Error::Unsupported)?
            .to_string();
        let (rt, token) = (self.runtime.clone(), self.dirs.agent_key.token(id));
        // The connection mounting volumes made, if it did (an agent channel carries one
        // connection at a time).
        let cached = self
            .agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        let v = vm.clone();
        let client = self
            .blocking(move || {
                let client = match cached {
                    Some(c) => c,
                    None => rt.connect(&v, &token).map_err(Error::runtime)?,
                };
                match trust_in_guest(&client, &ca) {
                    Ok(()) => Ok(client),
                    Err(e) => {
                        rt.destroy(&v);
                        Err(Error::Unsupported(format!(
                            "putting the egress CA into the guest's trust store: {e}"
                        )))
                    }
                }
            })
            .await??;
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), client);
        Ok(vm)
    }
}

/// Writes the CA to [`GUEST_EGRESS_CA`] and adds it to [`GUEST_CA_BUNDLE`] (made when
/// the image has none).
fn trust_in_guest(client: &AgentClient, ca: &str) -> std::result::Result<(), String> {
    let write = |path: &str, data: Vec<u8>| {
        client
            .write_file_with(WriteFileRequest {
                path: path.into(),
                data,
                mode: Some(0o644),
                append: false,
                create_parents: true,
                owner: None,
            })
            .map_err(|e| format!("{path}: {e}"))
    };
    write(GUEST_EGRESS_CA, ca.as_bytes().to_vec())?;
    let mut bundle = match client.read_file_up_to(GUEST_CA_BUNDLE, MAX_BUNDLE) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(format!("{GUEST_CA_BUNDLE} is over {MAX_BUNDLE} bytes")),
        // None yet (an image without ca-certificates).
        Err(_) => Vec::new(),
    };
    if bundle.windows(ca.len()).any(|w| w == ca.as_bytes()) {
        return Ok(());
    }
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca.as_bytes());
    write(GUEST_CA_BUNDLE, bundle)
}
