//! `zygote run` end to end: the CLI binary boots a QEMU sandbox per command.
mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn zygote_bin() -> PathBuf {
    zygote_images::cargo_build_bin("zygote-cli", "zygote", None, false, &mut common::progress)
        .expect("building the zygote CLI")
}

fn zygote_run(bin: &PathBuf, image: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .args(["run", "--image", image])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning zygote");
    if let Some(data) = stdin {
        child.stdin.take().unwrap().write_all(data).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    eprintln!(
        "zygote run {args:?}: {:?} in {:.1}s",
        out.status.code(),
        t.elapsed().as_secs_f64()
    );
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn zygote_run_minimal() {
    let bin = zygote_bin();
    common::kernel();
    let image = common::image("minimal").file_stem();

    let out = zygote_run(
        &bin,
        &image,
        &[
            "-i",
            "-e",
            "GREETING=hi",
            "--",
            "sh",
            "-c",
            "cat; echo $GREETING; echo err >&2; exit 3",
        ],
        Some(b"from stdin\n"),
    );
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from stdin\nhi\n");
    assert!(text(&out.stderr).contains("err\n"), "{}", text(&out.stderr));

    let out = zygote_run(&bin, &image, &["--", "sh", "-c", "kill -9 $$"], None);
    assert_eq!(
        out.status.code(),
        Some(137),
        "stderr: {}",
        text(&out.stderr)
    );

    let out = zygote_run(&bin, &image, &["--timeout", "1", "--", "sleep", "30"], None);
    assert_eq!(
        out.status.code(),
        Some(124),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("timed out"),
        "{}",
        text(&out.stderr)
    );

    let out = zygote_run(&bin, &image, &["no-such-command"], None);
    assert_eq!(
        out.status.code(),
        Some(127),
        "stderr: {}",
        text(&out.stderr)
    );

    let out = zygote_run(&bin, &image, &["--runtime", "kvm", "--", "true"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("use --runtime qemu"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn zygote_run_ctrl_c_tears_down() {
    let bin = zygote_bin();
    common::kernel();
    let image = common::image("minimal").file_stem();
    let mut child = Command::new(&bin)
        .args([
            "run",
            "-v",
            "--image",
            &image,
            "--",
            "sh",
            "-c",
            "echo started; sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait until the command runs in the guest, i.e. the VM is fully up.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    let workdir = std::env::temp_dir().join(format!("zygote-qemu-{pid}-0"));
    assert!(
        workdir.is_dir(),
        "{} should exist while running",
        workdir.display()
    );
    let t = Instant::now();
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(!workdir.exists(), "overlay directory left behind");
}

#[test]
fn zygote_run_python_numpy() {
    let bin = zygote_bin();
    common::kernel();
    // The first build runs debootstrap (minutes); later ones are cached.
    let image = common::image("python");
    let out = zygote_run(
        &bin,
        &image.file_stem(),
        &[
            "--mem-mib",
            "1024",
            "--",
            "python3",
            "-c",
            "import numpy; print(numpy.__version__)",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let version = text(&out.stdout);
    let version = version.trim();
    let parts: Vec<&str> = version.split('.').collect();
    assert!(
        parts.len() >= 2 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "numpy version {version:?}"
    );
}
