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

//!
//! Rooms: [`table`] (the bounded lease table), `thread_cache` (each thread's
//! front of it: a hot key's lease without a lock), `slow_path` (one store call
//! per key at a time, serving the requests queued behind it), `fallback`
//! (local buckets while the store is away), `sweep` (tokens going back),
//! [`blocked`] (the short-circuit after a refusal), [`stage`] (what a
//! refusal means under each rollout stage), [`report`] (what an operator
//! may read: one key's state, the hot keys), [`keyed`] (decisions for a
//! key and quota given by the caller: the Envoy rate limit services).
//!
//! `impl Limiter` is the decision and what it needs (at most 30 methods,
//! held by `architecture::the_limiter_decides_and_nothing_else`). The
//! other callers reach it through borrowed views, each its own type:
//! [`Limiter::keyed`] (the Envoy fronts), [`Limiter::sweeper`] (tokens
//! going back, run as a task by the composition root) and
//! [`Limiter::report`] (the admin's reads). The fleet heartbeat
//! ([`fleet::Heartbeat`]), the overrides follower
//! ([`overrides::OverridesFollower`]) and the slot renewer
//! ([`slots::SlotRenewer`]) are tasks of their own, started by the
//! composition root.

pub mod blocked;
pub mod cost;
mod fallback;
pub mod fleet;
pub mod handle;
pub mod headers;
pub mod key;
pub mod keyed;
pub mod lease;
pub mod overrides;
pub mod policy;
mod recent_refusals;
pub mod report;
pub mod slots;
mod slow_path;
pub mod stage;
pub mod sweep;
pub mod table;
#[cfg(test)]
pub(crate) mod testing;
mod thread_cache;
pub mod usage;
mod verdict;

use std::borrow::Cow;
use std::hash::Hasher;
use std::sync::Arc;

use crate::clock::Clock;
use crate::quota::{Algorithm, Spec};
use crate::store::{FleetStore, StoreError};
use crate::telemetry::metrics::{DecisionLabels, Metrics, StripedCounter};
pub use handle::LimitRef;
use key::Facts;
use lease::Sizing;
use policy::{Limit, Mode, StoreFailure};
use stage::Outcome;
use table::LeaseTable;
use verdict::{admitted, cost_of};
pub use verdict::{Checked, Costs, Decision, LimitVerdict, Pending, Verdict};

/// One configured limit, ready for decisions: its quota, its stage on this
/// instance and its counters. Rebuilt with each config.
pub struct LimitRuntime {
    pub config: Arc<Limit>,
    pub spec: Spec,
    /// `config.shards`, kept beside `spec` so an unsharded decision does
    /// not touch the config at all.
    shards: u32,
    /// `spec` cut to this region's slice: the quota of every key of an
    /// unsharded limit without plans, worked out once.
    sliced: Spec,
    /// The name as it enters key hashes ([`key::name_id`]).
    name_id: u64,
    /// Whether a canary limit enforces on this instance.
    pub enforcing: bool,
    /// The `RateLimit-Policy` item of `sliced`, made once.
    pub policy: headers::Policy,
    counters: [StripedCounter; 4],
}

impl std::fmt::Debug for LimitRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitRuntime")
            .field("name", &self.config.name)
            .field("spec", &self.spec)
            .field("enforcing", &self.enforcing)
            .finish_non_exhaustive()
    }
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
        let spec = config.spec();
        let sliced = spec.slice(config.share());
        LimitRuntime {
            spec,
            shards: config.shards,
            sliced,
            name_id: key::name_id(&config.name),
            enforcing: stage::canary_enforces(instance_id, config.canary_percent),
            // A calendar window's length changes; its responses make their own item.
            policy: headers::Policy::new(&config.name, sliced.count, sliced.period_ms().div_ceil(1000).max(1)),
            counters: [
                counter(Outcome::Admitted),
                counter(Outcome::Limited),
                counter(Outcome::ShadowLimited),
                counter(Outcome::SoftLimited),
            ],
            config,
        }
    }

    /// Whether a refusal by this limit turns a request away on this
    /// instance: `enforce`, and `canary` where it enforces. Shadow, soft and
    /// a non-enforcing canary never refuse, and never answer 503 either.
    pub fn can_refuse(&self) -> bool {
        match self.config.mode {
            Mode::Enforce => true,
            Mode::Canary => self.enforcing,
            Mode::Shadow | Mode::Soft => false,
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
    /// Borrowed when it is the limit's own: a decision copies no quota.
    /// Inline, and a key's own quota out of line (see `spec_of`).
    #[inline]
    fn spec_for(&self, facts: &Facts<'_>) -> (Cow<'_, Spec>, Option<u32>) {
        if self.shards <= 1
            && (facts.plan.is_none() || self.config.plans.is_empty())
            && (facts.rates.is_empty() || self.config.rate_from.is_none())
        {
            return (Cow::Borrowed(&self.sliced), None);
        }
        self.own_spec(facts)
    }

    /// [`key_spec`]: a claim's, a plan's or a sub-bucket's quota.
    #[inline(never)]
    fn own_spec(&self, facts: &Facts<'_>) -> (Cow<'_, Spec>, Option<u32>) {
        let (spec, shard) = key_spec(&self.config, self.spec, self.shards, facts);
        (Cow::Owned(spec), shard)
    }
}

/// The quota of a request's key under `limit` (whose plain quota is
/// `spec`, split in `shards`): the rate of the caller's verified JWT claim
/// when the limit has `rate_from` (at most `max_rate`), else the plan's
/// rate when the request's plan is one of the limit's, then its sub-bucket's share when sharded, then this
/// region's slice (`[region] share`; the whole without `[region]`). The
/// slice comes last so that another region, given the key's whole quota
/// ([`Spec::whole`]), computes its own slice of it exactly. The limiter and
/// `leasegate explain` both ask this.
pub fn key_spec(limit: &Limit, spec: Spec, shards: u32, facts: &Facts<'_>) -> (Spec, Option<u32>) {
    // A verified token's own rate (`rate_from`, clamped by `max_rate`)
    // comes first, then the plan's.
    let claimed = limit
        .rate_from
        .as_ref()
        .and_then(|rf| rf.quota(facts.rates.get(rf.index)?.as_deref()?));
    let spec = if let Some((rate, capacity)) = claimed {
        Spec::new(limit.algorithm, rate, capacity)
    } else if facts.plan.is_none() || limit.plans.is_empty() {
        spec
    } else {
        limit.spec_for(facts.plan)
    };
    if shards <= 1 {
        return (spec.slice(limit.share()), None);
    }
    let shard = key::shard(limit.shard_by, shards, facts);
    (spec.share(shard, shards).slice(limit.share()), Some(shard))
}

/// A store key's public name: the first 8 bytes of its SHA-256, printed as
/// 16 hex digits (`{:016x}`). The access log and `leasegate explain
/// --json` print it, so a 429 line leads back to its key without the log
/// holding the key itself (a JWT subject, a tenant, a header's value).
pub fn key_hash(store_key: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(store_key.as_bytes());
    let mut n = [0u8; 8];
    n.copy_from_slice(&d[..8]);
    u64::from_be_bytes(n)
}

/// The store key of a request under `limit`, with its sub-bucket.
pub fn store_key(limit: &Limit, facts: &Facts<'_>, shard: Option<u32>) -> String {
    let mut k = String::with_capacity(64);
    key::derive(&mut k, &limit.name, &limit.by, facts);
    if let Some(s) = shard {
        key::push_shard(&mut k, s);
    }
    k
}

/// `[leasing]` and friends, as the limiter uses them.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub sizing: Sizing,
    /// Longest local block after a refusal (not after a reservation: a key
    /// holding reserved tokens is blocked until they are due).
    pub max_block_ms: u64,
    /// `[leasing] reserve`: a drained token bucket reserves its refill to
    /// come rather than answer nothing.
    pub reserve: bool,
    /// Most keys with a local lease (`[store] max_keys`, per shard).
    pub max_keys: usize,
    /// `[store] fleet_size`, when set: the bound on the live count of the
    /// fleet ([`fleet`]) that the fallback divides a limit's quota by.
    pub fleet_size: Option<u64>,
    /// `[store] timeout_ms`: the longest a request waits for the store, per
    /// limit, whether for its own call or for the one in flight for its key.
    pub deadline_ms: u64,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store.name())
            .finish_non_exhaustive()
    }
}

/// The decision engine shared by every worker.
pub struct Limiter {
    store: Arc<dyn FleetStore>,
    /// Local buckets that decide for fail-open routes while the store is
    /// away; bounded like the embedded store.
    fallback: crate::store::memory::MemoryStore,
    /// Whether the fallback was ever asked: until then a store answer has
    /// no fallback bucket to forget, and does not look for one.
    fallback_used: std::sync::atomic::AtomicBool,
    leases: LeaseTable,
    /// The bound on tokens going back in the background.
    releases: sweep::Releases,
    settings: Arc<arc_swap::ArcSwap<Settings>>,
    clock: Clock,
    /// Unix milliseconds, for what is compared with a date: an override's
    /// expiry, a calendar month's length.
    wall: Clock,
    /// The live count of instances, from the store's heartbeats.
    fleet: Arc<fleet::Fleet>,
    /// Refused keys the sweeper forgot in their window (the status page).
    forgotten: recent_refusals::Forgotten,
    /// Concurrency limits' slots held on this instance.
    slots: Arc<slots::SlotTable>,
    /// The fleet's per-caller overrides, as last loaded from the store.
    overrides: Arc<overrides::Overrides>,
    /// Where in its spread a block ends, per instance (`slow_path`).
    jitter_seed: u64,
}

impl Limiter {
    pub fn new(store: Arc<dyn FleetStore>, settings: Settings, clock: Clock) -> Arc<Limiter> {
        Self::with_wall_clock(store, settings, clock, crate::clock::system_clock())
    }

    /// [`Limiter::new`] with its wall clock (Unix milliseconds) given too:
    /// the fallback buckets' windows, an override's expiry, a calendar
    /// month's length. `leasegate simulate` runs it on virtual time.
    pub fn with_wall_clock(store: Arc<dyn FleetStore>, settings: Settings, clock: Clock, wall: Clock) -> Arc<Limiter> {
        Arc::new(Limiter {
            store,
            fallback: crate::store::memory::MemoryStore::with_clock(settings.max_keys, wall.clone()),
            fallback_used: std::sync::atomic::AtomicBool::new(false),
            leases: LeaseTable::new(settings.max_keys),
            releases: sweep::Releases::new(),
            settings: Arc::new(arc_swap::ArcSwap::from_pointee(settings)),
            clock,
            wall,
            fleet: Arc::default(),
            forgotten: recent_refusals::Forgotten::default(),
            slots: Arc::new(slots::SlotTable::new(settings.max_keys)),
            overrides: Arc::default(),
            jitter_seed: fastrand::u64(..),
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

    /// Unix milliseconds on the limiter's wall clock.
    pub fn wall_ms(&self) -> u64 {
        (self.wall)()
    }

    /// `spec`'s advertised window in seconds, now.
    #[inline]
    pub(crate) fn window_secs(&self, spec: &Spec) -> u64 {
        spec.window_secs(|| self.wall_ms())
    }

    /// Decisions for keys and quotas the caller names (the Envoy fronts).
    pub fn keyed(self: &Arc<Self>) -> keyed::Keyed<'_> {
        keyed::Keyed::of(self)
    }

    /// Tokens going back: the sweep, a reload's changed limits, shutdown.
    pub fn sweeper(&self) -> sweep::Sweeper<'_> {
        sweep::Sweeper::of(self)
    }

    /// What an operator may read: keys, the fleet, overrides, the store.
    pub fn report(&self) -> report::Report<'_> {
        report::Report::of(self)
    }

    /// The hash of `limit`'s key for `facts`, without building the key.
    /// Inline: out of line, a call saved and restored six registers, a
    /// sixth of what it costs.
    #[inline]
    fn key_hash(&self, limit: &LimitRuntime, facts: &Facts<'_>, shard: Option<u32>) -> u64 {
        let mut hasher = self.leases.key_hasher(limit.name_id);
        key::hash_parts(&mut hasher, &limit.config.by, facts);
        if let Some(s) = shard {
            hasher.write_u32(s);
        }
        hasher.finish()
    }

    /// The verdict when every limit decides from memory, without waiting
    /// for anything: a token at hand, or a key blocked after a refusal (the
    /// local short-circuit). False (and nothing spent) when one of them
    /// needs the store. This is the common path: a hash, a lookup in the
    /// thread's front (a shard's read lock when it misses) and one
    /// compare-and-swap per limit; a blocked key's refusal builds no
    /// key string and no future.
    ///
    /// Fills `verdict` (empty on entry) and answers [`Checked::Decided`];
    /// when one limit needs the store, [`Checked::NeedsStore`] with where
    /// [`Limiter::resume`] goes on from, the limits before it decided in
    /// `verdict` (their tokens held), so nothing is taken twice. `limits`
    /// are the request's, in order; `costs` its reserves under those with
    /// a `cost`. Written in place: a verdict is a few hundred bytes, and
    /// moving it in and out of an `Option` cost this path a third of its
    /// time.
    pub fn try_check<'l>(
        self: &'l Arc<Self>,
        limits: &[LimitRef<'l>],
        costs: Costs<'_>,
        facts: &Facts<'_>,
        verdict: &mut Verdict<'l>,
    ) -> Checked {
        debug_assert!(verdict.limits.is_empty() && verdict.taken.hashes.is_empty());
        let now = self.now_ms();
        for (position, &limit) in limits.iter().enumerate() {
            let (spec, shard) = self.spec_of(&limit, facts);
            let h = self.key_hash(&limit, facts, shard);
            if spec.algorithm == Algorithm::Concurrency {
                let Some(lv) = self.slot_verdict_now(limit, h, &spec, verdict) else {
                    return Checked::NeedsStore(Pending { next: position });
                };
                if verdict.decide(lv) {
                    break;
                }
                continue;
            }
            // A reserve above the key's capacity could never fit.
            let n = cost_of(costs, limit).clamp(1, spec.capacity.max(1));
            if let Some((remaining, reset_ms)) = self.take_local(h, &spec, n, now) {
                verdict.taken.push(self, h, n, limit);
                verdict
                    .limits
                    .push(admitted(limit, h, &spec, self.window_secs(&spec), remaining, reset_ms));
                continue;
            }
            // As the slow path would find it: blocked, and marked in use.
            let blocked = self
                .leases
                .with(h, |l| {
                    let blocked = blocked::refuses(l, now, n);
                    if blocked {
                        l.touch(now);
                    }
                    blocked
                })
                .unwrap_or(false);
            if !blocked {
                // The limits decided so far stay decided, their tokens
                // held: `resume` goes on from here.
                return Checked::NeedsStore(Pending { next: position });
            }
            let lv = self.refused(limit, h, &|| store_key(&limit.config, facts, shard), &spec);
            if verdict.decide(lv) {
                break;
            }
        }
        for lv in &verdict.limits {
            lv.limit.count(lv.outcome);
        }
        Checked::Decided
    }

    /// Refuses a request from memory before its identity is resolved, when
    /// one of `limits` is [identity-free](policy::Limit::identity_free),
    /// enforcing, and its key is blocked after a refusal: a client over its
    /// network's ceiling then costs no signature check. Takes no token;
    /// returns false (and leaves `verdict` empty) otherwise, and the full
    /// decision runs as usual once the identity is known. `facts` carries
    /// no identity, tenant or plan.
    pub fn refused_before_identity<'l>(
        &self,
        limits: impl IntoIterator<Item = LimitRef<'l>>,
        facts: &Facts<'_>,
        verdict: &mut Verdict<'l>,
    ) -> bool {
        let now = self.now_ms();
        for limit in limits {
            if !limit.config.identity_free() || !limit.can_refuse() {
                continue;
            }
            let (spec, shard) = limit.spec_for(facts);
            let h = self.key_hash(&limit, facts, shard);
            let blocked = self
                .leases
                .with(h, |l| blocked::refuses(l, now, 1) && l.available() == 0)
                .unwrap_or(false);
            if !blocked {
                continue;
            }
            let lv = self.refused(limit, h, &|| store_key(&limit.config, facts, shard), &spec);
            if lv.outcome != Outcome::Limited {
                continue;
            }
            limit.count(lv.outcome);
            verdict.limits.push(lv);
            verdict.decision = Decision::Refuse {
                at: verdict.limits.len() - 1,
            };
            return true;
        }
        false
    }

    /// Spends `n` tokens at hand for `h` (1, or a request's reserve), if
    /// there are that many, starting a refill when the lease runs low.
    /// Returns what the headers need.
    fn take_local(self: &Arc<Self>, h: u64, spec: &Spec, n: u64, now: u64) -> Option<(u64, u64)> {
        let (remaining, reset_ms, low) = self
            .leases
            .with(h, |lease| {
                lease.try_take_n(n, now).then(|| {
                    let size = lease.size_hint();
                    (
                        lease.remaining(),
                        lease.reset_ms(now),
                        // A refill already under way: nothing to start.
                        (lease.available() <= Sizing::low_watermark(size) && !lease.refill_in_flight())
                            .then(|| lease.clone()),
                    )
                })
            })
            .flatten()?;
        if let Some(lease) = low {
            self.refill_in_background(lease, *spec);
        }
        Some((remaining, reset_ms))
    }

    /// Decides a request against `limits` (in order). All must admit;
    /// a request refused by one limit gives back what earlier ones took.
    /// Waits for the store only for a limit with no token at hand. Callers
    /// try [`Limiter::try_check`] first. When the store fails, the route's
    /// `on_failure` decides: fail open, and the key's local fallback bucket
    /// decides instead ([`Decision::Bypass`]); fail closed, and the request
    /// is [`Decision::Unavailable`], holding no token. Either way the
    /// verdict keeps the error (`store_error`) for the request path's log.
    pub async fn check<'l>(
        self: &'l Arc<Self>,
        limits: &[LimitRef<'l>],
        costs: Costs<'_>,
        facts: &Facts<'_>,
        on_failure: StoreFailure,
    ) -> Verdict<'l> {
        self.resume(Verdict::default(), Pending::start(), limits, costs, facts, on_failure)
            .await
    }

    /// [`Limiter::check`], going on from where [`Limiter::try_check`]
    /// stopped (`pending`): the limits it decided keep their outcome and
    /// tokens.
    pub async fn resume<'l>(
        self: &'l Arc<Self>,
        mut verdict: Verdict<'l>,
        pending: Pending,
        limits: &[LimitRef<'l>],
        costs: Costs<'_>,
        facts: &Facts<'_>,
        on_failure: StoreFailure,
    ) -> Verdict<'l> {
        for lv in &verdict.limits {
            lv.limit.count(lv.outcome);
        }
        let settings = self.settings();
        let from = pending.next.min(limits.len());
        for &limit in &limits[from..] {
            let (spec, shard) = self.spec_of(&limit, facts);
            let now = self.now_ms();
            let h = self.key_hash(&limit, facts, shard);
            let lv = if spec.algorithm == Algorithm::Concurrency {
                let key = store_key(&limit.config, facts, shard);
                match self.slot_verdict(limit, h, &key, &spec, on_failure, &mut verdict).await {
                    Some(lv) => lv,
                    // The store failed and the route fails closed.
                    None => break,
                }
            } else {
                let n = cost_of(costs, limit).clamp(1, spec.capacity.max(1));
                match self.take_local(h, &spec, n, now) {
                    Some((remaining, reset_ms)) => {
                        verdict.taken.push(self, h, n, limit);
                        admitted(limit, h, &spec, self.window_secs(&spec), remaining, reset_ms)
                    }
                    None => {
                        let key = store_key(&limit.config, facts, shard);
                        match self.slow_path(h, &key, &spec, n, &settings).await {
                            Ok(Some((remaining, reset_ms))) => {
                                verdict.taken.push(self, h, n, limit);
                                admitted(limit, h, &spec, self.window_secs(&spec), remaining, reset_ms)
                            }
                            Ok(None) => self.refused(limit, h, &|| key.clone(), &spec),
                            // A limit that cannot refuse here cannot fail the
                            // request either: its fallback bucket only keeps its
                            // counts honest, and the bypass metric leaves it out.
                            Err(_) if !limit.can_refuse() => self.fallback(limit, h, &key, &spec, shard, n),
                            Err(e) => {
                                // The route's on_store_failure decides: a
                                // fail-closed route answers 503 whatever later
                                // limits say; a fail-open one asks the fallback.
                                let failed = store_failure_decision(&e, on_failure);
                                verdict.store_error = Some(e);
                                verdict.decision = failed;
                                if on_failure == StoreFailure::Deny {
                                    // The request gets a 503 whatever later
                                    // limits would say: no need to ask them, and
                                    // no token is kept.
                                    verdict.taken.give_back();
                                    break;
                                }
                                self.fallback(limit, h, &key, &spec, shard, n)
                            }
                        }
                    }
                }
            };
            limit.count(lv.outcome);
            // A limit that refused decides, whatever another limit's store
            // did.
            if verdict.decide(lv) {
                break;
            }
        }
        verdict
    }

    /// The verdict of a limit whose key is refused (by the store or by the
    /// local block).
    /// `key` names the key for the shadow-block log line, the one use of
    /// the string: a refusal answered from memory never builds it otherwise.
    fn refused<'l>(&self, limit: LimitRef<'l>, h: u64, key: &dyn Fn() -> String, spec: &Spec) -> LimitVerdict<'l> {
        let now = self.now_ms();
        let (retry_after_ms, over, remaining, reset_ms) = self
            .leases
            .with(h, |l| {
                let over = l.count_over(now, spec.period_ms());
                (blocked::retry_after(l, now), over, l.remaining(), l.reset_ms(now))
            })
            .unwrap_or((1, 1, 0, 0));
        let outcome = stage::on_refusal(limit.config.mode, limit.enforcing);
        // One event at 1, 2, 4, 8, ... refusals: a flood logs a handful.
        if outcome == Outcome::ShadowLimited && over.is_power_of_two() {
            tracing::info!(
                target: "rate_limit_shadow_block",
                limit = %limit.config.name,
                key = %key(),
                over_by = over,
                over_percent = stage::over_percent(over, spec.count),
                "rate_limit_shadow_block"
            );
        }
        LimitVerdict {
            limit,
            key_hash: h,
            outcome,
            quota: spec.count,
            window_secs: self.window_secs(spec),
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
}

/// What a store failure means for a request on a route that fails open
/// (`Allow`) or closed (`Deny`).
pub(super) fn store_failure_decision(e: &StoreError, on_failure: StoreFailure) -> Decision {
    match on_failure {
        StoreFailure::Allow => Decision::Bypass { reason: e.reason() },
        StoreFailure::Deny => Decision::Unavailable {
            retry_after_ms: e.retry_after_ms(),
        },
    }
}

#[cfg(test)]
mod tests;
