//! A sandbox's metadata: the user's own key/value labels, set at create, inherited by
//! branch children (with `zygote.parent` added), shown in every sandbox view, and used
//! to filter the list (`GET /v1/sandboxes?metadata=key=value`, several ANDed).
use std::collections::BTreeMap;

use crate::error::{RequestError, Result};

pub type Metadata = BTreeMap<String, String>;

/// Most keys one sandbox has (including those zygote adds).
pub const MAX_METADATA_KEYS: usize = 64;
pub const MAX_METADATA_KEY_LEN: usize = 128;
pub const MAX_METADATA_VALUE_LEN: usize = 1024;
/// Keys starting with this are zygote's own: users cannot set them.
pub const RESERVED_PREFIX: &str = "zygote.";
/// Set on every branch child: the sandbox it was branched from.
pub const PARENT_KEY: &str = "zygote.parent";

fn check_key(k: &str) -> Result<()> {
    let ok = !k.is_empty()
        && k.len() <= MAX_METADATA_KEY_LEN
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
    if !ok {
        return Err(RequestError::invalid(format!(
            "metadata key {k:?} must be 1-{MAX_METADATA_KEY_LEN} characters of A-Z a-z 0-9 . _ - /"
        )));
    }
    Ok(())
}

/// What a user may give at create.
pub fn validate_metadata(m: &Metadata) -> Result<()> {
    // Room for the keys zygote adds to a branch child.
    if m.len() > MAX_METADATA_KEYS - 1 {
        return Err(RequestError::invalid(format!(
            "metadata has {} keys; at most {}",
            m.len(),
            MAX_METADATA_KEYS - 1
        )));
    }
    for (k, v) in m {
        check_key(k)?;
        if k.starts_with(RESERVED_PREFIX) {
            return Err(RequestError::invalid(format!(
                "metadata key {k:?}: keys starting with {RESERVED_PREFIX:?} are zygote's own"
            )));
        }
        if v.len() > MAX_METADATA_VALUE_LEN || v.contains('\0') {
            return Err(RequestError::invalid(format!(
                "metadata value of {k:?} must be at most {MAX_METADATA_VALUE_LEN} bytes, without NUL"
            )));
        }
    }
    Ok(())
}

/// A branch child's metadata: its parent's, the branch request's own labels over them,
/// and where it came from.
pub fn for_child(parent_id: &str, parent: &Metadata, extra: Option<&Metadata>) -> Result<Metadata> {
    let mut m = parent.clone();
    if let Some(extra) = extra {
        m.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    m.insert(PARENT_KEY.into(), parent_id.into());
    if m.len() > MAX_METADATA_KEYS {
        return Err(RequestError::invalid(format!(
            "a child would have {} metadata keys with its parent's; at most {MAX_METADATA_KEYS}",
            m.len()
        )));
    }
    Ok(m)
}

/// The `metadata=key=value` pairs of a list query (other parameters are refused).
pub fn parse_filters(query: Option<&str>) -> Result<Vec<(String, String)>> {
    let mut filters = Vec::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if name != "metadata" {
            return Err(RequestError::invalid(format!(
                "unknown query parameter {name:?} (filter with metadata=key=value)"
            )));
        }
        let Some((k, v)) = value.split_once('=') else {
            return Err(RequestError::invalid(format!(
                "metadata filter {value:?}: want key=value"
            )));
        };
        check_key(k)?;
        filters.push((k.to_string(), v.to_string()));
    }
    Ok(filters)
}

/// Whether `m` has every filter's key with that value.
pub fn matches(m: &Metadata, filters: &[(String, String)]) -> bool {
    filters.iter().all(|(k, v)| m.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> Metadata {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keys_and_values_are_bounded_and_zygote_keys_reserved() {
        validate_metadata(&meta(&[("team", "search"), ("run/id", "a-1.2_x")])).unwrap();
        for bad in [
            meta(&[("", "x")]),
            meta(&[("sp ace", "x")]),
            meta(&[("zygote.parent", "sb-1")]),
            meta(&[("k", &"v".repeat(MAX_METADATA_VALUE_LEN + 1))]),
            meta(&[(&"k".repeat(MAX_METADATA_KEY_LEN + 1), "v")]),
        ] {
            assert!(validate_metadata(&bad).is_err(), "{bad:?}");
        }
        let many: Metadata = (0..MAX_METADATA_KEYS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        let e = validate_metadata(&many).unwrap_err();
        assert!(e.to_string().contains("at most 63"), "{e}");
    }

    #[test]
    fn filters_are_anded_pairs() {
        let f = parse_filters(Some("metadata=team%3Dsearch&metadata=stage=2")).unwrap();
        assert_eq!(
            f,
            [
                ("team".into(), "search".into()),
                ("stage".into(), "2".into())
            ]
        );
        let m = meta(&[("team", "search"), ("stage", "2"), ("x", "y")]);
        assert!(matches(&m, &f));
        assert!(!matches(&meta(&[("team", "search")]), &f));
        assert!(matches(&m, &[]));
        assert!(parse_filters(None).unwrap().is_empty());
        assert!(parse_filters(Some("metadata=novalue")).is_err());
        assert!(parse_filters(Some("state=running")).is_err());
    }

    #[test]
    fn a_child_inherits_and_names_its_parent() {
        let c = for_child("sb-1", &meta(&[("team", "search")]), None).unwrap();
        assert_eq!(c, meta(&[("team", "search"), ("zygote.parent", "sb-1")]));
        let extra = meta(&[("team", "ranking"), ("owner", "k8s")]);
        let c = for_child("sb-1", &meta(&[("team", "search")]), Some(&extra)).unwrap();
        assert_eq!(
            c,
            meta(&[
                ("team", "ranking"),
                ("owner", "k8s"),
                ("zygote.parent", "sb-1")
            ])
        );
        let full: Metadata = (0..MAX_METADATA_KEYS - 1)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        assert!(for_child("sb-1", &full, Some(&extra)).is_err());
    }
}
