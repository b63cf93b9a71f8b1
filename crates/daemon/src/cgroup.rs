//! One cgroup v2 per VM process: limits (`memory.max`, `cpu.max`,
//! `pids.max`) when the controllers are available, and in any case a handle
//! to find and kill everything the VM left behind (`cgroup.kill`).
//!
//! Hosts differ: a pure v2 host delegates controllers to us; a hybrid host
//! (v1 for cpu/memory, a controller-less v2 at /sys/fs/cgroup/unified) only
//! gives grouping; some hosts have no v2 at all. What cannot be applied is
//! reported (in `GET /v1/info` and in each sandbox), never a failed create.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::model::{CgroupInfo, CgroupReport, Limits};

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const WANTED: [&str; 3] = ["memory", "cpu", "pids"];

/// Where VM cgroups are created and what they can do.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// Parent directory of the per-VM cgroups; None: no usable cgroup v2.
    root: Option<PathBuf>,
    /// Controllers enabled for the children of `root`.
    controllers: Vec<String>,
    /// Why limits (or cgroups at all) are unavailable.
    limitations: Vec<String>,
}

impl Cgroups {
    /// Uses `root` (e.g. a delegated cgroup, or a fake directory in tests)
    /// as the parent of VM cgroups; otherwise `<cgroup2 mount><our cgroup>/zygote`.
    pub fn detect(root: Option<PathBuf>) -> Cgroups {
        let root = match root {
            Some(r) => r,
            None => match own_cgroup2_dir() {
                Ok(dir) => dir.join("zygote"),
                Err(why) => {
                    return Cgroups {
                        root: None,
                        controllers: Vec::new(),
                        limitations: vec![why],
                    }
                }
            },
        };
        if let Err(e) = std::fs::create_dir_all(&root) {
            return Cgroups {
                root: None,
                controllers: Vec::new(),
                limitations: vec![format!("cannot create {}: {e}", root.display())],
            };
        }
        let mut limitations = Vec::new();
        // Controllers must be enabled in the parent's subtree_control before
        // they appear in root, then in root's for the VM cgroups.
        if let Some(parent) = root.parent() {
            enable_controllers(parent);
        }
        let available = read_words(&root.join("cgroup.controllers"));
        let missing: Vec<&str> = WANTED
            .iter()
            .copied()
            .filter(|c| !available.iter().any(|a| a == c))
            .collect();
        if !missing.is_empty() {
            limitations.push(format!(
                "cgroup v2 at {} offers no {} controller{} (on a hybrid hierarchy they belong to cgroup v1); \
                 VMs still get their own cgroup, without those limits",
                root.display(),
                missing.join("/"),
                if missing.len() > 1 { "s" } else { "" },
            ));
        }
        enable_controllers(&root);
        let enabled = read_words(&root.join("cgroup.subtree_control"));
        let controllers: Vec<String> = WANTED
            .iter()
            .filter(|c| enabled.iter().any(|e| e == *c))
            .map(|c| c.to_string())
            .collect();
        for c in WANTED {
            if available.iter().any(|a| a == c) && !controllers.iter().any(|e| e == c) {
                limitations.push(format!(
                    "the {c} controller could not be enabled in {}/cgroup.subtree_control \
                     (a cgroup with processes cannot delegate; run zygoted in its own cgroup)",
                    root.display()
                ));
            }
        }
        Cgroups {
            root: Some(root),
            controllers,
            limitations,
        }
    }

    pub fn info(&self) -> CgroupInfo {
        CgroupInfo {
            root: self.root.as_ref().map(|r| r.display().to_string()),
            controllers: self.controllers.clone(),
            limitations: self.limitations.clone(),
        }
    }

    /// Creates the cgroup `name` and applies what it can of `limits`.
    pub fn create(&self, name: &str, limits: &Limits) -> CgroupReport {
        let mut report = CgroupReport::default();
        let requested = requested_files(limits);
        let Some(root) = &self.root else {
            let why = self.limitations.join("; ");
            for (file, _, _) in &requested {
                report.not_applied.insert(file.to_string(), why.clone());
            }
            return report;
        };
        let dir = root.join(name);
        if let Err(e) = std::fs::create_dir(&dir) {
            let why = format!("cannot create {}: {e}", dir.display());
            for (file, _, _) in &requested {
                report.not_applied.insert(file.to_string(), why.clone());
            }
            return report;
        }
        report.path = Some(dir.display().to_string());
        for (file, controller, value) in requested {
            if !self.controllers.iter().any(|c| c == controller) {
                report.not_applied.insert(
                    file.to_string(),
                    format!("the {controller} controller is not available in cgroup v2 here"),
                );
                continue;
            }
            match std::fs::write(dir.join(file), &value) {
                Ok(()) => report.applied.push(format!("{file}={value}")),
                Err(e) => {
                    report
                        .not_applied
                        .insert(file.to_string(), format!("writing {value:?}: {e}"));
                }
            }
        }
        report
    }
}

/// (interface file, controller, value) for each requested limit.
fn requested_files(limits: &Limits) -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    if let Some(m) = limits.memory_mib {
        out.push(("memory.max", "memory", (m * 1024 * 1024).to_string()));
    }
    if let Some(c) = limits.cpu_percent {
        // Quota per 100 ms period: 100% of one CPU is 100000 µs.
        out.push(("cpu.max", "cpu", format!("{} 100000", u64::from(c) * 1000)));
    }
    if let Some(p) = limits.pids {
        out.push(("pids.max", "pids", p.to_string()));
    }
    out
}

fn read_words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Best effort: asks for each wanted controller that `dir` has available
/// (one at a time, so one refusal does not block the others).
fn enable_controllers(dir: &Path) {
    let available = read_words(&dir.join("cgroup.controllers"));
    let enabled = read_words(&dir.join("cgroup.subtree_control"));
    for c in WANTED {
        if available.iter().any(|a| a == c) && !enabled.iter().any(|e| e == c) {
            let path = dir.join("cgroup.subtree_control");
            let res = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(format!("+{c}").as_bytes()));
            if let Err(e) = res {
                tracing::debug!("enabling {c} in {}: {e}", path.display());
            }
        }
    }
}

/// The cgroup v2 directory this process is in.
fn own_cgroup2_dir() -> Result<PathBuf, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    let mount = mountinfo
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next()? == "cgroup2").then(|| pre.split_whitespace().nth(4))?
        })
        .ok_or_else(|| "no cgroup v2 filesystem is mounted".to_string())?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| {
            "this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)".to_string()
        })?;
    Ok(Path::new(mount).join(path.trim_start_matches('/')))
}

/// Whether `dir` is on a real cgroup2 filesystem (tests use plain directories).
fn is_cgroupfs(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we own; c is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
    }
}

/// Pids in a cgroup.
pub fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// `pid (comm) state S, threads N, wchan W: cmdline`, for reports on what survived.
fn describe_pid(pid: u32) -> String {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
    let stat = read("stat");
    // comm may contain spaces and parentheses: the state follows the last ')'.
    let (comm, rest) = stat.rsplit_once(')').unwrap_or(("?", ""));
    let comm = comm.split_once('(').map_or("?", |(_, c)| c);
    let state = rest.split_whitespace().next().unwrap_or("?");
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    let cmdline = read("cmdline").replace('\0', " ");
    format!(
        "{pid} ({comm}) state {state}, {threads} threads, wchan {}: {}",
        read("wchan"),
        cmdline.trim()
    )
}

/// Kills every process in the cgroup and removes it. Returns an error
/// message if something survived.
pub fn destroy(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    if is_cgroupfs(dir) {
        // cgroup.kill (Linux 5.14+) kills atomically, even processes forking
        // while we look; signalling each pid is the fallback.
        if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
            for pid in procs(dir) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    let left: Vec<String> = procs(dir).into_iter().map(describe_pid).collect();
                    return Err(format!(
                        "removing {}: {e} (left: {})",
                        dir.display(),
                        left.join("; ")
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    } else {
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))
    }
}
