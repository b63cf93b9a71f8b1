//! A bounded, seeded stand-in for the cargo-fuzz target: many random layers (see
//! `generate.rs`) applied next to a sentinel, checked against the properties of
//! [`FuzzReport::check`]. `ZYGOTE_FUZZ_ITERS` raises the iteration count (scripts/fuzz.sh
//! scales it to a time budget); `ZYGOTE_FUZZ_SEED` picks another seed.
use super::*;

fn iterations() -> u64 {
    std::env::var("ZYGOTE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn seed() -> u64 {
    std::env::var("ZYGOTE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5a59_474f_5445_0033)
}

#[test]
fn random_layers_stay_inside_the_root_and_within_the_limits() {
    let mut seeds = Seeded::new(seed());
    let (mut applied, mut refused) = (0u64, 0u64);
    let iterations = iterations();
    for i in 0..iterations {
        let s = seeds.next();
        let report = fuzz_seed(s);
        if let Err(broken) = report.check() {
            panic!("iteration {i}, seed {s}: {broken}");
        }
        match report.outcome {
            Ok(()) => applied += 1,
            Err(_) => refused += 1,
        }
    }
    eprintln!("layer fuzzing: {iterations} runs, {applied} applied, {refused} refused");
    // Random layers that were all refused would test the error paths only.
    assert!(
        applied * 20 >= iterations,
        "only {applied} of {iterations} runs applied"
    );
}

#[test]
fn fuzzer_bytes_drive_the_generator_or_are_one_raw_layer() {
    // The same bytes, the same layers.
    let a = generate::layers(&mut FuzzBytes::new(b"0123456789abcdef"), "/x");
    let b = generate::layers(&mut FuzzBytes::new(b"0123456789abcdef"), "/x");
    assert_eq!(a, b);
    // Short and empty inputs still make layers (decisions past the end are zeros).
    assert!(!generate::layers(&mut FuzzBytes::new(b""), "/x").is_empty());
    let raw = fuzz_apply(&[0xff, 1, 2, 3]);
    assert_eq!(raw.layers, 1);
    assert!(raw.outcome.is_err(), "three bytes are no tar stream");
    raw.check().unwrap();
}

#[test]
fn the_listing_sees_every_change_outside_the_root_and_none_inside() {
    // The oracle itself must be able to fail.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let sentinel = dir.path().join("sentinel");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(sentinel.join("sub")).unwrap();
    std::fs::write(sentinel.join("keep"), b"1234").unwrap();
    std::fs::write(sentinel.join("sub/keep2"), b"x").unwrap();
    let before = listing(dir.path(), &root);
    std::fs::write(root.join("inside"), b"fine").unwrap();
    assert_eq!(listing(dir.path(), &root), before, "inside the root");
    let changes: [&dyn Fn(); 3] = [
        &|| std::fs::write(sentinel.join("keep"), b"abcd").unwrap(),
        &|| std::fs::remove_file(sentinel.join("sub/keep2")).unwrap(),
        &|| std::fs::write(dir.path().join("escaped"), b"").unwrap(),
    ];
    let mut last = before;
    for change in changes {
        change();
        let now = listing(dir.path(), &root);
        assert_ne!(now, last);
        last = now;
    }
}
