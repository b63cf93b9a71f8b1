//! Guest-wide duties: init set-up as PID 1, reidentify, power-off.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

use zygote_proto::{
    ErrorBody, ErrorCode, ReidentifyReport, ReidentifyRequest, ReidentifyTimes, UnixTime,
};

use crate::log;
use crate::reaper::Reaper;

/// Largest entropy blob accepted; the kernel pool is 256 bytes, more is waste.
pub const MAX_ENTROPY: usize = 4096;

/// Hostname used when running as PID 1 until `reidentify` sets another.
pub const DEFAULT_HOSTNAME: &str = "zygote";

/// `_IOW('R', 0x03, int[2])`: add bytes to the pool and credit entropy.
/// Not exported by the libc crate.
const RNDADDENTROPY: u64 = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool (linux/random.h).
const RNDRESEEDCRNG: u64 = 0x5207;

pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn bad(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::BadRequest, message)
}

/// RFC 1123-ish: letters, digits, '-' and '.', not starting with '-' or '.',
/// at most 64 bytes (the kernel's limit).
pub fn validate_hostname(name: &str) -> Result<(), ErrorBody> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if name.is_empty() || name.len() > 64 || !ok_chars || name.starts_with(['-', '.']) {
        return Err(bad(format!("invalid hostname {name:?}")));
    }
    Ok(())
}

pub fn validate_time(t: &UnixTime) -> Result<(), ErrorBody> {
    if t.secs < 0 || t.nanos >= 1_000_000_000 {
        return Err(bad(format!("invalid time {}.{:09}", t.secs, t.nanos)));
    }
    Ok(())
}

/// Check every field first, so a bad request changes nothing; then apply.
/// With `dry_run` nothing is applied and the report says so.
pub fn reidentify(
    req: &ReidentifyRequest,
    dry_run: bool,
    reaper: &Reaper,
) -> Result<ReidentifyReport, ErrorBody> {
    if req.entropy.len() > MAX_ENTROPY {
        return Err(bad(format!(
            "entropy of {} bytes exceeds {MAX_ENTROPY}",
            req.entropy.len()
        )));
    }
    if let Some(h) = &req.hostname {
        validate_hostname(h)?;
    }
    if let Some(t) = &req.time {
        validate_time(t)?;
    }
    let net = req.net.as_ref().map(crate::netconf::validate).transpose()?;
    if let Some(id) = &req.identity {
        crate::forked::validate(id)?;
    }
    let mut report = ReidentifyReport {
        entropy_bytes: req.entropy.len(),
        dry_run,
        ..Default::default()
    };
    if dry_run {
        return Ok(report);
    }
    let mut took = ReidentifyTimes::default();
    let mut t = Instant::now();
    let mut lap = |part: &mut u64| {
        *part = t.elapsed().as_micros() as u64;
        t = Instant::now();
    };
    if !req.entropy.is_empty() {
        report.entropy_credited = add_entropy(&req.entropy)?;
        report.crng_reseeded = report.entropy_credited && reseed_crng();
    }
    lap(&mut took.entropy);
    if let Some(h) = &req.hostname {
        set_hostname(h)?;
        write_hostname_file(Path::new(ETC_HOSTNAME), h);
        write_hosts_file(Path::new(ETC_HOSTS), h);
        report.hostname_set = true;
    }
    lap(&mut took.hostname);
    if let Some(t) = &req.time {
        set_clock(t)?;
        report.clock_set = true;
    }
    lap(&mut took.clock);
    if let Some(plan) = &net {
        crate::netconf::apply(plan).map_err(|e| ErrorBody::from_io(&plan.interface, &e))?;
        report.net_set = true;
    }
    lap(&mut took.net);
    // Last: the new machine-id comes from the CRNG reseeded above, and hooks
    // see the new hostname, clock and address.
    if let Some(id) = &req.identity {
        crate::forked::apply(
            id,
            &crate::forked::ForkPaths::default(),
            reaper,
            &mut report,
        )?;
    }
    lap(&mut took.identity);
    report.took_us = Some(took);
    Ok(report)
}

/// Mix `data` into the kernel RNG. Returns whether it was also credited as
/// entropy (needs CAP_SYS_ADMIN; a plain write only mixes).
fn add_entropy(data: &[u8]) -> Result<bool, ErrorBody> {
    let err = |e: io::Error| ErrorBody::from_io("/dev/urandom", &e);
    let mut f = OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(err)?;
    if unsafe { libc::geteuid() } != 0 {
        f.write_all(data).map_err(err)?;
        return Ok(false);
    }
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + data.len());
    info.extend_from_slice(&((data.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(data.len() as i32).to_ne_bytes());
    info.extend_from_slice(data);
    info.resize(info.len().next_multiple_of(4), 0);
    // u32 alignment for the kernel's view of the struct.
    let words: Vec<u32> = info
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let r = unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY as _, words.as_ptr()) };
    if r == 0 {
        return Ok(true);
    }
    // Credit refused (e.g. no CAP_SYS_ADMIN in a container): still mix it in.
    f.write_all(data).map_err(err)?;
    Ok(false)
}

/// Reseed the kernel's CRNG from its input pool now (RNDRESEEDCRNG, root only). After a
/// fork every sibling has the same CRNG state; crediting entropy alone changes what it
/// returns only at the kernel's next periodic reseed.
fn reseed_crng() -> bool {
    let Ok(f) = OpenOptions::new().write(true).open("/dev/urandom") else {
        return false;
    };
    // SAFETY: an argument-less ioctl on a descriptor we own.
    unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG as _) == 0 }
}

pub fn set_hostname(name: &str) -> Result<(), ErrorBody> {
    let r = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    if r != 0 {
        return Err(ErrorBody::from_io(
            "sethostname",
            &io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Where userspace reads the machine's name (`hostname -F`, init scripts, shells).
const ETC_HOSTNAME: &str = "/etc/hostname";

/// Writes `name` to the hostname file at `path` (a copy of another guest still names
/// its source there), replaced whole. Only where `/etc` exists (a rootfs without one has
/// nowhere to put it); a read-only root is logged, not fatal: the kernel's name is set.
fn write_hostname_file(path: &Path, name: &str) {
    if !path.parent().is_some_and(Path::is_dir) {
        return;
    }
    if let Err(e) = crate::forked::replace_file(path, format!("{name}\n").as_bytes(), 0o644) {
        log!("writing {}: {e}", path.display());
    }
}

/// Where the machine's own name resolves (`127.0.1.1 <name>`, Debian's convention).
const ETC_HOSTS: &str = "/etc/hosts";

/// The largest hosts file rewritten: one a guest's user grew beyond this is left alone
/// rather than read whole into the agent.
const MAX_HOSTS_BYTES: u64 = 1 << 20;

/// Points `127.0.1.1` at `name` in the hosts file at `path` (every such line, or one
/// added), so that the machine's new name resolves as its old one did (`sudo`, `hostname
/// -f` and many tools look it up). Other lines are kept as they are. Missing, non-regular
/// or oversized files are left alone; failures are logged, not fatal.
fn write_hosts_file(path: &Path, name: &str) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if !meta.is_file() || meta.len() > MAX_HOSTS_BYTES {
        return;
    }
    let Ok(old) = fs::read_to_string(path) else {
        return;
    };
    let new = hosts_with_name(&old, name);
    if new != old {
        if let Err(e) = crate::forked::replace_file(path, new.as_bytes(), 0o644) {
            log!("writing {}: {e}", path.display());
        }
    }
}

/// `hosts` with each `127.0.1.1` line naming only `name` (one appended if none).
fn hosts_with_name(hosts: &str, name: &str) -> String {
    let mut out = String::with_capacity(hosts.len() + name.len() + 16);
    let mut found = false;
    for line in hosts.lines() {
        if line.split_whitespace().next() == Some("127.0.1.1") {
            found = true;
            out.push_str("127.0.1.1 ");
            out.push_str(name);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if !found {
        out.push_str("127.0.1.1 ");
        out.push_str(name);
        out.push('\n');
    }
    out
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn set_clock(t: &UnixTime) -> Result<(), ErrorBody> {
    let tv = libc::timeval {
        tv_sec: t.secs as _,
        tv_usec: (t.nanos / 1000) as _,
    };
    if unsafe { libc::settimeofday(&tv, std::ptr::null()) } != 0 {
        return Err(ErrorBody::from_io(
            "settimeofday",
            &io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn mount(source: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) {
    let _ = fs::create_dir_all(target);
    let c = |s: &str| CString::new(s).expect("static strings have no NUL");
    let (src, tgt, fst, dat) = (c(source), c(target), c(fstype), c(data));
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fst.as_ptr(),
            flags,
            dat.as_ptr().cast(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        // EBUSY: already mounted (e.g. the kernel's devtmpfs automount).
        if e.raw_os_error() != Some(libc::EBUSY) {
            log!("mount {fstype} on {target}: {e}");
        }
    }
}

/// Give init a stdin (/dev/null) and stdout/stderr (the console) if the
/// kernel started it without them (it does when the root filesystem has no
/// /dev/console). Otherwise the first sockets would land on fds 0-2. Fds that
/// are already open are left alone.
fn setup_stdio() {
    let missing: Vec<libc::c_int> = (0..3)
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0)
        .collect();
    if missing.is_empty() {
        return;
    }
    // Raw fds on purpose: with 0-2 closed, open() itself returns one of
    // them, and a File would close it again on drop.
    let open = |path: &std::ffi::CStr, flags| unsafe { libc::open(path.as_ptr(), flags) };
    let null = open(c"/dev/null", libc::O_RDWR);
    let console = open(c"/dev/console", libc::O_WRONLY | libc::O_NOCTTY);
    for fd in missing {
        let source = if fd > 0 && console >= 0 {
            console
        } else {
            null
        };
        if source >= 0 && source != fd {
            unsafe { libc::dup2(source, fd) };
        }
    }
    // Anything that landed on 0-2 is now one of the standard fds.
    for fd in [null, console] {
        if fd > 2 {
            unsafe { libc::close(fd) };
        }
    }
}

/// `ioctl(SIOCSIFFLAGS)` to bring an interface up (eth0 is configured by the
/// kernel's `ip=` parameter; lo is not).
pub fn interface_up(name: &str) -> io::Result<()> {
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    let result = (|| {
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        if name.len() >= req.ifr_name.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
        }
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        if unsafe { libc::ioctl(sock, libc::SIOCGIFFLAGS as _, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
        if unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS as _, &req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })();
    unsafe { libc::close(sock) };
    result
}

/// Everything init must do before serving: filesystems, console, hostname,
/// loopback, a sane PATH. Failures are logged, never fatal: a half-set-up
/// guest that still answers is far easier to debug than a kernel panic.
pub fn init_as_pid1() {
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    mount("proc", "/proc", "proc", nosuid_nodev | libc::MS_NOEXEC, "");
    mount("sysfs", "/sys", "sysfs", nosuid_nodev | libc::MS_NOEXEC, "");
    mount("devtmpfs", "/dev", "devtmpfs", libc::MS_NOSUID, "mode=0755");
    setup_stdio();
    mount(
        "devpts",
        "/dev/pts",
        "devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "gid=5,mode=0620,ptmxmode=0666",
    );
    mount("tmpfs", "/dev/shm", "tmpfs", nosuid_nodev, "mode=1777");
    mount("tmpfs", "/tmp", "tmpfs", nosuid_nodev, "mode=1777");
    mount("tmpfs", "/run", "tmpfs", nosuid_nodev, "mode=0755");
    if let Err(e) = set_hostname(DEFAULT_HOSTNAME) {
        log!("{e}");
    }
    if let Err(e) = interface_up("lo") {
        log!("bringing up lo: {e}");
    }
    if std::env::var_os("PATH").is_none() {
        std::env::set_var("PATH", DEFAULT_PATH);
    }
    if std::env::var_os("HOME").is_none() {
        std::env::set_var("HOME", "/root");
    }
}

pub fn read_cmdline() -> String {
    fs::read_to_string("/proc/cmdline").unwrap_or_default()
}

/// sync + reboot(2). As PID 1 this never returns: if the kernel refuses, we
/// park forever, because init exiting would panic the kernel.
pub fn reboot(how: libc::c_int) -> ! {
    unsafe { libc::sync() };
    let r = unsafe { libc::reboot(how) };
    log!("reboot failed ({r}): {}", io::Error::last_os_error());
    loop {
        std::thread::park();
    }
}

/// Is this process the init of its PID namespace?
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// True if `path` exists and is a socket (safe to unlink before bind).
pub fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hostname_file_is_replaced_where_etc_exists() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        fs::create_dir(&etc).unwrap();
        fs::write(etc.join("hostname"), "sb-parent\n").unwrap();
        write_hostname_file(&etc.join("hostname"), "sb-child");
        assert_eq!(
            fs::read_to_string(etc.join("hostname")).unwrap(),
            "sb-child\n"
        );
        // No /etc: nothing is made.
        let missing = root.path().join("none").join("hostname");
        write_hostname_file(&missing, "sb-child");
        assert!(!missing.exists());
    }

    #[test]
    fn the_hosts_file_names_the_new_hostname() {
        let before = "127.0.0.1 localhost\n127.0.1.1 sb-parent\n# keep\n::1 localhost\n";
        assert_eq!(
            hosts_with_name(before, "sb-child"),
            "127.0.0.1 localhost\n127.0.1.1 sb-child\n# keep\n::1 localhost\n"
        );
        assert_eq!(
            hosts_with_name("127.0.0.1 localhost", "sb-child"),
            "127.0.0.1 localhost\n127.0.1.1 sb-child\n"
        );
        let root = tempfile::tempdir().unwrap();
        let hosts = root.path().join("hosts");
        fs::write(&hosts, before).unwrap();
        write_hosts_file(&hosts, "sb-child");
        assert!(fs::read_to_string(&hosts)
            .unwrap()
            .contains("127.0.1.1 sb-child\n"));
        // A directory (or anything but a regular file) is left alone; no file is not made.
        let missing = root.path().join("none");
        write_hosts_file(&missing, "sb-child");
        assert!(!missing.exists());
    }

    #[test]
    fn hostnames() {
        for ok in ["zygote", "vm-1", "a.b.c", &"x".repeat(64)] {
            validate_hostname(ok).unwrap();
        }
        for bad in ["", "-x", ".x", "a b", "a_b", "é", &"x".repeat(65), "a\0b"] {
            assert!(validate_hostname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn times() {
        validate_time(&UnixTime {
            secs: 0,
            nanos: 999_999_999,
        })
        .unwrap();
        assert!(validate_time(&UnixTime { secs: -1, nanos: 0 }).is_err());
        assert!(validate_time(&UnixTime {
            secs: 1,
            nanos: 1_000_000_000
        })
        .is_err());
    }

    #[test]
    fn dry_run_validates_but_changes_nothing() {
        let before = hostname();
        let req = ReidentifyRequest {
            entropy: vec![1; 64],
            hostname: Some("zygote-test-never-applied".into()),
            time: Some(UnixTime { secs: 1, nanos: 0 }),
            net: None,
            identity: None,
        };
        let r = reidentify(
            &req,
            true,
            &Reaper::new(crate::reaper::ReapMode::PerChild).unwrap(),
        )
        .unwrap();
        assert!(r.dry_run && !r.hostname_set && !r.clock_set && !r.entropy_credited);
        assert_eq!(r.entropy_bytes, 64);
        assert_eq!(hostname(), before);
        assert_eq!(r.took_us, None, "a dry run times nothing");

        // Applied, an empty request changes nothing but still reports its parts' times.
        let r = reidentify(
            &ReidentifyRequest::default(),
            false,
            &Reaper::new(crate::reaper::ReapMode::PerChild).unwrap(),
        )
        .unwrap();
        assert!(!r.dry_run && !r.hostname_set && !r.net_set && !r.machine_id_set);
        assert!(r.took_us.is_some(), "{r:?}");
        assert_eq!(hostname(), before);

        let too_much = ReidentifyRequest {
            entropy: vec![0; MAX_ENTROPY + 1],
            ..Default::default()
        };
        assert_eq!(
            reidentify(
                &too_much,
                true,
                &Reaper::new(crate::reaper::ReapMode::PerChild).unwrap()
            )
            .unwrap_err()
            .code,
            ErrorCode::BadRequest
        );
        let bad_host = ReidentifyRequest {
            hostname: Some("no spaces".into()),
            ..Default::default()
        };
        assert_eq!(
            reidentify(
                &bad_host,
                true,
                &Reaper::new(crate::reaper::ReapMode::PerChild).unwrap()
            )
            .unwrap_err()
            .code,
            ErrorCode::BadRequest
        );
    }
}
