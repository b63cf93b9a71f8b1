//! Exposed ports in the state database: `(sandbox, port)` rows the port proxy serves.
//! A child module of `db` (for its connection), in a file of its own.
use rusqlite::{params, OptionalExtension, Row};

use super::Db;
use crate::error::Result;

/// Run by [`Db::open`]. Rows of sandboxes that are gone are removed on every start: an
/// older daemon (which knows no ports) may have deleted their sandboxes, and a
/// restarted daemon must never serve a route to an address a new sandbox may hold.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS ports (
    sandbox TEXT NOT NULL,
    port INTEGER NOT NULL,
    public INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (sandbox, port)
);
DELETE FROM ports WHERE sandbox NOT IN (SELECT id FROM sandboxes);";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRow {
    pub sandbox: String,
    pub port: u16,
    pub public: bool,
    pub created_at: u64,
}

/// What [`Db::add_port`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddPort {
    Added,
    /// The sandbox has this port exposed already.
    Exists,
    /// The sandbox is gone or no longer running (or paused).
    NotRunning,
}

fn port_from_row(r: &Row) -> rusqlite::Result<PortRow> {
    Ok(PortRow {
        sandbox: r.get(0)?,
        port: r.get(1)?,
        public: r.get(2)?,
        created_at: r.get::<_, i64>(3)? as u64,
    })
}

impl Db {
    /// Records an exposure if its sandbox is running (or paused) at that moment. The
    /// check and the insert are one statement: a delete marks the sandbox `deleting`
    /// before it removes its ports, so no exposure can slip in behind it.
    pub fn add_port(&self, p: &PortRow) -> Result<AddPort> {
        let conn = self.conn();
        let added = conn.execute(
            "INSERT OR IGNORE INTO ports (sandbox, port, public, created_at)
             SELECT ?1, ?2, ?3, ?4 WHERE EXISTS
                (SELECT 1 FROM sandboxes WHERE id = ?1 AND state IN ('running', 'paused'))",
            params![p.sandbox, p.port, p.public, p.created_at as i64],
        )?;
        if added == 1 {
            return Ok(AddPort::Added);
        }
        let exists = conn
            .query_row(
                "SELECT 1 FROM ports WHERE sandbox = ?1 AND port = ?2",
                params![p.sandbox, p.port],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        Ok(if exists {
            AddPort::Exists
        } else {
            AddPort::NotRunning
        })
    }

    pub fn port(&self, sandbox: &str, port: u16) -> Result<Option<PortRow>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT sandbox, port, public, created_at FROM ports
                 WHERE sandbox = ?1 AND port = ?2",
                params![sandbox, port],
                port_from_row,
            )
            .optional()?)
    }

    /// A sandbox's exposed ports, lowest first.
    pub fn ports(&self, sandbox: &str) -> Result<Vec<PortRow>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT sandbox, port, public, created_at FROM ports WHERE sandbox = ?1
             ORDER BY port",
        )?;
        let rows = stmt.query_map([sandbox], port_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Whether the port was exposed.
    pub fn delete_port(&self, sandbox: &str, port: u16) -> Result<bool> {
        let n = self.conn().execute(
            "DELETE FROM ports WHERE sandbox = ?1 AND port = ?2",
            params![sandbox, port],
        )?;
        Ok(n > 0)
    }

    /// Removes every exposure of a sandbox (it is being deleted).
    pub fn delete_ports(&self, sandbox: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM ports WHERE sandbox = ?1", [sandbox])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::SandboxRow;

    fn sandbox(id: &str, state: &str) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            name: None,
            state: state.into(),
            runtime: "qemu".into(),
            origin: crate::model::Origin::Snapshot {
                id: "snap-x".into(),
            },
            hostname: id.into(),
            mem_mib: 256,
            vcpus: 1,
            created_at: 1,
            limits: Default::default(),
            cgroup: Default::default(),
            vm: None,
            depends_on: Vec::new(),
            exit_reason: None,
            exited_at: None,
            ttl_secs: None,
            expires_at: None,
            pending: None,
            network: Default::default(),
            env: Default::default(),
            metadata: Default::default(),
            lifecycle: Default::default(),
        }
    }

    fn port(sandbox: &str, port: u16) -> PortRow {
        PortRow {
            sandbox: sandbox.into(),
            port,
            public: port == 80,
            created_at: 7,
        }
    }

    #[test]
    fn exposures_need_a_running_sandbox_and_go_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("zygote.db");
        let db = Db::open(&path).unwrap();
        db.put_sandbox(&sandbox("sb-a", "running")).unwrap();
        db.put_sandbox(&sandbox("sb-dead", "dead")).unwrap();

        assert_eq!(db.add_port(&port("sb-a", 8080)).unwrap(), AddPort::Added);
        assert_eq!(db.add_port(&port("sb-a", 80)).unwrap(), AddPort::Added);
        assert_eq!(db.add_port(&port("sb-a", 8080)).unwrap(), AddPort::Exists);
        assert_eq!(
            db.add_port(&port("sb-dead", 8080)).unwrap(),
            AddPort::NotRunning
        );
        assert_eq!(
            db.add_port(&port("sb-none", 8080)).unwrap(),
            AddPort::NotRunning
        );
        assert_eq!(
            db.ports("sb-a").unwrap(),
            [port("sb-a", 80), port("sb-a", 8080)]
        );
        assert_eq!(db.port("sb-a", 80).unwrap(), Some(port("sb-a", 80)));
        assert_eq!(db.port("sb-a", 81).unwrap(), None);

        assert!(db.delete_port("sb-a", 80).unwrap());
        assert!(!db.delete_port("sb-a", 80).unwrap());
        assert_eq!(db.ports("sb-a").unwrap(), [port("sb-a", 8080)]);

        // A sandbox that went while its ports stayed (an older daemon deleted it): the
        // next start drops them.
        db.delete_sandbox("sb-a").unwrap();
        assert_eq!(db.ports("sb-a").unwrap().len(), 1);
        drop(db);
        let db = Db::open(&path).unwrap();
        assert!(db.ports("sb-a").unwrap().is_empty());

        db.put_sandbox(&sandbox("sb-b", "running")).unwrap();
        db.add_port(&port("sb-b", 1)).unwrap();
        db.delete_ports("sb-b").unwrap();
        assert!(db.ports("sb-b").unwrap().is_empty());
    }
}
