//! The daemon's state: an embedded SQLite database (`<state>/zygote.db`).
//!
//! Sandboxes and snapshots are rows whose structured parts (origin, limits,
//! the runtime's VM record, lineage) are JSON columns: the daemon reads
//! whole rows and the schema stays small. Every change is committed before
//! the API answers (WAL, synchronous=FULL), so a daemon killed at any point
//! restarts knowing every VM it started and every snapshot it reported.
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{de::DeserializeOwned, Serialize};

use crate::error::{Error, Result};
use crate::lifecycle::Lifecycle;
use crate::model::{CgroupReport, ImageRun, Limits, Origin, PackOrigin, SandboxEnv, SnapshotKind};
use crate::network::NetRecord;
use crate::runtime::{SnapshotData, VmRecord};

/// 2 added `sandboxes.ttl_secs` and `sandboxes.expires_at`; 3 added `sandboxes.pending`;
/// 4 added `sandboxes.network`; 5 added the `ports` table ([`ports`]); 6 added
/// `sandboxes.env`; 7 added `sandboxes.metadata`; 8 added `sandboxes.lifecycle`; 9 added
/// `snapshots.run` and `snapshots.pack`; 10 added E2B's template tables ([`templates`]); 11 added
/// the `volumes` table ([`volumes`]).
const SCHEMA_VERSION: i64 = 11;

#[path = "db_files.rs"]
mod files;
#[path = "db_ports.rs"]
mod ports;
#[path = "db_volumes.rs"]
mod volumes;
pub use ports::{AddPort, PortRow};
#[path = "db_templates.rs"]
mod templates;
pub use templates::{BuildLogRow, BuildRow, CacheRow, TagRow, UploadRow};
pub use volumes::{DeleteVolume, VolumeRow};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    name TEXT,
    state TEXT NOT NULL,
    runtime TEXT NOT NULL,
    origin TEXT NOT NULL,
    hostname TEXT NOT NULL,
    mem_mib INTEGER NOT NULL,
    vcpus INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    limits TEXT NOT NULL,
    cgroup TEXT NOT NULL,
    vm TEXT,
    depends_on TEXT NOT NULL,
    exit_reason TEXT,
    exited_at INTEGER,
    ttl_secs INTEGER,
    expires_at INTEGER,
    pending TEXT,
    network TEXT,
    env TEXT,
    metadata TEXT,
    lifecycle TEXT
);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    name TEXT,
    kind TEXT NOT NULL,
    runtime TEXT NOT NULL,
    source_sandbox TEXT NOT NULL,
    depends_on TEXT NOT NULL,
    mem_mib INTEGER NOT NULL,
    vcpus INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    implicit INTEGER NOT NULL,
    data TEXT NOT NULL,
    run TEXT,
    pack TEXT
);
CREATE INDEX IF NOT EXISTS sandboxes_expires_at ON sandboxes (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS images (
    sha256 TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    path TEXT NOT NULL,
    first_used INTEGER NOT NULL
);
";

/// A sandbox as stored.
#[derive(Debug, Clone)]
pub struct SandboxRow {
    pub id: String,
    pub name: Option<String>,
    pub state: String,
    pub runtime: String,
    pub origin: Origin,
    pub hostname: String,
    pub mem_mib: u32,
    pub vcpus: u32,
    pub created_at: u64,
    pub limits: Limits,
    pub cgroup: CgroupReport,
    /// The runtime's handle on the VM process (absent while creating).
    pub vm: Option<VmRecord>,
    /// Snapshot ids whose layers the VM's disk reads, oldest first.
    pub depends_on: Vec<String>,
    pub exit_reason: Option<String>,
    pub exited_at: Option<u64>,
    /// Time-to-live in seconds: children inherit it, and a TTL change resets
    /// `expires_at` to now + this.
    pub ttl_secs: Option<u64>,
    /// Unix seconds after which the reaper deletes the sandbox.
    pub expires_at: Option<u64>,
    /// A snapshot or branch of this sandbox that was started and not yet recorded.
    pub pending: Option<PendingCapture>,
    /// Its network policy and namespace (rows from before networking: the default
    /// policy, no namespace).
    pub network: NetRecord,
    /// Its execs' default environment and secrets (rows from before: none).
    pub env: SandboxEnv,
    /// The user's labels (rows from before: none).
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Pause settings and saved state (rows from before: defaults, not paused).
    pub lifecycle: Lifecycle,
}

/// The intent record of a snapshot or branch: written before the runtime changes the
/// VM's disk chain, cleared in the same transaction that records the result. A daemon
/// that finds one at start-up was killed in between; it asks the runtime whether the
/// capture completed (the VM runs on `next_disk`) and then records it, or undoes it
/// (`crate::manager::recovery`).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PendingCapture {
    /// The id the snapshot (or branch point) gets.
    pub snapshot: String,
    pub kind: SnapshotKind,
    /// The name the client asked for.
    pub name: Option<String>,
    /// The snapshot's directory.
    pub dir: PathBuf,
    /// The writable layer the VM moves to; its current layer becomes the snapshot's.
    pub next_disk: PathBuf,
}

/// A snapshot as stored.
#[derive(Debug, Clone)]
pub struct SnapshotRow {
    pub id: String,
    pub name: Option<String>,
    pub kind: SnapshotKind,
    pub runtime: String,
    pub source_sandbox: String,
    pub depends_on: Vec<String>,
    pub mem_mib: u32,
    pub vcpus: u32,
    pub created_at: u64,
    pub size_bytes: u64,
    pub implicit: bool,
    pub data: SnapshotData,
    /// The source sandbox's OCI image run config, for sandboxes started from it (rows
    /// from before: none).
    pub run: ImageRun,
    /// For a snapshot imported from a pack: where it came from (rows from before or
    /// of this daemon's own: none).
    pub pack: Option<PackOrigin>,
}

impl SnapshotRow {
    /// The record of a capture of `source` taken at `created_at`, before the capture
    /// joins the source's chain. Branch points are implicit (collected with their last
    /// dependant).
    pub fn captured(
        source: &SandboxRow,
        id: String,
        name: Option<String>,
        kind: SnapshotKind,
        mut data: SnapshotData,
        created_at: u64,
    ) -> SnapshotRow {
        data.isolated_nic = source.network.attachment.is_some();
        SnapshotRow {
            id,
            name,
            kind,
            runtime: source.runtime.clone(),
            source_sandbox: source.id.clone(),
            depends_on: source.depends_on.clone(),
            mem_mib: source.mem_mib,
            vcpus: source.vcpus,
            created_at,
            size_bytes: data.size_bytes(),
            implicit: kind == SnapshotKind::Branch,
            data,
            run: source.env.image.clone(),
            pack: None,
        }
    }
}

pub struct Db {
    conn: Mutex<Connection>,
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("state types serialize")
}

fn from_json<T: DeserializeOwned>(idx: usize, text: String) -> rusqlite::Result<T> {
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// Columns added after version 1, with their types (all nullable, so old
/// rows read back as "no TTL", "nothing pending").
const SANDBOX_COLUMNS_SINCE_V1: &[(&str, &str)] = &[
    ("ttl_secs", "INTEGER"),
    ("expires_at", "INTEGER"),
    ("pending", "TEXT"),
    ("network", "TEXT"),
    ("env", "TEXT"),
    ("metadata", "TEXT"),
    ("lifecycle", "TEXT"),
];

fn add_missing_columns(conn: &Connection, table: &str, columns: &[(&str, &str)]) -> Result<()> {
    let existing: Vec<String> = conn
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if existing.is_empty() {
        // No such table yet: SCHEMA creates it with every column.
        return Ok(());
    }
    for (name, ty) in columns {
        if !existing.iter().any(|c| c == name) {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {name} {ty}"))?;
            tracing::info!("state database: added {table}.{name}");
        }
    }
    Ok(())
}

impl Db {
    /// Opens (or creates) the database at `path`, private to the daemon's user.
    pub fn open(path: &Path) -> Result<Db> {
        files::make_private(path)?;
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > SCHEMA_VERSION {
            return Err(Error::Internal(format!(
                "{} has schema version {version}, newer than this daemon's {SCHEMA_VERSION}",
                path.display()
            )));
        }
        // A database from before TTLs gets the new columns before SCHEMA
        // runs: CREATE TABLE IF NOT EXISTS leaves an existing table as it
        // was, and SCHEMA's index needs the columns.
        add_missing_columns(&conn, "sandboxes", SANDBOX_COLUMNS_SINCE_V1)?;
        add_missing_columns(&conn, "snapshots", &[("run", "TEXT"), ("pack", "TEXT")])?;
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(ports::SCHEMA)?;
        conn.execute_batch(templates::SCHEMA)?;
        conn.execute_batch(volumes::SCHEMA)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        Ok(Db {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // Statements are atomic in SQLite; a panic mid-call leaves no
        // half-applied state in the connection, so poisoning is ignored.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn put_sandbox(&self, s: &SandboxRow) -> Result<()> {
        Self::put_sandbox_on(&self.conn(), s)
    }

    pub fn put_snapshot(&self, s: &SnapshotRow) -> Result<()> {
        Self::put_snapshot_on(&self.conn(), s)
    }

    /// Writes several rows atomically (e.g. a snapshot, the sandbox whose
    /// disk now builds on it, and branch children): after a crash either all
    /// of them or none are recorded.
    pub fn commit(&self, sandboxes: &[&SandboxRow], snapshots: &[&SnapshotRow]) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for s in snapshots {
            Self::put_snapshot_on(&tx, s)?;
        }
        for s in sandboxes {
            Self::put_sandbox_on(&tx, s)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn put_sandbox_on(conn: &Connection, s: &SandboxRow) -> Result<()> {
        conn.execute(
            "INSERT OR REPLACE INTO sandboxes (id, name, state, runtime, origin, hostname, mem_mib,
                vcpus, created_at, limits, cgroup, vm, depends_on, exit_reason, exited_at,
                ttl_secs, expires_at, pending, network, env, metadata, lifecycle)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                ?18, ?19, ?20, ?21, ?22)",
            params![
                s.id,
                s.name,
                s.state,
                s.runtime,
                to_json(&s.origin),
                s.hostname,
                s.mem_mib,
                s.vcpus,
                s.created_at as i64,
                to_json(&s.limits),
                to_json(&s.cgroup),
                s.vm.as_ref().map(to_json),
                to_json(&s.depends_on),
                s.exit_reason,
                s.exited_at.map(|t| t as i64),
                s.ttl_secs.map(|t| t as i64),
                s.expires_at.map(|t| t as i64),
                s.pending.as_ref().map(to_json),
                to_json(&s.network),
                to_json(&s.env),
                to_json(&s.metadata),
                to_json(&s.lifecycle),
            ],
        )?;
        Ok(())
    }

    fn sandbox_from_row(r: &Row) -> rusqlite::Result<SandboxRow> {
        Ok(SandboxRow {
            id: r.get(0)?,
            name: r.get(1)?,
            state: r.get(2)?,
            runtime: r.get(3)?,
            origin: from_json(4, r.get(4)?)?,
            hostname: r.get(5)?,
            mem_mib: r.get(6)?,
            vcpus: r.get(7)?,
            created_at: r.get::<_, i64>(8)? as u64,
            limits: from_json(9, r.get(9)?)?,
            cgroup: from_json(10, r.get(10)?)?,
            vm: match r.get::<_, Option<String>>(11)? {
                Some(t) => Some(from_json(11, t)?),
                None => None,
            },
            depends_on: from_json(12, r.get(12)?)?,
            exit_reason: r.get(13)?,
            exited_at: r.get::<_, Option<i64>>(14)?.map(|t| t as u64),
            ttl_secs: r.get::<_, Option<i64>>(15)?.map(|t| t as u64),
            expires_at: r.get::<_, Option<i64>>(16)?.map(|t| t as u64),
            pending: match r.get::<_, Option<String>>(17)? {
                Some(t) => Some(from_json(17, t)?),
                None => None,
            },
            network: match r.get::<_, Option<String>>(18)? {
                Some(t) => from_json(18, t)?,
                None => NetRecord::default(),
            },
            env: match r.get::<_, Option<String>>(19)? {
                Some(t) => from_json(19, t)?,
                None => SandboxEnv::default(),
            },
            metadata: match r.get::<_, Option<String>>(20)? {
                Some(t) => from_json(20, t)?,
                None => Default::default(),
            },
            lifecycle: match r.get::<_, Option<String>>(21)? {
                Some(t) => from_json(21, t)?,
                None => Lifecycle::default(),
            },
        })
    }

    const SANDBOX_COLS: &'static str = "id, name, state, runtime, origin, hostname, mem_mib, vcpus,
        created_at, limits, cgroup, vm, depends_on, exit_reason, exited_at, ttl_secs, expires_at,
        pending, network, env, metadata, lifecycle";

    pub fn sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        let sql = format!("SELECT {} FROM sandboxes WHERE id = ?1", Self::SANDBOX_COLS);
        Ok(self
            .conn()
            .query_row(&sql, [id], Self::sandbox_from_row)
            .optional()?)
    }

    pub fn sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let sql = format!(
            "SELECT {} FROM sandboxes ORDER BY created_at, id",
            Self::SANDBOX_COLS
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], Self::sandbox_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Sandboxes whose deadline is `now` or earlier, soonest first.
    pub fn expired_sandboxes(&self, now: u64) -> Result<Vec<SandboxRow>> {
        let sql = format!(
            "SELECT {} FROM sandboxes WHERE expires_at <= ?1 ORDER BY expires_at, id",
            Self::SANDBOX_COLS
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([now as i64], Self::sandbox_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn delete_sandbox(&self, id: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id])?;
        Ok(())
    }

    fn put_snapshot_on(conn: &Connection, s: &SnapshotRow) -> Result<()> {
        conn.execute(
            "INSERT OR REPLACE INTO snapshots (id, name, kind, runtime, source_sandbox, depends_on,
                mem_mib, vcpus, created_at, size_bytes, implicit, data, run, pack)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            params![
                s.id,
                s.name,
                s.kind.as_str(),
                s.runtime,
                s.source_sandbox,
                to_json(&s.depends_on),
                s.mem_mib,
                s.vcpus,
                s.created_at as i64,
                s.size_bytes as i64,
                s.implicit,
                to_json(&s.data),
                (!s.run.is_empty()).then(|| to_json(&s.run)),
                s.pack.as_ref().map(to_json),
            ],
        )?;
        Ok(())
    }

    fn snapshot_from_row(r: &Row) -> rusqlite::Result<SnapshotRow> {
        let kind: String = r.get(2)?;
        Ok(SnapshotRow {
            id: r.get(0)?,
            name: r.get(1)?,
            kind: SnapshotKind::parse(&kind).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    2,
                    rusqlite::types::Type::Text,
                    format!("unknown snapshot kind {kind:?}").into(),
                )
            })?,
            runtime: r.get(3)?,
            source_sandbox: r.get(4)?,
            depends_on: from_json(5, r.get(5)?)?,
            mem_mib: r.get(6)?,
            vcpus: r.get(7)?,
            created_at: r.get::<_, i64>(8)? as u64,
            size_bytes: r.get::<_, i64>(9)? as u64,
            implicit: r.get(10)?,
            data: from_json(11, r.get(11)?)?,
            run: match r.get::<_, Option<String>>(12)? {
                Some(j) => from_json(12, j)?,
                None => ImageRun::default(),
            },
            pack: match r.get::<_, Option<String>>(13)? {
                Some(j) => Some(from_json(13, j)?),
                None => None,
            },
        })
    }

    const SNAPSHOT_COLS: &'static str = "id, name, kind, runtime, source_sandbox, depends_on,
        mem_mib, vcpus, created_at, size_bytes, implicit, data, run, pack";

    pub fn snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        let sql = format!(
            "SELECT {} FROM snapshots WHERE id = ?1",
            Self::SNAPSHOT_COLS
        );
        Ok(self
            .conn()
            .query_row(&sql, [id], Self::snapshot_from_row)
            .optional()?)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRow>> {
        let sql = format!(
            "SELECT {} FROM snapshots ORDER BY created_at, id",
            Self::SNAPSHOT_COLS
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], Self::snapshot_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM snapshots WHERE id = ?1", [id])?;
        Ok(())
    }

    /// Everything that depends on snapshot `id`: sandboxes and snapshots
    /// whose layer chains include it.
    pub fn dependents(&self, id: &str) -> Result<Vec<String>> {
        let mut out: Vec<String> = self
            .sandboxes()?
            .into_iter()
            .filter(|s| s.depends_on.iter().any(|d| d == id))
            .map(|s| s.id)
            .collect();
        out.extend(
            self.snapshots()?
                .into_iter()
                .filter(|s| s.depends_on.iter().any(|d| d == id))
                .map(|s| s.id),
        );
        Ok(out)
    }

    /// Records that an image (by content hash) was used, for lineage.
    pub fn note_image(&self, name: &str, sha256: &str, path: &Path, now: u64) -> Result<()> {
        self.conn().execute(
            "INSERT OR IGNORE INTO images (sha256, name, path, first_used) VALUES (?1, ?2, ?3, ?4)",
            params![sha256, name, path.display().to_string(), now as i64],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sandboxes table as schema version 1 created it.
    const SANDBOXES_V1: &str = "
        CREATE TABLE sandboxes (
            id TEXT PRIMARY KEY, name TEXT, state TEXT NOT NULL, runtime TEXT NOT NULL,
            origin TEXT NOT NULL, hostname TEXT NOT NULL, mem_mib INTEGER NOT NULL,
            vcpus INTEGER NOT NULL, created_at INTEGER NOT NULL, limits TEXT NOT NULL,
            cgroup TEXT NOT NULL, vm TEXT, depends_on TEXT NOT NULL, exit_reason TEXT,
            exited_at INTEGER
        );
        INSERT INTO sandboxes VALUES ('sb-old', 'old', 'running', 'qemu',
            '{\"image\":{\"name\":\"minimal\",\"sha256\":\"ab\"}}', 'old', 256, 1, 100,
            '{}', '{\"path\":null,\"applied\":[],\"not_applied\":{}}', NULL, '[]', NULL, NULL);
        PRAGMA user_version = 1;";

    fn columns(db: &Db) -> Vec<String> {
        let conn = db.conn();
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info('sandboxes')")
            .unwrap();
        let names = stmt.query_map([], |r| r.get(0)).unwrap();
        names.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[test]
    fn a_version_1_database_gains_the_new_columns_and_keeps_its_rows() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("zygote.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch(SANDBOXES_V1)
            .unwrap();

        let db = Db::open(&path).unwrap();
        let cols = columns(&db);
        for col in ["ttl_secs", "expires_at", "pending", "network"] {
            assert!(cols.iter().any(|c| c == col), "{col}: {cols:?}");
        }
        let mut old = db.sandbox("sb-old").unwrap().expect("the old row");
        assert_eq!((old.name.as_deref(), old.created_at), (Some("old"), 100));
        assert_eq!((old.ttl_secs, old.expires_at), (None, None));
        assert_eq!(old.pending, None);
        assert_eq!(old.network, NetRecord::default());
        assert!(db.expired_sandboxes(u64::MAX).unwrap().is_empty());

        old.ttl_secs = Some(30);
        old.expires_at = Some(130);
        db.put_sandbox(&old).unwrap();
        drop(db);
        // Reopening (now the current version) changes nothing and keeps the deadline.
        let db = Db::open(&path).unwrap();
        assert_eq!(columns(&db).len(), cols.len());
        assert!(db.expired_sandboxes(129).unwrap().is_empty());
        let due = db.expired_sandboxes(130).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].ttl_secs, due[0].expires_at), (Some(30), Some(130)));
    }
}
