//! What a usage route tells a caller of its state under one limit: the
//! store's live state of its key (asked with a grant of nothing, which
//! takes nothing), plus the tokens this instance holds for it (expired or
//! not: they are this instance's until they go back), less what it owes
//! the store and has not sent yet. On one instance that is exact. Tokens
//! other instances lease are not in the store's count: on a fleet,
//! `remaining` can read low by up to a lease per instance.

use super::key::Facts;
use super::{LimitRuntime, Limiter};
use crate::quota::{Algorithm, Unspent};
use crate::store::Acquire as _;

/// One limit's state for a caller.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub name: String,
    /// The quota per window (the rate's count; a concurrency limit's max).
    pub limit: u64,
    pub remaining: u64,
    /// Seconds until the quota is whole again (0: it is).
    pub reset: u64,
    /// The window, in seconds.
    pub window: u64,
    /// What the caller owes beyond its quota, in tokens: costs settled
    /// above their reserve and above what remained, in the store's count
    /// or not sent yet from this instance. Always 0 for a limit without a
    /// cost (a drained token bucket's reservations are not a debt).
    pub debt: u64,
    /// The store did not answer: this instance's own view.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
}

impl Limiter {
    /// The caller's state under `limit` (its override, claim or plan
    /// applied, as a decision would), taking nothing.
    pub async fn usage(&self, limit: &LimitRuntime, facts: &Facts<'_>) -> Usage {
        let (spec, shard) = self.spec_of(limit, facts);
        let h = self.key_hash(limit, facts, shard);
        let mut u = Usage {
            name: limit.config.name.clone(),
            limit: spec.count,
            remaining: spec.count,
            reset: 0,
            window: self.window_secs(&spec),
            debt: 0,
            stale: false,
        };
        if spec.algorithm == Algorithm::Concurrency {
            u.window = 1;
            u.remaining = self.slots.get(h).map_or(spec.capacity, |k| k.left_now());
            return u;
        }
        let now = self.now_ms();
        let (at_hand, owed_here) = self.leases.with(h, |l| (l.held(), l.debt())).unwrap_or((0, 0));
        let key = super::store_key(&limit.config, facts, shard);
        let window_ms = u.window.saturating_mul(1_000);
        match self.store.acquire(&key, &spec, 0, Unspent::default()).await {
            Ok(g) => {
                // What is left, all told: the store's and what is at hand,
                // less what is owed (here, or below the store's zero).
                let net = i128::from(g.remaining) + i128::from(at_hand) - i128::from(owed_here) - i128::from(g.owed);
                u.remaining = u64::try_from(net.max(0)).unwrap_or(u64::MAX).min(spec.count);
                if limit.config.cost.is_some() {
                    u.debt = u64::try_from((-net).max(0)).unwrap_or(u64::MAX);
                }
                u.reset = super::headers::secs(g.reset_ms.min(window_ms));
            }
            Err(_) => {
                u.stale = true;
                let (remaining, reset_ms) = self
                    .leases
                    .with(h, |l| (l.store_remaining().saturating_add(at_hand), l.reset_ms(now)))
                    .unwrap_or((spec.count, 0));
                u.remaining = remaining.saturating_sub(owed_here).min(spec.count);
                if limit.config.cost.is_some() {
                    u.debt = owed_here.saturating_sub(remaining);
                }
                u.reset = super::headers::secs(reset_ms.min(window_ms));
            }
        }
        u
    }
}
