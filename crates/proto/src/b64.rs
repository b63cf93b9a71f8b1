//! Standard base64 (RFC 4648, `+/` alphabet, `=` padding).
//!
//! Binary payloads (file contents, exec stdin/stdout, entropy) travel inside
//! JSON frames, and JSON has no byte-string type. A few dozen lines here keep the
//! crate dependency-light, which matters because the agent is a static binary
//! shipped into every guest image.

use serde::{Deserialize, Deserializer, Serializer};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Why a base64 string could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("base64 length {0} is not a multiple of 4")]
    BadLength(usize),
    #[error("invalid base64 byte 0x{byte:02x} at offset {offset}")]
    BadByte { byte: u8, offset: usize },
}

/// Length of the encoding of `n` bytes.
pub const fn encoded_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Encode bytes as padded standard base64.
pub fn encode(data: &[u8]) -> String {
    let mut out = Vec::with_capacity(encoded_len(data.len()));
    let mut chunks = data.chunks_exact(3);
    for c in &mut chunks {
        let n = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
        out.extend_from_slice(&[
            ALPHABET[(n >> 18) as usize & 63],
            ALPHABET[(n >> 12) as usize & 63],
            ALPHABET[(n >> 6) as usize & 63],
            ALPHABET[n as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend_from_slice(&[
                ALPHABET[(n >> 18) as usize & 63],
                ALPHABET[(n >> 12) as usize & 63],
                b'=',
                b'=',
            ]);
        }
        [a, b] => {
            let n = (u32::from(a) << 16) | (u32::from(b) << 8);
            out.extend_from_slice(&[
                ALPHABET[(n >> 18) as usize & 63],
                ALPHABET[(n >> 12) as usize & 63],
                ALPHABET[(n >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
    // Every byte pushed comes from ALPHABET or is '=', so this cannot fail.
    String::from_utf8(out).expect("base64 output is ASCII")
}

fn sextet(byte: u8, offset: usize) -> Result<u32, DecodeError> {
    let v = match byte {
        b'A'..=b'Z' => byte - b'A',
        b'a'..=b'z' => byte - b'a' + 26,
        b'0'..=b'9' => byte - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return Err(DecodeError::BadByte { byte, offset }),
    };
    Ok(u32::from(v))
}

/// Decode padded standard base64. Whitespace is not accepted: producers are
/// programs, and rejecting it keeps the decoder strict and simple.
pub fn decode(text: &str) -> Result<Vec<u8>, DecodeError> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return Err(DecodeError::BadLength(bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let last = bytes.len() / 4;
    for (i, quad) in bytes.chunks_exact(4).enumerate() {
        let base = i * 4;
        let pad = if i + 1 == last {
            quad.iter().rev().take_while(|&&b| b == b'=').count()
        } else {
            0
        };
        if pad > 2 {
            return Err(DecodeError::BadByte {
                byte: b'=',
                offset: base + 1,
            });
        }
        let mut n = 0u32;
        for (j, &b) in quad.iter().enumerate() {
            let v = if j >= 4 - pad {
                0
            } else {
                sextet(b, base + j)?
            };
            n = (n << 6) | v;
        }
        let three = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&three[..3 - pad]);
    }
    Ok(out)
}

/// `#[serde(with = "b64::bytes")]` for `Vec<u8>` fields.
pub mod bytes {
    use super::*;

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        decode(&text).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "b64::opt_bytes")]` for `Option<Vec<u8>>` fields.
pub mod opt_bytes {
    use super::*;

    pub fn serialize<S: Serializer>(data: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match data {
            Some(d) => s.serialize_some(&encode(d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text = Option::<std::borrow::Cow<str>>::deserialize(d)?;
        text.map(|t| decode(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, enc) in cases {
            assert_eq!(encode(plain.as_bytes()), enc);
            assert_eq!(decode(enc).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn all_byte_values_round_trip() {
        for len in 0..300 {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let enc = encode(&data);
            assert_eq!(enc.len(), encoded_len(len));
            assert_eq!(decode(&enc).unwrap(), data);
        }
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(decode("abc"), Err(DecodeError::BadLength(3)));
        assert!(matches!(
            decode("ab$="),
            Err(DecodeError::BadByte { byte: b'$', .. })
        ));
        assert!(decode("a===").is_err());
        // Padding is only legal in the final quad.
        assert!(decode("Zg==Zg==").is_err());
    }
}
