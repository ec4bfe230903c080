//! The slow path: a request whose key has no token at hand, and the
//! background refill of a busy key.
//!
//! One store call per key is in flight at any time, whether a request's or
//! a refill's. Requests that find one in flight wait in line for its answer
//! and are served from its grant; when it leaves some of them without a
//! token, one of them makes the next call, asking for the whole line (up to
//! `[leasing] max`). A cold key hit by a burst of n requests therefore costs
//! a couple of calls, not n, and one instance never holds more than `max`
//! plus the one call's grant.
//!
//! A request waits at most `[store] timeout_ms` in all, for the call it
//! waits for and for its own. Expired tokens go back inside the next call
//! (one atomic store step), not in a round trip of their own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::blocked;
use super::lease::{Due, Granted, Lease, RefillSlot, SharedLease};
use super::sweep::Release;
use super::{Limiter, Settings};
use crate::quota::Unspent;
use crate::quota::{Grant, Spec};
use crate::store::{Acquire as _, StoreError};

/// Who a store call is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// A request without the tokens it needs at hand (1, or its reserve
    /// under a limit with a cost): the grant's first that many are its own.
    Request(u64),
    /// A background refill: every token granted goes to the lease.
    Refill,
}

impl Limiter {
    /// Not `need` tokens at hand (1, or a request's reserve under a limit
    /// with a cost): blocked, or the key's one store call (its own, or the
    /// one in flight). `Ok(Some((remaining, reset_ms)))` when admitted,
    /// `Ok(None)` when refused.
    pub(super) async fn slow_path(
        self: &Arc<Self>,
        h: u64,
        key: &str,
        spec: &Spec,
        need: u64,
        settings: &Settings,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let (lease, evicted) = self.leases.get_or_insert(h, key);
        for e in &evicted {
            if let Some(r) = Release::take_all(e) {
                self.releases.later(&self.store, r);
            }
        }
        // Store calls and refusals mark a key as in use (the sweeper forgets
        // idle ones); spending a token does not.
        lease.touch(self.now_ms());
        let budget = Duration::from_millis(settings.deadline_ms.max(1));
        let deadline = tokio::time::Instant::now() + budget;
        // In line from now on: a call made for this key asks for us too.
        let _in_line = lease.wait_in_line();
        let mut waited = false;
        // A slot claimed while waiting: the call waited for has just ended,
        // so what it brought is looked at before another call is made.
        let mut claimed: Option<RefillSlot<'_>> = None;
        loop {
            let now = self.now_ms();
            if lease.try_take_n(need, now) {
                return Ok(Some((lease.remaining(), lease.reset_ms(now))));
            }
            if blocked::refuses(&lease, now, need) {
                return Ok(None);
            }
            // A reservation made under another quota (a reload changed the
            // limit while its call was in flight) goes back, as the tokens
            // at hand did.
            if let Some(old) = lease.reserved_under().filter(|s| s != spec) {
                if let Some(r) = Release::new(&lease, old, lease.take_reserved(), lease.window_ms()) {
                    self.releases.later(&self.store, r);
                }
            }
            // Tokens the store reserved for this lease: those due are ours
            // to spend; until the next is, refused from memory, and the
            // store is not asked (it has queued us already).
            match lease.take_due(now, settings.sizing.ttl_ms) {
                Due::Now(_) => continue,
                Due::At(at) => {
                    blocked::block(&lease, now, at.saturating_sub(now), u64::MAX);
                    return Ok(None);
                }
                Due::None => {}
            }
            let slot = match claimed.take().or_else(|| lease.start_refill()) {
                Some(slot) => slot,
                None => {
                    // A call is in flight: its answer, or its failure, is ours.
                    let Ok(slot) = tokio::time::timeout_at(deadline, lease.wait_for_refill()).await else {
                        return Err(StoreError::Timeout(settings.deadline_ms));
                    };
                    waited = true;
                    // The call ended: if it failed, so do we, without calling
                    // again (and a slot we hold passes the failure on).
                    if let Some(e) = lease.last_failure() {
                        if let Some(slot) = &slot {
                            slot.record(Some(&e));
                        }
                        return Err(e);
                    }
                    claimed = slot;
                    continue;
                }
            };
            let call = self.store_call(&lease, &slot, spec, settings, Caller::Request(need));
            // A request that already waited has only the rest of its budget.
            let answer = if waited {
                match tokio::time::timeout_at(deadline, call).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        let e = StoreError::Timeout(settings.deadline_ms);
                        slot.record(Some(&e));
                        return Err(e);
                    }
                }
            } else {
                call.await
            };
            drop(slot);
            return answer.map(|admitted| admitted.then(|| (lease.remaining(), lease.reset_ms(self.now_ms()))));
        }
    }

    /// The key's store call, made while holding its slot: gives back expired
    /// tokens, asks for a lease sized to the traffic and the requests in
    /// line, and records the answer. `Ok(true)`: the request it was made for
    /// got its token (a refill: tokens were granted).
    async fn store_call(
        self: &Arc<Self>,
        lease: &SharedLease,
        slot: &RefillSlot<'_>,
        spec: &Spec,
        settings: &Settings,
        caller: Caller,
    ) -> Result<bool, StoreError> {
        let now = self.now_ms();
        lease.touch(now);
        let own = match caller {
            Caller::Request(need) => need.max(1),
            Caller::Refill => 0,
        };
        let mut expired = lease.take_expired(now);
        if own > 1 {
            // Fewer than the request's reserve at hand: they go back in
            // this call, and the store grants all it needs or nothing.
            expired += lease.take_up_to(u64::MAX);
        }
        let unspent = Unspent {
            tokens: expired,
            window_ms: lease.window_ms(),
            // Costs settled above their reserve: the store takes them
            // first, and a key left owing is refused until it has paid.
            charge: lease.take_debt(),
            need: own,
        };
        if own > 0 {
            lease.note_unit(own);
        }
        let size = lease.next_size(&settings.sizing, spec.capacity, now, own);
        lease.set_size_hint(size);
        // Enough for the requests in line (up to `max`; each needs what
        // the asking one does, a guess), else the sized lease; never less
        // than the asking request needs.
        let line = lease.waiting().saturating_mul(own.max(1));
        let want = size.max(line.min(settings.sizing.max.max(size))).max(own);
        lease.set_spec(*spec);
        // A drained token bucket reserves tokens of its refill to come
        // rather than answer nothing: one call per reservation, not one
        // per token per instance. Not for a request that needs several at
        // once: reserved tokens come due one by one.
        let answer = if settings.reserve && own <= 1 {
            self.store.acquire_or_reserve(lease.key(), spec, want, unspent).await
        } else {
            self.store.acquire(lease.key(), spec, want, unspent).await
        };
        slot.record(answer.as_ref().err());
        // Expired tokens that went with a failed call are not sent again: the
        // call may have landed, and tokens must never go back twice.
        let grant = answer?;
        // The store answers for this key again: a fallback bucket from an
        // earlier outage is stale (left alone it would refill to full and
        // start the next outage with the whole burst).
        if self.fallback_used.load(std::sync::atomic::Ordering::Acquire) {
            self.fallback.forget(lease.key());
        }
        let now = self.now_ms();
        if grant.granted > 0 && grant.granted < own {
            // Fewer than the request needs (a region's credit topped up
            // part of it): the tokens are the lease's, the request is
            // refused and asks again.
            lease.record_admitted(0, now);
            lease.add(
                Granted {
                    tokens: grant.granted,
                    remaining: grant.remaining,
                    reset_ms: grant.reset_ms,
                    window_ms: grant.window_ms,
                },
                now,
                settings.sizing.ttl_ms,
            );
            return Ok(false);
        }
        lease.record_admitted(own.min(grant.granted), now);
        if grant.granted == 0 && own > 1 && grant.remaining > 0 {
            // Refused for want of room for this request's reserve: a
            // request needing at most what is left may still be granted.
            lease.refused(grant.remaining, grant.reset_ms.max(grant.retry_after_ms), now);
            blocked::block_needing(lease, now, grant.retry_after_ms, settings.max_block_ms, grant.remaining);
            return Ok(false);
        }
        if grant.granted == 0 {
            lease.refused(0, grant.reset_ms.max(grant.retry_after_ms), now);
            if grant.reserved > 0 {
                // Ours, due from the store's retry time on: refused from
                // memory until then, however long (asking sooner would
                // bring nothing), and told exactly when.
                let first_at = now.saturating_add(grant.retry_after_ms.max(1));
                lease.reserve(grant.reserved, first_at, *spec, settings.sizing.ttl_ms);
                blocked::block(lease, now, grant.retry_after_ms, u64::MAX);
                if lease.is_evicted() {
                    if let Some(r) = Release::new(lease, *spec, lease.take_reserved(), grant.window_ms) {
                        self.releases.later(&self.store, r);
                    }
                }
            } else if queue_is_full(spec, &grant) {
                blocked::block_spread(
                    lease,
                    now,
                    grant.retry_after_ms,
                    settings.max_block_ms,
                    jitter(self.jitter_seed, lease, now),
                );
            } else {
                blocked::block(lease, now, grant.retry_after_ms, settings.max_block_ms);
            }
            return Ok(false);
        }
        // Sliding window: tokens still at hand from an older window go back
        // to it now, before the new grant's window becomes the lease's.
        let old_window = lease.window_ms();
        if old_window != 0 && old_window != grant.window_ms {
            if let Some(r) = Release::new(lease, *spec, lease.take_all(), old_window) {
                self.releases.later(&self.store, r);
            }
        }
        lease.add(
            Granted {
                tokens: grant.granted - own,
                remaining: grant.remaining,
                reset_ms: grant.reset_ms,
                window_ms: grant.window_ms,
            },
            now,
            settings.sizing.ttl_ms,
        );
        drained(lease, &grant, now, settings);
        if lease.is_evicted() {
            // The table let this lease go while the call was in flight: keep
            // what the other requests in line need, give the rest back (the
            // caller is in line too, and has its token).
            let others = lease.waiting().saturating_sub(own);
            let surplus = lease.available().saturating_sub(others);
            if let Some(r) = Release::new(lease, *spec, lease.take_up_to(surplus), grant.window_ms) {
                self.releases.later(&self.store, r);
            }
        }
        Ok(true)
    }

    /// Tops up a busy key's lease before it runs dry, if no store call is in
    /// flight for it. A store that answers at once (the embedded one) is
    /// served inline; one that must wait (Redis) finishes in a background
    /// task, so no request waits for it.
    pub(super) fn refill_in_background(self: &Arc<Self>, lease: SharedLease, spec: Spec) {
        // A lease holding a reservation is queued in the store already.
        if lease.refill_in_flight() || lease.has_reservation() {
            return;
        }
        let this = self.clone();
        let mut refill = Box::pin(async move {
            // Released when this ends, or if the task is dropped midway.
            let Some(slot) = lease.start_refill() else {
                return;
            };
            let settings = this.settings();
            if let Err(e) = this.store_call(&lease, &slot, &spec, &settings, Caller::Refill).await {
                tracing::debug!(key = lease.key(), error = %e, "background lease refill failed");
            }
            drop(slot);
        });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if refill.as_mut().poll(&mut cx).is_pending() {
            tokio::spawn(refill);
        }
    }
}

/// A token bucket asked to reserve that reserved nothing: its queue of
/// reservations is full, and every instance refused so is told about the
/// same wait (until the queue has drained past one token). Longer than two
/// tokens' refill is how it shows: a plain empty bucket's wait is at most
/// one.
fn queue_is_full(spec: &Spec, grant: &Grant) -> bool {
    spec.algorithm == crate::quota::Algorithm::TokenBucket
        && grant.reserved == 0
        && grant.retry_after_ms > 2 * crate::quota::token_bucket::reserved_ready_ms(spec, 1)
}

/// A number in 0..1, different on every instance (its random `seed`),
/// key and millisecond: where in the spread a block ends. Drawn from the
/// instance's seed rather than the process's randomness, so a simulated
/// fleet with seeded instances repeats itself.
fn jitter(seed: u64, lease: &Lease, now_ms: u64) -> f64 {
    use std::hash::BuildHasher;
    let h = foldhash::fast::FixedState::with_seed(seed).hash_one((lease.key(), now_ms));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// After a grant that drained the shared bucket: a request that finds
/// nothing at hand is refused here until the store's next token (at most
/// the lease TTL, after which tokens at hand go back and the store may have
/// more), rather than asking a store that just said it has nothing. Refused
/// clients are told the store's exact wait, which every grant carries.
fn drained(lease: &Lease, grant: &Grant, now: u64, settings: &Settings) {
    if grant.remaining == 0 {
        let cap = settings.sizing.ttl_ms.min(settings.max_block_ms);
        blocked::block(lease, now, grant.retry_after_ms, cap);
    }
}
