//! E2B template builds in the state database (issue 35, `e2b/control/templates*`):
//! builds with their logs, the tags that name a build's result, the per-step build
//! cache and the uploads COPY steps read. A child module of `db` (for its connection).
//!
//! A template is a snapshot (`e2b_builds.snapshot`); a tag (`name:tag`) names a build.
//! Every snapshot a build takes belongs to its template (`e2b_template_snapshots`), so
//! that deleting the template deletes them all, also those a later cache entry
//! replaced.
//! Every row that names a snapshot is dropped on start when that snapshot is gone, and
//! a build a crash interrupted (still `waiting` or `building`) is `error` from then on:
//! nothing runs it any more (its sandbox is removed by its intent record,
//! `manager::template_intent`).
use rusqlite::{params, OptionalExtension, Row};

use super::Db;
use crate::error::Result;

/// Run by [`Db::open`].
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS e2b_builds (
    id TEXT PRIMARY KEY,
    template TEXT NOT NULL,
    tags TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    snapshot TEXT,
    defaults TEXT,
    created_at INTEGER NOT NULL,
    vcpus INTEGER,
    mem_mib INTEGER
);
CREATE TABLE IF NOT EXISTS e2b_build_logs (
    build TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL,
    step TEXT,
    PRIMARY KEY (build, seq)
);
CREATE TABLE IF NOT EXISTS e2b_template_tags (
    template TEXT NOT NULL,
    tag TEXT NOT NULL,
    build TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (template, tag)
);
CREATE TABLE IF NOT EXISTS e2b_step_cache (
    key TEXT PRIMARY KEY,
    snapshot TEXT NOT NULL,
    template TEXT NOT NULL,
    defaults TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS e2b_template_snapshots (
    snapshot TEXT PRIMARY KEY,
    template TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS e2b_uploads (
    hash TEXT PRIMARY KEY,
    token TEXT UNIQUE,
    expires_at INTEGER NOT NULL,
    stored INTEGER NOT NULL,
    size INTEGER NOT NULL
);
UPDATE e2b_builds SET status = 'error',
    reason = '{\"message\":\"the build was interrupted: the daemon restarted\"}'
    WHERE status IN ('waiting', 'building');
DELETE FROM e2b_step_cache WHERE snapshot NOT IN (SELECT id FROM snapshots);
DELETE FROM e2b_template_snapshots WHERE snapshot NOT IN (SELECT id FROM snapshots);
UPDATE e2b_builds SET status = 'error', snapshot = NULL,
    reason = '{\"message\":\"the template snapshot was deleted\"}'
    WHERE status = 'ready' AND snapshot NOT IN (SELECT id FROM snapshots);
DELETE FROM e2b_template_tags WHERE build NOT IN
    (SELECT id FROM e2b_builds WHERE status = 'ready');";

/// One build: its template name, state and (once `ready`) the snapshot it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRow {
    pub id: String,
    pub template: String,
    /// JSON list of the tags the build gets when it is ready.
    pub tags: String,
    /// `waiting` (requested, not started), `building`, `ready` or `error`.
    pub status: String,
    /// JSON `{"message", "step"?}` of a failed build.
    pub reason: Option<String>,
    pub snapshot: Option<String>,
    /// JSON of the template's defaults (envs, workdir, user) once ready.
    pub defaults: Option<String>,
    pub created_at: u64,
    /// The build sandbox's size (E2B's cpuCount, memoryMB) when it starts from an image.
    pub vcpus: Option<u32>,
    pub mem_mib: Option<u32>,
}

fn build_from_row(r: &Row) -> rusqlite::Result<BuildRow> {
    Ok(BuildRow {
        id: r.get(0)?,
        template: r.get(1)?,
        tags: r.get(2)?,
        status: r.get(3)?,
        reason: r.get(4)?,
        snapshot: r.get(5)?,
        defaults: r.get(6)?,
        created_at: r.get::<_, i64>(7)? as u64,
        vcpus: r.get(8)?,
        mem_mib: r.get(9)?,
    })
}

const BUILD_COLUMNS: &str = "id, template, tags, status, reason, snapshot, defaults, created_at, \
     vcpus, mem_mib FROM e2b_builds";

/// One line of a build's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildLogRow {
    pub at_ms: u64,
    pub level: String,
    pub message: String,
    pub step: Option<String>,
}

/// A tag of a template and the build it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagRow {
    pub tag: String,
    pub build: String,
    pub created_at: u64,
}

/// A cached build step: the snapshot after it and the template defaults at that point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRow {
    pub snapshot: String,
    pub template: String,
    pub defaults: String,
}

/// An upload of a COPY step's files, by the SDK's files hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRow {
    pub hash: String,
    /// The one-time URL's secret while the upload is awaited.
    pub token: Option<String>,
    pub expires_at: u64,
    pub stored: bool,
    pub size: u64,
}

fn upload_from_row(r: &Row) -> rusqlite::Result<UploadRow> {
    Ok(UploadRow {
        hash: r.get(0)?,
        token: r.get(1)?,
        expires_at: r.get::<_, i64>(2)? as u64,
        stored: r.get(3)?,
        size: r.get::<_, i64>(4)? as u64,
    })
}

impl Db {
    pub fn put_build(&self, b: &BuildRow) -> Result<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO e2b_builds
             (id, template, tags, status, reason, snapshot, defaults, created_at, vcpus, mem_mib)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                b.id,
                b.template,
                b.tags,
                b.status,
                b.reason,
                b.snapshot,
                b.defaults,
                b.created_at as i64,
                b.vcpus,
                b.mem_mib
            ],
        )?;
        Ok(())
    }

    pub fn build(&self, id: &str) -> Result<Option<BuildRow>> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {BUILD_COLUMNS} WHERE id = ?1"),
                [id],
                build_from_row,
            )
            .optional()?)
    }

    /// The builds of a template, oldest first.
    pub fn builds_of(&self, template: &str) -> Result<Vec<BuildRow>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {BUILD_COLUMNS} WHERE template = ?1 ORDER BY created_at, id"
        ))?;
        let rows = stmt.query_map([template], build_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Makes a ready build the one its tags name, in one transaction.
    pub fn finish_build(&self, b: &BuildRow, tags: &[String], now: u64) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE e2b_builds SET status = ?2, reason = ?3, snapshot = ?4, defaults = ?5
             WHERE id = ?1",
            params![b.id, b.status, b.reason, b.snapshot, b.defaults],
        )?;
        for tag in tags {
            tx.execute(
                "INSERT OR REPLACE INTO e2b_template_tags (template, tag, build, created_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![b.template, tag, b.id, now as i64],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Appends lines to a build's log (numbered on from its last one).
    pub fn add_build_logs(&self, build: &str, lines: &[BuildLogRow]) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let next: i64 = tx.query_row(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM e2b_build_logs WHERE build = ?1",
            [build],
            |r| r.get(0),
        )?;
        for (i, l) in lines.iter().enumerate() {
            tx.execute(
                "INSERT INTO e2b_build_logs (build, seq, at_ms, level, message, step)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    build,
                    next + i as i64,
                    l.at_ms as i64,
                    l.level,
                    l.message,
                    l.step
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// At most `limit` lines of a build's log from line `offset` on.
    pub fn build_logs(&self, build: &str, offset: u64, limit: u64) -> Result<Vec<BuildLogRow>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT at_ms, level, message, step FROM e2b_build_logs
             WHERE build = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        )?;
        let rows = stmt.query_map(
            params![build, offset.min(i64::MAX as u64) as i64, limit as i64],
            |r| {
                Ok(BuildLogRow {
                    at_ms: r.get::<_, i64>(0)? as u64,
                    level: r.get(1)?,
                    message: r.get(2)?,
                    step: r.get(3)?,
                })
            },
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn template_tags(&self, template: &str) -> Result<Vec<TagRow>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT tag, build, created_at FROM e2b_template_tags WHERE template = ?1
             ORDER BY created_at, tag",
        )?;
        let rows = stmt.query_map([template], |r| {
            Ok(TagRow {
                tag: r.get(0)?,
                build: r.get(1)?,
                created_at: r.get::<_, i64>(2)? as u64,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Points `tags` of `template` at `build` (replacing what they named).
    pub fn set_tags(&self, template: &str, tags: &[String], build: &str, now: u64) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for tag in tags {
            tx.execute(
                "INSERT OR REPLACE INTO e2b_template_tags (template, tag, build, created_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![template, tag, build, now as i64],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn remove_tags(&self, template: &str, tags: &[String]) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for tag in tags {
            tx.execute(
                "DELETE FROM e2b_template_tags WHERE template = ?1 AND tag = ?2",
                params![template, tag],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Forgets a template: its tags, builds, logs and the cache entries its builds made.
    /// Returns the snapshots those named (the caller deletes the ones nothing else uses).
    pub fn forget_template(&self, template: &str) -> Result<Vec<String>> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut snaps: Vec<String> = Vec::new();
        {
            let mut stmt = tx.prepare(
                "SELECT snapshot FROM e2b_builds WHERE template = ?1 AND snapshot IS NOT NULL
                 UNION SELECT snapshot FROM e2b_step_cache WHERE template = ?1
                 UNION SELECT snapshot FROM e2b_template_snapshots WHERE template = ?1",
            )?;
            let rows = stmt.query_map([template], |r| r.get(0))?;
            for s in rows {
                snaps.push(s?);
            }
        }
        tx.execute(
            "DELETE FROM e2b_build_logs WHERE build IN
             (SELECT id FROM e2b_builds WHERE template = ?1)",
            [template],
        )?;
        tx.execute("DELETE FROM e2b_builds WHERE template = ?1", [template])?;
        tx.execute(
            "DELETE FROM e2b_template_tags WHERE template = ?1",
            [template],
        )?;
        tx.execute("DELETE FROM e2b_step_cache WHERE template = ?1", [template])?;
        tx.execute(
            "DELETE FROM e2b_template_snapshots WHERE template = ?1",
            [template],
        )?;
        tx.commit()?;
        Ok(snaps)
    }

    /// Records that a build of `template` took `snapshot`.
    pub fn own_snapshot(&self, template: &str, snapshot: &str) -> Result<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO e2b_template_snapshots (snapshot, template) VALUES (?1, ?2)",
            params![snapshot, template],
        )?;
        Ok(())
    }

    /// Whether a template build took `snapshot` (it is the template's, not the user's).
    pub fn template_owns_snapshot(&self, snapshot: &str) -> Result<bool> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM e2b_template_snapshots WHERE snapshot = ?1",
                [snapshot],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// Whether any build or cache entry still names `snapshot`.
    pub fn template_uses_snapshot(&self, snapshot: &str) -> Result<bool> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM e2b_builds WHERE snapshot = ?1
                 UNION SELECT 1 FROM e2b_step_cache WHERE snapshot = ?1",
                [snapshot],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    pub fn cached_step(&self, key: &str) -> Result<Option<CacheRow>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT snapshot, template, defaults FROM e2b_step_cache WHERE key = ?1
                 AND snapshot IN (SELECT id FROM snapshots)",
                [key],
                |r| {
                    Ok(CacheRow {
                        snapshot: r.get(0)?,
                        template: r.get(1)?,
                        defaults: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    pub fn cache_step(&self, key: &str, c: &CacheRow, now: u64) -> Result<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO e2b_step_cache (key, snapshot, template, defaults, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![key, c.snapshot, c.template, c.defaults, now as i64],
        )?;
        Ok(())
    }

    pub fn upload(&self, hash: &str) -> Result<Option<UploadRow>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT hash, token, expires_at, stored, size FROM e2b_uploads WHERE hash = ?1",
                [hash],
                upload_from_row,
            )
            .optional()?)
    }

    pub fn put_upload(&self, u: &UploadRow) -> Result<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO e2b_uploads (hash, token, expires_at, stored, size)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                u.hash,
                u.token,
                u.expires_at as i64,
                u.stored,
                u.size as i64
            ],
        )?;
        Ok(())
    }

    /// Takes the upload a one-time token names: the token is spent (cleared) in the same
    /// statement, so two requests with it cannot both get the upload.
    pub fn take_upload_token(&self, token: &str) -> Result<Option<UploadRow>> {
        let conn = self.conn();
        let row = conn
            .query_row(
                "SELECT hash, token, expires_at, stored, size FROM e2b_uploads WHERE token = ?1",
                [token],
                upload_from_row,
            )
            .optional()?;
        if row.is_some() {
            conn.execute(
                "UPDATE e2b_uploads SET token = NULL WHERE token = ?1",
                [token],
            )?;
        }
        Ok(row)
    }

    pub fn delete_upload(&self, hash: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM e2b_uploads WHERE hash = ?1", [hash])?;
        Ok(())
    }
}
