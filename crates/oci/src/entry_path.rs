//! Tar entry names as guest paths. A name from a layer or an archive is hostile: it is
//! refused when it is not UTF-8, has a `..` component or one longer than a file name
//! can be (`NAME_MAX`: the host would fail it with an error that blames the host), and
//! otherwise normalized to
//! an absolute path (`/` and `.` components dropped) that resolves inside the tree.
//! Names made from entries (a whiteout's hidden name) are checked with [`entry_name`]
//! before they are joined to a host path.

/// The longest file name Linux filesystems take.
const NAME_MAX: usize = 255;

/// The absolute, normalized form of a tar entry's path; None for the root itself.
pub(crate) fn guest_path(raw: &[u8]) -> std::result::Result<Option<String>, String> {
    let s = std::str::from_utf8(raw)
        .map_err(|_| format!("{:?} is not UTF-8", String::from_utf8_lossy(raw)))?;
    let mut parts = Vec::new();
    for c in s.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(format!("{s:?} has a `..` component")),
            c if c.len() > NAME_MAX => {
                let start: String = c.chars().take(32).collect();
                return Err(format!(
                    "a component of the path ({start:?}...) is {} bytes, longer than the \
                     {NAME_MAX} a file name may have",
                    c.len()
                ));
            }
            c => parts.push(c),
        }
    }
    Ok((!parts.is_empty()).then(|| format!("/{}", parts.join("/"))))
}

/// The last component of an absolute guest path.
pub(crate) fn final_component(guest: &str) -> &str {
    guest.rsplit_once('/').map_or(guest, |(_, name)| name)
}

/// `name` if it names an entry of a directory: not empty, `.` or `..` (the directory
/// itself and its parent: joined to a host path, those reach other files than `name`'s).
pub(crate) fn entry_name(name: &str) -> std::result::Result<&str, String> {
    match name {
        "" | "." | ".." => Err(format!("{name:?} is not the name of a directory entry")),
        _ => Ok(name),
    }
}
