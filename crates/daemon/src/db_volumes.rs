//! Named volumes in the state database: one row per volume whose image is complete
//! (`crate::manager::volumes` makes the image first, then the row), and which sandbox
//! writes it (`attached_to`). A child module of `db`, in a file of its own.
//!
//! The claim is one conditional statement ([`Db::claim_volume`]), so two creates can
//! never both get a volume. Claims whose sandbox has no record are released on every
//! start: a daemon killed between a claim and its sandbox's record (or between the
//! record's removal and the release) leaves no volume held by nobody.
use rusqlite::{params, OptionalExtension, Row};

use super::Db;
use crate::error::Result;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    size_mib INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    token TEXT NOT NULL,
    attached_to TEXT
);
UPDATE volumes SET attached_to = NULL
    WHERE attached_to IS NOT NULL AND attached_to NOT IN (SELECT id FROM sandboxes);";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    pub id: String,
    pub name: String,
    pub size_mib: u64,
    pub created_at: u64,
    /// The volume content API's bearer token for this volume (E2B's `VolumeAndToken`).
    pub token: String,
    /// The sandbox that writes it.
    pub attached_to: Option<String>,
}

/// What [`Db::delete_volume`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteVolume {
    Deleted,
    Missing,
    /// Mounted in this sandbox.
    Attached(String),
}

fn volume_from_row(r: &Row) -> rusqlite::Result<VolumeRow> {
    Ok(VolumeRow {
        id: r.get(0)?,
        name: r.get(1)?,
        size_mib: r.get::<_, i64>(2)? as u64,
        created_at: r.get::<_, i64>(3)? as u64,
        token: r.get(4)?,
        attached_to: r.get(5)?,
    })
}

const COLUMNS: &str = "id, name, size_mib, created_at, token, attached_to";

impl Db {
    /// Records a volume; false if its name is taken.
    pub fn insert_volume(&self, v: &VolumeRow) -> Result<bool> {
        let added = self.conn().execute(
            "INSERT OR IGNORE INTO volumes (id, name, size_mib, created_at, token, attached_to)
             VALUES (?1, ?2, ?3, ?4, ?5, NULL)",
            params![
                v.id,
                v.name,
                v.size_mib as i64,
                v.created_at as i64,
                v.token
            ],
        )?;
        Ok(added == 1)
    }

    pub fn volumes(&self) -> Result<Vec<VolumeRow>> {
        let conn = self.conn();
        let mut st = conn.prepare(&format!(
            "SELECT {COLUMNS} FROM volumes ORDER BY created_at, id"
        ))?;
        let rows = st.query_map([], volume_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The volume with this id, or else this name.
    pub fn volume(&self, id_or_name: &str) -> Result<Option<VolumeRow>> {
        Ok(self
            .conn()
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM volumes WHERE id = ?1
                     UNION ALL SELECT {COLUMNS} FROM volumes WHERE name = ?1 LIMIT 1"
                ),
                params![id_or_name],
                volume_from_row,
            )
            .optional()?)
    }

    /// Removes a volume's record unless a sandbox has it (one statement: no claim can
    /// slip in between the check and the removal).
    pub fn delete_volume(&self, id: &str) -> Result<DeleteVolume> {
        let conn = self.conn();
        let removed = conn.execute(
            "DELETE FROM volumes WHERE id = ?1 AND attached_to IS NULL",
            params![id],
        )?;
        if removed == 1 {
            return Ok(DeleteVolume::Deleted);
        }
        let holder: Option<Option<String>> = conn
            .query_row(
                "SELECT attached_to FROM volumes WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?;
        Ok(match holder {
            Some(Some(sandbox)) => DeleteVolume::Attached(sandbox),
            // Released in between: the caller may try again.
            Some(None) => DeleteVolume::Attached(String::new()),
            None => DeleteVolume::Missing,
        })
    }

    /// Gives the volume to `sandbox` if nobody has it; the holder otherwise (None: the
    /// volume is gone).
    pub fn claim_volume(
        &self,
        id: &str,
        sandbox: &str,
    ) -> Result<std::result::Result<(), Option<String>>> {
        let conn = self.conn();
        let claimed = conn.execute(
            "UPDATE volumes SET attached_to = ?2 WHERE id = ?1 AND attached_to IS NULL",
            params![id, sandbox],
        )?;
        if claimed == 1 {
            return Ok(Ok(()));
        }
        let holder: Option<Option<String>> = conn
            .query_row(
                "SELECT attached_to FROM volumes WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?;
        Ok(Err(holder.flatten()))
    }

    /// Releases volume `id` if `sandbox` holds it.
    pub fn release_volume(&self, id: &str, sandbox: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE volumes SET attached_to = NULL WHERE id = ?1 AND attached_to = ?2",
            params![id, sandbox],
        )?;
        Ok(())
    }

    /// Releases every volume `sandbox` holds.
    pub fn release_volumes(&self, sandbox: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE volumes SET attached_to = NULL WHERE attached_to = ?1",
            params![sandbox],
        )?;
        Ok(())
    }
}
