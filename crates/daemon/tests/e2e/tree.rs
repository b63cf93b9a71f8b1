//! Branch trees end to end: the lineage with each branch's cost, and keeping one
//! branch (siblings dropped, the parent replaced).
use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{KeepResponse, SandboxTree};

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
