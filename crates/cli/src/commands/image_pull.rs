//! `zygote image pull|import`: OCI images into the local image store, with a progress
//! bar per layer on a terminal (plain lines otherwise).
use std::collections::HashMap;
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use zygote_images::ImageInfo;
use zygote_oci::{Event, ImportOptions, LayerState, PullOptions, Transport};

#[derive(clap::Args)]
pub struct PullArgs {
    /// Image reference: alpine:3.20, registry.example:5000/team/app:1.4, app@sha256:...
    reference: String,
    /// Registry username (the password is read from stdin: --password-stdin); without
    /// it, credentials come from ~/.docker/config.json (or $DOCKER_CONFIG).
    #[arg(long, short = 'u', requires = "password_stdin")]
    username: Option<String>,
    /// Read the registry password from stdin.
    #[arg(long, requires = "username")]
    password_stdin: bool,
    /// Reach this registry over plain HTTP (loopback registries always are); repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    insecure_registries: Vec<String>,
    /// Refuse a layer larger than this (compressed).
    #[arg(long, value_name = "MIB", default_value_t = 16384)]
    max_layer_mib: u64,
    /// The ext4 image's size (sparse); default: what the tree needs plus 1 GiB free.
    #[arg(long, value_name = "MIB")]
    size_mib: Option<u64>,
    /// Convert again even if this image was converted before.
    #[arg(long)]
    force: bool,
    /// Print the image's metadata as JSON instead of its path.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// An OCI image layout (directory or tar) or a `docker save` archive.
    path: PathBuf,
    /// Store it under this name (default: the archive's own, else localhost/<file>:<tag>).
    #[arg(long)]
    name: Option<String>,
    /// Which image of an archive holding several (a tag).
    #[arg(long)]
    tag: Option<String>,
    #[arg(long, value_name = "MIB")]
    size_mib: Option<u64>,
    #[arg(long)]
    json: bool,
}

pub fn pull(args: PullArgs) -> anyhow::Result<i32> {
    let credentials = match &args.username {
        Some(user) => {
            let mut password = String::new();
            std::io::stdin()
                .read_to_string(&mut password)
                .context("reading the password from stdin")?;
            Some((
                user.clone(),
                password.trim_end_matches(['\n', '\r']).to_string(),
            ))
        }
        None => None,
    };
    let mut transport = Transport::from_env();
    transport.insecure.extend(args.insecure_registries.clone());
    let mut opts = PullOptions {
        credentials,
        transport,
        ..Default::default()
    };
    opts.limits.max_layer_bytes = args.max_layer_mib << 20;
    opts.convert.size_mib = args.size_mib;
    opts.convert.force = args.force;
    let started = Instant::now();
    let info = pull_with_progress(&args.reference, &opts)
        .with_context(|| format!("pulling {}", args.reference))?;
    report(&info, args.json, started)
}

/// Pulls on a runtime of its own, showing progress on stderr.
pub(crate) fn pull_with_progress(reference: &str, opts: &PullOptions) -> anyhow::Result<ImageInfo> {
    let view = Progress::new();
    let sink = view.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(zygote_oci::pull(
        reference,
        opts,
        Arc::new(move |e| sink.event(e)),
    ));
    view.finish();
    Ok(result?)
}

pub fn import(args: ImportArgs) -> anyhow::Result<i32> {
    let mut opts = ImportOptions {
        name: args.name.clone(),
        tag: args.tag.clone(),
        ..Default::default()
    };
    opts.convert.size_mib = args.size_mib;
    let started = Instant::now();
    let view = Progress::new();
    let sink = view.clone();
    let result = zygote_oci::import(&args.path, &opts, &move |e| sink.event(e));
    view.finish();
    let info = result.with_context(|| format!("importing {}", args.path.display()))?;
    report(&info, args.json, started)
}

fn report(info: &ImageInfo, json: bool, started: Instant) -> anyhow::Result<i32> {
    if json {
        println!("{}", serde_json::to_string_pretty(info)?);
        return Ok(0);
    }
    let digest = info
        .oci
        .as_ref()
        .map(|o| o.manifest_digest.as_str())
        .unwrap_or("");
    eprintln!(
        "{} ({digest}): sha256:{} in {:.1}s",
        info.name,
        &info.sha256[..16],
        started.elapsed().as_secs_f64()
    );
    println!("{}", info.path.display());
    Ok(0)
}

/// Bars per layer on a terminal; otherwise a line per finished layer and step.
#[derive(Clone)]
struct Progress {
    inner: Arc<Mutex<View>>,
}

struct View {
    multi: Option<MultiProgress>,
    bars: HashMap<usize, ProgressBar>,
    status: Option<ProgressBar>,
}

impl Progress {
    fn new() -> Progress {
        let tty = std::io::stderr().is_terminal();
        let multi = tty.then(MultiProgress::new);
        let status = multi.as_ref().map(|m| {
            let s = m.add(ProgressBar::new_spinner());
            s.enable_steady_tick(std::time::Duration::from_millis(120));
            s
        });
        Progress {
            inner: Arc::new(Mutex::new(View {
                multi,
                bars: HashMap::new(),
                status,
            })),
        }
    }

    fn event(&self, e: Event) {
        let mut v = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(multi) = v.multi.clone() else {
            match e {
                Event::Resolved {
                    reference,
                    digest,
                    layers,
                    bytes,
                } => eprintln!("  {reference}: {digest}, {layers} layers, {}", mib(bytes)),
                Event::Layer {
                    index,
                    digest,
                    total,
                    state: state @ (LayerState::Done | LayerState::Cached),
                    ..
                } => eprintln!(
                    "  layer {index} {} {}: {state:?}",
                    short(&digest),
                    mib(total)
                ),
                Event::Layer {
                    index,
                    done,
                    state: LayerState::Resuming,
                    ..
                } => eprintln!("  layer {index}: resuming after {}", mib(done)),
                Event::Layer { .. } => {}
                Event::Step { message } => eprintln!("  {message}"),
            }
            return;
        };
        match e {
            Event::Resolved {
                reference, digest, ..
            } => {
                let _ = multi.println(format!("{reference}: {digest}"));
            }
            Event::Layer {
                index,
                digest,
                done,
                total,
                state,
            } => {
                let bar = v.bars.entry(index).or_insert_with(|| {
                    let b = multi.add(ProgressBar::new(total));
                    b.set_style(
                        ProgressStyle::with_template(
                            "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    );
                    b.set_prefix(format!("layer {index} {}", short(&digest)));
                    b
                });
                bar.set_position(done);
                match state {
                    LayerState::Done => bar.finish_with_message("done"),
                    LayerState::Cached => bar.finish_with_message("already here"),
                    LayerState::Resuming => bar.set_message("resuming"),
                    LayerState::Downloading => {}
                }
            }
            Event::Step { message } => {
                if let Some(s) = &v.status {
                    s.set_message(message);
                }
            }
        }
    }

    fn finish(&self) {
        let mut v = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = v.status.take() {
            s.finish_and_clear();
        }
    }
}

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}
