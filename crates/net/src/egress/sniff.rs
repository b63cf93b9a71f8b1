//! The name a guest's connection asks for, read from its first bytes: the TLS
//! ClientHello's server name (SNI, RFC 6066 section 3) or the plain HTTP request's
//! `Host` header (with its method and path, for the egress record). Pure and bounded:
//! the caller feeds what it has read so far, at most [`MAX_SNIFF_BYTES`], and gets
//! either an answer or "need more"; nothing here trusts a length it has not checked
//! against what is there.
use std::fmt;

/// The most bytes read from a connection before it must have named its host.
pub const MAX_SNIFF_BYTES: usize = 16 * 1024;

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet.
    NeedMore,
    /// A TLS ClientHello naming this host (lower-case).
    Tls { host: String },
    /// A plain HTTP request.
    Http {
        host: String,
        method: String,
        path: String,
    },
    /// The connection names no host it could be judged by.
    Unnamed(NoName),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoName {
    /// Neither TLS nor an HTTP request line.
    UnknownProtocol,
    /// TLS, but the ClientHello has no server name.
    NoSni,
    /// A ClientHello or HTTP head that is malformed or past the bounds.
    Malformed,
    /// An HTTP request without a `Host` header, or with two.
    NoHost,
    /// The host named is not a DNS name (an address literal, odd bytes).
    NotAName,
}

impl fmt::Display for NoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NoName::UnknownProtocol => "neither TLS nor HTTP",
            NoName::NoSni => "TLS without a server name (SNI)",
            NoName::Malformed => "malformed TLS ClientHello or HTTP head",
            NoName::NoHost => "HTTP request without exactly one Host header",
            NoName::NotAName => "the host named is not a DNS name",
        })
    }
}

/// Reads the first bytes of a connection.
pub fn sniff(buf: &[u8]) -> Sniffed {
    match buf.first() {
        None => Sniffed::NeedMore,
        Some(0x16) => tls(buf),
        Some(b) if b.is_ascii_uppercase() => http(buf),
        Some(_) => Sniffed::Unnamed(NoName::UnknownProtocol),
    }
}

/// A DNS name as a host may be named: letters, digits, `-`, `_` and dots, 1..=253
/// bytes, not all digits and dots (an address). Lower-cased, trailing dot dropped.
fn checked_name(raw: &[u8]) -> Result<String, NoName> {
    let raw = raw.strip_suffix(b".").unwrap_or(raw);
    let ok = !raw.is_empty()
        && raw.len() <= 253
        && raw
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && !raw.iter().all(|b| b.is_ascii_digit() || *b == b'.');
    if !ok {
        return Err(NoName::NotAName);
    }
    Ok(String::from_utf8_lossy(raw).to_ascii_lowercase())
}

/// Big-endian integer of `n` bytes at `at`, if there.
fn be(buf: &[u8], at: usize, n: usize) -> Option<usize> {
    let bytes = buf.get(at..at.checked_add(n)?)?;
    Some(
        bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b)),
    )
}

/// The handshake bytes of the TLS records at the start of `buf` (a ClientHello may
/// span several records), or None if a record is not a handshake record.
fn handshake_bytes(buf: &[u8]) -> Option<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        if buf[at] != 0x16 {
            return None;
        }
        let Some(len) = be(buf, at + 3, 2) else {
            return Some((out, false));
        };
        // A record is at most 2^14 bytes of plaintext (RFC 8446 5.1).
        if len == 0 || len > 16384 || buf.get(at + 1) != Some(&3) {
            return None;
        }
        let body = at + 5;
        match buf.get(body..body + len) {
            Some(b) => out.extend_from_slice(b),
            None => {
                out.extend_from_slice(&buf[body.min(buf.len())..]);
                return Some((out, false));
            }
        }
        at = body + len;
    }
    Some((out, true))
}

fn tls(buf: &[u8]) -> Sniffed {
    let Some((hs, _)) = handshake_bytes(buf) else {
        return Sniffed::Unnamed(NoName::Malformed);
    };
    // Handshake header: type 1 (ClientHello), 24-bit length.
    let Some(msg_len) = be(&hs, 1, 3) else {
        return Sniffed::NeedMore;
    };
    if hs[0] != 1 || msg_len > MAX_SNIFF_BYTES {
        return Sniffed::Unnamed(NoName::Malformed);
    }
    let Some(hello) = hs.get(4..4 + msg_len) else {
        return if buf.len() >= MAX_SNIFF_BYTES {
            Sniffed::Unnamed(NoName::Malformed)
        } else {
            Sniffed::NeedMore
        };
    };
    match server_name(hello) {
        Ok(Some(host)) => Sniffed::Tls { host },
        Ok(None) => Sniffed::Unnamed(NoName::NoSni),
        Err(e) => Sniffed::Unnamed(e),
    }
}

/// The host_name of the server_name extension of a whole ClientHello body.
fn server_name(hello: &[u8]) -> Result<Option<String>, NoName> {
    let bad = NoName::Malformed;
    // version (2), random (32), session id (1 + n).
    let mut at = 34;
    at += 1 + be(hello, at, 1).ok_or(bad)?;
    // cipher suites (2 + n), compression methods (1 + n).
    at += 2 + be(hello, at, 2).ok_or(bad)?;
    at += 1 + be(hello, at, 1).ok_or(bad)?;
    if at == hello.len() {
        return Ok(None); // no extensions at all
    }
    let ext_len = be(hello, at, 2).ok_or(bad)?;
    at += 2;
    let end = at
        .checked_add(ext_len)
        .filter(|e| *e <= hello.len())
        .ok_or(bad)?;
    while at < end {
        let kind = be(hello, at, 2).ok_or(bad)?;
        let len = be(hello, at + 2, 2).ok_or(bad)?;
        let data = hello.get(at + 4..at + 4 + len).ok_or(bad)?;
        at += 4 + len;
        if kind != 0 {
            continue;
        }
        // server_name_list: 2-byte length, then (type, 2-byte length, name) entries.
        let list_len = be(data, 0, 2).ok_or(bad)?;
        let list = data.get(2..2 + list_len).ok_or(bad)?;
        let mut i = 0;
        while i < list.len() {
            let name_type = list[i];
            let n = be(list, i + 1, 2).ok_or(bad)?;
            let name = list.get(i + 3..i + 3 + n).ok_or(bad)?;
            if name_type == 0 {
                return checked_name(name).map(Some);
            }
            i += 3 + n;
        }
        return Ok(None);
    }
    if at != end {
        return Err(bad);
    }
    Ok(None)
}

fn http(buf: &[u8]) -> Sniffed {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= MAX_SNIFF_BYTES {
            Sniffed::Unnamed(NoName::Malformed)
        } else {
            // Nothing but an HTTP method's letters may come first.
            let line = buf.split(|b| *b == b' ').next().unwrap_or_default();
            if line.len() > 16 || !line.iter().all(u8::is_ascii_uppercase) {
                Sniffed::Unnamed(NoName::UnknownProtocol)
            } else {
                Sniffed::NeedMore
            }
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..head_end]) else {
        return Sniffed::Unnamed(NoName::Malformed);
    };
    let mut lines = head.split("\r\n");
    let request: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    let [method, target, version] = request.as_slice() else {
        return Sniffed::Unnamed(NoName::UnknownProtocol);
    };
    if method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !version.starts_with("HTTP/1.")
    {
        return Sniffed::Unnamed(NoName::UnknownProtocol);
    }
    let hosts: Vec<&str> = lines
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.trim())
        .collect();
    let [host] = hosts.as_slice() else {
        return Sniffed::Unnamed(NoName::NoHost);
    };
    // host[:port]
    let name = match host.rsplit_once(':') {
        Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host,
    };
    let host = match checked_name(name.as_bytes()) {
        Ok(h) => h,
        Err(e) => return Sniffed::Unnamed(e),
    };
    // An absolute-form target must name the same host (else a proxy-style request
    // could say one host in Host and mean another).
    if let Some(rest) = target.strip_prefix("http://") {
        let authority = rest.split('/').next().unwrap_or_default();
        let target_host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
        if !target_host.eq_ignore_ascii_case(&host) {
            return Sniffed::Unnamed(NoName::NoHost);
        }
    }
    let path: String = target.chars().take(512).collect();
    Sniffed::Http {
        host,
        method: method.to_string(),
        path,
    }
}

#[cfg(test)]
#[path = "sniff_tests.rs"]
mod tests;
