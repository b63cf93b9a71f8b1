//! `zygote image build|pull|import|ls|rm|prune|kernel`: guest images and the guest kernel.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use zygote_images::{BuildOptions, ImageInfo};

#[derive(clap::Subcommand)]
pub enum ImageCommand {
    /// Build an image from its recipe (guest/rootfs/recipes/<NAME>.recipe, or a
    /// path to a .recipe file), and the guest kernel if needed. Cached:
    /// unchanged inputs return at once.
    Build(BuildArgs),
    /// Pull an OCI image from a registry and convert it (cached by manifest digest;
    /// layers shared between images are downloaded once).
    Pull(super::image_pull::PullArgs),
    /// Import an OCI image layout (directory or tar) or a `docker save` archive.
    Import(super::image_pull::ImportArgs),
    /// List built and pulled images (and recipes not built yet).
    Ls(LsArgs),
    /// Build the guest kernel (cached) and print the path of its vmlinux.
    Kernel,
    /// Delete an image: NAME (what its last build or pull gave), NAME-SHA256 or a sha256
    /// prefix; layers no other image uses are deleted too.
    Rm { image: String },
    /// Delete every image except the one each name means (its last build or pull), and
    /// layers no image uses.
    Prune,
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// Recipe name (e.g. minimal, python) or path to a .recipe file.
    name: String,
    /// Rebuild even if an image with the same inputs exists.
    #[arg(long)]
    force: bool,
    /// Re-run debootstrap instead of reusing the cached Debian tree.
    #[arg(long)]
    refresh_base: bool,
    /// Print the image's metadata as JSON instead of its path.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct LsArgs {
    /// Machine-readable output (a JSON array of image metadata).
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: ImageCommand) -> anyhow::Result<i32> {
    match cmd {
        ImageCommand::Build(args) => build(args),
        ImageCommand::Pull(args) => super::image_pull::pull(args),
        ImageCommand::Import(args) => super::image_pull::import(args),
        ImageCommand::Ls(args) => ls(args),
        ImageCommand::Kernel => kernel(),
        ImageCommand::Rm { image } => {
            let info = match zygote_oci::find_local(&image)? {
                Some(found) => {
                    zygote_images::remove_image(&format!("{}-{}", found.name, found.sha256))?
                }
                None => zygote_images::remove_image(&image)?,
            };
            eprintln!("removed {}", info.path.display());
            let layers = zygote_oci::prune_blobs()?;
            if layers > 0 {
                eprintln!("{} of unused layers removed", human_bytes(layers));
            }
            Ok(0)
        }
        ImageCommand::Prune => {
            let removed = zygote_images::prune_images()?;
            let freed: u64 =
                removed.iter().map(|i| i.disk_bytes).sum::<u64>() + zygote_oci::prune_blobs()?;
            for info in &removed {
                eprintln!("removed {}", info.path.display());
            }
            eprintln!(
                "{} image(s) removed, {} freed",
                removed.len(),
                human_bytes(freed)
            );
            Ok(0)
        }
    }
}

fn build(args: BuildArgs) -> anyhow::Result<i32> {
    let opts = BuildOptions {
        force: args.force,
        refresh_base: args.refresh_base,
    };
    let started = Instant::now();
    // An image is only bootable with the kernel: make `image build` enough to
    // `zygote run` afterwards without another long wait.
    let kernel = with_progress("building the guest kernel", zygote_images::build_kernel)
        .context("building the guest kernel")?;
    eprintln!("kernel {} ({})", kernel.release, kernel.vmlinux.display());
    let info = with_progress(&format!("building image {}", args.name), |progress| {
        zygote_images::build_image_with(&args.name, &opts, progress)
    })
    .with_context(|| format!("building image {}", args.name))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        eprintln!(
            "image {} sha256:{} ({} on disk) in {:.1}s",
            info.name,
            &info.sha256[..16],
            human_bytes(info.disk_bytes),
            started.elapsed().as_secs_f64()
        );
        println!("{}", info.path.display());
    }
    Ok(0)
}

fn kernel() -> anyhow::Result<i32> {
    let info = with_progress("building the guest kernel", zygote_images::build_kernel)
        .context("building the guest kernel")?;
    eprintln!(
        "kernel {} (linux-source-6.1 {}), cache key {}",
        info.release,
        info.package_version,
        &info.key[..16]
    );
    println!("{}", info.vmlinux.display());
    Ok(0)
}

fn ls(args: LsArgs) -> anyhow::Result<i32> {
    let images = zygote_images::list_images()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&images)?);
        return Ok(0);
    }
    print!("{}", render_table(&images, zygote_api::time::now()));
    let built: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
    let unbuilt: Vec<String> = zygote_images::list_recipes()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| !built.contains(&n.as_str()))
        .collect();
    if !unbuilt.is_empty() {
        eprintln!(
            "recipes not built yet: {} (zygote image build NAME)",
            unbuilt.join(", ")
        );
    }
    Ok(0)
}

fn render_table(images: &[ImageInfo], now: u64) -> String {
    let mut rows = vec![[
        "NAME".to_string(),
        "SHA256".to_string(),
        "SIZE".to_string(),
        "ON DISK".to_string(),
        "BUILT".to_string(),
        "SOURCE".to_string(),
    ]];
    for i in images {
        rows.push([
            i.name.clone(),
            i.sha256.chars().take(12).collect(),
            human_bytes(i.size_bytes),
            human_bytes(i.disk_bytes),
            ago(now.saturating_sub(i.built_at)),
            match &i.oci {
                Some(o) => o.reference.clone(),
                None => i.base.clone(),
            },
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Runs `f` with a progress callback: a spinner showing the latest line on a
/// terminal, with every line also printed above it; plain lines otherwise.
pub(crate) fn with_progress<T, E>(
    title: &str,
    f: impl FnOnce(&mut dyn FnMut(&str)) -> Result<T, E>,
) -> Result<T, E> {
    let started = Instant::now();
    if !std::io::stderr().is_terminal() {
        return f(&mut |line| eprintln!("  {line}"));
    }
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{elapsed}] {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    spinner.set_prefix(title.to_string());
    spinner.enable_steady_tick(Duration::from_millis(120));
    let result = f(&mut |line| {
        spinner.println(format!("  {line}"));
        spinner.set_message(line.to_string());
    });
    spinner.finish_and_clear();
    if result.is_ok() && started.elapsed() > Duration::from_secs(2) {
        eprintln!("{title}: done in {:.1}s", started.elapsed().as_secs_f64());
    }
    result
}

pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn ago(secs: u64) -> String {
    match secs {
        0..=59 => format!("{secs}s ago"),
        60..=3599 => format!("{}m ago", secs / 60),
        3600..=86399 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes_and_ages() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(human_bytes(2 << 30), "2.0 GiB");
        assert_eq!(ago(5), "5s ago");
        assert_eq!(ago(125), "2m ago");
        assert_eq!(ago(7200), "2h ago");
        assert_eq!(ago(3 * 86400), "3d ago");
    }

    #[test]
    fn table_aligns_columns() {
        let info = ImageInfo {
            name: "minimal".into(),
            sha256: "0123456789abcdef".repeat(4),
            path: "/c/minimal.ext4".into(),
            size_bytes: 256 << 20,
            disk_bytes: 3 << 20,
            recipe_key: "k".into(),
            recipe_path: "/r".into(),
            description: String::new(),
            base: "busybox-static 1.35".into(),
            agent_sha256: "a".into(),
            built_at: 1000,
            build_secs: 1.0,
            oci: None,
        };
        let table = render_table(&[info], 1060);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("NAME     SHA256"), "{table}");
        assert!(lines[1].starts_with("minimal  0123456789ab"), "{table}");
        assert!(lines[1].contains("256.0 MiB"));
        assert!(lines[1].contains("1m ago"));
        let col = lines[0].find("SOURCE").unwrap();
        assert_eq!(&lines[1][col..], "busybox-static 1.35");
    }
}
