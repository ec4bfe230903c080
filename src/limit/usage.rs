//! What a usage route tells a caller of its state under one limit: the
//! store's live state of its key (asked with a grant of nothing, which
//! takes nothing), plus the tokens this instance holds for it. Tokens other
//! instances lease are not in the store's count: on a fleet, `remaining`
//! can read low by up to a lease per instance.

use super::key::Facts;
use super::{LimitRuntime, Limiter};
use crate::quota::{Algorithm, Unspent};

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
    /// above their reserve, in the store's count and not sent yet from
    /// this instance (a token bucket's reservations count too).
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
            window: spec.window_secs(),
            debt: 0,
            stale: false,
        };
        if spec.algorithm == Algorithm::Concurrency {
            u.window = 1;
            u.remaining = self.slots.get(h).map_or(spec.capacity, |k| k.left_now());
            return u;
        }
        let now = self.now_ms();
        let (at_hand, owed_here) = self.leases.with(h, |l| (l.spendable(now), l.debt())).unwrap_or((0, 0));
        u.debt = owed_here;
        let key = Self::key_string(limit, facts, shard);
        match self.store.acquire(&key, &spec, 0, Unspent::default()).await {
            Ok(g) => {
                u.debt = u.debt.saturating_add(g.owed);
                u.remaining = (g.remaining + at_hand).saturating_sub(owed_here).min(spec.count);
                u.reset = super::headers::secs(g.reset_ms);
            }
            Err(_) => {
                u.stale = true;
                let (remaining, reset_ms) = self
                    .leases
                    .with(h, |l| (l.remaining() + at_hand, l.reset_ms(now)))
                    .unwrap_or((spec.count, 0));
                u.remaining = remaining.min(spec.count);
                u.reset = super::headers::secs(reset_ms);
            }
        }
        u
    }
}
