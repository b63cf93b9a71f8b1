//! Developer shortcut without the CLI: `cargo run -p zygote-images --example build -- kernel|<image>...`
fn main() {
    let mut progress = |line: &str| eprintln!("  {line}");
    for what in std::env::args().skip(1) {
        let result = if what == "kernel" {
            zygote_images::build_kernel(&mut progress).map(|k| format!("{k:#?}"))
        } else {
            zygote_images::build_image(&what, &mut progress).map(|i| format!("{i:#?}"))
        };
        match result {
            Ok(info) => println!("{info}"),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}
