//! Shadow and soft events: `RateLimitShadowBlock` and `RateLimitSoftBlock`
//! sent as DogStatsD events to an agent (`[events] dogstatsd`), at most one
//! per key per `min_interval_ms`.
//!
//! The request path only ever calls [`Emitter::offer`]: a hash, a short
//! critical section on one of 16 shards of the fixed-size
//! [`interval::IntervalTable`] and, for the one request per key and
//! interval that may send, a `try_send` into a bounded channel. A full
//! channel drops the event (counted `dropped`); nothing waits. The
//! `leasegate-events` thread owns the UDP socket, formats each event
//! ([`format::datagram`]) and sends it without blocking; an agent that is
//! down (nothing listening, ICMP port unreachable) fails the send on that
//! thread (counted `failed`) and costs requests nothing. A flood of keys
//! is capped there too: at most [`PER_SECOND`] events a second over all
//! keys ([`BURST`] at once), the rest dropped. Dropping the
//! emitter closes the channel and ends the thread.
//!
//! Never here: a client key or identity in a metric label; a block on
//! anything from a request.

pub mod format;
pub mod interval;

use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;

use crate::limit::key::{self, Facts};
use crate::limit::policy::Limit;
use crate::sync::Recover;
use crate::telemetry::metrics::{Metrics, ResultLabels};
pub use format::{Event, Kind};
use interval::{Budget, IntervalTable};

/// `[events]`: shadow and soft decisions as DogStatsD events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The agent's UDP address.
    pub dogstatsd: std::net::SocketAddr,
    /// At most one event per key per this long.
    pub min_interval: std::time::Duration,
}

/// Events waiting for the sender thread, at most.
pub const QUEUE: usize = 1_024;
/// Events per second the sender sends at most, over all keys, and at
/// once after a quiet spell; the rest are dropped (and counted).
pub const PER_SECOND: u64 = 100;
pub const BURST: u64 = 1_000;
/// Shards of the interval table; each remembers `SETS × WAYS` keys.
const SHARDS: usize = 16;
const SETS: usize = 256;

/// `leasegate_events_total{result}` handles.
#[derive(Clone)]
struct Counters {
    sent: Counter,
    dropped: Counter,
    failed: Counter,
}

impl Counters {
    fn new(metrics: &Metrics) -> Counters {
        let c = |result| metrics.events.get_or_create(&ResultLabels { result }).clone();
        Counters {
            sent: c("sent"),
            dropped: c("dropped"),
            failed: c("failed"),
        }
    }
}

/// The running `[events]` section: the per-key interval table, the queue
/// and (behind it) the sender thread.
pub struct Emitter {
    settings: Settings,
    instance: String,
    shards: Box<[Mutex<IntervalTable>]>,
    hasher: foldhash::fast::RandomState,
    queue: SyncSender<Event>,
    counters: Counters,
}

impl Emitter {
    /// Starts the sender thread for `settings`. `None` (and a WARN) when the
    /// socket or the thread cannot be made: the gateway serves without
    /// events rather than not at all.
    pub fn start(settings: &Settings, instance: &str, metrics: &Metrics) -> Option<Emitter> {
        let socket = match socket(settings.dogstatsd) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(dogstatsd = %settings.dogstatsd, error = %e, "cannot open the events socket; events are off");
                return None;
            }
        };
        let (queue, rx) = mpsc::sync_channel(QUEUE);
        let emitter = Emitter::new(settings, instance, metrics, queue);
        let counters = emitter.counters.clone();
        let spawned = std::thread::Builder::new()
            .name("leasegate-events".into())
            .spawn(move || send_loop(&socket, &rx, &counters));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the events thread; events are off");
            return None;
        }
        tracing::info!(
            dogstatsd = %settings.dogstatsd,
            min_interval_ms = settings.min_interval.as_millis() as u64,
            "shadow and soft events on"
        );
        Some(emitter)
    }

    /// An emitter feeding `queue` (the sender thread, or a test).
    fn new(settings: &Settings, instance: &str, metrics: &Metrics, queue: SyncSender<Event>) -> Emitter {
        Emitter {
            settings: settings.clone(),
            instance: instance.to_string(),
            shards: (0..SHARDS).map(|_| Mutex::new(IntervalTable::new(SETS))).collect(),
            hasher: foldhash::fast::RandomState::default(),
            queue,
            counters: Counters::new(metrics),
        }
    }

    /// Whether this emitter was started for `settings` and `instance` (a
    /// reload that changes neither keeps it, and its interval table).
    pub fn runs(&self, settings: &Settings, instance: &str) -> bool {
        self.settings == *settings && self.instance == instance
    }

    /// An over-quota decision of `limit` for `facts` at `now_ms`: queues
    /// the event `make` builds if the key has not sent within the interval.
    /// Never blocks.
    pub fn offer(&self, limit: &Limit, facts: &Facts<'_>, now_ms: u64, make: impl FnOnce(&str) -> Event) {
        let mut h = self.hasher.build_hasher();
        key::hash_into(&mut h, &limit.name, &limit.by, facts);
        let hash = h.finish();
        let interval_ms = self.settings.min_interval.as_millis() as u64;
        // The top bits pick the shard; the table uses the rest.
        let shard = (hash >> 60) as usize % SHARDS;
        let Some(table) = self.shards.get(shard) else { return };
        let admitted = table.lock().recover().admit(hash, now_ms, interval_ms);
        if !admitted {
            return;
        }
        // Full (or the thread is gone): drop it, count it, move on.
        if self.queue.try_send(make(&self.instance)).is_err() {
            self.counters.dropped.inc();
        }
    }
}

/// A non-blocking UDP socket of the agent's address family.
struct Socket {
    socket: UdpSocket,
    agent: SocketAddr,
    /// Connected to the agent, so a refused port shows as a send error
    /// rather than silence. Unconnected when `connect` failed (no route to
    /// the agent yet, say): each send then names the address.
    connected: bool,
}

impl Socket {
    fn send(&self, datagram: &[u8]) -> std::io::Result<usize> {
        if self.connected {
            self.socket.send(datagram)
        } else {
            self.socket.send_to(datagram, self.agent)
        }
    }
}

fn socket(agent: SocketAddr) -> std::io::Result<Socket> {
    let local: SocketAddr = match agent {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local)?;
    socket.set_nonblocking(true)?;
    let connected = match socket.connect(agent) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(dogstatsd = %agent, error = %e, "cannot connect the events socket; sending unconnected");
            false
        }
    };
    Ok(Socket {
        socket,
        agent,
        connected,
    })
}

/// The sender thread: one datagram per event until the emitter is dropped.
fn send_loop(socket: &Socket, rx: &Receiver<Event>, counters: &Counters) {
    let mut last_error: Option<std::io::ErrorKind> = None;
    let started = std::time::Instant::now();
    let mut budget = Budget::new(PER_SECOND, BURST);
    while let Ok(event) = rx.recv() {
        if !budget.take(started.elapsed().as_millis() as u64) {
            counters.dropped.inc();
            continue;
        }
        let datagram = format::datagram(&event);
        match socket.send(datagram.as_bytes()) {
            Ok(_) => {
                counters.sent.inc();
                last_error = None;
            }
            Err(e) => {
                counters.failed.inc();
                // Once per run of failures, not per event.
                if last_error != Some(e.kind()) {
                    tracing::warn!(error = %e, "cannot send an event to the dogstatsd agent");
                    last_error = Some(e.kind());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limit::policy::{Draft, Limit};
    use crate::quota::Rate;

    fn settings(interval_ms: u64) -> Settings {
        Settings {
            dogstatsd: "127.0.0.1:8125".parse().unwrap(),
            min_interval: Duration::from_millis(interval_ms),
        }
    }

    fn facts<'a>(identity: &'a str, headers: &'a http::HeaderMap) -> Facts<'a> {
        Facts {
            identity,
            tenant: None,
            plan: None,
            rates: &[],
            route: "api",
            ip: "127.0.0.1".parse().unwrap(),
            headers,
        }
    }

    fn event(identity: &str) -> impl FnOnce(&str) -> Event + '_ {
        move |instance| Event {
            kind: Kind::Shadow,
            limit: "watch".into(),
            route: "api".into(),
            tier: "key",
            identity: identity.into(),
            over_percent: 10,
            instance: instance.into(),
        }
    }

    #[test]
    fn a_key_queues_one_event_per_interval_and_a_full_queue_drops() {
        let metrics = Metrics::new();
        let (tx, rx) = mpsc::sync_channel(2);
        let e = Emitter::new(&settings(1_000), "gw-a", &metrics, tx);
        let limit = Limit::try_new(Draft::new("watch", "1/min".parse::<Rate>().unwrap())).unwrap();
        let h = http::HeaderMap::new();
        for now in 0..50 {
            e.offer(&limit, &facts("key:a", &h), now, event("key:a"));
        }
        assert_eq!(rx.try_recv().map(|ev| ev.identity).ok().as_deref(), Some("key:a"));
        assert!(rx.try_recv().is_err(), "one per key per interval");
        // After the interval, the key sends again.
        e.offer(&limit, &facts("key:a", &h), 1_000, event("key:a"));
        assert_eq!(rx.try_recv().map(|ev| ev.instance).ok().as_deref(), Some("gw-a"));
        // Three new keys, nobody draining a queue of two: one is dropped.
        for id in ["key:b", "key:c", "key:d"] {
            e.offer(&limit, &facts(id, &h), 1_000, event(id));
        }
        let text = metrics.encode();
        assert!(text.contains("leasegate_events_total{result=\"dropped\"} 1"), "{text}");
        // Another limit on the same identity is another key.
        let other = Limit::try_new(Draft::new("other", "1/min".parse::<Rate>().unwrap())).unwrap();
        drop(rx.try_recv());
        e.offer(&other, &facts("key:a", &h), 1_001, event("key:a"));
        assert_eq!(rx.try_iter().count(), 2);
    }

    #[test]
    fn a_reload_keeps_an_emitter_only_for_the_same_settings() {
        let metrics = Metrics::new();
        let (tx, _rx) = mpsc::sync_channel(1);
        let e = Emitter::new(&settings(1_000), "gw-a", &metrics, tx);
        assert!(e.runs(&settings(1_000), "gw-a"));
        assert!(!e.runs(&settings(2_000), "gw-a"));
        assert!(!e.runs(&settings(1_000), "gw-b"));
    }
}
