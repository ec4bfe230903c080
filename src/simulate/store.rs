//! The simulated fleet's store: the memory store (the same math as the
//! Lua scripts) behind a round trip and an outage, counting its calls.
//!
//! A call waits half the round trip, is applied (or, while the store is
//! down, never answered: the caller's `[store] timeout_ms` ends it, as it
//! would a hung Redis), and its answer waits the other half. Heartbeats
//! keep the fleet's members as `lua/fleet.lua` does, so the fallback
//! divides quotas by the live count as it would on Redis (the memory
//! store's own heartbeat answers 1: its fleet is one process).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Clock;
use crate::quota::{Grant, Spec};
use crate::store::memory::MemoryStore;
use crate::store::{
    BoxFuture, Demand, FleetTables, Hold, Overridden, OverrideOp, QuotaStore, Slots, StoreError, Unspent,
};
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
    half_rtt: Duration,
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
            half_rtt: rtt / 2,
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

    /// The way there: half the round trip; a store that is down then
    /// never answers.
    async fn there(&self) {
        if !self.half_rtt.is_zero() {
            tokio::time::sleep(self.half_rtt).await;
        }
        if self.is_down() {
            std::future::pending::<()>().await;
        }
    }

    /// The way back.
    async fn back(&self) {
        if !self.half_rtt.is_zero() {
            tokio::time::sleep(self.half_rtt).await;
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
            self.there().await;
            let g = self.inner.grant(key, spec, want, unspent, reserve).await;
            if let Ok(g) = &g {
                if g.granted > 0 {
                    self.counts.lock().recover().grants.push(g.granted);
                }
            }
            self.back().await;
            g
        })
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.count_call();
            self.there().await;
            let r = self.inner.release(key, spec, unspent).await;
            self.back().await;
            r
        })
    }

    fn name(&self) -> &'static str {
        "simulated"
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            self.there().await;
            self.back().await;
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
            self.there().await;
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
            self.back().await;
            Ok(live)
        })
    }

    fn fair_share<'a>(&'a self, d: Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            self.there().await;
            let answer = self.inner.fair_share(d).await;
            self.back().await;
            answer
        })
    }

    fn hold_slots<'a>(&'a self, h: Hold<'a>) -> BoxFuture<'a, Result<Slots, StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            self.there().await;
            let answer = self.inner.hold_slots(h).await;
            self.back().await;
            answer
        })
    }

    fn overrides<'a>(&'a self, op: OverrideOp<'a>) -> BoxFuture<'a, Result<Overridden, StoreError>> {
        Box::pin(async move {
            self.counts.lock().recover().other_calls += 1;
            self.there().await;
            let answer = self.inner.overrides(op).await;
            self.back().await;
            answer
        })
    }

    /// One process: no other changes an override.
    fn watch_overrides(&self, _wake: std::sync::Arc<tokio::sync::Notify>) {}
}
