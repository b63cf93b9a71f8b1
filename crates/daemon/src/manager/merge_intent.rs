//! What a merge leaves behind if the daemon dies in the middle: the short-lived sandbox
//! holding the common state, and staging directories in the guest merged into. Before
//! it starts either, a merge records a [`MergeIntent`] naming them (`intent`); it
//! removes the record when it has cleaned up. A daemon starting finds the records of
//! merges a crash interrupted and finishes their clean-up (the guest may then still have
//! completed the merge's `apply` on its own: that request runs to its end once sent).
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use zygote_proto::TreeOp;

use super::Manager;
use crate::error::Result;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct MergeIntent {
    /// The sandbox started from the common state.
    pub base_sandbox: String,
    /// The sandbox merged into, and the staging directories made in it.
    pub target: String,
    pub staging: Vec<String>,
}

impl Manager {
    /// Deletes the base sandbox and staging directories of a merge a crash interrupted.
    pub(super) async fn finish_merge(self: &Arc<Self>, intent: &MergeIntent) -> Result<()> {
        tracing::warn!(
            "cleaning up after a merge into {} a crash interrupted",
            intent.target
        );
        if self.sandbox_row(&intent.base_sandbox).is_ok() {
            self.delete(&intent.base_sandbox).await?;
        }
        let ops: Vec<TreeOp> = intent
            .staging
            .iter()
            .map(|s| TreeOp::Remove {
                path: s.clone(),
                recursive: true,
            })
            .collect();
        if self
            .agent_call(&intent.target, move |c| c.apply(ops.clone()))
            .await
            .is_err()
        {
            tracing::warn!(
                "sandbox {}: could not remove merge staging {:?}",
                intent.target,
                intent.staging
            );
        }
        Ok(())
    }
}
