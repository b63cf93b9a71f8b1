//! What an E2B template build (`e2b/control/templates_build`) leaves behind if the
//! daemon dies in the middle: the sandbox the steps run in, and snapshots of it that no
//! build or cache entry names yet (taken, but not recorded as a step's or the
//! template's). Before it creates the sandbox, a build records a [`TemplateBuildIntent`]
//! naming it; it removes the record once the sandbox is deleted. A daemon starting finds
//! the records of builds a crash interrupted and deletes that sandbox and those
//! snapshots; the build itself is already `error` (`db_templates` marks every build
//! still running at open).
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::intent::Intent;
use super::Manager;
use crate::error::Result;
use crate::model::{CreateSandboxRequest, Sandbox};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TemplateBuildIntent {
    pub build: String,
    /// The sandbox the build runs its steps in (its id is chosen before it exists).
    pub sandbox: String,
}

impl Manager {
    /// Starts the sandbox build `build` runs its steps in, recorded first (see the
    /// module doc): a crash from here on leaves nothing behind after the next start.
    pub async fn start_build_sandbox(
        self: &Arc<Self>,
        build: &str,
        req: CreateSandboxRequest,
    ) -> Result<Sandbox> {
        let intent = TemplateBuildIntent {
            build: build.to_string(),
            sandbox: super::new_id("sb"),
        };
        Intent::TemplateBuild(intent.clone()).record(self)?;
        crate::fault::point("template-build.recorded");
        let made = self
            .create_with_ids(req, vec![intent.sandbox.clone()])
            .await;
        match made {
            Ok(mut v) if !v.is_empty() => Ok(v.remove(0)),
            Ok(_) => Err(crate::error::Error::Internal(
                "create made no sandbox".into(),
            )),
            Err(e) => {
                self.finish_template_build(&intent).await?;
                Intent::TemplateBuild(intent).forget(self);
                Err(e)
            }
        }
    }

    /// Deletes a build's sandbox and the snapshots of it nothing names, then its record.
    pub async fn end_build_sandbox(self: &Arc<Self>, build: &str, sandbox: &str) -> Result<()> {
        let intent = TemplateBuildIntent {
            build: build.to_string(),
            sandbox: sandbox.to_string(),
        };
        self.finish_template_build(&intent).await?;
        Intent::TemplateBuild(intent).forget(self);
        Ok(())
    }

    /// The clean-up of [`Manager::end_build_sandbox`], also run at start for a build a
    /// crash interrupted.
    pub(super) async fn finish_template_build(
        self: &Arc<Self>,
        intent: &TemplateBuildIntent,
    ) -> Result<()> {
        if self.sandbox_row(&intent.sandbox).is_ok() {
            self.delete(&intent.sandbox).await?;
        }
        // Newest first: a later snapshot of the sandbox depends on the earlier ones.
        let mut orphans: Vec<_> = self
            .db
            .snapshots()?
            .into_iter()
            .filter(|s| s.source_sandbox == intent.sandbox)
            .collect();
        orphans.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        for s in orphans {
            if !self.db.template_uses_snapshot(&s.id)? {
                if let Err(e) = self.delete_snapshot(&s.id) {
                    tracing::warn!("template build {}: snapshot {}: {e}", intent.build, s.id);
                }
            }
        }
        Ok(())
    }
}
