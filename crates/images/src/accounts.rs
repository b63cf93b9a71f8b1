//! Login accounts a recipe asks for (`USERS="user"`), added to the staged tree
//! without running anything inside it.
//!
//! E2B's templates run commands as an unprivileged `user` (uid 1000, home
//! `/home/user`, password-less sudo), and code written for E2B expects that account.
//! A debootstrap tree has only the system accounts, and running `useradd` in a chroot
//! would execute the tree's own binaries on the host; instead the account lines are
//! appended to the tree's `/etc/passwd`, `/etc/group` and `/etc/shadow`, the home is
//! made from `/etc/skel`, and owners are set on the staged files, which `mkfs.ext4 -d`
//! copies into the image as they are.
use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{ImageError, IoContext, Result};
use crate::pack::{find_file, put_file, resolve_parent};

/// The first uid (and gid) given to recipe accounts, Debian's first regular one.
pub const FIRST_UID: u32 = 1000;

/// At most this many accounts per recipe (they get consecutive ids).
pub const MAX_USERS: usize = 16;

/// Whether `name` is a valid account name (Debian's default `NAME_REGEX`, lowercase).
pub fn valid_user_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 32
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Adds each account of `users` (uid = gid = 1000, 1001, ...) to the tree at `root`:
/// a home from `/etc/skel` owned by it, `/bin/bash` as shell, membership of `sudo`
/// when the tree has that group and a password-less sudoers entry when it has
/// `/etc/sudoers.d`. An account the tree already has is left as it is.
pub fn add_users(root: &Path, users: &[String]) -> Result<()> {
    for (i, name) in users.iter().enumerate() {
        let id = FIRST_UID + i as u32;
        let passwd = read_etc(root, "/etc/passwd")?;
        if passwd.lines().any(|l| l.split(':').next() == Some(name)) {
            continue;
        }
        if passwd
            .lines()
            .any(|l| l.split(':').nth(2) == Some(&id.to_string()))
        {
            return Err(guest_error(
                "/etc/passwd",
                format!("uid {id} for account {name:?} is taken"),
            ));
        }
        let home = format!("/home/{name}");
        append_line(
            root,
            "/etc/passwd",
            &passwd,
            &format!("{name}:x:{id}:{id}::{home}:/bin/bash"),
        )?;
        let group = read_etc(root, "/etc/group")?;
        let group = add_to_group(&group, "sudo", name);
        append_line(root, "/etc/group", &group, &format!("{name}:x:{id}:"))?;
        if let Ok(shadow) = read_etc(root, "/etc/shadow") {
            // `*`: no password login; sudo is password-less below.
            let entry = format!("{name}:*:19000:0:99999:7:::");
            append_line(root, "/etc/shadow", &shadow, &entry)?;
        }
        make_home(root, &home, id)?;
        if find_file(root, "/etc/sudoers.d")?.is_some_and(|p| p.is_dir()) {
            let rule = format!("{name} ALL=(ALL:ALL) NOPASSWD: ALL\n");
            put_file(
                root,
                &format!("/etc/sudoers.d/{name}"),
                rule.as_bytes(),
                0o440,
            )?;
        }
    }
    Ok(())
}

fn guest_error(path: &str, msg: String) -> ImageError {
    ImageError::GuestPath {
        path: path.into(),
        msg,
    }
}

/// The text of one of the tree's account files (followed inside the tree only).
fn read_etc(root: &Path, guest: &str) -> Result<String> {
    let path = find_file(root, guest)?.ok_or_else(|| guest_error(guest, "missing".into()))?;
    std::fs::read_to_string(&path).ctx(|| format!("reading {}", path.display()))
}

/// Writes `text` plus `line` back as the tree's `guest` file, keeping its owner and mode
/// (`/etc/shadow` is `root:shadow 0640`).
fn append_line(root: &Path, guest: &str, text: &str, line: &str) -> Result<()> {
    let path = find_file(root, guest)?.ok_or_else(|| guest_error(guest, "missing".into()))?;
    let meta = std::fs::metadata(&path).ctx(|| format!("stat {}", path.display()))?;
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line);
    out.push('\n');
    put_file(root, guest, out.as_bytes(), meta.mode() & 0o7777)?;
    lchown(&path, Some(meta.uid()), Some(meta.gid())).ctx(|| format!("chown {}", path.display()))
}

/// `group` with `user` added to the members of group `name`, when that group exists.
fn add_to_group(group: &str, name: &str, user: &str) -> String {
    group
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() == 4 && fields[0] == name {
                let members = fields[3];
                let sep = if members.is_empty() { "" } else { "," };
                format!(
                    "{}:{}:{}:{members}{sep}{user}\n",
                    fields[0], fields[1], fields[2]
                )
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

/// `home` (mode 0750, Debian's default for new homes) with `/etc/skel`'s regular files,
/// all owned by `id`.
fn make_home(root: &Path, home: &str, id: u32) -> Result<()> {
    let name = Path::new(home)
        .file_name()
        .ok_or_else(|| guest_error(home, "no file name".into()))?;
    let dir = resolve_parent(root, home)?.join(name);
    std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750))
        .ctx(|| format!("chmod {}", dir.display()))?;
    if let Some(skel) = find_file(root, "/etc/skel")?.filter(|p| p.is_dir()) {
        for entry in std::fs::read_dir(&skel).ctx(|| format!("listing {}", skel.display()))? {
            let entry = entry.ctx(|| format!("listing {}", skel.display()))?;
            // Regular files only: a link or device in a hostile tree is not copied.
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                let to = dir.join(entry.file_name());
                std::fs::copy(entry.path(), &to).ctx(|| format!("copying to {}", to.display()))?;
                lchown(&to, Some(id), Some(id)).ctx(|| format!("chown {}", to.display()))?;
            }
        }
    }
    lchown(&dir, Some(id), Some(id)).ctx(|| format!("chown {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let etc = t.path().join("etc");
        std::fs::create_dir_all(etc.join("skel")).unwrap();
        std::fs::create_dir_all(etc.join("sudoers.d")).unwrap();
        std::fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        std::fs::write(etc.join("group"), "root:x:0:\nsudo:x:27:\n").unwrap();
        std::fs::write(etc.join("shadow"), "root:*:19000:0:99999:7:::\n").unwrap();
        let mode = std::fs::Permissions::from_mode(0o640);
        std::fs::set_permissions(etc.join("shadow"), mode).unwrap();
        std::fs::write(etc.join("skel/.bashrc"), "# skel\n").unwrap();
        t
    }

    #[test]
    fn names_follow_debian_rules() {
        for ok in ["user", "a", "build-1", "x_y"] {
            assert!(valid_user_name(ok), "{ok}");
        }
        for bad in ["", "User", "1user", "a:b", "a b", "../x", &"u".repeat(33)] {
            assert!(!valid_user_name(bad), "{bad}");
        }
    }

    #[test]
    fn adds_an_account_with_home_group_sudo_and_owner() {
        let t = tree();
        add_users(t.path(), &["user".into()]).unwrap();
        let read = |p: &str| std::fs::read_to_string(t.path().join(p)).unwrap();
        assert!(read("etc/passwd").ends_with("user:x:1000:1000::/home/user:/bin/bash\n"));
        assert_eq!(
            read("etc/group"),
            "root:x:0:\nsudo:x:27:user\nuser:x:1000:\n"
        );
        assert!(read("etc/shadow").contains("\nuser:*:"));
        let shadow = std::fs::metadata(t.path().join("etc/shadow")).unwrap();
        assert_eq!(shadow.mode() & 0o777, 0o640, "the file keeps its mode");
        assert_eq!(
            read("etc/sudoers.d/user"),
            "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
        );
        let home = std::fs::metadata(t.path().join("home/user")).unwrap();
        assert_eq!(
            (home.uid(), home.gid(), home.mode() & 0o777),
            (1000, 1000, 0o750)
        );
        let rc = std::fs::metadata(t.path().join("home/user/.bashrc")).unwrap();
        assert_eq!(rc.uid(), 1000);
        // Idempotent: a second pass adds nothing.
        add_users(t.path(), &["user".into()]).unwrap();
        let lines = read("etc/passwd");
        assert_eq!(lines.lines().filter(|l| l.starts_with("user:")).count(), 1);
    }

    #[test]
    fn a_taken_uid_is_refused_and_a_skel_link_is_not_followed() {
        let t = tree();
        std::os::unix::fs::symlink("/etc/hostname", t.path().join("etc/skel/leak")).unwrap();
        add_users(t.path(), &["user".into()]).unwrap();
        assert!(!t.path().join("home/user/leak").exists());
        let t = tree();
        let passwd = "root:x:0:0:root:/root:/bin/bash\nother:x:1000:1000::/h:/bin/sh\n";
        std::fs::write(t.path().join("etc/passwd"), passwd).unwrap();
        let err = add_users(t.path(), &["user".into()]).unwrap_err();
        assert!(err.to_string().contains("uid 1000"), "{err}");
    }
}
