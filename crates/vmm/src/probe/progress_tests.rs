use super::*;
use crate::memory::{host_total_mib, GuestRam, MIN_MEM_MIB};
use vm_memory::{Bytes, GuestAddress};

fn ram() -> std::sync::Arc<GuestRam> {
    GuestRam::new(MIN_MEM_MIB, host_total_mib()).expect("map guest RAM")
}

fn set_heartbeat(ram: &GuestRam, v: u64) {
    ram.memory()
        .write_obj(
            v,
            GuestAddress(abi::MAILBOX_GPA + abi::MAILBOX_OFF_HEARTBEAT),
        )
        .unwrap();
}

#[test]
fn progress_is_a_heartbeat_larger_than_the_first_one_read() {
    let ram = ram();
    set_heartbeat(&ram, 41);
    let start = mono_ns();
    let writer = {
        let ram = ram.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            set_heartbeat(&ram, 47);
        })
    };
    let p = wait_for_progress(&ram, Duration::from_secs(10)).expect("progress");
    writer.join().unwrap();
    assert_eq!((p.before, p.after), (41, 47));
    // It waited for the writer: at least most of its 30 ms sleep.
    assert!(p.since(start) >= Duration::from_millis(20), "{p:?}");
}

#[test]
fn a_heartbeat_that_does_not_move_or_goes_back_is_a_stall() {
    let ram = ram();
    set_heartbeat(&ram, 9);
    let err = wait_for_progress(&ram, Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(err, ProbeError::Stalled { heartbeat: 9, .. }),
        "{err}"
    );
    // Going backwards (e.g. a guest that restarted) is not progress either. The first
    // read is taken here, so that no thread's timing decides which value it saw.
    let before = heartbeat(&ram).unwrap();
    set_heartbeat(&ram, 3);
    let err = wait_beyond(&ram, before, Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(err, ProbeError::Stalled { heartbeat: 9, .. }),
        "{err}"
    );
}

#[test]
fn board_slots_survive_fork_and_report_each_outcome() {
    let board = ProgressBoard::new(3).unwrap();
    assert_eq!(board.len(), 3);
    let proven = Progress {
        before: 5,
        after: 6,
        seen_mono_ns: 1234,
    };
    // SAFETY: the child only stores to the shared mapping and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        board.post(1, &Ok(proven));
        // SAFETY: leave the forked test process at once.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0);
    // SAFETY: reaping our child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    board.post(
        2,
        &Err(ProbeError::Stalled {
            heartbeat: 77,
            waited: Duration::from_secs(1),
        }),
    );
    // Slot 0 never posts: collect gives up at the deadline.
    let t = Instant::now();
    let got = board.collect(t + Duration::from_millis(30), Duration::from_millis(5));
    assert!(t.elapsed() >= Duration::from_millis(30));
    assert_eq!(
        got,
        vec![
            None,
            Some(Posted::Proven(proven)),
            Some(Posted::Stalled { heartbeat: 77 })
        ]
    );
    board.post(0, &Err(ProbeError::Mailbox("x".into())));
    let t = Instant::now();
    let got = board.collect(t + Duration::from_secs(10), Duration::from_millis(5));
    assert_eq!(got[0], Some(Posted::Unreadable));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "returns once all posted"
    );
    board.clear();
    assert!((0..3).all(|i| board.get(i).is_none()));
}
