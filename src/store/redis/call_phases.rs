//! Where a Redis call's time went: in this process, or waiting for Redis.
//!
//! A call is made on a request's worker, sent by the Redis I/O thread,
//! answered by Redis, read by the I/O thread, and taken by the worker. On
//! a busy host the two hand-overs (the I/O thread getting a CPU to send
//! and read, the worker getting one to take the reply) can cost more than
//! Redis itself; a missed deadline then says nothing about Redis. So each
//! call records, in `leasegate_store_call_phase_seconds`, its time from
//! sending to the reply (`redis`: the network, Redis, the connection's
//! pipeline) and the rest (`gateway`), under its result: `ok`, `error`, or
//! `timeout` when the caller stopped waiting first (then `redis` is the
//! time since sending, or 0 if the call was never sent, and `gateway` the
//! rest).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::telemetry::metrics::{Metrics, StorePhaseLabels};

/// When the I/O thread sent the call and read the reply, in ns after the
/// call began (+1, so 0 is "not yet").
#[derive(Debug)]
pub(super) struct Stamps {
    began: Instant,
    sent: AtomicU64,
    replied: AtomicU64,
}

impl Stamps {
    pub(super) fn new() -> Arc<Stamps> {
        Arc::new(Stamps {
            began: Instant::now(),
            sent: AtomicU64::new(0),
            replied: AtomicU64::new(0),
        })
    }

    fn mark(&self, at: &AtomicU64) {
        let ns = u64::try_from(self.began.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        at.store(ns + 1, Ordering::Release);
    }

    /// The I/O thread is sending the call now.
    pub(super) fn sent(&self) {
        self.mark(&self.sent);
    }

    /// The I/O thread has read the reply now.
    pub(super) fn replied(&self) {
        self.mark(&self.replied);
    }

    fn read(at: &AtomicU64) -> Option<Duration> {
        match at.load(Ordering::Acquire) {
            0 => None,
            ns => Some(Duration::from_nanos(ns - 1)),
        }
    }
}

/// The phases of one call at `total` after it began: (gateway, redis).
fn split(total: Duration, sent: Option<Duration>, replied: Option<Duration>) -> (Duration, Duration) {
    let redis = match (sent, replied) {
        (Some(s), Some(r)) => r.saturating_sub(s),
        (Some(s), None) => total.saturating_sub(s),
        _ => Duration::ZERO,
    }
    .min(total);
    (total - redis, redis)
}

/// Records a call's phases when dropped: with its result if the caller
/// saw one ([`PhaseWatch::answered`]), as `timeout` if it stopped waiting.
pub(super) struct PhaseWatch {
    pub stamps: Arc<Stamps>,
    pub metrics: Option<Arc<Metrics>>,
    pub result: Option<&'static str>,
}

impl PhaseWatch {
    pub(super) fn answered(&mut self, ok: bool) {
        self.result = Some(if ok { "ok" } else { "error" });
    }
}

impl Drop for PhaseWatch {
    fn drop(&mut self) {
        let Some(metrics) = &self.metrics else { return };
        let total = self.stamps.began.elapsed();
        let (gateway, redis) = split(
            total,
            Stamps::read(&self.stamps.sent),
            Stamps::read(&self.stamps.replied),
        );
        let result = self.result.unwrap_or("timeout");
        for (phase, took) in [("gateway", gateway), ("redis", redis)] {
            metrics
                .store_call_phase_seconds
                .get_or_create(&StorePhaseLabels { phase, result })
                .observe(took.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phases_add_up_to_the_call() {
        let ms = Duration::from_millis;
        // Sent after 3 ms of waiting for the I/O thread, answered 1 ms
        // later, taken 2 ms after that: 5 ms here, 1 ms at Redis.
        assert_eq!(split(ms(6), Some(ms(3)), Some(ms(4))), (ms(5), ms(1)));
        // The caller gave up at 5 ms, 1 ms after sending: Redis had 1 ms.
        assert_eq!(split(ms(5), Some(ms(4)), None), (ms(4), ms(1)));
        // Never sent: all of it here.
        assert_eq!(split(ms(5), None, None), (ms(5), ms(0)));
    }
}
