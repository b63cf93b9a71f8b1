//! Materialize one tree from the command line and print the report, for
//! profiling and poking at filesystems by hand:
//! `cargo run --release -p zygote-treeclone --example materialize -- SRC DST [auto|reflink|hardlink|copy] [THREADS]`
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: materialize SRC DST [auto|reflink|hardlink|copy] [THREADS]");
        std::process::exit(2);
    }
    let mut opts = zygote_treeclone::Options::default();
    if let Some(m) = args.get(2) {
        opts.method = m.parse().unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
    }
    if let Some(t) = args.get(3) {
        opts.threads = t.parse().expect("THREADS must be a number");
    }
    match zygote_treeclone::materialize(&PathBuf::from(&args[0]), &PathBuf::from(&args[1]), &opts) {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
