//! Disk space an import may take (uploads and pulls of snapshot packs, and the files
//! they decode to): what is free on the filesystem it writes to, beyond a reserve kept
//! for everything else there (the VMs' disk layers, the state database). Refusing up
//! front, saying what was free and needed, beats a write failing half-way on a full
//! disk (which also stops every VM whose disk layer is there). Errors name the
//! filesystem by its role, never by its host path.
use std::path::Path;

use zygote_images::space::free_bytes;
use zygote_oci::pack::Room;

use crate::error::Error;

/// What an import leaves free on a filesystem it writes to.
pub(crate) const KEEP_FREE_BYTES: u64 = 128 << 20;

/// The room an import has on the filesystem holding `dir` (unbounded if it cannot be
/// measured).
pub(crate) fn room(dir: &Path) -> Room {
    match free_bytes(dir) {
        Some(free) => Room {
            spare: free.saturating_sub(KEEP_FREE_BYTES),
            reserve: KEEP_FREE_BYTES,
        },
        None => Room::UNBOUNDED,
    }
}

/// An import's `needed` bytes refused on the filesystem `fs` names, with `free` there.
pub(crate) fn no_space(fs: &str, free: u64, needed: u64) -> Error {
    Error::NoSpace {
        what: fs.to_string(),
        free_mib: free >> 20,
        needed_mib: needed.div_ceil(1 << 20),
    }
}

/// A staging directory for an incoming pack whose blob writes keep [`KEEP_FREE_BYTES`]
/// free, the same reserve [`room`] measures up front.
pub(crate) fn pack_staging() -> zygote_oci::Result<zygote_oci::pack::Staging> {
    Ok(zygote_oci::pack::Staging::new()?.with_reserve(KEEP_FREE_BYTES))
}
