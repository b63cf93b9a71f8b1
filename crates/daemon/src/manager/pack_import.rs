//! Importing a snapshot pack (an upload or a pull) as a snapshot of this daemon.
//!
//! The pack is hostile until every check passed, and a refused one leaves nothing:
//! - its blobs are staged ([`Staging`], beside the blob store), never in the shared
//!   store, and an upload is streamed straight into that staging (no copy of the tar);
//!   its size is held to the free space (from `Content-Length` before the first byte,
//!   and while it arrives), and to [`MAX_PACK_BYTES`];
//! - its config is checked like a request (format, runtime, CPU, sizes, names), its files
//!   must be the roles a snapshot has (`image`, `disk`, `state/<name>`);
//! - each file is decoded within the free space (a few MiB of zstd can claim terabytes)
//!   and the base image's hash checked before the runtime looks at the snapshot;
//! - the base image is stored under its content ([`zygote_images::pack::pack_base_name`]),
//!   never under the name the pack gives it: no name or reference anyone resolves ever
//!   comes to mean a pack's image.
//!
//! Then, in this order: the base image is stored, the snapshot recorded, the staged
//! blobs committed to the store. Killed before the record, a daemon leaves files no
//! record names (start-up removes them and sweeps the staging) and at most a base image
//! stored under its hash, which holds exactly those bytes; after it, only staged blobs
//! (swept). Errors never carry host paths: a fault of this host's is logged in full and
//! answered without them ([`host_side`]).
use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use zygote_images::pack::ScratchPath;
use zygote_images::space::free_bytes;
use zygote_oci::blobs::BlobStore;
use zygote_oci::pack::sparse::{self, DecodeLimits};
use zygote_oci::pack::{self, Packed, PackedFile, Staging};
use zygote_oci::OciError;

use super::space::{no_space, room, KEEP_FREE_BYTES};
use super::{new_id, now, Manager};
use crate::db::SnapshotRow;
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{validate_name, PackOrigin, Snapshot, SnapshotKind, Validate};
use crate::pack_format::PackConfig;
use crate::runtime::{RuntimeError, SnapshotData};

/// Largest pack an upload may be, whatever the free space.
pub const MAX_PACK_BYTES: u64 = 256 << 30;
/// Largest file a pack may unpack to (apparent size: a memory state or disk layer).
const MAX_FILE_BYTES: u64 = 1 << 40;
/// How many bytes of an upload arrive between two looks at the free space.
const RECHECK_EVERY: u64 = 64 << 20;
/// The filesystems an import writes to, as errors name them.
const CACHE_FS: &str = "the image cache's filesystem";
const STATE_FS: &str = "the state directory's filesystem";

impl Manager {
    /// Imports the pack an upload carries (`declared`: its `Content-Length`, if sent).
    pub async fn import_upload<S, E>(
        &self,
        body: S,
        declared: Option<u64>,
        name: Option<String>,
    ) -> Result<Snapshot>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Unpin + Send,
        E: std::fmt::Display,
    {
        if let Some(n) = &name {
            validate_name("name", n)?;
        }
        let imported = async {
            let staging = self.blocking(super::space::pack_staging).await??;
            let (packed, staging) = receive(body, declared, staging).await?;
            self.import_pack(packed, staging, name, "file".into()).await
        };
        imported.await.map_err(host_side)
    }

    /// Registers the snapshot `p` holds (its blobs in `staging`) as a new one here.
    pub(super) async fn import_pack(
        &self,
        p: Packed,
        staging: Staging,
        name: Option<String>,
        source: String,
    ) -> Result<Snapshot> {
        let config: PackConfig = serde_json::from_slice(&p.config)
            .map_err(|e| Error::invalid(format!("not a zygote snapshot pack: its config: {e}")))?;
        config.validate()?;
        self.check_pack(&config)?;
        let files = PackFiles::of(&p, &config)?;
        let digest = p.manifest_digest.to_string();
        let id = new_id("snap");
        let dir = self.dirs.snapshots.join(&id);
        let disk = self.dirs.new_layer(&id);
        let rt = self.runtime.clone();
        let (d, k, cfg) = (dir.clone(), disk.clone(), config.clone());
        let unpacked = self
            .blocking(move || -> Result<(SnapshotData, Base)> {
                let base = Base::stage(&files.image, &cfg.image.sha256)?;
                std::fs::create_dir_all(&d)
                    .map_err(Error::io(format!("creating {}", d.display())))?;
                for (name, f) in &files.state {
                    let dest = d.join(name);
                    if let Some(parent) = dest.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(Error::io(format!("creating {}", parent.display())))?;
                    }
                    decode(
                        f,
                        &dest,
                        &format!("the pack's state file {name:?}"),
                        STATE_FS,
                    )?;
                }
                let disk = match &files.disk {
                    Some(f) => {
                        decode(f, &k, "the pack's disk layer", STATE_FS)?;
                        Some(k.as_path())
                    }
                    None => None,
                };
                let state_file = d.join(&cfg.state_file);
                let data = rt
                    .import_files(&d, &state_file, disk, base.path(), &cfg.accel)
                    .map_err(refusal)?;
                Ok((data, base))
            })
            .await
            .and_then(|r| r);
        let forget = || {
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::remove_file(&disk);
        };
        let (data, base) = match unpacked {
            Ok(u) => u,
            Err(e) => {
                forget();
                return Err(e);
            }
        };
        fault::point("pack-import.unpacked");
        let description = format!(
            "base image of snapshot {} (from a pack)",
            config.snapshot.id
        );
        let stored = self.blocking(move || base.store(description)).await;
        if let Err(e) = stored.and_then(|r| r) {
            forget();
            return Err(e);
        }
        fault::point("pack-import.base-stored");
        let mut data = data;
        data.isolated_nic = config.isolated_nic;
        let row = SnapshotRow {
            id: id.clone(),
            name: name.or(config.snapshot.name.clone()),
            kind: SnapshotKind::Full,
            runtime: config.runtime.clone(),
            source_sandbox: config.snapshot.source_sandbox.clone(),
            depends_on: Vec::new(),
            mem_mib: config.mem_mib,
            vcpus: config.vcpus,
            created_at: now(),
            size_bytes: data.size_bytes(),
            implicit: false,
            data,
            run: config.run.clone(),
            pack: Some(PackOrigin {
                source,
                digest,
                snapshot: config.snapshot.id.clone(),
                agent_token: config.agent_token.clone(),
            }),
        };
        if let Err(e) = self.db.put_snapshot(&row) {
            forget();
            return Err(e);
        }
        fault::point("pack-import.recorded");
        // The snapshot has what it needs; its blobs only spare a later push or pull.
        let digests = p.digests();
        let committed = self
            .blocking(move || staging.commit(&digests, &BlobStore::open()?))
            .await;
        if let Err(e) = committed.and_then(|r| r.map_err(Error::from)) {
            tracing::warn!(snapshot = %id, "keeping the pack's blobs: {e}");
        }
        tracing::info!(snapshot = %id, from = %config.snapshot.id, "imported a snapshot pack");
        self.snapshot_view(&row)
    }
}

/// Streams an upload into `staging` (see the module doc for the limits); returns the
/// pack read from it.
async fn receive<S, E>(
    mut body: S,
    declared: Option<u64>,
    staging: Staging,
) -> Result<(Packed, Staging)>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin + Send,
    E: std::fmt::Display,
{
    let dir = staging.dir().to_path_buf();
    let limit = room(&dir).spare.min(MAX_PACK_BYTES);
    if let Some(n) = declared {
        check_received(n, limit, &dir)?;
    }
    let staging = std::sync::Arc::new(staging);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let s = staging.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let mut input = ChannelReader {
            rx,
            chunk: Bytes::new(),
        };
        pack::read_archive(&mut input, MAX_PACK_BYTES, &s)
    });
    let fed = async move {
        let (mut total, mut next_look) = (0u64, RECHECK_EVERY);
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| Error::MalformedBody(format!("reading the pack: {e}")))?;
            total += chunk.len() as u64;
            check_received(total, limit, &dir)?;
            if total >= next_look {
                // Others write to this filesystem too.
                next_look = total + RECHECK_EVERY;
                if room(&dir).spare == 0 {
                    let free = free_bytes(&dir).unwrap_or(0);
                    return Err(no_space(CACHE_FS, free, KEEP_FREE_BYTES));
                }
            }
            if tx.send(chunk).await.is_err() {
                // The reader stopped (the tar ended, or it refused it): its answer says.
                break;
            }
        }
        Ok(())
    }
    .await;
    let read = reader
        .await
        .map_err(|e| Error::Internal(format!("reading the pack: {e}")))?;
    // A refused upload stopped feeding the reader, whose error is only a consequence.
    fed?;
    let packed = read?;
    let staging = std::sync::Arc::into_inner(staging).expect("the reader is done with it");
    Ok((packed, staging))
}

/// Refuses an upload of `n` bytes so far: over [`MAX_PACK_BYTES`] (413), or over the
/// free space of the staging's filesystem (`limit`, 507).
fn check_received(n: u64, limit: u64, dir: &Path) -> Result<()> {
    if n > MAX_PACK_BYTES {
        return Err(Error::BodyTooLarge {
            what: "a snapshot pack",
            limit: MAX_PACK_BYTES as usize,
        });
    }
    if n > limit {
        let free = free_bytes(dir).unwrap_or(0);
        return Err(no_space(CACHE_FS, free, n.saturating_add(KEEP_FREE_BYTES)));
    }
    Ok(())
}

/// The upload's chunks as a blocking reader (for the tar reader's thread).
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    chunk: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(c) => self.chunk = c,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// A pack's files by what they are to a snapshot: every file one of these, each state
/// file's name a plain relative path that no other one's is a directory of.
struct PackFiles {
    image: PackedFile,
    disk: Option<PackedFile>,
    state: Vec<(String, PackedFile)>,
}

impl PackFiles {
    fn of(p: &Packed, c: &PackConfig) -> Result<PackFiles> {
        let (mut image, mut disk, mut state) = (None, None, Vec::new());
        for f in &p.files {
            match f.role.as_str() {
                "image" => image = Some(f.clone()),
                "disk" => disk = Some(f.clone()),
                role => match role.strip_prefix("state/") {
                    Some(name) => state.push((state_name(name)?.to_string(), f.clone())),
                    None => {
                        return Err(Error::invalid(format!(
                            "the pack has a file of unknown role {role:?}"
                        )))
                    }
                },
            }
        }
        let image = image.ok_or_else(|| Error::invalid("the pack has no image file"))?;
        state_name(&c.state_file)?;
        if !state.iter().any(|(n, _)| *n == c.state_file) {
            return Err(Error::invalid(format!(
                "the pack has no state/{} file",
                c.state_file
            )));
        }
        for (a, _) in &state {
            if state.iter().any(|(b, _)| b.starts_with(&format!("{a}/"))) {
                return Err(Error::invalid(format!(
                    "the pack's state file {a:?} is also a directory"
                )));
            }
        }
        Ok(PackFiles { image, disk, state })
    }
}

/// A state file's path in the snapshot's directory as a pack names it: at most two
/// plain components (`vm/memory.bin`), nothing that climbs out, hides or is too long.
fn state_name(name: &str) -> Result<&str> {
    let parts: Vec<&str> = name.split('/').collect();
    let ok = parts.len() <= 2
        && parts
            .iter()
            .all(|c| !c.is_empty() && c.len() <= 128 && !c.starts_with('.') && !c.contains('\0'));
    if !ok {
        return Err(Error::invalid(format!("a state file named {name:?}")));
    }
    Ok(name)
}

/// Decodes a pack's file within the free space of the filesystem `dest` is on (`fs`
/// names it in the error).
fn decode(f: &PackedFile, dest: &Path, what: &str, fs: &str) -> Result<()> {
    let limits = DecodeLimits {
        max_len: MAX_FILE_BYTES,
        room: room(dest.parent().unwrap_or(dest)),
    };
    match sparse::decode(&f.blob, dest, what, &limits) {
        Ok(_) => Ok(()),
        Err(OciError::NoSpace {
            free_mib,
            needed_mib,
            ..
        }) => Err(Error::NoSpace {
            what: format!("{fs}, decoding {what}"),
            free_mib,
            needed_mib,
        }),
        Err(e) => Err(e.into()),
    }
}

/// The pack's base image: one this host stores already (the same bytes, whatever it
/// is called), or the pack's, decoded and checked, to be stored under its content.
enum Base {
    Stored(PathBuf),
    Staged {
        scratch: ScratchPath,
        sha256: String,
        path: PathBuf,
    },
}

impl Base {
    fn stage(blob: &PackedFile, sha256: &str) -> Result<Base> {
        if let Some(found) = zygote_images::find_by_sha256(sha256)? {
            let path = found
                .path
                .canonicalize()
                .map_err(Error::io(format!("resolving {}", found.path.display())))?;
            return Ok(Base::Stored(path));
        }
        // `<name>-<pid>.<ext>`: what a killed import leaves, the next build or start-up
        // removes.
        let tmp = zygote_images::pack::scratch_dir()?.join(format!(
            "pack-{}-{}-{}.ext4",
            &sha256[..12],
            super::random_hex(4),
            std::process::id()
        ));
        let scratch = ScratchPath(tmp);
        decode(blob, &scratch.0, "the pack's base image", CACHE_FS)?;
        let actual = zygote_images::sha256_file(&scratch.0)?;
        if actual != sha256 {
            return Err(OciError::DigestMismatch {
                what: "the pack's base image".into(),
                expected: sha256.to_string(),
                actual,
            }
            .into());
        }
        Ok(Base::Staged {
            scratch,
            sha256: sha256.to_string(),
            path: zygote_images::pack::pack_base_path(sha256)?,
        })
    }

    /// Where the snapshot's disk finds it (for a staged one: once stored).
    fn path(&self) -> &Path {
        match self {
            Base::Stored(p) | Base::Staged { path: p, .. } => p,
        }
    }

    fn store(self, description: String) -> Result<()> {
        if let Base::Staged {
            scratch, sha256, ..
        } = self
        {
            zygote_images::pack::store_pack_base(&scratch.0, &sha256, description)?;
        }
        Ok(())
    }
}

/// A runtime's verdict on the pack's files: "not here" and "malformed" are the
/// client's 422s; anything else is this host's.
pub(super) fn refusal(e: RuntimeError) -> Error {
    match e {
        RuntimeError::Unsupported(m) => Error::Unsupported(m),
        e => e.into(),
    }
}

/// An import's error as the API answers it: the client's errors (4xx) are made without
/// host paths; this host's faults (5xx) are logged in full and answered with their
/// I/O cause only, which names no path either.
pub(super) fn host_side(e: Error) -> Error {
    let (status, _) = e.status_code();
    let no_space = matches!(
        e,
        Error::NoSpace { .. } | Error::Oci(OciError::NoSpace { .. })
    );
    if !status.is_server_error() || no_space {
        return e;
    }
    tracing::error!("snapshot pack import: {e}");
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut io = None;
    while let Some(c) = cause {
        if let Some(i) = c.downcast_ref::<std::io::Error>() {
            io = Some(i.to_string());
        }
        cause = c.source();
    }
    Error::Internal(format!(
        "the daemon could not store the pack{} (its log has the details)",
        io.map(|i| format!(": {i}")).unwrap_or_default()
    ))
}
