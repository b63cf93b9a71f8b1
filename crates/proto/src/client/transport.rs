//! Byte streams the client can run over, and how to open them.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::ClientError;

/// A bidirectional byte stream the client can split into a reader (owned by
/// its demultiplexing thread) and a writer (shared by callers).
///
/// Splitting needs a second handle to the same stream, which generic
/// `Read + Write` values cannot provide, hence this trait; it is implemented
/// for TCP and Unix sockets. Other transports can implement it, or use
/// [`super::AgentClient::from_split`] with separate halves.
pub trait ReadWrite: Read + Write + Send + 'static {
    /// A second handle to the same underlying stream.
    fn try_clone_rw(&self) -> io::Result<Box<dyn ReadWrite>>;
    /// Shut the stream down in both directions, waking a blocked reader.
    fn shutdown_rw(&self) -> io::Result<()>;
}

impl ReadWrite for TcpStream {
    fn try_clone_rw(&self) -> io::Result<Box<dyn ReadWrite>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_rw(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Both)
    }
}

impl ReadWrite for UnixStream {
    fn try_clone_rw(&self) -> io::Result<Box<dyn ReadWrite>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_rw(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Both)
    }
}

/// Resolve `addr` and connect to the first address that answers within `timeout`.
pub(super) fn tcp(addr: &str, timeout: Duration) -> Result<TcpStream, ClientError> {
    use std::net::ToSocketAddrs;
    let connect_err = |source| ClientError::Connect {
        target: addr.to_string(),
        source,
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
    for sa in addr.to_socket_addrs().map_err(connect_err)? {
        match TcpStream::connect_timeout(&sa, timeout) {
            Ok(s) => {
                // Requests are small and latency-sensitive; don't let Nagle hold them.
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(connect_err(last))
}

pub(super) fn unix(path: &Path) -> Result<UnixStream, ClientError> {
    UnixStream::connect(path).map_err(|source| ClientError::Connect {
        target: path.display().to_string(),
        source,
    })
}

/// Connect to a hybrid-vsock Unix socket (Firecracker / cloud-hypervisor
/// style): the host side of the guest's vsock is a Unix socket, and the first
/// line selects the guest port. Protocol: send `CONNECT <port>\n`, receive
/// `OK <host-port>\n`; after that the stream carries our frames.
pub(super) fn vsock_uds(
    path: &Path,
    port: u32,
    timeout: Duration,
) -> Result<UnixStream, ClientError> {
    let mut stream = unix(path)?;
    let handshake = |e: io::Error| ClientError::Handshake(e.to_string());
    stream.set_read_timeout(Some(timeout)).map_err(handshake)?;
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .map_err(handshake)?;
    // Read byte by byte: a buffered reader could swallow the start of the
    // first frame that follows the reply line.
    let line = read_line_unbuffered(&mut stream, 64).map_err(handshake)?;
    match line.strip_prefix("OK ") {
        Some(rest) if rest.trim().parse::<u32>().is_ok() => {}
        _ => {
            return Err(ClientError::Handshake(format!(
                "expected `OK <port>` after CONNECT {port}, got {line:?}"
            )))
        }
    }
    stream.set_read_timeout(None).map_err(handshake)?;
    Ok(stream)
}

fn read_line_unbuffered(r: &mut impl Read, max: usize) -> io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        if r.read(&mut byte)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed after {:?}",
                    String::from_utf8_lossy(&line)
                ),
            ));
        }
        if byte[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
        if line.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "handshake line too long",
            ));
        }
    }
}
