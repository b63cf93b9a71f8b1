//! Fresh identifiers and secrets: sandbox and snapshot ids, tokens and keys, all from
//! the kernel's CSPRNG. A module of its own so that what needs one (the manager, the
//! server's token, the agent keys) does not import the manager for it.

/// `n` random bytes as hex, from the kernel's CSPRNG.
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert_eq!(got, n as isize, "getrandom failed");
    hex::encode(buf)
}

/// A new id such as `sb-3f9a1c2b7d4e`: `prefix`, then 6 random bytes in hex.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", random_hex(6))
}
