//! A bounded, seeded fuzz of snapshot pack import through the API (the stand-in for
//! cargo-fuzz that always runs; scripts/fuzz.sh runs it longer, and libFuzzer's
//! fuzz/ target covers the archive reader in-process). A valid hand-made
//! pack (tests/pack_util) is damaged at every level it has: the tar's bytes, the
//! manifest, the config (then re-digested, so the damage reaches the daemon's checks),
//! each file's blob, its roles and its decoded contents (a qcow2 header). Property:
//! each upload is taken (201) or refused cleanly with a 4xx whose message names no host
//! path; a refusal leaves no file in the blob store, the image store, the staging or
//! the state directory; the daemon lives on. `ZYGOTE_FUZZ_ITERS` sets the number of
//! uploads, `ZYGOTE_FUZZ_SEED` the seed (printed on failure).
mod common;
mod pack_util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};

use pack_util::{diff, encode, import, random_bytes, Host, PackParts, Rng};

fn iterations() -> u64 {
    std::env::var("ZYGOTE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150)
}

fn seed() -> u64 {
    std::env::var("ZYGOTE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7a79_676f_7061_636b)
}

const CONFIG_PATHS: &[&str] = &[
    "format",
    "runtime",
    "accel",
    "cpu",
    "cpu.vendor",
    "cpu.family",
    "mem_mib",
    "vcpus",
    "image",
    "image.name",
    "image.sha256",
    "snapshot",
    "snapshot.id",
    "snapshot.name",
    "snapshot.kind",
    "snapshot.source_sandbox",
    "snapshot.created_at",
    "agent_token",
    "run",
    "run.env",
    "run.cwd",
    "run.uid",
    "state_file",
];

const NAMES: &[&str] = &[
    "",
    ".",
    "..",
    "../x",
    "state/../../x",
    "a/b/c",
    ".hidden",
    "state",
    "state/state",
    "state/vm",
    "state/vm/memory.bin",
    "state/state/x",
    "disk",
    "image",
    "image2",
    "vm/meta.json",
    "x\u{0}y",
];

fn some_value(r: &mut Rng) -> Value {
    match r.below(12) {
        0 => Value::Null,
        1 => json!(r.below(2) == 0),
        2 => json!(0),
        3 => json!(-1),
        4 => json!(r.next_u64()),
        5 => json!(1.5),
        6 => json!("a".repeat(r.below(600) as usize)),
        7 => json!(NAMES[r.below(NAMES.len() as u64) as usize]),
        8 => json!([1, "x", null]),
        9 => json!({"k": "v"}),
        10 => json!("ab".repeat(32)),
        _ => json!(r.below(70_000)),
    }
}

/// Sets (or removes, with None) a dotted path in a JSON object.
fn set_path(v: &mut Value, path: &str, to: Option<Value>) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap();
    let mut cur = v;
    for p in parts {
        if !cur[p].is_object() {
            cur[p] = json!({});
        }
        cur = &mut cur[p];
    }
    if let Some(obj) = cur.as_object_mut() {
        match to {
            Some(x) => {
                obj.insert(last.to_string(), x);
            }
            None => {
                obj.remove(last);
            }
        }
    }
}

/// One damaged upload (and what was done, for the failure message).
fn mutate(r: &mut Rng, good: &PackParts, work: &Path) -> (String, Vec<u8>) {
    let mut p = good.clone();
    match r.below(5) {
        0 => {
            let mut t = good.tar();
            let what = match r.below(5) {
                0 => {
                    let at = r.below(t.len() as u64) as usize;
                    t.truncate(at);
                    format!("tar cut at {at}")
                }
                1 => {
                    let n = 1 + r.below(8);
                    for _ in 0..n {
                        let at = r.below(t.len() as u64) as usize;
                        t[at] ^= 1 << r.below(8);
                    }
                    format!("{n} bits flipped in the tar")
                }
                2 => {
                    let block = r.below((t.len() / 512) as u64) as usize * 512;
                    let junk = random_bytes(r, 512);
                    t[block..block + 512].copy_from_slice(&junk);
                    format!("tar block at {block} overwritten")
                }
                3 => {
                    let at = r.below(t.len() as u64) as usize;
                    let n = 1 + r.below(2000) as usize;
                    let junk = random_bytes(r, n);
                    t.splice(at..at, junk);
                    format!("bytes inserted at {at}")
                }
                _ => {
                    let mut entries = vec![(
                        "blobs/sha256/".to_string() + &"0".repeat(64),
                        random_bytes(r, 100),
                    )];
                    entries.push(("index.json".into(), b"{}".to_vec()));
                    t = pack_util::tar_of(&entries);
                    "a tar of other things".into()
                }
            };
            (what, t)
        }
        1 => {
            let path = CONFIG_PATHS[r.below(CONFIG_PATHS.len() as u64) as usize];
            let what = if r.below(4) == 0 {
                set_path(&mut p.config, path, None);
                format!("config without {path}")
            } else {
                let v = some_value(r);
                let what = format!("config {path} = {}", truncate(&v.to_string()));
                set_path(&mut p.config, path, Some(v));
                what
            };
            (what, p.tar())
        }
        2 => {
            let i = r.below(p.files.len() as u64) as usize;
            let role = p.files[i].0.clone();
            let what = match r.below(7) {
                0 => {
                    let n = r.below(5000) as usize;
                    p.files[i].1 = random_bytes(r, n);
                    format!("{role}: random bytes")
                }
                1 => {
                    let n = p.files[i].1.len();
                    p.files[i].1.truncate(r.below(n as u64) as usize);
                    format!("{role}: blob cut")
                }
                2 => {
                    let n = r.below(1 << 20) as usize;
                    let data = random_bytes(r, n);
                    p.files[i].1 = encode(work, "fuzz", &data);
                    format!("{role}: random contents")
                }
                3 => {
                    let mut layer = pack_util::qcow2_layer(work, 4 << 20);
                    for _ in 0..1 + r.below(4) {
                        let at = r.below(512) as usize;
                        layer[at] = r.next_u64() as u8;
                    }
                    p.files[i].1 = encode(work, "fuzz", &layer);
                    format!("{role}: a damaged qcow2 header")
                }
                4 => {
                    let to = NAMES[r.below(NAMES.len() as u64) as usize];
                    p.files[i].0 = to.to_string();
                    format!("{role} renamed {to:?}")
                }
                5 => {
                    p.files.remove(i);
                    format!("{role} left out")
                }
                _ => {
                    let copy = p.files[i].clone();
                    p.files.push(copy);
                    format!("{role} twice")
                }
            };
            (what, p.tar())
        }
        3 => {
            let mut m = p.manifest();
            let what = match r.below(6) {
                0 => {
                    m["artifactType"] = json!("application/x-other");
                    m["config"]["mediaType"] = json!("application/json");
                    "another artifact type".to_string()
                }
                1 => {
                    m["layers"][0]["mediaType"] = json!("application/vnd.oci.image.layer.v1.tar");
                    "a layer of another type".into()
                }
                2 => {
                    m["layers"][1]["annotations"] = json!({});
                    "a layer without a role".into()
                }
                3 => {
                    m["layers"][2]["digest"] = json!(format!("sha256:{}", "e".repeat(64)));
                    "a layer whose blob is not there".into()
                }
                4 => {
                    m["config"]["digest"] = m["layers"][2]["digest"].clone();
                    "the config pointing at a file".into()
                }
                _ => {
                    m["layers"] = json!([]);
                    "no layers".into()
                }
            };
            (what, p.tar_with_manifest(&m))
        }
        _ => {
            let (a, _) = mutate(r, good, work);
            let (b, t) = mutate(r, good, work);
            (format!("{a}, and (separately) {b}"), t)
        }
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(60).collect()
}

/// After an accepted upload: the snapshot deleted and what it stored removed from the
/// cache (its base image, its committed blobs), so the next one starts as the first.
async fn reset(c: &Client, host: &Host, baseline: &BTreeMap<PathBuf, u64>) {
    let l: Value = c
        .json(Method::GET, "/v1/snapshots", None::<&()>)
        .await
        .unwrap();
    for s in l["snapshots"].as_array().unwrap() {
        let id = s["id"].as_str().unwrap();
        c.raw(Method::DELETE, &format!("/v1/snapshots/{id}"), None)
            .await
            .unwrap_or_else(|e| panic!("deleting {id}: {e}"));
    }
    for p in host.footprint().keys() {
        if !baseline.contains_key(p) && p.starts_with(&host.cache) {
            std::fs::remove_file(p).unwrap();
        }
    }
    assert_eq!(diff(baseline, &host.footprint()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_packs_are_refused_cleanly_and_leave_nothing() {
    if let Err(why) = pack_util::require_tools() {
        eprintln!("skipping damaged_packs_are_refused_cleanly_and_leave_nothing: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let host = Host::start(&tmp.path().join("host"), &[]);
    let c = host.client();
    let good = PackParts::synthetic(&work, 42, 2 << 20);
    let baseline = host.footprint();
    // The undamaged pack is taken: refusals below are the damage's.
    import(&c, good.tar()).await.expect("the undamaged pack");
    reset(&c, &host, &baseline).await;

    let seed = seed();
    let mut r = Rng(seed | 1);
    let (mut taken, mut refused) = (0, BTreeMap::<String, u32>::new());
    for i in 0..iterations() {
        let (what, body) = mutate(&mut r, &good, &work);
        let ctx = format!("iteration {i} (ZYGOTE_FUZZ_SEED={seed}): {what}");
        match import(&c, body).await {
            Ok(_) => {
                eprintln!("taken: {ctx}");
                taken += 1;
                reset(&c, &host, &baseline).await;
            }
            Err(ClientError::Api {
                status,
                code,
                message,
            }) => {
                assert!(
                    (400..500).contains(&status),
                    "{ctx}: {status} {code}: {message}"
                );
                for p in host.paths() {
                    assert!(!message.contains(&p), "{ctx}: {message:?} names {p}");
                }
                let left = diff(&baseline, &host.footprint());
                assert!(
                    left.is_empty(),
                    "{ctx}: refused ({code}: {message}) but left {left:?}"
                );
                *refused.entry(code).or_default() += 1;
            }
            Err(e) => panic!("{ctx}: {e} (did the daemon die?)"),
        }
    }
    eprintln!(
        "{} uploads: {taken} taken, refused: {refused:?}",
        iterations()
    );
    // The daemon is still there.
    let _: Value = c
        .json(Method::GET, "/v1/info", None::<&()>)
        .await
        .expect("the daemon answers");
}
