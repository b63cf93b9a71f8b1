//! The database's files are the daemon user's alone (0600), whatever the umask.
//!
//! The database holds every sandbox's record (VM sockets, network addresses, metadata);
//! in WAL mode its latest rows live in `zygote.db-wal` and the shared-memory index in
//! `zygote.db-shm`, next to the main file. SQLite creates those companions with the
//! main file's mode (it `fchmod`s a new one to match, so the umask plays no part), so
//! the main file is made 0600 *before* SQLite opens it: narrowing it afterwards, as the
//! daemon once did, left companions created at open with the umask's 0644. Companions a
//! crash left behind keep the mode they were made with (SQLite reuses a non-empty one
//! as it is): they are narrowed too.
use std::fs::{OpenOptions, Permissions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const PRIVATE: u32 = 0o600;
/// What SQLite keeps next to a database: WAL, its index, a rollback journal.
const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Makes `db` (created empty if missing) and its existing companions 0600; call it
/// before opening the database.
pub(super) fn make_private(db: &Path) -> Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .mode(PRIVATE)
        .open(db)
        .map_err(Error::io(format!("creating {}", db.display())))?;
    for path in std::iter::once(db.to_path_buf()).chain(COMPANIONS.iter().map(|s| companion(db, s)))
    {
        match std::fs::set_permissions(&path, Permissions::from_mode(PRIVATE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(format!(
                    "restricting {} to its owner",
                    path.display()
                ))(e))
            }
            _ => {}
        }
    }
    Ok(())
}

fn companion(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    use super::{companion, PRIVATE};
    use crate::db::Db;

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    }

    /// Issue 33: `zygote.db-wal` and `-shm` were 0644 under the usual umask 022.
    /// The database at `db` and its WAL files.
    fn with_wal(db: &Path) -> [PathBuf; 3] {
        [
            db.to_path_buf(),
            companion(db, "-wal"),
            companion(db, "-shm"),
        ]
    }

    /// Opens the database at `db`, writes to it (so the WAL certainly exists; the
    /// connection stays open: a clean close would fold the WAL back and remove it) and
    /// checks that every file is private.
    fn open_and_check(db: &Path) {
        let opened = Db::open(db).unwrap();
        opened
            .conn()
            .execute_batch("PRAGMA user_version = 9")
            .unwrap();
        for p in with_wal(db) {
            assert_eq!(
                format!("{:o}", mode(&p)),
                format!("{PRIVATE:o}"),
                "{}",
                p.display()
            );
        }
    }

    /// Issue 33: `zygote.db-wal` and `-shm` were 0644 under the usual umask 022.
    #[test]
    fn the_database_and_its_wal_files_are_private_whatever_the_umask() {
        // SAFETY: umask(2) has no memory-safety preconditions. 022 is what a daemon
        // started from a login shell has (and what this test process most likely has).
        let before = unsafe { libc::umask(0o022) };
        let tmp = tempfile::tempdir().unwrap();
        open_and_check(&tmp.path().join("zygote.db"));
        // Files left by a crash of a daemon that made them 0644 are narrowed.
        let old = tmp.path().join("old.db");
        for p in with_wal(&old) {
            std::fs::write(&p, b"").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        open_and_check(&old);
        // SAFETY: as above.
        unsafe { libc::umask(before) };
    }
}
