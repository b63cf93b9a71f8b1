//! Image recipes: one `<name>.recipe` file per image.
//!
//! The format is a strict subset of shell variable assignments, so a recipe
//! can be `source`d by a shell script and parsed here without a shell:
//!
//! ```text
//! # comment
//! DESCRIPTION="Debian bookworm + python3"
//! BASE=debootstrap            # busybox | debootstrap
//! SUITE=bookworm              # debootstrap only
//! VARIANT=minbase             # debootstrap only (default minbase)
//! PACKAGES="python3 python3-numpy"
//! APT_PACKAGES="npm"          # debootstrap only: installed by apt-get in the tree afterwards
//! MIRROR=http://deb.debian.org/debian   # optional: default from apt sources
//! SIZE_MIB=1024               # ext4 size (sparse file)
//! HOSTNAME=zygote             # optional
//! FILES="files/motd:/etc/motd"  # extra files, src (relative to the recipe) : guest path
//! USERS="user"                # login accounts (uid 1000, 1001, ...; see accounts.rs)
//! ```
//!
//! Values are either bare words or quoted with `"` or `'`; `$`, backquotes and
//! backslashes are rejected so that no shell expansion could make `source`
//! and this parser disagree. Unknown keys are errors (they are usually typos).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::accounts::{valid_user_name, MAX_USERS};
use crate::error::{ImageError, IoContext, Result};
use crate::paths::recipe_dirs;

/// How the root filesystem tree starts out before the agent is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// Debian's static busybox plus one symlink per applet.
    Busybox,
    /// `debootstrap --variant=VARIANT --include=PACKAGES SUITE`.
    Debootstrap {
        suite: String,
        variant: String,
        packages: Vec<String>,
        /// Installed by apt-get inside the tree after debootstrap: for packages whose
        /// dependencies debootstrap's own resolver cannot follow (virtual packages and
        /// alternatives, e.g. Debian's `npm`).
        apt_packages: Vec<String>,
        mirror: Option<String>,
    },
}

/// An extra file copied into the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraFile {
    /// Host path (relative entries are resolved against the recipe's directory).
    pub src: PathBuf,
    /// Absolute path inside the guest.
    pub dest: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub name: String,
    pub path: PathBuf,
    /// The recipe file's text, verbatim (part of the image cache key).
    pub text: String,
    pub description: String,
    pub base: Base,
    pub size_mib: u64,
    pub hostname: String,
    /// Login accounts to add (`USERS`), in uid order.
    pub users: Vec<String>,
    pub files: Vec<ExtraFile>,
}

const KEYS: &[&str] = &[
    "DESCRIPTION",
    "BASE",
    "SUITE",
    "VARIANT",
    "PACKAGES",
    "APT_PACKAGES",
    "MIRROR",
    "SIZE_MIB",
    "HOSTNAME",
    "FILES",
    "USERS",
];

/// Image names double as file-name prefixes: keep them boring.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
        && name.len() <= 64
}

/// Parses the `KEY=value` lines of a recipe into a map (the syntax layer).
pub fn parse_assignments(path: &Path, text: &str) -> Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for (idx, raw) in text.lines().enumerate() {
        let err = |msg: String| ImageError::RecipeSyntax {
            path: path.to_path_buf(),
            line: idx + 1,
            msg,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, rest)) = line.split_once('=') else {
            return Err(err(format!("expected KEY=value, got {line:?}")));
        };
        let key_ok = key.starts_with(|c: char| c.is_ascii_uppercase())
            && key
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !key_ok {
            return Err(err(format!("invalid key {key:?} (no spaces around '=')")));
        }
        if !KEYS.contains(&key) {
            return Err(err(format!(
                "unknown key {key} (known: {})",
                KEYS.join(", ")
            )));
        }
        let (value, trailer) = split_value(rest).map_err(&err)?;
        let trailer = trailer.trim_start();
        if !trailer.is_empty() && !trailer.starts_with('#') {
            return Err(err(format!("unexpected text after the value: {trailer:?}")));
        }
        if vars.insert(key.to_string(), value).is_some() {
            return Err(err(format!("{key} is set twice")));
        }
    }
    Ok(vars)
}

/// Splits a value from what follows it on the line.
fn split_value(rest: &str) -> std::result::Result<(String, &str), String> {
    const FORBIDDEN: &[char] = &['$', '`', '\\'];
    if let Some(quote @ ('"' | '\'')) = rest.chars().next() {
        let body = &rest[1..];
        let end = body
            .find(quote)
            .ok_or_else(|| format!("missing closing {quote}"))?;
        let value = &body[..end];
        if quote == '"' && value.contains(FORBIDDEN) {
            return Err("'$', '`' and '\\' are not allowed in values".into());
        }
        return Ok((value.to_string(), &body[end + 1..]));
    }
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let value = &rest[..end];
    if value.contains(FORBIDDEN)
        || value.contains(['"', '\'', ';', '&', '|', '<', '>', '(', ')', '#'])
    {
        return Err(format!(
            "quote the value {value:?}: it has shell metacharacters"
        ));
    }
    Ok((value.to_string(), &rest[end..]))
}

/// Parses and validates a whole recipe.
pub fn parse_recipe(name: &str, path: &Path, text: &str) -> Result<Recipe> {
    let mut vars = parse_assignments(path, text)?;
    let invalid = |msg: String| ImageError::RecipeInvalid {
        path: path.to_path_buf(),
        msg,
    };
    if !valid_name(name) {
        return Err(invalid(format!(
            "image name {name:?} must be lowercase letters, digits, '.', '_' or '-'"
        )));
    }
    let mut take = |key: &str| vars.remove(key);
    let description = take("DESCRIPTION").unwrap_or_default();
    let base_kind = take("BASE").ok_or_else(|| invalid("BASE= is required".into()))?;
    let suite = take("SUITE");
    let variant = take("VARIANT");
    let packages = take("PACKAGES");
    let apt_packages = take("APT_PACKAGES");
    let mirror = take("MIRROR");
    let base = match base_kind.as_str() {
        "busybox" => {
            if suite.is_some()
                || variant.is_some()
                || packages.is_some()
                || apt_packages.is_some()
                || mirror.is_some()
            {
                return Err(invalid(
                    "SUITE, VARIANT, PACKAGES, APT_PACKAGES and MIRROR only apply to \
                     BASE=debootstrap"
                        .into(),
                ));
            }
            Base::Busybox
        }
        "debootstrap" => {
            let suite = suite.ok_or_else(|| invalid("BASE=debootstrap needs SUITE=".into()))?;
            let variant = variant.unwrap_or_else(|| "minbase".into());
            let words = |list: Option<String>| -> Vec<String> {
                list.unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_string)
                    .collect()
            };
            let packages = words(packages);
            let apt_packages = words(apt_packages);
            // Led by a letter or digit: a word is never taken for an option of
            // debootstrap or apt-get.
            let word_ok = |w: &str| {
                w.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && w.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.:_".contains(c))
            };
            for word in packages
                .iter()
                .chain(&apt_packages)
                .chain([&suite, &variant])
            {
                if !word_ok(word) {
                    return Err(invalid(format!("invalid suite/variant/package {word:?}")));
                }
            }
            if let Some(m) = &mirror {
                if !(m.starts_with("http://") || m.starts_with("https://")) {
                    return Err(invalid(format!("MIRROR must be an http(s) URL, got {m:?}")));
                }
            }
            Base::Debootstrap {
                suite,
                variant,
                packages,
                apt_packages,
                mirror,
            }
        }
        other => {
            return Err(invalid(format!(
                "BASE must be busybox or debootstrap, not {other:?}"
            )))
        }
    };
    let size_text = take("SIZE_MIB").ok_or_else(|| invalid("SIZE_MIB= is required".into()))?;
    let size_mib: u64 = size_text
        .parse()
        .ok()
        .filter(|s| (16..=1 << 20).contains(s))
        .ok_or_else(|| invalid(format!("SIZE_MIB must be 16..=1048576, got {size_text:?}")))?;
    let hostname = take("HOSTNAME").unwrap_or_else(|| "zygote".into());
    let host_ok = !hostname.is_empty()
        && hostname.len() <= 63
        && hostname
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !host_ok {
        return Err(invalid(format!("invalid HOSTNAME {hostname:?}")));
    }
    let recipe_dir = path.parent().unwrap_or(Path::new("."));
    let mut files = Vec::new();
    for entry in take("FILES").unwrap_or_default().split_whitespace() {
        let (src, dest) = entry
            .split_once(':')
            .ok_or_else(|| invalid(format!("FILES entry {entry:?} is not SRC:DEST")))?;
        if !dest.starts_with('/') || dest.split('/').any(|c| c == "..") || dest.ends_with('/') {
            return Err(invalid(format!(
                "FILES destination {dest:?} must be an absolute file path without '..'"
            )));
        }
        files.push(ExtraFile {
            src: recipe_dir.join(src),
            dest: dest.to_string(),
        });
    }
    let users: Vec<String> = take("USERS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if users.len() > MAX_USERS {
        return Err(invalid(format!(
            "USERS names more than {MAX_USERS} accounts"
        )));
    }
    for (i, user) in users.iter().enumerate() {
        if !valid_user_name(user) || users[..i].contains(user) || user == "root" {
            return Err(invalid(format!(
                "USERS entry {user:?} must be a new lowercase account name, each once"
            )));
        }
    }
    Ok(Recipe {
        name: name.to_string(),
        path: path.to_path_buf(),
        text: text.to_string(),
        description,
        base,
        size_mib,
        hostname,
        users,
        files,
    })
}

/// Loads a recipe by name (searching [`recipe_dirs`]) or by path to a
/// `.recipe` file (the image is then named after the file).
pub fn find_recipe(name_or_path: &str) -> Result<Recipe> {
    let as_path = Path::new(name_or_path);
    if name_or_path.contains('/') || name_or_path.ends_with(".recipe") {
        let name = as_path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        return load(&name, as_path);
    }
    let dirs = recipe_dirs();
    for dir in &dirs {
        let path = dir.join(format!("{name_or_path}.recipe"));
        if path.is_file() {
            return load(name_or_path, &path);
        }
    }
    Err(ImageError::UnknownRecipe {
        name: name_or_path.to_string(),
        searched: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

fn load(name: &str, path: &Path) -> Result<Recipe> {
    let text = std::fs::read_to_string(path).ctx(|| format!("reading {}", path.display()))?;
    parse_recipe(name, path, &text)
}

/// Every recipe visible through [`recipe_dirs`] as (name, path), shadowed
/// names omitted, sorted by name.
pub fn list_recipes() -> Vec<(String, PathBuf)> {
    let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
    for dir in recipe_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "recipe") {
                if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                    found.entry(stem.to_string()).or_insert(path);
                }
            }
        }
    }
    found.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Recipe> {
        parse_recipe("test", Path::new("/r/test.recipe"), text)
    }

    #[test]
    fn parses_busybox_recipe() {
        let r =
            parse("# tiny\nBASE=busybox\nSIZE_MIB=64   # sparse\nDESCRIPTION=\"a b\"\n").unwrap();
        assert_eq!(r.base, Base::Busybox);
        assert_eq!(r.size_mib, 64);
        assert_eq!(r.description, "a b");
        assert_eq!(r.hostname, "zygote");
        assert!(r.files.is_empty());
    }

    #[test]
    fn parses_debootstrap_recipe_with_files() {
        let r = parse(
            "BASE=debootstrap\nSUITE=bookworm\nPACKAGES='python3  python3-numpy'\n\
             SIZE_MIB=1024\nFILES=\"files/motd:/etc/motd x:/opt/x\"\nHOSTNAME=py\n",
        )
        .unwrap();
        assert_eq!(
            r.base,
            Base::Debootstrap {
                suite: "bookworm".into(),
                variant: "minbase".into(),
                packages: vec!["python3".into(), "python3-numpy".into()],
                apt_packages: vec![],
                mirror: None,
            }
        );
        assert_eq!(r.hostname, "py");
        assert_eq!(
            r.files,
            vec![
                ExtraFile {
                    src: "/r/files/motd".into(),
                    dest: "/etc/motd".into()
                },
                ExtraFile {
                    src: "/r/x".into(),
                    dest: "/opt/x".into()
                },
            ]
        );
    }

    #[test]
    fn rejects_syntax_errors_with_line_numbers() {
        let cases = [
            ("BASE=busybox\nSIZE_MIB = 64\n", 2, "invalid key"),
            ("BASE=busybox\nSIZE=64\n", 2, "unknown key SIZE"),
            ("BASE=busybox\nBASE=busybox\n", 2, "set twice"),
            ("DESCRIPTION=\"unterminated\n", 1, "missing closing"),
            ("DESCRIPTION=\"$(rm -rf /)\"\n", 1, "not allowed"),
            ("DESCRIPTION=a;b\n", 1, "metacharacters"),
            ("DESCRIPTION=two words\n", 1, "after the value"),
            ("just words\n", 1, "expected KEY=value"),
        ];
        for (text, want_line, want_msg) in cases {
            match parse(text) {
                Err(ImageError::RecipeSyntax { line, msg, .. }) => {
                    assert_eq!(line, want_line, "{text:?}: {msg}");
                    assert!(msg.contains(want_msg), "{text:?}: {msg}");
                }
                other => panic!("{text:?}: expected a syntax error, got {other:?}"),
            }
        }
    }

    #[test]
    fn rejects_invalid_recipes() {
        let cases = [
            ("SIZE_MIB=64\n", "BASE= is required"),
            ("BASE=alpine\nSIZE_MIB=64\n", "busybox or debootstrap"),
            ("BASE=busybox\n", "SIZE_MIB= is required"),
            ("BASE=busybox\nSIZE_MIB=8\n", "SIZE_MIB must be"),
            ("BASE=busybox\nSIZE_MIB=lots\n", "SIZE_MIB must be"),
            ("BASE=busybox\nSUITE=bookworm\nSIZE_MIB=64\n", "only apply"),
            (
                "BASE=busybox\nAPT_PACKAGES=npm\nSIZE_MIB=64\n",
                "only apply",
            ),
            (
                "BASE=debootstrap\nSUITE=b\nAPT_PACKAGES=\"n;rm\"\nSIZE_MIB=64\n",
                "package",
            ),
            (
                "BASE=debootstrap\nSUITE=b\nAPT_PACKAGES=\"-oDir=/x\"\nSIZE_MIB=64\n",
                "package",
            ),
            ("BASE=debootstrap\nSIZE_MIB=64\n", "needs SUITE"),
            (
                "BASE=debootstrap\nSUITE=bookworm\nPACKAGES=\"a,b\"\nSIZE_MIB=64\n",
                "package",
            ),
            (
                "BASE=debootstrap\nSUITE=b\nMIRROR=ftp://x\nSIZE_MIB=64\n",
                "http(s)",
            ),
            ("BASE=busybox\nSIZE_MIB=64\nFILES=a:etc/x\n", "absolute"),
            ("BASE=busybox\nSIZE_MIB=64\nFILES=a:/etc/../x\n", "absolute"),
            ("BASE=busybox\nSIZE_MIB=64\nFILES=a\n", "SRC:DEST"),
            ("BASE=busybox\nSIZE_MIB=64\nHOSTNAME=a.b\n", "HOSTNAME"),
            ("BASE=busybox\nSIZE_MIB=64\nUSERS=\"Bob\"\n", "USERS entry"),
            ("BASE=busybox\nSIZE_MIB=64\nUSERS=\"a a\"\n", "USERS entry"),
            ("BASE=busybox\nSIZE_MIB=64\nUSERS=root\n", "USERS entry"),
            ("BASE=busybox\nSIZE_MIB=64\nUSERS=\"a:0\"\n", "USERS entry"),
        ];
        for (text, want) in cases {
            match parse(text) {
                Err(ImageError::RecipeInvalid { msg, .. }) => {
                    assert!(msg.contains(want), "{text:?}: {msg}")
                }
                other => panic!("{text:?}: expected an invalid recipe, got {other:?}"),
            }
        }
    }

    #[test]
    fn image_names() {
        for ok in ["minimal", "python", "py3.11", "a-b_c", "0"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "Python", "-x", "a/b", "a b", ".hidden"] {
            assert!(!valid_name(bad), "{bad}");
        }
        let err = parse_recipe(
            "Bad",
            Path::new("/r/Bad.recipe"),
            "BASE=busybox\nSIZE_MIB=64\n",
        );
        assert!(matches!(err, Err(ImageError::RecipeInvalid { .. })));
    }

    #[test]
    fn builtin_recipes_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/rootfs/recipes");
        for name in ["minimal", "python"] {
            let path = dir.join(format!("{name}.recipe"));
            let text = std::fs::read_to_string(&path).unwrap();
            let recipe = parse_recipe(name, &path, &text).unwrap();
            assert_eq!(recipe.name, name);
        }
    }

    #[test]
    fn recipe_is_valid_shell() {
        // The format promises `source`-compatibility: check it with a real shell.
        let text = "DESCRIPTION=\"a b\"\nBASE=busybox # c\nPACKAGES='x y'\n";
        parse_assignments(Path::new("t"), text).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{text}\nprintf '%s|%s|%s' \"$DESCRIPTION\" \"$BASE\" \"$PACKAGES\""
            ))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|busybox|x y");
    }
}
