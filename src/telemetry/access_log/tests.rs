use super::*;
use crate::clock::civil_from_days;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn at(secs: u64, micros: u32) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(u64::from(micros))
}

fn stamp(t: SystemTime) -> String {
    let mut out = Vec::new();
    write_timestamp(&mut out, t);
    String::from_utf8(out).unwrap()
}

#[test]
fn timestamps_are_rfc3339_utc_with_microseconds() {
    assert_eq!(stamp(at(0, 0)), "1970-01-01T00:00:00.000000Z");
    assert_eq!(stamp(at(951_782_400, 7)), "2000-02-29T00:00:00.000007Z");
    assert_eq!(stamp(at(1_735_689_599, 999_999)), "2024-12-31T23:59:59.999999Z");
    assert_eq!(stamp(at(1_804_447_033, 139_256)), "2027-03-07T19:17:13.139256Z");
    assert_eq!(stamp(at(4_107_542_400, 0)), "2100-03-01T00:00:00.000000Z");
    assert_eq!(stamp(at(4_107_542_399, 0)), "2100-02-28T23:59:59.000000Z");
    // The cached second is not reused for the next one.
    assert_eq!(stamp(at(59, 1)), "1970-01-01T00:00:59.000001Z");
    assert_eq!(stamp(at(60, 1)), "1970-01-01T00:01:00.000001Z");
    assert_eq!(
        stamp(UNIX_EPOCH - Duration::from_secs(5)),
        "1970-01-01T00:00:00.000000Z"
    );
}

#[test]
fn every_day_for_four_centuries_follows_the_day_before() {
    // Walk day by day from the epoch and check the calendar by hand.
    let (mut y, mut m, mut d) = (1970u64, 1u64, 1u64);
    for days in 0..146_097u64 {
        assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let len = match m {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        d += 1;
        if d > len {
            d = 1;
            m += 1;
            if m > 12 {
                m = 1;
                y += 1;
            }
        }
    }
}

/// An `out` shared with the test: what was written, and a gate that
/// holds every write while shut.
#[derive(Clone, Default)]
struct Held {
    out: Arc<Mutex<Vec<u8>>>,
    shut: Arc<std::sync::atomic::AtomicBool>,
}

impl Write for Held {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        while self.shut.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.out.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits (5 s at most) for `f` to hold.
fn eventually(f: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !f() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Producers on several threads, a writer that sleeps on an empty queue
/// and is woken only then: every line handed over is written, once,
/// whatever the interleaving; and after the stop a batch is dropped and
/// counted, not held.
#[test]
fn a_writer_woken_only_from_sleep_loses_no_batch() {
    let sink = Sink::new(Format::Json);
    let held = Held::default();
    let (threads, batches) = (4, 300);
    std::thread::scope(|s| {
        let mut out = held.clone();
        let sink = &sink;
        let writer = s.spawn(move || sink.write_until_stopped(&mut out));
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..batches {
                    sink.give(format!("{t}.{i}\n").into_bytes(), 1);
                    if i % 50 == 0 {
                        // Let the writer find the queue empty and sleep.
                        std::thread::sleep(Duration::from_millis(15));
                    }
                }
            });
        }
        let all = eventually(|| held.out.lock().unwrap().iter().filter(|&&b| b == b'\n').count() == threads * batches);
        sink.stop();
        writer.join().unwrap();
        assert!(all, "every batch written without a stop to wake the writer");
    });
    let text = String::from_utf8(held.out.lock().unwrap().clone()).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), threads * batches, "each line once");
    assert_eq!(sink.queued.load(Ordering::SeqCst), 0);
    assert_eq!(sink.queued_bytes.load(Ordering::SeqCst), 0);
    assert_eq!(sink.dropped.load(Ordering::SeqCst), 0);
    sink.give(b"late\n".to_vec(), 1);
    assert_eq!(
        sink.dropped.load(Ordering::SeqCst),
        1,
        "a stopped writer's batch is dropped"
    );
}

/// A stuck stdout: past [`MAX_QUEUED_BYTES`] batches are dropped (long
/// paths make long lines: the line bound alone would let 128 000 of them
/// wait), and what fit is written once stdout moves again.
#[test]
fn a_stuck_writer_holds_at_most_the_byte_bound() {
    let sink = Sink::new(Format::Json);
    let held = Held::default();
    held.shut.store(true, Ordering::SeqCst);
    let mib = vec![b'x'; 1 << 20];
    std::thread::scope(|s| {
        let mut out = held.clone();
        let sink = &sink;
        let writer = s.spawn(move || sink.write_until_stopped(&mut out));
        for _ in 0..70 {
            sink.give(mib.clone(), 1);
        }
        let (dropped, queued) = (
            sink.dropped.load(Ordering::SeqCst),
            sink.queued_bytes.load(Ordering::SeqCst),
        );
        held.shut.store(false, Ordering::SeqCst);
        let drained = eventually(|| sink.queued_bytes.load(Ordering::SeqCst) == 0);
        sink.stop();
        writer.join().unwrap();
        assert_eq!(dropped, 70 - (MAX_QUEUED_BYTES >> 20) as u64);
        assert!(queued <= MAX_QUEUED_BYTES, "{queued} bytes waited");
        assert!(drained);
    });
    assert_eq!(held.out.lock().unwrap().len(), MAX_QUEUED_BYTES);
}

/// A writer that dies (here, a panicking stdout) stops the sink: lines
/// handed over later are dropped and counted instead of piling up.
#[test]
fn a_dead_writer_drops_lines_instead_of_holding_them() {
    struct Panics;
    impl Write for Panics {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            panic!("stdout broke");
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink: &'static Sink = Box::leak(Box::new(Sink::new(Format::Json)));
    let writer = std::thread::spawn(move || sink.write_until_stopped(&mut Panics));
    sink.give(b"first\n".to_vec(), 1);
    assert!(writer.join().is_err(), "the writer died");
    sink.give(b"second\n".to_vec(), 1);
    assert_eq!(sink.dropped.load(Ordering::SeqCst), 1);
    assert!(sink.queue.lock().recover().batches.is_empty(), "nothing held");
}

/// The one test that starts the process's writer (it is started once
/// per process): batches reach it when due, and a stuck one drops
/// lines instead of holding anyone up. Lines of other tests that may
/// reach the same writer are told apart by their request id.
#[test]
fn batches_are_written_when_due_and_a_stuck_stdout_drops_lines_without_blocking() {
    use std::time::Instant;
    let stdout = Held::default();
    let (out, stuck) = (stdout.out.clone(), stdout.shut.clone());
    let guard = start(Format::Json, Box::new(stdout)).expect("the first start");
    assert_eq!(format(), Some(Format::Json));
    const ID: &str = "batch-test-7f3a";
    let line = Line {
        request_id: ID,
        route: "r",
        method: "GET",
        path: "/",
        status: 200,
        identity: "subnet",
        outcome: "-",
        limit: "-",
        key: "-",
        upstream: "-",
        micros: 1,
        ..Line::minimal(200)
    };
    let written = || {
        let out = out.lock().unwrap();
        String::from_utf8_lossy(&out).lines().filter(|l| l.contains(ID)).count()
    };
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while written() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(written(), n);
    };
    // Any thread but a worker hands each line over at once.
    std::thread::scope(|s| {
        s.spawn(|| record_json(&line));
    });
    wait_for(1);
    // A worker's line waits for its batch to be due: by age here.
    std::thread::scope(|s| {
        s.spawn(|| {
            batch_this_thread();
            record_json(&line);
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(written(), 1, "a worker's first line waits for its batch");
            std::thread::sleep(Duration::from_millis(BATCH_AGE_MS));
            record_json(&line);
        });
    });
    wait_for(3);
    // By size, and whatever is left when the worker idles or stops.
    std::thread::scope(|s| {
        s.spawn(|| {
            batch_this_thread();
            let per_line = {
                let mut one = Vec::new();
                write_json(&mut one, &line, crate::clock::wall_now());
                one.len()
            };
            for _ in 0..BATCH_BYTES / per_line + 1 {
                record_json(&line);
            }
            record_json(&line);
            flush_thread();
        });
    });
    let n = 3 + BATCH_BYTES / (written_len(&line)) + 2;
    wait_for(n);
    // A stdout that takes nothing: lines past the bound are dropped and
    // counted, and recording never waits.
    stuck.store(true, Ordering::SeqCst);
    let before = dropped();
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..MAX_QUEUED_LINES + 1_000 {
                record_json(&line);
            }
        });
    });
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "recording never waits on stdout"
    );
    assert!(dropped() - before >= 999, "dropped {}", dropped() - before);
    stuck.store(false, Ordering::SeqCst);
    drop(guard);
}

fn written_len(line: &Line<'_>) -> usize {
    let mut one = Vec::new();
    write_json(&mut one, line, crate::clock::wall_now());
    one.len()
}

/// What the `tracing` JSON layer, set up as main.rs set it up before,
/// writes for the same event.
fn tracing_json(line: &Line<'_>) -> String {
    use tracing_subscriber::prelude::*;
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let layer = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(false)
        .with_writer(move || writer.clone());
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let path = line.path.to_string();
        tracing::info!(
            target: "access",
            request_id = line.request_id,
            route = line.route,
            method = line.method,
            path = %path,
            status = line.status,
            identity = line.identity,
            outcome = line.outcome,
            limit = line.limit,
            key = line.key,
            upstream = line.upstream,
            ms = line.micros as f64 / 1_000.0,
        );
    });
    let out = buf.0.lock().unwrap().clone();
    String::from_utf8(out).unwrap()
}

/// The line without its timestamp's value (the two are written at
/// different instants).
fn without_time(s: &str) -> String {
    let start = s.find("\"timestamp\":\"").unwrap() + 13;
    let end = start + s[start..].find('"').unwrap();
    format!("{}{}", &s[..start], &s[end..])
}

#[test]
fn json_lines_are_what_the_tracing_layer_wrote() {
    let lines = [
        Line {
            request_id: "51c81f0d7ed84f21adc97a6d28c70fe7",
            route: "all",
            method: "GET",
            path: "/",
            status: 200,
            identity: "subnet",
            outcome: "admitted",
            limit: "-",
            key: "-",
            upstream: "backend",
            micros: 1_511,
            fields: Fields::FIRST,
            ..Line::minimal(200)
        },
        Line {
            request_id: "\"quoted\\\" \u{1} \t\n\r\u{8}\u{c}\u{7f}",
            route: "ünïcödé ☃",
            method: "PURGE",
            path: "/a%20b/\u{1f}x",
            status: 429,
            identity: "-",
            outcome: "limited",
            limit: "five",
            key: "9f86d081884c7d65",
            upstream: "-",
            micros: 0,
            fields: Fields::FIRST,
            ..Line::minimal(200)
        },
    ];
    let mut micros: Vec<u64> = (0..3_000).collect();
    micros.extend([
        10_000,
        99_999,
        100_000,
        1_000_001,
        123_456_789,
        3_600_000_000,
        u64::from(u32::MAX),
    ]);
    for line in lines {
        for &m in &micros {
            let line = Line { micros: m, ..line };
            let mut ours = Vec::new();
            write_json(&mut ours, &line, crate::clock::wall_now());
            let ours = String::from_utf8(ours).unwrap();
            let theirs = tracing_json(&line);
            assert_eq!(without_time(&ours), without_time(&theirs), "micros {m}");
            let v: serde_json::Value = serde_json::from_str(&ours).unwrap();
            assert_eq!(v["ms"].as_f64().unwrap(), m as f64 / 1_000.0);
        }
    }
}

#[test]
fn the_new_fields_are_json_and_can_be_left_out() {
    let cost = [("tokens", 120), ("per \"day\"", 1)];
    let line = Line {
        request_id: "r1",
        client: Some("2001:db8::7".parse().unwrap()),
        tenant: "acme",
        key_id: "beta",
        bytes_in: 12,
        bytes_out: 3_456,
        upstream_target: "127.0.0.1:8080",
        upstream_micros: Some(2_500),
        cost: &cost,
        aborted: true,
        ..Line::minimal(200)
    };
    let mut out = Vec::new();
    write_json(&mut out, &line, crate::clock::wall_now());
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["client"], "2001:db8::7");
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["key_id"], "beta");
    assert_eq!(v["bytes_in"], 12);
    assert_eq!(v["bytes_out"], 3_456);
    assert_eq!(v["upstream_target"], "127.0.0.1:8080");
    assert_eq!(v["upstream_ms"], 2.5);
    assert_eq!(v["cost"]["tokens"], 120);
    assert_eq!(v["cost"]["per \"day\""], 1);
    assert_eq!(v["aborted"], true);
    let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys.len(), 2 + FIELD_NAMES.len());
    // Left out: no key at all; nothing reached the upstream: null.
    let fields = Fields::parse(&["-client", "-key_id", "-path"]).unwrap();
    let mut out = Vec::new();
    write_json(
        &mut out,
        &Line {
            fields,
            upstream_micros: None,
            cost: &[],
            ..line
        },
        crate::clock::wall_now(),
    );
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    for gone in ["client", "key_id", "path"] {
        assert!(v.get(gone).is_none(), "{gone}: {v}");
    }
    assert!(v["upstream_ms"].is_null());
    assert_eq!(v["cost"], serde_json::json!({}));
    assert_eq!(v["tenant"], "acme");
}
