//! The query of `GET /v1/sandboxes/{id}/logs`: how much of the console log's end.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{in_range, Validate};
use crate::error::Result;

/// The bound of a sandbox's console log: the daemon keeps at most this many bytes of it
/// (the boot and the latest output), so a query asks for at most as many.
pub const LOG_CAP: u64 = 2 * 1024 * 1024;

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    /// At most this many bytes from the end of the console log (1..=2097152, default:
    /// all of it, which is at most that: the log keeps the boot and the latest output).
    #[serde(default)]
    #[param(minimum = 1, maximum = 2097152)]
    pub tail_bytes: Option<u64>,
}

impl LogsQuery {
    /// Bytes to serve from the end of the log.
    pub fn bytes(&self) -> u64 {
        self.tail_bytes.unwrap_or(LOG_CAP)
    }
}

impl Validate for LogsQuery {
    fn validate(&self) -> Result<()> {
        if let Some(n) = self.tail_bytes {
            in_range("tail_bytes", n, 1, LOG_CAP)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_range_is_the_log_cap() {
        assert_eq!(LOG_CAP, 2_097_152, "update the documented maximum");
        let q = |n| LogsQuery { tail_bytes: n };
        assert!(q(Some(0)).validate().is_err());
        assert!(q(Some(LOG_CAP + 1)).validate().is_err());
        assert!(q(Some(LOG_CAP)).validate().is_ok());
        assert_eq!(q(None).bytes(), LOG_CAP);
    }
}
