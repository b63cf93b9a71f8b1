//! The kvm runtime's device set on a real Linux guest: the `minimal` image as a
//! copy-on-write root disk, vsock to the in-guest agent (exec, files), virtio-rng.
//! Needs hardware virtualization; elsewhere it skips with the reason printed.
mod linux_support;

use linux_support::{agent, boot_minimal, sh_ok};

#[test]
fn minimal_image_boots_with_cow_root_and_vsock_agent() {
    if !zygote_vmm::host::linux_guests_or_skip("minimal_image_boots_with_cow_root_and_vsock_agent")
    {
        return;
    }
    let image = linux_support::minimal_image();
    let dir = tempfile::tempdir().unwrap();
    let vm = boot_minimal(dir.path(), 2, 512);
    let a = agent(&vm.vsock);

    // The agent is PID 1 on the CoW root disk; the guest sees both vCPUs.
    assert_eq!(sh_ok(&a, "cat /proc/1/comm"), "zygote-agent");
    assert_eq!(sh_ok(&a, "grep -c ^processor /proc/cpuinfo"), "2");
    assert_eq!(
        sh_ok(&a, "awk '$2 == \"/\" {print $1, $3}' /proc/mounts"),
        "/dev/root ext4"
    );
    // virtio-rng is the kernel's hardware RNG.
    assert_eq!(
        sh_ok(&a, "cat /sys/class/misc/hw_random/rng_current"),
        "virtio_rng.0"
    );

    // Writes land in the VM's private copy of the disk, through the page cache and down
    // to the block device (sync), never in the base image.
    a.write_file("/root/hello.txt", b"written in the guest", Some(0o644))
        .expect("write a file");
    assert_eq!(
        a.read_file("/root/hello.txt").unwrap(),
        b"written in the guest"
    );
    sh_ok(
        &a,
        "dd if=/dev/urandom of=/root/blob bs=64k count=16 2>/dev/null; sync",
    );
    assert!(
        vm.devices.root_private_bytes() >= 1 << 20,
        "the guest's writes reached the CoW disk ({} private bytes)",
        vm.devices.root_private_bytes()
    );
    a.close();
    vm.vmm.shutdown();
    linux_support::assert_image_intact(&image);
}
