//! `watch` / `unwatch`: the changes under a directory, streamed as they happen.
//!
//! A `watch` runs on a thread of its own with one inotify instance (`inotify`): it
//! watches the directory (and, when recursive, every directory below it, adding new
//! ones as they appear and dropping moved-away ones), polls the instance, turns each
//! kernel record into a [`WatchEvent`] named relative to the watched directory, and
//! sends them as `watch_events` frames right away. It keeps no queue of its own: what
//! the host has not taken waits in the kernel's bounded queue, whose overflow becomes an
//! `overflow` event. The thread looks at a stop flag between polls (every
//! [`STOP_CHECK`]): `unwatch`, a new session and the connection's end set it.
//!
//! Limits (see `zygote_proto::watch`): watchers per agent, watched directories per
//! watcher and per agent, and the descriptor reserve (`fds::admit`) all answer
//! `limit_reached` at the start; a new subdirectory the limits leave unwatched is
//! reported as an `overflow` event naming it.
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zygote_proto::watch::{
    UnwatchRequest, WatchEvent, WatchEventKind, WatchRequest, MAX_EVENTS_PER_FRAME, MAX_WATCHERS,
    MAX_WATCHES_PER_WATCHER, MAX_WATCHES_TOTAL,
};
use zygote_proto::{ErrorBody, ErrorCode, Response};

use crate::conn::Reply;
use crate::exec::pollfd;
use crate::files::abs_path;
use crate::inotify::{Inotify, RawEvent};

/// How often a watch thread looks at its stop flag while nothing happens.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// Bytes read from the instance at once (a record is 16 bytes plus its name).
const READ_BUFFER: usize = 64 * 1024;

/// Entries of a newly created directory reported as created, at most (a directory
/// that already holds more when the agent gets to it gets an `overflow` event).
const MAX_CREATES_PER_NEW_DIR: usize = 4096;

/// Watchers and watched directories of the guest, over every connection.
#[derive(Default)]
pub(crate) struct WatchCounts {
    watchers: Arc<AtomicUsize>,
    watches: Arc<AtomicUsize>,
}

/// One watcher's place in the count; given back when dropped.
struct WatcherSlot(Arc<AtomicUsize>);

impl Drop for WatcherSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn limit(message: String) -> ErrorBody {
    ErrorBody::new(ErrorCode::LimitReached, message)
}

impl WatchCounts {
    fn take(&self) -> Result<WatcherSlot, ErrorBody> {
        let taken = self
            .watchers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_WATCHERS).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(limit(format!(
                "{MAX_WATCHERS} watchers are open, the most the agent runs: end one first"
            )));
        }
        let slot = WatcherSlot(self.watchers.clone());
        crate::fds::admit("watcher")?;
        Ok(slot)
    }
}

/// The directories one watcher watches: inotify's watch descriptors and their paths
/// relative to the watched directory (empty for itself).
struct Tree {
    ino: Inotify,
    root: PathBuf,
    root_wd: i32,
    recursive: bool,
    dirs: HashMap<i32, PathBuf>,
    /// Watched directories moved away in the batch being translated (rename cookie,
    /// old name): a matching move-in renames their watches, else they are dropped.
    moved_away: Vec<(u32, PathBuf)>,
    /// Entries reported as created by walking a new directory in this batch, and in the
    /// one before. The kernel may report one of them itself too (it appeared after the
    /// directory was watched but before the walk read it): that report is in the next
    /// batch, and is skipped, so each entry is created once.
    walked_now: HashSet<PathBuf>,
    walked_before: HashSet<PathBuf>,
    /// The agent's count of watched directories, which this tree's are part of.
    total: Arc<AtomicUsize>,
}

/// What the watch does after a batch of records.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Go,
    /// The watched directory itself is gone: the watch ends.
    RootGone,
}

fn name_of(rel: &Path) -> String {
    rel.to_string_lossy().into_owned()
}

fn event(rel: &Path, kind: WatchEventKind) -> WatchEvent {
    WatchEvent {
        name: name_of(rel),
        kind,
    }
}

impl Tree {
    /// Watch `rel` (its symlink followed only for the root), within the limits.
    fn add(&mut self, rel: &Path) -> Result<i32, ErrorBody> {
        if self.dirs.len() >= MAX_WATCHES_PER_WATCHER {
            return Err(limit(format!(
                "a watcher watches at most {MAX_WATCHES_PER_WATCHER} directories"
            )));
        }
        let counted = self
            .total
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_WATCHES_TOTAL).then_some(n + 1)
            });
        if counted.is_err() {
            return Err(limit(format!(
                "the agent watches {MAX_WATCHES_TOTAL} directories, the most it watches"
            )));
        }
        let path = self.root.join(rel);
        let follow = rel.as_os_str().is_empty();
        match self.ino.add(&path, follow) {
            // The same directory again (moved back, say): one watch, counted once.
            Ok(wd) if self.dirs.contains_key(&wd) => {
                self.total.fetch_sub(1, Ordering::SeqCst);
                self.dirs.insert(wd, rel.to_path_buf());
                Ok(wd)
            }
            Ok(wd) => {
                self.dirs.insert(wd, rel.to_path_buf());
                Ok(wd)
            }
            Err(e) => {
                self.total.fetch_sub(1, Ordering::SeqCst);
                let shown = if follow {
                    "the directory"
                } else {
                    "a subdirectory"
                };
                Err(match e.raw_os_error() {
                    Some(libc::ENOSPC) | Some(libc::EMFILE) => limit(
                        "the guest kernel's inotify limit is reached (fs.inotify.max_user_watches)"
                            .into(),
                    ),
                    Some(libc::ENOTDIR) => {
                        let mut b = ErrorBody::from_io(&format!("watch {shown}"), &e);
                        b.code = ErrorCode::BadRequest;
                        b.message = "the path is not a directory".into();
                        b
                    }
                    _ => ErrorBody::from_io(&format!("watch {shown}"), &e),
                })
            }
        }
    }

    /// Stop watching `wd` (its watch is gone, or its directory moved away).
    fn forget(&mut self, wd: i32) {
        if self.dirs.remove(&wd).is_some() {
            self.total.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Watch `rel` and every directory below it; with `creates`, report what is found
    /// below it as created (it is new: its entries appeared before the watch did).
    /// Limits met here become `overflow` events naming the directory left out.
    fn add_subtree(&mut self, rel: &Path, creates: bool, out: &mut Vec<WatchEvent>) {
        let mut stack = vec![rel.to_path_buf()];
        let mut reported = 0;
        while let Some(dir) = stack.pop() {
            if self.add(&dir).is_err() {
                out.push(event(&dir, WatchEventKind::Overflow));
                continue;
            }
            let Ok(entries) = std::fs::read_dir(self.root.join(&dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let child = dir.join(entry.file_name());
                if creates {
                    if reported == MAX_CREATES_PER_NEW_DIR {
                        out.push(event(rel, WatchEventKind::Overflow));
                    }
                    if reported < MAX_CREATES_PER_NEW_DIR {
                        out.push(event(&child, WatchEventKind::Create));
                        self.walked_now.insert(child.clone());
                    }
                    reported += 1;
                }
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(child);
                }
            }
        }
    }

    /// The watched directory `from` (and what is below it) is now `to`.
    fn rename_subtree(&mut self, from: &Path, to: &Path) {
        for path in self.dirs.values_mut() {
            if let Ok(rest) = path.strip_prefix(from) {
                *path = to.join(rest);
            }
        }
    }

    /// After a batch: directories moved out of the tree are no longer watched (their
    /// watches would report under the old name); this batch's walked entries are the
    /// ones the next batch may see again.
    fn end_batch(&mut self) {
        for (_, rel) in std::mem::take(&mut self.moved_away) {
            self.remove_subtree(&rel);
        }
        self.walked_before = std::mem::take(&mut self.walked_now);
    }

    /// Stop watching `rel` and everything below it.
    fn remove_subtree(&mut self, rel: &Path) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, p)| p.starts_with(rel))
            .map(|(&wd, _)| wd)
            .collect();
        for wd in gone {
            self.ino.remove(wd);
            self.forget(wd);
        }
    }

    /// Turn one kernel record into events (and watches of new directories).
    fn translate(&mut self, ev: RawEvent, out: &mut Vec<WatchEvent>) -> Flow {
        if ev.mask & libc::IN_Q_OVERFLOW != 0 {
            out.push(event(Path::new(""), WatchEventKind::Overflow));
            return Flow::Go;
        }
        let Some(base) = self.dirs.get(&ev.wd).cloned() else {
            return Flow::Go; // a watch already dropped
        };
        let is_root = ev.wd == self.root_wd;
        if ev.mask & libc::IN_IGNORED != 0 {
            self.forget(ev.wd);
            return if is_root { Flow::RootGone } else { Flow::Go };
        }
        if ev.name.is_empty() {
            // The watched directory itself; a subdirectory's own events are reported
            // by its parent's watch, under its name.
            if is_root {
                let kind = if ev.mask & libc::IN_DELETE_SELF != 0 {
                    Some(WatchEventKind::Remove)
                } else if ev.mask & libc::IN_MOVE_SELF != 0 {
                    Some(WatchEventKind::Rename)
                } else if ev.mask & libc::IN_ATTRIB != 0 {
                    Some(WatchEventKind::Chmod)
                } else {
                    None
                };
                out.extend(kind.map(|k| event(Path::new(""), k)));
            }
            return Flow::Go;
        }
        let rel = base.join(OsStr::from_bytes(&ev.name));
        let is_dir = ev.mask & libc::IN_ISDIR != 0;
        let m = ev.mask;
        if m & libc::IN_CREATE != 0 && self.walked_before.remove(&rel) {
            return Flow::Go; // reported (and, a directory, watched) by the walk
        }
        let kind = if m & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
            WatchEventKind::Create
        } else if m & libc::IN_MODIFY != 0 {
            WatchEventKind::Write
        } else if m & libc::IN_DELETE != 0 {
            WatchEventKind::Remove
        } else if m & libc::IN_MOVED_FROM != 0 {
            WatchEventKind::Rename
        } else if m & libc::IN_ATTRIB != 0 {
            WatchEventKind::Chmod
        } else {
            return Flow::Go;
        };
        out.push(event(&rel, kind));
        if self.recursive && is_dir {
            if m & libc::IN_CREATE != 0 {
                self.add_subtree(&rel, true, out);
            } else if m & libc::IN_MOVED_TO != 0 {
                let pair = self.moved_away.iter().position(|(c, _)| *c == ev.cookie);
                match pair {
                    Some(i) => {
                        let (_, from) = self.moved_away.swap_remove(i);
                        self.rename_subtree(&from, &rel);
                    }
                    None => self.add_subtree(&rel, false, out),
                }
            } else if m & libc::IN_MOVED_FROM != 0 {
                self.moved_away.push((ev.cookie, rel));
            }
        }
        Flow::Go
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // The instance's watches go with its descriptor.
        self.total.fetch_sub(self.dirs.len(), Ordering::SeqCst);
    }
}

/// Everything a watch holds until it ends.
fn start(reply: &Reply, req: &WatchRequest) -> Result<(WatcherSlot, Tree), ErrorBody> {
    let root = abs_path(&req.path)?.to_path_buf();
    let meta = std::fs::metadata(&root).map_err(|e| ErrorBody::from_io("watch", &e))?;
    if !meta.is_dir() {
        let mut body = ErrorBody::new(ErrorCode::BadRequest, "the path is not a directory");
        body.errno = Some(libc::ENOTDIR);
        return Err(body);
    }
    let counts = &reply.agent().watches;
    let slot = counts.take()?;
    let ino = Inotify::new().map_err(|e| match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => limit(
            "the guest kernel's inotify limit is reached (fs.inotify.max_user_instances)".into(),
        ),
        _ => ErrorBody::from_io("inotify", &e),
    })?;
    let mut tree = Tree {
        ino,
        root,
        root_wd: -1,
        recursive: req.recursive,
        dirs: HashMap::new(),
        moved_away: Vec::new(),
        walked_now: HashSet::new(),
        walked_before: HashSet::new(),
        total: counts.watches.clone(),
    };
    tree.root_wd = tree.add(Path::new(""))?;
    if req.recursive {
        // At the start a limit refuses the watch: the client asked for all of the tree.
        let mut stack = vec![PathBuf::new()];
        while let Some(dir) = stack.pop() {
            let entries = match std::fs::read_dir(tree.root.join(&dir)) {
                Ok(e) => e,
                Err(_) => continue, // unreadable or gone meanwhile
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let child = dir.join(entry.file_name());
                    if let Err(e) = tree.add(&child) {
                        if e.code == ErrorCode::LimitReached {
                            return Err(e);
                        }
                        continue;
                    }
                    stack.push(child);
                }
            }
        }
    }
    Ok((slot, tree))
}

/// `watch`: watch until `unwatch`, the client's end or the directory's.
pub(crate) fn run(reply: Reply, req: WatchRequest) {
    let (_slot, mut tree) = match start(&reply, &req) {
        Ok(s) => s,
        Err(e) => return reply.finish(Response::Error(e)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    reply.register_watch(stop.clone());
    if !reply.event(Response::WatchStarted) {
        return reply.unregister_watch();
    }
    let mut buf = vec![0u8; READ_BUFFER];
    let ended = loop {
        if stop.load(Ordering::SeqCst) {
            break Ok(());
        }
        let mut pfd = [pollfd(tree.ino.fd(), libc::POLLIN)];
        // SAFETY: `pfd` is a valid array of one pollfd.
        let n = unsafe { libc::poll(pfd.as_mut_ptr(), 1, STOP_CHECK.as_millis() as i32) };
        if n <= 0 {
            continue; // timeout or EINTR
        }
        let raw = match tree.ino.read(&mut buf) {
            Ok(raw) => raw,
            Err(e) => break Err(ErrorBody::from_io("read watch events", &e)),
        };
        let mut out = Vec::new();
        let mut flow = Flow::Go;
        for ev in raw {
            if tree.translate(ev, &mut out) == Flow::RootGone {
                flow = Flow::RootGone;
            }
        }
        tree.end_batch();
        for chunk in out.chunks(MAX_EVENTS_PER_FRAME) {
            let events = chunk.to_vec();
            if !reply.event(Response::WatchEvents { events }) {
                // The client is gone; nothing more to say to it.
                return reply.unregister_watch();
            }
        }
        if flow == Flow::RootGone {
            break Ok(());
        }
    };
    reply.unregister_watch();
    reply.finish(match ended {
        Ok(()) => Response::Ok,
        Err(e) => Response::Error(e),
    });
}

/// `unwatch`: end a watch of this connection.
pub(crate) fn unwatch(reply: &Reply, req: &UnwatchRequest) -> Result<Response, ErrorBody> {
    reply.stop_watch(req.watch_id).map(|()| Response::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) -> Tree {
        let mut t = Tree {
            ino: Inotify::new().unwrap(),
            root: root.to_path_buf(),
            root_wd: -1,
            recursive: true,
            dirs: HashMap::new(),
            moved_away: Vec::new(),
            walked_now: HashSet::new(),
            walked_before: HashSet::new(),
            total: Arc::new(AtomicUsize::new(0)),
        };
        t.root_wd = t.add(Path::new("")).unwrap();
        t
    }

    fn raw(wd: i32, mask: u32, name: &str) -> RawEvent {
        RawEvent {
            wd,
            mask,
            cookie: 0,
            name: name.as_bytes().to_vec(),
        }
    }

    #[test]
    fn an_entry_both_walked_and_reported_by_the_kernel_is_created_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = tree(dir.path());
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), b"").unwrap();
        let mut out = Vec::new();
        let root = t.root_wd;
        t.translate(raw(root, libc::IN_CREATE | libc::IN_ISDIR, "d"), &mut out);
        t.end_batch();
        let names: Vec<&str> = out.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["d", "d/f"]);
        // The kernel's own report of d/f (it appeared after d was watched, before the
        // walk read d) comes in the next batch: skipped. A later one is not.
        let d = *t.dirs.iter().find(|(_, p)| p.as_os_str() == "d").unwrap().0;
        let mut next = Vec::new();
        t.translate(raw(d, libc::IN_CREATE, "f"), &mut next);
        t.translate(raw(d, libc::IN_MODIFY, "f"), &mut next);
        t.end_batch();
        t.translate(raw(d, libc::IN_CREATE, "f"), &mut next);
        let kinds: Vec<_> = next.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("d/f", WatchEventKind::Write),
                ("d/f", WatchEventKind::Create)
            ]
        );
    }

    #[test]
    fn a_directory_moved_within_the_tree_reports_under_its_new_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/in")).unwrap();
        let mut t = tree(dir.path());
        let mut out = Vec::new();
        t.add_subtree(Path::new("a"), false, &mut out);
        let inner = *t
            .dirs
            .iter()
            .find(|(_, p)| p.as_os_str() == "a/in")
            .unwrap()
            .0;
        let root = t.root_wd;
        let moved = |mask, name: &str| RawEvent {
            cookie: 7,
            ..raw(root, mask | libc::IN_ISDIR, name)
        };
        t.translate(moved(libc::IN_MOVED_FROM, "a"), &mut out);
        t.translate(moved(libc::IN_MOVED_TO, "b"), &mut out);
        t.translate(raw(inner, libc::IN_CREATE, "x"), &mut out);
        t.end_batch();
        let names: Vec<&str> = out.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "b/in/x"]);
        // Moved out of the tree (no move-in pairs it): no longer watched.
        t.translate(moved(libc::IN_MOVED_FROM, "b"), &mut out);
        t.end_batch();
        assert_eq!(t.dirs.len(), 1, "only the root is left: {:?}", t.dirs);
    }
}
