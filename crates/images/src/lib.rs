//! Guest kernels and root filesystem images for zygote.
//!
//! - [`build_kernel`]: runs `guest/kernel/build.sh` (Debian's linux-source-6.1
//!   + `guest/kernel/zygote.config`), cached under `<cache>/kernel/<key>/`.
//! - [`build_image`]: builds the ext4 image described by
//!   `guest/rootfs/recipes/<name>.recipe` (format: [`recipe`]) with the static
//!   agent as `/sbin/zygote-agent`, stored content-addressed in
//!   `<cache>/images/` (layout: [`store`]).
//! - [`list_images`] / [`locate_image`]: what is built, without building.
//!
//! `<cache>` is `$ZYGOTE_CACHE_DIR` or `~/.cache/zygote`. Progress is reported
//! as human-readable lines through a caller-supplied callback.
pub mod accounts;
mod agent;
mod debootstrap;
mod error;
mod exec;
mod kernel;
mod overlay;
pub mod pack;
pub mod paths;
pub mod recipe;
mod rootfs;
pub mod space;
pub mod store;

pub use agent::{build_agent, cargo_build_bin, AGENT_TARGET};
pub use error::{ImageError, Result};
pub use exec::Progress;
pub use kernel::{build_kernel, kernel_info, KernelInfo};
pub use paths::cache_dir;
pub use recipe::{find_recipe, list_recipes, Recipe};
pub use rootfs::{build_image, build_image_with, BuildOptions, AGENT_GUEST_PATH};
pub use store::{
    find_by_sha256, list_images, locate_image, prune_images, remove_image, sha256_file, ImageInfo,
    OciOrigin, RunConfig,
};

/// sha256 of a byte string, lowercase hex.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}
