//! In-flight limits (`algorithm = "concurrency"`): a request holds a slot
//! from admission until its response ends, or its client goes away.
//!
//! Slots are leased as tokens are: this instance holds some of a key's
//! slots in the store (`lua/slots.lua`, counted per instance, each
//! instance's count with a TTL) and hands them to its own requests without
//! a store call. A slot that comes back stays held, idle, for the next
//! request, and goes back to the store when the key is contended (the
//! store last said every slot was taken) or after a lease TTL unused. The
//! renewer ([`SlotRenewer`]) keeps the held ones alive every third
//! of a TTL, so an instance that dies takes its slots with it within
//! `[leasing] ttl_ms`.
//!
//! Per key, store calls are one at a time (`calling`), and each says how
//! many slots this instance holds, not how many to add: a call whose
//! answer was lost is corrected by the next. The only lock taken per
//! request is the key's state mutex, never across an await.
//!
//! Bound: the slots held by all instances never exceed `max` in the
//! store; a request runs only on a slot its instance holds. While the
//! store is away a fail-open route admits up to `max` divided by the live
//! fleet per instance, and an instance that cannot renew keeps using what
//! it held: after a TTL the store forgets those, so for an outage longer
//! than a TTL the fleet may run up to `max` more.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::policy::StoreFailure;
use super::stage::Outcome;
use super::Settings;
use super::{LimitRef, LimitVerdict};
use crate::clock::Clock;
use crate::quota::Spec;
use crate::store::{FleetStore, Hold, StoreError};
use crate::sync::Recover as _;

const SHARDS: usize = 16;

/// How long a refused key is refused from memory (no store call) unless
/// one of this instance's own slots comes back first.
pub const FULL_MS: u64 = 250;

/// One shard of the table: keys by hash.
type Shard = Mutex<HashMap<u64, Arc<KeySlots>>>;

/// The slots this instance holds, per key.
pub(super) struct SlotTable {
    shards: Box<[Shard]>,
    /// This instance, in the store's count.
    member: u64,
    max_keys: usize,
    /// Wakes the renewer early: a contended key has an idle slot to give back.
    pub(super) wake: tokio::sync::Notify,
}

/// One key's slots on this instance.
pub struct KeySlots {
    key: Box<str>,
    /// The limit's `max` as last seen: a reload may change it.
    max: AtomicU64,
    state: Mutex<State>,
    /// One store call per key at a time.
    calling: tokio::sync::Mutex<()>,
    /// A slot of this key came back on this instance: the head of its
    /// queue may take it.
    pub freed: tokio::sync::Notify,
}

#[derive(Debug, Default, Clone, Copy)]
struct State {
    /// Held in the store for this instance.
    owned: u64,
    /// Held by requests now (may exceed `owned` only on the fallback).
    in_use: u64,
    /// Slots held by every instance, as the store last said.
    held_total: u64,
    /// When a slot was last taken or given back.
    used_at: u64,
    /// Refused from memory until then.
    full_until: u64,
}

/// A slot a request holds: given back when dropped (the response ended,
/// or was abandoned).
pub struct Held {
    slots: Arc<KeySlots>,
    now: crate::clock::Clock,
    table: Arc<SlotTable>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("key", &self.slots.key).finish()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let now = (self.now)();
        let contended = {
            let mut s = self.slots.state.lock().recover();
            s.in_use = s.in_use.saturating_sub(1);
            s.used_at = now;
            s.full_until = 0;
            s.held_total >= self.slots.max() && s.owned > s.in_use
        };
        self.slots.freed.notify_one();
        if contended {
            // Another instance may be waiting for it: back to the store
            // now rather than at the next renewal.
            self.table.wake.notify_one();
        }
    }
}

/// What a decision on a slot says.
#[derive(Debug)]
pub(super) enum Taken {
    /// A slot, and what the headers say: slots left as far as this
    /// instance knows.
    Slot(Held, u64),
    /// None free: retry after this many ms.
    Full(u64),
}

impl Taken {
    /// `limit`'s part of a verdict for the key `h`; a slot goes into
    /// `verdict`, to be held until the response ends.
    fn into_verdict<'l>(
        self,
        limit: LimitRef<'l>,
        h: u64,
        spec: &Spec,
        verdict: &mut super::Verdict<'l>,
    ) -> LimitVerdict<'l> {
        match self {
            Taken::Slot(held, left) => {
                verdict.held.push(held);
                slot_admitted(limit, h, spec, left)
            }
            Taken::Full(ms) => slot_refused(limit, h, spec, ms),
        }
    }
}

impl SlotTable {
    pub(super) fn new(max_keys: usize) -> SlotTable {
        SlotTable {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            member: fastrand::u64(..),
            max_keys: max_keys.max(1),
            wake: tokio::sync::Notify::new(),
        }
    }

    fn shard(&self, h: u64) -> &Shard {
        &self.shards[(h as usize) % SHARDS]
    }

    pub(super) fn get(&self, h: u64) -> Option<Arc<KeySlots>> {
        self.shard(h).lock().recover().get(&h).cloned()
    }

    /// The key's slots, made on first use; `None` when `max_keys` keys
    /// hold slots already (a key in use is never forgotten).
    fn get_or_insert(&self, h: u64, key: &str, max: u64, now: u64) -> Option<Arc<KeySlots>> {
        let mut shard = self.shard(h).lock().recover();
        if let Some(k) = shard.get(&h) {
            k.retune(max);
            return Some(k.clone());
        }
        if shard.len() >= self.max_keys.div_ceil(SHARDS) {
            shard.retain(|_, k| !k.forgettable(now));
            if shard.len() >= self.max_keys.div_ceil(SHARDS) {
                return None;
            }
        }
        let k = Arc::new(KeySlots {
            key: key.into(),
            max: AtomicU64::new(max),
            state: Mutex::default(),
            calling: tokio::sync::Mutex::new(()),
            freed: tokio::sync::Notify::new(),
        });
        shard.insert(h, k.clone());
        Some(k)
    }

    /// Keys tracked now.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().recover().len()).sum()
    }

    fn all(&self) -> Vec<Arc<KeySlots>> {
        self.shards
            .iter()
            .flat_map(|s| s.lock().recover().values().cloned().collect::<Vec<_>>())
            .collect()
    }
}

impl KeySlots {
    fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// A new `max` (a reload changed the limit): idle slots are no longer
    /// this instance's to hand out, so the next request asks the store,
    /// which grants by the new `max`, and the next renewal gives them back.
    fn retune(&self, max: u64) {
        if self.max.swap(max, Ordering::Relaxed) != max {
            let mut s = self.state.lock().recover();
            s.owned = s.owned.min(s.in_use);
            s.full_until = 0;
        }
    }

    /// A slot at hand, from memory: `Ok(Some)` taken, `Ok(None)` needs the
    /// store, `Err(ms)` refused from memory (full) for that long.
    fn take_local(&self, now: u64) -> Result<Option<u64>, u64> {
        let mut s = self.state.lock().recover();
        if s.in_use < s.owned {
            s.in_use += 1;
            s.used_at = now;
            return Ok(Some(self.left(&s)));
        }
        if s.full_until > now {
            return Err(s.full_until - now);
        }
        Ok(None)
    }

    /// Slots left for the headers: the store's last count, or this
    /// instance's own if it knows of more in use.
    fn left(&self, s: &State) -> u64 {
        let idle = s.owned.saturating_sub(s.in_use);
        self.max().saturating_sub(s.held_total.max(s.in_use)).max(idle)
    }

    /// Slots left as far as this instance knows, now.
    pub(super) fn left_now(&self) -> u64 {
        self.left(&self.state.lock().recover())
    }

    /// Nothing held and nobody using it for a TTL: no reason to remember.
    /// A key in a store call is kept: its answer lands here.
    fn forgettable(&self, now: u64) -> bool {
        let s = self.state.lock().recover();
        s.owned == 0 && s.in_use == 0 && now.saturating_sub(s.used_at) > FULL_MS && self.calling.try_lock().is_ok()
    }
}

/// Taking slots: at hand, from the store, or on the fallback.
impl SlotTable {
    /// A slot for key `h` at hand, without waiting: `None` when the store
    /// must be asked.
    pub(super) fn slot_now(self: &Arc<Self>, h: u64, max: u64, clock: &Clock) -> Option<Taken> {
        let k = self.get(h)?;
        k.retune(max);
        let now = clock();
        match k.take_local(now) {
            Ok(Some(left)) => Some(Taken::Slot(self.held(k, clock), left)),
            Ok(None) => None,
            Err(ms) => Some(Taken::Full(ms)),
        }
    }

    fn held(self: &Arc<Self>, slots: Arc<KeySlots>, clock: &Clock) -> Held {
        Held {
            slots,
            now: clock.clone(),
            table: self.clone(),
        }
    }

    /// A slot for `key` (hash `h`, limit `max`), asking the store for one
    /// more when none is at hand. An error is the store's: the caller's
    /// route decides what it means.
    /// `store` is asked within twice `settings.deadline_ms`, for slots that
    /// live `settings.sizing.ttl_ms`.
    pub(super) async fn slot(
        self: &Arc<Self>,
        (store, clock, settings): (&dyn FleetStore, &Clock, &Settings),
        h: u64,
        key: &str,
        max: u64,
    ) -> Result<Taken, StoreError> {
        let now = clock();
        let Some(k) = self.get_or_insert(h, key, max, now) else {
            return Ok(Taken::Full(FULL_MS));
        };
        let deadline = std::time::Duration::from_millis(settings.deadline_ms.max(1) * 2);
        // Another request's call for this key is that slow: the store is
        // busy, not down (that call's own result says so), and what this
        // instance holds is in use. Full, not a store failure: a failure
        // would let the fallback admit beyond what the store granted.
        let Ok(_calling) = tokio::time::timeout(deadline, k.calling.lock()).await else {
            return Ok(Taken::Full(FULL_MS));
        };
        match k.take_local(clock()) {
            Ok(Some(left)) => return Ok(Taken::Slot(self.held(k.clone(), clock), left)),
            Err(ms) => return Ok(Taken::Full(ms)),
            Ok(None) => {}
        }
        let hold = k.state.lock().recover().owned;
        let answer = store
            .hold_slots(Hold {
                key,
                member: self.member,
                hold,
                want: 1,
                max,
                ttl_ms: settings.sizing.ttl_ms,
            })
            .await?;
        let now = clock();
        let mut s = k.state.lock().recover();
        s.owned = hold + answer.granted;
        s.held_total = answer.held;
        if answer.granted == 0 {
            s.full_until = now + FULL_MS;
            return Ok(Taken::Full(FULL_MS));
        }
        s.in_use += 1;
        s.used_at = now;
        let left = k.left(&s);
        drop(s);
        Ok(Taken::Slot(self.held(k.clone(), clock), left))
    }

    /// A slot while the store is away, on a route that fails open: this
    /// instance's part of `max` (`max` divided by the live fleet: `part`),
    /// counted here alone. Given back like any slot.
    pub(super) fn slot_fallback(self: &Arc<Self>, h: u64, key: &str, (max, part): (u64, u64), clock: &Clock) -> Taken {
        let now = clock();
        let Some(k) = self.get_or_insert(h, key, max, now) else {
            return Taken::Full(FULL_MS);
        };
        let mut s = k.state.lock().recover();
        if s.in_use >= part.max(s.owned) {
            return Taken::Full(FULL_MS);
        }
        s.in_use += 1;
        s.used_at = now;
        let left = part.saturating_sub(s.in_use);
        drop(s);
        Taken::Slot(self.held(k, clock), left)
    }
}

/// The limiter's side: a concurrency limit's verdict.
impl super::Limiter {
    /// A concurrency limit's verdict from memory, its slot (if any) in
    /// `verdict`; `None` when the store must be asked.
    pub(super) fn slot_verdict_now<'l>(
        &self,
        limit: LimitRef<'l>,
        h: u64,
        spec: &Spec,
        verdict: &mut super::Verdict<'l>,
    ) -> Option<LimitVerdict<'l>> {
        let taken = self.slots.slot_now(h, spec.capacity, &self.clock)?;
        Some(taken.into_verdict(limit, h, spec, verdict))
    }

    /// A concurrency limit's verdict, asking the store when no slot is at
    /// hand; its slot (if any) in `verdict`. A store failure is the
    /// route's to decide, as for tokens: fail open, and the fallback's
    /// share of `max` decides; fail closed, and `None` (the verdict says
    /// 503 and holds nothing).
    pub(super) async fn slot_verdict<'l>(
        &self,
        limit: LimitRef<'l>,
        h: u64,
        key: &str,
        spec: &Spec,
        on_failure: StoreFailure,
        verdict: &mut super::Verdict<'l>,
    ) -> Option<LimitVerdict<'l>> {
        let settings = self.settings();
        let fallback = || {
            let part = spec.capacity.div_ceil(self.fleet_divisor(&settings)).max(1);
            self.slots.slot_fallback(h, key, (spec.capacity, part), &self.clock)
        };
        let taken = match self
            .slots
            .slot((&*self.store, &self.clock, &settings), h, key, spec.capacity)
            .await
        {
            Ok(taken) => taken,
            // A limit that cannot refuse here cannot fail the request either.
            Err(_) if !limit.can_refuse() => fallback(),
            Err(e) => {
                verdict.decision = super::store_failure_decision(&e, on_failure);
                verdict.store_error = Some(e);
                if on_failure == StoreFailure::Deny {
                    verdict.taken.give_back();
                    verdict.held.clear();
                    return None;
                }
                fallback()
            }
        };
        Some(taken.into_verdict(limit, h, spec, verdict))
    }

    /// The future that is ready when a slot of `limit`'s key for `facts`
    /// comes back on this instance (never, for a key it does not track).
    pub fn slot_freed(
        &self,
        limit: &super::LimitRuntime,
        facts: &super::key::Facts<'_>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (_, shard) = limit.spec_for(facts);
        let k = self.slots.get(self.key_hash(limit, facts, shard));
        async move {
            match k {
                Some(k) => k.freed.notified().await,
                None => std::future::pending().await,
            }
        }
    }
}

/// The slot renewer: a task of its own, started by the composition root,
/// that keeps this instance's slots alive in the store every third of a
/// lease TTL, gives back the idle ones of a contended key at once, and
/// forgets keys with nothing held.
pub struct SlotRenewer {
    store: Arc<dyn crate::store::FleetStore>,
    slots: Arc<SlotTable>,
    settings: Arc<arc_swap::ArcSwap<super::Settings>>,
    clock: crate::clock::Clock,
}

impl SlotRenewer {
    /// The renewer of `limiter`'s slots.
    pub fn of(limiter: &super::Limiter) -> SlotRenewer {
        SlotRenewer {
            store: limiter.store.clone(),
            slots: limiter.slots.clone(),
            settings: limiter.settings.clone(),
            clock: limiter.clock.clone(),
        }
    }

    /// Renews every key's slots in the store, giving back the idle ones of
    /// a contended key and those unused for a TTL, and forgets keys with
    /// nothing held. `leaving`: gives every idle slot back (shutdown).
    pub async fn renew(&self, leaving: bool) {
        self.renew_keys(leaving, false).await;
    }

    /// [`SlotRenewer::renew`]; `only_contended`: just the keys the store
    /// last said were full (a slot came back on one), not every key.
    async fn renew_keys(&self, leaving: bool, only_contended: bool) {
        let ttl_ms = self.settings.load().sizing.ttl_ms;
        for k in self.slots.all() {
            if only_contended && k.state.lock().recover().held_total < k.max() {
                continue;
            }
            let _calling = k.calling.lock().await;
            let now = (self.clock)();
            let hold = {
                let mut s = k.state.lock().recover();
                let idle_long = now.saturating_sub(s.used_at) >= ttl_ms;
                let contended = s.held_total >= k.max();
                if leaving || idle_long || contended {
                    // The request path takes no slot above `owned`: set it
                    // first, so the store never hears of fewer than run.
                    s.owned = s.in_use;
                }
                s.owned.max(s.in_use)
            };
            if hold == 0 && k.state.lock().recover().held_total == 0 && !leaving {
                continue;
            }
            let answer = self
                .store
                .hold_slots(Hold {
                    key: &k.key,
                    member: self.slots.member,
                    hold,
                    want: 0,
                    max: k.max(),
                    ttl_ms,
                })
                .await;
            if let Ok(a) = answer {
                let mut s = k.state.lock().recover();
                s.held_total = a.held;
                if hold == 0 {
                    // Given back: nothing left to renew until it is used.
                    s.held_total = 0;
                }
            }
        }
        let now = (self.clock)();
        for shard in self.slots.shards.iter() {
            shard.lock().recover().retain(|_, k| !k.forgettable(now));
        }
    }

    /// The renewer: every third of a lease TTL, or at once when a
    /// contended key has a slot to give back.
    pub async fn run(self: Arc<Self>) {
        let every = || std::time::Duration::from_millis((self.settings.load().sizing.ttl_ms / 3).clamp(20, 2_000));
        let mut next = tokio::time::Instant::now() + every();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {
                    self.renew_keys(false, false).await;
                    next = tokio::time::Instant::now() + every();
                }
                // A slot came back on a full key: give that key's idle
                // slots back now; the others wait for their renewal.
                _ = self.slots.wake.notified() => self.renew_keys(false, true).await,
            }
        }
    }
}

/// A concurrency limit's part of an admitted verdict: `left` slots free as
/// far as this instance knows; nothing resets in time.
fn slot_admitted<'l>(limit: LimitRef<'l>, key_hash: u64, spec: &Spec, left: u64) -> LimitVerdict<'l> {
    LimitVerdict {
        limit,
        key_hash,
        outcome: Outcome::Admitted,
        quota: spec.capacity,
        window_secs: 1,
        remaining: left.min(spec.capacity),
        reset_ms: 0,
        retry_after_ms: 0,
        over_percent: 0,
    }
}

/// A concurrency limit with no slot free: what its stage makes of it, and
/// a retry when this instance will ask the store again.
fn slot_refused<'l>(limit: LimitRef<'l>, key_hash: u64, spec: &Spec, retry_after_ms: u64) -> LimitVerdict<'l> {
    LimitVerdict {
        limit,
        key_hash,
        outcome: super::stage::on_refusal(limit.config.mode, limit.enforcing),
        quota: spec.capacity,
        window_secs: 1,
        remaining: 0,
        reset_ms: retry_after_ms,
        retry_after_ms,
        over_percent: 0,
    }
}

#[cfg(test)]
mod tests;
