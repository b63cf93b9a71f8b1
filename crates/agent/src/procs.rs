//! Background processes (`spawn`, `processes`, `process_output`, `process_stdin`,
//! `process_signal`): programs that outlive the request that started them.
//!
//! Each one gets a thread running the same poll loop as an exec ([`exec::pump`]), which
//! appends its output to a bounded ring instead of sending it. Readers come with a byte
//! offset (stdout and stderr counted together) and get what was printed since, waiting on
//! a condition variable when there is nothing yet; whoever asks, on whichever connection,
//! sees the same ring. The table lives in the agent, not in a connection, so a daemon
//! that disconnects or restarts finds its processes where it left them, and a branched
//! or restored guest carries them (and their output so far) along.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use zygote_proto::process::{
    OutputChunk, ProcessInfo, ProcessOutput, ProcessOutputRequest, ProcessState,
    ProcessStdinRequest, MAX_OUTPUT_READ, MAX_OUTPUT_WAIT_MS, MAX_PROCESSES, PROCESS_OUTPUT_RING,
};
use zygote_proto::{ErrorBody, ErrorCode, ExecRequest, ExecResult, Response, Stream};

use crate::exec::{self, Started};
use crate::reaper::Reaper;

/// Longest a `process_stdin` write waits for a program that is not reading.
const STDIN_WRITE_WAIT: Duration = Duration::from_secs(10);

fn err(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, message)
}

/// The last [`PROCESS_OUTPUT_RING`] bytes a process printed, as chunks in order.
#[derive(Default)]
struct OutputRing {
    chunks: VecDeque<(Stream, Vec<u8>)>,
    /// Offset of the first byte still kept.
    start: u64,
    /// Bytes printed in all (the offset the next byte gets).
    end: u64,
}

impl OutputRing {
    fn push(&mut self, stream: Stream, data: &[u8]) {
        match self.chunks.back_mut() {
            // Small writes of one stream coalesce, so a chatty program does not cost a
            // chunk header per line.
            Some((s, last)) if *s == stream && last.len() < 4096 => last.extend_from_slice(data),
            _ => self.chunks.push_back((stream, data.to_vec())),
        }
        self.end += data.len() as u64;
        let mut excess = (self.end - self.start).saturating_sub(PROCESS_OUTPUT_RING as u64);
        while excess > 0 {
            let Some((_, front)) = self.chunks.front_mut() else {
                break;
            };
            let cut = (excess as usize).min(front.len());
            if cut == front.len() {
                self.chunks.pop_front();
            } else {
                front.drain(..cut);
            }
            self.start += cut as u64;
            excess -= cut as u64;
        }
    }

    /// Up to `max` bytes from `offset` (or from the oldest byte kept, if later):
    /// (first offset, chunks).
    fn read(&self, offset: u64, max: usize) -> (u64, Vec<OutputChunk>) {
        let from = offset.clamp(self.start, self.end);
        let mut out = Vec::new();
        let mut pos = self.start;
        let mut room = max;
        for (stream, data) in &self.chunks {
            let chunk_end = pos + data.len() as u64;
            if chunk_end > from && room > 0 {
                let skip = (from.saturating_sub(pos)) as usize;
                let take = (data.len() - skip).min(room);
                out.push(OutputChunk {
                    stream: *stream,
                    data: data[skip..skip + take].to_vec(),
                });
                room -= take;
            }
            pos = chunk_end;
        }
        (from, out)
    }
}

struct Status {
    ring: OutputRing,
    /// Set once the program has ended and its output is all in the ring.
    exit: Option<ExecResult>,
}

struct Process {
    pid: u32,
    argv: Vec<String>,
    started_unix_ms: u64,
    status: Mutex<Status>,
    /// Signalled on new output and on the end.
    changed: Condvar,
    /// The write end of its stdin pipe, until closed (`eof`) or the program ends.
    stdin: Mutex<Option<OwnedFd>>,
}

impl Process {
    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stdin(&self) -> MutexGuard<'_, Option<OwnedFd>> {
        self.stdin.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn info_with(&self, st: &Status) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid,
            argv: self.argv.clone(),
            state: if st.exit.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            exit: st.exit.clone(),
            started_unix_ms: self.started_unix_ms,
            output_bytes: st.ring.end,
            stdin_open: self.stdin().is_some(),
        }
    }

    fn info(&self) -> ProcessInfo {
        let st = self.status();
        self.info_with(&st)
    }
}

/// Every background process the agent started, oldest first.
#[derive(Default)]
pub(crate) struct ProcessTable {
    list: Mutex<Vec<Arc<Process>>>,
}

impl ProcessTable {
    fn list(&self) -> MutexGuard<'_, Vec<Arc<Process>>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, pid: u32) -> Result<Arc<Process>, ErrorBody> {
        self.list()
            .iter()
            .find(|p| p.pid == pid)
            .cloned()
            .ok_or_else(|| err(ErrorCode::NotFound, format!("no background process {pid}")))
    }

    /// Start `req` in the background and begin collecting its output.
    pub(crate) fn spawn(&self, reaper: &Reaper, req: ExecRequest) -> Result<Response, ErrorBody> {
        // Room first, so a full table refuses before anything starts.
        {
            let mut list = self.list();
            if list.len() >= MAX_PROCESSES {
                let oldest_ended = list.iter().position(|p| p.status().exit.is_some());
                match oldest_ended {
                    Some(i) => drop(list.remove(i)),
                    None => {
                        return Err(err(
                            ErrorCode::LimitReached,
                            format!(
                                "{MAX_PROCESSES} background processes are running, the \
                                 most the agent keeps: end one before starting another"
                            ),
                        ))
                    }
                }
            }
        }
        crate::fds::admit("background process")?;
        let Started {
            pid,
            at,
            stdin,
            outputs,
            watch,
        } = exec::start(reaper, &req, true)?;
        let started_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let process = Arc::new(Process {
            pid: pid as u32,
            argv: req.argv.clone(),
            started_unix_ms,
            status: Mutex::new(Status {
                ring: OutputRing::default(),
                exit: None,
            }),
            changed: Condvar::new(),
            stdin: Mutex::new(None),
        });
        {
            let mut list = self.list();
            // The kernel reuses the pid of a process that ended: the new one replaces it.
            list.retain(|p| p.pid != process.pid);
            list.push(process.clone());
        }
        let initial = req.stdin.unwrap_or_default();
        let deadline = req
            .timeout_ms
            .and_then(|ms| at.checked_add(Duration::from_millis(ms)));
        let collector = process.clone();
        let collect = move || {
            let mut sink = |stream: Stream, data: &[u8]| {
                collector.status().ring.push(stream, data);
                collector.changed.notify_all();
            };
            let (status, timed_out) = exec::pump(pid, outputs, None, watch, deadline, &mut sink);
            collector.stdin().take();
            collector.status().exit = Some(exec::exec_result(status, timed_out, at));
            collector.changed.notify_all();
        };
        if let Err(e) = thread::Builder::new()
            .name(format!("bg-{pid}"))
            .spawn(collect)
        {
            // Nobody would collect it: do not leave it running unobserved.
            exec::kill_group(pid);
            self.list().retain(|p| !Arc::ptr_eq(p, &process));
            return Err(ErrorBody::from_io("cannot start an output thread", &e));
        }
        if let Some(fd) = stdin {
            exec::set_nonblocking(&fd);
            *process.stdin() = Some(fd);
        }
        let info = process.info();
        if !initial.is_empty() {
            // Written from its own thread: a program that reads its stdin slowly must
            // not hold up the answer. The thread takes the stdin lock before the answer
            // goes out, so a `process_stdin` sent after it waits its turn and the
            // program reads the initial data first.
            let writer = process.clone();
            let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
            let started = thread::Builder::new()
                .name(format!("bg-{pid}-stdin"))
                .spawn(move || {
                    let guard = writer.stdin();
                    let _ = locked_tx.send(());
                    let _ = writer.write_stdin_locked(guard, &initial, false);
                });
            if started.is_ok() {
                let _ = locked_rx.recv();
            }
        }
        Ok(Response::Spawned(info))
    }

    pub(crate) fn processes(&self) -> Response {
        let list: Vec<_> = self.list().clone();
        Response::Processes {
            processes: list.iter().map(|p| p.info()).collect(),
        }
    }

    pub(crate) fn output(&self, req: &ProcessOutputRequest) -> Result<Response, ErrorBody> {
        if req.wait_ms > MAX_OUTPUT_WAIT_MS {
            return Err(err(
                ErrorCode::BadRequest,
                format!("wait_ms {} exceeds {MAX_OUTPUT_WAIT_MS}", req.wait_ms),
            ));
        }
        let process = self.find(req.pid)?;
        let deadline = Instant::now() + Duration::from_millis(req.wait_ms);
        let mut st = process.status();
        while st.ring.end <= req.offset && st.exit.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = process
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let (offset, chunks) = st.ring.read(req.offset, MAX_OUTPUT_READ);
        let next_offset = offset + chunks.iter().map(|c| c.data.len() as u64).sum::<u64>();
        Ok(Response::ProcessOutput(ProcessOutput {
            chunks,
            offset,
            next_offset,
            process: process.info_with(&st),
        }))
    }

    pub(crate) fn stdin(&self, req: &ProcessStdinRequest) -> Result<Response, ErrorBody> {
        self.find(req.pid)?.write_stdin(&req.data, req.eof)?;
        Ok(Response::Ok)
    }

    pub(crate) fn signal(&self, pid: u32, signal: i32) -> Result<Response, ErrorBody> {
        if !(1..=64).contains(&signal) {
            return Err(err(
                ErrorCode::BadRequest,
                format!("signal {signal} out of range 1..=64"),
            ));
        }
        let process = self.find(pid)?;
        // `exit` is set a moment after the reaper collects the program (its output is
        // drained first); until then the group id may still name the processes it left
        // behind, and the kernel hands out pids in sequence, so it does not name a
        // stranger's group that soon.
        let st = process.status();
        if st.exit.is_some() {
            return Err(exited(pid));
        }
        // SAFETY: kill(2) has no memory-safety preconditions.
        if unsafe { libc::kill(-(pid as libc::pid_t), signal) } != 0 {
            let e = io::Error::last_os_error();
            return Err(ErrorBody::from_io(&format!("signal process {pid}"), &e));
        }
        Ok(Response::Ok)
    }
}

fn exited(pid: u32) -> ErrorBody {
    err(
        ErrorCode::ProcessExited,
        format!("background process {pid} has exited"),
    )
}

impl Process {
    /// Write all of `data` to stdin (waiting up to [`STDIN_WRITE_WAIT`] for the program
    /// to read), then close it when `eof`.
    fn write_stdin(&self, data: &[u8], eof: bool) -> Result<(), ErrorBody> {
        self.write_stdin_locked(self.stdin(), data, eof)
    }

    /// [`Self::write_stdin`] with the stdin lock already taken (`guard`).
    fn write_stdin_locked(
        &self,
        mut guard: MutexGuard<'_, Option<OwnedFd>>,
        data: &[u8],
        eof: bool,
    ) -> Result<(), ErrorBody> {
        let Some(fd) = guard.as_ref() else {
            // Lock order is status, then stdin (see `info_with`).
            drop(guard);
            return Err(if self.status().exit.is_some() {
                exited(self.pid)
            } else {
                err(
                    ErrorCode::BadRequest,
                    format!("the stdin of process {} is closed", self.pid),
                )
            });
        };
        let deadline = Instant::now() + STDIN_WRITE_WAIT;
        let mut written = 0;
        while written < data.len() {
            let n = unsafe {
                libc::write(
                    fd.as_raw_fd(),
                    data[written..].as_ptr().cast(),
                    data.len() - written,
                )
            };
            if n >= 0 {
                written += n as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(err(
                            ErrorCode::Busy,
                            format!(
                                "process {} did not read its stdin for {}s ({written} of {} \
                                 bytes written)",
                                self.pid,
                                STDIN_WRITE_WAIT.as_secs(),
                                data.len()
                            ),
                        ));
                    }
                    let mut p = libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    let ms = left.as_millis().min(1000) as i32 + 1;
                    unsafe { libc::poll(&mut p, 1, ms) };
                }
                // EPIPE: the program closed its stdin (or ended).
                _ => {
                    guard.take();
                    return Err(ErrorBody::from_io(
                        &format!("write to the stdin of process {}", self.pid),
                        &e,
                    ));
                }
            }
        }
        if eof {
            guard.take();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(chunks: &[OutputChunk]) -> String {
        chunks
            .iter()
            .map(|c| String::from_utf8_lossy(&c.data).into_owned())
            .collect()
    }

    #[test]
    fn the_ring_reads_from_any_offset_in_print_order() {
        let mut ring = OutputRing::default();
        ring.push(Stream::Stdout, b"hello ");
        ring.push(Stream::Stderr, b"oops ");
        ring.push(Stream::Stdout, b"world");
        let (from, chunks) = ring.read(0, usize::MAX);
        assert_eq!(from, 0);
        assert_eq!(text(&chunks), "hello oops world");
        assert_eq!(
            chunks.iter().map(|c| c.stream).collect::<Vec<_>>(),
            [Stream::Stdout, Stream::Stderr, Stream::Stdout]
        );
        let (from, chunks) = ring.read(8, 4);
        assert_eq!((from, text(&chunks)), (8, "ps w".to_string()));
        let (from, chunks) = ring.read(ring.end, 100);
        assert_eq!((from, chunks.len()), (16, 0));
        // An offset past the end reads nothing, from the end.
        assert_eq!(ring.read(99, 10).0, 16);
    }

    #[test]
    fn the_ring_drops_the_oldest_bytes_beyond_its_bound() {
        let mut ring = OutputRing::default();
        let block = vec![b'a'; 300 * 1024];
        for _ in 0..4 {
            ring.push(Stream::Stdout, &block);
            ring.push(Stream::Stderr, b"!");
        }
        assert_eq!(ring.end, 4 * (300 * 1024 + 1));
        assert_eq!(ring.end - ring.start, PROCESS_OUTPUT_RING as u64);
        let kept: usize = ring.chunks.iter().map(|(_, d)| d.len()).sum();
        assert_eq!(kept, PROCESS_OUTPUT_RING);
        // Asking for dropped output starts at the oldest byte kept.
        let (from, chunks) = ring.read(0, usize::MAX);
        assert_eq!(from, ring.start);
        assert_eq!(chunks.iter().map(|c| c.data.len()).sum::<usize>(), kept);
        assert_eq!(chunks.last().unwrap().data, b"!");
    }
}
