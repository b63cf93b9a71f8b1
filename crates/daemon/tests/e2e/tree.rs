//! Branch trees end to end: the lineage with each branch's cost, and keeping one
//! branch (siblings dropped, the parent replaced).
use hyper::Method;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use zygote_daemon::client::{Client, ClientError};

use zygote_daemon::model::{DiffEntry, KeepResponse, SandboxDiff, SandboxList, SandboxTree};

use super::get;

async fn tree(c: &Client, id: &str) -> SandboxTree {
    c.json(
        Method::GET,
        &format!("/v1/sandboxes/{id}/tree"),
        None::<&()>,
    )
    .await
    .unwrap_or_else(|e| panic!("tree of {id}: {e}"))
}

/// Right after `parent` branched into `children`: the same tree from any member.
pub async fn check_tree(c: &Client, parent: &str, children: &[String]) {
    for from in std::iter::once(parent).chain(children.iter().map(String::as_str)) {
        let t = tree(c, from).await;
        assert_eq!(t.root, parent, "tree seen from {from}");
        let ids: Vec<&str> = t.sandboxes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids[0], parent);
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v
        };
        assert_eq!(sorted(&t.sandboxes[0].children), sorted(children));
        let below: Vec<String> = t.sandboxes[1..].iter().map(|n| n.id.clone()).collect();
        assert_eq!(
            below, t.sandboxes[0].children,
            "children follow their parent"
        );
        for n in &t.sandboxes[1..] {
            assert_eq!(n.parent.as_deref(), Some(parent));
            let unique = n
                .unique_memory_bytes
                .expect("a running child's unique memory");
            assert!(unique > 0, "{n:?}");
        }
        assert!(
            t.snapshots.iter().any(|s| s.source_sandbox == parent),
            "the branch point is listed: {:?}",
            t.snapshots
        );
    }
}

/// The parent was created with metadata team=search, run=e2e: its children have it too,
/// with `zygote.parent`, and the list filters on it.
pub async fn check_metadata(c: &Client, parent: &str, children: &[String]) {
    let want_parent: BTreeMap<String, String> = [("run", "e2e"), ("team", "search")]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
    assert_eq!(get(c, parent).await.metadata, want_parent);
    for child in children {
        let mut want = want_parent.clone();
        want.insert("zygote.parent".into(), parent.into());
        assert_eq!(get(c, child).await.metadata, want, "{child}");
    }
    let ids = |query: &'static str| async move {
        let list: SandboxList = c
            .json(Method::GET, &format!("/v1/sandboxes?{query}"), None::<&()>)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        let mut ids: Vec<String> = list.sandboxes.into_iter().map(|s| s.id).collect();
        ids.sort();
        ids
    };
    let mut family: Vec<String> = children.to_vec();
    family.push(parent.to_string());
    family.sort();
    assert_eq!(ids("metadata=team=search").await, family);
    let mut kids = children.to_vec();
    kids.sort();
    let by_parent = format!("metadata=zygote.parent={parent}&metadata=run=e2e");
    let list: SandboxList = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes?{by_parent}"),
            None::<&()>,
        )
        .await
        .expect("filter by parent");
    let mut got: Vec<String> = list.sandboxes.into_iter().map(|s| s.id).collect();
    got.sort();
    assert_eq!(got, kids, "ANDed filters");
    assert!(ids("metadata=team=other").await.is_empty());
}

/// Keep `winner` over its `sibling` and replace `parent` by it; returns nothing left
/// but `winner` (named as the parent was).
pub async fn keep_and_promote(c: &Client, parent: &str, winner: &str, sibling: &str) {
    let parent_name = get(c, parent).await.name;
    // Not a branch child: nothing changes.
    let e = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/keep"),
            Some(&json!({})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("conflict"), "{e}");
    let kept: KeepResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{winner}/keep"),
            Some(&json!({"promote": true})),
        )
        .await
        .expect("keep");
    assert_eq!(kept.kept, winner);
    assert_eq!(kept.deleted, [sibling, parent]);
    assert_eq!(kept.name, parent_name);
    let t = tree(c, winner).await;
    assert_eq!(t.root, winner);
    assert_eq!(t.sandboxes.len(), 1, "{t:?}");
    assert_eq!(get(c, winner).await.name, parent_name);
    // Its siblings are gone now: keeping it again has nothing to drop.
    let e = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{winner}/keep"),
            Some(&json!({})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("conflict"), "{e}");
}

/// Where each child copies its parent's memory (qemu), a branch the host cannot hold is
/// refused up front, saying how many children fit.
pub async fn check_branch_capacity(c: &Client, parent: &str, runtime: &str) {
    if runtime != "qemu" {
        return; // kvm children share memory: up to 256 are tried.
    }
    let mem_mib = u64::from(get(c, parent).await.mem_mib);
    let available_mib = zygote_vmm::host::meminfo_kib("MemAvailable").expect("MemAvailable") / 1024;
    if available_mib / mem_mib >= 256 {
        eprintln!(
            "skip: {available_mib} MiB available holds 256 children of {mem_mib} MiB; \
             the capacity refusal is not reachable here"
        );
        return;
    }
    let e = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some(&json!({"count": 256})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("insufficient_memory"), "{e}");
    assert!(e.to_string().contains("room for"), "{e}");
}

async fn diff(c: &Client, id: &str, query: &str) -> Result<SandboxDiff, ClientError> {
    c.json(
        Method::GET,
        &format!("/v1/sandboxes/{id}/diff?{query}"),
        None::<&()>,
    )
    .await
}

/// Siblings and parent compared: `b` wrote /root/child.txt, each child's hook wrote its
/// own /root/forked.txt, the parent wrote /root/parent-after.txt after the branch.
pub async fn check_diff(c: &Client, parent: &str, b: &str, sibling: &str) {
    let d = diff(c, b, &format!("against={sibling}&path=/root&content=true"))
        .await
        .expect("diff of siblings");
    let paths = |v: &[DiffEntry]| v.iter().map(|e| e.path.clone()).collect::<Vec<_>>();
    assert_eq!(paths(&d.added), ["child.txt"], "{d:?}");
    assert!(d.removed.is_empty(), "{d:?}");
    assert_eq!(d.modified.len(), 1, "{d:?}");
    let m = &d.modified[0];
    assert_eq!(m.path, "forked.txt");
    let unified = m.unified.as_deref().expect("a text diff");
    assert!(
        unified.contains(&format!("-{sibling} ")) && unified.contains(&format!("+{b} ")),
        "{unified}"
    );
    let d = diff(c, b, &format!("against={parent}"))
        .await
        .expect("diff against the parent");
    assert_eq!(d.path, "/root");
    assert_eq!(paths(&d.added), ["child.txt", "forked.txt"], "{d:?}");
    assert_eq!(paths(&d.removed), ["parent-after.txt"], "{d:?}");
    assert!(d.modified.is_empty(), "{d:?}");
    assert!(d.modified.iter().all(|m| m.unified.is_none()));
    for (query, code) in [
        (
            format!("against={parent}&path=/root/../etc"),
            "invalid_argument",
        ),
        (format!("against={b}"), "invalid_argument"),
        ("against=sb-000000000000".to_string(), "not_found"),
    ] {
        let e = diff(c, b, &query).await.unwrap_err();
        assert_eq!(e.code(), Some(code), "{query}: {e}");
    }
}
