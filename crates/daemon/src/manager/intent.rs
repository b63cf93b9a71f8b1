//! Intent records: how an operation that changes several sandboxes one after another
//! survives a daemon killed in the middle. Before its first change, the operation
//! writes `intents/<operation>-<id>.json` naming everything it is about to make or
//! remove (whole and synced: a temp file renamed over it); it removes the record once
//! done. A daemon starting finds the records of operations a crash interrupted and
//! settles each ([`Manager::finish_interrupted_operations`]), then removes the record.
//!
//! Each operation says how it is settled (its own module):
//! * a merge (`merge_intent`): the short-lived sandbox holding the common state and the
//!   staging directories in the guest merged into are removed (undone);
//! * a keep (`tree`): the deletions it decided on are carried out and the kept sandbox
//!   takes its promoted parent's name (finished: a deleted sibling cannot come back);
//! * an E2B template build (`template_intent`): its build sandbox and the snapshots of
//!   it nothing names are removed (undone; the build is `error`).
//!
//! The settling code is the operation's own: what runs at start-up is what the
//! interrupted request was running, so the two cannot drift apart.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::merge_intent::MergeIntent;
use super::template_intent::TemplateBuildIntent;
use super::tree::KeepIntent;
use super::Manager;
use crate::error::{Error, Result};

/// One operation in progress (see the module doc).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(super) enum Intent {
    Merge(MergeIntent),
    Keep(KeepIntent),
    TemplateBuild(TemplateBuildIntent),
}

impl Intent {
    fn path(&self, m: &Manager) -> PathBuf {
        let name = match self {
            Intent::Merge(i) => format!("merge-{}.json", i.base_sandbox),
            Intent::Keep(i) => format!("keep-{}.json", i.kept),
            Intent::TemplateBuild(i) => format!("template-build-{}.json", i.sandbox),
        };
        m.dirs.intents.join(name)
    }

    /// Recorded (durably) before the operation changes anything.
    pub fn record(&self, m: &Manager) -> Result<()> {
        let path = self.path(m);
        let body = serde_json::to_vec(self).map_err(|e| Error::Internal(e.to_string()))?;
        write_synced(&path, &body).map_err(Error::io(format!("recording {}", path.display())))
    }

    /// The operation is done (or settled): its record goes.
    pub fn forget(&self, m: &Manager) {
        let _ = std::fs::remove_file(self.path(m));
    }
}

/// Puts `body` at `path` whole or not at all, synced: a temp file renamed over it, and
/// the directory synced so the new name outlasts a power cut too.
pub(super) fn write_synced(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Where daemons before intent records kept a merge's (`merges/<base sandbox>.json`,
/// a bare [`MergeIntent`]): still settled, so an upgrade right after a crash loses none.
const LEGACY_MERGES_DIR: &str = "merges";

impl Manager {
    /// Settles every operation a crash interrupted (see the module doc).
    pub(crate) async fn finish_interrupted_operations(self: &Arc<Self>) -> Result<()> {
        let legacy = self.dirs.state.join(LEGACY_MERGES_DIR);
        for path in json_files(&legacy) {
            let intent = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<MergeIntent>(&b).ok());
            if let Some(intent) = intent {
                self.finish_merge(&intent).await?;
            }
            let _ = std::fs::remove_file(&path);
        }
        let _ = std::fs::remove_dir(&legacy);
        for path in json_files(&self.dirs.intents) {
            let intent = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Intent>(&b).ok());
            match &intent {
                Some(Intent::Merge(i)) => self.finish_merge(i).await?,
                Some(Intent::Keep(i)) => {
                    if let Err(e) = self.finish_keep(i).await {
                        // Kept for the next start, which tries again.
                        tracing::warn!("finishing the keep of {}: {e}", i.kept);
                        continue;
                    }
                }
                Some(Intent::TemplateBuild(i)) => {
                    if let Err(e) = self.finish_template_build(i).await {
                        tracing::warn!("cleaning up template build {}: {e}", i.build);
                        continue;
                    }
                }
                None => tracing::warn!("{}: not an intent record; removed", path.display()),
            }
            let _ = std::fs::remove_file(&path);
        }
        Ok(())
    }
}

/// The `*.json` files in `dir` (none if it does not exist); a `*.tmp` is a record whose
/// write a crash interrupted, so its operation had not started: removed.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for path in entries.flatten().map(|e| e.path()) {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => files.push(path),
            Some("tmp") => {
                let _ = std::fs::remove_file(&path);
            }
            _ => {}
        }
    }
    files.sort();
    files
}
