//! The entry point of the snapshot pack import fuzz target (fuzz/) and of the
//! seeded test below: arbitrary bytes as an uploaded pack, read into a staging directory
//! of their own ([`read_archive`]), then each file the pack names decoded within small
//! limits ([`sparse::decode`]). The invariant: whatever the bytes, no panic, and the
//! staging is gone once dropped. Not part of the crate's API.
#![doc(hidden)]

use super::sparse::{self, DecodeLimits};
use super::{read_archive, Room, Staging};

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the reader took the bytes as a pack.
    pub read: bool,
    /// Files decoded without an error.
    pub decoded: usize,
    /// Entries left in the staging root after the staging was dropped.
    pub staging_left: usize,
}

/// Reads `data` as a pack and decodes its files (see the module doc).
pub fn read_and_decode(data: &[u8]) -> Outcome {
    let tmp = tempfile::tempdir().expect("a scratch directory");
    let root = tmp.path().join("staging");
    let mut outcome = Outcome {
        read: false,
        decoded: 0,
        staging_left: 0,
    };
    {
        let staging = Staging::under(&root).expect("a staging directory");
        if let Ok(p) = read_archive(&mut &data[..], 64 << 20, &staging) {
            outcome.read = true;
            let limits = DecodeLimits {
                max_len: 1 << 30,
                room: Room {
                    spare: 16 << 20,
                    reserve: 0,
                },
            };
            for (i, f) in p.files.iter().enumerate() {
                let dest = tmp.path().join(format!("file-{i}"));
                if sparse::decode(&f.blob, &dest, &f.role, &limits).is_ok() {
                    outcome.decoded += 1;
                }
            }
        }
    }
    outcome.staging_left = std::fs::read_dir(&root).map(|d| d.count()).unwrap_or(0);
    outcome
}
