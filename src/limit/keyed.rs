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
use crate::store::StoreError;

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

impl Limiter {
    /// The lease-table hash of a caller-named key.
    pub fn hash_key(&self, key: &str) -> u64 {
        self.leases.hasher.hash_one(key)
    }

    /// Takes `hits` tokens of `key` under `spec`, all or none. `hits` 0
    /// only looks: admitted unless the key is blocked. More than one token
    /// is taken from the lease at once when it holds enough, else in one
    /// store call of its own (given back whole if partly granted).
    pub async fn check_key(self: &Arc<Self>, key: &str, spec: &Spec, hits: u64) -> Result<KeyDecision, StoreError> {
        let h = self.hash_key(key);
        let now = self.now_ms();
        if hits > spec.capacity {
            // Never fits, whatever the store holds: no call to make.
            return Ok(self.refusal(h, now, spec.period_ms()));
        }
        match hits {
            0 => Ok(self.look(h, spec, now)),
            1 => {
                if let Some((remaining, reset_ms)) = self.take_local(h, *spec, now) {
                    return Ok(admitted(remaining, reset_ms));
                }
                let settings = self.settings();
                match self.slow_path(h, key, spec, &settings).await? {
                    Some((remaining, reset_ms)) => Ok(admitted(remaining, reset_ms)),
                    None => Ok(self.refusal(h, self.now_ms(), 1)),
                }
            }
            n => {
                let local = self
                    .leases
                    .with(h, |l| l.try_take_n(n, now).then(|| (l.remaining(), l.reset_ms(now))));
                if let Some(Some((remaining, reset_ms))) = local {
                    return Ok(admitted(remaining, reset_ms));
                }
                if let Some(wait) = self.leases.with(h, |l| blocked::remaining(l, now)).flatten() {
                    return Ok(KeyDecision {
                        admitted: false,
                        remaining: 0,
                        reset_ms: wait,
                        retry_after_ms: wait,
                    });
                }
                let grant = self.store.acquire(key, spec, n, Unspent::default()).await?;
                if grant.granted == n {
                    return Ok(admitted(grant.remaining, grant.reset_ms));
                }
                // All or none: a part granted goes back.
                self.give_back_later(
                    key,
                    spec,
                    Unspent {
                        tokens: grant.granted,
                        window_ms: grant.window_ms,
                    },
                );
                let wait = grant.retry_after_ms.max(grant.reset_ms).max(1);
                Ok(KeyDecision {
                    admitted: false,
                    remaining: grant.remaining,
                    reset_ms: grant.reset_ms.max(1),
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
        self.store.acquire(key, spec, want, Unspent::default()).await
    }

    /// Gives `unspent` tokens of `key` back to the store in the background,
    /// within the bound on releases in flight.
    pub fn give_back_later(self: &Arc<Self>, key: &str, spec: &Spec, unspent: Unspent) {
        let lease = Arc::new(super::lease::Lease::new(key));
        if let Some(r) = super::sweep::Release::new(&lease, *spec, unspent.tokens, unspent.window_ms) {
            self.release_later(r);
        }
    }

    /// Hits 0: what the lease says, taking nothing.
    fn look(&self, h: u64, spec: &Spec, now: u64) -> KeyDecision {
        self.leases
            .with(h, |l| match blocked::remaining(l, now) {
                Some(wait) => KeyDecision {
                    admitted: false,
                    remaining: 0,
                    reset_ms: wait,
                    retry_after_ms: wait,
                },
                None => admitted(l.remaining(), l.reset_ms(now)),
            })
            .unwrap_or(KeyDecision {
                admitted: true,
                remaining: spec.count,
                reset_ms: 0,
                retry_after_ms: 0,
            })
    }

    /// A refused key: when it may come back, from its local block (at
    /// least `floor_ms`).
    fn refusal(&self, h: u64, now: u64, floor_ms: u64) -> KeyDecision {
        let wait = self
            .leases
            .with(h, |l| blocked::retry_after(l, now))
            .unwrap_or(floor_ms)
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
