//! The decision core: every request on a route with limits gets a verdict
//! here before it reaches the upstream.
//!
//! A verdict with leased tokens at hand is a map lookup and one atomic
//! operation, with no lock held across an await and no store call. The
//! store is asked only when a key has no token at hand (the request then
//! waits for that one call), and in the background when a busy key's lease
//! runs low. After a refusal the key is blocked locally until its retry
//! time, so repeated 429s cost no store call. The embedded memory store goes
//! through exactly this path too: single instance and fleet are one code
//! path.

pub mod blocked;
pub mod headers;
pub mod key;
pub mod lease;
pub mod stage;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, RwLock};

use crate::config::{self, Limit};
use crate::metrics::{DecisionLabels, Metrics, StripedCounter};
use crate::quota::Spec;
use crate::store::{QuotaStore, StoreError, Unspent};
use key::Facts;
use lease::{Granted, Lease, Sizing};
use stage::Outcome;

/// One configured limit, ready for decisions: its quota, its stage on this
/// instance and its counters. Rebuilt with each config.
pub struct LimitRuntime {
    pub config: Arc<Limit>,
    pub spec: Spec,
    /// `config.shards`, kept beside `spec` so an unsharded decision does
    /// not touch the config at all.
    shards: u32,
    /// Whether a canary limit enforces on this instance.
    pub enforcing: bool,
    counters: [StripedCounter; 4],
}

impl LimitRuntime {
    pub fn new(config: Arc<Limit>, instance_id: &str, metrics: &Metrics) -> LimitRuntime {
        let counter = |outcome: Outcome| {
            metrics
                .decisions
                .get_or_create(&DecisionLabels {
                    limit: config.name.clone(),
                    outcome: outcome.label(),
                })
                .clone()
        };
        LimitRuntime {
            spec: config.spec(),
            shards: config.shards,
            enforcing: stage::canary_enforces(instance_id, config.canary_percent),
            counters: [
                counter(Outcome::Admitted),
                counter(Outcome::Limited),
                counter(Outcome::ShadowLimited),
                counter(Outcome::SoftLimited),
            ],
            config,
        }
    }

    fn count(&self, outcome: Outcome) {
        let i = match outcome {
            Outcome::Admitted => 0,
            Outcome::Limited => 1,
            Outcome::ShadowLimited => 2,
            Outcome::SoftLimited => 3,
        };
        self.counters[i].inc();
    }

    /// The quota of a request's key, and its sub-bucket when the limit is
    /// sharded.
    fn spec_for(&self, facts: &Facts<'_>) -> (Spec, Option<u32>) {
        let spec = if facts.plan.is_none() || self.config.plans.is_empty() {
            self.spec
        } else {
            self.config.spec_for(facts.plan)
        };
        if self.shards <= 1 {
            return (spec, None);
        }
        let shard = key::shard(self.config.shard_by, self.shards, facts);
        (spec.share(shard, self.shards), Some(shard))
    }
}

/// One limit's part of a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitVerdict {
    /// The limit: an index into the config's limits.
    pub limit: usize,
    pub outcome: Outcome,
    pub quota: u64,
    pub window_secs: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    /// When refused: milliseconds until a token will be available.
    pub retry_after_ms: u64,
    /// How far over the quota this key is, in percent (when refused).
    pub over_percent: u64,
}

/// The decision for one request.
#[derive(Debug, Default)]
pub struct Verdict {
    /// One entry per limit checked, in route order (inline for up to two).
    pub limits: smallvec::SmallVec<[LimitVerdict; 2]>,
    /// Index into `limits` of the limit that refused (enforced), if any.
    pub refused: Option<usize>,
    /// The store failed: the route's `on_store_failure` decides.
    pub store_error: Option<StoreError>,
    /// Keys (hashed) this request took a token from, for giving back.
    taken: smallvec::SmallVec<[u64; 2]>,
}

/// `[leasing]` and friends, as the limiter uses them.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub sizing: Sizing,
    /// Longest local block after a refusal.
    pub max_block_ms: u64,
    /// Most keys with a local lease (`[store] max_keys`, per shard).
    pub max_keys: usize,
    /// `[store] fleet_size`: divides a limit's rate for the fallback bucket.
    pub fleet_size: u64,
}

impl Settings {
    pub fn from_config(c: &config::Config) -> Settings {
        Settings {
            sizing: Sizing {
                min: c.leasing.min,
                max: c.leasing.max,
                lookahead_ms: c.leasing.lookahead.as_millis() as u64,
                fraction: c.leasing.max_fraction,
                ttl_ms: c.leasing.ttl.as_millis() as u64,
            },
            max_block_ms: c.leasing.max_block.as_millis() as u64,
            max_keys: c.store.max_keys,
            fleet_size: c.store.fleet_size,
        }
    }
}

const SHARDS: usize = 64;

/// Leases are keyed by a 64-bit keyed hash of their store key: the map
/// holds no strings, so a lookup touches the table and the lease, nothing
/// else. Two keys would share a lease only on a full 64-bit collision under
/// a per-process random seed (about 1 in 10^7 for a million live keys).
type Shard = RwLock<crate::int_hash::IntMap<u64, Arc<Lease>>>;

/// Leases by key hash, sharded so unrelated keys rarely share a lock; the
/// lock is held only for the lookup and the atomic spend, never across an
/// await.
struct LeaseMap {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    /// Soft cap per shard: at it, empty unheld leases are forgotten before a
    /// new one is made. Leases holding tokens expire within the lease TTL,
    /// so the map stays near the cap under any key churn.
    per_shard_cap: usize,
}

impl LeaseMap {
    fn new(max_keys: usize) -> LeaseMap {
        LeaseMap {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::default())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            per_shard_cap: max_keys.div_ceil(SHARDS).max(16),
        }
    }

    fn shard(&self, h: u64) -> &Shard {
        &self.shards[(h >> 58) as usize % SHARDS]
    }

    /// Runs `f` on the lease of `h`, if there is one, under a read lock.
    fn with<T>(&self, h: u64, f: impl FnOnce(&Lease) -> T) -> Option<T> {
        let shard = self.shard(h).read().ok()?;
        shard.get(&h).map(|l| f(l))
    }

    fn get(&self, h: u64) -> Option<Arc<Lease>> {
        self.shard(h).read().ok()?.get(&h).cloned()
    }

    fn get_or_insert(&self, h: u64, key: &str) -> Option<Arc<Lease>> {
        if let Some(l) = self.get(h) {
            return Some(l);
        }
        let mut shard = self.shard(h).write().ok()?;
        if shard.len() >= self.per_shard_cap && !shard.contains_key(&h) {
            // Full: forget leases that hold nothing and nobody holds. A
            // forgotten blocked key only costs its next request a store call.
            let victims: Vec<u64> = shard
                .iter()
                .filter(|(_, l)| l.available() == 0 && Arc::strong_count(l) == 1)
                .map(|(k, _)| *k)
                .take(64)
                .collect();
            for v in victims {
                shard.remove(&v);
            }
        }
        Some(shard.entry(h).or_insert_with(|| Arc::new(Lease::new(key))).clone())
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().map_or(0, |s| s.len())).sum()
    }
}

pub type Clock = crate::store::memory::Clock;

/// Milliseconds on a monotonic clock (never 0), for leases and blocks:
/// wall-clock jumps must not expire or extend them. Coarse: one atomic
/// load per read (see [`crate::clock`]).
pub fn monotonic_clock() -> Clock {
    crate::clock::coarse()
}

/// The decision engine shared by every worker.
pub struct Limiter {
    store: Arc<dyn QuotaStore>,
    /// Local buckets that decide for fail-open routes while the store is
    /// away; bounded like the embedded store.
    fallback: crate::store::memory::MemoryStore,
    leases: LeaseMap,
    settings: arc_swap::ArcSwap<Settings>,
    clock: Clock,
}

impl Limiter {
    pub fn new(store: Arc<dyn QuotaStore>, settings: Settings, clock: Clock) -> Arc<Limiter> {
        Arc::new(Limiter {
            store,
            fallback: crate::store::memory::MemoryStore::new(settings.max_keys),
            leases: LeaseMap::new(settings.max_keys),
            settings: arc_swap::ArcSwap::from_pointee(settings),
            clock,
        })
    }

    pub fn settings(&self) -> Settings {
        **self.settings.load()
    }

    pub fn set_settings(&self, settings: Settings) {
        self.settings.store(Arc::new(settings));
    }

    pub fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    /// The store's name (`memory`, `redis`).
    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// Keys with a lease now.
    pub fn tracked_keys(&self) -> usize {
        self.leases.len()
    }

    /// The hash of `limit`'s key for `facts`, without building the key.
    fn key_hash(&self, limit: &LimitRuntime, facts: &Facts<'_>, shard: Option<u32>) -> u64 {
        let mut hasher = self.leases.hasher.build_hasher();
        key::hash_into(&mut hasher, &limit.config.name, &limit.config.by, facts);
        if let Some(s) = shard {
            hasher.write_u32(s);
        }
        hasher.finish()
    }

    fn key_string(limit: &LimitRuntime, facts: &Facts<'_>, shard: Option<u32>) -> Arc<str> {
        let mut k = String::with_capacity(64);
        key::derive(&mut k, &limit.config.name, &limit.config.by, facts);
        if let Some(s) = shard {
            key::push_shard(&mut k, s);
        }
        Arc::from(k)
    }

    /// The verdict when every limit has a token at hand, without waiting
    /// for anything; `None` (and nothing spent) when one of them has not.
    /// This is the common path: a hash, a read lock and one
    /// compare-and-swap per limit.
    pub fn try_check(
        self: &Arc<Self>,
        all: &[Arc<LimitRuntime>],
        which: &[usize],
        facts: &Facts<'_>,
    ) -> Option<Verdict> {
        let now = self.now_ms();
        let mut verdict = Verdict::default();
        for (i, limit) in which.iter().filter_map(|&w| all.get(w).map(|l| (w, l))) {
            let (spec, shard) = limit.spec_for(facts);
            let h = self.key_hash(limit, facts, shard);
            let Some((remaining, reset_ms)) = self.take_local(h, spec, now) else {
                self.undo(&verdict);
                return None;
            };
            verdict.taken.push(h);
            verdict.limits.push(admitted(i, &spec, remaining, reset_ms));
        }
        for lv in &verdict.limits {
            if let Some(limit) = all.get(lv.limit) {
                limit.count(Outcome::Admitted);
            }
        }
        Some(verdict)
    }

    /// Spends a token at hand for `h`, if there is one, starting a refill
    /// when the lease runs low. Returns what the headers need.
    fn take_local(self: &Arc<Self>, h: u64, spec: Spec, now: u64) -> Option<(u64, u64)> {
        let (remaining, reset_ms, low) = self
            .leases
            .with(h, |lease| {
                lease.try_take(now).then(|| {
                    let size = lease.size_hint.load(std::sync::atomic::Ordering::Relaxed);
                    (
                        lease.remaining(),
                        lease.reset_ms(now),
                        lease.available() <= Sizing::low_watermark(size),
                    )
                })
            })
            .flatten()?;
        if low {
            if let Some(lease) = self.leases.get(h) {
                self.refill_in_background(lease, spec);
            }
        }
        Some((remaining, reset_ms))
    }

    /// Gives back the tokens a verdict took (a request that was then not
    /// served, e.g. a fail-closed route whose store failed).
    pub fn undo(&self, verdict: &Verdict) {
        for &h in &verdict.taken {
            self.leases.with(h, |l| l.give_back(1));
        }
    }

    /// Decides a request against `which` of `all` (in order). All must admit;
    /// a request refused by one limit gives back what earlier ones took.
    /// Waits for the store only for a limit with no token at hand. Callers
    /// try [`Limiter::try_check`] first. When the store fails and the route
    /// fails open, the key's local fallback bucket decides instead.
    pub async fn check(
        self: &Arc<Self>,
        all: &[Arc<LimitRuntime>],
        which: &[usize],
        facts: &Facts<'_>,
        fail_open: bool,
    ) -> Verdict {
        let settings = self.settings();
        let mut verdict = Verdict::default();
        for (i, limit) in which.iter().filter_map(|&w| all.get(w).map(|l| (w, l))) {
            let (spec, shard) = limit.spec_for(facts);
            let now = self.now_ms();
            let h = self.key_hash(limit, facts, shard);
            let lv = match self.take_local(h, spec, now) {
                Some((remaining, reset_ms)) => {
                    verdict.taken.push(h);
                    admitted(i, &spec, remaining, reset_ms)
                }
                None => {
                    let key = Self::key_string(limit, facts, shard);
                    match self.slow_path(h, &key, &spec, now, &settings).await {
                        Ok(Some((remaining, reset_ms))) => {
                            verdict.taken.push(h);
                            admitted(i, &spec, remaining, reset_ms)
                        }
                        Ok(None) => self.refused(i, limit, h, &key, &spec),
                        Err(e) => {
                            // The route's on_store_failure decides: a
                            // fail-closed route answers 503 whatever later
                            // limits say; a fail-open one asks the fallback.
                            verdict.store_error = Some(e);
                            if !fail_open {
                                // The request gets a 503 whatever later
                                // limits would say: no need to ask them.
                                break;
                            }
                            self.fallback(i, limit, &key, &spec, shard, &settings)
                        }
                    }
                }
            };
            limit.count(lv.outcome);
            let refused = lv.outcome == Outcome::Limited;
            verdict.limits.push(lv);
            if refused {
                verdict.refused = Some(verdict.limits.len() - 1);
                // Nothing was admitted: earlier limits get their token back.
                self.undo(&verdict);
                verdict.taken.clear();
                break;
            }
        }
        verdict
    }

    /// The verdict of the local fallback bucket of `key`: its quota is the
    /// limit's `fallback_rate`, or the key's quota divided over the fleet.
    fn fallback(
        &self,
        i: usize,
        limit: &LimitRuntime,
        key: &str,
        spec: &Spec,
        shard: Option<u32>,
        settings: &Settings,
    ) -> LimitVerdict {
        let mut fallback = limit.config.fallback_spec(spec, settings.fleet_size);
        if let (Some(s), Some(_)) = (shard, limit.config.fallback_rate) {
            // A set fallback_rate is the whole key's: a sub-bucket gets its share.
            fallback = fallback.share(s, limit.shards);
        }
        let grant = self
            .fallback
            .acquire_now(key, &fallback, 1, Unspent::default())
            .unwrap_or_default();
        let (outcome, reset_ms) = if grant.granted > 0 {
            (Outcome::Admitted, grant.reset_ms)
        } else {
            (
                stage::on_refusal(limit.config.mode, limit.enforcing),
                grant.retry_after_ms,
            )
        };
        LimitVerdict {
            limit: i,
            outcome,
            quota: fallback.count,
            window_secs: fallback.window_secs(),
            remaining: grant.remaining.min(fallback.count),
            reset_ms,
            retry_after_ms: grant.retry_after_ms,
            over_percent: if grant.granted > 0 { 0 } else { 100 },
        }
    }

    /// The verdict of a limit whose key is refused (by the store or by the
    /// local block).
    fn refused(&self, i: usize, limit: &LimitRuntime, h: u64, key: &str, spec: &Spec) -> LimitVerdict {
        let now = self.now_ms();
        let (retry_after_ms, over, remaining, reset_ms) = self
            .leases
            .with(h, |l| {
                let over = l.over.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                (blocked::retry_after(l, now), over, l.remaining(), l.reset_ms(now))
            })
            .unwrap_or((1, 1, 0, 0));
        let outcome = stage::on_refusal(limit.config.mode, limit.enforcing);
        // One event at 1, 2, 4, 8, ... refusals: a flood logs a handful.
        if outcome == Outcome::ShadowLimited && over.is_power_of_two() {
            tracing::info!(
                target: "rate_limit_shadow_block",
                limit = %limit.config.name,
                key = %key,
                over_by = over,
                over_percent = stage::over_percent(over, spec.count),
                "rate_limit_shadow_block"
            );
        }
        LimitVerdict {
            limit: i,
            outcome,
            quota: spec.count,
            window_secs: spec.window_secs(),
            remaining: remaining.min(spec.count),
            // A refused client is told the time it may retry.
            reset_ms: if outcome == Outcome::Limited {
                retry_after_ms
            } else {
                reset_ms
            },
            retry_after_ms,
            over_percent: stage::over_percent(over, spec.count),
        }
    }

    /// No token at hand: blocked, or one store call.
    async fn slow_path(
        self: &Arc<Self>,
        h: u64,
        key: &Arc<str>,
        spec: &Spec,
        now: u64,
        settings: &Settings,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let Some(lease) = self.leases.get_or_insert(h, key) else {
            return Err(StoreError::Failed("lease map lock poisoned".into()));
        };
        if lease.try_take(now) {
            return Ok(Some((lease.remaining(), lease.reset_ms(now))));
        }
        lease.touch(now);
        // Expired tokens go back before asking for more, so the store never
        // refuses while they sit here.
        let expired = lease.take_expired(now);
        if expired > 0 {
            if let Err(e) = self
                .store
                .release(
                    key,
                    &lease.spec().unwrap_or(*spec),
                    Unspent {
                        tokens: expired,
                        window_ms: 0,
                    },
                )
                .await
            {
                tracing::debug!(%key, error = %e, "releasing an expired lease failed");
            }
        }
        if blocked::remaining(&lease, now).is_some() {
            return Ok(None);
        }
        // One store call per key at a time: requests that find one in
        // flight wait for its answer (at most the store deadline) instead of
        // adding theirs (a hot key coming out of a block would otherwise send
        // one call per waiting request). If that call failed, they fail the
        // same way at once; if it answered but left them no token, they
        // make their own calls.
        let slot = match lease.start_refill() {
            Some(slot) => Some(slot),
            None => {
                // Bounded by that call's own deadline (the guard's), and
                // released early if its request goes away.
                let waited = lease.wait_for_refill().await;
                let now = self.now_ms();
                if lease.try_take(now) {
                    return Ok(Some((lease.remaining(), lease.reset_ms(now))));
                }
                if blocked::remaining(&lease, now).is_some() {
                    return Ok(None);
                }
                match waited {
                    Some(slot) => Some(slot),
                    None => {
                        if let Some(e) = lease.last_failure() {
                            return Err(e);
                        }
                        // It answered but left no token for this request:
                        // call now, beside any other, rather than queue
                        // behind one call at a time (leases of one token
                        // would serialise a busy key).
                        None
                    }
                }
            }
        };
        let now = self.now_ms();
        let size = lease.next_size(&settings.sizing, spec.capacity, now, expired);
        lease.size_hint.store(size, std::sync::atomic::Ordering::Relaxed);
        lease.set_spec(*spec);
        let grant = self.store.acquire(key, spec, size, Unspent::default()).await;
        if let Some(slot) = &slot {
            slot.record(grant.as_ref().err());
        }
        let grant = grant?;
        let now = self.now_ms();
        if grant.granted == 0 {
            lease.refused(grant.reset_ms.max(grant.retry_after_ms), now);
            blocked::block(&lease, now, grant.retry_after_ms, settings.max_block_ms);
            return Ok(None);
        }
        lease.add(
            Granted {
                tokens: grant.granted - 1,
                remaining: grant.remaining,
                reset_ms: grant.reset_ms,
            },
            now,
            settings.sizing.ttl_ms,
        );
        drained(&lease, spec, grant.remaining, now, settings);
        Ok(Some((lease.remaining(), lease.reset_ms(now))))
    }

    /// Tops up a busy key's lease before it runs dry; one refill per key.
    /// A store that answers at once (the embedded one) is served inline; one
    /// that must wait (Redis) finishes in a background task, so no request
    /// waits for it.
    fn refill_in_background(self: &Arc<Self>, lease: Arc<Lease>, spec: Spec) {
        if lease.refill_in_flight() {
            return;
        }
        let this = self.clone();
        let mut refill = Box::pin(async move {
            // Released when this ends, or if the task is dropped midway.
            let Some(slot) = lease.start_refill() else {
                return;
            };
            let settings = this.settings();
            let now = this.now_ms();
            let size = lease.next_size(&settings.sizing, spec.capacity, now, 0);
            lease.size_hint.store(size, std::sync::atomic::Ordering::Relaxed);
            lease.set_spec(spec);
            let answer = this.store.acquire(lease.key(), &spec, size, Unspent::default()).await;
            slot.record(answer.as_ref().err());
            let now = this.now_ms();
            match answer {
                Ok(g) if g.granted > 0 => {
                    lease.add(
                        Granted {
                            tokens: g.granted,
                            remaining: g.remaining,
                            reset_ms: g.reset_ms,
                        },
                        now,
                        settings.sizing.ttl_ms,
                    );
                    drained(&lease, &spec, g.remaining, now, &settings);
                }
                // Refused: the tokens at hand are still spent; requests that
                // find none (and those waiting for this call) are refused
                // here until the store's retry time, as after a request's
                // own refusal.
                Ok(g) => {
                    lease.refused(g.reset_ms.max(g.retry_after_ms), now);
                    blocked::block(&lease, now, g.retry_after_ms, settings.max_block_ms);
                }
                Err(e) => tracing::debug!(key = lease.key(), error = %e, "background lease refill failed"),
            }
            drop(slot);
        });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if refill.as_mut().poll(&mut cx).is_pending() {
            tokio::spawn(refill);
        }
    }

    /// Returns expired leases' tokens to the store and forgets keys idle for
    /// longer than `idle_ms`. Run periodically; bounds memory per key.
    pub async fn sweep(&self, idle_ms: u64) {
        let now = self.now_ms();
        let mut to_release = Vec::new();
        for shard in self.leases.shards.iter() {
            let Ok(mut map) = shard.write() else { continue };
            map.retain(|_, lease| {
                let expired = lease.take_expired(now);
                if let (true, Some(spec)) = (expired > 0, lease.spec()) {
                    to_release.push((lease.clone(), spec, expired));
                }
                let touched = lease.touched.load(std::sync::atomic::Ordering::Relaxed);
                let idle = now.saturating_sub(touched) > idle_ms && blocked::remaining(lease, now).is_none();
                // A lease someone holds (a refill in flight) stays.
                !(idle && lease.available() == 0 && Arc::strong_count(lease) == 1)
            });
        }
        for (lease, spec, tokens) in to_release {
            if let Err(e) = self
                .store
                .release(lease.key(), &spec, Unspent { tokens, window_ms: 0 })
                .await
            {
                tracing::debug!(key = lease.key(), error = %e, "releasing an expired lease failed");
            }
        }
    }

    /// After a reload: gives back the tokens of leases drawn under `limits`
    /// (limits removed, or whose quota changed). Returns how many.
    pub async fn release_limits(&self, limits: &std::collections::HashSet<String>) -> u64 {
        if limits.is_empty() {
            return 0;
        }
        self.release_where(|lease| {
            let hit = limits.contains(limit_of(lease.key()));
            if hit {
                // A refusal under the old quota says nothing about the new one.
                lease.blocked_until.store(0, std::sync::atomic::Ordering::Relaxed);
            }
            hit
        })
        .await
    }

    /// Gives every unspent token back to the store (shutdown). Returns how
    /// many tokens went back.
    pub async fn release_all(&self) -> u64 {
        self.release_where(|_| true).await
    }

    /// Takes every token of the leases `pick` selects and gives them back to
    /// the store; the shard locks are released before any store call.
    async fn release_where(&self, mut pick: impl FnMut(&Lease) -> bool) -> u64 {
        let mut to_release = Vec::new();
        for shard in self.leases.shards.iter() {
            let Ok(map) = shard.read() else { continue };
            for lease in map.values() {
                if !pick(lease) {
                    continue;
                }
                let n = lease.take_all();
                if let (true, Some(spec)) = (n > 0, lease.spec()) {
                    to_release.push((lease.clone(), spec, n));
                }
            }
        }
        // Many calls in flight at once (a multiplexed connection pipelines
        // them): at shutdown, 100k leases must not take 100k round trips.
        let mut released = 0;
        let mut in_flight = tokio::task::JoinSet::new();
        for (lease, spec, tokens) in to_release {
            if in_flight.len() >= RELEASES_IN_FLIGHT {
                if let Some(Ok(n)) = in_flight.join_next().await {
                    released += n;
                }
            }
            let store = self.store.clone();
            in_flight.spawn(async move {
                match store
                    .release(lease.key(), &spec, Unspent { tokens, window_ms: 0 })
                    .await
                {
                    Ok(()) => tokens,
                    Err(e) => {
                        tracing::debug!(key = lease.key(), error = %e, "releasing a lease failed");
                        0
                    }
                }
            });
        }
        while let Some(done) = in_flight.join_next().await {
            released += done.unwrap_or(0);
        }
        released
    }
}

/// After a grant that left the shared bucket `remaining`: if it drained
/// it, a request that finds nothing at hand is refused here for about one
/// token's refill time (at most the lease TTL, after which tokens at hand
/// go back and the store may have more), rather than asking a store that
/// just said it has nothing: the requests that waited for this call would
/// otherwise all ask at once.
fn drained(lease: &Lease, spec: &Spec, remaining: u64, now: u64, settings: &Settings) {
    if remaining == 0 {
        let per_token = spec.period_ms().div_ceil(spec.count).max(1);
        // Clients are told the full refill time of one token (at most that
        // long until one exists); the local block is the shorter of it, the
        // lease TTL and max_block_ms.
        let cap = settings.sizing.ttl_ms.min(settings.max_block_ms);
        blocked::block(lease, now, per_token, cap);
    }
}

/// Releases in flight at once when many leases go back together.
const RELEASES_IN_FLIGHT: usize = 64;

/// The limit name inside `rl:{<limit>:...}`.
fn limit_of(key: &str) -> &str {
    let inner = key.strip_prefix("rl:{").unwrap_or(key);
    inner.split([':', '}']).next().unwrap_or(inner)
}

fn admitted(i: usize, spec: &Spec, remaining: u64, reset_ms: u64) -> LimitVerdict {
    LimitVerdict {
        limit: i,
        outcome: Outcome::Admitted,
        quota: spec.count,
        window_secs: spec.window_secs(),
        // A burst above the rate may hold more: never advertise more than q.
        remaining: remaining.min(spec.count),
        reset_ms,
        retry_after_ms: 0,
        over_percent: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeyPart, Mode};
    use crate::quota::{Grant, Rate};
    use crate::store::memory::MemoryStore;
    use crate::store::BoxFuture;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A memory store that counts its calls.
    struct Counting {
        inner: MemoryStore,
        acquires: AtomicU64,
        releases: AtomicU64,
    }

    impl QuotaStore for Counting {
        fn acquire<'a>(
            &'a self,
            key: &'a str,
            spec: &'a Spec,
            want: u64,
            unspent: Unspent,
        ) -> BoxFuture<'a, Result<Grant, StoreError>> {
            self.acquires.fetch_add(1, Ordering::SeqCst);
            self.inner.acquire(key, spec, want, unspent)
        }
        fn release<'a>(
            &'a self,
            key: &'a str,
            spec: &'a Spec,
            unused: Unspent,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            self.releases.fetch_add(1, Ordering::SeqCst);
            self.inner.release(key, spec, unused)
        }
        fn name(&self) -> &'static str {
            "counting"
        }
    }

    fn limit(name: &str, rate: &str, burst: Option<u64>, mode: Mode) -> Arc<LimitRuntime> {
        let rate: Rate = rate.parse().unwrap();
        let config = Arc::new(Limit {
            burst: burst.unwrap_or(rate.count),
            mode,
            ..Limit::new(name, rate)
        });
        Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))
    }

    fn setup() -> (Arc<Counting>, Arc<Limiter>) {
        let store = Arc::new(Counting {
            inner: MemoryStore::new(10_000),
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
        });
        let settings = Settings {
            sizing: Sizing::default(),
            max_block_ms: 5_000,
            max_keys: 100_000,
            fleet_size: 1,
        };
        (store.clone(), Limiter::new(store, settings, monotonic_clock()))
    }

    fn facts<'a>(identity: &'a str, headers: &'a http::HeaderMap) -> Facts<'a> {
        Facts {
            identity,
            tenant: None,
            plan: None,
            route: "r",
            ip: "127.0.0.1".parse().unwrap(),
            headers,
        }
    }

    /// A store that answers after a delay, like one across a network.
    struct Slow(Counting);

    impl QuotaStore for Slow {
        fn acquire<'a>(
            &'a self,
            key: &'a str,
            spec: &'a Spec,
            want: u64,
            unspent: Unspent,
        ) -> BoxFuture<'a, Result<Grant, StoreError>> {
            // Counted when asked, answered 10 ms later.
            self.0.acquires.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                self.0.inner.acquire(key, spec, want, unspent).await
            })
        }
        fn release<'a>(
            &'a self,
            key: &'a str,
            spec: &'a Spec,
            unused: Unspent,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            self.0.release(key, spec, unused)
        }
        fn name(&self) -> &'static str {
            "slow"
        }
    }

    #[tokio::test]
    async fn concurrent_requests_without_tokens_share_one_store_call() {
        let store = Arc::new(Slow(Counting {
            inner: MemoryStore::new(1_000),
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
        }));
        let settings = Settings {
            sizing: Sizing {
                min: 50,
                ..Sizing::default()
            },
            max_block_ms: 5_000,
            max_keys: 100_000,
            fleet_size: 1,
        };
        let limiter = Limiter::new(store.clone(), settings, monotonic_clock());
        let limits = Arc::new(vec![limit("big", "1000000/s", None, Mode::Enforce)]);
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (limiter, limits) = (limiter.clone(), limits.clone());
            tasks.push(tokio::spawn(async move {
                let h = http::HeaderMap::new();
                let v = limiter.check(&limits, &[0], &facts("hot", &h), true).await;
                (v.refused, v.store_error)
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), (None, None));
        }
        // One call brought 50 tokens for all twenty (a background refill
        // may follow once the lease runs low).
        assert!(store.0.acquires.load(Ordering::SeqCst) <= 2, "{:?}", store.0.acquires);
    }

    #[tokio::test]
    async fn a_request_waits_for_another_requests_store_call_no_longer_than_the_deadline() {
        // The store answers in 10 ms; the guard's deadline is 5 ms.
        let slow = Arc::new(Slow(Counting {
            inner: MemoryStore::new(1_000),
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
        }));
        let store = Arc::new(crate::store::guard::Guarded::new(
            slow.clone(),
            Duration::from_millis(5),
            crate::store::guard::BreakerSettings {
                failures: 3,
                open_ms: 1_000,
            },
            monotonic_clock(),
            Arc::new(Metrics::new()),
        ));
        let limiter = Limiter::new(store, setup().1.settings(), monotonic_clock());
        let limits = Arc::new(vec![limit("big", "1000000/s", None, Mode::Enforce)]);
        let first = {
            let (limiter, limits) = (limiter.clone(), limits.clone());
            tokio::spawn(async move {
                let h = http::HeaderMap::new();
                limiter.check(&limits, &[0], &facts("k", &h), false).await.store_error
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let h = http::HeaderMap::new();
        let started = std::time::Instant::now();
        // This one waits for the first request's call, which the deadline ends.
        let second = limiter.check(&limits, &[0], &facts("k", &h), false).await;
        assert_eq!(second.store_error, Some(StoreError::Timeout(5)));
        assert!(started.elapsed() < Duration::from_millis(9), "{:?}", started.elapsed());
        assert_eq!(first.await.unwrap(), Some(StoreError::Timeout(5)));
        assert_eq!(slow.0.acquires.load(Ordering::SeqCst), 1, "one call for both");
    }

    /// A store that fails after a moment, counting its calls.
    struct Failing(AtomicU64);

    impl QuotaStore for Failing {
        fn acquire<'a>(
            &'a self,
            _: &'a str,
            _: &'a Spec,
            _: u64,
            _: Unspent,
        ) -> BoxFuture<'a, Result<Grant, StoreError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(3)).await;
                Err(StoreError::Unavailable("down".into()))
            })
        }
        fn release<'a>(&'a self, _: &'a str, _: &'a Spec, _: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
            Box::pin(async { Ok(()) })
        }
        fn name(&self) -> &'static str {
            "failing"
        }
    }

    #[tokio::test]
    async fn requests_that_waited_for_a_failed_call_fail_with_it_without_calling_again() {
        let store = Arc::new(Failing(AtomicU64::new(0)));
        let settings = setup().1.settings();
        let limiter = Limiter::new(store.clone(), settings, monotonic_clock());
        let limits = Arc::new(vec![limit("big", "1000000/s", None, Mode::Enforce)]);
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let (limiter, limits) = (limiter.clone(), limits.clone());
            tasks.push(tokio::spawn(async move {
                let h = http::HeaderMap::new();
                limiter.check(&limits, &[0], &facts("k", &h), false).await.store_error
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), Some(StoreError::Unavailable("down".into())));
        }
        assert_eq!(store.0.load(Ordering::SeqCst), 1, "one call for five requests");
    }

    /// Three per hour, leases of ten that live 50 ms: the first request's
    /// lease takes the whole bucket.
    fn one_lease_drains_the_bucket() -> (Arc<Limiter>, Vec<Arc<LimitRuntime>>) {
        let (_store, limiter) = setup();
        limiter.set_settings(Settings {
            sizing: Sizing {
                min: 10,
                max: 10,
                fraction: 1.0,
                ttl_ms: 50,
                ..Sizing::default()
            },
            max_block_ms: 5_000,
            max_keys: 100_000,
            fleet_size: 1,
        });
        (limiter, vec![limit("three", "3/h", None, Mode::Enforce)])
    }

    #[tokio::test]
    async fn a_drained_bucket_refuses_from_memory_with_the_real_wait() {
        let (limiter, limits) = one_lease_drains_the_bucket();
        let h = http::HeaderMap::new();
        let v = limiter.check(&limits, &[0], &facts("a", &h), true).await;
        assert_eq!(v.refused, None);
        // Another instance would now find the bucket empty; this one has two
        // tokens at hand, then refuses from memory (telling the client the
        // real wait for a token: 20 minutes).
        for _ in 0..2 {
            assert_eq!(limiter.check(&limits, &[0], &facts("a", &h), true).await.refused, None);
        }
        let v = limiter.check(&limits, &[0], &facts("a", &h), true).await;
        assert_eq!(v.refused, Some(0));
        assert_eq!(v.limits[0].retry_after_ms, 1_200_000);
    }

    #[tokio::test]
    async fn unspent_tokens_of_a_drained_bucket_serve_again_after_the_lease_ttl() {
        let (limiter, limits) = one_lease_drains_the_bucket();
        let h = http::HeaderMap::new();
        assert_eq!(limiter.check(&limits, &[0], &facts("a", &h), true).await.refused, None);
        // The two unspent tokens expire with the lease and go back; the
        // drained-bucket block is no longer than the TTL, so they serve.
        tokio::time::sleep(Duration::from_millis(80)).await;
        for i in 0..2 {
            let v = limiter.check(&limits, &[0], &facts("a", &h), true).await;
            assert_eq!(v.refused, None, "request {i}");
        }
    }

    #[tokio::test]
    async fn a_fail_closed_route_stops_at_the_first_limit_whose_store_failed() {
        let store = Arc::new(Failing(AtomicU64::new(0)));
        let limiter = Limiter::new(store.clone(), setup().1.settings(), monotonic_clock());
        let limits = vec![
            limit("a", "1000000/s", None, Mode::Enforce),
            limit("b", "1000000/s", None, Mode::Enforce),
        ];
        let h = http::HeaderMap::new();
        let v = limiter.check(&limits, &[0, 1], &facts("k", &h), false).await;
        assert!(v.store_error.is_some());
        assert_eq!(store.0.load(Ordering::SeqCst), 1, "the 503 is decided; b is not asked");
        // A fail-open route asks both, each decided by its fallback bucket.
        let v = limiter.check(&limits, &[0, 1], &facts("k2", &h), true).await;
        assert_eq!(v.limits.len(), 2);
        assert_eq!(v.refused, None);
    }

    #[tokio::test]
    async fn a_sharded_limits_fallback_rate_is_split_over_its_sub_buckets() {
        let store = Arc::new(Failing(AtomicU64::new(0)));
        let limiter = Limiter::new(store, setup().1.settings(), monotonic_clock());
        let rate: Rate = "40/h".parse().unwrap();
        let config = Arc::new(Limit {
            by: vec![KeyPart::Route],
            shards: 4,
            fallback_rate: Some("8/h".parse().unwrap()),
            ..Limit::new("sharded", rate)
        });
        let limits = vec![Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))];
        let h = http::HeaderMap::new();
        // One client, so one sub-bucket: its share of the fallback is 8 / 4.
        let mut admitted = 0;
        for _ in 0..5 {
            let v = limiter.check(&limits, &[0], &facts("k", &h), true).await;
            assert!(v.store_error.is_some());
            if v.refused.is_none() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 2);
    }

    #[tokio::test]
    async fn a_dropped_request_frees_its_keys_store_call_slot() {
        let store = Arc::new(Slow(Counting {
            inner: MemoryStore::new(1_000),
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
        }));
        let limiter = Limiter::new(store.clone(), setup().1.settings(), monotonic_clock());
        let limits = vec![limit("big", "1000000/s", None, Mode::Enforce)];
        let h = http::HeaderMap::new();
        // A client that goes away while its store call is in flight...
        let abandoned = tokio::time::timeout(
            Duration::from_millis(2),
            limiter.check(&limits, &[0], &facts("k", &h), true),
        )
        .await;
        assert!(abandoned.is_err());
        // ...leaves the key free for the next request.
        let v = tokio::time::timeout(
            Duration::from_secs(1),
            limiter.check(&limits, &[0], &facts("k", &h), true),
        )
        .await
        .expect("no request waits on an abandoned call");
        assert_eq!(v.refused, None);
    }

    #[tokio::test]
    async fn a_low_limit_admits_exactly_its_quota_then_refuses_from_memory() {
        let (store, limiter) = setup();
        let limits = vec![limit("five", "5/min", None, Mode::Enforce)];
        let h = http::HeaderMap::new();
        for i in 0..5 {
            let v = limiter.check(&limits, &[0], &facts("a", &h), true).await;
            assert_eq!(v.refused, None, "request {i}");
            assert_eq!(v.limits[0].remaining, 4 - i);
        }
        let v = limiter.check(&limits, &[0], &facts("a", &h), true).await;
        assert_eq!(v.refused, Some(0));
        assert_eq!(v.limits[0].retry_after_ms.div_ceil(1000), 12);
        let calls = store.acquires.load(Ordering::SeqCst);
        // A burst of refusals on the blocked key costs no store call.
        for _ in 0..1_000 {
            let v = limiter.check(&limits, &[0], &facts("a", &h), true).await;
            assert_eq!(v.refused, Some(0));
        }
        assert_eq!(store.acquires.load(Ordering::SeqCst), calls);
        // Another identity is independent.
        let v = limiter.check(&limits, &[0], &facts("b", &h), true).await;
        assert_eq!(v.refused, None);
    }

    #[tokio::test]
    async fn a_refusal_by_the_second_limit_gives_back_the_first() {
        let (_, limiter) = setup();
        let limits = vec![
            limit("wide", "10/min", None, Mode::Enforce),
            limit("narrow", "2/min", None, Mode::Enforce),
        ];
        let h = http::HeaderMap::new();
        for _ in 0..2 {
            assert_eq!(
                limiter.check(&limits, &[0, 1], &facts("a", &h), true).await.refused,
                None
            );
        }
        for _ in 0..5 {
            let v = limiter.check(&limits, &[0, 1], &facts("a", &h), true).await;
            assert_eq!(v.refused, Some(1));
        }
        // "wide" spent only on the 2 admitted requests: 8 left for its own route.
        let mut admitted = 0;
        for _ in 0..20 {
            if limiter
                .check(&limits, &[0], &facts("a", &h), true)
                .await
                .refused
                .is_none()
            {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 8);
    }

    #[tokio::test]
    async fn shadow_and_soft_spend_like_enforce_but_admit() {
        let (_, limiter) = setup();
        let limits = vec![
            limit("shadow", "3/min", None, Mode::Shadow),
            limit("soft", "3/min", None, Mode::Soft),
        ];
        let h = http::HeaderMap::new();
        let mut outcomes = Vec::new();
        for _ in 0..5 {
            let v = limiter.check(&limits, &[0, 1], &facts("a", &h), true).await;
            assert_eq!(v.refused, None);
            outcomes.push((v.limits[0].outcome, v.limits[1].outcome));
        }
        let over = |o: Outcome| outcomes.iter().filter(|(a, b)| *a == o || *b == o).count();
        assert_eq!(over(Outcome::ShadowLimited), 2);
        assert_eq!(over(Outcome::SoftLimited), 2);
    }

    #[tokio::test]
    async fn leases_grow_for_a_busy_key_and_cut_store_calls() {
        let (store, limiter) = setup();
        let limits = vec![limit("big", "1000000/min", None, Mode::Enforce)];
        let h = http::HeaderMap::new();
        for _ in 0..20_000 {
            assert_eq!(limiter.check(&limits, &[0], &facts("a", &h), true).await.refused, None);
            tokio::task::yield_now().await; // let background refills run
        }
        let calls = store.acquires.load(Ordering::SeqCst);
        assert!(calls < 20_000 / 50, "{calls} store calls for 20,000 decisions");
    }

    #[tokio::test]
    async fn expired_leases_go_back_to_the_store() {
        let (store, limiter) = setup();
        limiter.set_settings(Settings {
            sizing: Sizing {
                ttl_ms: 1,
                ..Sizing::default()
            },
            max_block_ms: 5_000,
            max_keys: 100_000,
            fleet_size: 1,
        });
        let limits = vec![limit("l", "1000/min", None, Mode::Enforce)];
        let h = http::HeaderMap::new();
        assert_eq!(limiter.check(&limits, &[0], &facts("a", &h), true).await.refused, None);
        tokio::time::sleep(Duration::from_millis(5)).await;
        limiter.sweep(60_000).await;
        assert_eq!(store.releases.load(Ordering::SeqCst), 1);
        // All 1000 are back in the shared bucket.
        let g = store
            .inner
            .acquire_now("rl:{l:a}", &limits[0].spec, 2_000, Unspent::default())
            .unwrap();
        assert_eq!(g.granted, 1_000 - 1);
    }

    #[tokio::test]
    async fn key_churn_cannot_grow_the_lease_map_past_its_cap() {
        let store = Arc::new(MemoryStore::new(1_000_000));
        let settings = Settings {
            sizing: Sizing::default(),
            max_block_ms: 3_600_000,
            max_keys: 1_024,
            fleet_size: 1,
        };
        let limiter = Limiter::new(store, settings, monotonic_clock());
        let limits = vec![limit("one", "1/h", None, Mode::Enforce)];
        let h = http::HeaderMap::new();
        for i in 0..20_000 {
            let id = format!("subnet:2001:db8:{i:x}::/64");
            limiter.check(&limits, &[0], &facts(&id, &h), true).await;
            limiter.check(&limits, &[0], &facts(&id, &h), true).await; // refused and blocked for an hour
        }
        assert!(
            limiter.tracked_keys() <= 1_024 + SHARDS,
            "{} leases",
            limiter.tracked_keys()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn eight_tasks_on_one_key_admit_exactly_the_allowance() {
        let (_, limiter) = setup();
        let limits = Arc::new(vec![limit("day", "1000/day", None, Mode::Enforce)]);
        let admitted = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (limiter, limits, admitted) = (limiter.clone(), limits.clone(), admitted.clone());
                tokio::spawn(async move {
                    let h = http::HeaderMap::new();
                    for _ in 0..100_000 {
                        if limiter
                            .check(&limits, &[0], &facts("hot", &h), true)
                            .await
                            .refused
                            .is_none()
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 1000);
    }
}
