//! Per-sandbox agent tokens. Each guest agent takes the token of the first connection it
//! sees and from then on requires it in the `hello` that opens every connection
//! (crates/agent/src/auth.rs). The daemon derives a sandbox's token from a key of its
//! own and the sandbox id (HMAC-SHA256), so it needs no table of secrets: it can always
//! compute the token a guest holds, including the one a branch child or a restored
//! snapshot wakes up with (its source sandbox's), and a daemon restart keeps them.
//! The key lives in the state directory, readable by the daemon's user only.
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

const KEY_FILE: &str = "agent.key";
const KEY_LEN: usize = 32;

#[derive(Clone)]
pub struct AgentKey([u8; KEY_LEN]);

impl std::fmt::Debug for AgentKey {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

impl AgentKey {
    /// The state directory's key, made on first use (mode 0600).
    pub fn load_or_create(state: &Path) -> Result<AgentKey> {
        let path = state.join(KEY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::create(&path),
            Err(e) => Err(Error::io(format!("reading {}", path.display()))(e)),
        }
    }

    fn parse(path: &Path, text: &str) -> Result<AgentKey> {
        let mode = std::fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o077)
            .unwrap_or(0);
        if mode != 0 {
            return Err(Error::Internal(format!(
                "{} is readable by other users (mode {mode:o} in the group/other bits); \
                 chmod 600 it",
                path.display()
            )));
        }
        let bytes = hex::decode(text.trim()).ok().filter(|b| b.len() == KEY_LEN);
        let Some(bytes) = bytes else {
            return Err(Error::Internal(format!(
                "{} is not {KEY_LEN} hex-encoded bytes; remove it to make a new key (the \
                 agents of running sandboxes will then refuse this daemon)",
                path.display()
            )));
        };
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&bytes);
        Ok(AgentKey(key))
    }

    fn create(path: &PathBuf) -> Result<AgentKey> {
        let key: [u8; KEY_LEN] = hex::decode(crate::ids::random_hex(KEY_LEN))
            .expect("random_hex is hex")
            .try_into()
            .expect("KEY_LEN bytes");
        // create_new: two daemons racing on one state directory never mix keys.
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| {
                f.write_all(hex::encode(key).as_bytes())?;
                f.sync_all()
            });
        match written {
            Ok(()) => Ok(AgentKey(key)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(path)
                    .map_err(Error::io(format!("reading {}", path.display())))?;
                Self::parse(path, &text)
            }
            Err(e) => Err(Error::io(format!("writing {}", path.display()))(e)),
        }
    }

    /// The token of sandbox `id`'s agent.
    pub fn token(&self, id: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_sandbox_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let key = AgentKey::load_or_create(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (a, b) = (key.token("sb-a"), key.token("sb-b"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        let again = AgentKey::load_or_create(dir.path()).unwrap();
        assert_eq!(again.token("sb-a"), a, "same key after a restart");
        let other = AgentKey::load_or_create(tempfile::tempdir().unwrap().path()).unwrap();
        assert_ne!(
            other.token("sb-a"),
            a,
            "another daemon's key gives other tokens"
        );
    }

    #[test]
    fn a_key_others_can_read_or_a_garbled_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        AgentKey::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = AgentKey::load_or_create(dir.path()).err().unwrap();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "zz").unwrap();
        let e = AgentKey::load_or_create(dir.path()).err().unwrap();
        assert!(e.to_string().contains("hex-encoded"), "{e}");
    }
}
