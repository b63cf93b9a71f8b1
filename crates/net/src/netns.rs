//! Sockets made inside a sandbox's network namespace by the daemon.
//!
//! A socket belongs to the namespace of the thread that created it, for its whole
//! life, whatever thread uses it later. So the daemon can serve a guest from inside
//! the guest's namespace (no host port, no NAT to the host) and reach out from there
//! (the packets meet the host's rules for sandboxes and its NAT like the guest's own)
//! by creating the socket on a short-lived thread that has joined the namespace
//! (`setns(CLONE_NEWNET)` switches only the calling thread), then handing it to the
//! async runtime. The thread ends right after, so no thread of the daemon's pools is
//! ever left in a sandbox's namespace.
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Runs `make` on a fresh thread inside the namespace at `netns` (`/run/netns/<name>`).
pub fn in_netns<T: Send>(
    netns: &Path,
    make: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    let ns = File::open(netns)?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns on a namespace file we hold open; it changes only this
            // thread's network namespace, and this thread ends when `make` returns.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            make()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("socket set-up panicked")))
    })
}

/// [`in_netns`] from async code (on the blocking pool, which only waits for the
/// fresh thread).
pub async fn in_netns_async<T: Send + 'static>(
    netns: std::path::PathBuf,
    make: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(move || in_netns(&netns, make))
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e.to_string())))
}

/// A number from the kernel's random source (DNS query ids).
pub fn random_u16() -> u16 {
    let mut b = [0u8; 2];
    // SAFETY: getrandom fills at most `b.len()` bytes of a buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 2 {
        // Never happens after boot; a fixed id is still matched with the question.
        return 0x5a5a;
    }
    u16::from_ne_bytes(b)
}
