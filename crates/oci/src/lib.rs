//! OCI images for zygote (under construction).
pub mod apply;
mod error;

pub use error::{OciError, Result};
