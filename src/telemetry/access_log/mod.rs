//! The access log: one line per request on stdout, formatted on the worker
//! and written by one background thread, in batches.
//!
//! A worker appends each line to a buffer of its own thread (no lock, no
//! hand-off per line) and hands the buffer over whole: when it holds
//! [`BATCH_BYTES`], when its first line is [`BATCH_AGE_MS`] old, and
//! whenever the worker's runtime goes idle. The writer thread writes each
//! batch with one `write` (nginx's `access_log ... buffer=`), and a slow
//! stdout still never holds up a request: past [`MAX_QUEUED_LINES`] lines
//! or [`MAX_QUEUED_BYTES`] waiting, batches are dropped and counted.
//!
//! Handing a batch over wakes nobody while the writer is busy: once it has
//! written, the writer gathers for [`WRITE_EVERY_MS`] before it looks
//! again, and only a writer asleep on an empty queue is woken. A worker
//! under load goes idle thousands of times a second; when each hand-over
//! woke the writer, the writer took the worker's core that often. Under
//! load it now writes at most about every [`WRITE_EVERY_MS`], and a line
//! handed over waits up to that long plus the writes ahead of it.
//!
//! The JSON line is written by hand, field by field, byte for byte what the
//! `tracing` JSON layer wrote before (a test holds the two together); the
//! text format still goes through `tracing`, into the same batches.

mod fields;
mod text;

pub use fields::{Field, Fields, FieldsError, NAMES as FIELD_NAMES};
pub use text::record_text;

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::sync::Recover;
use std::time::{SystemTime, UNIX_EPOCH};

/// A batch is handed to the writer once it holds this many bytes.
pub const BATCH_BYTES: usize = 32 * 1024;
/// ... or once its first line is this old (coarse clock), at the latest.
pub const BATCH_AGE_MS: u64 = 200;
/// Lines handed over but not yet written, past which batches are dropped.
pub const MAX_QUEUED_LINES: usize = 128_000;
/// ... and bytes (a line holds its path, up to `max_header_bytes`).
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// After writing, the writer gathers batches this long before it writes
/// again.
pub const WRITE_EVERY_MS: u64 = 10;

/// The format the access log was started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
}

/// What one access-log line says (see `docs/configuration.md`, `access_log`).
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    pub request_id: &'a str,
    pub route: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub identity: &'a str,
    /// `admitted`, `limited`, `shadow_limited`, `soft_limited`, `bypassed`
    /// or `-` (no limit applied).
    pub outcome: &'a str,
    /// The limit that refused (or was over in shadow or soft mode), `-`
    /// for none.
    pub limit: &'a str,
    /// That limit's key, as `leasegate explain --json` prints its
    /// `key_hash` (the key itself may hold a subject or a tenant), `-` for
    /// none.
    pub key: &'a str,
    pub upstream: &'a str,
    /// Microseconds from the start of handling to the response head.
    pub micros: u64,
    /// The client's address as the identity saw it (after trusted
    /// proxies); `None`: not known.
    pub client: Option<IpAddr>,
    /// The identity's tenant, `-` for none.
    pub tenant: &'a str,
    /// An API key's id or a JWT's `sub` (never a secret), `-` for none.
    pub key_id: &'a str,
    /// Request body bytes received.
    pub bytes_in: u64,
    /// Response body bytes handed on to the client.
    pub bytes_out: u64,
    /// The target that answered (or failed last), `-` for none.
    pub upstream_target: &'a str,
    /// Microseconds from the first pick of a target to the upstream's
    /// response head; `None`: no upstream answered.
    pub upstream_micros: Option<u64>,
    /// What the request was charged, per limit with a `cost`.
    pub cost: &'a [(&'a str, u64)],
    /// The client went away before the body's end.
    pub aborted: bool,
    /// The fields written (`[gateway] access_log_fields`).
    pub fields: Fields,
}

impl Line<'_> {
    /// A line with only what every request has; the rest empty.
    pub fn minimal(status: u16) -> Line<'static> {
        Line {
            request_id: "",
            route: "-",
            method: "-",
            path: "",
            status,
            identity: "-",
            outcome: "-",
            limit: "-",
            key: "-",
            upstream: "-",
            micros: 0,
            client: None,
            tenant: "-",
            key_id: "-",
            bytes_in: 0,
            bytes_out: 0,
            upstream_target: "-",
            upstream_micros: None,
            cost: &[],
            aborted: false,
            fields: Fields::ALL,
        }
    }
}

struct Sink {
    format: Format,
    queue: Mutex<Queue>,
    /// Wakes a writer asleep on an empty queue.
    wake: Condvar,
    /// Lines and bytes handed over and not yet written.
    queued: AtomicUsize,
    queued_bytes: AtomicUsize,
    dropped: AtomicU64,
}

/// What waits for the writer.
#[derive(Default)]
struct Queue {
    /// Each batch's bytes and its number of lines.
    batches: Vec<(Vec<u8>, usize)>,
    /// The writer waits on `wake` for a batch (it found none).
    asleep: bool,
    /// The writer has stopped, or is writing its last batches: later ones
    /// are dropped.
    stop: bool,
}

impl Sink {
    fn new(format: Format) -> Sink {
        Sink {
            format,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            queued: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Queues a batch for the writer, waking it only if it sleeps on an
    /// empty queue; drops it (counted) past the bounds or once the writer
    /// has stopped.
    fn give(&self, bytes: Vec<u8>, lines: usize) {
        let len = bytes.len();
        if self.queued.load(Ordering::Relaxed) + lines > MAX_QUEUED_LINES
            || self.queued_bytes.load(Ordering::Relaxed) + len > MAX_QUEUED_BYTES
        {
            self.dropped.fetch_add(lines as u64, Ordering::Relaxed);
            return;
        }
        let mut q = self.queue.lock().recover();
        if q.stop {
            drop(q);
            self.dropped.fetch_add(lines as u64, Ordering::Relaxed);
            return;
        }
        self.queued.fetch_add(lines, Ordering::Relaxed);
        self.queued_bytes.fetch_add(len, Ordering::Relaxed);
        q.batches.push((bytes, lines));
        if q.asleep {
            q.asleep = false;
            drop(q);
            self.wake.notify_one();
        }
    }

    /// Lets the writer write what is queued and stop.
    fn stop(&self) {
        self.queue.lock().recover().stop = true;
        self.wake.notify_one();
    }

    /// The writer's loop: takes every queued batch, writes it, gathers for
    /// [`WRITE_EVERY_MS`], and so on until stopped; sleeps on the queue
    /// while it is empty. However it ends (a panic too), the sink is
    /// stopped, so later batches are dropped and counted, never held.
    fn write_until_stopped(&self, out: &mut dyn Write) {
        struct Stopping<'a>(&'a Sink);
        impl Drop for Stopping<'_> {
            fn drop(&mut self) {
                self.0.stop();
            }
        }
        let _stopping = Stopping(self);
        let mut taken = Vec::new();
        loop {
            let stop = {
                let mut q = self.queue.lock().recover();
                while q.batches.is_empty() && !q.stop {
                    q.asleep = true;
                    q = self.wake.wait(q).recover();
                }
                q.asleep = false;
                std::mem::swap(&mut q.batches, &mut taken);
                q.stop
            };
            for (bytes, lines) in taken.drain(..) {
                // A closed or failing stdout loses lines, never the gateway.
                let _ = out.write_all(&bytes);
                self.queued.fetch_sub(lines, Ordering::Relaxed);
                self.queued_bytes.fetch_sub(bytes.len(), Ordering::Relaxed);
            }
            let _ = out.flush();
            if stop {
                return;
            }
            std::thread::sleep(Duration::from_millis(WRITE_EVERY_MS));
        }
    }
}

static SINK: OnceLock<Sink> = OnceLock::new();

thread_local! {
    static BATCH: RefCell<Batch> = RefCell::new(Batch::default());
    /// Set on worker threads, whose runtime hands the batch over when idle;
    /// any other thread hands over each line at once.
    static BATCHING: Cell<bool> = const { Cell::new(false) };
}

#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    lines: usize,
    /// Coarse milliseconds at the first line.
    since_ms: u64,
}

/// Stops the writer when dropped, after every batch handed over before is
/// written (this thread's too).
/// A stdout that takes no more (a stuck pipe) holds up the exit by at most
/// [`EXIT_WAIT`].
pub struct Guard {
    written: mpsc::Receiver<()>,
}

/// How long the exit waits for the lines still buffered to be written.
pub const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for Guard {
    fn drop(&mut self) {
        flush_thread();
        if let Some(sink) = SINK.get() {
            sink.stop();
        }
        let _ = self.written.recv_timeout(EXIT_WAIT);
    }
}

/// Starts the writer thread, writing to `out` (stdout's descriptor). Once
/// per process: a second call returns `None`. Without a writer thread (it
/// could not be started) lines are dropped and counted.
pub fn start(format: Format, mut out: Box<dyn Write + Send>) -> Option<Guard> {
    SINK.set(Sink::new(format)).ok()?;
    let sink = SINK.get()?;
    let (done, written) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("leasegate-access-log".into())
        .spawn(move || {
            sink.write_until_stopped(&mut *out);
            let _ = done.send(());
        });
    if spawned.is_err() {
        sink.stop();
        return None;
    }
    Some(Guard { written })
}

/// The format the access log runs in, if it was started.
pub fn format() -> Option<Format> {
    SINK.get().map(|s| s.format)
}

/// Lines dropped because the writer fell behind.
pub fn dropped() -> u64 {
    SINK.get().map_or(0, |s| s.dropped.load(Ordering::Relaxed))
}

/// Marks this thread as a worker whose runtime calls [`flush_thread`] when
/// it goes idle: its lines are handed over in batches.
pub fn batch_this_thread() {
    BATCHING.with(|b| b.set(true));
}

/// Hands this thread's batch to the writer (a worker going idle, a thread
/// ending).
pub fn flush_thread() {
    let _ = BATCH.try_with(|b| {
        if let Ok(mut b) = b.try_borrow_mut() {
            hand_over(&mut b);
        }
    });
}

fn hand_over(batch: &mut Batch) {
    if batch.lines == 0 {
        return;
    }
    let lines = std::mem::take(&mut batch.lines);
    // The next batch grows from empty: a one-line batch (an idle worker's)
    // holds a line's bytes, not a full batch's, while it waits its turn.
    let bytes = std::mem::take(&mut batch.bytes);
    if let Some(sink) = SINK.get() {
        sink.give(bytes, lines);
    }
}

/// Appends whatever `write` puts in the buffer as one line of this
/// thread's batch, and hands the batch over when it is due.
fn append(write: impl FnOnce(&mut Vec<u8>)) {
    let _ = BATCH.try_with(|b| {
        let Ok(mut b) = b.try_borrow_mut() else { return };
        let now = crate::clock::coarse_now_ms();
        if b.lines == 0 {
            b.since_ms = now;
        }
        write(&mut b.bytes);
        b.lines += 1;
        let due =
            b.bytes.len() >= BATCH_BYTES || now.saturating_sub(b.since_ms) >= BATCH_AGE_MS || !BATCHING.with(Cell::get);
        if due {
            hand_over(&mut b);
        }
    });
}

/// Logs one request in JSON (the format must be [`Format::Json`]).
pub fn record_json(line: &Line<'_>) {
    append(|out| write_json(out, line, crate::clock::wall_now()));
}

/// A `tracing` writer into this thread's batch, for the text format: the
/// fmt layer writes each event with one `write_all`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchWriter;

impl Write for BatchWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        append(|out| out.extend_from_slice(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchWriter {
    type Writer = BatchWriter;

    fn make_writer(&'a self) -> BatchWriter {
        BatchWriter
    }
}

/// One JSON line, `\n` included. The fields up to `ms` are byte for
/// byte what the `tracing` JSON layer (flattened, no target, no spans)
/// wrote for them; the ones after follow in the same style.
pub fn write_json(out: &mut Vec<u8>, line: &Line<'_>, now: SystemTime) {
    let f = line.fields;
    out.extend_from_slice(b"{\"timestamp\":\"");
    write_timestamp(out, now);
    out.extend_from_slice(b"\",\"level\":\"INFO\"");
    let key = |out: &mut Vec<u8>, field: Field| {
        if !f.has(field) {
            return false;
        }
        out.extend_from_slice(b",\"");
        out.extend_from_slice(fields::NAMES[field as usize].as_bytes());
        out.extend_from_slice(b"\":");
        true
    };
    for (field, value) in [
        (Field::RequestId, line.request_id),
        (Field::Route, line.route),
        (Field::Method, line.method),
        (Field::Path, line.path),
    ] {
        if key(out, field) {
            string(out, value);
        }
    }
    if key(out, Field::Status) {
        let _ = serde_json::to_writer(&mut *out, &line.status);
    }
    for (field, value) in [
        (Field::Identity, line.identity),
        (Field::Outcome, line.outcome),
        (Field::Limit, line.limit),
        (Field::Key, line.key),
        (Field::Upstream, line.upstream),
    ] {
        if key(out, field) {
            string(out, value);
        }
    }
    if key(out, Field::Ms) {
        millis(out, line.micros);
    }
    if key(out, Field::Client) {
        match line.client {
            Some(ip) => {
                out.push(b'"');
                let _ = write!(out, "{ip}");
                out.push(b'"');
            }
            None => out.extend_from_slice(b"\"-\""),
        }
    }
    for (field, value) in [(Field::Tenant, line.tenant), (Field::KeyId, line.key_id)] {
        if key(out, field) {
            string(out, value);
        }
    }
    for (field, value) in [(Field::BytesIn, line.bytes_in), (Field::BytesOut, line.bytes_out)] {
        if key(out, field) {
            let _ = write!(out, "{value}");
        }
    }
    if key(out, Field::UpstreamTarget) {
        string(out, line.upstream_target);
    }
    if key(out, Field::UpstreamMs) {
        match line.upstream_micros {
            Some(m) => millis(out, m),
            None => out.extend_from_slice(b"null"),
        }
    }
    if key(out, Field::Cost) {
        out.push(b'{');
        for (i, (limit, n)) in line.cost.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            string(out, limit);
            let _ = write!(out, ":{n}");
        }
        out.push(b'}');
    }
    if key(out, Field::Aborted) {
        out.extend_from_slice(if line.aborted { b"true" } else { b"false" });
    }
    out.extend_from_slice(b"}\n");
}

/// Microseconds as decimal milliseconds: 0.263, not 0.26327300000000003.
fn millis(out: &mut Vec<u8>, micros: u64) {
    let _ = serde_json::to_writer(&mut *out, &(micros as f64 / 1_000.0));
}

/// A JSON string with serde_json's escaping (the one `tracing` used).
fn string(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *out, s);
}

thread_local! {
    /// The last second formatted, and its `YYYY-MM-DDTHH:MM:SS.` prefix.
    static SECOND: RefCell<(u64, [u8; 20])> = const { RefCell::new((u64::MAX, [0; 20])) };
}

/// UTC, RFC 3339 with microseconds: `2026-11-30T19:37:13.139256Z`. Times
/// before the epoch read as the epoch.
pub fn write_timestamp(out: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let prefix = SECOND.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            *c = (secs, second_prefix(secs));
        }
        c.1
    });
    out.extend_from_slice(&prefix);
    let micros = since.subsec_micros();
    let mut digits = [b'0'; 6];
    let mut m = micros;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (m % 10) as u8;
        m /= 10;
    }
    out.extend_from_slice(&digits);
    out.push(b'Z');
}

/// `YYYY-MM-DDTHH:MM:SS.` for `secs` since the epoch (proleptic Gregorian,
/// years 1970–9999).
fn second_prefix(secs: u64) -> [u8; 20] {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = crate::clock::civil_from_days(days);
    let mut p = [0u8; 20];
    let mut put = |at: usize, v: u64, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            p[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y.min(9999), 4);
    put(5, m, 2);
    put(8, d, 2);
    put(11, rem / 3600, 2);
    put(14, rem % 3600 / 60, 2);
    put(17, rem % 60, 2);
    p[4] = b'-';
    p[7] = b'-';
    p[10] = b'T';
    p[13] = b':';
    p[16] = b':';
    p[19] = b'.';
    p
}

#[cfg(test)]
mod tests;
