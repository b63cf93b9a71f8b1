//! What a merge leaves behind if the daemon dies in the middle: the short-lived sandbox
//! holding the common state, and staging directories in the guest merged into. Before
//! it starts either, a merge writes `merges/<base sandbox>.json` naming them; it removes
//! the record when it has cleaned up. A daemon starting finds the records of merges a
//! crash interrupted and finishes their clean-up (the guest may then still have
//! completed the merge's `apply` on its own: that request runs to its end once sent).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use zygote_proto::TreeOp;

use super::Manager;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct MergeIntent {
    /// The sandbox started from the common state.
    pub base_sandbox: String,
    /// The sandbox merged into, and the staging directories made in it.
    pub target: String,
    pub staging: Vec<String>,
}

impl MergeIntent {
    fn path(&self, m: &Manager) -> PathBuf {
        m.dirs.merges.join(format!("{}.json", self.base_sandbox))
    }

    /// Recorded (durably) before the base sandbox or any staging directory exists.
    pub fn record(&self, m: &Manager) -> Result<()> {
        let path = self.path(m);
        let body = serde_json::to_vec(self).map_err(|e| Error::Internal(e.to_string()))?;
        write_synced(&path, &body).map_err(Error::io(format!("recording {}", path.display())))
    }

    pub fn forget(&self, m: &Manager) {
        let _ = std::fs::remove_file(self.path(m));
    }
}

/// Puts `body` at `path` whole or not at all, synced: a temp file renamed over it.
pub(super) fn write_synced(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl Manager {
    /// Deletes the base sandboxes and staging directories of merges a crash interrupted.
    pub(crate) async fn finish_interrupted_merges(self: &Arc<Self>) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(&self.dirs.merges) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let path = e.path();
            let intent = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<MergeIntent>(&b).ok());
            if let Some(intent) = intent {
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
            }
            let _ = std::fs::remove_file(&path);
        }
        Ok(())
    }
}
