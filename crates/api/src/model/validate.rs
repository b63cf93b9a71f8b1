//! The [`Validate`] trait and the checks request types share.
use crate::error::{RequestError, Result};

pub trait Validate {
    fn validate(&self) -> Result<()>;
}

/// Names (sandbox/snapshot labels, hostnames): 1-63 of `[a-z0-9-]`, not
/// starting or ending with `-` (so every name is also a valid hostname).
pub fn validate_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(RequestError::invalid(format!(
            "{what} {name:?} must be 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'"
        )))
    }
}

/// Guest paths must be absolute, without NUL, at most 4096 bytes.
pub fn validate_guest_path(path: &str) -> Result<()> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(RequestError::invalid(format!(
            "path {path:?} must be absolute, at most 4096 bytes, without NUL"
        )));
    }
    Ok(())
}

pub fn in_range<T: PartialOrd + std::fmt::Display>(what: &str, v: T, lo: T, hi: T) -> Result<()> {
    if v < lo || v > hi {
        return Err(RequestError::invalid(format!(
            "{what} must be in {lo}..={hi}, got {v}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_hostname_safe() {
        for ok in ["a", "web-1", "x0"] {
            assert!(validate_name("name", ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"x".repeat(64)] {
            assert!(validate_name("name", bad).is_err(), "{bad}");
        }
    }
}
