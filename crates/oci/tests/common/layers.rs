//! Layer tarballs from a list of entries (including whiteouts and hostile entries that
//! `tar::Builder` refuses), and OCI image layouts assembled from them with umoci.
//!
//! umoci 0.4.7 `raw add-layer` takes only uncompressed tars and always stores them gzipped
//! (`application/vnd.oci.image.layer.v1.tar+gzip`); it has no flag to choose compression.
//! Use [`super::push_zstd`] for zstd layers.

use std::path::{Path, PathBuf};
use std::process::Command;

use tar::{EntryType, Header};

use super::{read_json, require_tools, run};

/// Fixed mtime (2023-11-14) so identical specs give identical layer digests.
pub const MTIME: u64 = 1_700_000_000;

/// One tar member of a layer.
#[derive(Clone, Debug)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
        uid: u64,
        gid: u64,
    },
    File {
        path: String,
        data: Vec<u8>,
        mode: u32,
        uid: u64,
        gid: u64,
        mtime: u64,
        xattrs: Vec<(String, Vec<u8>)>,
    },
    Symlink {
        path: String,
        target: String,
    },
    Hardlink {
        path: String,
        target: String,
    },
    /// Deletes `path` from lower layers (written as an empty `dir/.wh.name`).
    Whiteout(String),
    /// Hides everything lower layers put in this directory (written as `dir/.wh..wh..opq`).
    Opaque(String),
    Fifo {
        path: String,
    },
    CharDevice {
        path: String,
        major: u32,
        minor: u32,
    },
    /// A header written byte for byte, for paths like `../escape` or `/etc/x` that
    /// `tar::Builder` refuses; `link` is the link target (empty for none), at most 100 bytes each.
    Raw {
        kind: EntryType,
        path: Vec<u8>,
        link: Vec<u8>,
        data: Vec<u8>,
        mode: u32,
    },
}

impl Entry {
    /// A root-owned 0755 directory.
    pub fn dir(path: &str) -> Self {
        Entry::Dir {
            path: path.into(),
            mode: 0o755,
            uid: 0,
            gid: 0,
        }
    }

    /// A root-owned 0644 file with the fixed [`MTIME`] and no xattrs.
    pub fn file(path: &str, data: impl Into<Vec<u8>>) -> Self {
        Entry::File {
            path: path.into(),
            data: data.into(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: MTIME,
            xattrs: vec![],
        }
    }

    /// A symbolic link (target stored verbatim, may be absolute or contain `..`).
    pub fn symlink(path: &str, target: &str) -> Self {
        Entry::Symlink {
            path: path.into(),
            target: target.into(),
        }
    }

    /// A hard link to `target`, a path inside the image.
    pub fn hardlink(path: &str, target: &str) -> Self {
        Entry::Hardlink {
            path: path.into(),
            target: target.into(),
        }
    }

    /// A hostile regular file whose path is written verbatim.
    pub fn raw_file(path: &[u8], data: &[u8]) -> Self {
        Entry::Raw {
            kind: EntryType::Regular,
            path: path.into(),
            link: vec![],
            data: data.into(),
            mode: 0o644,
        }
    }

    /// A hostile hard link whose path and target are written verbatim.
    pub fn raw_hardlink(path: &[u8], target: &[u8]) -> Self {
        Entry::Raw {
            kind: EntryType::Link,
            path: path.into(),
            link: target.into(),
            data: vec![],
            mode: 0o644,
        }
    }

    /// Sets the permission bits of a file or directory (no-op for other kinds).
    pub fn mode(mut self, m: u32) -> Self {
        if let Entry::Dir { mode, .. } | Entry::File { mode, .. } | Entry::Raw { mode, .. } =
            &mut self
        {
            *mode = m;
        }
        self
    }

    /// Sets the owner of a file or directory (no-op for other kinds).
    pub fn owner(mut self, u: u64, g: u64) -> Self {
        if let Entry::Dir { uid, gid, .. } | Entry::File { uid, gid, .. } = &mut self {
            (*uid, *gid) = (u, g);
        }
        self
    }

    /// Adds an extended attribute to a file (a PAX `SCHILY.xattr.<name>` record).
    pub fn xattr(mut self, name: &str, value: &[u8]) -> Self {
        if let Entry::File { xattrs, .. } = &mut self {
            xattrs.push((name.into(), value.into()));
        }
        self
    }
}

/// Image config fields the crate maps into a sandbox; empty means "not set".
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// A whole single-platform image: layers bottom-up, config, architecture (`amd64`, `arm64`).
#[derive(Clone, Debug)]
pub struct ImageSpec {
    pub layers: Vec<Vec<Entry>>,
    pub config: Config,
    pub arch: String,
}

impl ImageSpec {
    /// A one-layer image whose `/etc/arch` names the architecture, for index/platform tests.
    pub fn tiny(arch: &str) -> Self {
        let layer = vec![
            Entry::dir("etc"),
            Entry::file("etc/arch", format!("{arch}\n")),
        ];
        ImageSpec {
            layers: vec![layer],
            config: Config::default(),
            arch: arch.into(),
        }
    }
}

/// The three-layer amd64 image the self-test pushes, reusable as a known-good pull target.
// Applied, it must yield: etc/hostname = "zygote-v2\n"; app/old.txt gone (whiteout);
// app/cache holding only c (opaque); app/tool-link a hard link of bin/tool (0755, "#!tool\n");
// app/current -> cache; app/data.txt with xattr user.zygote = "yes"; app owned 1000:1000;
// etc/secret 0600; app/fifo a FIFO. Config: Env [PATH=/usr/bin:/bin, GREETING=hello world],
// WorkingDir /app, User 1000:1000, Entrypoint [/bin/tool], Cmd [--serve, 8080].
pub fn sample_spec() -> ImageSpec {
    let base = vec![
        Entry::dir("etc"),
        Entry::file("etc/hostname", "zygote\n"),
        Entry::file("etc/secret", "s3cret\n").mode(0o600),
        Entry::dir("bin"),
        Entry::file("bin/tool", "#!tool\n").mode(0o755),
        Entry::dir("app").owner(1000, 1000),
        Entry::file("app/old.txt", "old\n"),
        Entry::dir("app/cache"),
        Entry::file("app/cache/a", "a\n"),
        Entry::file("app/cache/b", "b\n"),
    ];
    let middle = vec![
        Entry::Whiteout("app/old.txt".into()),
        Entry::Opaque("app/cache".into()),
        Entry::file("app/cache/c", "c\n"),
        Entry::hardlink("app/tool-link", "bin/tool"),
        Entry::symlink("app/current", "cache"),
        Entry::file("app/data.txt", "data\n").xattr("user.zygote", b"yes"),
    ];
    let top = vec![
        Entry::file("etc/hostname", "zygote-v2\n"),
        Entry::Fifo {
            path: "app/fifo".into(),
        },
    ];
    let config = Config {
        env: vec!["PATH=/usr/bin:/bin".into(), "GREETING=hello world".into()],
        working_dir: Some("/app".into()),
        user: Some("1000:1000".into()),
        entrypoint: vec!["/bin/tool".into()],
        cmd: vec!["--serve".into(), "8080".into()],
    };
    ImageSpec {
        layers: vec![base, middle, top],
        config,
        arch: "amd64".into(),
    }
}

/// Serializes entries into an uncompressed tar, exactly in the given order.
pub fn layer_tar(entries: &[Entry]) -> Result<Vec<u8>, String> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        append(&mut b, e).map_err(|err| format!("{e:?}: {err}"))?;
    }
    b.into_inner().map_err(|e| e.to_string())
}

fn header(kind: EntryType, mode: u32, uid: u64, gid: u64, mtime: u64, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(gid);
    h.set_mtime(mtime);
    h.set_size(size);
    h
}

/// `dir/name` -> `dir/<prefix>name`, for whiteout file names.
fn sibling(path: &str, name: &str) -> String {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some((dir, base)) => format!("{dir}/{name}{base}"),
        None => format!("{name}{path}"),
    }
}

fn append(b: &mut tar::Builder<Vec<u8>>, e: &Entry) -> std::io::Result<()> {
    let empty: &[u8] = &[];
    match e {
        Entry::Dir {
            path,
            mode,
            uid,
            gid,
        } => b.append_data(
            &mut header(EntryType::Directory, *mode, *uid, *gid, MTIME, 0),
            path,
            empty,
        ),
        Entry::File {
            path,
            data,
            mode,
            uid,
            gid,
            mtime,
            xattrs,
        } => {
            if !xattrs.is_empty() {
                let records: Vec<u8> = xattrs
                    .iter()
                    .flat_map(|(k, v)| pax_record(&format!("SCHILY.xattr.{k}"), v))
                    .collect();
                let mut h = Header::new_ustar();
                h.set_entry_type(EntryType::XHeader);
                h.set_mode(0o644);
                h.set_size(records.len() as u64);
                h.set_path(
                    sibling(path, "PaxHeaders/")
                        .chars()
                        .take(99)
                        .collect::<String>(),
                )?;
                h.set_cksum();
                b.append(&h, &records[..])?;
            }
            let mut h = header(
                EntryType::Regular,
                *mode,
                *uid,
                *gid,
                *mtime,
                data.len() as u64,
            );
            b.append_data(&mut h, path, &data[..])
        }
        Entry::Symlink { path, target } | Entry::Hardlink { path, target } => {
            let kind = if matches!(e, Entry::Symlink { .. }) {
                EntryType::Symlink
            } else {
                EntryType::Link
            };
            b.append_link(&mut header(kind, 0o777, 0, 0, MTIME, 0), path, target)
        }
        Entry::Whiteout(path) => b.append_data(
            &mut header(EntryType::Regular, 0o644, 0, 0, MTIME, 0),
            sibling(path, ".wh."),
            empty,
        ),
        Entry::Opaque(dir) => {
            let path = format!("{}/.wh..wh..opq", dir.trim_end_matches('/'));
            b.append_data(
                &mut header(EntryType::Regular, 0o644, 0, 0, MTIME, 0),
                path,
                empty,
            )
        }
        Entry::Fifo { path } => b.append_data(
            &mut header(EntryType::Fifo, 0o644, 0, 0, MTIME, 0),
            path,
            empty,
        ),
        Entry::CharDevice { path, major, minor } => {
            let mut h = header(EntryType::Char, 0o666, 0, 0, MTIME, 0);
            h.set_device_major(*major)?;
            h.set_device_minor(*minor)?;
            b.append_data(&mut h, path, empty)
        }
        Entry::Raw {
            kind,
            path,
            link,
            data,
            mode,
        } => {
            let mut h = header(*kind, *mode, 0, 0, MTIME, data.len() as u64);
            let old = h.as_old_mut();
            let too_long = || std::io::Error::other("raw path or link longer than 100 bytes");
            old.name
                .get_mut(..path.len())
                .ok_or_else(too_long)?
                .copy_from_slice(path);
            old.linkname
                .get_mut(..link.len())
                .ok_or_else(too_long)?
                .copy_from_slice(link);
            h.set_cksum();
            b.append(&h, &data[..])
        }
    }
}

/// One PAX record, `"<len> <key>=<value>\n"`, where len counts the whole record.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3; // space, '=', newline
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut out = format!("{len} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

/// A tagged image inside an OCI image layout directory.
#[derive(Clone, Debug)]
pub struct LayoutRef {
    pub path: PathBuf,
    pub tag: String,
}

impl LayoutRef {
    /// The `oci:PATH:TAG` reference skopeo understands.
    pub fn transport(&self) -> String {
        format!("oci:{}:{}", self.path.display(), self.tag)
    }

    /// The manifest digest `index.json` records for the tag, to compare with what a pull resolves.
    pub fn manifest_digest(&self) -> Result<String, String> {
        let index = read_json(&self.path.join("index.json"))?;
        index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == self.tag.as_str())
            .and_then(|m| m["digest"].as_str().map(str::to_owned))
            .ok_or_else(|| format!("tag {} not in {}/index.json", self.tag, self.path.display()))
    }

    /// Reads a blob of the layout by digest (manifest, config or layer).
    pub fn blob(&self, digest: &str) -> Result<Vec<u8>, String> {
        let path = self.path.join("blobs").join(digest.replacen(':', "/", 1));
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Builds `spec` as `tag` in the OCI layout `dir` (created if absent or empty; other tags kept).
pub fn build_layout(spec: &ImageSpec, dir: &Path, tag: &str) -> Result<LayoutRef, String> {
    require_tools(&["umoci"])?;
    if !dir.join("index.json").exists() {
        if dir.exists() {
            // umoci init refuses existing paths; only an empty directory may be replaced.
            std::fs::remove_dir(dir)
                .map_err(|e| format!("{} is not an empty dir: {e}", dir.display()))?;
        }
        run(Command::new("umoci").arg("init").arg("--layout").arg(dir))?;
    }
    let image = format!("{}:{tag}", dir.display());
    run(Command::new("umoci").args(["new", "--image", &image]))?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    for (i, entries) in spec.layers.iter().enumerate() {
        let tar = tmp.path().join(format!("layer{i}.tar"));
        std::fs::write(&tar, layer_tar(entries)?).map_err(|e| e.to_string())?;
        run(Command::new("umoci")
            .args(["raw", "add-layer", "--image", &image])
            .arg(&tar))?;
    }
    let c = &spec.config;
    let mut cmd = Command::new("umoci");
    cmd.args([
        "config",
        "--image",
        &image,
        "--os=linux",
        &format!("--architecture={}", spec.arch),
    ]);
    cmd.args(c.env.iter().map(|e| format!("--config.env={e}")));
    cmd.args(
        c.working_dir
            .iter()
            .map(|w| format!("--config.workingdir={w}")),
    );
    cmd.args(c.user.iter().map(|u| format!("--config.user={u}")));
    cmd.args(
        c.entrypoint
            .iter()
            .map(|e| format!("--config.entrypoint={e}")),
    );
    cmd.args(c.cmd.iter().map(|e| format!("--config.cmd={e}")));
    run(&mut cmd)?;
    // Every umoci step leaves the previous manifest and config behind: drop them.
    run(Command::new("umoci").arg("gc").arg("--layout").arg(dir))?;
    Ok(LayoutRef {
        path: dir.to_owned(),
        tag: tag.to_owned(),
    })
}
