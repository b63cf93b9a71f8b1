//! The probe guest drives virtio-blk by polling: CoW root image, persistent data disk,
//! read-only disk.
mod devices_support;

use std::sync::{Arc, Mutex};

use devices_support::{line_with, probe_elf, run_scenario};
use zygote_probe_abi as abi;
use zygote_vmm::devices::virtio::block::{Block, BlockConfig};

const IMAGE_BYTES: usize = 1 << 20;

/// An image whose sector 0 holds the probe's expected pattern; the rest is filler.
fn make_image(path: &std::path::Path) -> Vec<u8> {
    let mut data = vec![0x33u8; IMAGE_BYTES];
    for w in 0..64u64 {
        let at = 8 * w as usize;
        data[at..at + 8].copy_from_slice(&abi::blk_base_word(w).to_le_bytes());
    }
    std::fs::write(path, &data).unwrap();
    data
}

fn expected_written() -> Vec<u8> {
    let mut v = Vec::new();
    for s in 0..abi::BLK_WRITE_SECTORS {
        for w in 0..64 {
            v.extend_from_slice(&abi::blk_write_word(abi::BLK_WRITE_FIRST + s, w).to_le_bytes());
        }
    }
    v
}

#[test]
fn probe_writes_to_a_cow_root_image_without_touching_the_base() {
    let Some(elf) = probe_elf("probe_writes_to_a_cow_root_image_without_touching_the_base") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("root.img");
    let before = make_image(&path);
    let dev = Arc::new(Mutex::new(Block::open(BlockConfig::cow(&path)).unwrap()));
    let t = run_scenario(&elf, "blk", vec![dev.clone()]).unwrap_or_else(|t| panic!("{t:#?}"));
    let line = line_with(&t, "check blk ok").expect("blk check line");
    assert!(line.contains("capacity=2048 ro=0 wrote=8"), "{line}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "base image unchanged"
    );
    let dev = dev.lock().unwrap();
    // 8 sectors from sector 1 live in page 0 and page 1 of the disk.
    assert_eq!(dev.private_bytes(), 2 * 4096);
    let state = dev.save_state();
    assert_eq!(state.overlay_pages, vec![0, 1]);
    assert!(state.virtio.activated);
    assert!(
        state.virtio.queues[0].next_used >= 5,
        "{:?}",
        state.virtio.queues
    );
    let mut overlay = Vec::new();
    dev.write_overlay(&state, &mut overlay).unwrap();
    let first = abi::BLK_WRITE_FIRST as usize * 512;
    let want = expected_written();
    assert_eq!(&overlay[first..first + want.len()], &want[..]);
}

#[test]
fn probe_writes_reach_a_persistent_data_disk() {
    let Some(elf) = probe_elf("probe_writes_reach_a_persistent_data_disk") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.img");
    make_image(&path);
    let dev = Arc::new(Mutex::new(
        Block::open(BlockConfig::persistent(&path)).unwrap(),
    ));
    let t = run_scenario(&elf, "blk", vec![dev.clone()]).unwrap_or_else(|t| panic!("{t:#?}"));
    assert!(
        line_with(&t, "check blk ok capacity=2048 ro=0 wrote=8").is_some(),
        "{t:#?}"
    );
    let file = std::fs::read(&path).unwrap();
    let first = abi::BLK_WRITE_FIRST as usize * 512;
    let want = expected_written();
    assert_eq!(&file[first..first + want.len()], &want[..]);
    assert_eq!(dev.lock().unwrap().private_bytes(), 0);
}

#[test]
fn probe_sees_a_read_only_disk_refuse_writes() {
    let Some(elf) = probe_elf("probe_sees_a_read_only_disk_refuse_writes") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.img");
    let before = make_image(&path);
    let cfg = BlockConfig {
        read_only: true,
        ..BlockConfig::persistent(&path)
    };
    let dev = Arc::new(Mutex::new(Block::open(cfg).unwrap()));
    let t = run_scenario(&elf, "blk", vec![dev]).unwrap_or_else(|t| panic!("{t:#?}"));
    assert!(
        line_with(&t, "check blk ok capacity=2048 ro=1 wrote=0").is_some(),
        "{t:#?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
