//! Pulling and importing real OCI images (made by umoci, pushed by skopeo to Debian's
//! docker-registry on 127.0.0.1) into ext4 images, checked with debugfs: the applied
//! tree, the run config, caching, auth, platforms, digests, limits, resuming and
//! hostile layers. Every test skips, saying why, without the tools.
mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use common::{
    build_layout, docker_archive, or_skip, push, push_index, push_zstd, sample_spec, Auth, Entry,
    Format, ImageSpec, LayoutRef, Platform, Registry,
};
use zygote_images::ImageInfo;
use zygote_oci::{Event, ImportOptions, LayerState, OciError, PullOptions};

/// One zygote cache for the whole test binary (the variable is process-wide).
fn cache() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        std::env::set_var("ZYGOTE_CACHE_DIR", d.path());
        d
    })
    .path()
}

/// Held by every test: they share one cache, and checking that a failed conversion
/// left no scratch files needs no other conversion running.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Nothing in the image store's scratch directory.
fn assert_no_scratch() {
    let scratch = cache().join("images/tmp");
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

fn pull_with(reference: &str, opts: &PullOptions) -> (Result<ImageInfo, OciError>, Vec<Event>) {
    cache();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let result = rt.block_on(zygote_oci::pull(
        reference,
        opts,
        Arc::new(move |e| sink.lock().unwrap().push(e)),
    ));
    let events = events.lock().unwrap().clone();
    (result, events)
}

fn pull(reference: &str) -> (ImageInfo, Vec<Event>) {
    let (r, events) = pull_with(reference, &PullOptions::default());
    (
        r.unwrap_or_else(|e| panic!("pull {reference}: {e}")),
        events,
    )
}

fn debugfs(image: &Path, request: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(request)
        .arg(image)
        .output()
        .expect("debugfs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cat(image: &Path, path: &str) -> String {
    debugfs(image, &format!("cat \"{path}\""))
}

fn stat(image: &Path, path: &str) -> String {
    debugfs(image, &format!("stat \"{path}\""))
}

fn inode(image: &Path, path: &str) -> String {
    let s = stat(image, path);
    s.split_whitespace()
        .skip_while(|w| *w != "Inode:")
        .nth(1)
        .unwrap_or_default()
        .to_string()
}

fn names(image: &Path, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = debugfs(image, &format!("ls -p \"{dir}\""))
        .lines()
        .filter_map(|l| l.split('/').nth(5).map(str::to_string))
        .filter(|n| !n.is_empty() && n != "." && n != "..")
        .collect();
    v.sort();
    v
}

/// The sample image's tree and config, as `sample_spec` documents them.
fn check_sample(info: &ImageInfo) {
    let img = &info.path;
    assert!(cat(img, "/etc/hostname").starts_with("zygote"));
    assert_eq!(names(img, "/app/cache"), vec!["c"]);
    assert!(!names(img, "/app").contains(&"old.txt".to_string()));
    assert_eq!(cat(img, "/app/tool-link"), "#!tool\n");
    assert_eq!(
        inode(img, "/app/tool-link"),
        inode(img, "/bin/tool"),
        "one inode"
    );
    let current = stat(img, "/app/current");
    assert!(
        current.contains("Type: symlink") && current.contains("Fast link dest: \"cache\""),
        "{current}"
    );
    let data = stat(img, "/app/data.txt");
    assert!(data.contains("user.zygote (3) = \"yes\""), "{data}");
    let app = stat(img, "/app");
    assert!(
        app.contains("User:  1000") && app.contains("Group:  1000"),
        "{app}"
    );
    assert!(stat(img, "/etc/secret").contains("Mode:  0600"));
    assert!(stat(img, "/app/fifo").contains("Type: FIFO"));
    let agent = stat(img, "/sbin/zygote-agent");
    assert!(
        agent.contains("Type: regular") && agent.contains("User:     0"),
        "{agent}"
    );
    let oci = info.oci.as_ref().expect("an OCI origin");
    assert_eq!(oci.platform, "linux/amd64");
    assert_eq!(oci.layers.len(), 3);
    let run = &oci.config;
    assert_eq!(run.env, vec!["PATH=/usr/bin:/bin", "GREETING=hello world"]);
    assert_eq!(run.working_dir.as_deref(), Some("/app"));
    assert_eq!((run.uid, run.gid), (Some(1000), Some(1000)));
    assert_eq!(run.entrypoint, vec!["/bin/tool"]);
}

fn tools() -> Result<(), String> {
    common::require_tools(&["docker-registry", "skopeo", "umoci", "debugfs", "mkfs.ext4"])
}

fn layout(spec: &ImageSpec, tag: &str) -> (tempfile::TempDir, LayoutRef) {
    let dir = tempfile::tempdir().unwrap();
    let l = build_layout(spec, &dir.path().join("layout"), tag).expect("building the layout");
    (dir, l)
}

#[test]
fn pulls_convert_the_tree_and_config_and_hit_the_cache() {
    let _serial = serial();
    or_skip!(tools());
    let reg = or_skip!(Registry::start(Auth::None));
    let (_d, l) = layout(&sample_spec(), "v1");
    let pushed = push(&l, &reg, "team/sample:v1", Format::Oci).unwrap();
    let reference = format!("{}/team/sample:v1", reg.host());
    let (info, events) = pull(&reference);
    assert_eq!(info.name, reference);
    assert_eq!(info.oci.as_ref().unwrap().manifest_digest, pushed);
    check_sample(&info);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Resolved { layers: 3, .. })));
    // Every layer ends downloaded, or found in the blob store (another test's pull).
    let mut ended: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            Event::Layer {
                index,
                state: LayerState::Done | LayerState::Cached,
                ..
            } => Some(*index),
            _ => None,
        })
        .collect();
    ended.sort();
    assert_eq!(ended, vec![0, 1, 2], "{events:?}");

    // Again: resolved against the registry, nothing downloaded or converted.
    let blobs_before = reg.count_requests("GET", "/blobs/");
    let (again, events) = pull(&reference);
    assert_eq!(again.sha256, info.sha256);
    assert_eq!(
        reg.count_requests("GET", "/blobs/"),
        blobs_before,
        "no blob fetched"
    );
    assert!(!events.iter().any(|e| matches!(e, Event::Layer { .. })));
    // Found by name afterwards, and by its short forms.
    let found = zygote_oci::find_local(&reference).unwrap().unwrap();
    assert_eq!(found.sha256, info.sha256);

    // The same image with Docker media types: same layers, already in the blob store.
    let docker = push(&l, &reg, "team/sample-docker:v1", Format::Docker).unwrap();
    let (info2, events) = pull(&format!("{}/team/sample-docker:v1", reg.host()));
    assert_eq!(info2.oci.as_ref().unwrap().manifest_digest, docker);
    check_sample(&info2);
    assert!(events
        .iter()
        .filter(|e| matches!(e, Event::Layer { .. }))
        .all(|e| matches!(
            e,
            Event::Layer {
                state: LayerState::Cached,
                ..
            }
        )));

    // By digest.
    let (by_digest, _) = pull(&format!("{}/team/sample@{pushed}", reg.host()));
    assert_eq!(by_digest.oci.unwrap().manifest_digest, pushed);
}

#[test]
fn rootless_conversion_sets_owners_with_debugfs() {
    let _serial = serial();
    or_skip!(tools());
    let reg = or_skip!(Registry::start(Auth::None));
    let (_d, l) = layout(&sample_spec(), "v1");
    push(&l, &reg, "rootless/sample:v1", Format::Oci).unwrap();
    let mut opts = PullOptions::default();
    opts.convert.rootless = true;
    let (info, _) = pull_with(&format!("{}/rootless/sample:v1", reg.host()), &opts);
    check_sample(&info.unwrap());
}

#[test]
fn platforms_missing_images_and_unreachable_registries() {
    let _serial = serial();
    or_skip!(tools());
    let reg = or_skip!(Registry::start(Auth::None));
    let (_a, amd) = layout(&ImageSpec::tiny("amd64"), "amd");
    let (_b, arm) = layout(&ImageSpec::tiny("arm64"), "arm");
    let arm64 = Platform {
        variant: Some("v8".into()),
        ..Platform::linux("arm64")
    };
    for format in [Format::Oci, Format::Docker] {
        let repo = format!("multi/{format:?}").to_lowercase();
        push_index(
            &reg,
            &format!("{repo}:latest"),
            &[(arm64.clone(), &arm), (Platform::linux("amd64"), &amd)],
            format,
        )
        .unwrap();
        let (info, _) = pull(&format!("{}/{repo}:latest", reg.host()));
        assert_eq!(cat(&info.path, "/etc/arch"), "amd64\n", "{format:?}");
    }
    push_index(&reg, "armonly/img:1", &[(arm64.clone(), &arm)], Format::Oci).unwrap();
    let (r, _) = pull_with(
        &format!("{}/armonly/img:1", reg.host()),
        &PullOptions::default(),
    );
    let err = r.unwrap_err();
    assert!(matches!(err, OciError::NoPlatform { .. }), "{err}");
    assert!(err.to_string().contains("linux/arm64/v8"), "{err}");
    // A single-platform arm64 image (no index): refused by its config.
    push(&arm, &reg, "armonly/single:1", Format::Oci).unwrap();
    let (r, _) = pull_with(
        &format!("{}/armonly/single:1", reg.host()),
        &PullOptions::default(),
    );
    assert!(matches!(r, Err(OciError::NoPlatform { .. })), "{r:?}");

    let (r, _) = pull_with(
        &format!("{}/nope/nothing:1", reg.host()),
        &PullOptions::default(),
    );
    assert!(matches!(r, Err(OciError::NotFound { .. })), "{r:?}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (r, _) = pull_with(&format!("{closed}/x/y:1"), &PullOptions::default());
    let err = r.unwrap_err().to_string();
    assert!(err.contains(&closed.to_string()), "{err}");
    let (r, _) = pull_with("not a reference", &PullOptions::default());
    assert!(matches!(r, Err(OciError::BadReference(_))), "{r:?}");
    for name in ["multi/oci:latest", "armonly/img:1", "armonly/single:1"] {
        let full = format!("{}/{name}", reg.host());
        let known = zygote_oci::find_local(&full).unwrap().is_some();
        assert_eq!(known, name.starts_with("multi"), "{name}");
    }
}

#[test]
fn registries_with_basic_and_token_auth() {
    let _serial = serial();
    or_skip!(tools());
    for auth in [Auth::basic("alice", "s3cret"), Auth::token("bob", "t0ken")] {
        let reg = or_skip!(Registry::start(auth.clone()));
        let (_d, l) = layout(&ImageSpec::tiny("amd64"), "t");
        push(&l, &reg, "private/img:1", Format::Oci).unwrap();
        let reference = format!("{}/private/img:1", reg.host());
        let empty = tempfile::tempdir().unwrap();
        std::env::set_var("DOCKER_CONFIG", empty.path());
        let (r, _) = pull_with(&reference, &PullOptions::default());
        let err = r.unwrap_err();
        assert!(
            matches!(err, OciError::Unauthorized { .. }),
            "{auth:?}: {err}"
        );
        assert!(
            err.to_string().contains("no credentials were found"),
            "{err}"
        );
        let wrong = PullOptions {
            credentials: Some(("alice".into(), "wrong".into())),
            ..Default::default()
        };
        let (r, _) = pull_with(&reference, &wrong);
        assert!(
            matches!(r, Err(OciError::Unauthorized { .. })),
            "{auth:?}: {r:?}"
        );

        let (user, password) = auth.credentials().unwrap();
        let given = PullOptions {
            credentials: Some((user.into(), password.into())),
            ..Default::default()
        };
        let (r, _) = pull_with(&reference, &given);
        assert_eq!(cat(&r.unwrap().path, "/etc/arch"), "amd64\n");
        // From the docker config, as `docker login` writes it.
        let token = common::base64(format!("{user}:{password}").as_bytes());
        let config = serde_json::json!({"auths": {reg.host(): {"auth": token}}});
        std::fs::write(empty.path().join("config.json"), config.to_string()).unwrap();
        let (r, _) = pull_with(&reference, &PullOptions::default());
        assert!(r.is_ok(), "{auth:?}: {r:?}");
        if matches!(auth, Auth::Token { .. }) {
            assert!(
                !reg.token_requests().is_empty(),
                "the token server was asked"
            );
        }
    }
    std::env::remove_var("DOCKER_CONFIG");
}

#[test]
fn digests_sizes_and_limits_are_enforced_and_nothing_is_left() {
    let _serial = serial();
    or_skip!(tools());
    let reg = or_skip!(Registry::start(Auth::None));
    let (_d, l) = layout(&sample_spec(), "v1");
    let digest = push(&l, &reg, "bad/corrupt:1", Format::Oci).unwrap();
    let (_, manifest) = reg.get_manifest("bad/corrupt", &digest).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let layer = manifest["layers"][1]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    reg.corrupt_blob(&layer).unwrap();
    let reference = format!("{}/bad/corrupt:1", reg.host());
    let (r, _) = pull_with(&reference, &PullOptions::default());
    let err = r.unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    assert!(zygote_oci::find_local(&reference).unwrap().is_none());
    let blobs = cache().join("oci/blobs/sha256");
    let hex = layer.trim_start_matches("sha256:");
    assert!(!blobs.join(hex).exists() && !blobs.join(format!("{hex}.partial")).exists());

    // A layer over the limit is refused before it is downloaded.
    let (_e, big) = layout(&ImageSpec::tiny("amd64"), "big");
    let big_digest = push(&big, &reg, "bad/big:1", Format::Oci).unwrap();
    let small = PullOptions {
        limits: zygote_oci::Limits {
            max_layer_bytes: 10,
            ..Default::default()
        },
        ..Default::default()
    };
    let gets = reg.count_requests("GET", "/blobs/");
    let (r, _) = pull_with(&format!("{}/bad/big:1", reg.host()), &small);
    assert!(
        matches!(r, Err(OciError::TooLarge { limit: 10, .. })),
        "{r:?}"
    );
    assert!(
        reg.count_requests("GET", "/blobs/") <= gets + 1,
        "only the config"
    );

    // A manifest that lies about a layer's size: no more than it said is read.
    let liar = reg
        .tamper_manifest("bad/big", &big_digest, "liar", |m| {
            m["layers"][0]["size"] = serde_json::json!(5);
        })
        .unwrap();
    let (r, _) = pull_with(
        &format!("{}/bad/big@{liar}", reg.host()),
        &PullOptions::default(),
    );
    assert!(
        matches!(r, Err(OciError::TooLarge { limit: 5, .. })),
        "{r:?}"
    );
    assert_no_scratch();
}

#[test]
fn an_interrupted_download_resumes() {
    let _serial = serial();
    or_skip!(tools());
    let reg = or_skip!(Registry::start(Auth::None));
    let mut spec = ImageSpec::tiny("amd64");
    // Incompressible, so the layer blob is large enough to cut.
    let noise: Vec<u8> = (0..600_000u64)
        .map(|i| (i * 2654435761 % 251) as u8)
        .collect();
    spec.layers[0].push(Entry::file("noise", noise));
    let (_d, l) = layout(&spec, "r");
    let digest = push(&l, &reg, "resume/img:1", Format::Oci).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&reg.get_manifest("resume/img", &digest).unwrap().1).unwrap();
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = l.blob(&layer).unwrap();
    // What a killed pull leaves: the first part of the blob.
    let blobs = cache().join("oci/blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let half = bytes.len() / 2;
    let partial = blobs.join(format!("{}.partial", layer.trim_start_matches("sha256:")));
    std::fs::write(&partial, &bytes[..half]).unwrap();
    let (info, events) = pull(&format!("{}/resume/img:1", reg.host()));
    assert!(
        events.iter().any(|e| matches!(e, Event::Layer { state: LayerState::Resuming, done, .. } if *done == half as u64)),
        "{events:?}"
    );
    assert_eq!(cat(&info.path, "/etc/arch"), "amd64\n");
    assert!(!partial.exists());
}

#[test]
fn zstd_layers_pull() {
    let _serial = serial();
    or_skip!(tools());
    let reg = or_skip!(Registry::start(Auth::None));
    let (_d, l) = layout(&sample_spec(), "z");
    or_skip!(push_zstd(&l, &reg, "zstd/sample:1"));
    let (info, _) = pull(&format!("{}/zstd/sample:1", reg.host()));
    check_sample(&info);
}

#[test]
fn hostile_layers_are_refused_or_contained() {
    let _serial = serial();
    or_skip!(tools());
    let reg = or_skip!(Registry::start(Auth::None));
    let mut escape = ImageSpec::tiny("amd64");
    escape
        .layers
        .push(vec![Entry::raw_file(b"../escape", b"x")]);
    let (_d, l) = layout(&escape, "e");
    push(&l, &reg, "evil/escape:1", Format::Oci).unwrap();
    let reference = format!("{}/evil/escape:1", reg.host());
    let (r, _) = pull_with(&reference, &PullOptions::default());
    let err = r.unwrap_err();
    assert!(matches!(err, OciError::BadLayer { layer: 1, .. }), "{err}");
    assert!(err.to_string().contains("`..`"), "{err}");
    assert!(zygote_oci::find_local(&reference).unwrap().is_none());
    assert_no_scratch();

    // Through an absolute symlink: lands inside the image, never on the host.
    let mut through = ImageSpec::tiny("amd64");
    through.layers.push(vec![
        Entry::symlink("hostetc", "/etc"),
        Entry::symlink("up", "../../../../.."),
    ]);
    through.layers.push(vec![
        Entry::file("hostetc/zygote-oci-test-owned", "x"),
        Entry::file("up/zygote-oci-test-escaped", "y"),
    ]);
    let (_e, l) = layout(&through, "t");
    push(&l, &reg, "evil/through:1", Format::Oci).unwrap();
    let (info, _) = pull(&format!("{}/evil/through:1", reg.host()));
    assert!(!Path::new("/etc/zygote-oci-test-owned").exists());
    assert_eq!(cat(&info.path, "/etc/zygote-oci-test-owned"), "x");
    assert_eq!(cat(&info.path, "/zygote-oci-test-escaped"), "y");

    // A whiteout of `..` at the root names the scratch directory, which holds other
    // builds' and pulls' work: refused, and that work stays.
    let other = cache().join("images/tmp/other-build");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("keep"), b"k").unwrap();
    let mut dotdot = ImageSpec::tiny("amd64");
    dotdot.layers.push(vec![Entry::raw_file(b".wh...", b"")]);
    let (_w, l) = layout(&dotdot, "w");
    push(&l, &reg, "evil/dotdot:1", Format::Oci).unwrap();
    let (r, _) = pull_with(
        &format!("{}/evil/dotdot:1", reg.host()),
        &Default::default(),
    );
    let err = r.unwrap_err();
    assert!(matches!(err, OciError::BadLayer { layer: 1, .. }), "{err}");
    assert!(other.join("keep").exists(), "{err}");
    std::fs::remove_dir_all(&other).unwrap();

    // Zeros that gzip 1000:1: stopped at the limit, which the error names.
    let mut zeros = ImageSpec::tiny("amd64");
    zeros
        .layers
        .push(vec![Entry::file("zeros", vec![0u8; 32 << 20])]);
    let (_z, l) = layout(&zeros, "z");
    push(&l, &reg, "evil/zeros:1", Format::Oci).unwrap();
    let mut limits = zygote_oci::Limits::default();
    limits.unpack.max_stream_bytes = 8 << 20;
    let opts = PullOptions {
        limits,
        ..Default::default()
    };
    let (r, _) = pull_with(&format!("{}/evil/zeros:1", reg.host()), &opts);
    let err = r.unwrap_err();
    assert!(
        matches!(err, OciError::TooLarge { limit, .. } if limit == 8 << 20),
        "{err}"
    );
    assert!(err.to_string().contains("stream limit"), "{err}");
    assert_no_scratch();
}

#[test]
fn layouts_and_docker_archives_import() {
    let _serial = serial();
    or_skip!(tools());
    cache();
    let (d, l) = layout(&sample_spec(), "v1");
    let quiet = |_e: Event| {};
    // The layout directory (one tag: no choice needed).
    let info = zygote_oci::import(&l.path, &ImportOptions::default(), &quiet).unwrap();
    assert_eq!(info.name, "localhost/layout:v1");
    assert_eq!(
        info.oci.as_ref().unwrap().manifest_digest,
        l.manifest_digest().unwrap()
    );
    check_sample(&info);
    // A docker save archive, named by its RepoTags.
    let archive = d.path().join("saved.tar");
    docker_archive(&l, &archive, "saved/app:2").unwrap();
    let info = zygote_oci::import(&archive, &ImportOptions::default(), &quiet).unwrap();
    assert_eq!(info.name, "docker.io/saved/app:2");
    check_sample(&info);
    // A tar of the layout, named on import.
    let tarball = d.path().join("layout.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&l.path)
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let named = ImportOptions {
        name: Some("mine/app:3".into()),
        ..Default::default()
    };
    let info = zygote_oci::import(&tarball, &named, &quiet).unwrap();
    assert_eq!(info.name, "mine/app:3");
    assert!(zygote_oci::find_local("mine/app:3").unwrap().is_some());
    // A layout with two tags needs one named; a wrong one says what there is.
    build_layout(&ImageSpec::tiny("amd64"), &l.path, "v2").unwrap();
    let err = zygote_oci::import(&l.path, &ImportOptions::default(), &quiet).unwrap_err();
    assert!(err.to_string().contains("choose one by tag"), "{err}");
    let v3 = ImportOptions {
        tag: Some("v3".into()),
        ..Default::default()
    };
    let err = zygote_oci::import(&l.path, &v3, &quiet)
        .unwrap_err()
        .to_string();
    assert!(err.contains("v1") && err.contains("v2"), "{err}");
    // Not an image at all.
    let err = zygote_oci::import(d.path(), &ImportOptions::default(), &quiet).unwrap_err();
    assert!(matches!(err, OciError::BadArchive { .. }), "{err}");
}
