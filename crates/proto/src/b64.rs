//! Standard base64 (RFC 4648, `+/` alphabet, `=` padding) for binary payloads in JSON.
//!
//! File contents, exec stdin/stdout and entropy travel inside JSON frames, and JSON has
//! no byte-string type. The coding itself is the `base64` crate's standard engine, which
//! is strict: padding is required, trailing bits must be zero, and whitespace or other
//! bytes outside the alphabet are refused (producers are programs; a guest's frame that
//! is not canonical base64 is an error, not something to repair).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serializer};

/// Why a base64 string could not be decoded (the offending byte and offset, or a bad
/// length or padding).
pub use base64::DecodeError;

/// Length of the encoding of `n` bytes.
pub const fn encoded_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Encode bytes as padded standard base64.
pub fn encode(data: &[u8]) -> String {
    STANDARD.encode(data)
}

/// Decode padded standard base64.
pub fn decode(text: &str) -> Result<Vec<u8>, DecodeError> {
    STANDARD.decode(text)
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
    fn rejects_what_is_not_canonical_padded_base64() {
        for bad in [
            "abc",      // not a multiple of 4
            "Zg",       // padding missing
            "ab$=",     // outside the alphabet
            "a===",     // too much padding
            "Zg==Zg==", // padding before the end
            "Zh==",     // trailing bits set (not what any encoder writes)
            "Zm9v\n",   // whitespace
            "Zm9v-_==", // the URL-safe alphabet
        ] {
            assert!(decode(bad).is_err(), "{bad:?} was accepted");
        }
        let e = decode("ab$=").unwrap_err();
        assert!(e.to_string().contains("2"), "the offset is named: {e}");
    }

    #[test]
    fn serde_helpers_refuse_bad_input_with_a_message() {
        #[derive(Debug, serde::Deserialize)]
        struct Frame {
            #[serde(with = "bytes")]
            data: Vec<u8>,
            #[serde(default, with = "opt_bytes")]
            stdin: Option<Vec<u8>>,
        }
        let ok: Frame = serde_json::from_str(r#"{"data":"aGk=","stdin":null}"#).unwrap();
        assert_eq!((ok.data, ok.stdin), (b"hi".to_vec(), None));
        let e = serde_json::from_str::<Frame>(r#"{"data":"aGk"}"#).unwrap_err();
        assert!(e.to_string().to_lowercase().contains("padding"), "{e}");
    }
}
