//! Where shared quota lives: the [`QuotaStore`] contract and its stores.
//!
//! A store changes a key's state only through `acquire` and `release`, each
//! atomic per key, and runs the algorithms of [`crate::quota`]. The lease
//! core talks to a store only when it has no local token at hand, so store
//! calls are rare and may be boxed.

pub mod breaker;
pub mod deadline;
pub mod guard;
pub mod link;
pub mod memory;
pub mod redis;
#[cfg(test)]
pub mod testing;

use std::future::Future;
use std::pin::Pin;

use crate::quota::Unspent;
use crate::quota::{Grant, Spec};

/// What spending a region's credit did: tokens spent, and unexpired
/// tokens left after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Credit {
    pub spent: u64,
    pub left: u64,
    /// A transfer for the key is on its way (claimed, not yet credited or
    /// refused): the credit may be there in a moment.
    pub pending: bool,
    /// The region's shortfall of the key: tokens its gateways asked for
    /// over the last period and found neither in the bucket nor in credit
    /// (a floor of the excess demand: requests refused from memory never
    /// ask).
    pub short: u64,
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0} ms")]
    Timeout(u64),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// No connection to send the call on (one is being dialled in the
    /// background): the call was never sent. A store failure for the
    /// request, but not a failed call for the breaker, which counts the
    /// failed dials themselves ([`link::StoreLink`]).
    #[error("store not connected: {0}")]
    NotConnected(String),
    #[error("store error: {0}")]
    Failed(String),
    /// The guard's breaker is open: no call was made.
    #[error("store circuit open; next probe in {retry_after_ms} ms")]
    CircuitOpen { retry_after_ms: u64 },
}

impl StoreError {
    /// The `reason` label of `leasegate_rate_limit_bypassed_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreError::CircuitOpen { .. } => "store_circuit_open",
            StoreError::Timeout(_) => "store_timeout",
            StoreError::Unavailable(_) | StoreError::NotConnected(_) | StoreError::Failed(_) => "store_error",
        }
    }

    /// When the store may answer again, if it says: the breaker's next
    /// probe; 0 when unknown.
    pub fn retry_after_ms(&self) -> u64 {
        match self {
            StoreError::CircuitOpen { retry_after_ms } => *retry_after_ms,
            _ => 0,
        }
    }
}

/// Shared quota, keyed by `rl:{<limit>:<parts>}`: what every store is.
/// Four calls; [`Acquire`] names the two kinds of [`QuotaStore::grant`].
pub trait QuotaStore: Send + Sync + 'static {
    /// Gives back `unspent` first (when tokens > 0), then takes up to
    /// `want`: one atomic step. With `reserve`, a token bucket with no
    /// whole token to grant reserves up to `want` of its refill to come
    /// ([`Acquire::acquire_or_reserve`]); the windows ignore it.
    fn grant<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>>;

    /// Gives back `unspent` tokens (a lease's), clamped to capacity. A
    /// sliding window takes them off the window they were taken in while it
    /// still counts (current or previous), and nowhere once it is older.
    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// Whether the store answers, at the cost of one round trip and no
    /// quota: the guard's background probe while its circuit is open.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// The two ways to ask a [`QuotaStore`] for tokens, by name; every quota
/// store has them.
pub trait Acquire: QuotaStore {
    /// Gives back `unspent` first (when tokens > 0), then takes up to `want`: one atomic step.
    ///
    /// The grant is `min(want, available)`; whenever it leaves no whole
    /// token, [`Grant::retry_after_ms`] says when one will be. The give-back
    /// is clamped to the capacity and goes to the window the tokens were
    /// taken in, as [`QuotaStore::release`] does. On an error the caller
    /// cannot tell whether it was applied (a call that timed out may still
    /// run): it must not give the same tokens back again.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        self.grant(key, spec, want, unspent, false)
    }

    /// [`Acquire::acquire`], except that a token bucket with no whole
    /// token to grant reserves up to `want` tokens of its refill to come
    /// ([`Grant::reserved`], [`crate::quota::token_bucket::acquire_or_reserve`]):
    /// the caller spends them as they become due instead of asking again,
    /// so a drained key costs the store one call per reservation, not one
    /// per instance per token. The windows grant as `acquire` does.
    fn acquire_or_reserve<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        self.grant(key, spec, want, unspent, true)
    }
}

impl<S: QuotaStore + ?Sized> Acquire for S {}

/// What a fleet shares beside its quota: its heartbeats, its RLQS streams'
/// demands, its concurrency limits' slots and its overrides. The memory
/// store keeps them for a fleet of one, Redis for a fleet. A front that
/// needs them takes a [`FleetStore`], so a store without them does not
/// compile into its place.
pub trait FleetTables: Send + Sync + 'static {
    /// The fleet's heartbeat: marks `member` (this instance) live for
    /// `ttl_ms` (0: gone) and answers how many instances are live, itself
    /// included. What the local fallback divides a quota by while the
    /// store is away. The embedded store is this instance's alone: 1.
    fn heartbeat(&self, member: u64, ttl_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Records a stream's [`Demand`] for its `ttl_ms`, and answers its
    /// max-min fair share of the `rate` (the same unit) among the demands
    /// of every stream heard within theirs: the fleet's on Redis, this
    /// instance's on the memory store (the fleet is this instance). A
    /// `ttl_ms` of 0 ([`Demand::leave`]) deletes the stream's demand at
    /// once and answers 0.
    fn fair_share<'a>(&'a self, d: Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Sets `h.member`'s in-flight slots of a concurrency limit's key to
    /// `h.hold` and grants up to `h.want` more, as many as fit under
    /// `h.max` beside every other member's unexpired slots; the member's
    /// slots then live `h.ttl_ms` (`lua/slots.lua`). `hold` is absolute, so
    /// a call whose answer was lost is corrected by the next.
    fn hold_slots<'a>(&'a self, h: Hold<'a>) -> BoxFuture<'a, Result<Slots, StoreError>>;

    /// Per-tenant overrides of limits, shared by the fleet
    /// (`lua/overrides.lua` on Redis; in memory on the memory store): read
    /// the version, load every override of some limits, or change one,
    /// which bumps the version.
    fn overrides<'a>(&'a self, op: OverrideOp<'a>) -> BoxFuture<'a, Result<Overridden, StoreError>>;

    /// Wakes `wake` whenever another instance changes an override (Redis
    /// pub/sub), for as long as the store lives; the poll is the fallback.
    /// A store whose fleet is this instance has nothing to hear.
    fn watch_overrides(&self, wake: std::sync::Arc<tokio::sync::Notify>);
}

/// A store a fleet shares: its quota and its tables. What the limiter runs
/// on.
pub trait FleetStore: QuotaStore + FleetTables {}

impl<S: QuotaStore + FleetTables + ?Sized> FleetStore for S {}

/// One instance's slots of a concurrency limit's key, as
/// [`FleetTables::hold_slots`] sets them.
#[derive(Debug, Clone, Copy)]
pub struct Hold<'a> {
    /// The limit's store key (`rl:{<limit>:<parts>}`).
    pub key: &'a str,
    /// This instance (random per process, unique in the fleet).
    pub member: u64,
    /// The slots it holds now, by its own count.
    pub hold: u64,
    /// How many more it asks for.
    pub want: u64,
    /// The limit: most slots held by all members together.
    pub max: u64,
    /// How long its slots count without a renewal.
    pub ttl_ms: u64,
}

/// What [`FleetTables::hold_slots`] answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slots {
    /// Slots granted beyond `hold`.
    pub granted: u64,
    /// Slots held by every member after the call (this one's included).
    pub held: u64,
}

/// A call on the fleet's overrides ([`FleetTables::overrides`]).
#[derive(Debug, Clone, Copy)]
pub enum OverrideOp<'a> {
    /// The version only: what an instance polls.
    Version,
    /// Every override of these limits, with the version.
    Load(&'a [String]),
    /// Sets `limit`'s override for `who` to `value`.
    Set {
        limit: &'a str,
        who: &'a str,
        value: &'a str,
    },
    /// Drops `limit`'s override for `who`.
    Delete { limit: &'a str, who: &'a str },
}

/// What [`FleetTables::overrides`] answered: the version after the call,
/// and for a load each override as (limit, who, value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overridden {
    pub version: u64,
    pub entries: Vec<(String, String, String)>,
    /// A set refused: the limit holds [`MAX_OVERRIDES_PER_LIMIT`] already.
    pub full: bool,
}

/// Most overrides one limit may hold in the store, whoever asks (the
/// store refuses one more): every instance loads them all.
pub const MAX_OVERRIDES_PER_LIMIT: u64 = 10_000;

/// One RLQS stream's demand for a bucket, as [`FleetTables::fair_share`]
/// records it.
#[derive(Debug, Clone, Copy)]
pub struct Demand<'a> {
    /// The bucket's store key.
    pub key: &'a str,
    /// The stream (random per stream, unique in the fleet).
    pub member: u64,
    /// What it wants and the bucket's rate, in thousandths of a request
    /// per second.
    pub demand: u64,
    pub rate: u64,
    /// How long the demand counts without a new report; 0: the stream
    /// leaves (its demand is deleted now).
    pub ttl_ms: u64,
}

impl<'a> Demand<'a> {
    /// Stream `member` leaves `key`'s demands: a closed stream's share goes
    /// to the others at their next report, not when its demand expires
    /// (the TTL is for an instance that dies).
    pub fn leave(key: &'a str, member: u64) -> Demand<'a> {
        Demand {
            key,
            member,
            demand: 0,
            rate: 0,
            ttl_ms: 0,
        }
    }

    /// Whether this is a [`Demand::leave`].
    pub fn leaves(&self) -> bool {
        self.ttl_ms == 0
    }
}

/// The calls of transfers between regions (`src/region/`), apart from the
/// quota a request takes: the primary's transfer out, the requesting
/// region's credit, and the claim that elects one asker per key and
/// window. Redis implements them (`redis/region.rs`); the memory store
/// cannot share a transfer with anyone, and [`NoRegions`] says so.
pub trait RegionStore: Send + Sync + 'static {
    /// The primary's side of a transfer between regions: takes up to
    /// `want` tokens of `key` (quota `spec`) out of this store's bucket,
    /// never leaving it fewer than `keep` (the primary's own), once per
    /// transfer `id`: a repeated call
    /// with the same id answers what the first one granted and takes
    /// nothing. The id is remembered for `remember_ms`.
    fn transfer_out<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        id: u64,
        want: u64,
        keep: u64,
        remember_ms: u64,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// The requesting region's side: adds `tokens` granted by transfer
    /// `id` to `key`'s credit for `ttl_ms`, once per id. Returns the tokens
    /// credited (0 when the transfer was credited before).
    fn credit<'a>(&'a self, key: &'a str, id: u64, tokens: u64, ttl_ms: u64) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Spends up to `want` tokens of `key`'s unexpired credit, and counts
    /// what it could not give in the key's shortfall (kept `period_ms`).
    fn spend_credit<'a>(&'a self, key: &'a str, want: u64, period_ms: u64)
        -> BoxFuture<'a, Result<Credit, StoreError>>;

    /// Sets `key`'s rebalance claim for `window` (kept `ttl_ms`) unless it
    /// is set: true for the one caller, of all the region's gateways, that
    /// set it.
    fn claim<'a>(&'a self, key: &'a str, window: u64, ttl_ms: u64) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Drops `key`'s rebalance claim for `window`, so that the region's
    /// next ask for the key is elected again (the asker gave up).
    fn unclaim<'a>(&'a self, key: &'a str, window: u64) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// The region calls of a store that has none (the memory backend): every
/// call fails, so a memory store enforces its slice but cannot transfer.
pub struct NoRegions;

fn unsupported<'a, T: Send + 'a>() -> BoxFuture<'a, Result<T, StoreError>> {
    Box::pin(std::future::ready(Err(StoreError::Failed(
        "transfers between regions need the redis backend".into(),
    ))))
}

impl RegionStore for NoRegions {
    fn transfer_out<'a>(
        &'a self,
        _: &'a str,
        _: &'a Spec,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        unsupported()
    }

    fn credit<'a>(&'a self, _: &'a str, _: u64, _: u64, _: u64) -> BoxFuture<'a, Result<u64, StoreError>> {
        unsupported()
    }

    fn spend_credit<'a>(&'a self, _: &'a str, _: u64, _: u64) -> BoxFuture<'a, Result<Credit, StoreError>> {
        unsupported()
    }

    fn claim<'a>(&'a self, _: &'a str, _: u64, _: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        unsupported()
    }

    fn unclaim<'a>(&'a self, _: &'a str, _: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        unsupported()
    }
}
