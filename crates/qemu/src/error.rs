use std::time::Duration;

use zygote_proto::client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error("cannot run {program}: {source} (install qemu-system-x86 and qemu-utils)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("qemu-img could not create the overlay: {0}")]
    Overlay(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("KVM acceleration requested but unavailable: {0}")]
    KvmUnavailable(String),
    #[error(
        "QEMU exited during boot ({status})\n--- qemu stderr ---\n{stderr}\n\
         --- serial console (last lines) ---\n{serial_tail}"
    )]
    Exited {
        status: String,
        stderr: String,
        serial_tail: String,
    },
    #[error(
        "the guest agent did not answer within {after:?} (last error: {last_error})\n\
         --- serial console (last lines) ---\n{serial_tail}"
    )]
    BootTimeout {
        after: Duration,
        last_error: String,
        serial_tail: String,
    },
    #[error("agent: {0}")]
    Agent(#[from] ClientError),
    #[error(transparent)]
    Images(#[from] zygote_images::ImageError),
}
