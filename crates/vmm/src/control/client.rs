//! Blocking client for a VMM control socket, one connection per request (so no reply
//! can be taken for an earlier request's, and no connection idles out between uses).
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use super::protocol::{ErrorBody, Reply, Request};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the VMM at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("VMM control I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("VMM sent an unreadable reply: {0}")]
    Decode(String),
    #[error("VMM refused the request ({}): {}", .0.code, .0.message)]
    Refused(ErrorBody),
}

impl ClientError {
    /// The VMM's error code, when it refused the request.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Refused(e) => Some(&e.code),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ControlClient {
    path: PathBuf,
    timeout: Duration,
}

impl ControlClient {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            timeout: Duration::from_secs(600),
        }
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Wait until the socket accepts connections (the VMM is up) or the deadline passes.
    pub fn wait_ready(&self, deadline: Instant) -> Result<(), ClientError> {
        loop {
            match UnixStream::connect(&self.path) {
                Ok(_) => return Ok(()),
                Err(source) if Instant::now() >= deadline => {
                    return Err(ClientError::Connect {
                        path: self.path.clone(),
                        source,
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Send one request and return the raw reply.
    pub fn call(&self, req: &Request) -> Result<Reply, ClientError> {
        let mut stream =
            UnixStream::connect(&self.path).map_err(|source| ClientError::Connect {
                path: self.path.clone(),
                source,
            })?;
        stream.set_read_timeout(Some(self.timeout))?;
        let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Decode(e.to_string()))?;
        line.push(b'\n');
        stream.write_all(&line)?;
        let mut reply = String::new();
        BufReader::new(&stream).read_line(&mut reply)?;
        if reply.is_empty() {
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "VMM closed the connection without replying",
            )));
        }
        serde_json::from_str(&reply).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Send a request and decode a successful reply's data.
    pub fn request<T: DeserializeOwned>(&self, req: &Request) -> Result<T, ClientError> {
        let reply = self.call(req)?;
        if !reply.ok {
            return Err(ClientError::Refused(reply.error.unwrap_or(ErrorBody {
                code: "internal".into(),
                message: "error reply without details".into(),
            })));
        }
        serde_json::from_value(reply.data.unwrap_or(serde_json::Value::Null))
            .map_err(|e| ClientError::Decode(e.to_string()))
    }
}
