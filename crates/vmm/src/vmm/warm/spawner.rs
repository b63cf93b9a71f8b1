//! The spawner's side: build the VM ahead, wait for the branch, become the child.
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::wire::{self, Go};
use super::{Payload, SpawnerSetup};
use crate::vmm::branch::{
    exit_now, join_cgroup, join_netns, unowned_persistent_disk, ChildContext,
};
use crate::vmm::ready::{self, ReadyRecord};
use crate::vmm::{PrebuiltVm, RestoreConfig, Vmm, VmmError};

impl Vmm {
    /// Runs in a freshly forked spawner (single-threaded): never returns.
    pub(super) fn become_warm_spawner(
        &mut self,
        sock: UnixStream,
        setup: &SpawnerSetup,
        parent: libc::pid_t,
    ) -> ! {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A waiting spawner dies with its VMM; once it runs a VM of its own it does
            // not (as a fork-path child). Re-check the parent to close the race.
            // SAFETY: plain prctl and getppid.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if unsafe { libc::getppid() } != parent {
                return 1;
            }
            self.release_parent_objects(sock.as_raw_fd(), &setup.keep_fds);
            let vcpus = self.vcpus.len();
            let built =
                join_cgroup(setup.cgroup.clone()).and_then(|()| PrebuiltVm::new(&self.ram, vcpus));
            let prebuilt = match built {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("zygote: warm spawner: building its VM: {e}");
                    return 1;
                }
            };
            if (&sock).write_all(&[wire::BUILT]).is_err() {
                return 1;
            }
            let (go, mut fds) = match wire::recv_go(&sock) {
                Ok(Some(m)) => m,
                Ok(None) => return 0, // dropped by its VMM
                Err(e) => {
                    eprintln!("zygote: warm spawner: reading the branch: {e}");
                    return 1;
                }
            };
            let t = Instant::now();
            let verifying = go.witness_device_data.is_some();
            let mismatches = match verifying.then(|| fds.pop()).flatten() {
                Some(w) => match wire::count_mismatches(&self.ram, &w) {
                    Ok(n) => n,
                    Err(e) => {
                        eprintln!("zygote: warm spawner: comparing with the witness: {e}");
                        return 1;
                    }
                },
                None => 0,
            };
            self.become_warm_child(prebuilt, go, fds, setup, sock, (t, mismatches))
        }));
        exit_now(code.unwrap_or(101))
    }

    /// Restore the branch's state into the built VM, report, run the child main.
    fn become_warm_child(
        &mut self,
        prebuilt: PrebuiltVm,
        go: Go,
        fds: Vec<std::os::fd::OwnedFd>,
        setup: &SpawnerSetup,
        sock: UnixStream,
        (t, mismatches): (Instant, u64),
    ) -> i32 {
        let mut payload = Payload {
            bytes: go.payload,
            fds,
        };
        let child = (setup.child)(&mut payload);
        let mut mismatches = mismatches;
        let result = match unowned_persistent_disk(&go.state, &child.devices) {
            Some(id) => Err(VmmError::Device(format!(
                "no file of its own for the persistent disk {id:?}: it would write into the \
                 parent's"
            ))),
            None => join_cgroup(child.cgroup).and_then(|()| join_netns(child.netns)),
        }
        // Its devices are the parent's as of its fork: bring their disks up to date,
        // then it is where a fork-path child starts (see `inherit`).
        .and_then(|()| self.mark_disk_pages(&go.disk_pages))
        .and_then(|()| {
            let inherited_disks = self.inherited_disks(&go.state, &child.devices);
            let device_data = self
                .private_data_not_inherited(&inherited_disks)
                .map_err(|e| VmmError::Device(format!("reading device data: {e}")))?;
            if let Some(witness) = &go.witness_device_data {
                mismatches += self.disk_mismatches(&go.state, &inherited_disks, witness);
            }
            let cfg = RestoreConfig {
                serial_out: child.serial,
                start_paused: false,
                device_host: child.devices,
                device_data,
                inherited_disks,
            };
            Vmm::restore_prebuilt(prebuilt, self.ram.clone(), &go.state, cfg)
        });
        if result.is_ok() {
            // SAFETY: plain prctl: running, it is a VM of its own.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, 0) };
        }
        ReadyRecord {
            index: 0,
            status: if result.is_ok() { 0 } else { 1 },
            // SAFETY: getpid cannot fail.
            pid: unsafe { libc::getpid() },
            restore_ns: t.elapsed().as_nanos() as u64,
            ready_mono_ns: ready::mono_ns(),
            mismatches: mismatches.min(u64::from(u32::MAX)) as u32,
        }
        .send(sock.as_raw_fd());
        drop(sock);
        match result {
            Ok(vmm) => (setup.child_main)(ChildContext { index: 0, vmm }, payload),
            Err(e) => {
                eprintln!("zygote: warm branch child: {e}");
                1
            }
        }
    }
}
