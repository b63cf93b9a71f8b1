//! A file upload streamed into a sandbox: the body is read as it arrives (optionally
//! gunzipped), written to a hidden staging file next to the target in chunks of at
//! most [`UPLOAD_CHUNK`] bytes through the agent's append, then renamed over the
//! target. The daemon holds one chunk at a time whatever the file's size; a reader
//! sees the old file or the whole new one, never a part.
//!
//! Bounds: [`MAX_STREAMED_UPLOAD_BYTES`] of (decompressed) data, so a gzip bomb stops
//! there. A failed or abandoned upload (client gone, bad gzip, guest disk full) removes
//! its staging file; a daemon killed mid-upload leaves it (a dot file named
//! `.<name>.zygote-upload-*`, never the target).
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use zygote_proto::client::AgentClient;
use zygote_proto::{Owner, WriteFileRequest};

use super::Manager;
use crate::error::{Error, Result};
use crate::model::validate_guest_path;

/// Bytes of the file one streamed upload may write.
pub const MAX_STREAMED_UPLOAD_BYTES: u64 = 16 << 30;
/// Bytes sent to the agent per append (well under its frame limit).
const UPLOAD_CHUNK: usize = 4 << 20;

static UPLOADS: AtomicU64 = AtomicU64::new(0);

impl Manager {
    /// Writes the bytes `body` yields to `path` (gunzipped when `gzip`), owned by
    /// `owner`, creating its parents; returns the size written.
    pub async fn write_file_stream(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        owner: Option<Owner>,
        body: mpsc::Receiver<io::Result<Bytes>>,
        gzip: bool,
    ) -> Result<u64> {
        validate_guest_path(path)?;
        let Some((dir, name)) = path.rsplit_once('/').filter(|(_, n)| !n.is_empty()) else {
            return Err(Error::invalid(format!("{path} names no file")));
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let staging = format!(
            "{dir}/.{name}.zygote-upload-{nanos:x}-{:x}",
            UPLOADS.fetch_add(1, Ordering::Relaxed)
        );
        let target = path.to_string();
        let client = self.agent(id).await?;
        self.blocking(move || {
            let body = ChannelReader {
                rx: body,
                current: Bytes::new(),
                received: 0,
            };
            let mut reader: Box<dyn Read> = if gzip {
                Box::new(flate2::read::MultiGzDecoder::new(body))
            } else {
                Box::new(body)
            };
            let result = stage(&client, &mut reader, &staging, owner).and_then(|size| {
                client.rename(&staging, &target).map_err(Error::agent)?;
                Ok(size)
            });
            if result.is_err() {
                let _ = client.remove(&staging, false);
            }
            result
        })
        .await?
    }
}

/// Appends everything `reader` yields to `staging`; its size.
fn stage(
    client: &AgentClient,
    reader: &mut dyn Read,
    staging: &str,
    owner: Option<Owner>,
) -> Result<u64> {
    let mut buf = vec![0u8; UPLOAD_CHUNK];
    let mut total = 0u64;
    let mut first = true;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::invalid(format!("the upload body: {e}"))),
            }
        }
        total += filled as u64;
        if total > MAX_STREAMED_UPLOAD_BYTES {
            return Err(Error::PayloadTooLarge {
                limit: MAX_STREAMED_UPLOAD_BYTES as usize,
            });
        }
        if filled > 0 || first {
            client
                .write_file_with(WriteFileRequest {
                    path: staging.to_string(),
                    data: buf[..filled].to_vec(),
                    mode: None,
                    append: true,
                    create_parents: first,
                    owner,
                })
                .map_err(Error::agent)?;
        }
        first = false;
        if filled < buf.len() {
            return Ok(total);
        }
    }
}

/// The request body's chunks as a blocking `Read` (for the upload's blocking thread);
/// past [`MAX_STREAMED_UPLOAD_BYTES`] received it fails, so a compressed body that
/// never decompresses to anything (endless empty gzip members) ends too.
struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
    received: u64,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(chunk) => self.current = chunk?,
            }
            self.received += self.current.len() as u64;
            if self.received > MAX_STREAMED_UPLOAD_BYTES {
                return Err(io::Error::other(format!(
                    "over {MAX_STREAMED_UPLOAD_BYTES} bytes"
                )));
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}
