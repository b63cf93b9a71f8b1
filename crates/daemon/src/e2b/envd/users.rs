//! E2B's users: the name a client acts as (`Authorization: Basic base64("<user>:")` on
//! Connect calls, `?username=` on `/files`) becomes the uid, gid and home envd would
//! use, read from the guest's own `/etc/passwd` (and `/etc/group` for owner names).
//!
//! Both files are the guest's, so hostile: they are read through the agent as regular
//! files of at most [`MAX_ACCOUNT_FILE_BYTES`], at most [`MAX_ACCOUNT_LINES`] lines are
//! looked at, and a malformed line is skipped, never trusted in part. They are read per
//! request (no cache): the guest may add users at any time, as E2B's templates do.
//!
//! With no user named, envd (>= 0.4.0) uses the template's default user; for zygote
//! that is `user` when the guest has it (E2B's templates all do), else root. An unknown
//! name is envd's `invalid username: '<u>'`.
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{header, HeaderMap};
use base64::Engine as _;

use super::connect::{Code, ConnectError};
use crate::manager::Manager;

/// Bytes of `/etc/passwd` or `/etc/group` read at most.
pub const MAX_ACCOUNT_FILE_BYTES: u64 = 1 << 20;
/// Lines of either file looked at.
const MAX_ACCOUNT_LINES: usize = 65_536;
/// Longest user name taken from a client or the guest (useradd allows 32).
const MAX_NAME_BYTES: usize = 256;
/// The user E2B's SDKs and templates run as by default.
const DEFAULT_USER: &str = "user";

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("invalid username: '{0}'")]
    Unknown(String),
    #[error("malformed Authorization header: expected Basic base64(\"<user>:\")")]
    BadAuthorization,
    #[error("reading the guest's {file}: {message}")]
    Accounts { file: &'static str, message: String },
}

impl From<UserError> for ConnectError {
    fn from(e: UserError) -> ConnectError {
        match e {
            UserError::Unknown(_) | UserError::BadAuthorization => {
                ConnectError::new(Code::Unauthenticated, e.to_string())
            }
            UserError::Accounts { .. } => ConnectError::new(Code::Internal, e.to_string()),
        }
    }
}

/// A guest user as envd acts for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

impl User {
    fn root() -> User {
        User {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        }
    }

    pub fn owner(&self) -> zygote_proto::Owner {
        zygote_proto::Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }
}

/// The guest's users (from `/etc/passwd`) and group names (from `/etc/group`).
#[derive(Debug, Default)]
pub struct Accounts {
    users: Vec<User>,
    groups: BTreeMap<u32, String>,
}

impl Accounts {
    /// The guest's users; group names too when `with_groups` (for owner names).
    pub async fn load(
        manager: &Arc<Manager>,
        id: &str,
        with_groups: bool,
    ) -> Result<Accounts, UserError> {
        let read = |file: &'static str| async move {
            manager
                .read_small_file(id, file, MAX_ACCOUNT_FILE_BYTES)
                .await
                .map(|d| d.unwrap_or_default())
                .map_err(|e| UserError::Accounts {
                    file,
                    message: e.to_string(),
                })
        };
        let users = parse_passwd(&read("/etc/passwd").await?);
        let groups = if with_groups {
            parse_group(&read("/etc/group").await?)
        } else {
            BTreeMap::new()
        };
        Ok(Accounts { users, groups })
    }

    /// The user named `name`, or the default one (`user`, else root).
    pub fn resolve(&self, name: Option<&str>) -> Result<User, UserError> {
        let by_name = |n: &str| self.users.iter().find(|u| u.name == n).cloned();
        match name.filter(|n| !n.is_empty()) {
            Some(n) => by_name(n)
                .or_else(|| (n == "root").then(User::root))
                .ok_or_else(|| UserError::Unknown(printable(n))),
            None => Ok(by_name(DEFAULT_USER)
                .or_else(|| by_name("root"))
                .unwrap_or_else(User::root)),
        }
    }

    /// The name of uid `uid`, or the number (as Go's envd shows an unknown owner).
    pub fn user_name(&self, uid: u32) -> String {
        self.users
            .iter()
            .find(|u| u.uid == uid)
            .map_or_else(|| uid.to_string(), |u| u.name.clone())
    }

    pub fn group_name(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// The user a Connect call names in `Authorization: Basic base64("<user>:")`, if any.
pub fn basic_auth_user(headers: &HeaderMap) -> Result<Option<String>, UserError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| UserError::BadAuthorization)?;
    let Some((scheme, encoded)) = value.trim().split_once(' ') else {
        return Err(UserError::BadAuthorization);
    };
    if !scheme.eq_ignore_ascii_case("basic") || encoded.len() > 4 * MAX_NAME_BYTES {
        return Err(UserError::BadAuthorization);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| UserError::BadAuthorization)?;
    let text = String::from_utf8(decoded).map_err(|_| UserError::BadAuthorization)?;
    let name = text.split(':').next().unwrap_or("");
    Ok((!name.is_empty()).then(|| name.to_string()))
}

/// The user a Connect call acts as: the one its `Authorization` names, else the
/// default user.
pub async fn acting_user(
    manager: &Arc<Manager>,
    id: &str,
    headers: &HeaderMap,
) -> Result<User, UserError> {
    let name = basic_auth_user(headers)?;
    Accounts::load(manager, id, false)
        .await?
        .resolve(name.as_deref())
}

/// A client-given name as it may appear in a message: bounded, control characters out.
fn printable(name: &str) -> String {
    name.chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME_BYTES)
        .collect()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_BYTES && !name.chars().any(char::is_control)
}

/// `name:x:uid:gid:gecos:home:shell` lines; any other line is skipped. A home that is
/// not an absolute path without NUL becomes `/`.
fn parse_passwd(data: &[u8]) -> Vec<User> {
    let text = String::from_utf8_lossy(data);
    text.lines()
        .take(MAX_ACCOUNT_LINES)
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() != 7 || !valid_name(f[0]) {
                return None;
            }
            let home = f[5];
            let home_ok = home.starts_with('/') && home.len() <= 4096 && !home.contains('\0');
            Some(User {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: if home_ok { home.into() } else { "/".into() },
            })
        })
        .collect()
}

/// `name:x:gid:members` lines: gid → name (the first line for a gid wins).
fn parse_group(data: &[u8]) -> BTreeMap<u32, String> {
    let text = String::from_utf8_lossy(data);
    let mut groups = BTreeMap::new();
    for line in text.lines().take(MAX_ACCOUNT_LINES) {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() != 4 || !valid_name(f[0]) {
            continue;
        }
        if let Ok(gid) = f[2].parse::<u32>() {
            groups.entry(gid).or_insert_with(|| f[0].to_string());
        }
    }
    groups
}

/// `path` as envd resolves it for `user`: `~` and relative paths under the home, then
/// `.` and `..` folded lexically (never above `/`). `None` for an empty path or one
/// with a NUL byte.
pub fn resolve_path(path: &str, user: &User) -> Option<String> {
    if path.is_empty() || path.contains('\0') {
        return None;
    }
    let joined = if path.starts_with('/') {
        path.to_string()
    } else if path == "~" {
        user.home.clone()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{}/{rest}", user.home)
    } else {
        format!("{}/{path}", user.home)
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_account_files_are_read_line_by_line() {
        let passwd = b"root:x:0:0:root:/root:/bin/bash\n\
user:x:1000:1000::/home/user:/bin/bash\n\
broken:x:notanumber:1::/x:/bin/sh\n\
short:x:1\n\
odd:x:7:7::relative/home:/bin/sh\n\xff\xfe:x:9:9::/:/bin/sh\n";
        let accounts = Accounts {
            users: parse_passwd(passwd),
            groups: parse_group(b"root:x:0:\nuser:x:1000:\nbad:x:y:\n"),
        };
        assert_eq!(accounts.users.len(), 4, "{:?}", accounts.users);
        let user = accounts.resolve(None).unwrap();
        assert_eq!(
            (user.uid, user.gid, user.home.as_str()),
            (1000, 1000, "/home/user")
        );
        assert_eq!(accounts.resolve(Some("odd")).unwrap().home, "/");
        assert!(matches!(
            accounts.resolve(Some("broken")),
            Err(UserError::Unknown(n)) if n == "broken"
        ));
        assert_eq!(accounts.user_name(1000), "user");
        assert_eq!(accounts.user_name(4242), "4242");
        assert_eq!(accounts.group_name(1000), "user");
        // No `user`: root, even from an empty file.
        assert_eq!(Accounts::default().resolve(None).unwrap(), User::root());
        assert_eq!(
            Accounts::default().resolve(Some("root")).unwrap(),
            User::root()
        );
    }

    #[test]
    fn paths_resolve_under_the_home_and_never_above_root() {
        let u = User {
            name: "u".into(),
            uid: 1,
            gid: 1,
            home: "/home/u".into(),
        };
        assert_eq!(resolve_path("a/b", &u).unwrap(), "/home/u/a/b");
        assert_eq!(resolve_path("~", &u).unwrap(), "/home/u");
        assert_eq!(resolve_path("~/x/./y/..", &u).unwrap(), "/home/u/x");
        assert_eq!(
            resolve_path("../../../../etc/passwd", &u).unwrap(),
            "/etc/passwd"
        );
        assert_eq!(resolve_path("/../..", &u).unwrap(), "/");
        assert_eq!(resolve_path("", &u), None);
        assert_eq!(resolve_path("a\0b", &u), None);
    }

    #[test]
    fn basic_authorization_names_the_user() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, v.parse().unwrap());
            m
        };
        assert_eq!(basic_auth_user(&HeaderMap::new()).unwrap(), None);
        // base64("user:")
        assert_eq!(
            basic_auth_user(&h("Basic dXNlcjo=")).unwrap().as_deref(),
            Some("user")
        );
        for bad in ["Bearer dXNlcjo=", "Basic !!!", "Basic"] {
            assert!(basic_auth_user(&h(bad)).is_err(), "{bad}");
        }
    }
}
