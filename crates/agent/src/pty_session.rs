//! The kernel side of a pty: allocate a master/slave pair, size it, make the slave
//! the controlling terminal of a new session for the program, find the user's login
//! shell, and end what is left of a session.
//!
//! The program becomes a session leader (`setsid`) in the child, then takes the
//! slave as its controlling terminal (`TIOCSCTTY`), so the terminal's line discipline
//! turns a typed Ctrl-C into SIGINT for the foreground process group and a resize
//! (`TIOCSWINSZ` on the master) into SIGWINCH. An interactive shell puts each job in
//! a process group of its own, so killing the program's group is not enough when the
//! host goes away: [`kill_session`] finds every process of the session in `/proc`.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// A new pty pair of `cols` x `rows`: (master, slave). Both are close-on-exec; the
/// slave is opened without becoming the agent's controlling terminal.
pub(crate) fn open_pair(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: plain syscalls on a descriptor we own; ptsname_r writes at most
    // `buf.len()` bytes including the terminating NUL.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let master = OwnedFd::from_raw_fd(fd);
        if libc::grantpt(fd) != 0 || libc::unlockpt(fd) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = [0 as libc::c_char; 64];
        let r = libc::ptsname_r(fd, buf.as_mut_ptr(), buf.len());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        let path = CStr::from_ptr(buf.as_ptr());
        let sfd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if sfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let slave = OwnedFd::from_raw_fd(sfd);
        set_size(&master, cols, rows)?;
        Ok((master, slave))
    }
}

/// Set the terminal size; the kernel signals SIGWINCH to the foreground group.
pub(crate) fn set_size(master: &OwnedFd, cols: u16, rows: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Run `cmd` on `slave`: it is the program's stdin, stdout and stderr, and (through
/// `setsid` + `TIOCSCTTY` in the child) its controlling terminal.
pub(crate) fn attach(cmd: &mut Command, slave: &OwnedFd) -> io::Result<()> {
    cmd.stdin(slave.try_clone()?)
        .stdout(slave.try_clone()?)
        .stderr(slave.try_clone()?);
    // SAFETY: only async-signal-safe calls between fork and exec. std has already
    // moved the slave onto descriptors 0-2 when this runs.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// The login shell and home directory of the user the agent runs as, from
/// `/etc/passwd`; `/bin/sh` and None when there is no usable entry.
pub(crate) fn login_shell() -> (String, Option<String>) {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    parse_passwd(&passwd, uid)
        .map(|(shell, home)| {
            let shell = Some(shell)
                .filter(|s| s.starts_with('/') && std::path::Path::new(s).exists())
                .unwrap_or_else(|| "/bin/sh".into());
            let home = Some(home).filter(|h| std::path::Path::new(h).is_dir());
            (shell, home)
        })
        .unwrap_or_else(|| ("/bin/sh".into(), None))
}

/// (shell, home) of `uid`'s line in a passwd file.
fn parse_passwd(passwd: &str, uid: u32) -> Option<(String, String)> {
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[2].parse::<u32>().ok()? != uid {
            return None;
        }
        Some((f[6].to_string(), f[5].to_string()))
    })
}

/// SIGKILL every process of session `sid` (the pty's program and whatever its
/// shell started, in any process group). A process that forks while this runs may
/// escape one round, hence a few. Programs that made sessions of their own
/// (`setsid`) are out of reach, as they are meant to be.
pub(crate) fn kill_session(sid: libc::pid_t) {
    for _ in 0..5 {
        let members = session_members(sid);
        if members.is_empty() {
            return;
        }
        for pid in members {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Processes whose session id is `sid`, from `/proc/<pid>/stat`.
fn session_members(sid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&pid| {
            let stat = File::open(format!("/proc/{pid}/stat"))
                .and_then(|mut f| {
                    let mut s = String::new();
                    io::Read::read_to_string(&mut f, &mut s).map(|_| s)
                })
                .unwrap_or_default();
            // A zombie is already dead; killing it again is harmless.
            stat_session(&stat) == Some(sid)
        })
        .collect()
}

/// The session field of a `/proc/<pid>/stat` line. The command name (field 2) is
/// in parentheses and may hold spaces and parentheses itself: fields are counted
/// from the last `)`.
fn stat_session(stat: &str) -> Option<libc::pid_t> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // state ppid pgrp session
    rest.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_field_survives_odd_command_names() {
        let stat = "42 (a) b (c)) S 1 42 77 34816 42 4194560";
        assert_eq!(stat_session(stat), Some(77));
        assert_eq!(stat_session("garbage"), None);
    }

    #[test]
    fn passwd_lookup_by_uid() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nu:x:1000:1000::/home/u:/bin/zsh\nbad\n";
        assert_eq!(
            parse_passwd(passwd, 0),
            Some(("/bin/bash".into(), "/root".into()))
        );
        assert_eq!(
            parse_passwd(passwd, 1000),
            Some(("/bin/zsh".into(), "/home/u".into()))
        );
        assert_eq!(parse_passwd(passwd, 5), None);
    }

    #[test]
    fn a_pair_has_the_asked_size() {
        let (master, slave) = open_pair(91, 33).unwrap();
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        assert_eq!((ws.ws_col, ws.ws_row), (91, 33));
        set_size(&master, 10, 5).unwrap();
        assert_eq!(
            unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        assert_eq!((ws.ws_col, ws.ws_row), (10, 5));
    }
}
