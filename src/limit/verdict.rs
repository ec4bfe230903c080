//! What the limiter answers for one request: the [`Decision`] the request
//! path acts on, each limit's part ([`LimitVerdict`], what the client is
//! shown), and the tokens the request holds until it is served
//! ([`Taken`], a drop guard).

use super::stage::Outcome;
use super::Limiter;
use crate::quota::Spec;
use crate::store::StoreError;

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

/// What the limiter decided for one request: the one thing the request
/// path acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Decision {
    /// Every limit admits (shadow and soft ones may be over, and say so).
    #[default]
    Admit,
    /// A limit refuses: 429. Its entry in [`Verdict::limits`] is at
    /// [`Verdict::refused`].
    Refuse,
    /// The store failed and the route fails open: admitted by the local
    /// fallback buckets; `reason` is the bypass metric's label.
    Bypass { reason: &'static str },
    /// The store failed and the route fails closed: 503, with a retry
    /// after this long. No token is kept.
    Unavailable { retry_after_ms: u64 },
}

/// The decision for one request, and what the client is shown of it.
#[derive(Debug, Default)]
pub struct Verdict<'l> {
    pub decision: Decision,
    /// One entry per limit checked, in route order (inline for up to two).
    pub limits: smallvec::SmallVec<[LimitVerdict; 2]>,
    /// Index into `limits` of the limit that refused (enforced), if any.
    pub refused: Option<usize>,
    /// Why the store failed, when it did (the decision says what it means).
    pub store_error: Option<StoreError>,
    /// The tokens this request holds: given back unless committed.
    pub(super) taken: Taken<'l>,
    /// Slots of concurrency limits this request holds: given back when
    /// dropped, so the request path moves them into the response body
    /// ([`Verdict::take_held`]) to hold them until it ends.
    pub(super) held: Vec<super::slots::Held>,
    /// Where in the request's limits [`Limiter::check`] goes on from when
    /// [`Limiter::try_check`] stopped at a limit that needs the store.
    pub(super) next: usize,
    /// What the request reserves under limits with a `cost` (a limit's
    /// index and its tokens), set by the request path before the decision;
    /// a limit not listed takes 1.
    pub costs: super::cost::Reserves,
}

impl Verdict<'_> {
    /// The request is served: the tokens it took are spent. A verdict
    /// dropped uncommitted (a refusal, a client gone while the store
    /// answered) gives them back to their leases.
    pub fn commit(&mut self) {
        self.taken.hashes.clear();
    }

    /// [`Verdict::commit`], by value: for callers that serve every request
    /// they check (benchmarks, tests, the Envoy services).
    pub fn committed(mut self) -> Self {
        self.commit();
        self
    }

    /// Adds one limit's part. When it refuses (enforced), the verdict
    /// refuses: nothing was admitted, so what earlier limits took (tokens,
    /// slots) goes back. True when it refused: no later limit is asked.
    pub(super) fn decide(&mut self, lv: LimitVerdict) -> bool {
        let refused = lv.outcome == Outcome::Limited;
        self.limits.push(lv);
        if refused {
            self.refused = Some(self.limits.len() - 1);
            self.decision = Decision::Refuse;
            self.taken.give_back();
            self.held.clear();
        }
        refused
    }

    /// The in-flight slots this request holds, to keep until its response
    /// ends (empty for a request on no concurrency limit).
    pub fn take_held(&mut self) -> Vec<super::slots::Held> {
        std::mem::take(&mut self.held)
    }

    /// Tokens held and not committed yet.
    pub fn tokens_held(&self) -> usize {
        self.taken.hashes.len()
    }

    /// The tokens the request takes under limit `i`: its reserve under a
    /// limit with a `cost`, else 1.
    #[inline]
    pub(super) fn cost_of(&self, i: usize) -> u64 {
        if self.costs.is_empty() {
            return 1;
        }
        self.costs.iter().find(|(l, _)| *l == i).map_or(1, |(_, n)| *n)
    }
}

/// Tokens a request took, per key (by hash): a drop guard, as in
/// pingora-limits, so that every way out of a decision that does not serve
/// the request gives them back, and none is written by hand.
#[derive(Debug, Default)]
pub(super) struct Taken<'l> {
    limiter: Option<&'l Limiter>,
    pub(super) hashes: smallvec::SmallVec<[Took; 2]>,
}

/// The tokens one limit took for a request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Took {
    /// The key's hash.
    pub(super) h: u64,
    /// How many: 1, or the request's reserve under a limit with a cost.
    pub(super) n: u64,
    /// The limit (an index into the config's limits).
    pub(super) limit: usize,
}

impl<'l> Taken<'l> {
    pub(super) fn push(&mut self, limiter: &'l Limiter, h: u64, n: u64, limit: usize) {
        self.limiter = Some(limiter);
        self.hashes.push(Took { h, n, limit });
    }

    /// The limiter the tokens came from (none taken: none).
    pub(super) fn limiter(&self) -> Option<&'l Limiter> {
        self.limiter
    }

    #[cold]
    pub(super) fn give_back(&mut self) {
        if let Some(limiter) = self.limiter {
            for t in self.hashes.drain(..) {
                limiter.leases.with(t.h, |l| l.give_back(t.n));
            }
        }
    }
}

impl Drop for Taken<'_> {
    /// A served request (committed) drops nothing: one length test, inline.
    #[inline]
    fn drop(&mut self) {
        if !self.hashes.is_empty() {
            self.give_back();
        }
    }
}

pub(super) fn admitted(i: usize, spec: &Spec, window_secs: u64, remaining: u64, reset_ms: u64) -> LimitVerdict {
    LimitVerdict {
        limit: i,
        outcome: Outcome::Admitted,
        quota: spec.count,
        window_secs,
        // A burst above the rate may hold more: never advertise more than q.
        remaining: remaining.min(spec.count),
        reset_ms,
        retry_after_ms: 0,
        over_percent: 0,
    }
}
