//! vCPU threads: configuration for boot, the KVM_RUN loop, and pause/resume.
//!
//! Pausing uses the documented `immediate_exit` protocol: the controller marks the vCPU
//! as wanted-paused and sends it a signal; the signal handler sets `kvm_run.immediate_exit`
//! so that a KVM_RUN which has not started yet returns EINTR at once, and a KVM_RUN in
//! progress is interrupted by the signal itself. The thread then parks on a condvar
//! outside KVM_RUN, holding no locks, which is what branching (fork) requires.
use std::cell::Cell;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::JoinHandle;

use kvm_bindings::{kvm_run, Msrs};
use kvm_ioctls::{VcpuExit, VcpuFd};

use crate::arch::{cpuid, msr, regs};
use crate::devices::Bus;
use crate::persist::VcpuState;
use crate::vstate::capture::XsaveFormat;
use crate::vstate::vm::{HostKvm, Vm};

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("creating vCPU {index} failed: {source}")]
    Create {
        index: u8,
        source: kvm_ioctls::Error,
    },
    #[error("configuring vCPU {index}: {op} failed: {source}")]
    Configure {
        index: u8,
        op: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {index}: KVM_SET_MSRS set {set} of {wanted} MSRs; MSR {failed:#x} was refused")]
    MsrRefused {
        index: u8,
        set: usize,
        wanted: usize,
        failed: u32,
    },
    #[error("spawning the vCPU {0} thread failed: {1}")]
    Spawn(u8, std::io::Error),
}

/// Why a vCPU stopped the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest asked for a reset (i8042 0xFE, or a KVM reset system event): a clean end.
    Reset,
    /// The guest powered off (KVM shutdown system event).
    PowerOff,
    /// Triple fault (KVM_EXIT_SHUTDOWN).
    TripleFault { vcpu: u8, dump: String },
    /// KVM could not emulate or handle something (KVM_EXIT_INTERNAL_ERROR).
    InternalError {
        vcpu: u8,
        suberror: u32,
        dump: String,
    },
    /// VM entry failed (KVM_EXIT_FAIL_ENTRY).
    FailEntry { vcpu: u8, reason: u64, dump: String },
    /// Any other exit or ioctl failure we cannot continue from.
    Fatal { vcpu: u8, detail: String },
}

impl ExitReason {
    /// True for a guest-requested end (reset/power-off), false for errors.
    pub fn is_clean(&self) -> bool {
        matches!(self, ExitReason::Reset | ExitReason::PowerOff)
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitReason::Reset => write!(f, "guest reset"),
            ExitReason::PowerOff => write!(f, "guest powered off"),
            ExitReason::TripleFault { vcpu, dump } => {
                write!(f, "vCPU {vcpu}: triple fault (KVM_EXIT_SHUTDOWN)\n{dump}")
            }
            ExitReason::InternalError {
                vcpu,
                suberror,
                dump,
            } => {
                let what = match suberror {
                    1 => " (emulation failure: an instruction KVM cannot emulate)",
                    2 => " (simultaneous exceptions)",
                    3 => " (delivery event)",
                    _ => "",
                };
                write!(
                    f,
                    "vCPU {vcpu}: KVM internal error, suberror {suberror}{what}\n{dump}"
                )
            }
            ExitReason::FailEntry { vcpu, reason, dump } => write!(
                f,
                "vCPU {vcpu}: VM entry failed, hardware reason {reason:#x}\n{dump}"
            ),
            ExitReason::Fatal { vcpu, detail } => write!(f, "vCPU {vcpu}: {detail}"),
        }
    }
}

/// Messages from vCPU threads to the VMM.
#[derive(Debug)]
pub enum VmEvent {
    Exit(ExitReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Run,
    Pause,
    Stop,
}

struct ControlState {
    want: Want,
    parked: bool,
    exited: bool,
    /// Set by the controller with a pause: capture state while parking.
    capture_requested: bool,
    captured: Option<Result<VcpuState, String>>,
}

/// Shared between a vCPU thread and the controller.
pub struct VcpuControl {
    state: Mutex<ControlState>,
    cv: Condvar,
}

impl VcpuControl {
    fn new(start_paused: bool) -> Self {
        Self {
            state: Mutex::new(ControlState {
                want: if start_paused { Want::Pause } else { Want::Run },
                parked: false,
                exited: false,
                capture_requested: false,
                captured: None,
            }),
            cv: Condvar::new(),
        }
    }
}

thread_local! {
    static KVM_RUN_PTR: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal that kicks a vCPU out of KVM_RUN.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

extern "C" fn handle_kick(_: libc::c_int) {
    // Only async-signal-safe work: a volatile store through a const-initialized TLS slot.
    KVM_RUN_PTR.with(|p| {
        let run = p.get();
        if !run.is_null() {
            // SAFETY: the pointer is this thread's own mapped kvm_run, set while its VcpuFd lives.
            unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
        }
    });
}

fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: installing a handler that only performs a volatile store.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handle_kick as *const () as usize;
            act.sa_flags = 0;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(kick_signal(), &act, std::ptr::null_mut());
        }
    });
}

/// Buses a vCPU dispatches I/O exits on.
#[derive(Clone)]
pub struct IoBuses {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
}

/// A configured vCPU, not yet running.
pub struct Vcpu {
    pub index: u8,
    pub fd: VcpuFd,
}

impl Vcpu {
    pub fn new(vm: &Vm, index: u8) -> Result<Self, VcpuError> {
        let fd = vm
            .fd
            .create_vcpu(u64::from(index))
            .map_err(|source| VcpuError::Create { index, source })?;
        Ok(Self { index, fd })
    }

    fn op(&self, op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
        let index = self.index;
        move |source| VcpuError::Configure { index, op, source }
    }

    /// CPUID, MSRs and LAPIC wiring for every vCPU; registers for the boot vCPU only
    /// (application processors wait for INIT/SIPI from the guest).
    pub fn configure_boot(
        &self,
        host: &HostKvm,
        num_vcpus: u8,
        entry: u64,
    ) -> Result<(), VcpuError> {
        let cpuid = cpuid::for_vcpu(
            &host.supported_cpuid,
            cpuid::CpuidParams {
                vcpu_index: self.index,
                num_vcpus,
                tsc_deadline: host.tsc_deadline,
            },
        );
        self.fd
            .set_cpuid2(&cpuid)
            .map_err(self.op("KVM_SET_CPUID2"))?;

        let (entries, skipped) =
            msr::filter_supported(&msr::boot_msr_values(), &host.msr_index_list);
        if !skipped.is_empty() {
            tracing::debug!(
                vcpu = self.index,
                ?skipped,
                "host KVM lacks these boot MSRs"
            );
        }
        let msrs = Msrs::from_entries(&entries).expect("boot MSR list is small");
        let set = self.fd.set_msrs(&msrs).map_err(self.op("KVM_SET_MSRS"))?;
        if set != entries.len() {
            return Err(VcpuError::MsrRefused {
                index: self.index,
                set,
                wanted: entries.len(),
                failed: entries[set].index,
            });
        }

        let mut lapic = self.fd.get_lapic().map_err(self.op("KVM_GET_LAPIC"))?;
        regs::wire_lapic_lints(&mut lapic);
        self.fd
            .set_lapic(&lapic)
            .map_err(self.op("KVM_SET_LAPIC"))?;

        if self.index == 0 {
            self.fd
                .set_regs(&regs::boot_regs(entry))
                .map_err(self.op("KVM_SET_REGS"))?;
            let sregs = self.fd.get_sregs().map_err(self.op("KVM_GET_SREGS"))?;
            self.fd
                .set_sregs(&regs::boot_sregs(sregs))
                .map_err(self.op("KVM_SET_SREGS"))?;
            self.fd
                .set_fpu(&regs::boot_fpu())
                .map_err(self.op("KVM_SET_FPU"))?;
        }
        Ok(())
    }

    /// Start the vCPU thread.
    pub fn spawn(
        mut self,
        run_size: usize,
        buses: IoBuses,
        events: Sender<VmEvent>,
        start_paused: bool,
        capture: Arc<CaptureParams>,
    ) -> Result<VcpuHandle, VcpuError> {
        install_kick_handler();
        let control = Arc::new(VcpuControl::new(start_paused));
        let ctl = control.clone();
        let index = self.index;
        let kvm_run = KvmRunMapping {
            addr: self.fd.get_kvm_run() as *mut kvm_run as usize,
            size: run_size,
            fd: std::os::fd::AsRawFd::as_raw_fd(&self.fd),
        };
        let thread = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || super::vcpu_loop::run(self, buses, events, ctl, capture))
            .map_err(|e| VcpuError::Spawn(index, e))?;
        let pthread = {
            use std::os::unix::thread::JoinHandleExt;
            thread.as_pthread_t()
        };
        Ok(VcpuHandle {
            index,
            thread: Some(thread),
            pthread,
            control,
            kvm_run,
        })
    }
}

/// What a vCPU thread needs to capture its own state when asked.
pub struct CaptureParams {
    /// MSRs this host lets us read back, in restore order.
    pub msr_indices: Vec<u32>,
    pub xsave: XsaveFormat,
    pub has_xcrs: bool,
}

/// Where a vCPU's kvm_run page is mapped. A forked child has no vCPU threads, so it
/// unmaps these itself: the mapping would otherwise keep the parent's VM alive.
#[derive(Debug, Clone, Copy)]
pub struct KvmRunMapping {
    pub addr: usize,
    pub size: usize,
    pub fd: std::os::fd::RawFd,
}

/// The controller's side of a running vCPU thread.
pub struct VcpuHandle {
    pub index: u8,
    thread: Option<JoinHandle<()>>,
    pthread: libc::pthread_t,
    control: Arc<VcpuControl>,
    kvm_run: KvmRunMapping,
}

impl VcpuHandle {
    pub fn kvm_run_mapping(&self) -> KvmRunMapping {
        self.kvm_run
    }

    fn kick(&self) {
        // SAFETY: the thread is joined only in `stop`, after which we never kick it.
        unsafe { libc::pthread_kill(self.pthread, kick_signal()) };
    }

    /// Ask the vCPU to leave KVM_RUN and park; with `capture`, it also records its state
    /// (in parallel with the other vCPUs) before reporting parked. Does not wait.
    pub fn request_pause(&self, capture: bool) {
        let mut st = self.control.state.lock().unwrap();
        if st.want == Want::Run {
            st.want = Want::Pause;
        }
        if capture {
            st.capture_requested = true;
            st.captured = None;
            // An already-parked vCPU must wake to capture.
            st.parked = false;
            self.control.cv.notify_all();
        }
        drop(st);
        self.kick();
    }

    /// After `request_pause(true)` and `wait_parked`: the captured state.
    pub fn take_captured(&self) -> Option<Result<VcpuState, String>> {
        self.control.state.lock().unwrap().captured.take()
    }

    /// Wait until the vCPU is parked (or has exited).
    pub fn wait_parked(&self) {
        let mut st = self.control.state.lock().unwrap();
        while !(st.parked || st.exited) {
            st = self.control.cv.wait(st).unwrap();
        }
    }

    pub fn resume(&self) {
        let mut st = self.control.state.lock().unwrap();
        if st.want == Want::Pause {
            st.want = Want::Run;
        }
        self.control.cv.notify_all();
    }

    /// Stop the thread and join it.
    pub fn stop(&mut self) {
        {
            let mut st = self.control.state.lock().unwrap();
            st.want = Want::Stop;
            self.control.cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            // Kick until it leaves: a vCPU halted in KVM_RUN only returns on a signal.
            while !t.is_finished() {
                self.kick();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let _ = t.join();
        }
    }
}

impl Drop for VcpuHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Thread-side helpers used by the run loop.
pub(crate) mod thread_side {
    use super::*;

    pub fn set_kvm_run(ptr: *mut kvm_run) {
        KVM_RUN_PTR.with(|p| p.set(ptr));
    }

    /// Block while paused (capturing state when asked); returns false when the thread
    /// should exit.
    pub fn wait_until_runnable(
        ctl: &VcpuControl,
        mut capture: impl FnMut() -> Result<VcpuState, String>,
    ) -> bool {
        let mut st = ctl.state.lock().unwrap();
        loop {
            match st.want {
                Want::Run => {
                    st.parked = false;
                    return true;
                }
                Want::Stop => return false,
                Want::Pause => {
                    if st.capture_requested {
                        st.capture_requested = false;
                        // Capturing only issues ioctls on our own vCPU fd; holding the
                        // control lock meanwhile keeps the controller waiting, which it
                        // does anyway.
                        st.captured = Some(capture());
                    }
                    if !st.parked {
                        st.parked = true;
                        ctl.cv.notify_all();
                    }
                    st = ctl.cv.wait(st).unwrap();
                }
            }
        }
    }

    /// The controller wants this vCPU parked (or stopped).
    pub fn pause_wanted(ctl: &VcpuControl) -> bool {
        ctl.state.lock().unwrap().want != Want::Run
    }

    pub fn mark_exited(ctl: &VcpuControl) {
        let mut st = ctl.state.lock().unwrap();
        st.exited = true;
        st.parked = false;
        ctl.cv.notify_all();
    }

    /// After a fatal exit the thread stays parked until told to stop, so the VMM can
    /// still read its registers if it wants to.
    pub fn wait_for_stop(ctl: &VcpuControl) {
        let mut st = ctl.state.lock().unwrap();
        while st.want != Want::Stop {
            st = ctl.cv.wait(st).unwrap();
        }
    }

    pub fn exit_to_reason(exit: &VcpuExit) -> &'static str {
        match exit {
            VcpuExit::Exception => "KVM_EXIT_EXCEPTION",
            VcpuExit::Debug(_) => "KVM_EXIT_DEBUG",
            VcpuExit::Hypercall(_) => "KVM_EXIT_HYPERCALL",
            VcpuExit::Nmi => "KVM_EXIT_NMI",
            VcpuExit::Unknown => "KVM_EXIT_UNKNOWN",
            _ => "an unexpected exit",
        }
    }
}
