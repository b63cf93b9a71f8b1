//! `zygote bench api-fanout`: the largest branch the host holds, through the daemon's
//! streaming endpoint (issue 17), timed as a client sees it. A private daemon runs a
//! parent sandbox and a second, idle one; per round the parent is branched into N
//! children with `"stream": true` (N: `--count`, else as many as the daemon says fit,
//! at most 256), and the bench records when the branch point, the first child and the
//! last child were reported, and each child's time to ready. Meanwhile a probe thread
//! asks `GET /v1/sandboxes/{other}` and `GET /healthz` every `--probe-ms`: the daemon's
//! responsiveness during a fan-out, against the same probe while nothing happens (the
//! probe is a process on the same host, so its own scheduling is in the figures too).
//! The children are deleted after each round. Medians and p90; the last line printed is
//! one JSON object.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::json;
use zygote_api::client::{block_on, Client, Method};
use zygote_api::model::{BranchEvent, Sandbox, SandboxList};
use zygote_api::ErrorBody;

use super::stats::{ms, Summary};
use crate::commands::private_daemon::{PrivateDaemon, StateDir};

#[derive(clap::Args)]
pub struct ApiFanoutBenchArgs {
    /// Children per branch (default: as many as the daemon says the host holds, at most
    /// 256, the API's limit).
    #[arg(long)]
    count: Option<u32>,
    /// Rounds (one branch of --count children each).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Guest memory of the parent (and so of each child) in MiB.
    #[arg(long, default_value_t = 128)]
    mem_mib: u32,
    /// Runtime of the private daemon: kvm (zygote's VMM) or qemu.
    #[arg(long, default_value = "qemu")]
    runtime: String,
    /// Interval of the responsiveness probe (GET of another sandbox), in ms.
    #[arg(long, default_value_t = 50)]
    probe_ms: u64,
    /// Print only the JSON summary.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ApiFanoutBench {
    runtime: String,
    mem_mib: u32,
    rounds: usize,
    /// Children asked for in each round (after the daemon's capacity answer).
    counts: Vec<u32>,
    /// How many children the daemon said fit when asked for 256 (None: all did).
    fit: Option<u32>,
    /// Children that did not come up, rounds that failed, deletions that failed (each
    /// in `errors`).
    failures: usize,
    /// Request -> the `point` line (the parent's pause over, the children recorded).
    point_ms: Summary,
    /// Request -> the first `child` line.
    first_child_ms: Summary,
    /// Request -> the last `child` line (every child running).
    all_ready_ms: Summary,
    /// Request -> each child's `child` line, over every child of every round.
    child_ready_ms: Summary,
    /// The parent's pause as the runtime reports it.
    pause_ms: Summary,
    /// `GET /v1/sandboxes/{other}` latency while no branch runs.
    probe_idle_ms: Summary,
    /// The same probe while a branch streams.
    probe_during_ms: Summary,
    /// `GET /healthz` (no database read) while no branch runs.
    health_idle_ms: Summary,
    /// The same while a branch streams.
    health_during_ms: Summary,
    errors: Vec<String>,
}

/// One streamed branch as the client saw it.
#[derive(Default)]
struct Round {
    point: Option<Duration>,
    ready: Vec<Duration>,
    /// Children that did not come up, with the cause.
    failed: Vec<String>,
    pause_ms: Option<f64>,
    children: Vec<String>,
}

enum Answer {
    Streamed(Round),
    /// 422 insufficient_memory: how many fit.
    TooMany(u32),
}

/// `POST .../branch` with `"stream": true`, each line timed on arrival.
async fn branch_streamed(c: &Client, parent: &str, count: u32) -> anyhow::Result<Answer> {
    let body = serde_json::to_vec(&json!({"count": count, "stream": true}))?;
    let t0 = Instant::now();
    let resp = c
        .send(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some((body.into(), "application/json")),
        )
        .await?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body.collect().await?.to_bytes();
        let err: ErrorBody = serde_json::from_slice(&bytes)
            .with_context(|| format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)))?;
        if let Some(fit) = err.error.fit {
            return Ok(Answer::TooMany(fit));
        }
        anyhow::bail!("HTTP {status}: {} ({})", err.error.message, err.error.code);
    }
    let mut round = Round::default();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            buf.extend_from_slice(data);
        }
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let at = t0.elapsed();
            match serde_json::from_slice(&line[..nl])? {
                BranchEvent::Point { pause_ms, .. } => {
                    round.point = Some(at);
                    round.pause_ms = pause_ms;
                }
                BranchEvent::Child { id, .. } => {
                    round.ready.push(at);
                    round.children.push(id);
                }
                BranchEvent::ChildFailed { index, error, .. } => {
                    round.failed.push(format!("child {index}: {error}"))
                }
                BranchEvent::Done(_) => {}
                BranchEvent::Error { code, message } => {
                    // Whatever came up is still deleted by the caller.
                    anyhow::bail!("the branch failed: {message} ({code})")
                }
            }
        }
    }
    Ok(Answer::Streamed(round))
}

/// Answer times of the probe's two requests.
#[derive(Default)]
struct Probed {
    /// `GET /v1/sandboxes/{other}`: the API's path, a database read included.
    sandbox: Vec<Duration>,
    /// `GET /healthz`: the daemon's event loop alone.
    health: Vec<Duration>,
}

/// Asks `GET /v1/sandboxes/{id}` and `GET /healthz` in turn every `every` until `stop`,
/// timing each answer.
fn probe(c: Client, id: String, every: Duration, stop: Arc<AtomicBool>) -> Probed {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut out = Probed::default();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let answered: Result<Sandbox, _> =
            rt.block_on(c.json(Method::GET, &format!("/v1/sandboxes/{id}"), None::<&()>));
        if answered.is_ok() {
            out.sandbox.push(t.elapsed());
        }
        let t = Instant::now();
        if rt.block_on(c.raw(Method::GET, "/healthz", None)).is_ok() {
            out.health.push(t.elapsed());
        }
        std::thread::sleep(every);
    }
    out
}

/// Runs `f` while [`probe`] runs beside it.
fn probed<T>(c: &Client, other: &str, every: Duration, f: impl FnOnce() -> T) -> (T, Probed) {
    let stop = Arc::new(AtomicBool::new(false));
    let h = {
        let (c, id, stop) = (c.clone(), other.to_string(), stop.clone());
        std::thread::spawn(move || probe(c, id, every, stop))
    };
    let out = f();
    stop.store(true, Ordering::Relaxed);
    (out, h.join().expect("probe thread"))
}

fn delete_all(c: &Client, ids: &[String], errors: &Mutex<Vec<String>>) {
    // A few at a time: each delete waits for its VM to go.
    std::thread::scope(|s| {
        for chunk in ids.chunks(ids.len().div_ceil(8).max(1)) {
            s.spawn(move || {
                for id in chunk {
                    if let Err(e) =
                        block_on(c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None))
                    {
                        errors.lock().unwrap().push(format!("deleting {id}: {e}"));
                    }
                }
            });
        }
    });
}

fn create(c: &Client, body: serde_json::Value) -> anyhow::Result<Sandbox> {
    let made: SandboxList = block_on(c.json(Method::POST, "/v1/sandboxes", Some(&body)))?;
    made.sandboxes.into_iter().next().context("no sandbox")
}

pub fn run(args: ApiFanoutBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let say = |m: String| {
        if !args.json {
            eprintln!("{m}");
        }
    };
    let runtime = ["--runtime".to_string(), args.runtime.clone()];
    let d = PrivateDaemon::start(
        StateDir::Temp {
            prefix: "zygote-bench-",
        },
        &runtime,
        "the daemon",
    )?;
    let c = &d.client;
    let parent = create(
        c,
        json!({"image": "minimal", "mem_mib": args.mem_mib, "name": "fanout-parent"}),
    )
    .context("creating the parent sandbox")?;
    let other = create(
        c,
        json!({"image": "minimal", "mem_mib": 64, "name": "fanout-other"}),
    )
    .context("creating the probed sandbox")?;
    let every = Duration::from_millis(args.probe_ms.max(1));
    let ((), idle) = probed(c, &other.id, every, || {
        std::thread::sleep(Duration::from_secs(3))
    });
    say(format!(
        "parent {} ({} MiB) and {} on the {} runtime; idle probe p50 {} ms",
        parent.id,
        args.mem_mib,
        other.id,
        args.runtime,
        ms(Summary::of(&idle.sandbox).p50)
    ));

    let errors = Mutex::new(Vec::new());
    let (mut counts, mut fit) = (Vec::new(), None);
    let (mut point, mut first, mut all, mut each, mut pause) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut during = Probed::default();
    for round in 1..=args.rounds {
        let mut count = args.count.unwrap_or(256);
        let (answer, probed_now) = probed(c, &other.id, every, || {
            let mut answer = block_on(branch_streamed(c, &parent.id, count));
            if let Ok(Answer::TooMany(n)) = answer {
                fit = Some(n);
                count = n;
                answer = block_on(branch_streamed(c, &parent.id, count));
            }
            answer
        });
        during.sandbox.extend(probed_now.sandbox);
        during.health.extend(probed_now.health);
        counts.push(count);
        let r = match answer {
            Ok(Answer::Streamed(r)) => r,
            Ok(Answer::TooMany(n)) => {
                errors
                    .lock()
                    .unwrap()
                    .push(format!("round {round}: {count} children refused, {n} fit"));
                continue;
            }
            Err(e) => {
                errors.lock().unwrap().push(format!("round {round}: {e:#}"));
                continue;
            }
        };
        errors
            .lock()
            .unwrap()
            .extend(r.failed.iter().map(|f| format!("round {round}: {f}")));
        point.extend(r.point);
        first.extend(r.ready.first().copied());
        all.extend(r.ready.last().copied().filter(|_| r.failed.is_empty()));
        each.extend(r.ready.iter().copied());
        pause.extend(r.pause_ms.map(|p| Duration::from_secs_f64(p / 1e3)));
        say(format!(
            "round {round}: {count} children; point {} ms, first {} ms, all {} ms, {} failed",
            r.point.map_or("-".into(), |t| ms(t.as_secs_f64() * 1e3)),
            r.ready
                .first()
                .map_or("-".into(), |t| ms(t.as_secs_f64() * 1e3)),
            r.ready
                .last()
                .map_or("-".into(), |t| ms(t.as_secs_f64() * 1e3)),
            r.failed.len()
        ));
        delete_all(c, &r.children, &errors);
    }
    delete_all(c, &[parent.id.clone(), other.id.clone()], &errors);
    let errors = errors.into_inner().unwrap();
    let result = ApiFanoutBench {
        runtime: args.runtime.clone(),
        mem_mib: args.mem_mib,
        rounds: args.rounds,
        counts,
        fit,
        failures: errors.len(),
        point_ms: Summary::of(&point),
        first_child_ms: Summary::of(&first),
        all_ready_ms: Summary::of(&all),
        child_ready_ms: Summary::of(&each),
        pause_ms: Summary::of(&pause),
        probe_idle_ms: Summary::of(&idle.sandbox),
        probe_during_ms: Summary::of(&during.sandbox),
        health_idle_ms: Summary::of(&idle.health),
        health_during_ms: Summary::of(&during.health),
        errors,
    };
    if !args.json {
        crate::commands::daemon_client::print_table(
            &["figure", "p50 ms", "p90 ms", "max ms", "n"],
            &[
                ("request -> branch point", &result.point_ms),
                ("request -> first child ready", &result.first_child_ms),
                ("request -> all children ready", &result.all_ready_ms),
                ("request -> each child ready", &result.child_ready_ms),
                ("parent pause", &result.pause_ms),
                ("GET other sandbox, idle", &result.probe_idle_ms),
                ("GET other sandbox, during", &result.probe_during_ms),
                ("GET /healthz, idle", &result.health_idle_ms),
                ("GET /healthz, during", &result.health_during_ms),
            ]
            .iter()
            .map(|(name, s)| {
                vec![
                    name.to_string(),
                    ms(s.p50),
                    ms(s.p90),
                    ms(s.max),
                    s.n.to_string(),
                ]
            })
            .collect::<Vec<_>>(),
        );
        for e in &result.errors {
            eprintln!("failure: {e}");
        }
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(if result.failures == 0 { 0 } else { 1 })
}
