//! File requests: read_file, write_file, list_dir, stat, rename, remove.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use zygote_proto::{
    DirEntry, ErrorBody, ErrorCode, FileChunk, FileKind, Metadata, ReadFileRequest, RemoveRequest,
    RenameRequest, Response, StatRequest, WriteFileRequest, MAX_DATA_CHUNK,
};

type Result<T> = std::result::Result<T, ErrorBody>;

const DEFAULT_FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// Paths must be absolute: the agent's cwd is an implementation detail the
/// host should not depend on.
pub(crate) fn abs_path(path: &str) -> Result<&Path> {
    if !path.starts_with('/') {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("path {path:?} is not absolute"),
        ));
    }
    if path.contains('\0') {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            "path contains a NUL byte",
        ));
    }
    Ok(Path::new(path))
}

pub(crate) fn io_err(path: &Path) -> impl Fn(io::Error) -> ErrorBody + '_ {
    move |e| ErrorBody::from_io(&path.display().to_string(), &e)
}

fn check_mode(mode: Option<u32>) -> Result<()> {
    match mode {
        Some(m) if m > 0o7777 => Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("mode {m:#o} has bits outside 0o7777"),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn read_file(req: &ReadFileRequest) -> Result<Response> {
    let path = abs_path(&req.path)?;
    let err = io_err(path);
    let mut file = File::open(path).map_err(&err)?;
    let meta = file.metadata().map_err(&err)?;
    if meta.is_dir() {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("{}: is a directory", path.display()),
        ));
    }
    let want = req
        .len
        .unwrap_or(MAX_DATA_CHUNK as u64)
        .min(MAX_DATA_CHUNK as u64) as usize;
    if req.offset > 0 {
        file.seek(SeekFrom::Start(req.offset)).map_err(&err)?;
    }
    let mut data = Vec::with_capacity(want.min(meta.len() as usize));
    (&mut file)
        .take(want as u64)
        .read_to_end(&mut data)
        .map_err(&err)?;
    let end = req.offset + data.len() as u64;
    // Files in /proc and /sys report size 0, so a short read also means EOF.
    let eof = data.len() < want || (meta.is_file() && end >= meta.len());
    Ok(Response::FileData(FileChunk {
        size: meta.len().max(end),
        offset: req.offset,
        eof,
        data,
    }))
}

/// Distinguishes temp files of concurrent writes to the same path.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) fn write_file(req: &WriteFileRequest) -> Result<Response> {
    let path = abs_path(&req.path)?;
    check_mode(req.mode)?;
    let err = io_err(path);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("{}: not a file path", path.display()),
        ));
    };
    if req.create_parents {
        create_parents(dir, req.owner).map_err(io_err(dir))?;
    }
    let chown = |f: &File| match req.owner {
        Some(o) => std::os::unix::fs::fchown(f, Some(o.uid), Some(o.gid)),
        None => Ok(()),
    };
    if req.append {
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(req.mode.unwrap_or(DEFAULT_FILE_MODE))
            .open(path)
            .map_err(&err)?;
        chown(&f).map_err(&err)?;
        f.write_all(&req.data).map_err(&err)?;
        if let Some(mode) = req.mode {
            f.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(&err)?;
        }
        f.sync_all().map_err(&err)?;
        let size = f.metadata().map_err(&err)?.len();
        return Ok(Response::Written { size });
    }

    // Atomic replace. Keep an existing file's permissions unless told otherwise.
    let mode = match req.mode {
        Some(m) => m,
        None => match fs::metadata(path) {
            Ok(m) => m.mode() & 0o7777,
            Err(_) => DEFAULT_FILE_MODE,
        },
    };
    let temp = dir.join(format!(
        ".{}.zygote-tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let write_temp = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        chown(&f)?;
        f.write_all(&req.data)?;
        // Explicit chmod: the open mode is filtered by the umask.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&temp, path)
    };
    if let Err(e) = write_temp() {
        let _ = fs::remove_file(&temp);
        return Err(err(e));
    }
    sync_dir(dir).map_err(io_err(dir))?;
    Ok(Response::Written {
        size: req.data.len() as u64,
    })
}

/// Creates `dir` and its missing ancestors (mode 0o755), each new one given to `owner`
/// (existing ones keep theirs), as E2B's envd does for the user it writes as.
fn create_parents(dir: &Path, owner: Option<zygote_proto::Owner>) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        match fs::symlink_metadata(d) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(d),
            Err(e) => return Err(e),
        }
        at = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::DirBuilder::new().mode(DIR_MODE).create(d) {
            // A concurrent writer made it first: it is theirs, not ours to chown.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            r => r?,
        }
        if let Some(o) = owner {
            std::os::unix::fs::lchown(d, Some(o.uid), Some(o.gid))?;
        }
    }
    Ok(())
}

/// Make a rename durable: fsync the directory holding the new entry.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn kind_of(ft: fs::FileType) -> FileKind {
    if ft.is_file() {
        FileKind::File
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_symlink() {
        FileKind::Symlink
    } else {
        FileKind::Other
    }
}

pub(crate) fn metadata_of(path: &Path, m: &fs::Metadata) -> Metadata {
    let kind = kind_of(m.file_type());
    let symlink_target = if kind == FileKind::Symlink {
        fs::read_link(path)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    Metadata {
        kind,
        size: m.size(),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        mtime: m.mtime(),
        mtime_nanos: m.mtime_nsec().clamp(0, 999_999_999) as u32,
        symlink_target,
    }
}

pub(crate) fn stat(req: &StatRequest) -> Result<Response> {
    let path = abs_path(&req.path)?;
    let m = if req.follow_symlinks {
        fs::metadata(path)
    } else {
        fs::symlink_metadata(path)
    }
    .map_err(io_err(path))?;
    Ok(Response::Stat(metadata_of(path, &m)))
}

pub(crate) fn list_dir(path: &str) -> Result<Response> {
    let path = abs_path(path)?;
    let mut entries = Vec::new();
    for entry in fs::read_dir(path).map_err(io_err(path))? {
        let entry = entry.map_err(io_err(path))?;
        let full = entry.path();
        // An entry deleted while we list is simply not reported.
        let Ok(m) = fs::symlink_metadata(&full) else {
            continue;
        };
        entries.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            meta: metadata_of(&full, &m),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Response::DirListing { entries })
}

pub(crate) fn rename(req: &RenameRequest) -> Result<Response> {
    let from = abs_path(&req.from)?;
    let to = abs_path(&req.to)?;
    fs::rename(from, to)
        .map_err(|e| ErrorBody::from_io(&format!("{} -> {}", from.display(), to.display()), &e))?;
    if let Some(dir) = to.parent() {
        sync_dir(dir).map_err(io_err(dir))?;
    }
    Ok(Response::Ok)
}

pub(crate) fn remove(req: &RemoveRequest) -> Result<Response> {
    let path = abs_path(&req.path)?;
    if path == Path::new("/") {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            "refusing to remove /",
        ));
    }
    let err = io_err(path);
    let meta = fs::symlink_metadata(path).map_err(&err)?;
    if meta.is_dir() {
        if req.recursive {
            fs::remove_dir_all(path).map_err(&err)?;
        } else {
            fs::remove_dir(path).map_err(&err)?;
        }
    } else {
        fs::remove_file(path).map_err(&err)?;
    }
    Ok(Response::Ok)
}
