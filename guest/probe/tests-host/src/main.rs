//! Throwaway harness: boots the probe guest on /dev/kvm with the same boot path
//! zygote's VMM implements (see ../README.md), so the probe can be debugged
//! before the VMM exists. It is deliberately one file with no VMM abstractions.
//!
//! usage: probe-harness --elf PATH [--mem-mib N] [--vcpus N] [--scenario NAME]
//!                      [--timeout-s N] [--cmdline-extra "k=v ..."]
//!                      [--claim-mem-mib N] [--omit-token] [--aps-runnable]
//!                      (the last three are negative tests: the probe must fail)
//! Exit status 0 when the scenario passed (PROBE OK and mailbox status OK, or for
//! `spin`: PROBE READY, the SPIN marker, a heartbeat that rises while running and
//! stands still while the vCPU is paused).

use kvm_bindings::{
    kvm_pit_config, kvm_segment, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zygote_probe_abi as abi;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const GDT_GPA: u64 = 0x500;
const PML4_GPA: u64 = 0x9000;
const PDPT_GPA: u64 = 0xa000;
const PD_GPA: u64 = 0xb000; // one 4 KiB page directory per GiB mapped, up to 16
const E820_LOW_END: u64 = 0x9_fc00; // conventional RAM, below the EBDA
const HIMEM_START: u64 = MIB;

/// Guest RAM: [0, min(mem, 3 GiB)) and, above the 32-bit MMIO hole, the rest
/// from 4 GiB.
struct GuestMem {
    regions: Vec<(u64, *mut u8, u64)>,
}

// The raw pointers are to a private anonymous mapping that lives as long as the
// process; vCPU threads and the main thread only do volatile word accesses.
unsafe impl Send for GuestMem {}
unsafe impl Sync for GuestMem {}

impl GuestMem {
    fn new(mem: u64) -> GuestMem {
        let low = mem.min(abi::MMIO_HOLE_START);
        let mut regions = vec![(0, low)];
        if mem > low {
            regions.push((abi::MMIO_HOLE_END, mem - low));
        }
        let regions = regions
            .into_iter()
            .map(|(gpa, size)| {
                // SAFETY: fresh anonymous mapping; NORESERVE so 4 GiB costs nothing until touched.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        size as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                assert!(p != libc::MAP_FAILED, "mmap {size} bytes failed");
                (gpa, p as *mut u8, size)
            })
            .collect();
        GuestMem { regions }
    }

    fn ptr(&self, gpa: u64, len: u64) -> *mut u8 {
        for &(base, host, size) in &self.regions {
            if gpa >= base && gpa + len <= base + size {
                // SAFETY: in bounds of the mapping.
                return unsafe { host.add((gpa - base) as usize) };
            }
        }
        panic!("guest range {gpa:#x}+{len:#x} is not RAM");
    }

    fn write(&self, gpa: u64, bytes: &[u8]) {
        // SAFETY: ptr() checked the range.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr(gpa, bytes.len() as u64),
                bytes.len(),
            )
        }
    }

    fn write_u64(&self, gpa: u64, v: u64) {
        self.write(gpa, &v.to_le_bytes());
    }

    fn read_u64(&self, gpa: u64) -> u64 {
        // SAFETY: ptr() checked the range; the guest writes these words concurrently.
        unsafe { std::ptr::read_volatile(self.ptr(gpa, 8) as *const u64) }
    }

    fn read_bytes(&self, gpa: u64, len: u64) -> Option<Vec<u8>> {
        let ok = self
            .regions
            .iter()
            .any(|&(b, _, s)| gpa >= b && gpa + len <= b + s);
        // SAFETY: range checked just above.
        ok.then(|| unsafe { std::slice::from_raw_parts(self.ptr(gpa, len), len as usize).to_vec() })
    }

    fn register(&self, vm: &VmFd) {
        for (slot, &(gpa, host, size)) in self.regions.iter().enumerate() {
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: gpa,
                memory_size: size,
                userspace_addr: host as u64,
            };
            // SAFETY: the mapping outlives the VM (never unmapped).
            unsafe { vm.set_user_memory_region(region) }.expect("KVM_SET_USER_MEMORY_REGION");
        }
    }
}

struct Args {
    elf: String,
    mem_mib: u64,
    vcpus: u64,
    scenario: String,
    timeout: Duration,
    cmdline_extra: String,
    /// Negative tests: the probe.mem_mib value to claim instead of the real size.
    claim_mem_mib: Option<u64>,
    /// Negative tests: leave CMDLINE_TOKEN off the command line.
    omit_token: bool,
    /// Negative tests: start the APs at the 64-bit entry too (a VMM bug).
    aps_runnable: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        elf: String::new(),
        mem_mib: 256,
        vcpus: 1,
        scenario: "boot".into(),
        timeout: Duration::from_secs(60),
        cmdline_extra: String::new(),
        claim_mem_mib: None,
        omit_token: false,
        aps_runnable: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--elf" => a.elf = val(),
            "--mem-mib" => a.mem_mib = val().parse().expect("--mem-mib"),
            "--vcpus" => a.vcpus = val().parse().expect("--vcpus"),
            "--scenario" => a.scenario = val(),
            "--timeout-s" => a.timeout = Duration::from_secs(val().parse().expect("--timeout-s")),
            "--cmdline-extra" => a.cmdline_extra = val(),
            "--claim-mem-mib" => a.claim_mem_mib = Some(val().parse().expect("--claim-mem-mib")),
            "--omit-token" => a.omit_token = true,
            "--aps-runnable" => a.aps_runnable = true,
            _ => panic!("unknown argument {flag}"),
        }
    }
    assert!(!a.elf.is_empty(), "--elf PATH is required");
    a
}

/// Loads PT_LOAD segments at p_paddr, copying p_filesz bytes only (as
/// linux-loader does; fresh guest RAM is already zero). Returns e_entry.
fn load_elf(mem: &GuestMem, path: &str) -> u64 {
    let f = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let u16at = |o: usize| u16::from_le_bytes(f[o..o + 2].try_into().unwrap());
    let u32at = |o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap());
    let u64at = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap());
    assert!(
        &f[..4] == b"\x7fELF" && f[4] == 2 && f[5] == 1,
        "not a little-endian ELF64"
    );
    assert_eq!(u16at(18), 62, "not x86_64");
    let entry = u64at(24);
    let (phoff, phentsize, phnum) = (u64at(32) as usize, u16at(54) as usize, u16at(56) as usize);
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32at(ph) != 1 {
            continue; // not PT_LOAD
        }
        let (off, paddr, filesz, memsz) = (
            u64at(ph + 8) as usize,
            u64at(ph + 24),
            u64at(ph + 32) as usize,
            u64at(ph + 40),
        );
        mem.ptr(paddr, memsz); // panics if the segment is not in RAM
        mem.write(paddr, &f[off..off + filesz]);
        eprintln!("[harness] PT_LOAD paddr={paddr:#x} filesz={filesz:#x} memsz={memsz:#x}");
    }
    entry
}

/// Identity map of max(4 GiB, top of RAM), capped at 16 GiB, with 2 MiB pages.
fn setup_page_tables(mem: &GuestMem, ram_top: u64) -> u64 {
    let limit = ram_top
        .clamp(abi::MMIO_HOLE_END, abi::IDENTITY_MAP_MAX)
        .next_multiple_of(GIB);
    let gibs = limit / GIB;
    mem.write_u64(PML4_GPA, PDPT_GPA | 0x3); // present | writable
    for g in 0..gibs {
        let pd = PD_GPA + g * 0x1000;
        mem.write_u64(PDPT_GPA + g * 8, pd | 0x3);
        for e in 0..512 {
            mem.write_u64(pd + e * 8, (g * GIB + e * 2 * MIB) | 0x83); // present | writable | 2 MiB
        }
    }
    limit
}

fn setup_zero_page(mem: &GuestMem, e820: &[(u64, u64, u32)], cmdline: &str) {
    let zp = abi::ZERO_PAGE_GPA;
    mem.write(zp, &[0u8; 4096]);
    mem.write(zp + 0x1fe, &0xaa55u16.to_le_bytes()); // hdr.boot_flag
    mem.write(zp + 0x202, b"HdrS"); // hdr.header
    mem.write(zp + 0x210, &[0xff]); // hdr.type_of_loader: undefined loader
    mem.write(zp + 0x228, &(abi::CMDLINE_GPA as u32).to_le_bytes()); // hdr.cmd_line_ptr
    mem.write(zp + 0x0c8, &((abi::CMDLINE_GPA >> 32) as u32).to_le_bytes()); // ext_cmd_line_ptr
    mem.write(zp + 0x238, &(cmdline.len() as u32).to_le_bytes()); // hdr.cmdline_size
    mem.write(zp + 0x1e8, &[e820.len() as u8]); // e820_entries
    for (i, &(addr, size, kind)) in e820.iter().enumerate() {
        let e = zp + 0x2d0 + 20 * i as u64;
        mem.write_u64(e, addr);
        mem.write_u64(e + 8, size);
        mem.write(e + 16, &kind.to_le_bytes());
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write(abi::CMDLINE_GPA, &bytes);
}

fn setup_gdt(mem: &GuestMem) {
    // null, 0x08: 64-bit code, 0x10: data, 0x18: 64-bit TSS (busy) for TR.
    let gdt: [u64; 4] = [
        0,
        0x00af_9b00_0000_ffff,
        0x00cf_9300_0000_ffff,
        0x0080_8b00_0000_0067,
    ];
    for (i, d) in gdt.iter().enumerate() {
        mem.write_u64(GDT_GPA + i as u64 * 8, *d);
    }
}

fn setup_bsp(vcpu: &VcpuFd, entry: u64) {
    let mut sregs = vcpu.get_sregs().expect("get_sregs");
    let seg = |selector: u16, type_: u8, l: u8, db: u8| kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db,
        s: 1,
        l,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.cs = seg(0x08, 0xb, 1, 0);
    let data = seg(0x10, 0x3, 0, 1);
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = kvm_segment {
        s: 0,
        g: 0,
        limit: 0x67,
        ..seg(0x18, 0xb, 0, 0)
    };
    sregs.gdt.base = GDT_GPA;
    sregs.gdt.limit = 4 * 8 - 1;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr3 = PML4_GPA;
    sregs.cr4 = 1 << 5; // PAE
    sregs.cr0 = (1 << 0) | (1 << 4) | (1 << 31); // PE | ET | PG
    sregs.efer = (1 << 8) | (1 << 10); // LME | LMA
    vcpu.set_sregs(&sregs).expect("set_sregs");
    let mut regs = vcpu.get_regs().expect("get_regs");
    regs.rip = entry;
    regs.rsi = abi::ZERO_PAGE_GPA;
    regs.rflags = 2;
    regs.rsp = 0; // the probe must set its own stack
    vcpu.set_regs(&regs).expect("set_regs");
}

enum Event {
    Reset(u64),
    Stopped(u64, String),
}

struct Shared {
    mem: GuestMem,
    start: Instant,
    lines: Mutex<Vec<String>>,
    pause: AtomicBool,
    paused: AtomicBool,
}

extern "C" fn on_kick(_: libc::c_int) {}

/// Runs one vCPU until reset or an exit the harness does not handle.
fn run_vcpu(id: u64, mut vcpu: VcpuFd, sh: Arc<Shared>, tx: mpsc::Sender<Event>) {
    let mut line = Vec::new();
    loop {
        if sh.pause.load(Ordering::SeqCst) {
            sh.paused.store(true, Ordering::SeqCst);
            while sh.pause.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            sh.paused.store(false, Ordering::SeqCst);
        }
        let stop = match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) if port == abi::COM1_PORT => {
                for &b in data {
                    if b == b'\n' {
                        let text = String::from_utf8_lossy(&line).into_owned();
                        println!(
                            "[{:>9.3} ms cpu{id}] {text}",
                            sh.start.elapsed().as_secs_f64() * 1e3
                        );
                        sh.lines.lock().unwrap().push(text);
                        line.clear();
                    } else {
                        line.push(b);
                    }
                }
                None
            }
            Ok(VcpuExit::IoOut(port, data))
                if port == abi::RESET_PORT && data == [abi::RESET_VALUE] =>
            {
                let _ = tx.send(Event::Reset(id));
                return;
            }
            Ok(VcpuExit::IoOut(..)) | Ok(VcpuExit::MmioWrite(..)) => None,
            Ok(VcpuExit::IoIn(port, data)) => {
                // LSR: transmitter empty; everything else reads as absent.
                let v = if port == abi::COM1_PORT + 5 {
                    0x60
                } else {
                    0xff
                };
                data.fill(v);
                None
            }
            Ok(VcpuExit::MmioRead(_, data)) => {
                data.fill(0xff);
                None
            }
            Ok(VcpuExit::InternalError) => Some("KVM_EXIT_INTERNAL_ERROR".to_string()),
            Ok(other) => Some(format!("unhandled exit {other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => None,
            Err(e) => Some(format!("KVM_RUN failed: {e}")),
        };
        if let Some(why) = stop {
            let _ = tx.send(Event::Stopped(id, describe_stop(&mut vcpu, &sh.mem, why)));
            return;
        }
    }
}

fn describe_stop(vcpu: &mut VcpuFd, mem: &GuestMem, why: String) -> String {
    let run = vcpu.get_kvm_run();
    let mut s = why;
    if run.exit_reason == kvm_bindings::KVM_EXIT_INTERNAL_ERROR {
        // SAFETY: the union member matches exit_reason.
        let internal = unsafe { run.__bindgen_anon_1.internal };
        s += &format!(" suberror={}", internal.suberror);
    }
    if let (Ok(regs), Ok(sregs)) = (vcpu.get_regs(), vcpu.get_sregs()) {
        // Long mode is identity-mapped and real mode is cs.base + ip: either way
        // this is the physical address of the faulting instruction.
        let pc = sregs.cs.base + regs.rip;
        let code = mem
            .read_bytes(pc, 16)
            .map(|b| format!("{b:02x?}"))
            .unwrap_or_default();
        s += &format!(
            " rip={:#x} cs={:#x}(base {:#x}) rsp={:#x} cr0={:#x} efer={:#x} bytes@pc={code}",
            regs.rip, sregs.cs.selector, sregs.cs.base, regs.rsp, sregs.cr0, sregs.efer
        );
    }
    s
}

fn has_line(sh: &Shared, want: &str) -> bool {
    sh.lines.lock().unwrap().iter().any(|l| l == want)
}

fn mailbox(sh: &Shared, off: u64) -> u64 {
    sh.mem.read_u64(abi::MAILBOX_GPA + off)
}

fn main() {
    let args = parse_args();
    let mem_bytes = args.mem_mib * MIB;
    assert!(
        args.mem_mib >= 32,
        "the probe is linked at 16 MiB: give it at least 32 MiB"
    );
    let kvm = Kvm::new().expect("open /dev/kvm");
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    vm.set_tss_address(0xfffb_d000).expect("KVM_SET_TSS_ADDR");
    vm.create_irq_chip().expect("KVM_CREATE_IRQCHIP");
    vm.create_pit2(kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    })
    .expect("KVM_CREATE_PIT2");

    let mem = GuestMem::new(mem_bytes);
    mem.register(&vm);
    let low = mem_bytes.min(abi::MMIO_HOLE_START);
    let mut e820 = vec![(0, E820_LOW_END, 1u32), (HIMEM_START, low - HIMEM_START, 1)];
    if mem_bytes > low {
        e820.push((abi::MMIO_HOLE_END, mem_bytes - low, 1));
    }
    let ram_top = e820.last().map(|&(a, s, _)| a + s).unwrap();
    let entry = load_elf(&mem, &args.elf);
    let mapped = setup_page_tables(&mem, ram_top);
    setup_gdt(&mem);
    let cmdline = format!(
        "console=ttyS0 {}{} {}{} {}{} {} {}",
        abi::CMDLINE_SCENARIO,
        args.scenario,
        abi::CMDLINE_MEM_MIB,
        args.claim_mem_mib.unwrap_or(args.mem_mib),
        abi::CMDLINE_VCPUS,
        args.vcpus,
        args.cmdline_extra,
        if args.omit_token {
            ""
        } else {
            abi::CMDLINE_TOKEN
        }
    );
    setup_zero_page(&mem, &e820, &cmdline);
    eprintln!(
        "[harness] entry={entry:#x} mem={}MiB vcpus={} mapped={}GiB cmdline={cmdline:?}",
        args.mem_mib,
        args.vcpus,
        mapped / GIB
    );

    // SAFETY: installing a no-op handler without SA_RESTART so a kick makes
    // KVM_RUN return EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_kick as *const () as usize;
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }

    let sh = Arc::new(Shared {
        mem,
        start: Instant::now(),
        lines: Mutex::new(Vec::new()),
        pause: AtomicBool::new(false),
        paused: AtomicBool::new(false),
    });
    let (tx, rx) = mpsc::channel();
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .expect("KVM_GET_SUPPORTED_CPUID");
    let mut threads = Vec::new();
    for id in 0..args.vcpus {
        let vcpu = vm.create_vcpu(id).expect("KVM_CREATE_VCPU");
        // KVM does not fill in the APIC id: CPUID.1:EBX[31:24] and leaf 0xB's
        // x2APIC id must say which vCPU this is.
        let mut cpuid = supported.clone();
        for e in cpuid.as_mut_slice() {
            if e.function == 1 {
                e.ebx = (e.ebx & 0x00ff_ffff) | ((id as u32) << 24);
            }
            if e.function == 0xb {
                e.edx = id as u32;
            }
        }
        vcpu.set_cpuid2(&cpuid).expect("KVM_SET_CPUID2");
        // APs stay in KVM's wait-for-SIPI state (the default for non-BSP vCPUs
        // with an in-kernel irqchip): only the BSP gets the boot registers.
        if id == 0 {
            setup_bsp(&vcpu, entry);
        } else if args.aps_runnable {
            setup_bsp(&vcpu, entry);
            let runnable = kvm_bindings::kvm_mp_state {
                mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
            };
            vcpu.set_mp_state(runnable).expect("KVM_SET_MP_STATE");
        }
        let (sh, tx) = (sh.clone(), tx.clone());
        threads.push(std::thread::spawn(move || run_vcpu(id, vcpu, sh, tx)));
    }
    drop(tx);

    let ok = if args.scenario == "spin" {
        check_spin(&sh, &rx, &threads[0], args.timeout)
    } else {
        check_finish(&sh, &rx, args.timeout)
    };
    println!(
        "[harness] {} after {:.1} ms",
        if ok { "PASS" } else { "FAIL" },
        sh.start.elapsed().as_secs_f64() * 1e3
    );
    // vCPU threads may be parked in KVM_RUN (halted APs, the spinning BSP):
    // leaving the process ends them.
    std::process::exit(if ok { 0 } else { 1 });
}

fn report_mailbox(sh: &Shared) {
    println!(
        "[harness] mailbox magic={:#x} status={} heartbeat={} cpus_alive={:#x}",
        mailbox(sh, abi::MAILBOX_OFF_MAGIC),
        mailbox(sh, abi::MAILBOX_OFF_STATUS),
        mailbox(sh, abi::MAILBOX_OFF_HEARTBEAT),
        mailbox(sh, abi::MAILBOX_OFF_CPUS_ALIVE)
    );
}

/// boot/smp: the BSP must reset after PROBE OK with mailbox status OK.
fn check_finish(sh: &Shared, rx: &mpsc::Receiver<Event>, timeout: Duration) -> bool {
    let ok = match rx.recv_timeout(timeout) {
        Ok(Event::Reset(id)) => {
            println!("[harness] vcpu{id} requested reset (i8042 0xfe)");
            id == 0
        }
        Ok(Event::Stopped(id, why)) => {
            println!("[harness] vcpu{id} stopped: {why}");
            false
        }
        Err(_) => {
            println!("[harness] timed out after {timeout:?}");
            false
        }
    };
    report_mailbox(sh);
    ok && has_line(sh, abi::REPORT_OK)
        && mailbox(sh, abi::MAILBOX_OFF_MAGIC) == abi::MAILBOX_MAGIC
        && mailbox(sh, abi::MAILBOX_OFF_STATUS) == abi::STATUS_OK
}

/// spin: wait for PROBE READY, then watch the heartbeat run, pause the vCPU and
/// see it stand still, resume and see it run again.
fn check_spin(
    sh: &Shared,
    rx: &mpsc::Receiver<Event>,
    bsp: &std::thread::JoinHandle<()>,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    while !has_line(sh, abi::REPORT_READY) {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(Event::Reset(id)) => {
                println!("[harness] vcpu{id} reset before PROBE READY");
                return false;
            }
            Ok(Event::Stopped(id, why)) => {
                println!("[harness] vcpu{id} stopped: {why}");
                return false;
            }
            Err(_) if Instant::now() > deadline => {
                println!("[harness] no PROBE READY within {timeout:?}");
                return false;
            }
            Err(_) => {}
        }
    }
    let marker = mailbox(
        sh,
        abi::MAILBOX_OFF_SCRATCH + 8 * abi::SCRATCH_SPIN_MARKER as u64,
    );
    let beat = || mailbox(sh, abi::MAILBOX_OFF_HEARTBEAT);
    let sample = |label: &str| -> Vec<u64> {
        let v: Vec<u64> = (0..4)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(200));
                beat()
            })
            .collect();
        println!("[harness] heartbeat {label}: {v:?}");
        v
    };
    let running = sample("running");
    // Pause: ask the vCPU thread to park and kick it out of KVM_RUN until it does.
    sh.pause.store(true, Ordering::SeqCst);
    while !sh.paused.load(Ordering::SeqCst) {
        // SAFETY: the thread is alive (it only exits on reset/stop, reported above).
        unsafe { libc::pthread_kill(bsp.as_pthread_t(), libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(5));
    }
    let paused = sample("paused");
    sh.pause.store(false, Ordering::SeqCst);
    let resumed = sample("resumed");
    report_mailbox(sh);
    let rising = |v: &[u64]| v.windows(2).all(|w| w[1] > w[0]);
    let ok = marker == abi::SPIN_MARKER
        && rising(&running)
        && paused.windows(2).all(|w| w[0] == w[1])
        && rising(&resumed)
        && resumed[0] > paused[0];
    if marker != abi::SPIN_MARKER {
        println!("[harness] spin marker is {marker:#x}");
    }
    if ok {
        let rate = (running[3] - running[0]) as f64 / 0.6;
        println!("[harness] heartbeat rate ~{rate:.0}/s");
    }
    ok
}
