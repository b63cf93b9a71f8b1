use super::request::{S_IOERR, S_OK, S_UNSUPP, T_FLUSH, T_GET_ID, T_IN, T_OUT};
use super::*;
use crate::devices::virtio::testutil::{activate_ctx, guest_mem, Driver, F_WRITE};
use crate::memory::GuestMemoryMmap;

const HDR: u64 = 0x10000;
const DATA: u64 = 0x20000;
const STATUS: u64 = 0x30000;

fn header(drv: &Driver, at: u64, kind: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    drv.write(at, &h);
}

fn active(
    mem: &GuestMemoryMmap,
    drv: &Driver,
    dev: &mut Block,
    features: u64,
) -> Arc<Mutex<BlockWorker>> {
    let (ctx, _w, _i) = activate_ctx(mem, vec![drv.queue()], features);
    dev.activate(ctx).unwrap();
    dev.active.as_ref().unwrap().0.clone()
}

fn mem_block(sectors: usize, read_only: bool) -> Block {
    let cfg = BlockConfig {
        read_only,
        id: Some("zygote-test-disk-id-longer-than-20".into()),
        ..BlockConfig::persistent("/nonexistent")
    };
    Block::with_disk(cfg, Disk::Memory(vec![0; sectors * 512]))
}

const ALL: u64 = VIRTIO_F_VERSION_1 | VIRTIO_BLK_F_FLUSH;

/// Post a request, run the worker, return (used len, status).
fn request(drv: &mut Driver, w: &Arc<Mutex<BlockWorker>>, chain: &[(u64, u32, bool)]) -> (u32, u8) {
    drv.write(STATUS, &[0xee]);
    let head = drv.add(chain);
    w.lock().unwrap().process();
    let used = drv.used();
    assert_eq!(used.len(), 1, "one completion: {used:?}");
    assert_eq!(used[0].0, u32::from(head));
    (used[0].1, drv.read(STATUS, 1)[0])
}

#[test]
fn write_read_flush_get_id_and_unsupported() {
    let mem = guest_mem(1);
    let mut drv = Driver::new(&mem, 0, 64);
    let mut dev = mem_block(64, false);
    assert_eq!(dev.capacity_sectors(), 64);
    let w = active(&mem, &drv, &mut dev, ALL);

    let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
    drv.write(DATA, &pattern);
    header(&drv, HDR, T_OUT, 3);
    // Header split over two descriptors, data over two: framing must not matter.
    let r = request(
        &mut drv,
        &w,
        &[
            (HDR, 8, false),
            (HDR + 8, 8, false),
            (DATA, 100, false),
            (DATA + 100, 924, false),
            (STATUS, 1, true),
        ],
    );
    assert_eq!(r, (1, S_OK));

    drv.write(DATA, &[0u8; 1024]);
    header(&drv, HDR, T_IN, 3);
    let r = request(
        &mut drv,
        &w,
        &[
            (HDR, 16, false),
            (DATA, 512, true),
            (DATA + 512, 512, true),
            (STATUS, 1, true),
        ],
    );
    assert_eq!(r, (1025, S_OK));
    assert_eq!(drv.read(DATA, 1024), pattern);

    header(&drv, HDR, T_FLUSH, 0);
    assert_eq!(
        request(&mut drv, &w, &[(HDR, 16, false), (STATUS, 1, true)]),
        (1, S_OK)
    );

    header(&drv, HDR, T_GET_ID, 0);
    let r = request(
        &mut drv,
        &w,
        &[(HDR, 16, false), (DATA, 32, true), (STATUS, 1, true)],
    );
    assert_eq!(r, (21, S_OK));
    assert_eq!(&drv.read(DATA, 20), b"zygote-test-disk-id-");

    header(&drv, HDR, 0x1234, 0);
    assert_eq!(
        request(&mut drv, &w, &[(HDR, 16, false), (STATUS, 1, true)]),
        (1, S_UNSUPP)
    );
    // Status byte as the last byte of a longer writable descriptor.
    header(&drv, HDR, T_FLUSH, 0);
    drv.add(&[(HDR, 16, false), (STATUS - 7, 8, true)]);
    w.lock().unwrap().process();
    assert_eq!(
        drv.used().last().unwrap().1,
        1,
        "only the status byte was written"
    );
    assert_eq!(drv.read(STATUS, 1)[0], S_OK);
}

#[test]
fn lying_chains_get_errors_never_panics() {
    let mem = guest_mem(1);
    let mut drv = Driver::new(&mem, 0, 64);
    let mut dev = mem_block(64, false);
    let w = active(&mem, &drv, &mut dev, ALL);
    let ioerr = (1, S_IOERR);

    header(&drv, HDR, T_IN, 0);
    // Header too short.
    assert_eq!(
        request(&mut drv, &w, &[(HDR, 8, false), (STATUS, 1, true)]),
        ioerr
    );
    // Data not a multiple of 512.
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[(HDR, 16, false), (DATA, 100, true), (STATUS, 1, true)]
        ),
        ioerr
    );
    // Past the end of the disk, and a sector number whose byte offset overflows.
    header(&drv, HDR, T_IN, 63);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[(HDR, 16, false), (DATA, 1024, true), (STATUS, 1, true)]
        ),
        ioerr
    );
    header(&drv, HDR, T_OUT, u64::MAX / 256);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)]
        ),
        ioerr
    );
    // Data buffer outside guest memory (read and write direction).
    header(&drv, HDR, T_IN, 0);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[
                (HDR, 16, false),
                (0x7000_0000, 512, true),
                (STATUS, 1, true)
            ]
        ),
        ioerr
    );
    header(&drv, HDR, T_OUT, 0);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[
                (HDR, 16, false),
                (u64::MAX - 100, 512, false),
                (STATUS, 1, true)
            ]
        ),
        ioerr
    );
    // Readable descriptor after a writable one.
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[
                (HDR, 16, false),
                (DATA, 512, true),
                (DATA, 512, false),
                (STATUS, 1, true)
            ]
        ),
        ioerr
    );

    // No usable status byte: dropped with used length 0, nothing written.
    for chain in [
        vec![(HDR, 16, false)],                    // status descriptor not writable
        vec![(HDR, 16, false), (STATUS, 0, true)], // zero-length status descriptor
        vec![(HDR, 16, false), (0x7000_0000, 1, true)], // status outside memory
    ] {
        let r = request(&mut drv, &w, &chain);
        assert_eq!(r, (0, 0xee), "{chain:?}");
    }

    // Lengths that overflow 32 bits: the chain walker stops, leaving no status byte.
    let r = request(
        &mut drv,
        &w,
        &[(HDR, 16, false), (DATA, u32::MAX, true), (STATUS, 1, true)],
    );
    assert_eq!(r, (0, 0xee));

    // A descriptor loop (each points at the other) and a next index past the table.
    drv.store_desc(60, HDR, 16, 1, 61);
    drv.store_desc(61, STATUS, 1, 1 | F_WRITE, 60);
    drv.publish(60);
    drv.store_desc(62, HDR, 16, 1, 9999);
    drv.publish(62);
    w.lock().unwrap().process();
    assert_eq!(drv.used().len(), 2, "both returned to the guest");
}

#[test]
fn read_only_disks_refuse_writes() {
    let mem = guest_mem(1);
    let mut drv = Driver::new(&mem, 0, 16);
    let mut dev = mem_block(8, true);
    assert_ne!(dev.features() & VIRTIO_BLK_F_RO, 0);
    let w = active(&mem, &drv, &mut dev, ALL | VIRTIO_BLK_F_RO);
    header(&drv, HDR, T_OUT, 0);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)]
        ),
        (1, S_IOERR)
    );
    header(&drv, HDR, T_IN, 0);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)]
        ),
        (513, S_OK)
    );
}

fn image(dir: &tempfile::TempDir, name: &str, bytes: usize) -> PathBuf {
    let path = dir.path().join(name);
    let data: Vec<u8> = (0..bytes).map(|i| (i / 512) as u8 ^ 0x5a).collect();
    std::fs::write(&path, data).unwrap();
    path
}

#[test]
fn cow_image_keeps_writes_private_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "base.img", 1 << 20);
    let before = std::fs::read(&path).unwrap();
    let mem = guest_mem(1);
    let mut drv = Driver::new(&mem, 0, 16);
    let mut dev = Block::open(BlockConfig::cow(&path)).unwrap();
    assert_eq!(dev.capacity_sectors(), 2048);
    let w = active(&mem, &drv, &mut dev, ALL);
    assert_eq!(dev.private_bytes(), 0);

    // Read sector 5 from the base.
    header(&drv, HDR, T_IN, 5);
    request(
        &mut drv,
        &w,
        &[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
    );
    assert_eq!(drv.read(DATA, 512), before[5 * 512..6 * 512]);
    // Overwrite sectors 7..9 (straddling pages 0 and 1) and read them back.
    drv.write(DATA, &[0xab; 1024]);
    header(&drv, HDR, T_OUT, 7);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[(HDR, 16, false), (DATA, 1024, false), (STATUS, 1, true)]
        ),
        (1, S_OK)
    );
    drv.write(DATA, &[0; 1024]);
    header(&drv, HDR, T_IN, 7);
    request(
        &mut drv,
        &w,
        &[(HDR, 16, false), (DATA, 1024, true), (STATUS, 1, true)],
    );
    assert_eq!(drv.read(DATA, 1024), vec![0xab; 1024]);

    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "base image untouched"
    );
    assert_eq!(dev.private_bytes(), 2 * PAGE);
    // The kernel may copy a larger folio than the 4 KiB written (64 KiB seen on 6.18),
    // which is why the device counts pages itself; smaps only bounds it from above.
    let smaps = disk::smaps_private_dirty(dev.cow_host_addr().unwrap()).unwrap();
    assert!(smaps >= 2 * PAGE, "smaps shows the private copies: {smaps}");

    // Save, stream the overlay, restore into a fresh device: the writes survive.
    let state = dev.save_state();
    assert_eq!(state.overlay_pages, vec![0, 1]);
    let mut overlay = Vec::new();
    dev.write_overlay(&state, &mut overlay).unwrap();
    assert_eq!(overlay.len(), 2 * PAGE as usize);
    let json = serde_json::to_string(&DeviceState::Block(state.clone())).unwrap();
    let DeviceState::Block(state2) = serde_json::from_str(&json).unwrap() else {
        panic!("wrong variant")
    };
    let restored = Block::restore(&state2, Some(&mut overlay.as_slice()), None).unwrap();
    let mut got = [0u8; 1024];
    restored
        .disk
        .lock()
        .unwrap()
        .read_at(7 * 512, &mut got)
        .unwrap();
    assert_eq!(got, [0xab; 1024]);
    assert_eq!(restored.private_bytes(), 2 * PAGE);
    assert_eq!(restored.acked_features, ALL);
}

#[test]
fn persistent_disk_writes_reach_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "data.img", 64 * 1024);
    let mem = guest_mem(1);
    let mut drv = Driver::new(&mem, 0, 16);
    let mut dev = Block::open(BlockConfig::persistent(&path)).unwrap();
    // Without FLUSH negotiated the device is write-through.
    let w = active(&mem, &drv, &mut dev, VIRTIO_F_VERSION_1);
    drv.write(DATA, &[0x11; 512]);
    header(&drv, HDR, T_OUT, 2);
    assert_eq!(
        request(
            &mut drv,
            &w,
            &[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)]
        ),
        (1, S_OK)
    );
    let file = std::fs::read(&path).unwrap();
    assert_eq!(&file[1024..1536], &[0x11; 512]);
    assert_eq!(dev.private_bytes(), 0);
    assert!(dev.save_state().overlay_pages.is_empty());
    dev.reset();
    assert!(dev.active.is_none());
}

#[test]
fn config_space_and_bad_images() {
    let dev = mem_block(16, false);
    let mut cap = [0u8; 8];
    dev.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 16);
    let mut tail = [0xffu8; 4];
    dev.read_config(6, &mut tail);
    assert_eq!(tail, [0, 0, 0, 0]);
    dev.read_config(u64::MAX, &mut tail);
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        Block::open(BlockConfig::cow(&empty)),
        Err(BlockError::Disk(DiskError::Empty(_)))
    ));
    assert!(Block::open(BlockConfig::cow(dir.path().join("missing"))).is_err());
}

/// What a warm spawner relies on: the writes since a point are recorded apart from the
/// overlay; a copy whose contents and record of written pages are brought up to date
/// is adopted; one that lacks a written page is refused, and one with an old page's
/// contents is counted.
#[test]
fn a_cow_copy_caught_up_with_recent_writes_is_adopted_and_a_stale_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "root.img", 64 * 1024);
    let source = Block::open(BlockConfig::cow(&path)).unwrap();
    let write = |dev: &Block, off: u64, byte: u8| {
        dev.disk()
            .lock()
            .unwrap()
            .write_at(off, &[byte; 512])
            .unwrap();
    };
    let page_of = |dev: &Block, p: u64| {
        let disk = dev.disk();
        let guard = disk.lock().unwrap();
        let Disk::Cow(c) = &*guard else {
            panic!("a copy-on-write disk")
        };
        c.page(p).unwrap().to_vec()
    };
    write(&source, 0, 1);
    assert_eq!(pages(source.take_recent_writes()), vec![0]);
    assert_eq!(
        source.take_recent_writes(),
        None,
        "a read clears the record"
    );

    // The "copy": the source's disk as it is now (a spawner forked here).
    let copy = Block::open(BlockConfig::cow(&path)).unwrap();
    write(&copy, 0, 1);
    copy.take_recent_writes();

    // The source goes on: rewrites page 0, writes page 3.
    write(&source, 100, 2);
    write(&source, 3 * PAGE, 3);
    let since = pages(source.take_recent_writes());
    assert_eq!(since, vec![0, 3]);
    let state = source.save_state();
    let mut whole = Vec::new();
    source.write_overlay(&state, &mut whole).unwrap();
    assert_eq!(
        copy.overlay_mismatches(&state, &whole),
        2,
        "page 0 differs, 3 missing"
    );

    // Page 3 not recorded as written: refused.
    let err = Block::adopt(&state, copy.disk()).err().expect("refused");
    assert!(
        err.to_string().contains("1 pages written, 2 saved"),
        "{err}"
    );

    // Recorded but with old contents: adoptable, and verification counts them.
    copy.mark_written(&since).unwrap();
    assert_eq!(copy.overlay_mismatches(&state, &whole), 2);
    // The contents put in from outside (here by hand), as the source does.
    for &p in &since {
        let data = page_of(&source, p);
        let disk = copy.disk();
        let mut guard = disk.lock().unwrap();
        guard.write_at(p * PAGE, &data).unwrap();
    }
    assert_eq!(copy.overlay_mismatches(&state, &whole), 0);
    let adopted = Block::adopt(&state, copy.disk()).unwrap();
    let mut got = [0u8; 512];
    adopted
        .disk()
        .lock()
        .unwrap()
        .read_at(100, &mut got)
        .unwrap();
    assert_eq!(got, [2; 512]);
    assert_eq!(
        adopted.take_recent_writes(),
        None,
        "nothing is news after adoption"
    );

    // A page outside the disk is refused, and nothing of the list is recorded.
    assert!(copy.mark_written(&[5, 1 << 40]).is_err());
    assert_eq!(copy.save_state().overlay_pages, vec![0, 3]);
}

fn pages(bitmap: Option<Vec<u64>>) -> Vec<u64> {
    let bitmap = bitmap.expect("writes recorded");
    (0..bitmap.len() as u64 * 64)
        .filter(|p| bitmap[(p / 64) as usize] & (1 << (p % 64)) != 0)
        .collect()
}
