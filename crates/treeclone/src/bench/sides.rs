//! One shape on one filesystem: every selected side, interleaved run by run,
//! each run's clone checked and removed (untimed).
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::report::{Samples, SideKind, SideResult};
use super::shapes::{
    cp_reference, cp_reflink_reference, create_empty_tree, file_path, naive_copy, Shape,
};
use super::{io_err, BenchError, ShapeResult};
use crate::{fiemap, materialize, plan, FileMethod, Method, MethodCounts, Options, Strategy};

/// What this filesystem (and process) allows, found once per filesystem:
/// Err is the reason a side is skipped there.
pub(super) struct Caps {
    pub cp: Result<(), String>,
    pub cp_reflink: Result<(), String>,
    pub subvolume: Result<(), String>,
    pub overlay: Result<(), String>,
}

impl Caps {
    pub(super) fn probe(root: &Path) -> Caps {
        let fs_type = crate::fs_type_name(root).unwrap_or_else(|_| "unknown".into());
        Caps {
            cp: if super::shapes::gnu_cp_available() {
                Ok(())
            } else {
                Err("GNU cp not installed".into())
            },
            cp_reflink: super::shapes::cp_reflink_availability(root),
            subvolume: if crate::btrfs::is_btrfs(root) {
                Ok(())
            } else {
                Err(format!("{fs_type}, not btrfs"))
            },
            overlay: crate::overlay_availability(),
        }
    }

    fn of(&self, kind: SideKind) -> Result<(), String> {
        match kind {
            SideKind::Baseline | SideKind::PerFile | SideKind::Floor => Ok(()),
            SideKind::Cp => self.cp.clone(),
            SideKind::CpReflink => self.cp_reflink.clone(),
            SideKind::Subvolume => self.subvolume.clone(),
            SideKind::Overlay => self.overlay.clone(),
        }
    }
}

/// Everything one shape's runs share.
pub(super) struct ShapeCtx<'a> {
    pub label: &'a str,
    pub root: &'a Path,
    pub src: &'a Path,
    pub shape: &'a Shape,
    pub runs: usize,
    pub topts: &'a Options,
}

/// A clone (or copy) of one run, removed with [`crate::remove`] however the
/// run ends: an overlay clone is a mount, a subvolume clone a subvolume.
struct Scratch(Option<PathBuf>);

impl Scratch {
    fn path(&self) -> &Path {
        self.0.as_deref().expect("not removed yet")
    }

    fn remove(mut self) -> Result<(), BenchError> {
        let p = self.0.take().expect("not removed yet");
        crate::remove(&p).map_err(io_err("remove", &p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = crate::remove(&p);
        }
    }
}

/// One side's measurements so far.
struct Acc {
    kind: SideKind,
    skipped: Option<String>,
    samples: Samples,
    methods: MethodCounts,
    strategy: Option<Strategy>,
    sharing: Sharing,
    prepare_ms: Option<f64>,
}

/// One timed run of one side.
struct RunOut {
    times: (f64, f64),
    note: String,
}

pub(super) fn bench_shape(
    ctx: &ShapeCtx,
    sides: &[SideKind],
    caps: &Caps,
    progress: &mut dyn FnMut(&str),
) -> Result<ShapeResult, BenchError> {
    let (label, shape) = (ctx.label, ctx.shape);
    let mut accs: Vec<Acc> = sides
        .iter()
        .map(|&kind| Acc {
            kind,
            skipped: caps.of(kind).err(),
            samples: Samples::default(),
            methods: MethodCounts::default(),
            strategy: None,
            sharing: Sharing::Unchecked,
            prepare_ms: None,
        })
        .collect();

    // Seal once, untimed, when a whole-tree side will run.
    let mut sealed = None;
    if accs
        .iter()
        .any(|a| a.kind.needs_seal() && a.skipped.is_none())
    {
        let dst = ctx.root.join(format!("sealed-{}", shape.name));
        let t = Instant::now();
        match crate::seal(ctx.src, &dst, ctx.topts) {
            Ok(rep) => {
                let ms = t.elapsed().as_secs_f64() * 1e3;
                progress(&format!(
                    "{label}: {}: sealed in {ms:.0} ms (untimed; {}, {})",
                    shape.name,
                    rep.strategy.as_str(),
                    rep.by_method
                ));
                let is_subvolume = crate::btrfs::is_subvolume(&dst);
                for a in accs.iter_mut().filter(|a| a.kind.needs_seal()) {
                    a.prepare_ms = Some(ms);
                    if a.kind == SideKind::Subvolume && !is_subvolume && a.skipped.is_none() {
                        a.skipped = Some("the sealed tree is not a subvolume".into());
                    }
                }
                sealed = Some(Scratch(Some(dst)));
            }
            Err(e) => {
                for a in accs.iter_mut().filter(|a| a.kind.needs_seal()) {
                    a.skipped.get_or_insert_with(|| format!("seal failed: {e}"));
                }
            }
        }
    }
    for a in accs.iter().filter(|a| a.skipped.is_some()) {
        let why = a.skipped.as_deref().unwrap_or_default();
        progress(&format!(
            "{label}: {}: {} skipped: {why}",
            shape.name,
            a.kind.as_str()
        ));
    }

    for run in 0..ctx.runs {
        for a in accs.iter_mut().filter(|a| a.skipped.is_none()) {
            let sealed_path = sealed.as_ref().map(Scratch::path);
            let out = run_side(ctx, a, sealed_path, run)?;
            progress(&format!(
                "{label}: {} run {}/{} {}: visible/complete {:.1}/{:.1} ms{}",
                shape.name,
                run + 1,
                ctx.runs,
                a.kind.as_str(),
                out.times.0,
                out.times.1,
                out.note
            ));
            a.samples.push(out.times);
        }
    }
    if let Some(s) = sealed {
        s.remove()?;
    }
    Ok(finish(shape, accs))
}

/// Run side `a` once into a fresh destination, check and remove it.
fn run_side(
    ctx: &ShapeCtx,
    a: &mut Acc,
    sealed: Option<&Path>,
    run: usize,
) -> Result<RunOut, BenchError> {
    let (root, src, shape) = (ctx.root, ctx.src, ctx.shape);
    let dst = Scratch(Some(root.join(format!(
        "{}-{}-{run}",
        a.kind.as_str(),
        shape.name
    ))));
    let d = dst.path();
    let deep = run == 0;
    let mut note = String::new();
    let times = match a.kind {
        SideKind::Baseline => {
            let (copied, t) = timed(root, || {
                naive_copy(src, d).map_err(io_err("naive copy to", d))
            })?;
            if copied != shape.bytes() {
                return Err(BenchError::Verify(format!(
                    "baseline copied {copied} bytes, expected {}",
                    shape.bytes()
                )));
            }
            t
        }
        SideKind::Floor => {
            let threads = ctx.topts.effective_threads();
            let (made, t) = timed(root, || {
                create_empty_tree(src, d, threads).map_err(io_err("create empty tree", d))
            })?;
            if made != shape.files {
                return Err(BenchError::Verify(format!(
                    "floor created {made} files, expected {}",
                    shape.files
                )));
            }
            t
        }
        SideKind::Cp | SideKind::CpReflink => {
            let reflink = a.kind == SideKind::CpReflink;
            let (what, cp): (_, fn(&Path, &Path) -> std::io::Result<()>) = if reflink {
                ("cp -r --reflink=always to", cp_reflink_reference)
            } else {
                ("cp -r --reflink=never to", cp_reference)
            };
            let ((), t) = timed(root, || cp(src, d).map_err(io_err(what, d)))?;
            if deep {
                a.sharing = verify_tree(shape, src, d, reflink)?;
            }
            t
        }
        SideKind::PerFile | SideKind::Subvolume | SideKind::Overlay => {
            let (from, method, want) = match a.kind {
                SideKind::PerFile => (src, Method::Auto, Strategy::PerFile),
                SideKind::Subvolume => {
                    (sealed_src(sealed)?, Method::Subvolume, Strategy::Subvolume)
                }
                _ => (sealed_src(sealed)?, Method::Overlay, Strategy::Overlay),
            };
            let opts = Options {
                method,
                ..ctx.topts.clone()
            };
            let (rep, t) = timed(root, || Ok(materialize(from, d, &opts)?))?;
            if rep.strategy != want || rep.files != shape.files as u64 || rep.bytes != shape.bytes()
            {
                return Err(BenchError::Verify(format!(
                    "{} made {} files / {} bytes with strategy {}, expected {} / {} with {}",
                    a.kind.as_str(),
                    rep.files,
                    rep.bytes,
                    rep.strategy.as_str(),
                    shape.files,
                    shape.bytes(),
                    want.as_str()
                )));
            }
            a.strategy = Some(rep.strategy);
            for m in rep.per_file.iter().map(|f| f.method) {
                a.methods.add(m);
            }
            note = match rep.strategy {
                Strategy::PerFile => format!(" ({})", rep.by_method),
                s => format!(" ({})", s.as_str()),
            };
            if deep {
                // FIEMAP where the data should be shared: a reflinked first
                // file, or a snapshot. An overlay shows the lower file itself.
                let fiemap = match a.kind {
                    SideKind::PerFile => rep
                        .per_file
                        .first()
                        .is_some_and(|f| f.method == FileMethod::Reflink),
                    SideKind::Subvolume => true,
                    _ => false,
                };
                a.sharing = verify_tree(shape, src, d, fiemap)?;
            }
            t
        }
    };
    dst.remove()?;
    Ok(RunOut { times, note })
}

fn sealed_src(sealed: Option<&Path>) -> Result<&Path, BenchError> {
    sealed.ok_or_else(|| BenchError::Verify("no sealed tree to clone from".into()))
}

/// Runs `op` after syncing `root` (untimed), returning its value and
/// (visible, complete) in ms: complete also waits for a `syncfs` right
/// after `op` returned. See the module docs.
fn timed<T>(
    root: &Path,
    op: impl FnOnce() -> Result<T, BenchError>,
) -> Result<(T, (f64, f64)), BenchError> {
    let sync = || crate::syncfs(root).map_err(io_err("syncfs", root));
    sync()?;
    let t = Instant::now();
    let value = op()?;
    let visible = t.elapsed().as_secs_f64() * 1e3;
    sync()?;
    Ok((value, (visible, t.elapsed().as_secs_f64() * 1e3)))
}

/// Make sure a side really produced the tree (a fast wrong answer is not a
/// speedup): scan the clone (file count and bytes), compare the first and
/// last file's bytes with the source, and, when `fiemap`, ask FIEMAP
/// whether the first file shares all its extents with the source. Untimed,
/// first run.
fn verify_tree(shape: &Shape, src: &Path, dst: &Path, fiemap: bool) -> Result<Sharing, BenchError> {
    let plan = plan::scan(dst)?;
    let bytes: u64 = plan.files.iter().map(|f| f.size).sum();
    if plan.files.len() != shape.files || bytes != shape.bytes() {
        return Err(BenchError::Verify(format!(
            "{} holds {} files / {bytes} bytes, expected {} / {}",
            dst.display(),
            plan.files.len(),
            shape.files,
            shape.bytes()
        )));
    }
    for i in [0, shape.files.saturating_sub(1)] {
        let rel = file_path(shape, i);
        let (a, b) = (src.join(&rel), dst.join(&rel));
        if fs::read(&a).map_err(io_err("read", &a))? != fs::read(&b).map_err(io_err("read", &b))? {
            return Err(BenchError::Verify(format!(
                "{} differs from its source",
                b.display()
            )));
        }
    }
    if !fiemap {
        return Ok(Sharing::Unchecked);
    }
    let b = dst.join(file_path(shape, 0));
    let extents = fiemap::extents(&b).map_err(io_err("FIEMAP", &b))?;
    if extents
        .iter()
        .any(|e| e.flags & FIEMAP_EXTENT_DATA_INLINE != 0)
    {
        return Ok(Sharing::Inline);
    }
    let shared = !extents.is_empty() && extents.iter().all(fiemap::Extent::is_shared);
    Ok(if shared {
        Sharing::Shared
    } else {
        Sharing::NotShared
    })
}

/// FIEMAP flag: the data is stored inside the filesystem's metadata (btrfs
/// inlines files up to 2 KiB), so there is no extent to share.
const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x200;

/// What FIEMAP says about a clone's first file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sharing {
    Unchecked,
    Shared,
    NotShared,
    Inline,
}

impl Sharing {
    fn verified(self) -> Option<bool> {
        match self {
            Sharing::Shared => Some(true),
            Sharing::NotShared => Some(false),
            Sharing::Unchecked | Sharing::Inline => None,
        }
    }
}

fn finish(shape: &Shape, accs: Vec<Acc>) -> ShapeResult {
    let methods = accs
        .iter()
        .find(|a| a.kind == SideKind::PerFile && a.skipped.is_none())
        .map(|a| a.methods)
        .unwrap_or_default();
    let mut sides: Vec<SideResult> = accs
        .into_iter()
        .map(|a| {
            if let Some(why) = a.skipped {
                return SideResult::skipped(a.kind, why);
            }
            let how = match a.strategy {
                Some(Strategy::PerFile) => Some(a.methods.to_string()),
                Some(s) => Some(s.as_str().to_string()),
                None => None,
            };
            SideResult {
                side: a.kind,
                skipped: None,
                times: Some(a.samples.finish()),
                speedup_visible: None,
                speedup_complete: None,
                prepare_ms: a.prepare_ms,
                how,
                shared_extents_verified: a.sharing.verified(),
                notes: if a.sharing == Sharing::Inline {
                    vec!["data inline in metadata (FIEMAP): no extents to share".into()]
                } else {
                    Vec::new()
                },
            }
        })
        .collect();
    let base = sides[0].times.clone().expect("the baseline always runs");
    for s in &mut sides {
        if let Some(t) = &s.times {
            s.speedup_visible = Some(base.visible_median_ms / t.visible_median_ms);
            s.speedup_complete = Some(base.complete_median_ms / t.complete_median_ms);
        }
    }
    let get = |k: SideKind| sides.iter().find(|s| s.side == k);
    let times = |k: SideKind| get(k).and_then(|s| s.times.clone());
    let treatment = get(SideKind::PerFile).filter(|s| s.times.is_some());
    let (treatment_times, floor, cp) = (
        times(SideKind::PerFile),
        times(SideKind::Floor),
        times(SideKind::Cp),
    );
    ShapeResult {
        shape: shape.name.into(),
        files: shape.files,
        bytes: shape.bytes(),
        speedup_visible: treatment.and_then(|t| t.speedup_visible),
        speedup_complete: treatment.and_then(|t| t.speedup_complete),
        ceiling_visible: get(SideKind::Floor).and_then(|s| s.speedup_visible),
        cp_speedup: cp.as_ref().zip(treatment_times.as_ref()).map(|(c, t)| {
            [
                c.visible_median_ms / t.visible_median_ms,
                c.complete_median_ms / t.complete_median_ms,
            ]
        }),
        treatment_method: methods.dominant(),
        treatment_methods: methods,
        shared_extents_verified: treatment.and_then(|t| t.shared_extents_verified),
        baseline: base,
        treatment: treatment_times,
        floor,
        cp,
        sides,
    }
}
