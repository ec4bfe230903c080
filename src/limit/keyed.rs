//! Decisions for a key the caller names, under a quota it computed: the
//! Envoy rate limit service asks for a descriptor's key, not a request's.
//!
//! The same leases, the same single-flight store call and the same local
//! block after a refusal as an HTTP request: a key with tokens at hand is
//! decided with one atomic operation, and the store is asked only when it
//! has none.

use std::hash::BuildHasher;
use std::sync::Arc;

use super::{blocked, Limiter};
use crate::quota::{Grant, Spec, Unspent};
use crate::store::{Acquire as _, StoreError};

/// The answer for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDecision {
    pub admitted: bool,
    /// Left in the quota, as this instance last saw it.
    pub remaining: u64,
    /// Milliseconds until the quota is whole again (the window ends).
    pub reset_ms: u64,
    /// When refused: milliseconds until a token will be available.
    pub retry_after_ms: u64,
}

/// The limiter as the Envoy rate limit services (RLS, RLQS) use it: keys
/// and quotas they name themselves. Got from [`Limiter::keyed`].
pub struct Keyed<'a> {
    limiter: &'a Arc<Limiter>,
}

impl<'a> Keyed<'a> {
    pub(super) fn of(limiter: &'a Arc<Limiter>) -> Keyed<'a> {
        Keyed { limiter }
    }

    /// The lease-table hash of a caller-named key.
    pub fn hash_key(&self, key: &str) -> u64 {
        self.limiter.leases.hasher.hash_one(key)
    }

    /// Whether any override is loaded: one relaxed load.
    pub fn has_overrides(&self) -> bool {
        self.limiter.overrides.any()
    }

    /// The override in force for an Envoy descriptor of `domain` (its
    /// entries), and the quota it gives a rule of `rule`'s algorithm with
    /// this region's `share`; one relaxed load when no override is loaded.
    pub fn rls_override(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        rule: &Spec,
        share: crate::quota::Share,
    ) -> Option<Spec> {
        let l = self.limiter;
        l.overrides.for_descriptor(domain, entries, rule, share, l.wall_ms())
    }

    /// Takes `hits` tokens of `key` under `spec`. One token: the lease, or
    /// the key's store call, as for an HTTP request (a refusal takes
    /// nothing). `hits` 0 only looks, at the lease when there is one, else
    /// at the store (a call that takes nothing). More than one: from the
    /// lease when it holds that many, else in one store call of its own,
    /// and a call that does not get them all keeps what it got and is
    /// refused, as envoyproxy/ratelimit's `INCRBY` counts a cost that
    /// overruns the budget (so it ends the budget).
    pub async fn check_key(&self, key: &str, spec: &Spec, hits: u64) -> Result<KeyDecision, StoreError> {
        let h = self.hash_key(key);
        let now = self.limiter.now_ms();
        match hits {
            0 => match self.look(h, now) {
                Some(d) => Ok(d),
                None => {
                    let g = self.limiter.store.acquire(key, spec, 0, Unspent::default()).await?;
                    Ok(KeyDecision {
                        admitted: g.remaining > 0,
                        remaining: g.remaining,
                        reset_ms: g.reset_ms,
                        retry_after_ms: g.retry_after_ms,
                    })
                }
            },
            1 => {
                if let Some((remaining, reset_ms)) = self.limiter.take_local(h, spec, 1, now) {
                    return Ok(admitted(remaining, reset_ms));
                }
                let settings = self.limiter.settings();
                match self.limiter.slow_path(h, key, spec, 1, &settings).await? {
                    Some((remaining, reset_ms)) => Ok(admitted(remaining, reset_ms)),
                    None => Ok(self.refusal(h, self.limiter.now_ms())),
                }
            }
            n => {
                let local = self.limiter.leases.with(h, |l| {
                    if blocked::remaining(l, now).is_some() {
                        Some(None)
                    } else {
                        l.try_take_n(n, now).then(|| Some((l.remaining(), l.reset_ms(now))))
                    }
                });
                match local.flatten() {
                    Some(Some((remaining, reset_ms))) => return Ok(admitted(remaining, reset_ms)),
                    Some(None) => return Ok(self.refusal(h, now)),
                    None => {}
                }
                let grant = self.limiter.store.acquire(key, spec, n, Unspent::default()).await?;
                if grant.granted == n {
                    return Ok(admitted(grant.remaining, grant.reset_ms));
                }
                let wait = grant.retry_after_ms.max(1);
                Ok(KeyDecision {
                    admitted: false,
                    remaining: 0,
                    reset_ms: wait,
                    retry_after_ms: wait,
                })
            }
        }
    }

    /// `want` tokens of `key` straight from the store, past the leases (at
    /// most `want`; under the store's deadline and breaker): for a caller
    /// that keeps its own lease, as an RLQS assignment is.
    pub async fn acquire_direct(&self, key: &str, spec: &Spec, want: u64) -> Result<Grant, StoreError> {
        if want == 0 {
            return Ok(Grant::default());
        }
        self.limiter.store.acquire(key, spec, want, Unspent::default()).await
    }

    /// A stream's max-min fair share beside the fleet's other demands for
    /// its bucket ([`crate::store::FleetTables::fair_share`]).
    pub async fn fair_share(&self, d: crate::store::Demand<'_>) -> Result<u64, StoreError> {
        self.limiter.store.fair_share(d).await
    }

    /// Gives `unspent` tokens of `key` back to the store in the background,
    /// within the bound on releases in flight.
    pub fn give_back_later(&self, key: &str, spec: &Spec, unspent: Unspent) {
        if let Some(r) = super::sweep::Release::of_key(Arc::from(key), *spec, unspent) {
            self.limiter.releases.later(&self.limiter.store, r);
        }
    }

    /// Hits 0: what the key's lease says, taking nothing; `None` without a
    /// lease.
    fn look(&self, h: u64, now: u64) -> Option<KeyDecision> {
        self.limiter.leases.with(h, |l| match blocked::remaining(l, now) {
            Some(_) => {
                let wait = blocked::retry_after(l, now);
                KeyDecision {
                    admitted: false,
                    remaining: 0,
                    reset_ms: wait,
                    retry_after_ms: wait,
                }
            }
            None => admitted(l.remaining(), l.reset_ms(now)),
        })
    }

    /// A refused key: when it may come back, the store's retry time as
    /// its lease remembers it (not the local block, which is capped).
    fn refusal(&self, h: u64, now: u64) -> KeyDecision {
        let wait = self
            .limiter
            .leases
            .with(h, |l| blocked::retry_after(l, now))
            .unwrap_or(1)
            .max(1);
        KeyDecision {
            admitted: false,
            remaining: 0,
            reset_ms: wait,
            retry_after_ms: wait,
        }
    }
}

fn admitted(remaining: u64, reset_ms: u64) -> KeyDecision {
    KeyDecision {
        admitted: true,
        remaining,
        reset_ms,
        retry_after_ms: 0,
    }
}
