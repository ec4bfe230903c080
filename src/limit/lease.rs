//! Local leases: tokens taken from the shared store in batches and spent
//! here with one atomic operation each.
//!
//! The sizing rule is pure: `clamp(min, qps_ewma × lookahead, max)`, and
//! never more than `fraction` of the bucket's capacity (at least 1), so a
//! 10-per-minute limit is leased one token at a time and a 50,000-per-minute
//! one in hundreds. The [`Lease`] itself is a handful of atomics: spending
//! never takes a lock and never waits for the store.

use crate::sync::Recover;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The parameters of lease sizing, from `[leasing]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    pub min: u64,
    pub max: u64,
    pub lookahead_ms: u64,
    /// Largest share of a bucket's capacity one lease may hold.
    pub fraction: f64,
    /// Leased tokens unspent after this long go back to the store.
    pub ttl_ms: u64,
}

impl Default for Sizing {
    fn default() -> Self {
        Sizing {
            min: 5,
            max: 500,
            lookahead_ms: 250,
            fraction: 0.1,
            ttl_ms: 1_000,
        }
    }
}

impl Sizing {
    /// Tokens to ask for, given the observed rate and the bucket's capacity.
    pub fn lease_size(&self, qps: f64, capacity: u64) -> u64 {
        let wanted = (qps * self.lookahead_ms as f64 / 1_000.0).ceil();
        let wanted = if wanted.is_finite() && wanted > 0.0 {
            wanted as u64
        } else {
            0
        };
        let sized = wanted.clamp(self.min, self.max.max(self.min));
        let cap = ((capacity as f64 * self.fraction).floor() as u64).max(1);
        sized.min(cap)
    }

    /// Refill in the background once the local balance falls below this.
    pub fn low_watermark(size: u64) -> u64 {
        size / 4
    }
}

/// Exponentially weighted rate: each new sample counts for half.
pub fn ewma(previous: f64, sample: f64) -> f64 {
    if previous <= 0.0 {
        sample
    } else {
        0.5 * previous + 0.5 * sample
    }
}

/// The local state of one (limit, key). `repr(C)` keeps the fields the
/// spending path reads in the first cache line.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Lease {
    // -- read on every decision --
    /// Tokens at hand.
    tokens: AtomicU64,
    /// When the tokens at hand must go back to the store, ms.
    expires_at: AtomicU64,
    /// The size of the last lease asked for (for the low watermark).
    pub(crate) size_hint: AtomicU64,
    /// Remaining in the shared bucket at the last grant, for headers.
    store_remaining: AtomicU64,
    /// When the shared bucket is whole again, ms, for headers.
    reset_at: AtomicU64,
    // -- read on store calls and refusals --
    /// Tokens at hand right after the last grant: what was spent since is
    /// the rate estimate's sample, with no counter on the spending path.
    level_at_grant: AtomicU64,
    /// When the last store call was made, ms.
    sampled_at: AtomicU64,
    /// Smoothed requests per second, as f64 bits.
    qps: AtomicU64,
    /// Refused locally until this time, ms (after a store refusal).
    pub(crate) blocked_until: AtomicU64,
    /// When the store said a token will be available, ms: what a refused
    /// client is told (the local block may end sooner, to re-ask the store).
    pub(crate) retry_at: AtomicU64,
    /// Requests refused in the current over-quota window: how far over.
    over: AtomicU64,
    /// When that window began, ms.
    over_since: AtomicU64,
    /// Requests waiting for this key's store call: the call asks for them.
    waiting: AtomicU64,
    /// Forgotten by the lease table: tokens added later go back at once.
    evicted: AtomicBool,
    /// Threads' fronts keeping this lease (see `near`): references that
    /// do not make it busy.
    near: AtomicU64,
    /// The store's window of the last grant (sliding window), for giving
    /// tokens back to the window they were counted in.
    window_ms: AtomicU64,
    /// Tokens spent, decayed with a one-minute time constant, as f64 bits:
    /// this instance's recent admitted rate for the key (the fallback's base).
    admitted: AtomicU64,
    /// When `admitted` was last brought up to date, ms.
    admitted_at: AtomicU64,
    /// When `admitted` began counting, ms (a young average is corrected).
    admitted_since: AtomicU64,
    /// Tokens spent but not yet in `admitted`: recorded when the store next
    /// answers, so calls that fail (an outage) neither add nor decay.
    unrecorded: AtomicU64,
    /// Last store call or refusal, ms (idle leases are forgotten).
    pub(crate) touched: AtomicU64,
    /// One store call for this key at a time (a request's or a refill).
    refilling: AtomicBool,
    /// Wakes the requests waiting for that call's answer.
    arrived: tokio::sync::Notify,
    /// How the last store call for this key failed, if it did: what the
    /// requests that waited for it answer, instead of calling again.
    last_failure: std::sync::Mutex<Option<crate::store::StoreError>>,
    /// The quota the tokens at hand were taken under, for giving them back.
    spec: std::sync::Mutex<Option<crate::quota::Spec>>,
    /// The store key.
    key: Arc<str>,
}

/// What a refill brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub tokens: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    /// The store's window the tokens were counted in (sliding window).
    pub window_ms: u64,
}

impl Lease {
    pub fn new(key: &str) -> Lease {
        Lease {
            key: Arc::from(key),
            ..Lease::default()
        }
    }

    /// The store key this lease draws from.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The store key, shared (for tokens going back after the lease).
    pub fn shared_key(&self) -> Arc<str> {
        Arc::clone(&self.key)
    }

    /// Spends one token if one is at hand and the lease has not expired:
    /// one load and one compare-and-swap, nothing else written.
    pub fn try_take(&self, now_ms: u64) -> bool {
        if self.expires_at.load(Ordering::Relaxed) <= now_ms {
            return false;
        }
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(1))
            .is_ok()
    }

    /// Spends `n` tokens at once if that many are at hand (all or none).
    pub fn try_take_n(&self, n: u64, now_ms: u64) -> bool {
        if self.expires_at.load(Ordering::Relaxed) <= now_ms {
            return false;
        }
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(n))
            .is_ok()
    }

    /// Marks the lease as used now (store calls only; spending does not).
    pub fn touch(&self, now_ms: u64) {
        self.touched.store(now_ms, Ordering::Relaxed);
    }

    /// Tokens at hand now.
    pub fn available(&self) -> u64 {
        self.tokens.load(Ordering::Acquire)
    }

    /// Puts back a token taken for a request that was then refused.
    pub fn give_back(&self, tokens: u64) {
        self.tokens.fetch_add(tokens, Ordering::AcqRel);
    }

    /// Takes every token at hand if the lease has expired: they belong to
    /// the store again.
    pub fn take_expired(&self, now_ms: u64) -> u64 {
        if self.expires_at.load(Ordering::Acquire) > now_ms {
            return 0;
        }
        let taken = self.tokens.swap(0, Ordering::AcqRel);
        // A grant that landed between the two reads moved the expiry first
        // (see `add`): what was taken is fresh, and goes back at once.
        if taken > 0 && self.expires_at.load(Ordering::Acquire) > now_ms {
            self.tokens.fetch_add(taken, Ordering::AcqRel);
            return 0;
        }
        self.untake(taken);
        taken
    }

    /// Takes up to `n` tokens at hand; returns how many.
    pub fn take_up_to(&self, n: u64) -> u64 {
        let taken = match self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(t - t.min(n)))
        {
            Ok(before) | Err(before) => before.min(n),
        };
        self.untake(taken);
        taken
    }

    /// Tokens taken out unspent (expired, released, evicted) leave the
    /// level the rate sample starts from: they were not spent.
    fn untake(&self, taken: u64) {
        let _ = self
            .level_at_grant
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| Some(l.saturating_sub(taken)));
    }

    /// Takes every token at hand (shutdown, changed limit).
    pub fn take_all(&self) -> u64 {
        let taken = self.tokens.swap(0, Ordering::AcqRel);
        self.untake(taken);
        taken
    }

    /// The size of the next lease, updating the rate estimate from what was
    /// spent since the last grant (tokens taken back unspent since then, by
    /// any path, do not count); `asking` is 1 when a request without a
    /// token is asking (its hit counts too), 0 for a background refill.
    pub fn next_size(&self, sizing: &Sizing, capacity: u64, now_ms: u64, asking: u64) -> u64 {
        let level = self.level_at_grant.swap(0, Ordering::Relaxed);
        // Spent since the grant, plus the request asking now.
        let hits = level.saturating_sub(self.available()) + asking;
        let since = self.sampled_at.swap(now_ms, Ordering::Relaxed);
        if since != 0 {
            // Spent tokens were admitted; the asking request is not, yet.
            self.unrecorded.fetch_add(hits - asking, Ordering::Relaxed);
        }
        // A rate is never measured over less than half the lookahead: a
        // burst of n requests at one instant earns a lease of at most 2n,
        // not n per millisecond (the wake-up of a queue would otherwise look
        // like a flood and earn full-size leases). Steady traffic refills at
        // the low watermark, 3/4 of a lookahead apart, so it is not biased.
        let elapsed_ms = now_ms.saturating_sub(since).max(sizing.lookahead_ms / 2).max(1);
        let previous = f64::from_bits(self.qps.load(Ordering::Relaxed));
        // A first sample, or one after a long silence, says little: damp it.
        let sample = if since == 0 {
            0.0
        } else {
            hits as f64 * 1_000.0 / elapsed_ms as f64
        };
        let qps = ewma(previous, sample);
        self.qps.store(qps.to_bits(), Ordering::Relaxed);
        sizing.lease_size(qps, capacity)
    }

    /// Remembers the quota tokens are taken under.
    pub fn set_spec(&self, spec: crate::quota::Spec) {
        *self.spec.lock().recover() = Some(spec);
    }

    pub fn spec(&self) -> Option<crate::quota::Spec> {
        *self.spec.lock().recover()
    }

    /// Adds granted tokens; the lease then lives `ttl_ms` from now.
    pub fn add(&self, g: Granted, now_ms: u64, ttl_ms: u64) {
        // The new expiry and window first: a sweeper that sees the new
        // tokens must not take them as expired under the old ones.
        self.expires_at.store(now_ms.saturating_add(ttl_ms), Ordering::Release);
        self.window_ms.store(g.window_ms, Ordering::Release);
        let level = self.tokens.fetch_add(g.tokens, Ordering::AcqRel) + g.tokens;
        self.level_at_grant.store(level, Ordering::Relaxed);
        self.touch(now_ms);
        self.store_remaining.store(g.remaining, Ordering::Relaxed);
        self.reset_at
            .store(now_ms.saturating_add(g.reset_ms), Ordering::Relaxed);
    }

    /// Counts one more request over the quota and returns how many there
    /// were in the last `period_ms` (a window, not since the last grant: a
    /// refill in between does not make a key look less over).
    pub fn count_over(&self, now_ms: u64, period_ms: u64) -> u64 {
        let since = self.over_since.load(Ordering::Relaxed);
        if since == 0 || now_ms.saturating_sub(since) >= period_ms || now_ms < since {
            self.over_since.store(now_ms.max(1), Ordering::Relaxed);
            self.over.store(1, Ordering::Relaxed);
            return 1;
        }
        self.over.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Tokens at hand that may still be spent at `now_ms` (none once the
    /// lease has expired: they belong to the store again).
    pub fn spendable(&self, now_ms: u64) -> u64 {
        if self.expires_at.load(Ordering::Relaxed) <= now_ms {
            return 0;
        }
        self.available()
    }

    /// Requests refused in the over-quota window that is still open at
    /// `now_ms` (`period_ms` long), without counting one: 0 once it closed.
    pub fn refusals_in_window(&self, now_ms: u64, period_ms: u64) -> u64 {
        let since = self.over_since.load(Ordering::Relaxed);
        if since == 0 || now_ms < since || now_ms.saturating_sub(since) >= period_ms {
            return 0;
        }
        self.over.load(Ordering::Relaxed)
    }

    /// The store window the tokens at hand were counted in.
    pub fn window_ms(&self) -> u64 {
        self.window_ms.load(Ordering::Relaxed)
    }

    /// The store answered: tokens spent since the last answer, plus
    /// `admitted_now` (the asking request, when it was granted), join the
    /// decayed admitted count. Only answers call this: while the store is
    /// away the average stays what it was.
    pub fn record_admitted(&self, admitted_now: u64, now_ms: u64) {
        let hits = self.unrecorded.swap(0, Ordering::Relaxed) + admitted_now;
        if self.admitted_since.load(Ordering::Relaxed) == 0 {
            self.admitted_since.store(now_ms.max(1), Ordering::Relaxed);
            self.admitted_at.store(now_ms, Ordering::Relaxed);
        }
        let decayed = self.admitted_decayed(now_ms);
        self.admitted
            .store((decayed + hits as f64).to_bits(), Ordering::Relaxed);
        self.admitted_at.store(now_ms, Ordering::Relaxed);
    }

    fn admitted_decayed(&self, now_ms: u64) -> f64 {
        let count = f64::from_bits(self.admitted.load(Ordering::Relaxed));
        let at = self.admitted_at.load(Ordering::Relaxed);
        let dt = now_ms.saturating_sub(at) as f64;
        count * (-dt / ADMITTED_TAU_MS).exp()
    }

    /// This instance's admitted rate for the key, per second, averaged over
    /// about a minute as of the store's last answer: while the store is away
    /// nothing updates it, so it stays the rate from before the outage. An
    /// average younger than a minute is scaled up by the share of the minute
    /// it has seen (at least a second), so a new key is not under-rated.
    pub fn admitted_rate(&self) -> f64 {
        let since = self.admitted_since.load(Ordering::Relaxed);
        if since == 0 {
            return 0.0;
        }
        let at = self.admitted_at.load(Ordering::Relaxed);
        let age_ms = at.saturating_sub(since).max(1_000) as f64;
        let seen = 1.0 - (-age_ms / ADMITTED_TAU_MS).exp();
        f64::from_bits(self.admitted.load(Ordering::Relaxed)) * 1_000.0 / (ADMITTED_TAU_MS * seen)
    }

    /// A request starts waiting for this key's store call; it stops when
    /// the returned guard drops.
    pub fn wait_in_line(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(self)
    }

    /// Requests waiting for this key's store call now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Marks the lease as forgotten by the table.
    pub fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
    }

    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// How many threads' fronts keep this lease.
    pub fn held_near(&self) -> usize {
        self.near.load(Ordering::Acquire) as usize
    }

    /// A front starts (+1) or stops (-1) keeping this lease.
    pub(super) fn near_count(&self, delta: i64) {
        if delta >= 0 {
            self.near.fetch_add(delta as u64, Ordering::AcqRel);
        } else {
            self.near.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel);
        }
    }

    /// Records a store answer that granted nothing.
    pub fn refused(&self, reset_ms: u64, now_ms: u64) {
        self.store_remaining.store(0, Ordering::Relaxed);
        self.reset_at.store(now_ms.saturating_add(reset_ms), Ordering::Relaxed);
    }

    /// Remaining as the client should see it: what the store had left, plus
    /// what is at hand here.
    pub fn remaining(&self) -> u64 {
        self.store_remaining
            .load(Ordering::Relaxed)
            .saturating_add(self.available())
    }

    /// What the shared bucket had left at the store's last answer.
    pub fn store_remaining(&self) -> u64 {
        self.store_remaining.load(Ordering::Relaxed)
    }

    pub fn reset_ms(&self, now_ms: u64) -> u64 {
        self.reset_at.load(Ordering::Relaxed).saturating_sub(now_ms)
    }

    /// Claims the key's single store-call slot; released when the returned
    /// guard drops (also when the call's future is dropped midway), which
    /// wakes the requests waiting for it.
    pub fn start_refill(&self) -> Option<RefillSlot<'_>> {
        self.refilling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            // Lazily: a slot made for a failed claim would free the flag on drop.
            .then(|| RefillSlot {
                lease: self,
                recorded: AtomicBool::new(false),
            })
    }

    fn set_last_failure(&self, failure: Option<&crate::store::StoreError>) {
        *self.last_failure.lock().recover() = failure.cloned();
    }

    /// How the last store call for this key failed, if it did.
    pub fn last_failure(&self) -> Option<crate::store::StoreError> {
        self.last_failure.lock().recover().clone()
    }

    /// Whether a store call for this key is in flight.
    pub fn refill_in_flight(&self) -> bool {
        self.refilling.load(Ordering::Acquire)
    }

    /// Waits until the store call in flight for this key ends, or claims the
    /// slot if none is (then the caller makes the call).
    pub async fn wait_for_refill(&self) -> Option<RefillSlot<'_>> {
        let arrived = self.arrived.notified();
        tokio::pin!(arrived);
        // Registered before the check: an end between the two still wakes us.
        arrived.as_mut().enable();
        if let Some(slot) = self.start_refill() {
            return Some(slot);
        }
        arrived.await;
        None
    }
}

/// Time constant of the admitted-rate average, ms.
const ADMITTED_TAU_MS: f64 = 60_000.0;

/// A request waiting in line for a key's store call.
#[derive(Debug)]
pub struct Waiting<'a>(&'a Lease);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The store-call slot of a lease, held while its call is in flight.
#[derive(Debug)]
pub struct RefillSlot<'a> {
    lease: &'a Lease,
    recorded: AtomicBool,
}

impl RefillSlot<'_> {
    /// Records how this slot's call ended (`None`: it answered), for the
    /// requests waiting for it. Only the slot's call speaks for the key.
    pub fn record(&self, failure: Option<&crate::store::StoreError>) {
        self.lease.set_last_failure(failure);
        self.recorded.store(true, Ordering::Relaxed);
    }
}

impl Drop for RefillSlot<'_> {
    fn drop(&mut self) {
        if !self.recorded.load(Ordering::Relaxed) {
            // Dropped mid-call: nothing is known, so no older failure may
            // stand for it; the waiters make their own calls.
            self.lease.set_last_failure(None);
        }
        self.lease.refilling.store(false, Ordering::Release);
        self.lease.arrived.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_traffic_within_min_max_and_fraction() {
        let s = Sizing::default();
        assert_eq!(s.lease_size(0.0, 1_000_000), 5); // cold: min
        assert_eq!(s.lease_size(100.0, 1_000_000), 25); // 100 qps × 0.25 s
        assert_eq!(s.lease_size(1_000.0, 1_000_000), 250);
        assert_eq!(s.lease_size(1e9, 1_000_000), 500); // max
        assert_eq!(s.lease_size(1_000.0, 100), 10); // 10% of capacity
        assert_eq!(s.lease_size(1_000.0, 10), 1); // low limits: one at a time
        assert_eq!(s.lease_size(f64::NAN, 10), 1);
        assert_eq!(s.lease_size(f64::INFINITY, 1_000_000), 5);
    }

    #[test]
    fn sizes_grow_with_traffic_and_decay_when_it_falls() {
        let s = Sizing::default();
        let lease = Lease::default();
        let mut now = 1_000;
        lease.next_size(&s, 1_000_000, now, 1);
        let grant = |lease: &Lease, now| {
            lease.add(
                Granted {
                    tokens: 1_000,
                    remaining: 0,
                    reset_ms: 0,
                    window_ms: 0,
                },
                now,
                60_000,
            )
        };
        let mut sizes = Vec::new();
        for _ in 0..6 {
            grant(&lease, now);
            for _ in 0..400 {
                lease.try_take(now);
            }
            now += 100; // 4,000 qps
            sizes.push(lease.next_size(&s, 1_000_000, now, 1));
        }
        assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{sizes:?}");
        assert_eq!(*sizes.last().unwrap(), 500);
        let mut decaying = Vec::new();
        for _ in 0..8 {
            grant(&lease, now);
            now += 1_000; // 1 qps: the asking request only
            decaying.push(lease.next_size(&s, 1_000_000, now, 1));
        }
        assert!(decaying.windows(2).all(|w| w[0] >= w[1]), "{decaying:?}");
        assert_eq!(*decaying.last().unwrap(), 5);
    }

    #[test]
    fn tokens_are_spent_once_and_expire() {
        let lease = Lease::default();
        assert!(!lease.try_take(0));
        lease.add(
            Granted {
                tokens: 2,
                remaining: 8,
                reset_ms: 100,
                window_ms: 0,
            },
            1_000,
            500,
        );
        assert_eq!(lease.remaining(), 10);
        assert!(lease.try_take(1_100));
        assert_eq!(lease.take_expired(1_200), 0);
        assert!(lease.try_take(1_200));
        assert!(!lease.try_take(1_200));
        lease.give_back(1);
        assert!(!lease.try_take(1_500), "expired tokens are not spent");
        assert_eq!(lease.take_expired(1_500), 1);
    }

    #[test]
    fn one_refill_at_a_time() {
        let lease = Lease::default();
        let slot = lease.start_refill();
        assert!(slot.is_some());
        assert!(lease.start_refill().is_none());
        drop(slot);
        assert!(lease.start_refill().is_some());
    }
}
