//! A snapshot as a pack file, on whichever runtime the suite runs (the kvm runtime only
//! in the nested lane): exported, imported back as a new snapshot, and started; the
//! sandbox it starts has the snapshot's files. The two-daemon and registry cases are in
//! tests/packs.rs (qemu runtime).
use hyper::Method;
use serde_json::json;
use zygote_daemon::client::Client;
use zygote_daemon::model::Snapshot;

use super::common::{create, Cleanup};
use super::read;

/// Exports `snap`, imports it, starts a sandbox from the import and reads `path` there
/// (it must hold `expected`); everything it made is deleted again.
pub async fn check_round_trip(
    c: &Client,
    snap: &Snapshot,
    path: &str,
    expected: &str,
    cleanup: &Cleanup,
) {
    let mut pack = Vec::new();
    let n = c
        .download(
            &format!("/v1/snapshots/{}/export", snap.id),
            &mut pack,
            |_| {},
        )
        .await
        .expect("export");
    assert!(n > 0 && n as usize == pack.len());
    let body = (bytes::Bytes::from(pack), "application/x-tar");
    let imported: Snapshot = serde_json::from_slice(
        &c.raw(
            Method::POST,
            "/v1/snapshots/import?name=round-trip",
            Some(body),
        )
        .await
        .expect("import"),
    )
    .expect("a snapshot");
    assert_ne!(imported.id, snap.id);
    assert_eq!(
        imported.pack.as_ref().map(|p| p.snapshot.as_str()),
        Some(snap.id.as_str())
    );
    let sb = create(c, json!({"snapshot": imported.id}), cleanup)
        .await
        .remove(0);
    assert_eq!(read(c, &sb.id, path).await.unwrap(), expected);
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{}", sb.id), None)
        .await
        .expect("delete the sandbox");
    c.raw(
        Method::DELETE,
        &format!("/v1/snapshots/{}", imported.id),
        None,
    )
    .await
    .expect("delete the imported snapshot");
}
