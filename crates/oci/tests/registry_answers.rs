//! What a registry answers, and what the host's disk can hold, against pulls and
//! imports: a hostile registry (`common::fake`, on 127.0.0.1) sends bodies far past
//! anything a client should read, blobs larger than declared, and manifests declaring
//! more than the disk holds; a real one (Debian's docker-registry, basic and token
//! auth) takes snapshot packs pushed and pulled back. No conversion is reached, so the
//! agent is never built (`ZYGOTE_AGENT_BIN` names any file).
mod common;

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use common::fake::{Body, FakeRegistry, Reply};
use common::{or_skip, sha256_digest, Auth, Registry};
use zygote_images::space::free_bytes;
use zygote_oci::pack::{Room, Staging};
use zygote_oci::{ImportOptions, Limits, OciError, PullOptions};

/// Bodies the fake registry offers where a client should read little.
const BIG: u64 = 256 << 20;
/// What a client that stops at its cap lets the registry send: the cap (4 MiB at
/// most here) and what the two sockets buffer on loopback (tcp_rmem/wmem, tens of MiB).
const SENT_AT_MOST: u64 = 96 << 20;

/// One zygote cache for the whole test binary (the variables are process-wide).
fn cache() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        std::env::set_var("ZYGOTE_CACHE_DIR", d.path());
        std::env::set_var("ZYGOTE_AGENT_BIN", "/bin/true");
        std::env::set_var("DOCKER_CONFIG", d.path().join("no-docker-config"));
        d
    })
    .path()
}

/// The tests share one cache and one environment.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn pull(reference: &str, opts: &PullOptions) -> Result<zygote_images::ImageInfo, OciError> {
    cache();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(zygote_oci::pull(reference, opts, Arc::new(|_| {})))
}

/// Nothing of `digest` in the blob store, not even a partial download.
fn assert_not_stored(digest: &str) {
    let hex = digest.trim_start_matches("sha256:");
    let blobs = cache().join("oci/blobs/sha256");
    assert!(!blobs.join(hex).exists(), "{digest} stored");
    assert!(
        !blobs.join(format!("{hex}.partial")).exists(),
        "{digest} partly stored"
    );
}

/// A one-layer linux/amd64 image: its manifest declares the layer as `layer_size`.
struct Image {
    manifest: Vec<u8>,
    config: Vec<u8>,
    config_digest: String,
    layer_digest: String,
}

fn image(layer: &[u8], layer_size: u64) -> Image {
    let layer_digest = sha256_digest(layer);
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    })
    .to_string()
    .into_bytes();
    let config_digest = sha256_digest(&config);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer_size,
        }],
    })
    .to_string()
    .into_bytes();
    Image {
        manifest,
        config,
        config_digest,
        layer_digest,
    }
}

/// A registry serving `img` whose answer for `blob` is `blob_reply` instead.
fn serve(
    img: &Image,
    blob: String,
    blob_reply: impl Fn() -> Reply + Send + Sync + 'static,
) -> FakeRegistry {
    let (manifest, config, config_digest) = (
        img.manifest.clone(),
        img.config.clone(),
        img.config_digest.clone(),
    );
    FakeRegistry::start(move |r| {
        if r.path.ends_with("/manifests/1") {
            Reply::bytes(200, manifest.clone())
                .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        } else if r.path.ends_with(&format!("/blobs/{blob}")) {
            blob_reply()
        } else if r.path.ends_with(&format!("/blobs/{config_digest}")) {
            Reply::bytes(200, config.clone())
        } else {
            Reply::bytes(
                404,
                r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"no"}]}"#,
            )
        }
    })
}

fn endless(chunked: bool) -> Body {
    Body::Repeat {
        byte: b'{',
        len: BIG,
        chunked,
    }
}

#[test]
fn endless_manifests_tokens_and_errors_are_read_only_up_to_their_caps() {
    let _serial = serial();
    let check = |name: &str, handler: fn(&str, &common::fake::Request) -> Reply| {
        let reg = Arc::new(OnceLock::<String>::new());
        let host = reg.clone();
        let fake = FakeRegistry::start(move |r| handler(host.get().unwrap(), r));
        reg.set(fake.host()).unwrap();
        let err = pull(&format!("{}/app:1", fake.host()), &PullOptions::default()).unwrap_err();
        let sent = fake.sent();
        assert!(
            sent < SENT_AT_MOST,
            "{name}: {sent} bytes sent before the client hung up"
        );
        assert!(
            err.to_string().len() < 2048,
            "{name}: a long message: {err}"
        );
        err
    };
    // A manifest without end, and one announcing 256 MiB: refused at 4 MiB, or at once.
    let err = check("endless manifest", |_, _| Reply::new(200, endless(true)));
    assert!(
        matches!(err, OciError::TooLarge { limit, .. } if limit == 4 << 20),
        "{err}"
    );
    let err = check("announced manifest", |_, _| Reply::new(200, endless(false)));
    assert!(
        matches!(err, OciError::TooLarge { size, .. } if size == BIG),
        "{err}"
    );
    // An error without end: its first KiBs make the message.
    let err = check("endless error", |_, _| Reply::new(404, endless(true)));
    assert!(matches!(err, OciError::NotFound { .. }), "{err}");
    // A token service without end, for a token or for a refusal.
    fn challenge(host: &str, r: &common::fake::Request, token: fn() -> Reply) -> Reply {
        if r.path.starts_with("/token") {
            return token();
        }
        Reply::bytes(401, "{}").header(
            "WWW-Authenticate",
            &format!(r#"Bearer realm="http://{host}/token",service="fake""#),
        )
    }
    let err = check("endless token", |h, r| {
        challenge(h, r, || Reply::new(200, endless(true)))
    });
    assert!(matches!(err, OciError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("token service"), "{err}");
    let err = check("endless token refusal", |h, r| {
        challenge(h, r, || Reply::new(401, endless(true)))
    });
    assert!(matches!(err, OciError::Unauthorized { .. }), "{err}");
}

#[test]
fn credentials_are_not_sent_to_a_token_service_over_plain_http() {
    let _serial = serial();
    // A registry (on loopback, so plain HTTP itself) naming a token service on another
    // host over plain HTTP: the password would cross the network in the clear.
    let fake = FakeRegistry::start(|_| {
        Reply::bytes(401, "{}").header(
            "WWW-Authenticate",
            r#"Bearer realm="http://192.0.2.1/token",service="fake""#,
        )
    });
    let opts = PullOptions {
        credentials: Some(("alice".into(), "s3cret".into())),
        ..Default::default()
    };
    let err = pull(&format!("{}/app:1", fake.host()), &opts).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, OciError::Unauthorized { .. }), "{msg}");
    assert!(msg.contains("is not HTTPS"), "{msg}");
}

#[test]
fn a_config_or_layer_larger_than_declared_is_cut_off_at_its_declared_size() {
    let _serial = serial();
    let layer = b"not read".to_vec();
    let img = image(&layer, layer.len() as u64);
    // The config, sent without end.
    let fake = serve(&img, img.config_digest.clone(), || {
        Reply::new(200, endless(true))
    });
    let err = pull(&format!("{}/app:1", fake.host()), &PullOptions::default()).unwrap_err();
    assert!(
        matches!(err, OciError::TooLarge { limit, .. } if limit == img.config.len() as u64),
        "{err}"
    );
    assert!(fake.sent() < SENT_AT_MOST, "{} bytes sent", fake.sent());
    // The layer: sent without end, then announced larger than declared.
    for (chunked, how) in [(true, "sent it"), (false, "announced it")] {
        let fake = serve(&img, img.layer_digest.clone(), move || {
            Reply::new(200, endless(chunked))
        });
        let err = pull(&format!("{}/app:1", fake.host()), &PullOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, OciError::TooLarge { limit, .. } if limit == layer.len() as u64),
            "{msg}"
        );
        assert!(
            msg.contains(how) && msg.contains("its manifest declared"),
            "{msg}"
        );
        assert!(fake.sent() < SENT_AT_MOST, "{} bytes sent", fake.sent());
        assert_not_stored(&img.layer_digest);
    }
}

#[test]
fn layers_that_cannot_fit_on_the_disk_are_refused_before_any_download() {
    let _serial = serial();
    // 15 GiB declared (under the 16 GiB layer limit); 1 GiB of room beyond the reserve.
    let declared: u64 = 15 << 30;
    let img = image(b"a layer", declared);
    let fake = serve(&img, img.layer_digest.clone(), || {
        Reply::bytes(200, "short")
    });
    let free = free_bytes(cache()).unwrap();
    let mut limits = Limits::default();
    limits.unpack.reserve_bytes = free.saturating_sub(1 << 30);
    let opts = PullOptions {
        limits,
        ..Default::default()
    };
    let err = pull(&format!("{}/app:1", fake.host()), &opts).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, OciError::NoSpace { .. }), "{msg}");
    assert!(
        msg.contains("to download") && msg.contains("15360 MiB"),
        "{msg}"
    );
    assert!(
        !msg.contains(&cache().display().to_string()),
        "no host path: {msg}"
    );
    let layer_gets: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.contains(&img.layer_digest))
        .collect();
    assert!(layer_gets.is_empty(), "downloaded anyway: {layer_gets:?}");
    assert_not_stored(&img.layer_digest);
}

#[test]
fn an_archives_layers_that_cannot_fit_are_refused_before_any_copy() {
    let _serial = serial();
    cache();
    // An OCI layout whose layer is a sparse 1 GiB file: nothing on disk, 1 GiB copied.
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let layer_size: u64 = 1 << 30;
    let img = image(
        b"the layer's bytes are not checked before the copy",
        layer_size,
    );
    let put = |digest: &str, bytes: &[u8]| {
        std::fs::write(blobs.join(digest.trim_start_matches("sha256:")), bytes).unwrap()
    };
    let manifest_digest = sha256_digest(&img.manifest);
    put(&manifest_digest, &img.manifest);
    put(&img.config_digest, &img.config);
    let layer =
        std::fs::File::create(blobs.join(img.layer_digest.trim_start_matches("sha256:"))).unwrap();
    layer.set_len(layer_size).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": img.manifest.len(),
        }],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    // 256 MiB of room beyond the reserve.
    let free = free_bytes(cache()).unwrap();
    let mut opts = ImportOptions {
        name: Some("localhost/too-big:1".into()),
        ..Default::default()
    };
    opts.limits.unpack.reserve_bytes = free.saturating_sub(256 << 20);
    let err = zygote_oci::import(&layout, &opts, &|_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, OciError::NoSpace { .. }), "{msg}");
    assert!(msg.contains("to copy the archive's layers"), "{msg}");
    assert_not_stored(&img.layer_digest);
}

#[test]
fn snapshot_packs_push_and_pull_back_through_basic_and_token_auth() {
    let _serial = serial();
    cache();
    for auth in [Auth::basic("ci", "pw"), Auth::token("bob", "t0ken")] {
        let reg = or_skip!(Registry::start(auth.clone()));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&file, &data).unwrap();
        let packed = zygote_oci::pack::pack(
            br#"{"snapshot":"s1"}"#,
            &[("disk".to_string(), file)],
            &Default::default(),
            &|_| {},
        )
        .unwrap();
        let (user, password) = auth.credentials().unwrap();
        let opts = PullOptions {
            credentials: Some((user.into(), password.into())),
            ..Default::default()
        };
        let reference = format!("{}/packs/s1:1", reg.host());
        let rt = tokio::runtime::Runtime::new().unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let progress = Arc::new(move |e| sink.lock().unwrap().push(e));
        let digest = rt
            .block_on(zygote_oci::pack::push(
                &packed,
                &reference,
                &opts,
                progress.clone(),
            ))
            .unwrap_or_else(|e| panic!("{auth:?}: {e}"));
        assert_eq!(digest, packed.manifest_digest.to_string());
        // A second push finds every blob there.
        events.lock().unwrap().clear();
        rt.block_on(zygote_oci::pack::push(
            &packed,
            &reference,
            &opts,
            progress.clone(),
        ))
        .unwrap();
        let states: Vec<_> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                zygote_oci::Event::Layer { state, .. } => Some(*state),
                _ => None,
            })
            .collect();
        assert_eq!(states, vec![zygote_oci::LayerState::Cached], "{auth:?}");
        // Pulled back into a store without the file's blob: downloaded again.
        let blob = &packed.files[0].blob;
        std::fs::remove_file(blob).unwrap();
        let staging = Staging::new().unwrap();
        let back = rt
            .block_on(zygote_oci::pack::pull(
                &reference,
                &opts,
                &staging,
                Room::UNBOUNDED,
                progress,
            ))
            .unwrap_or_else(|e| panic!("{auth:?}: {e}"));
        // Staged until the pack is recorded, then moved into the shared store.
        assert!(!blob.exists(), "{auth:?}: staged, not yet shared");
        let digests: Vec<_> = back.files.iter().map(|f| f.digest.clone()).collect();
        staging
            .commit(&digests, &zygote_oci::blobs::BlobStore::open().unwrap())
            .unwrap();
        assert_eq!(back.manifest_digest, packed.manifest_digest);
        assert_eq!(back.config, packed.config);
        let disk = back.file("disk").unwrap();
        assert_eq!(disk.digest, packed.files[0].digest);
        assert!(blob.is_file(), "{auth:?}: the file's blob downloaded");
        // Without credentials: refused, saying so.
        let anonymous = rt
            .block_on(zygote_oci::pack::pull(
                &reference,
                &PullOptions::default(),
                &Staging::new().unwrap(),
                Room::UNBOUNDED,
                Arc::new(|_| {}),
            ))
            .unwrap_err();
        assert!(
            matches!(anonymous, OciError::Unauthorized { .. }),
            "{auth:?}: {anonymous}"
        );
        if matches!(auth, Auth::Token { .. }) {
            assert!(
                !reg.token_requests().is_empty(),
                "the token server was asked"
            );
        }
    }
}
