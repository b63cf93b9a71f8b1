//! The body of a vCPU thread: KVM_RUN, dispatch I/O exits to the buses, report the exit
//! that ends the VM (with a register dump for errors), and honour pause/stop requests.
use std::sync::mpsc::Sender;
use std::sync::Arc;

use kvm_ioctls::VcpuExit;

use super::capture;
use super::vcpu::thread_side::*;
use super::vcpu::{CaptureParams, ExitReason, IoBuses, Vcpu, VcpuControl, VmEvent};

const KVM_SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const KVM_SYSTEM_EVENT_RESET: u32 = 2;

/// Format general and control registers for error reports.
pub fn register_dump(vcpu: &Vcpu) -> String {
    let mut out = String::new();
    match vcpu.fd.get_regs() {
        Ok(r) => out.push_str(&format!(
            "  rip={:#018x} rsp={:#018x} rbp={:#018x} rflags={:#010x}\n  \
             rax={:#018x} rbx={:#018x} rcx={:#018x} rdx={:#018x}\n  \
             rsi={:#018x} rdi={:#018x} r8={:#018x}  r9={:#018x}\n",
            r.rip, r.rsp, r.rbp, r.rflags, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.r8, r.r9
        )),
        Err(e) => out.push_str(&format!("  (KVM_GET_REGS failed: {e})\n")),
    }
    match vcpu.fd.get_sregs() {
        Ok(s) => out.push_str(&format!(
            "  cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x}\n  \
             cs={:#06x} (dpl {} l {}) ss={:#06x} ds={:#06x} gdt={:#x}/{:#x} idt={:#x}/{:#x}",
            s.cr0,
            s.cr2,
            s.cr3,
            s.cr4,
            s.efer,
            s.cs.selector,
            s.cs.dpl,
            s.cs.l,
            s.ss.selector,
            s.ds.selector,
            s.gdt.base,
            s.gdt.limit,
            s.idt.base,
            s.idt.limit
        )),
        Err(e) => out.push_str(&format!("  (KVM_GET_SREGS failed: {e})")),
    }
    out
}

enum Step {
    Continue,
    /// An I/O exit was handled; KVM completes it on the next KVM_RUN.
    IoHandled,
    Interrupted,
    End(ExitReason),
}

fn run_once(vcpu: &mut Vcpu, buses: &IoBuses) -> Step {
    let index = vcpu.index;
    match vcpu.fd.run() {
        Ok(exit) => match exit {
            VcpuExit::IoIn(port, data) => {
                if !buses.pio.read(u64::from(port), data) {
                    // Nothing there: a floating ISA bus reads all ones.
                    data.fill(0xff);
                }
                Step::IoHandled
            }
            VcpuExit::IoOut(port, data) => {
                buses.pio.write(u64::from(port), data);
                Step::IoHandled
            }
            VcpuExit::MmioRead(addr, data) => {
                if !buses.mmio.read(addr, data) {
                    data.fill(0);
                }
                Step::IoHandled
            }
            VcpuExit::MmioWrite(addr, data) => {
                buses.mmio.write(addr, data);
                Step::IoHandled
            }
            // With the in-kernel irqchip KVM handles HLT itself; if one reaches us, the
            // vCPU simply runs again and blocks in the kernel.
            VcpuExit::Hlt => Step::Continue,
            VcpuExit::Intr => Step::Interrupted,
            VcpuExit::Shutdown => Step::End(ExitReason::TripleFault {
                vcpu: index,
                dump: register_dump(vcpu),
            }),
            VcpuExit::FailEntry(reason, _cpu) => Step::End(ExitReason::FailEntry {
                vcpu: index,
                reason,
                dump: register_dump(vcpu),
            }),
            VcpuExit::InternalError => {
                // SAFETY: for KVM_EXIT_INTERNAL_ERROR the `internal` union member is valid.
                let suberror = unsafe { vcpu.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
                Step::End(ExitReason::InternalError {
                    vcpu: index,
                    suberror,
                    dump: register_dump(vcpu),
                })
            }
            VcpuExit::SystemEvent(kind, _) => match kind {
                KVM_SYSTEM_EVENT_RESET => Step::End(ExitReason::Reset),
                KVM_SYSTEM_EVENT_SHUTDOWN => Step::End(ExitReason::PowerOff),
                other => Step::End(ExitReason::Fatal {
                    vcpu: index,
                    detail: format!("system event {other}"),
                }),
            },
            other => {
                let what = exit_to_reason(&other);
                Step::End(ExitReason::Fatal {
                    vcpu: index,
                    detail: format!("{what}\n{}", register_dump(vcpu)),
                })
            }
        },
        Err(e) if e.errno() == libc::EINTR => Step::Interrupted,
        Err(e) if e.errno() == libc::EAGAIN => Step::Continue,
        Err(e) => Step::End(ExitReason::Fatal {
            vcpu: index,
            detail: format!("KVM_RUN failed: {e}"),
        }),
    }
}

/// Finish the I/O exit just handled without running guest code. KVM completes an I/O
/// exit (stores an IN's data, advances RIP past an OUT or an MMIO read) only when
/// KVM_RUN is entered again, and that pending part is in no state userspace can save:
/// a vCPU captured before it would make a snapshot or a branch child execute the
/// instruction a second time. With `immediate_exit` set, KVM_RUN completes pending
/// operations and returns EINTR (KVM API, "KVM_RUN"); a string I/O may first exit again.
fn finish_pending_io(vcpu: &mut Vcpu, buses: &IoBuses) -> Option<ExitReason> {
    vcpu.fd.set_kvm_immediate_exit(1);
    let mut end = None;
    for _ in 0..1024 {
        match run_once(vcpu, buses) {
            Step::IoHandled | Step::Continue => {}
            Step::Interrupted => break,
            Step::End(reason) => {
                end = Some(reason);
                break;
            }
        }
    }
    vcpu.fd.set_kvm_immediate_exit(0);
    end
}

pub fn run(
    mut vcpu: Vcpu,
    buses: IoBuses,
    events: Sender<VmEvent>,
    ctl: Arc<VcpuControl>,
    capture: Arc<CaptureParams>,
) {
    set_kvm_run(vcpu.fd.get_kvm_run() as *mut _);
    // The kick signal must reach this thread even if the spawner had it blocked.
    // SAFETY: plain signal-mask manipulation on the current thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, super::vcpu::kick_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    let index = vcpu.index;
    while wait_until_runnable(&ctl, || {
        capture::capture_vcpu(
            &vcpu.fd,
            index,
            &capture.msr_indices,
            capture.xsave,
            capture.has_xcrs,
        )
        .map_err(|e| e.to_string())
    }) {
        let step = match run_once(&mut vcpu, &buses) {
            // About to park (and be captured, perhaps): complete the I/O first.
            Step::IoHandled if pause_wanted(&ctl) => match finish_pending_io(&mut vcpu, &buses) {
                Some(reason) => Step::End(reason),
                None => Step::Continue,
            },
            step => step,
        };
        match step {
            Step::Continue | Step::IoHandled => {}
            Step::Interrupted => vcpu.fd.set_kvm_immediate_exit(0),
            Step::End(reason) => {
                tracing::debug!(vcpu = vcpu.index, %reason, "vCPU ends the VM");
                let _ = events.send(VmEvent::Exit(reason));
                mark_exited(&ctl);
                wait_for_stop(&ctl);
                break;
            }
        }
    }
    mark_exited(&ctl);
    set_kvm_run(std::ptr::null_mut());
}
