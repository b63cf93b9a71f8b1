//! Changing a sandbox's egress policy while it runs (or is paused): the same checks as
//! at create, the namespace's rules replaced in one nftables transaction, the new
//! policy recorded so that a restarted daemon loads it again and branch children
//! (which copy their parent's record) inherit it.
use super::{Manager, STATE_PAUSED, STATE_RUNNING};
use crate::error::{Error, Result};
use crate::model::{EventLevel, NetworkMode, Sandbox, SetNetworkRequest};

impl Manager {
    /// `PUT /v1/sandboxes/{id}/network`.
    ///
    /// Order, so that a kill -9 between any two steps never leaves the rules in force
    /// more open than the recorded policy: (1) the namespace gets the rules letting out
    /// only what *both* the old and the new policy let out (tighter than either); (2)
    /// the new policy is recorded; (3) the namespace gets the new policy's rules. A
    /// crash after (1) leaves rules tighter than the recorded old policy, one after (2)
    /// rules tighter than the recorded new one; either way the restarted daemon loads
    /// the recorded policy's rules ([`Manager::reattach_networks`]). Recording first
    /// would leave an old, more open ruleset under a tighter record; loading the new
    /// rules first would leave a more open ruleset under the old record.
    pub async fn set_network(&self, id: &str, req: SetNetworkRequest) -> Result<Sandbox> {
        let policy = req.policy()?;
        self.network
            .check(&policy)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        let _guard = self.lock(id).await;
        let mut row = self.sandbox_row(id)?;
        if row.state != STATE_RUNNING && row.state != STATE_PAUSED {
            return Err(Error::WrongState {
                id: row.id.clone(),
                state: row.state.clone(),
                action: "change the network of",
                needs: "running or paused",
            });
        }
        let old = row.network.policy.clone();
        let att = row.network.attachment.clone();
        let secrets = super::egress_secrets::secret_bindings(&row.env);
        // Without a namespace (the user backend), `none` is QEMU's `restrict`, fixed
        // when the VM starts: a running VM cannot switch (a paused one takes it at resume).
        if att.is_none()
            && row.vm.is_some()
            && (old.mode == NetworkMode::None) != (policy.mode == NetworkMode::None)
        {
            return Err(Error::Unsupported(
                "switching between network \"none\" and \"egress\" of a running sandbox \
                 needs the isolated network (see GET /v1/info)"
                    .into(),
            ));
        }
        if let Some(att) = &att {
            let (net, att, old, new, secrets) = (
                self.network.clone(),
                att.clone(),
                old.clone(),
                policy.clone(),
                secrets.clone(),
            );
            self.blocking(move || net.load_policy(&att, Some(&old), &new, &secrets))
                .await?
                .map_err(|e| Error::Internal(format!("network: {e}")))?;
        }
        crate::fault::point("network.narrowed");
        row.network.policy = policy.clone();
        self.db.put_sandbox(&row)?;
        crate::fault::point("network.recorded");
        if let Some(att) = att {
            let net = self.network.clone();
            self.blocking(move || net.load_policy(&att, None, &policy, &secrets))
                .await?
                .map_err(|e| Error::Internal(format!("network: {e}")))?;
        }
        tracing::info!(sandbox = %row.id, "network policy changed");
        let view = &self.view(&row).network;
        self.event_log.record(
            &row.id,
            EventLevel::Info,
            "network policy changed",
            &[
                ("mode", view.mode.as_str().to_string()),
                ("allow_out", view.allow_out.join(",")),
                ("deny_out", view.deny_out.join(",")),
            ],
        );
        Ok(self.view(&row))
    }
}
