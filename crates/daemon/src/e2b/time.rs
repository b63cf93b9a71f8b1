//! RFC 3339 timestamps, the form E2B's API carries times in (`startedAt`, `endAt`);
//! zygote's own API uses unix seconds.

/// `secs` (unix seconds, UTC) as `YYYY-MM-DDTHH:MM:SSZ`. Seconds past year 9999 (which
/// RFC 3339 cannot write) are shown as its last second.
pub fn rfc3339(secs: u64) -> String {
    use time::format_description::well_known::Rfc3339;
    const LAST: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let secs = i64::try_from(secs).unwrap_or(LAST).min(LAST);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "9999-12-31T23:59:59Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_seconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400 + 3661), "2000-02-29T01:01:01Z");
        assert_eq!(rfc3339(253_402_300_799), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
    }
}
