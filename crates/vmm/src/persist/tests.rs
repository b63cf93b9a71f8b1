use super::*;

fn sample() -> VmState {
    VmState {
        memory: MemoryLayout {
            mem_mib: 256,
            ranges: vec![(0, 256 << 20)],
        },
        platform: VmPlatformState {
            pic_master: Default::default(),
            pic_slave: Default::default(),
            ioapic: Default::default(),
            pit: Default::default(),
            clock: kvm_clock_data {
                clock: 12345,
                ..Default::default()
            },
        },
        vcpus: vec![VcpuState {
            index: 0,
            cpuid: vec![kvm_cpuid_entry2 {
                function: 1,
                eax: 0x806ec,
                ..Default::default()
            }],
            mp_state: Default::default(),
            regs: kvm_regs {
                rip: 0x100_0000,
                rax: 42,
                ..Default::default()
            },
            sregs: Default::default(),
            xsave: vec![7; 1024],
            xcrs: None,
            debugregs: Default::default(),
            lapic: Default::default(),
            msrs: vec![kvm_msr_entry {
                index: 0x10,
                data: 99,
                ..Default::default()
            }],
            events: Default::default(),
        }],
        devices: DevicesState::default(),
        cmdline: "console=ttyS0".into(),
    }
}

fn cpu() -> CpuIdentity {
    CpuIdentity::from_signature("GenuineIntel".into(), 0x000806ec)
}

#[test]
fn round_trip() {
    let mut buf = Vec::new();
    sample().write_to(&mut buf, &cpu()).unwrap();
    let back = VmState::read_from(&mut buf.as_slice(), &cpu()).unwrap();
    assert_eq!(back.vcpus[0].regs.rax, 42);
    assert_eq!(back.vcpus[0].msrs[0].data, 99);
    assert_eq!(back.vcpus[0].xsave.len(), 1024);
    assert_eq!(back.platform.clock.clock, 12345);
    assert_eq!(back.memory, sample().memory);
    assert_eq!(back.cmdline, "console=ttyS0");
}

#[test]
fn detects_corruption_truncation_and_versions() {
    let mut buf = Vec::new();
    sample().write_to(&mut buf, &cpu()).unwrap();
    let mut flipped = buf.clone();
    let last = flipped.len() - 10;
    flipped[last] ^= 0xff;
    assert!(matches!(
        VmState::read_from(&mut flipped.as_slice(), &cpu()),
        Err(PersistError::Checksum)
    ));
    let truncated = &buf[..buf.len() - 100];
    assert!(VmState::read_from(&mut &truncated[..], &cpu()).is_err());
    let mut wrong_version = buf.clone();
    wrong_version[8] = 99;
    assert!(matches!(
        VmState::read_from(&mut wrong_version.as_slice(), &cpu()),
        Err(PersistError::Version { found: 99 })
    ));
    let mut bad_magic = buf;
    bad_magic[0] = b'X';
    assert!(matches!(
        VmState::read_from(&mut bad_magic.as_slice(), &cpu()),
        Err(PersistError::BadMagic)
    ));
}

#[test]
fn refuses_another_cpu() {
    let mut buf = Vec::new();
    sample().write_to(&mut buf, &cpu()).unwrap();
    let amd = CpuIdentity::from_signature("AuthenticAMD".into(), 0x00a50f00);
    let err = VmState::read_from(&mut buf.as_slice(), &amd).err().unwrap();
    assert!(matches!(err, PersistError::IncompatibleCpu { .. }), "{err}");
    assert!(err.to_string().contains("GenuineIntel"));
}

#[test]
fn cpu_signature_decoding() {
    // Family 6, extended model 8, model 0xe -> model 0x8e.
    let c = CpuIdentity::from_signature("GenuineIntel".into(), 0x000806ec);
    assert_eq!((c.family, c.model), (6, 0x8e));
    // AMD Zen 3: base family 0xf + extended 0xa = 0x19.
    let a = CpuIdentity::from_signature("AuthenticAMD".into(), 0x00a20f10);
    assert_eq!((a.family, a.model), (0x19, 0x21));
    assert_eq!(CpuIdentity::host(), CpuIdentity::host());
}
