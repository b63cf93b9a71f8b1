//! Boots the `minimal` image once under QEMU (TCG on hosts without hardware
//! virtualization) and exercises the agent through it.
mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::Checks;
use sha2::{Digest, Sha256};
use zygote_proto::client::AgentClient;
use zygote_proto::{ExecRequest, ReidentifyRequest, Stream, UnixTime};

fn sh(client: &AgentClient, script: &str) -> String {
    let out = client
        .exec_output(ExecRequest::shell(script))
        .expect("exec");
    assert!(
        out.result.success(),
        "{script:?}: {:?}, stderr {:?}",
        out.result,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Deterministic pseudo-random bytes (xorshift64*), so a failure is reproducible.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

#[test]
fn minimal_guest() {
    let kernel = common::kernel();
    let image = common::image("minimal");
    let mut cfg = common::config(&kernel, &image);
    cfg.vcpus = 2;
    let vm = common::boot(&cfg);
    let client = vm.client().clone();
    let mut checks = Checks::new();

    checks.run("health: the agent is PID 1", || {
        let h = client.health().unwrap();
        assert!(h.pid1, "{h:?}");
        assert!(!h.dry_run, "{h:?}");
    });

    checks.run("uname -r is the pinned kernel", || {
        let release = sh(&client, "uname -r");
        assert_eq!(release.trim(), kernel.release);
        // No local version suffix: the release is the source package's version.
        assert_eq!(kernel.release, kernel.version);
        assert!(
            kernel
                .package_version
                .starts_with(&format!("{}-", kernel.version)),
            "package {} vs kernel {}",
            kernel.package_version,
            kernel.version
        );
        assert_eq!(sh(&client, "nproc").trim(), "2");
    });

    checks.run("output streams before the command ends", || {
        let handle = client
            .spawn_exec(ExecRequest::shell("echo first; sleep 3; echo second"))
            .unwrap();
        let start = Instant::now();
        let mut chunks: Vec<(Duration, String)> = Vec::new();
        let result = handle
            .wait(|_, data| chunks.push((start.elapsed(), String::from_utf8_lossy(data).into())))
            .unwrap();
        let ended = start.elapsed();
        assert!(result.success(), "{result:?}");
        let first = chunks
            .iter()
            .find(|(_, text)| text.contains("first"))
            .expect("saw 'first'");
        assert!(
            ended - first.0 >= Duration::from_secs(2),
            "'first' arrived at {:?}, exit at {ended:?}: not streamed",
            first.0
        );
        let all: String = chunks.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(all, "first\nsecond\n");
    });

    checks.run("exit codes and separate stderr", || {
        let out = client
            .exec_output(ExecRequest::shell("echo out; echo err >&2; exit 7"))
            .unwrap();
        assert_eq!(out.result.exit_code, Some(7));
        assert_eq!(out.result.signal, None);
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        let ok = client.exec_output(ExecRequest::new(["true"])).unwrap();
        assert_eq!(ok.result.exit_code, Some(0));
        let missing = client.exec_output(ExecRequest::new(["/no/such/program"]));
        assert!(missing.is_err(), "{missing:?}");
    });

    checks.run("signals: a program killing itself", || {
        let out = client
            .exec_output(ExecRequest::shell("kill -9 $$"))
            .unwrap();
        assert_eq!(out.result.signal, Some(9), "{:?}", out.result);
        assert_eq!(out.result.exit_code, None);
        // Programs must start with default signal handling: SIGTERM kills.
        let out = client
            .exec_output(ExecRequest::shell("kill -TERM $$; sleep 5"))
            .unwrap();
        assert_eq!(out.result.signal, Some(15), "{:?}", out.result);
    });

    checks.run("signals: sent by the host", || {
        let handle = client
            .spawn_exec(ExecRequest::new(["sleep", "30"]))
            .unwrap();
        let t = Instant::now();
        handle.kill(libc::SIGINT).unwrap();
        let result = handle.wait(|_, _| {}).unwrap();
        assert_eq!(result.signal, Some(libc::SIGINT), "{result:?}");
        assert!(t.elapsed() < Duration::from_secs(10));
    });

    checks.run("timeouts kill the command", || {
        let mut req = ExecRequest::new(["sleep", "30"]);
        req.timeout_ms = Some(1000);
        let t = Instant::now();
        let out = client.exec_output(req).unwrap();
        assert!(out.result.timed_out, "{:?}", out.result);
        assert_eq!(out.result.signal, Some(libc::SIGKILL));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    });

    checks.run("stdin reaches the command", || {
        let mut req = ExecRequest::shell("wc -l; echo done");
        req.stdin = Some(b"one\ntwo\nthree\n".to_vec());
        let out = client.exec_output(req).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3\ndone");
        let binary: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        let mut req = ExecRequest::new(["cat"]);
        req.stdin = Some(binary.clone());
        let out = client.exec_output(req).unwrap();
        assert!(
            out.stdout == binary,
            "cat returned {} bytes",
            out.stdout.len()
        );
        let out = client.exec_output(ExecRequest::new(["cat"])).unwrap();
        assert!(out.stdout.is_empty(), "no stdin means /dev/null");
    });

    checks.run("10 MiB file round trip, byte-exact", || {
        let data = pattern(10 << 20);
        let t = Instant::now();
        client.write_file("/root/big.bin", &data, None).unwrap();
        let wrote = t.elapsed();
        let back = client.read_file("/root/big.bin").unwrap();
        eprintln!("    write {wrote:?}, read {:?}", t.elapsed() - wrote);
        assert_eq!(back.len(), data.len());
        assert!(back == data, "content differs");
        // And the guest sees the same bytes on its disk.
        let guest_sum = sh(&client, "sync; sha256sum /root/big.bin");
        let host_sum = hex::encode(Sha256::digest(&data));
        assert_eq!(guest_sum.split_whitespace().next(), Some(host_sum.as_str()));
    });

    checks.run("two concurrent execs over the one agent channel", || {
        let second = client.clone();
        let (tx, rx) = mpsc::channel();
        let t = Instant::now();
        for (c, tag) in [(client.clone(), "A"), (second, "B")] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let out = c.exec_output(ExecRequest::shell(format!("sleep 2; echo {tag}")));
                tx.send(out.map(|o| o.stdout)).unwrap();
            });
        }
        let mut got: Vec<Vec<u8>> = (0..2).map(|_| rx.recv().unwrap().unwrap()).collect();
        got.sort();
        assert_eq!(got, vec![b"A\n".to_vec(), b"B\n".to_vec()]);
        // Serial execution would take at least 4 s.
        assert!(
            t.elapsed() < Duration::from_millis(3800),
            "{:?}",
            t.elapsed()
        );
        // Concurrent output chunks are attributed to the right exec.
        let h1 = client
            .spawn_exec(ExecRequest::shell(
                "for i in 1 2 3; do echo x$i; sleep 0.3; done",
            ))
            .unwrap();
        let h2 = client
            .spawn_exec(ExecRequest::shell(
                "for i in 1 2 3; do echo y$i >&2; sleep 0.3; done",
            ))
            .unwrap();
        let collect = |h: zygote_proto::client::ExecHandle| {
            let mut text = Vec::new();
            let mut streams = Vec::new();
            h.wait(|s, d| {
                text.extend_from_slice(d);
                streams.push(s);
            })
            .unwrap();
            (String::from_utf8(text).unwrap(), streams)
        };
        let (t2, s2) = std::thread::scope(|s| {
            let j = s.spawn(|| collect(h2));
            let (t1, s1) = collect(h1);
            assert_eq!(t1, "x1\nx2\nx3\n");
            assert!(s1.iter().all(|s| *s == Stream::Stdout));
            j.join().unwrap()
        });
        assert_eq!(t2, "y1\ny2\ny3\n");
        assert!(s2.iter().all(|s| *s == Stream::Stderr));
    });

    checks.run("reidentify: hostname, clock, credited entropy", || {
        let before = sh(&client, "hostname; date +%s");
        let mut lines = before.lines();
        let old_host = lines.next().unwrap().to_string();
        let entropy: Vec<u8> = pattern(64);
        let report = client
            .reidentify(ReidentifyRequest {
                entropy: entropy.clone(),
                hostname: Some("sandbox-42".into()),
                time: Some(UnixTime::now()),
                net: None,
                identity: None,
            })
            .unwrap();
        assert!(report.hostname_set && report.clock_set, "{report:?}");
        assert_eq!(report.entropy_bytes, 64);
        // The agent runs as root in the guest, so RNDADDENTROPY must succeed.
        assert!(report.entropy_credited, "{report:?}");
        let after = sh(&client, "hostname; cat /proc/sys/kernel/hostname; date +%s");
        let mut lines = after.lines();
        assert_eq!(lines.next(), Some("sandbox-42"));
        assert_eq!(lines.next(), Some("sandbox-42"));
        assert_ne!(old_host, "sandbox-42");
        let guest_now: i64 = lines.next().unwrap().trim().parse().unwrap();
        let host_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(
            (guest_now - host_now).abs() < 30,
            "guest {guest_now} host {host_now}"
        );
        assert_eq!(client.health().unwrap().hostname, "sandbox-42");
        // Invalid input changes nothing.
        let bad = client.reidentify(ReidentifyRequest {
            hostname: Some("not a hostname".into()),
            ..Default::default()
        });
        assert!(bad.is_err());
        assert_eq!(sh(&client, "hostname").trim(), "sandbox-42");
    });

    checks.run("network: eth0 configured by the kernel's ip=", || {
        let out = sh(
            &client,
            "cat /sys/class/net/eth0/operstate; ip -4 addr show eth0",
        );
        assert!(out.starts_with("up"), "{out}");
        assert!(out.contains("10.0.2.15/24"), "{out}");
    });

    checks.run(
        "wget -T SEC works (busybox's own crashes) and bounds the wait",
        || {
            let run = |req: ExecRequest| {
                let started = Instant::now();
                let out = client.exec_output(req).unwrap();
                (out, started.elapsed())
            };
            // Run by name through PATH (as `zygote run -- wget ...` does), refused at once:
            // wget's own error (1), not SIGSEGV (139).
            let (out, _) = run(ExecRequest::new([
                "wget",
                "-T",
                "3",
                "-O",
                "/dev/null",
                "http://127.0.0.1:1/",
            ]));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.result.exit_code, Some(1), "{:?} {stderr}", out.result);
            assert!(stderr.contains("refused"), "{stderr}");
            // A server that accepts and never answers: given up after about 2 s. In a
            // busybox shell script the wrapper is reached by its path (the shell runs its
            // own applets before searching PATH).
            let (out, took) = run(ExecRequest::shell(
                "(sleep 30 | nc -l -p 8079 >/dev/null &); sleep 1; \
             /usr/bin/wget -q -T 2 -O - http://127.0.0.1:8079/",
            ));
            // busybox's `timeout` ends the program with SIGTERM (a shell reports 143).
            let ended_by_timeout = out.result.signal == Some(libc::SIGTERM)
                || out.result.exit_code == Some(128 + libc::SIGTERM);
            assert!(ended_by_timeout, "{:?}", out.result);
            assert!(took < Duration::from_secs(20), "took {took:?}");
        },
    );

    // Teardown: QEMU gone, scratch directory gone, base image untouched.
    let pid = vm.pid().expect("QEMU pid");
    let workdir = vm.workdir().to_path_buf();
    assert!(workdir.join("overlay.qcow2").is_file());
    vm.shutdown().expect("shutdown");
    checks.run("shutdown leaves nothing behind", || {
        assert!(!workdir.exists(), "{} still exists", workdir.display());
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        let sha = zygote_images::sha256_file(&image.path).unwrap();
        assert_eq!(sha, image.sha256, "the base image was modified");
    });
    checks.finish();
}
