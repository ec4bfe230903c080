//! What the limiter answers for one request: the [`Decision`] the request
//! path acts on, each limit's part ([`LimitVerdict`], what the client is
//! shown), and the tokens the request holds until it is served
//! ([`Taken`], a drop guard).

use super::handle::LimitRef;
use super::stage::Outcome;
use super::Limiter;
use crate::quota::Spec;
use crate::store::StoreError;

/// One limit's part of a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitVerdict<'l> {
    pub limit: LimitRef<'l>,
    /// The hash of the key it was decided on (the lease table's: the
    /// limit, the key's parts and its shard), so that no one derives the
    /// key again to tell it apart.
    pub key_hash: u64,
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
    /// A limit refuses: 429. Its entry in [`Verdict::limits`] is `at`
    /// ([`Verdict::refused`]).
    Refuse { at: usize },
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
    pub limits: smallvec::SmallVec<[LimitVerdict<'l>; 2]>,
    /// Why the store failed, when it did (the decision says what it means).
    pub store_error: Option<StoreError>,
    /// The tokens this request holds: given back unless committed.
    pub(super) taken: Taken<'l>,
    /// Slots of concurrency limits this request holds: given back when
    /// dropped, so the request path moves them into the response body
    /// ([`Verdict::take_held`]) to hold them until it ends.
    pub(super) held: Vec<super::slots::Held>,
}

/// Where a decision that needs the store goes on from: what
/// [`Limiter::try_check`] answers when a limit has no token at hand, for
/// [`Limiter::resume`]. The limits before it are decided in the verdict,
/// their tokens held, so nothing is taken twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use = "a decision that needs the store goes on with `Limiter::resume`"]
pub struct Pending {
    /// The position, in the request's limits, of the first one undecided.
    pub(super) next: usize,
}

impl Pending {
    /// A decision not begun: [`Limiter::resume`] from the first limit.
    pub fn start() -> Pending {
        Pending::default()
    }
}

/// What [`Limiter::try_check`] made of a request from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a decision that needs the store goes on with `Limiter::resume`"]
pub enum Checked {
    /// Every limit decided: the verdict is whole.
    Decided,
    /// A limit needs the store: go on from here.
    NeedsStore(Pending),
}

impl<'l> Verdict<'l> {
    /// The limit that refused the request (enforced), if one did.
    pub fn refused(&self) -> Option<&LimitVerdict<'l>> {
        self.refused_at().and_then(|at| self.limits.get(at))
    }

    /// The position of the limit that refused, in [`Verdict::limits`].
    pub fn refused_at(&self) -> Option<usize> {
        match self.decision {
            Decision::Refuse { at } => Some(at),
            _ => None,
        }
    }

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
    pub(super) fn decide(&mut self, lv: LimitVerdict<'l>) -> bool {
        let refused = lv.outcome == Outcome::Limited;
        self.limits.push(lv);
        if refused {
            self.decision = Decision::Refuse {
                at: self.limits.len() - 1,
            };
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
}

/// Tokens a request took, per key (by hash): a drop guard, as in
/// pingora-limits, so that every way out of a decision that does not serve
/// the request gives them back, and none is written by hand.
#[derive(Debug, Default)]
pub(super) struct Taken<'l> {
    limiter: Option<&'l Limiter>,
    pub(super) hashes: smallvec::SmallVec<[Took<'l>; 2]>,
}

/// The tokens one limit took for a request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Took<'l> {
    /// The key's hash.
    pub(super) h: u64,
    /// How many: 1, or the request's reserve under a limit with a cost.
    pub(super) n: u64,
    /// The limit.
    pub(super) limit: LimitRef<'l>,
}

impl<'l> Taken<'l> {
    pub(super) fn push(&mut self, limiter: &'l Limiter, h: u64, n: u64, limit: LimitRef<'l>) {
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

/// What the request reserves under each limit with a `cost` (a handle
/// and its tokens); a limit not listed takes 1.
pub type Costs<'c> = &'c [(std::sync::Arc<super::LimitRuntime>, u64)];

/// The tokens a request takes under `limit`: its reserve under a limit
/// with a `cost`, else 1.
#[inline]
pub(super) fn cost_of(costs: Costs<'_>, limit: LimitRef<'_>) -> u64 {
    if costs.is_empty() {
        return 1;
    }
    costs.iter().find(|(l, _)| limit.is(l)).map_or(1, |(_, n)| *n)
}

pub(super) fn admitted<'l>(
    limit: LimitRef<'l>,
    key_hash: u64,
    spec: &Spec,
    window_secs: u64,
    remaining: u64,
    reset_ms: u64,
) -> LimitVerdict<'l> {
    LimitVerdict {
        limit,
        key_hash,
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
