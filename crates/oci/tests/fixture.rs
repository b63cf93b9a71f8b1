//! Self-test of the shared fixture in `tests/common`: if these fail, fix the fixture (or the
//! tools it drives) before trusting any zygote-oci integration test.

mod common;

use common::http::http;
use common::{
    build_layout, docker_archive, layer_tar, or_skip, push, push_index, push_zstd, sample_spec,
    skopeo_inspect, Auth, Entry, Format, ImageSpec, Platform, Registry,
};
use serde_json::Value;

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn layer_tar_keeps_special_and_hostile_entries() {
    let mut entries = sample_spec().layers.concat();
    entries.push(Entry::CharDevice {
        path: "dev/null".into(),
        major: 1,
        minor: 3,
    });
    entries.push(Entry::raw_file(b"../escape", b"x"));
    entries.push(Entry::raw_file(b"/etc/x", b"y"));
    entries.push(Entry::raw_hardlink(b"evil", b"../../etc/passwd"));
    let tar = layer_tar(&entries).unwrap();
    for needle in [
        &b"../escape"[..],
        b"/etc/x",
        b"../../etc/passwd",
        b"32 SCHILY.xattr.user.zygote=yes\n",
    ] {
        assert!(
            tar.windows(needle.len()).any(|w| w == needle),
            "{} missing",
            String::from_utf8_lossy(needle)
        );
    }
    let mut archive = tar::Archive::new(&tar[..]);
    let mut seen = Vec::new();
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let link = e
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned());
        let xattr = e
            .pax_extensions()
            .unwrap()
            .and_then(|mut x| x.next())
            .map(|x| x.unwrap().key().unwrap().to_owned());
        seen.push((
            path,
            e.header().entry_type(),
            link,
            xattr,
            e.header().mode().unwrap(),
        ));
    }
    let find = |p: &str| {
        seen.iter()
            .find(|s| s.0 == p)
            .unwrap_or_else(|| panic!("{p} not in {seen:?}"))
    };
    assert!(find("app/.wh.old.txt").1.is_file());
    assert!(find("app/cache/.wh..wh..opq").1.is_file());
    assert_eq!(find("app/tool-link").2.as_deref(), Some("bin/tool"));
    assert!(find("app/tool-link").1.is_hard_link());
    assert!(find("app/current").1.is_symlink());
    assert_eq!(
        find("app/data.txt").3.as_deref(),
        Some("SCHILY.xattr.user.zygote")
    );
    assert_eq!(find("etc/secret").4, 0o600);
    assert!(find("app/fifo").1.is_fifo());
    assert!(find("dev/null").1.is_character_special());
    assert_eq!(find("../escape").1, tar::EntryType::Regular);
    assert_eq!(find("/etc/x").1, tar::EntryType::Regular);
    assert_eq!(find("evil").2.as_deref(), Some("../../etc/passwd"));
}

/// Pushes the sample image and checks manifest and config through skopeo; returns the
/// manifest digest.
fn push_sample(reg: &Registry, dir: &std::path::Path, reference: &str) -> Result<String, String> {
    let layout = build_layout(&sample_spec(), &dir.join("layout"), "v1")?;
    let digest = push(&layout, reg, reference, Format::Oci)?;
    assert_eq!(digest, layout.manifest_digest()?);
    let manifest = json(&skopeo_inspect(
        reg,
        reference,
        &["--raw"],
        reg.creds().as_deref(),
    )?);
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3, "{manifest}");
    assert!(layers
        .iter()
        .all(|l| l["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"));
    let config = json(&skopeo_inspect(
        reg,
        reference,
        &["--config", "--raw"],
        reg.creds().as_deref(),
    )?);
    assert_eq!(
        config["config"]["Env"],
        serde_json::json!(["PATH=/usr/bin:/bin", "GREETING=hello world"])
    );
    assert_eq!(config["config"]["WorkingDir"], "/app");
    assert_eq!(config["config"]["User"], "1000:1000");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/bin/tool"])
    );
    assert_eq!(
        config["config"]["Cmd"],
        serde_json::json!(["--serve", "8080"])
    );
    assert_eq!(config["architecture"], "amd64");
    Ok(digest)
}

#[test]
fn anonymous_registry_push_repush_docker_format_archive_and_corruption() {
    let reg = or_skip!(Registry::start(Auth::None));
    let dir = tempfile::tempdir().unwrap();
    let digest = or_skip!(push_sample(&reg, dir.path(), "sample/app:v1"));
    let layout = common::LayoutRef {
        path: dir.path().join("layout"),
        tag: "v1".into(),
    };

    // Same image, new tag: no blob is uploaded again.
    let (uploads, blobs) = (
        reg.count_requests("POST", "/blobs/uploads/"),
        reg.blob_count(),
    );
    assert!(
        uploads >= 4 && blobs >= 5,
        "uploads {uploads}, blobs {blobs}"
    );
    assert_eq!(
        or_skip!(push(&layout, &reg, "sample/app:again", Format::Oci)),
        digest
    );
    assert_eq!(reg.count_requests("POST", "/blobs/uploads/"), uploads);
    assert_eq!(reg.blob_count(), blobs);

    // Docker v2 schema 2 flavour of the same image.
    or_skip!(push(&layout, &reg, "sample/docker:v1", Format::Docker));
    let (media_type, body) = reg.get_manifest("sample/docker", "v1").unwrap();
    assert_eq!(media_type, Format::Docker.manifest_type());
    assert!(
        json(&String::from_utf8_lossy(&body))["layers"][0]["mediaType"]
            .as_str()
            .unwrap()
            .starts_with("application/vnd.docker.image.rootfs.diff.tar")
    );

    // docker save-style archive.
    let archive = dir.path().join("app.tar");
    or_skip!(docker_archive(&layout, &archive, "sample/app:v1"));
    let listing = std::process::Command::new("tar")
        .arg("-tf")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listing.stdout)
        .lines()
        .any(|l| l == "manifest.json"));

    // A corrupted layer is still served, under its old digest, with different bytes.
    let manifest = json(&or_skip!(skopeo_inspect(
        &reg,
        "sample/app:v1",
        &["--raw"],
        reg.creds().as_deref()
    )));
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    let before = std::fs::read(reg.blob_path(layer)).unwrap();
    reg.corrupt_blob(layer).unwrap();
    let served = reg
        .request("GET", &format!("/v2/sample/app/blobs/{layer}"), &[], &[])
        .unwrap();
    assert_eq!(served.status, 200);
    assert_eq!(served.body.len(), before.len());
    assert_ne!(common::sha256_digest(&served.body), layer);

    // A manifest with a wrong layer size is accepted by the registry as is.
    let bad = reg
        .tamper_manifest("sample/app", "v1", "bad-size", |m| {
            m["layers"][1]["size"] = 1.into()
        })
        .unwrap();
    let (_, body) = reg.get_manifest("sample/app", &bad).unwrap();
    assert_eq!(
        json(&String::from_utf8_lossy(&body))["layers"][1]["size"],
        1
    );
}

/// Auth modes: the account works, anonymous and wrong credentials are refused.
fn check_auth(auth: Auth) {
    let reg = or_skip!(Registry::start(auth));
    let dir = tempfile::tempdir().unwrap();
    or_skip!(push_sample(&reg, dir.path(), "private/app:v1"));
    let err = skopeo_inspect(&reg, "private/app:v1", &["--raw"], None).unwrap_err();
    assert!(err.contains("unauthorized"), "{err}");
    let (user, _) = reg.auth().credentials().unwrap();
    let wrong = format!("{user}:wrong");
    let err = skopeo_inspect(&reg, "private/app:v1", &["--raw"], Some(&wrong)).unwrap_err();
    assert!(err.contains("unauthorized"), "{err}");
    assert_eq!(
        reg.get_manifest("private/app", "v1")
            .map(|(t, _)| t)
            .unwrap(),
        Format::Oci.manifest_type()
    );
    if matches!(reg.auth(), Auth::Token { .. }) {
        assert!(
            reg.token_requests()
                .iter()
                .any(|r| r.contains("scope=repository")),
            "{:?}",
            reg.token_requests()
        );
    }
}

#[test]
fn basic_auth_registry() {
    check_auth(Auth::basic("alice", "s3cret"));
}

#[test]
fn token_auth_registry() {
    check_auth(Auth::token("bob", "t0ken-pass"));
}

#[test]
fn token_server_oauth2_password_grant() {
    let reg = or_skip!(Registry::start(Auth::token("bob", "t0ken-pass")));
    let realm = reg.token_realm().unwrap();
    let (port, path) = realm
        .strip_prefix("http://127.0.0.1:")
        .unwrap()
        .split_once('/')
        .unwrap();
    let form = |pw: &str| {
        format!("grant_type=password&username=bob&password={pw}&scope=repository%3Aa%2Fb%3Apull")
    };
    let ct = [(
        "Content-Type",
        "application/x-www-form-urlencoded".to_owned(),
    )];
    let post = |pw: &str| {
        http(
            port.parse().unwrap(),
            "POST",
            &format!("/{path}"),
            &ct,
            form(pw).as_bytes(),
        )
        .unwrap()
    };
    let ok = post("t0ken-pass");
    assert_eq!(ok.status, 200);
    let token = json(&String::from_utf8_lossy(&ok.body))["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let claims = common::base64_decode(token.split('.').nth(1).unwrap()).unwrap();
    let claims: Value = serde_json::from_slice(&claims).unwrap();
    assert_eq!(
        claims["access"],
        serde_json::json!([{"type": "repository", "name": "a/b", "actions": ["pull"]}])
    );
    assert_eq!(post("nope").status, 401);
}

#[test]
fn hostile_layer_survives_umoci() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ImageSpec {
        layers: vec![vec![Entry::raw_file(b"../escape", b"x")]],
        ..ImageSpec::tiny("amd64")
    };
    let layout = or_skip!(build_layout(&spec, &dir.path().join("l"), "evil"));
    let manifest: Value =
        serde_json::from_slice(&layout.blob(&layout.manifest_digest().unwrap()).unwrap()).unwrap();
    let layer = layout
        .blob(manifest["layers"][0]["digest"].as_str().unwrap())
        .unwrap();
    let mut tar = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&layer[..]), &mut tar).unwrap();
    assert!(tar.windows(9).any(|w| w == b"../escape"));
}

#[test]
fn multi_platform_index_and_arm64_only() {
    let reg = or_skip!(Registry::start(Auth::None));
    let dir = tempfile::tempdir().unwrap();
    let amd64 = or_skip!(build_layout(
        &ImageSpec::tiny("amd64"),
        &dir.path().join("l"),
        "amd64"
    ));
    let arm64 = or_skip!(build_layout(
        &ImageSpec::tiny("arm64"),
        &dir.path().join("l"),
        "arm64"
    ));
    let mut arm64_v8 = Platform::linux("arm64");
    arm64_v8.variant = Some("v8".into());
    for (reference, format) in [
        ("multi/oci:v1", Format::Oci),
        ("multi/docker:v1", Format::Docker),
    ] {
        let images = [
            (Platform::linux("amd64"), &amd64),
            (arm64_v8.clone(), &arm64),
        ];
        let digest = or_skip!(push_index(&reg, reference, &images, format));
        let index = json(&or_skip!(skopeo_inspect(
            &reg,
            reference,
            &["--raw"],
            reg.creds().as_deref()
        )));
        assert_eq!(common::sha256_digest(index.to_string().as_bytes()), digest);
        assert_eq!(index["mediaType"], format.index_type());
        let platforms: Vec<_> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["platform"].clone())
            .collect();
        assert_eq!(platforms[0]["architecture"], "amd64");
        assert_eq!(platforms[1]["architecture"], "arm64");
        assert_eq!(platforms[1]["variant"], "v8");
    }
    or_skip!(push(&arm64, &reg, "only/arm64:v1", Format::Oci));
    let config = json(&or_skip!(skopeo_inspect(
        &reg,
        "only/arm64:v1",
        &["--config", "--raw"],
        reg.creds().as_deref()
    )));
    assert_eq!(config["architecture"], "arm64");
}

#[test]
fn zstd_push() {
    let reg = or_skip!(Registry::start(Auth::None));
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ImageSpec::tiny("amd64");
    spec.layers
        .push(vec![Entry::file("zstd.txt", "compressed with zstd\n")]);
    let layout = or_skip!(build_layout(&spec, &dir.path().join("l"), "z"));
    or_skip!(push_zstd(&layout, &reg, "z/app:v1"));
}
