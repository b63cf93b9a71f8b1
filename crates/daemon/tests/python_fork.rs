//! A long-running Python process in the python image diverges after a branch when it
//! imports `zygote_guest`: the children of one parent draw different `random` numbers
//! (without it they repeat the parent's sequence: same seed state in every copy).
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::json;
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, ExecResponse, SandboxList};

use common::{eventually, start_daemon, step, Cleanup};

/// Seeded identically in every copy; appends "ITERATION GENERATION DRAW PLAIN" every
/// 20 ms, DRAW from `random` (reseeded by the helper), PLAIN from a generator nobody
/// reseeds: the control that shows the children would repeat each other without it.
const WRITER: &str = r#"
import random, time
plain = random.Random(42)
random.seed(42)
import zygote_guest
n = 0
while True:
    # Generation first: a line of the new generation is always drawn after the
    # reseed (check() sees at least that generation).
    g = zygote_guest.generation()
    zygote_guest.check()
    with open("/tmp/draws", "a") as f:
        f.write(f"{n} {g} {random.random()!r} {plain.random()!r}\n")
    n += 1
    time.sleep(0.02)
"#;

/// Children of one branch.
const CHILDREN: usize = 8;

async fn exec(c: &Client, id: &str, script: &str) -> ExecResponse {
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", script], "timeout_ms": 60000})),
    )
    .await
    .unwrap_or_else(|e| panic!("exec {script:?} in {id}: {e}"))
}

/// Iteration -> (generation, draw, plain draw), as the writer logged them.
async fn draws(c: &Client, id: &str) -> BTreeMap<u64, (u64, String, String)> {
    let out = exec(c, id, "cat /tmp/draws 2>/dev/null").await.stdout;
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let n = it.next()?.parse().ok()?;
            let g = it.next()?.parse().ok()?;
            Some((n, (g, it.next()?.to_string(), it.next()?.to_string())))
        })
        .collect()
}

/// `id`'s log once it reaches iteration `at`.
async fn log_through(c: &Client, id: &str, at: u64) -> BTreeMap<u64, (u64, String, String)> {
    eventually(Duration::from_secs(30), async || {
        let d = draws(c, id).await;
        d.contains_key(&at).then_some(d)
    })
    .await
    .unwrap_or_else(|| panic!("{id}: no iteration {at}"))
}

/// The first iteration `id`'s writer logged in `generation`, once it has.
async fn first_in(c: &Client, id: &str, generation: u64) -> u64 {
    eventually(Duration::from_secs(30), async || {
        let d = draws(c, id).await;
        d.iter()
            .find(|(_, (g, ..))| *g == generation)
            .map(|(n, _)| *n)
    })
    .await
    .unwrap_or_else(|| panic!("{id}: the writer logged nothing in generation {generation}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_processes_reseed_after_a_branch() {
    let t0 = Instant::now();
    zygote_images::build_kernel(&mut |l| eprintln!("    {l}")).expect("guest kernel");
    // The first build runs debootstrap (minutes); later ones are cached.
    zygote_images::build_image("python", &mut |l| eprintln!("    {l}")).expect("python image");
    step(t0, "kernel and python image ready");
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let _cleanup = Cleanup {
        state: state.clone(),
        cgroups: Default::default(),
    };
    let d = start_daemon(&state, &["--listen", "127.0.0.1:0", "--runtime", "qemu"]);
    let c = d.client();
    let made: SandboxList = c
        .json(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": "python", "mem_mib": 256})),
        )
        .await
        .expect("create");
    let parent = made.sandboxes[0].id.clone();
    c.raw(
        Method::PUT,
        &format!("/v1/sandboxes/{parent}/files?path=/root/writer.py"),
        Some((bytes::Bytes::from(WRITER), "application/octet-stream")),
    )
    .await
    .expect("write the writer");
    let started = exec(
        &c,
        &parent,
        "setsid python3 /root/writer.py </dev/null >/tmp/writer.log 2>&1 & echo started",
    )
    .await;
    assert_eq!(started.stdout.trim(), "started", "{started:?}");
    let parent_generation = eventually(Duration::from_secs(30), async || {
        draws(&c, &parent).await.values().next().map(|(g, ..)| *g)
    })
    .await
    .expect("the writer runs in the parent");
    step(
        t0,
        &format!("writer running in {parent}, generation {parent_generation}"),
    );

    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some(&json!({"count": CHILDREN})),
        )
        .await
        .expect("branch");
    step(t0, &format!("branched into {:?}", br.children));
    assert_eq!(br.children.len(), CHILDREN);
    // Kernel randomness: the first bytes read in each child right after the branch
    // differ from every sibling's and from the parent's (/dev/urandom and getrandom()).
    let first_bytes = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; \
                       python3 -c 'import os; print(os.getrandom(16).hex())'";
    let mut seen: Vec<(String, String)> = Vec::new();
    for id in br.children.iter().chain([&parent]) {
        let out = exec(&c, id, first_bytes).await.stdout;
        let mut lines = out.lines().map(str::to_string);
        let pair = (
            lines.next().unwrap_or_default(),
            lines.next().unwrap_or_default(),
        );
        assert!(pair.0.len() == 32 && pair.1.len() == 32, "{id}: {out:?}");
        for (u, g) in &seen {
            assert!(
                u != &pair.0 && g != &pair.1,
                "{id} repeats another sandbox's bytes: {seen:?}"
            );
        }
        seen.push(pair);
    }
    step(
        t0,
        &format!("/dev/urandom and getrandom() differ in all {CHILDREN} children and the parent"),
    );
    let generation = parent_generation + 1;
    // Both children continue from the same iteration; from the later of their first
    // iterations in the new generation on, both have reseeded.
    let mut from = 0;
    for child in &br.children {
        from = from.max(first_in(&c, child, generation).await);
    }
    let at = from + 2;
    let (a, b) = (
        log_through(&c, &br.children[0], at).await,
        log_through(&c, &br.children[1], at).await,
    );
    let mut rest = Vec::new();
    for child in &br.children[2..] {
        rest.push(log_through(&c, child, at).await);
    }
    for n in from..=at {
        let (x, y) = (&a[&n], &b[&n]);
        assert_eq!((x.0, y.0), (generation, generation), "iteration {n}");
        assert_eq!(x.2, y.2, "iteration {n}: the unreseeded control differs");
        assert_ne!(
            x.1, y.1,
            "iteration {n}: both children drew {} after the branch",
            x.1
        );
    }
    // And every child's draw at `at` is its own.
    let mut at_draws: Vec<&str> = [&a, &b]
        .into_iter()
        .chain(&rest)
        .map(|log| log[&at].1.as_str())
        .collect();
    at_draws.sort_unstable();
    at_draws.dedup();
    assert_eq!(
        at_draws.len(),
        CHILDREN,
        "children repeat each other's draws at {at}"
    );
    step(
        t0,
        &format!(
            "iterations {from}..={at}: children drew {} vs {}; the unreseeded control {} in both",
            a[&at].1, b[&at].1, a[&at].2
        ),
    );
    for id in br.children.iter().chain([&parent]) {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .expect("delete");
    }
}
