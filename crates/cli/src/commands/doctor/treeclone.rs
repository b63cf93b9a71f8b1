//! Tree clones: which of zygote-treeclone's fast methods work where zygote
//! copies trees (the daemon's state directory, the image cache), found by
//! trying each in a scratch directory there (`zygote_treeclone::probe_methods`).
//!
//! The only doctor probe that writes: it makes and removes a hidden scratch
//! directory inside an *existing* directory. A place that does not exist yet
//! is not created; its nearest existing ancestor is probed instead (the
//! filesystem it will land on). Per-file copy always works, so a missing
//! method is a warning at most, never a failure.
use std::path::Path;

use serde::Serialize;
use zygote_treeclone::MethodSupport;

use super::classify::{Out, Status};
use super::facts::Facts;

/// One place zygote clones trees in, and what the probe found there.
#[derive(Debug, Clone, Serialize)]
pub struct PlaceFacts {
    /// `state` (the daemon's state directory) or `images` (the image cache):
    /// the finding is `treeclone.<place>`.
    pub place: &'static str,
    pub dir: String,
    /// Where the probe ran: `dir`, or its nearest existing ancestor when `dir`
    /// does not exist yet (None: no ancestor exists either).
    pub probed_dir: Option<String>,
    /// Filesystem of `probed_dir` (statfs).
    pub fs: Option<String>,
    /// subvolume, overlay, reflink: whether each works there, and why (not).
    pub methods: Vec<MethodSupport>,
}

/// Probe the places the daemon (default state directory, as `zygote serve`
/// without `--state-dir` would use it) and the image builder clone trees in.
pub fn gather() -> Vec<PlaceFacts> {
    vec![
        probe_place("state", &zygote_api::defaults::state_dir(None)),
        probe_place("images", &zygote_images::paths::images_dir()),
    ]
}

pub(super) fn probe_place(place: &'static str, dir: &Path) -> PlaceFacts {
    // Never create `dir` as a side effect: probe the nearest existing ancestor
    // (a relative path's last ancestor is "", the current directory).
    let probed = dir
        .ancestors()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .find(|p| p.is_dir());
    PlaceFacts {
        place,
        dir: dir.display().to_string(),
        probed_dir: probed.map(|p| p.display().to_string()),
        fs: probed.and_then(|p| zygote_treeclone::fs_type_name(p).ok()),
        methods: probed
            .map(zygote_treeclone::probe_methods)
            .unwrap_or_default(),
    }
}

pub(super) fn findings(facts: &Facts, out: &mut Out) {
    for p in &facts.features.treeclone {
        let (status, detail) = place_finding(p, facts.host.root);
        out.add(&format!("treeclone.{}", p.place), status, detail);
    }
}

fn place_finding(p: &PlaceFacts, root: bool) -> (Status, String) {
    let fs = p.fs.as_deref().unwrap_or("unknown filesystem");
    let at = match p.probed_dir.as_deref() {
        Some(probed) if probed != p.dir => {
            format!("{} (not created yet; probed {probed}, {fs})", p.dir)
        }
        Some(_) => format!("{} ({fs})", p.dir),
        None => {
            return (
                Status::Warn,
                format!(
                    "{}: neither it nor any parent exists, so nothing was probed",
                    p.dir
                ),
            )
        }
    };
    // A scratch directory that could not be made fails every method alike.
    if let [first, rest @ ..] = p.methods.as_slice() {
        if !first.available
            && rest
                .iter()
                .all(|m| !m.available && m.detail == first.detail)
        {
            return (
                Status::Warn,
                format!("{at}: not probed: {}; per-file copy works", first.detail),
            );
        }
    }
    let get = |name: &str| p.methods.iter().find(|m| m.method == name);
    let have = |name: &str| get(name).is_some_and(|m| m.available);
    let (sub, ovl, refl) = (have("subvolume"), have("overlay"), have("reflink"));

    let mut works = Vec::new();
    if sub {
        works.push("subvolume snapshots (constant time)");
    }
    if ovl {
        works.push("overlay mounts of sealed trees (constant time, root)");
    }
    if refl {
        works.push("reflinks (per file, no data copied)");
    }
    works.push("per-file copy");
    let missing: Vec<&str> = [(sub, "subvolume"), (ovl, "overlay"), (refl, "reflink")]
        .into_iter()
        .filter_map(|(ok, name)| (!ok).then_some(name))
        .collect();
    // Where a method "should" work here, why it did not is worth showing.
    let unexpected: Vec<String> = missing
        .iter()
        .filter(|&&m| match m {
            "subvolume" => fs == "btrfs",
            "reflink" => fs == "btrfs" || fs == "xfs",
            _ => root,
        })
        .filter_map(|m| get(m).map(|s| format!("{m}: {}", s.detail)))
        .collect();
    let why = if unexpected.is_empty() {
        String::new()
    } else {
        format!(" ({})", unexpected.join("; "))
    };
    let works = works.join(", ");
    // Good enough: a constant-time clone for every tree (subvolume), or for
    // sealed trees with reflinks for the rest.
    if sub || (ovl && refl) {
        let not = if missing.is_empty() {
            String::new()
        } else {
            format!("; not {}", or_list(&missing))
        };
        return (Status::Ok, format!("{at}: {works}{not}{why}"));
    }
    let slow = match (ovl, refl) {
        (true, false) => "trees that are not sealed are copied byte for byte",
        (false, true) => "tree clones cost one reflink per file (no constant-time clone)",
        _ => "every tree clone copies every byte",
    };
    let mut faster = vec![if refl {
        "btrfs here would snapshot whole trees in constant time"
    } else {
        "btrfs here would give subvolume snapshots and reflinks (XFS: reflinks)"
    }];
    if !ovl && !root {
        faster.push("as root, sealed trees would mount as overlays");
    }
    (
        Status::Warn,
        format!(
            "{at}: {works}; no {}: {slow}; {}{why}",
            or_list(&missing),
            faster.join("; ")
        ),
    )
}

/// "a", "a or b", "a, b or c".
fn or_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::classify::classify;

    fn method(method: &'static str, available: bool, detail: &str) -> MethodSupport {
        MethodSupport {
            method,
            available,
            detail: detail.into(),
        }
    }

    fn place(fs: &str, sub: bool, ovl: bool, refl: bool) -> PlaceFacts {
        PlaceFacts {
            place: "state",
            dir: "/var/lib/zygote".into(),
            probed_dir: Some("/var/lib/zygote".into()),
            fs: Some(fs.into()),
            methods: vec![
                method("subvolume", sub, "subvolume detail"),
                method("overlay", ovl, "overlay detail"),
                method("reflink", refl, "reflink detail"),
            ],
        }
    }

    fn check(p: PlaceFacts, root: bool) -> (Status, String) {
        let mut f = Facts::default();
        f.host.root = root;
        f.features.treeclone = vec![p];
        let r = classify(&f);
        let found = r
            .findings
            .iter()
            .find(|x| x.check == "treeclone.state")
            .expect("treeclone.state finding");
        (found.status, found.detail.clone())
    }

    #[test]
    fn ext4_as_root_warns_overlay_only() {
        let (s, d) = check(place("ext2/3/4", false, true, false), true);
        assert_eq!(s, Status::Warn);
        assert!(d.contains("overlay mounts"), "{d}");
        assert!(d.contains("no subvolume or reflink"), "{d}");
        assert!(d.contains("btrfs here"), "{d}");
        assert!(!d.contains("as root"), "{d}");
    }

    #[test]
    fn unprivileged_ext4_suggests_btrfs_and_root() {
        let (s, d) = check(place("ext2/3/4", false, false, false), false);
        assert_eq!(s, Status::Warn);
        assert!(d.contains("copies every byte"), "{d}");
        assert!(d.contains("no subvolume, overlay or reflink"), "{d}");
        assert!(d.contains("as root"), "{d}");
        // Expected refusals are not spelled out; details stay in the JSON.
        assert!(!d.contains("detail"), "{d}");
    }

    #[test]
    fn btrfs_is_ok_and_unexpected_failures_say_why() {
        let (s, d) = check(place("btrfs", true, false, true), false);
        assert_eq!(s, Status::Ok);
        assert!(d.contains("subvolume snapshots"), "{d}");
        assert!(d.contains("not overlay"), "{d}");
        let (s, d) = check(place("btrfs", false, true, true), true);
        assert_eq!(s, Status::Ok, "overlay + reflink is enough");
        assert!(d.contains("subvolume: subvolume detail"), "{d}");
        let (s, d) = check(place("xfs", false, false, true), true);
        assert_eq!(s, Status::Warn);
        assert!(d.contains("overlay: overlay detail"), "{d}");
        assert!(d.contains("one reflink per file"), "{d}");
    }

    #[test]
    fn unprobed_and_missing_places_warn_never_fail() {
        let mut p = place("ext2/3/4", false, false, false);
        for m in &mut p.methods {
            m.detail = "cannot make a scratch directory in /x: Permission denied".into();
        }
        let (s, d) = check(p, false);
        assert_eq!(s, Status::Warn);
        assert!(d.contains("not probed: cannot make"), "{d}");
        let mut p = place("ext2/3/4", false, false, false);
        p.probed_dir = None;
        assert_eq!(check(p, false).0, Status::Warn);
        let mut p = place("ext2/3/4", false, true, false);
        p.probed_dir = Some("/var/lib".into());
        let (_, d) = check(p, true);
        assert!(d.contains("not created yet; probed /var/lib"), "{d}");
    }

    #[test]
    fn probing_a_missing_dir_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state/zygote");
        let p = probe_place("state", &dir);
        assert_eq!(p.probed_dir.as_deref(), Some(tmp.path().to_str().unwrap()));
        assert_eq!(p.methods.len(), 3);
        // Neither the place nor a scratch directory is left behind.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
