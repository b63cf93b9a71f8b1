//! virtio-serial ports as a transport: the qemu runtime's agent channel.
//!
//! QEMU connects a `virtserialport` to a chardev whose host end is a Unix socket in
//! the daemon's own directory, so only the daemon can reach the agent (no TCP port on
//! the host that other sandboxes or users could connect to). A port is one byte stream,
//! not a listener: the host connects and disconnects, and the guest sees that as the
//! port's host side opening and closing. While the host is away, `poll` reports POLLHUP
//! and `read` returns end-of-file, so serving a port is a loop: wait until the host is
//! there, serve the stream as one connection until end-of-file (which ends that
//! connection's execs, as a closed socket does), and wait again.
//!
//! The host's close and its next connection reach the guest as control messages on a
//! virtqueue of their own, unordered with the data: after a quick reconnect the guest
//! can read the new connection's first request and only then see the old close as
//! end-of-file. So an end-of-file followed by a host connection within [`RECONNECT_GRACE`]
//! does not end the stream ([`PortReader`]); sessions are told apart in-band instead
//! (every daemon connection opens with `hello`, see `conn`).
//!
//! The guest kernel announces ports asynchronously after the device probes, so a port
//! may appear only after the agent starts: finding it is retried.
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

/// Where the kernel lists virtio-serial ports (one directory per port, with `name`).
const PORTS_DIR: &str = "/sys/class/virtio-ports";
/// How often to look again while the host side is not connected.
const HOST_POLL: Duration = Duration::from_millis(10);
/// An end-of-file is the end of the stream only if no host connects within this.
const RECONNECT_GRACE: Duration = Duration::from_millis(500);

/// The device node of the port called `name`, if the kernel has announced it.
pub(crate) fn find(name: &str) -> Option<PathBuf> {
    find_in(Path::new(PORTS_DIR), Path::new("/dev"), name)
}

fn find_in(ports_dir: &Path, dev_dir: &Path, name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(ports_dir).ok()?;
    for entry in entries.flatten() {
        let given = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
        if given.trim_end() == name {
            return Some(dev_dir.join(entry.file_name()));
        }
    }
    None
}

/// Open the port called `name`, waiting (with growing pauses) until it exists.
pub(crate) fn open_when_present(name: &str) -> File {
    let mut pause = Duration::from_millis(5);
    let mut waited = Duration::ZERO;
    let mut told = false;
    loop {
        if let Some(path) = find(name) {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(f) => return f,
                Err(e) if !told => {
                    crate::log!("port {name}: opening {}: {e}; retrying", path.display());
                    told = true;
                }
                Err(_) => {}
            }
        } else if waited >= Duration::from_secs(5) && !told {
            crate::log!("port {name}: not present yet; still waiting");
            told = true;
        }
        thread::sleep(pause);
        waited += pause;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Block until the host side of `port` is connected (or has data for us).
pub(crate) fn wait_for_host(port: &File) {
    loop {
        let mut pfd = libc::pollfd {
            fd: port.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid descriptor we own.
        let r = unsafe { libc::poll(&mut pfd, 1, -1) };
        if r > 0 && pfd.revents & libc::POLLIN != 0 {
            return;
        }
        if r > 0 && pfd.revents & libc::POLLHUP == 0 {
            // Anything else (POLLOUT, POLLERR): let the connection find out.
            return;
        }
        // POLLHUP: nobody on the host side yet. The port has no event for "host
        // connected", so look again shortly.
        thread::sleep(HOST_POLL);
    }
}

/// Whether the host side of `port` is connected (or has data for us) now.
fn host_present(port: &File) -> bool {
    let mut pfd = libc::pollfd {
        fd: port.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one valid descriptor we own, without waiting.
    let r = unsafe { libc::poll(&mut pfd, 1, 0) };
    r > 0 && (pfd.revents & libc::POLLIN != 0 || pfd.revents & libc::POLLHUP == 0)
}

/// Reads a port as one stream across host reconnections that follow within
/// [`RECONNECT_GRACE`] (see the module doc); end-of-file only when none does.
pub(crate) struct PortReader {
    pub(crate) port: File,
}

impl Read for PortReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let n = self.port.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let deadline = Instant::now() + RECONNECT_GRACE;
            while !host_present(&self.port) {
                if Instant::now() >= deadline {
                    return Ok(0);
                }
                thread::sleep(HOST_POLL);
            }
        }
    }
}

/// After a connection broke inside a frame: read and discard what the host still sends
/// until it disconnects (no data left, and the port reports the host gone), so the next
/// connection's first frame starts a frame. The daemon drops such a connection at once
/// and waits a moment before it connects again.
pub(crate) fn drain_until_host_leaves(port: &File) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut dropped = 0usize;
    loop {
        let mut pfd = libc::pollfd {
            fd: port.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid descriptor we own.
        let r = unsafe { libc::poll(&mut pfd, 1, 100) };
        if r > 0 && pfd.revents & libc::POLLIN != 0 {
            match (&*port).read(&mut buf) {
                Ok(n) if n > 0 => {
                    dropped += n;
                    continue;
                }
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        if r > 0 && pfd.revents & libc::POLLHUP != 0 {
            break;
        }
    }
    crate::log!("port: skipped {dropped} bytes of a broken connection");
}

/// A second descriptor for the same port (each connection owns its own).
pub(crate) fn dup(port: &File) -> io::Result<OwnedFd> {
    Ok(port.try_clone()?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_port_by_its_name() {
        let sys = tempfile::tempdir().unwrap();
        for (dir, name) in [
            ("vport0p1", "org.other\n"),
            ("vport1p1", "org.zygote.agent\n"),
        ] {
            std::fs::create_dir(sys.path().join(dir)).unwrap();
            std::fs::write(sys.path().join(dir).join("name"), name).unwrap();
        }
        let dev = Path::new("/dev");
        assert_eq!(
            find_in(sys.path(), dev, "org.zygote.agent"),
            Some(PathBuf::from("/dev/vport1p1"))
        );
        assert_eq!(find_in(sys.path(), dev, "org.zygote"), None);
        assert_eq!(find_in(Path::new("/nonexistent"), dev, "x"), None);
    }
}
