//! Work inside a sandbox through its agent: exec (collected or streamed)
//! and files.
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};
use zygote_proto::b64;
use zygote_proto::client::{AgentClient, ClientError};
use zygote_proto::{FileKind, Stream, WriteFileRequest};

use super::event_notes::Ended;
use super::exec_cancel::ExecGuard;
use super::Manager;
use crate::error::{Error, Result};
use crate::model::{
    validate_guest_path, DirListing, ExecEvent, ExecRequest, ExecResponse, FileEntry, Validate,
    WriteResult, MAX_FILE_BYTES,
};

/// Output kept per stream by the non-streaming exec; the rest is dropped
/// (with a note) so one chatty program cannot exhaust the daemon's memory.
const MAX_COLLECTED: usize = 16 * 1024 * 1024;

fn stream_name(s: Stream) -> &'static str {
    match s {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    }
}

impl Manager {
    /// `req` as the agent gets it: the sandbox's envs and secrets (over its OCI image's
    /// `Env`), the request's own `env` over them; the image's working directory and
    /// user where the request names none.
    pub(super) fn agent_exec(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<zygote_proto::ExecRequest> {
        let mut agent_req = req.to_agent();
        let sandbox_env = self.sandbox_row(id)?.env;
        let mut env = sandbox_env.exec_env();
        env.append(&mut agent_req.env);
        agent_req.env = env;
        sandbox_env.image.defaults_for(&mut agent_req);
        Ok(agent_req)
    }

    pub async fn exec(self: &Arc<Self>, id: &str, req: ExecRequest) -> Result<ExecResponse> {
        req.validate()?;
        let started = Instant::now();
        let agent_req = self.agent_exec(id, &req)?;
        let client = self.agent(id).await?;
        self.note_command_started(id, &req, None, "exec");
        // Dropped with this future when the HTTP client goes away: kills the program.
        let guard = ExecGuard::new(client.clone(), id);
        let shared = guard.shared();
        let res = self
            .blocking(move || {
                let handle = client.spawn_exec(agent_req)?;
                if !shared.started(handle.id()) {
                    return Err(ClientError::Closed("the request was abandoned".into()));
                }
                let (mut out, mut err) = (Vec::new(), Vec::new());
                let r = handle.wait(|stream, data| {
                    let buf = match stream {
                        Stream::Stdout => &mut out,
                        Stream::Stderr => &mut err,
                    };
                    let room = MAX_COLLECTED.saturating_sub(buf.len());
                    buf.extend_from_slice(&data[..data.len().min(room)]);
                });
                r.map(|r| (r, out, err))
            })
            .await;
        guard.finish();
        let (r, out, err) = res?.map_err(Error::agent)?;
        self.metrics.exec.observe(started.elapsed());
        let end = Ended {
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            duration_ms: r.duration_ms,
        };
        self.note_command_ended(id, &req, &end);
        Ok(ExecResponse {
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            duration_ms: r.duration_ms,
            stdout: String::from_utf8_lossy(&out).into_owned(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
        })
    }

    /// Starts a program and returns its events as they happen. Errors that
    /// prevent the start (bad request, no such sandbox, program not found)
    /// are returned here, so they become proper HTTP errors. If the
    /// receiver is dropped (client gone), the program is killed.
    pub async fn exec_stream(
        self: &Arc<Self>,
        id: &str,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        req.validate()?;
        let started = Instant::now();
        let agent_req = self.agent_exec(id, &req)?;
        let client = self.agent(id).await?;
        let (tx, rx) = mpsc::channel(64);
        let (started_tx, started_rx) = oneshot::channel();
        let (ended_tx, ended_rx) = oneshot::channel::<()>();
        // The receiver goes with the HTTP response body: when the client disconnects it
        // is dropped, and the program is killed at once (not when it next prints).
        let guard = ExecGuard::new(client.clone(), id);
        let shared = guard.shared();
        let watched = tx.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = watched.closed() => drop(guard),
                _ = ended_rx => guard.finish(),
            }
        });
        let (this, sandbox) = (self.clone(), id.to_string());
        tokio::task::spawn_blocking(move || {
            let _ended = ended_tx;
            let handle = match client.spawn_exec(agent_req) {
                Ok(h) => h,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            if !shared.started(handle.id()) {
                // The request was abandoned while the program started: dropping the
                // handle kills it.
                return;
            }
            let _ = tx.blocking_send(ExecEvent::Started { pid: handle.pid() });
            let _ = started_tx.send(Ok(()));
            this.note_command_started(&sandbox, &req, Some(handle.pid()), "stream");
            // A send fails only once the receiver is gone, and then the guard has
            // already killed the program: its exit ends this wait.
            let result = handle.wait(|stream, data| {
                let _ = tx.blocking_send(ExecEvent::Output {
                    stream: stream_name(stream).into(),
                    data: b64::encode(data),
                });
            });
            let last = match result {
                Ok(r) => {
                    this.metrics.exec.observe(started.elapsed());
                    let end = Ended {
                        exit_code: r.exit_code,
                        signal: r.signal,
                        timed_out: r.timed_out,
                        duration_ms: r.duration_ms,
                    };
                    this.note_command_ended(&sandbox, &req, &end);
                    ExecEvent::Exit {
                        exit_code: r.exit_code,
                        signal: r.signal,
                        timed_out: r.timed_out,
                        duration_ms: r.duration_ms,
                    }
                }
                Err(e) => {
                    let err = Error::agent(e);
                    let body = err.body();
                    ExecEvent::Error {
                        code: body.error.code,
                        message: body.error.message,
                    }
                }
            };
            let _ = tx.blocking_send(last);
        });
        started_rx
            .await
            .map_err(|_| Error::Internal("exec task ended early".into()))?
            .map_err(Error::agent)?;
        Ok(rx)
    }

    /// A guest file for the API. A regular file is streamed chunk by chunk as the client
    /// takes them ([`FileBody::Stream`]): the daemon holds at most a couple of chunks,
    /// whatever the file's size, and stops reading in the guest when the client goes
    /// away. Anything else (a device, FIFO or socket) only with `special`, read whole up
    /// to [`MAX_FILE_BYTES`]: the bound holds for the bytes actually read, so /dev/zero
    /// cannot make the daemon buffer more. The first chunk is read before answering, so
    /// a missing or unreadable file is an error status, not a broken body.
    pub async fn read_file(
        self: &Arc<Self>,
        id: &str,
        path: String,
        special: bool,
    ) -> Result<FileBody> {
        validate_guest_path(&path)?;
        let p = path.clone();
        let meta = self.agent_call(id, move |c| c.stat(&p)).await?;
        if meta.kind == FileKind::Other {
            if !special {
                return Err(Error::invalid(format!(
                    "{path} is not a regular file (a device, FIFO or socket); add \
                     special=true to read it anyway (at most {} MiB)",
                    MAX_FILE_BYTES >> 20
                )));
            }
            let read = self
                .agent_call(id, move |c| c.read_file_up_to(&path, MAX_FILE_BYTES as u64))
                .await?;
            return read.map(FileBody::Whole).ok_or(Error::PayloadTooLarge {
                limit: MAX_FILE_BYTES,
            });
        }
        let p = path.clone();
        let first = self
            .agent_call(id, move |c| c.read_file_range(&p, 0, Some(STREAM_CHUNK)))
            .await?;
        let size = first.size;
        let (tx, chunks) = mpsc::channel(1);
        let client = self.agent(id).await?;
        tokio::task::spawn_blocking(move || stream_file(&client, &path, first, &tx));
        Ok(FileBody::Stream { size, chunks })
    }

    pub async fn write_file(
        self: &Arc<Self>,
        id: &str,
        path: String,
        mode: Option<String>,
        owner: Option<zygote_proto::Owner>,
        data: Vec<u8>,
    ) -> Result<WriteResult> {
        validate_guest_path(&path)?;
        let mode = match mode {
            None => None,
            Some(m) => Some(
                u32::from_str_radix(&m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        Error::invalid(format!("mode {m:?} is not octal permission bits"))
                    })?,
            ),
        };
        let size = data.len() as u64;
        let p = path.clone();
        let data = Arc::new(data);
        self.agent_call(id, move |c| {
            c.write_file_with(WriteFileRequest {
                path: p.clone(),
                data: data.to_vec(),
                mode,
                append: false,
                create_parents: true,
                owner,
            })
        })
        .await?;
        Ok(WriteResult { path, size })
    }

    pub async fn list_dir(self: &Arc<Self>, id: &str, path: String) -> Result<DirListing> {
        validate_guest_path(&path)?;
        let p = path.clone();
        let entries = self.agent_call(id, move |c| c.list_dir(&p)).await?;
        Ok(DirListing {
            path,
            entries: entries
                .into_iter()
                .map(|e| FileEntry {
                    kind: e.meta.kind.as_str().into(),
                    name: e.name,
                    size: e.meta.size,
                    mode: e.meta.mode,
                    mtime: e.meta.mtime,
                })
                .collect(),
        })
    }
}

/// What reading a guest file came to (decided in the agent call, answered after it).
/// Bytes asked of the agent per request while streaming a file.
const STREAM_CHUNK: u64 = 1 << 20;

/// A guest file's contents, as [`Manager::read_file`] hands them to the API.
pub enum FileBody {
    Whole(Vec<u8>),
    /// Chunks in order; an error ends the stream early (the client sees a cut body).
    Stream {
        /// The size the guest reported when the read began.
        size: u64,
        chunks: mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    },
}

/// Sends `first` and the rest of the file down `tx`, one chunk at a time; stops as soon
/// as the receiver is gone (the HTTP client left), so the guest reads no further.
fn stream_file(
    client: &AgentClient,
    path: &str,
    first: zygote_proto::FileChunk,
    tx: &mpsc::Sender<std::io::Result<bytes::Bytes>>,
) {
    let mut chunk = first;
    let mut offset = 0u64;
    loop {
        if chunk.offset != offset {
            let e = format!("{path}: asked for offset {offset}, got {}", chunk.offset);
            let _ = tx.blocking_send(Err(std::io::Error::other(e)));
            return;
        }
        if chunk.data.is_empty() && !chunk.eof {
            let e = format!("{path}: empty chunk before the end of the file");
            let _ = tx.blocking_send(Err(std::io::Error::other(e)));
            return;
        }
        offset += chunk.data.len() as u64;
        let eof = chunk.eof;
        if !chunk.data.is_empty() && tx.blocking_send(Ok(chunk.data.into())).is_err() {
            tracing::debug!("reading {path}: the client left at byte {offset}");
            return;
        }
        if eof {
            return;
        }
        chunk = match client.read_file_range(path, offset, Some(STREAM_CHUNK)) {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.blocking_send(Err(std::io::Error::other(format!("{path}: {e}"))));
                return;
            }
        };
    }
}
