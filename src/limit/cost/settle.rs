//! Settling a request's cost once its response has ended: the difference
//! from its reserve goes to the key's lease, here, with no store call. A
//! refund becomes tokens at hand again (spent by the next requests, or
//! going back to the store with the lease's unspent ones). A charge takes
//! tokens at hand first; what they do not cover is owed, and the key's
//! next store call ([`crate::quota::Unspent::charge`]) takes it from the
//! shared quota in the same atomic script as its grant, which may leave
//! the key in debt: refused, with the exact wait, until the refill or the
//! window has paid it off.

use std::sync::Arc;

use super::super::lease::SharedLease;
use super::super::sweep::Release;
use super::super::verdict::{Costs, Verdict};
use super::super::{LimitRuntime, Limiter};
use crate::quota::Spec;

/// A served request's settlements (inline for one).
pub type Settlements = smallvec::SmallVec<[Settlement; 1]>;

/// What one limit's reserve for a served request needs to settle.
#[derive(Debug)]
pub struct Settlement {
    /// The limit.
    pub limit: Arc<LimitRuntime>,
    /// The tokens reserved at admission.
    pub reserve: u64,
    lease: SharedLease,
    spec: Spec,
    /// The store window the reserve was counted in (a window algorithm's):
    /// a refund goes back to it, not to a later one.
    window_ms: u64,
}

impl Verdict<'_> {
    /// The reserves of this admitted request under limits that settle from
    /// the response (`cost.settle`), to settle when it has ended; taken
    /// from the verdict, which commits the rest. Empty, without a lookup,
    /// for a request on no such limit.
    pub fn settlements(&mut self, costs: Costs<'_>) -> Settlements {
        let mut out = Settlements::new();
        if costs.is_empty() {
            return out;
        }
        let Some(limiter) = self.taken.limiter() else {
            return out;
        };
        for t in &self.taken.hashes {
            let limit = t.limit;
            if limit.config.cost.as_ref().is_none_or(|c| c.settle.is_none()) {
                continue;
            }
            let Some(lease) = limiter.leases.get(t.h) else { continue };
            let spec = lease.spec().unwrap_or(limit.spec);
            let window_ms = lease.window_ms();
            out.push(Settlement {
                limit: limit.to_arc(),
                reserve: t.n,
                lease,
                spec,
                window_ms,
            });
        }
        out
    }
}

impl Limiter {
    /// The request reserved `s.reserve` and really cost `cost`: the
    /// difference goes to its lease (a lease the table let go sends it to
    /// the store in the background). Returns what the key owes the store
    /// after it, not yet sent.
    pub fn settle(&self, s: &Settlement, cost: u64) -> u64 {
        let lease = &s.lease;
        // What requests really take sizes the key's next leases.
        lease.note_unit(cost.max(1));
        if cost < s.reserve {
            let back = s.reserve - cost;
            // A window that has turned since the reserve was taken: the
            // refund goes back to the window that counted it (the store
            // drops it once that window no longer counts), not to the
            // tokens at hand, which the new window granted.
            let turned = s.spec.algorithm != crate::quota::Algorithm::TokenBucket && lease.window_ms() != s.window_ms;
            if lease.is_evicted() || turned {
                if let Some(r) = Release::new(lease, s.spec, back, s.window_ms) {
                    self.releases.later(&self.store, r);
                }
                return 0;
            }
            lease.give_back(back);
            if lease.is_evicted() {
                // Let go meanwhile: what the sweep did not take goes now.
                if let Some(r) = Release::new(lease, s.spec, lease.take_up_to(back), s.window_ms) {
                    self.releases.later(&self.store, r);
                }
                return 0;
            }
            return lease.debt();
        }
        let owed = lease.charge(cost - s.reserve);
        if owed > 0 {
            // A block set before this debt (a refill the store refused a
            // moment ago) would answer the next requests with the wait it
            // knew then, seconds where the debt means minutes: the next
            // request asks the store instead, carrying the debt, and hears
            // the debt's own wait (and blocks the key for it).
            super::super::blocked::unblock(lease);
        }
        if lease.is_evicted() && owed > 0 {
            // Nobody will call for this lease again: what it owes goes now.
            if let Some(r) = Release::charged(lease, s.spec, lease.take_debt()) {
                self.releases.later(&self.store, r);
            }
            return 0;
        }
        owed
    }
}
