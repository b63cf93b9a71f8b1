//! Embeds the web console's built assets (`console/dist`, made by `npm run build` there;
//! `make build` runs it first) into the daemon: writes `$OUT_DIR/console_assets.rs` with
//! one `include_bytes!` per file. Without `console/dist/index.html` the list is empty and
//! the daemon serves a page saying the console was not built (`src/ui/mod.rs`).
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let console = manifest.join("../../console");
    let dist = console.join("dist");
    let mut files = Vec::new();
    if dist.join("index.html").is_file() {
        println!("cargo:rerun-if-changed={}", dist.display());
        collect(&dist, &mut files);
    } else {
        // Watching a path that does not exist would rerun this script (and rebuild the
        // daemon) on every build; the console directory exists and changes when dist is
        // made. A checkout without it has nothing to watch.
        if console.is_dir() {
            println!("cargo:rerun-if-changed={}", console.display());
        }
        println!("cargo:rerun-if-changed=build.rs");
    }
    files.sort();
    let mut code = String::from("pub static ASSETS: &[(&str, &[u8])] = &[\n");
    for file in &files {
        let rel = file.strip_prefix(&dist).expect("under dist");
        let rel = rel.to_str().expect("asset names are UTF-8");
        code.push_str(&format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            file.display().to_string()
        ));
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("console_assets.rs"), code).expect("writing console_assets.rs");
}

/// Every file under `dir`, recursively.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}
