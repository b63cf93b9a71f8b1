//! Running a template build: a sandbox from the build's base (a zygote image, an OCI
//! reference the daemon pulls, or another template's snapshot), the steps through the
//! manager (RUN as `bash -l -c` as the step's user; COPY by `templates_copy`; ENV,
//! WORKDIR and USER kept as the template's defaults), the start command left running
//! and the ready command polled, then a snapshot: the template.
//!
//! Per-step cache, like a layer build: after each step the sandbox is snapshotted and
//! the snapshot recorded under `sha256(parent key, step JSON, filesHash)`; a later build
//! starts from the deepest step whose key is recorded (none with `force`, and none from
//! a step with `force` on), and its log says which steps were cached. ENV and USER
//! steps change no file, so they reuse the snapshot before them.
//!
//! The sandbox is recorded before it exists and deleted at the end, success or not
//! (`manager::template_intent`): a daemon killed mid-build leaves none behind.
use std::sync::Arc;

use sha2::{Digest, Sha256};
use zygote_api::model::ExecRequest;

use super::templates::resolve;
use super::templates_copy::{copy, Placement};
use super::templates_wire::{BuildStart, Defaults, Reason, Step};
use super::ControlError;
use crate::api::AppState;
use crate::db::{BuildLogRow, BuildRow, CacheRow};
use crate::e2b::envd::users::{Accounts, User};
use crate::manager::Manager;
use crate::model::{CreateSandboxRequest, SnapshotRequest};

/// Steps one build may have.
const MAX_STEPS: usize = 1000;
/// Bytes of one step argument, start or ready command.
const MAX_ARG_BYTES: usize = 64 << 10;
/// How long one RUN step may take.
const RUN_TIMEOUT_MS: u64 = 3_600_000;
/// How long the ready command is polled for.
const READY_TIMEOUT_SECS: u64 = 300;
/// Output lines of one step kept in the log (the rest are counted).
const MAX_LOG_LINES_PER_STEP: usize = 2000;
/// Runs `$1` in a login bash where there is one, else in sh.
const BASH_OR_SH: &str =
    r#"if command -v bash >/dev/null 2>&1; then exec bash -l -c "$1"; fi; exec sh -c "$1""#;
/// What E2B's SDK builds from by default (`Template()` without a `from_*`).
const E2B_DEFAULT_IMAGE: &str = "e2bdev/base";

/// What a build starts from.
#[derive(Debug, Clone)]
enum Base {
    Image(String),
    Snapshot { id: String, defaults: Defaults },
}

/// A checked build request.
#[derive(Debug)]
pub(super) struct Plan {
    base: Base,
    force: bool,
    steps: Vec<Step>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

fn bad(msg: String) -> ControlError {
    ControlError::BadRequest(msg)
}

impl Plan {
    /// The request's base and steps, checked: unknown step types, wrong argument
    /// counts, missing uploads and unknown templates are 400s before anything runs.
    pub fn check(st: &AppState, body: BuildStart) -> Result<Plan, ControlError> {
        if body
            .from_image_registry
            .as_ref()
            .is_some_and(|r| !r.is_null())
        {
            return Err(bad(
                "fromImageRegistry (registry credentials) is not supported by zygote".into(),
            ));
        }
        let base = match (body.from_template, body.from_image) {
            (Some(t), _) => match resolve(st, &t)? {
                Some(b) => Base::Snapshot {
                    id: b.snapshot.unwrap_or_default(),
                    defaults: b
                        .defaults
                        .and_then(|d| serde_json::from_str(&d).ok())
                        .unwrap_or_default(),
                },
                None if st.manager.snapshot_get(&t).is_ok() => Base::Snapshot {
                    id: t,
                    defaults: Defaults::default(),
                },
                None => Base::Image(t),
            },
            (None, Some(i)) if i == E2B_DEFAULT_IMAGE || i == "e2bdev/base:latest" => {
                Base::Image("base".into())
            }
            (None, Some(i)) => Base::Image(i),
            (None, None) => return Err(bad("fromImage or fromTemplate is required".into())),
        };
        if body.steps.len() > MAX_STEPS {
            return Err(bad(format!("at most {MAX_STEPS} steps")));
        }
        for (i, s) in body.steps.iter().enumerate() {
            check_step(st, i + 1, s)?;
        }
        for c in [&body.start_cmd, &body.ready_cmd].into_iter().flatten() {
            if c.len() > MAX_ARG_BYTES {
                return Err(bad(format!(
                    "startCmd and readyCmd are at most {MAX_ARG_BYTES} bytes"
                )));
            }
        }
        Ok(Plan {
            base,
            force: body.force,
            steps: body.steps,
            start_cmd: body.start_cmd.filter(|c| !c.is_empty()),
            ready_cmd: body.ready_cmd.filter(|c| !c.is_empty()),
        })
    }
}

fn check_step(st: &AppState, n: usize, s: &Step) -> Result<(), ControlError> {
    let a = &s.args;
    let argc = |lo: usize, hi: usize| {
        if a.len() < lo || a.len() > hi {
            return Err(bad(format!(
                "step {n} ({}): takes {lo} to {hi} arguments, got {}",
                s.kind,
                a.len()
            )));
        }
        Ok(())
    };
    if a.iter()
        .any(|x| x.len() > MAX_ARG_BYTES || x.contains('\0'))
    {
        return Err(bad(format!(
            "step {n}: an argument is over {MAX_ARG_BYTES} bytes or has a NUL"
        )));
    }
    match s.kind.as_str() {
        "RUN" => argc(1, 2)?,
        "WORKDIR" | "USER" => argc(1, 1)?,
        "ENV" => {
            argc(2, 2 * 4096)?;
            if !a.len().is_multiple_of(2)
                || a.iter().step_by(2).any(|k| k.is_empty() || k.contains('='))
            {
                return Err(bad(format!("step {n} (ENV): takes name, value pairs")));
            }
        }
        "COPY" => {
            argc(2, 4)?;
            let hash = s.files_hash.as_deref().unwrap_or_default();
            let stored = st.manager.db.upload(hash)?.is_some_and(|u| u.stored);
            if !stored {
                return Err(bad(format!(
                    "step {n} (COPY {}): its files (filesHash) were not uploaded",
                    a[0]
                )));
            }
            Placement::new(&a[0], "/").map_err(|e| bad(format!("step {n} (COPY): {e}")))?;
            if let Some(m) = a.get(3).filter(|m| !m.is_empty()) {
                u32::from_str_radix(m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| bad(format!("step {n} (COPY): mode {m:?} is not octal")))?;
            }
        }
        other => {
            return Err(bad(format!(
                "step {n}: unknown type {:?} (RUN, COPY, ENV, WORKDIR or USER)",
                other.chars().take(32).collect::<String>()
            )))
        }
    }
    Ok(())
}

/// A step's cache key from its parent's.
fn step_key(parent: &str, step: &Step) -> String {
    let mut s = step.clone();
    s.force = false;
    let json = serde_json::to_string(&s).unwrap_or_default();
    let mut h = Sha256::new();
    for part in [parent, &json, s.files_hash.as_deref().unwrap_or("")] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// A failed build's reason: what failed and at which step (`base`, `1`.., `finalize`).
struct Failure {
    message: String,
    step: String,
}

fn fail(step: impl Into<String>, message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        step: step.into(),
    }
}

/// One build in progress.
struct Build {
    m: Arc<Manager>,
    row: BuildRow,
    sandbox: Option<String>,
    defaults: Defaults,
    /// The snapshot of the state so far (`None`: only the base).
    at: Option<String>,
}

impl Build {
    fn log(&self, level: &str, step: Option<&str>, message: String) {
        let line = BuildLogRow {
            at_ms: now_ms(),
            level: level.into(),
            message,
            step: step.map(str::to_string),
        };
        if let Err(e) = self.m.db.add_build_logs(&self.row.id, &[line]) {
            tracing::warn!("template build {}: logging: {e}", self.row.id);
        }
    }

    /// The build sandbox, started on first need from the state so far.
    async fn sandbox(&mut self, base: &Base) -> Result<String, Failure> {
        if let Some(id) = &self.sandbox {
            return Ok(id.clone());
        }
        let (image, snapshot) = match (&self.at, base) {
            (Some(s), _) => (None, Some(s.clone())),
            (None, Base::Snapshot { id, .. }) => (None, Some(id.clone())),
            (None, Base::Image(i)) => (Some(i.clone()), None),
        };
        // A snapshot carries its size; an image takes the build's (else its default).
        let sized = image.is_some();
        let req = CreateSandboxRequest {
            image,
            snapshot,
            vcpus: self.row.vcpus.filter(|_| sized),
            mem_mib: self.row.mem_mib.filter(|_| sized),
            ..Default::default()
        };
        let s = self
            .m
            .start_build_sandbox(&self.row.id, req)
            .await
            .map_err(|e| fail("base", format!("starting the build sandbox: {e}")))?;
        self.sandbox = Some(s.id.clone());
        Ok(s.id)
    }

    async fn user(&self, id: &str, name: Option<&str>, step: &str) -> Result<User, Failure> {
        let accounts = Accounts::load(&self.m, id, false)
            .await
            .map_err(|e| fail(step, e.to_string()))?;
        accounts
            .resolve(name.or(self.defaults.user.as_deref()))
            .map_err(|e| fail(step, e.to_string()))
    }

    /// `cmd` in `bash -l -c` as `user`, with the defaults' envs and workdir; in `sh -c`
    /// on an image without bash (busybox, alpine).
    fn exec_request(&self, cmd: &str, user: &User, timeout_ms: u64) -> ExecRequest {
        let mut env = self.defaults.envs.clone();
        env.entry("HOME".into()).or_insert(user.home.clone());
        env.entry("USER".into()).or_insert(user.name.clone());
        ExecRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                BASH_OR_SH.into(),
                "sh".into(),
                cmd.into(),
            ],
            env,
            cwd: Some(self.defaults.workdir.clone().unwrap_or(user.home.clone())),
            timeout_ms: Some(timeout_ms),
            user: Some(format!("{}:{}", user.uid, user.gid)),
            ..Default::default()
        }
    }

    async fn snapshot(&mut self, step: &str) -> Result<String, Failure> {
        let id = self.sandbox.clone().unwrap_or_default();
        let snap = self
            .m
            .snapshot(SnapshotRequest {
                sandbox: id,
                kind: None,
                name: None,
            })
            .await
            .map_err(|e| fail(step, format!("snapshotting the build sandbox: {e}")))?;
        // A crash before the next line leaves a snapshot nothing names: the build's
        // intent record removes it at the next start.
        crate::fault::point("template-build.snapshotted");
        if let Err(e) = self.m.db.own_snapshot(&self.row.template, &snap.id) {
            tracing::warn!("template build {}: {e}", self.row.id);
        }
        self.at = Some(snap.id.clone());
        Ok(snap.id)
    }

    async fn run_step(&mut self, base: &Base, n: &str, s: &Step) -> Result<bool, Failure> {
        let a = &s.args;
        match s.kind.as_str() {
            "ENV" => {
                for kv in a.chunks(2) {
                    self.defaults.envs.insert(kv[0].clone(), kv[1].clone());
                }
                Ok(false)
            }
            "USER" => {
                let id = self.sandbox(base).await?;
                self.user(&id, Some(&a[0]), n).await?;
                self.defaults.user = Some(a[0].clone());
                Ok(false)
            }
            "WORKDIR" => {
                let id = self.sandbox(base).await?;
                let user = self.user(&id, None, n).await?;
                let dir = absolute(&a[0], self.defaults.workdir.as_deref(), &user.home);
                self.m
                    .make_dir(&id, &dir, Some(user.owner()))
                    .await
                    .map_err(|e| fail(n, format!("creating {dir}: {e}")))?;
                self.defaults.workdir = Some(dir);
                Ok(true)
            }
            "RUN" => {
                let id = self.sandbox(base).await?;
                let user = self.user(&id, a.get(1).map(String::as_str), n).await?;
                let req = self.exec_request(&a[0], &user, RUN_TIMEOUT_MS);
                let out = self
                    .m
                    .exec(&id, req)
                    .await
                    .map_err(|e| fail(n, format!("running {:?}: {e}", a[0])))?;
                let text = format!("{}{}", out.stdout, out.stderr);
                let lines: Vec<&str> = text.lines().collect();
                for l in lines.iter().take(MAX_LOG_LINES_PER_STEP) {
                    self.log("info", Some(n), l.to_string());
                }
                if lines.len() > MAX_LOG_LINES_PER_STEP {
                    let more = lines.len() - MAX_LOG_LINES_PER_STEP;
                    self.log("info", Some(n), format!("({more} more lines)"));
                }
                if out.exit_code != Some(0) {
                    let how = match (out.exit_code, out.timed_out) {
                        (_, true) => "timed out".to_string(),
                        (Some(c), _) => format!("exit status {c}"),
                        (None, _) => format!("signal {}", out.signal.unwrap_or(0)),
                    };
                    let tail: String = text
                        .chars()
                        .rev()
                        .take(4096)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    return Err(fail(
                        n,
                        format!("failed to run command '{}': {how}: {}", a[0], tail.trim()),
                    ));
                }
                Ok(true)
            }
            "COPY" => {
                let id = self.sandbox(base).await?;
                let who = a.get(2).filter(|u| !u.is_empty());
                let user_name = who.map(|u| u.split(':').next().unwrap_or(u));
                let user = self.user(&id, user_name, n).await?;
                let mode = a.get(3).filter(|m| !m.is_empty());
                let mode = mode.and_then(|m| u32::from_str_radix(m, 8).ok());
                let home = self.user(&id, None, n).await?.home;
                let dest = absolute(&a[1], self.defaults.workdir.as_deref(), &home);
                let dest = match a[1].ends_with('/') && !dest.ends_with('/') {
                    true => format!("{dest}/"),
                    false => dest,
                };
                let place = Placement::new(&a[0], &dest).map_err(|e| fail(n, e.to_string()))?;
                let hash = s.files_hash.clone().unwrap_or_default();
                let done = copy(&self.m, &id, &hash, &a[0], &a[1], place, user.owner(), mode)
                    .await
                    .map_err(|e| fail(n, format!("COPY {}: {e}", a[0])))?;
                self.log(
                    "info",
                    Some(n),
                    format!(
                        "copied {} files, {} directories, {} symlinks",
                        done.files, done.dirs, done.links
                    ),
                );
                Ok(true)
            }
            _ => Err(fail(n, format!("unknown step type {}", s.kind))),
        }
    }

    async fn execute(&mut self, plan: &Plan) -> Result<String, Failure> {
        let base = &plan.base;
        let mut key = match base {
            Base::Image(name) => {
                let info = self
                    .m
                    .find_or_pull(name)
                    .await
                    .map_err(|e| fail("base", format!("image {name}: {e}")))?;
                // The size is part of the state a cached step's snapshot holds.
                let (cpus, mem) = (self.row.vcpus, self.row.mem_mib);
                format!("image:{}:{cpus:?}:{mem:?}", info.sha256)
            }
            Base::Snapshot { id, defaults } => {
                self.defaults = defaults.clone();
                format!("snapshot:{id}")
            }
        };
        let total = plan.steps.len();
        let mut cached = !plan.force;
        for (i, s) in plan.steps.iter().enumerate() {
            let n = (i + 1).to_string();
            key = step_key(&key, s);
            cached &= !s.force;
            let hit = match cached {
                true => self.m.db.cached_step(&key).ok().flatten(),
                false => None,
            };
            let what = format!("{} {}", s.kind, s.args.join(" "));
            if let Some(hit) = hit {
                self.log("info", Some(&n), format!("CACHED [{n}/{total}] {what}"));
                self.at = Some(hit.snapshot);
                self.defaults = serde_json::from_str(&hit.defaults).unwrap_or_default();
                continue;
            }
            cached = false;
            self.log("info", Some(&n), format!("[{n}/{total}] {what}"));
            let changed = self.run_step(base, &n, s).await?;
            let snapshot = match (changed, &self.at) {
                (false, Some(at)) => at.clone(),
                _ => {
                    self.sandbox(base).await?;
                    self.snapshot(&n).await?
                }
            };
            let row = CacheRow {
                snapshot,
                template: self.row.template.clone(),
                defaults: serde_json::to_string(&self.defaults).unwrap_or_default(),
            };
            if let Err(e) = self.m.db.cache_step(&key, &row, crate::manager::now()) {
                tracing::warn!("template build {}: caching step {n}: {e}", self.row.id);
            }
        }
        if plan.start_cmd.is_some() || plan.ready_cmd.is_some() {
            self.finalize(plan).await?;
            return self.snapshot("finalize").await;
        }
        match (&self.at, base) {
            (Some(at), _) => Ok(at.clone()),
            (None, Base::Snapshot { id, .. }) => Ok(id.clone()),
            (None, Base::Image(_)) => {
                self.sandbox(base).await?;
                self.snapshot("base").await
            }
        }
    }

    /// The start command, left running, then the ready command until it succeeds.
    async fn finalize(&mut self, plan: &Plan) -> Result<(), Failure> {
        let id = self.sandbox(&plan.base).await?;
        let user = self.user(&id, None, "finalize").await?;
        if let Some(cmd) = &plan.start_cmd {
            self.log("info", Some("finalize"), format!("start command: {cmd}"));
            let mut req = self.exec_request(cmd, &user, 24 * 3_600_000);
            req.background = true;
            self.m
                .spawn_process(&id, req)
                .await
                .map_err(|e| fail("finalize", format!("starting {cmd:?}: {e}")))?;
        }
        let Some(ready) = &plan.ready_cmd else {
            return Ok(());
        };
        self.log("info", Some("finalize"), format!("waiting for: {ready}"));
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_secs(READY_TIMEOUT_SECS);
        loop {
            let out = self
                .m
                .exec(&id, self.exec_request(ready, &user, 30_000))
                .await
                .map_err(|e| fail("finalize", format!("running {ready:?}: {e}")))?;
            if out.exit_code == Some(0) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(fail(
                    "finalize",
                    format!(
                        "the ready command {ready:?} did not succeed in {READY_TIMEOUT_SECS} s"
                    ),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `path` made absolute against `workdir` (else `home`), `.` and `..` resolved.
fn absolute(path: &str, workdir: Option<&str>, home: &str) -> String {
    let joined = match path.starts_with('/') {
        true => path.to_string(),
        false => format!("{}/{path}", workdir.unwrap_or(home)),
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Runs build `row` to its end (in a task of its own) and records the outcome.
pub(super) async fn run(m: Arc<Manager>, row: BuildRow, plan: Plan) {
    let mut b = Build {
        m: m.clone(),
        row,
        sandbox: None,
        defaults: Defaults::default(),
        at: None,
    };
    b.log(
        "info",
        None,
        format!("Building template {}", b.row.template),
    );
    let outcome = b.execute(&plan).await;
    let mut row = b.row.clone();
    let tags: Vec<String> = serde_json::from_str(&row.tags).unwrap_or_default();
    if let Ok(snapshot) = &outcome {
        // Named by the build before the sandbox goes (its clean-up keeps what is named).
        row.snapshot = Some(snapshot.clone());
        row.defaults = serde_json::to_string(&b.defaults).ok();
        if let Err(e) = m.db.put_build(&row) {
            tracing::warn!("template build {}: {e}", row.id);
        }
    }
    if let Some(sandbox) = b.sandbox.take() {
        if let Err(e) = m.end_build_sandbox(&row.id, &sandbox).await {
            tracing::warn!("template build {}: removing its sandbox: {e}", row.id);
        }
    }
    match outcome {
        Ok(_) => {
            row.status = "ready".into();
            b.log("info", None, "Build finished: template ready".into());
            if let Err(e) = m.db.finish_build(&row, &tags, crate::manager::now()) {
                tracing::warn!("template build {}: {e}", row.id);
            }
        }
        Err(f) => {
            b.log("error", Some(&f.step), f.message.clone());
            row.status = "error".into();
            row.snapshot = None;
            let reason = Reason {
                message: f.message,
                step: Some(f.step),
            };
            row.reason = serde_json::to_string(&reason).ok();
            if let Err(e) = m.db.finish_build(&row, &[], crate::manager::now()) {
                tracing::warn!("template build {}: {e}", row.id);
            }
        }
    }
}
