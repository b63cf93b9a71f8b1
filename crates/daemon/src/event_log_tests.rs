//! The event log's tests: order, filters, bounds, torn lines, hostile ids.
use super::*;

fn log() -> (tempfile::TempDir, EventLog) {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::new(dir.path().join("events"));
    (dir, log)
}

fn messages(events: &[SandboxEvent]) -> Vec<&str> {
    events.iter().map(|e| e.message.as_str()).collect()
}

#[test]
fn events_come_back_in_order_filtered_and_limited() {
    let (_d, log) = log();
    log.record(
        "sb-1",
        EventLevel::Info,
        "created",
        &[("image", "base".into())],
    );
    log.record("sb-1", EventLevel::Warn, "agent slow", &[]);
    log.record(
        "sb-1",
        EventLevel::Error,
        "died",
        &[("reason", "oom".into())],
    );
    log.record("sb-2", EventLevel::Info, "other sandbox", &[]);
    let all = log.read("sb-1", &EventsQuery::default());
    assert_eq!(messages(&all), ["created", "agent slow", "died"]);
    assert_eq!(all[0].fields["image"], "base");
    assert!(all.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms));
    let newest = EventsQuery {
        order: Some(EventOrder::Desc),
        limit: Some(2),
        ..Default::default()
    };
    assert_eq!(messages(&log.read("sb-1", &newest)), ["died", "agent slow"]);
    let warn = EventsQuery {
        level: Some(EventLevel::Warn),
        search: Some("d".into()),
        ..Default::default()
    };
    assert_eq!(messages(&log.read("sb-1", &warn)), ["died"]);
    log.remove("sb-1");
    assert!(log.read("sb-1", &EventsQuery::default()).is_empty());
    assert_eq!(log.read("sb-2", &EventsQuery::default()).len(), 1);
}

#[test]
fn a_log_stays_bounded_and_keeps_its_newest_events() {
    let (d, log) = log();
    let big = "x".repeat(MAX_TEXT * 4);
    for i in 0..3000 {
        log.record("sb-1", EventLevel::Info, &format!("event {i} {big}"), &[]);
    }
    let size = std::fs::metadata(d.path().join("events/sb-1.jsonl"))
        .unwrap()
        .len();
    assert!(size <= MAX_LOG_BYTES + 2 * MAX_TEXT as u64, "{size} bytes");
    let all = log.read(
        "sb-1",
        &EventsQuery {
            limit: Some(1000),
            order: Some(EventOrder::Desc),
            ..Default::default()
        },
    );
    assert!(
        all[0].message.starts_with("event 2999 "),
        "the newest survives"
    );
    assert!(
        all.iter()
            .all(|e| e.message.len() <= MAX_TEXT + '…'.len_utf8()),
        "texts are cut"
    );
}

#[test]
fn a_torn_line_is_skipped_and_writing_goes_on() {
    let (d, log) = log();
    log.record("sb-1", EventLevel::Info, "before", &[]);
    let path = d.path().join("events/sb-1.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(br#"{"ts_ms":1,"level":"info","mess"#).unwrap();
    drop(f);
    log.record("sb-1", EventLevel::Info, "after", &[]);
    // Only the torn line is lost.
    let got = log.read("sb-1", &EventsQuery::default());
    assert_eq!(messages(&got), ["before", "after"]);
}

#[test]
fn ids_that_are_not_the_daemons_never_name_a_file() {
    let (d, log) = log();
    for id in ["../escape", "a/b", "", ".", "sb-1\0", &"a".repeat(65)] {
        log.record(id, EventLevel::Info, "x", &[]);
        assert!(log.read(id, &EventsQuery::default()).is_empty());
    }
    assert!(!d.path().join("escape.jsonl").exists());
    let made: Vec<_> = std::fs::read_dir(d.path().join("events"))
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(made.is_empty(), "{made:?}");
}

#[test]
fn orphans_go_and_the_living_stay() {
    let (d, log) = log();
    log.record("sb-live", EventLevel::Info, "x", &[]);
    log.record("sb-gone", EventLevel::Info, "x", &[]);
    std::fs::write(d.path().join("events/sb-gone.jsonl.compacting"), b"half").unwrap();
    log.remove_orphans(|id| id == "sb-live");
    let left: Vec<_> = std::fs::read_dir(d.path().join("events"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["sb-live.jsonl"]);
}
