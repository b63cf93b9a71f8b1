//! `zygote image pull|import|ls|rm` through the real binary, against Debian's
//! docker-registry on 127.0.0.1: a pull killed with SIGKILL mid-download registers
//! nothing and the next pull resumes the layer where it stopped (a throttling proxy
//! in front of the registry makes "mid-download" reliable); a docker archive imports;
//! rm drops the image and the layers only it used. Skips, saying why, without the tools.
#[path = "../../oci/tests/common/mod.rs"]
mod oci_fixture;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oci_fixture::{build_layout, docker_archive, push, Auth, Entry, Format, ImageSpec, Registry};

/// Forwards connections to `upstream`, counting the bytes that come back, and slowly
/// while `slow` is set (so a test can stop a download half-way).
struct Proxy {
    port: u16,
    down: Arc<AtomicU64>,
    slow: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(AtomicU64::new(0));
        let slow = Arc::new(AtomicBool::new(true));
        let (d, s) = (down.clone(), slow.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                });
                let (mut s_in, mut c_out, d, s) = (server, client, d.clone(), s.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 << 10];
                    while let Ok(n) = s_in.read(&mut buf) {
                        if n == 0 || c_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        d.fetch_add(n as u64, Ordering::SeqCst);
                        if s.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Proxy { port, down, slow }
    }
}

fn zygote(cache: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zygote"));
    cmd.env("ZYGOTE_CACHE_DIR", cache).stdin(Stdio::null());
    cmd
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("running zygote");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn listed(cache: &Path) -> Vec<serde_json::Value> {
    let out = run(zygote(cache).args(["image", "ls", "--json"]));
    serde_json::from_slice(&out.stdout).expect("image ls --json")
}

fn partials(cache: &Path) -> usize {
    std::fs::read_dir(cache.join("oci/blobs/sha256"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_killed_pull_registers_nothing_and_the_next_resumes() {
    if let Err(why) =
        oci_fixture::require_tools(&["docker-registry", "skopeo", "umoci", "mkfs.ext4"])
    {
        eprintln!("skipping: {why}");
        return;
    }
    let reg = Registry::start(Auth::None).expect("a registry");
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = ImageSpec::tiny("amd64");
    // 16 MiB that gzip cannot shrink: a layer big enough to stop half-way.
    let mut noise = vec![0u8; 16 << 20];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    spec.layers.push(vec![Entry::file("noise", noise)]);
    let layout = build_layout(&spec, &tmp.path().join("layout"), "v1").unwrap();
    push(&layout, &reg, "big/img:v1", Format::Oci).unwrap();
    let proxy = Proxy::start(reg.host());
    let reference = format!("127.0.0.1:{}/big/img:v1", proxy.port);
    let cache = tmp.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();

    let mut pull = zygote(&cache)
        .args(["image", "pull", &reference])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while proxy.down.load(Ordering::SeqCst) < 4 << 20 {
        assert!(
            Instant::now() < deadline,
            "the pull did not start downloading"
        );
        assert!(
            pull.try_wait().unwrap().is_none(),
            "the pull ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    pull.kill().unwrap(); // SIGKILL
    pull.wait().unwrap();
    assert!(listed(&cache).is_empty(), "a killed pull registers nothing");
    assert_eq!(
        partials(&cache),
        1,
        "the interrupted layer is kept to resume"
    );

    proxy.slow.store(false, Ordering::SeqCst);
    let before = proxy.down.load(Ordering::SeqCst);
    let out = run(zygote(&cache).args(["image", "pull", &reference]));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("resuming after"), "{log}");
    let fetched = proxy.down.load(Ordering::SeqCst) - before;
    assert!(
        fetched < 15 << 20,
        "the second pull fetched {fetched} bytes: no resume"
    );
    assert_eq!(partials(&cache), 0);
    let images = listed(&cache);
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["name"], reference);
    let table = run(zygote(&cache).args(["image", "ls"]));
    assert!(String::from_utf8_lossy(&table.stdout).contains("SOURCE"));

    // A docker save archive of the same image (its layers uncompressed: other blobs).
    let archive = tmp.path().join("saved.tar");
    docker_archive(&layout, &archive, "saved/img:v1").unwrap();
    run(zygote(&cache).args(["image", "import"]).arg(&archive));
    assert_eq!(listed(&cache).len(), 2);

    // rm: the image goes; layers the other image uses stay, the rest go.
    let blobs = || {
        std::fs::read_dir(cache.join("oci/blobs/sha256"))
            .unwrap()
            .count()
    };
    let before = blobs();
    run(zygote(&cache).args(["image", "rm", &reference]));
    assert_eq!(listed(&cache).len(), 1);
    let after_rm = blobs();
    assert!(
        after_rm < before,
        "the pulled image's own (compressed) layers went: {before} -> {after_rm}"
    );
    run(zygote(&cache).args(["image", "rm", "docker.io/saved/img:v1"]));
    assert!(listed(&cache).is_empty());
    assert_eq!(blobs(), 0);
}
