//! The simulated fleet's store: the memory store (the same math as the
//! Lua scripts) behind a round trip and an outage, counting its calls.
//!
//! A call waits half the round trip, is applied (or, while the store is
//! down, never answered: the caller's `[store] timeout_ms` ends it, as it
//! would a hung Redis), and its answer waits the other half. The virtual
//! clock (the limiter's, as the real one) counts whole milliseconds and
//! tokio's timer sleeps at least one: a round trip of 0.3 ms takes 0 ms
//! for seven calls in ten and 1 ms for the other three (the fraction
//! carried from call to call, so the mean is the round trip asked for),
//! not a millisecond each way. Heartbeats
//! keep the fleet's members as `lua/fleet.lua` does, so the fallback
//! divides quotas by the live count as it would on Redis (the memory
//! store's own heartbeat answers 1: its fleet is one process).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Clock;
use crate::quota::Unspent;
use crate::quota::{Grant, Spec};
use crate::store::memory::MemoryStore;
use crate::store::{BoxFuture, Demand, FleetTables, Hold, Overridden, OverrideOp, QuotaStore, Slots, StoreError};
use crate::sync::Recover;

/// What the store saw, for the report.
#[derive(Debug, Default, Clone)]
pub struct StoreCounts {
    /// Acquire and release calls sent, per virtual second (what
    /// `leasegate_store_calls_total` counts; heartbeats and pings apart).
    pub calls_per_sec: Vec<u64>,
    /// Tokens of every grant of at least one token: the lease sizes.
    pub grants: Vec<u64>,
    /// Heartbeats and probes sent.
    pub other_calls: u64,
}

pub struct SimStore {
    inner: MemoryStore,
    /// The round trip in microseconds.
    rtt_us: u64,
    /// The fraction of a millisecond carried to the next call (µs).
    carry_us: Mutex<u64>,
    /// `[from, to)` in ms on the virtual clock: no answer.
    down: Option<(u64, u64)>,
    clock: Clock,
    counts: Mutex<StoreCounts>,
    /// Heartbeats: member → expiry (ms).
    members: Mutex<BTreeMap<u64, u64>>,
}

impl SimStore {
    pub fn new(inner: MemoryStore, rtt: Duration, down: Option<(u64, u64)>, clock: Clock, seconds: u64) -> SimStore {
        SimStore {
            inner,
            rtt_us: rtt.as_micros().min(u128::from(u64::MAX)) as u64,
            carry_us: Mutex::new(0),
            down,
            clock,
            counts: Mutex::new(StoreCounts {
                calls_per_sec: vec![0; seconds as usize + 1],
                ..StoreCounts::default()
            }),
            members: Mutex::default(),
        }
    }

    pub fn counts(&self) -> StoreCounts {
        self.counts.lock().recover().clone()
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }

    fn is_down(&self) -> bool {
        let now = self.now();
        self.down.is_some_and(|(from, to)| now >= from && now < to)
    }

    fn count_call(&self) {
        let sec = (self.now().saturating_sub(1) / 1000) as usize;
        let mut c = self.counts.lock().recover();
        let last = c.calls_per_sec.len().saturating_sub(1);
        if let Some(n) = c.calls_per_sec.get_mut(sec.min(last)) {
            *n += 1;
        }
    }

    /// This call's round trip in whole milliseconds: the whole part of
    /// the round trip asked for, and one more whenever the carried
    /// fractions reach one.
    fn round_trip_ms(&self) -> u64 {
        let mut carry = self.carry_us.lock().recover();
        *carry += self.rtt_us % 1000;
        let extra = u64::from(*carry >= 1000);
        *carry %= 1000;
        self.rtt_us / 1000 + extra
    }

    /// The way there: half the call's round trip (rounded down); a store
    /// that is down then never answers. Returns the way back's wait.
    async fn there(&self) -> Duration {
        let rtt = self.round_trip_ms();
        let there = rtt / 2;
        if there > 0 {
            tokio::time::sleep(Duration::from_millis(there)).await;
        }
        if self.is_down() {
            std::future::pending::<()>().await;
        }
        Duration::from_millis(rtt - there)
    }

    /// The way back.
    async fn back(&self, wait: Duration) {
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

impl QuotaStore for SimStore {
    fn grant<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        Box::pin(async move {
            self.count_call();
            let back = self.there().await;
            let g = self.inner.grant(key, spec, want, unspent, reserve).await;
            if let Ok(g) = &g {
                if g.granted > 0 {
                    self.counts.lock().recover().grants.push(g.granted);
                }
            }
            self.back(back).await;
            g
        })
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.count_call();
            let back = self.there().await;
            let r = self.inner.release(key, spec, unspent).await;
            self.back(back).await;
            r
        })
    }

    fn name(&self) -> &'static str {
        "simulated"
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            let back = self.there().await;
            self.back(back).await;
            Ok(())
        })
    }
}

/// The fleet's tables of the simulated store: heartbeats as
/// `lua/fleet.lua` keeps them, the rest the memory store's (the scripts'
/// twin), each behind the same round trip and outage.
impl FleetTables for SimStore {
    fn heartbeat(&self, member: u64, ttl_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            let back = self.there().await;
            let now = self.now();
            let live = {
                let mut m = self.members.lock().recover();
                m.retain(|_, expires| *expires > now);
                if ttl_ms == 0 {
                    m.remove(&member);
                } else {
                    m.insert(member, now + ttl_ms);
                }
                m.len() as u64
            };
            self.back(back).await;
            Ok(live)
        })
    }

    fn fair_share<'a>(&'a self, d: Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            let back = self.there().await;
            let answer = self.inner.fair_share(d).await;
            self.back(back).await;
            answer
        })
    }

    fn hold_slots<'a>(&'a self, h: Hold<'a>) -> BoxFuture<'a, Result<Slots, StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            let back = self.there().await;
            let answer = self.inner.hold_slots(h).await;
            self.back(back).await;
            answer
        })
    }

    fn overrides<'a>(&'a self, op: OverrideOp<'a>) -> BoxFuture<'a, Result<Overridden, StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            let back = self.there().await;
            let answer = self.inner.overrides(op).await;
            self.back(back).await;
            answer
        })
    }

    /// One process: no other changes an override.
    fn watch_overrides(&self, _wake: std::sync::Arc<tokio::sync::Notify>) {}
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Ten calls one after another, on the paused clock, from virtual ms 1.
    fn ten_calls_take_ms(rtt: Duration) -> u64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let start = tokio::time::Instant::now();
            let clock: Clock = Arc::new(move || start.elapsed().as_millis() as u64 + 1);
            let store = SimStore::new(MemoryStore::with_clock(100, clock.clone()), rtt, None, clock, 1);
            for _ in 0..10 {
                store.ping().await.expect("the store answers");
            }
            start.elapsed().as_millis() as u64
        })
    }

    /// The clock counts whole ms and tokio's timer sleeps at least one:
    /// a call is not a millisecond each way whatever its round trip, but
    /// takes the round trip asked for on average (a fast Redis at 0.3 ms
    /// once made a drained key's fleet ask 70 times too often).
    #[test]
    fn calls_take_their_round_trip_on_average() {
        assert_eq!(ten_calls_take_ms(Duration::ZERO), 0);
        assert_eq!(ten_calls_take_ms(Duration::from_micros(300)), 3);
        assert_eq!(ten_calls_take_ms(Duration::from_micros(2500)), 25);
        assert_eq!(ten_calls_take_ms(Duration::from_millis(4)), 40);
    }
}
