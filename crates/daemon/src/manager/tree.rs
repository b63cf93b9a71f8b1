//! Branch trees: see the lineage with what each branch costs, keep one branch (a keep
//! records what it deletes first, so a crash midway is finished at start-up: `intent`).
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::intent::Intent;
use super::{Manager, STATE_DEAD};
use crate::db::SandboxRow;
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{KeepRequest, KeepResponse, Origin, SandboxTree, TreeNode, TreeSnapshot};

/// A keep in progress (`intent`): the sandboxes it deletes, in order (each branch's
/// deepest first, the promoted parent last), then the name the kept one takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct KeepIntent {
    pub kept: String,
    pub doomed: Vec<String>,
    /// The promoted parent's name, if it had one.
    #[serde(default)]
    pub name: Option<String>,
}

impl Manager {
    /// The parent of each sandbox in lineage terms: the branch parent, or the source
    /// sandbox of the snapshot it was started from.
    pub(super) fn lineage_parents(
        &self,
        rows: &[SandboxRow],
    ) -> Result<BTreeMap<String, (String, String)>> {
        let snapshots: BTreeMap<String, String> = self
            .db
            .snapshots()?
            .into_iter()
            .map(|s| (s.id, s.source_sandbox))
            .collect();
        Ok(rows
            .iter()
            .filter_map(|r| {
                let (parent, from) = match &r.origin {
                    Origin::Branch {
                        parent,
                        branch_point,
                    } => (parent.clone(), branch_point.clone()),
                    Origin::Snapshot { id } => (snapshots.get(id)?.clone(), id.clone()),
                    Origin::Image { .. } => return None,
                };
                Some((r.id.clone(), (parent, from)))
            })
            .collect())
    }

    pub fn tree(&self, id: &str) -> Result<SandboxTree> {
        let rows = self.db.sandboxes()?;
        if !rows.iter().any(|r| r.id == id) {
            return Err(Error::not_found("sandbox", id));
        }
        let by_id: BTreeMap<&str, &SandboxRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
        let parents = self.lineage_parents(&rows)?;
        let existing_parent = |id: &str| {
            parents
                .get(id)
                .map(|(p, _)| p.as_str())
                .filter(|p| by_id.contains_key(p))
        };
        let mut root = id;
        let mut seen = HashSet::new();
        while let Some(p) = existing_parent(root) {
            if !seen.insert(p) {
                break; // A cycle cannot happen; never loop if it did.
            }
            root = p;
        }
        // Children in creation order (rows come sorted by creation).
        let mut children: BTreeMap<&str, Vec<&SandboxRow>> = BTreeMap::new();
        for r in &rows {
            if let Some(p) = existing_parent(&r.id) {
                children.entry(p).or_default().push(r);
            }
        }
        let mut order = vec![by_id[root]];
        let mut i = 0;
        while i < order.len() {
            let kids = children
                .get(order[i].id.as_str())
                .cloned()
                .unwrap_or_default();
            order.extend(kids);
            i += 1;
        }
        let members: HashSet<&str> = order.iter().map(|r| r.id.as_str()).collect();
        let sandboxes = order
            .iter()
            .map(|r| TreeNode {
                id: r.id.clone(),
                name: r.name.clone(),
                state: r.state.clone(),
                parent: existing_parent(&r.id).map(String::from),
                started_from: parents.get(&r.id).map(|(_, from)| from.clone()),
                children: children
                    .get(r.id.as_str())
                    .map(|k| k.iter().map(|c| c.id.clone()).collect())
                    .unwrap_or_default(),
                unique_memory_bytes: r
                    .vm
                    .as_ref()
                    .filter(|_| r.state != STATE_DEAD)
                    .and_then(|vm| crate::procs::memory_use(vm.process.pid))
                    .map(|m| m.private),
                disk_bytes: super::own_disk_bytes(r),
            })
            .collect();
        let snapshots = self
            .db
            .snapshots()?
            .into_iter()
            .filter(|s| members.contains(s.source_sandbox.as_str()))
            .map(|s| TreeSnapshot {
                id: s.id,
                kind: s.kind,
                source_sandbox: s.source_sandbox,
                size_bytes: s.size_bytes,
            })
            .collect();
        Ok(SandboxTree {
            root: root.to_string(),
            sandboxes,
            snapshots,
        })
    }

    /// Keeps `id` and deletes its siblings (the other children of its branch point)
    /// with their descendants; with `promote`, also its parent, whose name it takes.
    /// What it will delete is recorded first (`intent`): a daemon killed midway finishes
    /// the job at its next start.
    pub async fn keep(self: &Arc<Self>, id: &str, req: KeepRequest) -> Result<KeepResponse> {
        let row = self.sandbox_row(id)?;
        let Origin::Branch {
            parent,
            branch_point,
        } = &row.origin
        else {
            return Err(Error::Conflict(format!(
                "{id} is not a branch child: there are no siblings to drop"
            )));
        };
        let rows = self.db.sandboxes()?;
        let siblings: Vec<&SandboxRow> = rows
            .iter()
            .filter(|r| r.id != id)
            .filter(|r| matches!(&r.origin, Origin::Branch { branch_point: b, .. } if b == branch_point))
            .collect();
        let parent_row = rows.iter().find(|r| &r.id == parent);
        if siblings.is_empty() && !req.promote {
            return Err(Error::Conflict(format!(
                "{id} has no siblings left (branch point {branch_point}); nothing to drop"
            )));
        }
        let promoted = match (req.promote, parent_row) {
            (false, _) => None,
            (true, Some(p)) => Some(p),
            (true, None) => {
                return Err(Error::Conflict(format!(
                    "{id}'s parent {parent} is gone: nothing to promote it over"
                )))
            }
        };
        // Deepest first, so no sandbox outlives its parent in the record mid-way.
        let parents = self.lineage_parents(&rows)?;
        let mut doomed: Vec<String> = Vec::new();
        let mut frontier: Vec<String> = siblings.iter().map(|s| s.id.clone()).collect();
        while let Some(next) = frontier.pop() {
            frontier.extend(
                parents
                    .iter()
                    .filter(|(_, (p, _))| *p == next)
                    .map(|(c, _)| c.clone()),
            );
            doomed.push(next);
        }
        doomed.reverse();
        doomed.extend(promoted.map(|p| p.id.clone()));
        let intent = KeepIntent {
            kept: id.to_string(),
            doomed,
            name: promoted.and_then(|p| p.name.clone()),
        };
        let record = Intent::Keep(intent.clone());
        record.record(self)?;
        // An error (not a crash) is the request's to report: nothing is finished later.
        let deleted = self.carry_out_keep(&intent).await;
        record.forget(self);
        let deleted = deleted?;
        tracing::info!("kept {id}; deleted {deleted:?}");
        Ok(KeepResponse {
            kept: id.to_string(),
            deleted,
            name: intent.name,
        })
    }

    /// Start-up, for a keep a crash interrupted: its deletions are carried out (those
    /// made before the crash are skipped) and the kept sandbox takes its name.
    pub(super) async fn finish_keep(self: &Arc<Self>, intent: &KeepIntent) -> Result<()> {
        tracing::warn!(
            "finishing the keep of {} a crash interrupted (deleting {:?})",
            intent.kept,
            intent.doomed
        );
        self.carry_out_keep(intent).await.map(drop)
    }

    /// The deletions in order, then the name; returns the sandboxes it deleted (one
    /// already gone is skipped: a crash came after its deletion).
    async fn carry_out_keep(self: &Arc<Self>, intent: &KeepIntent) -> Result<Vec<String>> {
        let mut deleted = Vec::new();
        for victim in &intent.doomed {
            match self.delete(victim).await {
                Ok(()) => deleted.push(victim.clone()),
                Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
            fault::point("keep.deleted-one");
        }
        if let Some(name) = &intent.name {
            let _guard = self.lock(&intent.kept).await;
            match self.sandbox_row(&intent.kept) {
                Ok(mut me) => {
                    me.name = Some(name.clone());
                    self.db.put_sandbox(&me)?;
                }
                // Deleted since (only a restart can come in between): no one to name.
                Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }
}
