//! Giving tokens back: expired leases (the sweeper), evicted leases, limits
//! changed by a reload, and everything at shutdown.
//!
//! Releases run concurrently, at most [`RELEASES_IN_FLIGHT`] at a time: a
//! multiplexed Redis connection pipelines them, so 100k leases going back
//! do not take 100k round trips one after another, and a flood of new keys
//! cannot pile up an unbounded number of release tasks either (past
//! [`MAX_PENDING_RELEASES`] waiting, a release is dropped and its tokens
//! come back by refill).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::blocked;
use super::lease::{Lease, SharedLease};
use super::Limiter;
use crate::quota::Spec;
use crate::quota::Unspent;
use crate::store::{Acquire as _, FleetStore, QuotaStore};

/// Releases in flight at once when many leases go back together.
pub const RELEASES_IN_FLIGHT: usize = 64;

/// Background releases waiting or in flight at most; more are dropped.
pub const MAX_PENDING_RELEASES: usize = 4_096;

/// Tokens of a key on their way back.
pub(super) struct Release {
    pub key: Arc<str>,
    pub spec: Spec,
    pub unspent: Unspent,
}

impl Release {
    /// `tokens` of `lease`, counted in `window_ms`, going back under
    /// `spec`; none when there are no tokens.
    pub fn new(lease: &Lease, spec: Spec, tokens: u64, window_ms: u64) -> Option<Release> {
        Release::of_key(
            lease.shared_key(),
            spec,
            Unspent {
                tokens,
                window_ms,
                ..Unspent::default()
            },
        )
    }

    /// `unspent` tokens of `key` (one that no lease holds here), and what
    /// it owes; none when there is neither.
    pub fn of_key(key: Arc<str>, spec: Spec, unspent: Unspent) -> Option<Release> {
        (unspent.tokens > 0 || unspent.charge > 0).then_some(Release { key, spec, unspent })
    }

    /// What `lease` owes (costs settled above their reserve) going to the
    /// store under `spec`; none when it owes nothing.
    pub fn charged(lease: &Lease, spec: Spec, charge: u64) -> Option<Release> {
        Release::of_key(
            lease.shared_key(),
            spec,
            Unspent {
                charge,
                ..Unspent::default()
            },
        )
    }

    /// Takes every token at hand of `lease`, and what it owes, if it has
    /// any and a spec.
    pub fn take_all(lease: &SharedLease) -> Option<Release> {
        let spec = lease.spec()?;
        let mut r = Release::new(lease, spec, lease.take_all(), lease.window_ms());
        let owed = lease.take_debt();
        if owed > 0 {
            match &mut r {
                Some(r) => r.unspent.charge = owed,
                None => r = Release::charged(lease, spec, owed),
            }
        }
        r
    }
}

/// How often the sweeper runs under `settings`, and how long a key stays
/// idle before it is forgotten: the gateway's sweeper and `leasegate
/// simulate`'s instances both follow this.
pub fn sweep_timing(settings: &super::Settings) -> (std::time::Duration, u64) {
    let every = std::time::Duration::from_millis((settings.sizing.ttl_ms / 2).clamp(100, 1_000));
    let idle_ms = settings.sizing.ttl_ms.max(settings.max_block_ms) + 1_000;
    (every, idle_ms)
}

/// The bound on background releases.
pub(super) struct Releases {
    slots: Arc<tokio::sync::Semaphore>,
    pending: Arc<AtomicUsize>,
}

impl Releases {
    pub fn new() -> Releases {
        Releases {
            slots: Arc::new(tokio::sync::Semaphore::new(RELEASES_IN_FLIGHT)),
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Releases waiting or in flight now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Gives `r` back in the background, never from a request's await.
    pub(super) fn later(&self, store: &Arc<dyn FleetStore>, r: Release) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_RELEASES {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(key = &*r.key, "too many releases pending; this one is dropped");
            return;
        }
        let (store, slots, pending) = (store.clone(), self.slots.clone(), self.pending.clone());
        runtime.spawn(async move {
            if let Ok(_slot) = slots.acquire().await {
                release(&*store, r).await;
            }
            pending.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Gives `batch` back, [`RELEASES_IN_FLIGHT`] at a time. Returns how
    /// many tokens went back.
    async fn batch(&self, store: &Arc<dyn FleetStore>, batch: Vec<Release>) -> u64 {
        let mut released = 0;
        let mut in_flight = tokio::task::JoinSet::new();
        for r in batch {
            // The same slots as background releases: 64 in flight in all.
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                break;
            };
            let store = store.clone();
            in_flight.spawn(async move {
                let _slot = slot;
                release(&*store, r).await
            });
            while let Some(done) = in_flight.try_join_next() {
                released += done.unwrap_or(0);
            }
        }
        while let Some(done) = in_flight.join_next().await {
            released += done.unwrap_or(0);
        }
        released
    }
}

/// Tokens going back to the store, on the operator's clock: the sweep of
/// expired and idle leases, a reload's changed limits, shutdown. Got from
/// [`Limiter::sweeper`]; the composition root and `leasegate simulate` run
/// the sweep as a task of their own.
pub struct Sweeper<'a> {
    limiter: &'a Limiter,
}

impl<'a> Sweeper<'a> {
    pub(super) fn of(limiter: &'a Limiter) -> Sweeper<'a> {
        Sweeper { limiter }
    }

    /// Returns expired leases' tokens to the store and forgets keys idle for
    /// longer than `idle_ms`. Run periodically; bounds memory per key.
    pub async fn sweep(&self, idle_ms: u64) {
        let now = self.limiter.now_ms();
        let mut to_release = Vec::new();
        let mut refused = Vec::new();
        self.limiter.leases.retain(|lease| {
            let expired = lease.take_expired(now);
            if let Some(spec) = lease.spec() {
                // With them, costs owed and not sent with a store call
                // since the last sweep: the fleet sees them within a sweep.
                let unspent = Unspent {
                    tokens: expired,
                    window_ms: lease.window_ms(),
                    charge: lease.take_debt(),
                    need: 0,
                };
                to_release.extend(Release::of_key(lease.shared_key(), spec, unspent));
            }
            let touched = lease.body().touched.load(Ordering::Relaxed);
            let idle = now.saturating_sub(touched) > idle_ms && blocked::remaining(lease, now).is_none();
            // A lease someone holds (a store call in flight) stays, and so
            // does one with reserved tokens still to come (expired ones
            // were taken above): forgotten, they would be lost.
            let forgettable = idle && lease.available() == 0 && !lease.has_reservation();
            let kept = !forgettable || super::thread_cache::is_held(lease);
            if !kept {
                // Refused in a window still open: the status page keeps
                // showing it for that window.
                let period = lease.spec().map_or(60_000, |s| s.period_ms());
                if let Some((refusals, until)) = lease.over_window(now, period) {
                    refused.push((lease.shared_key(), refusals, until));
                }
            }
            kept
        });
        // Only the most refused can stay (the table holds a few): a flood
        // of keys refused once costs one sort here, not a table walk each.
        if refused.len() > super::recent_refusals::KEPT {
            refused.select_nth_unstable_by(super::recent_refusals::KEPT, |a, b| b.1.cmp(&a.1));
            refused.truncate(super::recent_refusals::KEPT);
        }
        for (key, refusals, until) in refused {
            self.limiter.forgotten.keep(key, refusals, until, now);
        }
        self.limiter.releases.batch(&self.limiter.store, to_release).await;
    }

    /// After a reload: gives back the tokens of leases drawn under `limits`
    /// (limits removed, or whose quota changed). Returns how many.
    pub async fn release_limits(&self, limits: &std::collections::HashSet<String>) -> u64 {
        if limits.is_empty() {
            return 0;
        }
        let hit = |lease: &Lease| limits.contains(limit_of(lease.key()));
        let mut to_release = Vec::new();
        self.limiter.leases.for_each(|lease| {
            if hit(lease) {
                // Tokens first, reserved ones included, then the block: a
                // request in between must not find the old reservation and
                // block on it again. A refusal under the old quota says
                // nothing about the new one.
                to_release.extend(Release::take_all(lease));
                lease.body().blocked_until.store(0, Ordering::Relaxed);
                lease.body().retry_at.store(0, Ordering::Relaxed);
            }
        });
        self.limiter.releases.batch(&self.limiter.store, to_release).await
    }

    /// Gives every unspent token back to the store (shutdown). Returns how
    /// many tokens went back. The shard locks are released before any
    /// store call.
    pub async fn release_all(&self) -> u64 {
        let mut to_release = Vec::new();
        self.limiter
            .leases
            .for_each(|lease| to_release.extend(Release::take_all(lease)));
        self.limiter.releases.batch(&self.limiter.store, to_release).await
    }
}

/// One release; returns the tokens that went back. One that owes goes as
/// an acquire of nothing, whose script takes the charge with the tokens.
async fn release(store: &dyn QuotaStore, r: Release) -> u64 {
    let done = if r.unspent.charge > 0 {
        store.acquire(&r.key, &r.spec, 0, r.unspent).await.map(|_| ())
    } else {
        store.release(&r.key, &r.spec, r.unspent).await
    };
    match done {
        Ok(()) => r.unspent.tokens,
        Err(e) => {
            tracing::debug!(key = &*r.key, error = %e, "releasing a lease failed");
            0
        }
    }
}

/// The limit name inside `rl:{<limit>:...}`.
fn limit_of(key: &str) -> &str {
    let inner = key.strip_prefix("rl:{").unwrap_or(key);
    inner.split([':', '}']).next().unwrap_or(inner)
}
