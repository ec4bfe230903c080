//! Local leases: tokens taken from the shared store in batches and spent
//! here with one atomic operation each. The [`Lease`] is a handful of
//! atomics: spending never takes a lock and never waits for the store.
//!
//! It is made of parts, one per concern, each `repr(C)` in a file of its
//! own: `tokens` (what every decision reads and spends: with the table's
//! hash and the eviction mark, the whole of the lease's one cache line),
//! `rate` (the rate estimate that sizes the next lease, and the admitted
//! rate), `refill` (the one store call per key). Here stay, in the
//! lease's [`Body`] apart from that line, the block times, the fronts'
//! count, the grant's window, the quota and the key; and the methods the
//! limiter calls, delegating to the parts; those
//! that touch several (adding a grant, taking tokens back unspent, sizing
//! the next lease) are written here. `sizing` holds the pure sizing rule,
//! [`Sizing`].

mod rate;
mod refill;
mod reserved;
mod sizing;
mod tokens;

use crate::sync::Recover;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use rate::ewma;
pub use refill::{RefillSlot, Waiting};
pub use reserved::Due;
pub use sizing::Sizing;

use rate::RateEstimate;
use refill::Refill;
use reserved::Reserved;
use tokens::Tokens;

/// A lease shared by the table, threads' fronts and store calls:
/// triomphe's `Arc`, one count and no weak one, so that count and lease
/// are one 64-byte allocation (see [`Lease`]).
pub type SharedLease = triomphe::Arc<Lease>;

/// The local state of one (limit, key). `repr(C)`, 56 bytes: the spending
/// path's fields (`Tokens`, with the eviction mark a decision through a
/// thread's front reads), the hash the lease table compares and the
/// pointer to the rest. With a [`SharedLease`]'s count that is 64 bytes,
/// an allocation the allocator (mimalloc, whose blocks of a power-of-two
/// size are aligned to it) puts in one cache line, and that line is all of
/// the lease a decision with a token at hand reads. The rest (what store
/// calls and refusals read) is the [`Body`], an allocation of its own.
///
/// So the lines decisions read sit close together in memory: with the body
/// inline a lease was ~400 bytes, and 100 000 keys' hot lines were spread
/// over 40 MB (one in six lines of it read, the rest only on store calls).
/// With a std `Arc`'s two counts in a line of their own, 128 bytes a
/// lease: the line beside each hot one was read only by clones, yet the
/// caches fetch lines in pairs. One line a lease halves what 100 000 keys'
/// leases take of the caches (`docs/benchmarks.md`, issue 43's ninth
/// round).
#[derive(Debug, Default)]
#[repr(C)]
pub struct Lease {
    /// Tokens at hand, their expiry, the last lease's size and the
    /// eviction mark, the store's view.
    tokens: Tokens,
    /// The request hash the lease table finds this lease by: the table's
    /// entry is the pointer alone, compared through here (the line a
    /// decision reads anyway).
    table_key: u64,
    /// Read on store calls and refusals only.
    body: Box<Body>,
}

/// The part of a [`Lease`] a decision with a token at hand never reads.
#[derive(Debug, Default)]
pub(crate) struct Body {
    /// The rate estimate and the admitted rate.
    rate: RateEstimate,
    /// Refused locally until this time, ms (after a store refusal).
    pub(crate) blocked_until: AtomicU64,
    /// When the store said a token will be available, ms: what a refused
    /// client is told (the local block may end sooner, to re-ask the store).
    pub(crate) retry_at: AtomicU64,
    /// What the store still had when it refused a request needing more at
    /// once (a cost's reserve): the block does not refuse a request needing
    /// at most this many. 0 after any other refusal.
    pub(crate) block_room: AtomicU64,
    /// Requests refused in the current over-quota window: how far over.
    over: AtomicU64,
    /// When that window began, ms.
    over_since: AtomicU64,
    /// Threads' fronts keeping this lease (see `near`): references that
    /// do not make it busy.
    near: AtomicU64,
    /// The store's window of the last grant (sliding window), for giving
    /// tokens back to the window they were counted in.
    window_ms: AtomicU64,
    /// Last store call or refusal, ms (idle leases are forgotten).
    pub(crate) touched: AtomicU64,
    /// The key's one store call at a time, and the line behind it.
    refill: Refill,
    /// Tokens the store reserved for this lease, not moved to those at
    /// hand yet.
    reserved: Reserved,
    /// Costs settled above their reserve that the tokens at hand did not
    /// cover: owed to the store, sent with the next call for the key.
    debt: AtomicU64,
    /// Tokens a request takes here (a cost's reserve, then what responses
    /// settled at; 0 and 1: one), averaged: a lease is sized in requests'
    /// worth, so a limit with a cost makes as few store calls per request
    /// as one without.
    unit: AtomicU64,
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
    /// The lease of store key `key`, which the lease table finds by the
    /// request hash `table_key`.
    pub fn new(key: &str, table_key: u64) -> Lease {
        Lease {
            tokens: Tokens::default(),
            table_key,
            body: Box::new(Body {
                key: Arc::from(key),
                ..Body::default()
            }),
        }
    }

    /// What store calls and refusals read: the block after a refusal, the
    /// last use.
    pub(crate) fn body(&self) -> &Body {
        &self.body
    }

    /// The request hash the lease table finds this lease by.
    #[inline]
    pub fn table_key(&self) -> u64 {
        self.table_key
    }

    /// The store key this lease draws from.
    pub fn key(&self) -> &str {
        &self.body.key
    }

    /// The store key, shared (for tokens going back after the lease).
    pub fn shared_key(&self) -> Arc<str> {
        Arc::clone(&self.body.key)
    }

    // -- tokens --

    /// Spends one token if one is at hand and the lease has not expired:
    /// one load and one compare-and-swap, nothing else written.
    #[inline]
    pub fn try_take(&self, now_ms: u64) -> bool {
        self.tokens.try_take(now_ms)
    }

    /// Spends `n` tokens at once if that many are at hand (all or none).
    #[inline]
    pub fn try_take_n(&self, n: u64, now_ms: u64) -> bool {
        self.tokens.try_take_n(n, now_ms)
    }

    /// Tokens at hand now.
    #[inline]
    pub fn available(&self) -> u64 {
        self.tokens.available()
    }

    /// Tokens at hand that may still be spent at `now_ms` (none once the
    /// lease has expired: they belong to the store again).
    pub fn spendable(&self, now_ms: u64) -> u64 {
        self.tokens.spendable(now_ms)
    }

    /// The tokens at hand, expired or not: this instance holds them until
    /// they are spent or go back to the store.
    pub fn held(&self) -> u64 {
        self.tokens.available()
    }

    /// Puts back a token taken for a request that was then refused.
    pub fn give_back(&self, tokens: u64) {
        self.tokens.give_back(tokens);
    }

    /// The size of the last lease asked for (for the low watermark).
    #[inline]
    pub fn size_hint(&self) -> u64 {
        self.tokens.size_hint()
    }

    /// Remembers the size of the lease being asked for.
    pub fn set_size_hint(&self, size: u64) {
        self.tokens.set_size_hint(size);
    }

    /// Remaining as the client should see it: what the store had left, plus
    /// what is at hand here.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.tokens.remaining()
    }

    /// What the shared bucket had left at the store's last answer.
    pub fn store_remaining(&self) -> u64 {
        self.tokens.store_remaining()
    }

    #[inline]
    pub fn reset_ms(&self, now_ms: u64) -> u64 {
        self.tokens.reset_ms(now_ms)
    }

    // -- costs settled after the response --

    /// A response cost `tokens` more than its reserve: taken from the
    /// tokens at hand (spent, as the reserve was), and what they do not
    /// cover is owed to the store ([`Lease::take_debt`]). Returns what is
    /// owed now.
    pub fn charge(&self, tokens: u64) -> u64 {
        let covered = self.tokens.take_up_to(tokens);
        let rest = tokens - covered;
        if rest == 0 {
            return self.debt();
        }
        // Saturating: costs come from upstream responses, and an atomic
        // add wraps (a wrapped debt would be a huge debt forgiven).
        let add = |d: u64| Some(d.saturating_add(rest));
        match self.body.debt.fetch_update(Ordering::AcqRel, Ordering::Acquire, add) {
            Ok(before) | Err(before) => before.saturating_add(rest),
        }
    }

    /// Tokens owed to the store, not sent yet.
    pub fn debt(&self) -> u64 {
        self.body.debt.load(Ordering::Acquire)
    }

    /// Takes what is owed, to send to the store (an acquire's `charge`).
    pub fn take_debt(&self) -> u64 {
        self.body.debt.swap(0, Ordering::AcqRel)
    }

    // -- tokens taken back unspent: they leave the rate sample too --

    /// Takes every token at hand if the lease has expired, and a
    /// reservation nobody spent a lease TTL after its last token was due:
    /// they belong to the store again.
    pub fn take_expired(&self, now_ms: u64) -> u64 {
        let taken = self.tokens.take_expired(now_ms);
        self.body.rate.untake(taken);
        taken + self.body.reserved.take_expired(now_ms)
    }

    /// Takes up to `n` tokens at hand; returns how many.
    pub fn take_up_to(&self, n: u64) -> u64 {
        let taken = self.tokens.take_up_to(n);
        self.body.rate.untake(taken);
        taken
    }

    /// Takes every token at hand, and every token reserved (shutdown,
    /// changed limit, eviction).
    pub fn take_all(&self) -> u64 {
        let taken = self.tokens.take_all();
        self.body.rate.untake(taken);
        taken + self.body.reserved.take_all()
    }

    // -- tokens reserved for later --

    /// Holds `tokens` the store reserved under `spec` ([`Granted`] none
    /// now): the first due at `first_at`, the rest as the refill brings
    /// them; unspent, they go back `ttl_ms` after the last is due.
    pub fn reserve(&self, tokens: u64, first_at: u64, spec: crate::quota::Spec, ttl_ms: u64) {
        self.body.reserved.hold(tokens, first_at, spec, ttl_ms);
    }

    /// Takes every token still reserved (a lease the table let go while
    /// its reservation was on its way).
    pub fn take_reserved(&self) -> u64 {
        self.body.reserved.take_all()
    }

    /// Reserved tokens not yet moved to the tokens at hand (due or not).
    pub fn reserved(&self) -> u64 {
        self.body.reserved.left()
    }

    /// The quota a held reservation was made under.
    pub fn reserved_under(&self) -> Option<crate::quota::Spec> {
        self.body.reserved.spec()
    }

    /// Whether the lease holds reserved tokens not all moved to those at
    /// hand yet: it asks the store for none meanwhile.
    #[inline]
    pub fn has_reservation(&self) -> bool {
        self.body.reserved.is_held()
    }

    /// Moves the reserved tokens due at `now_ms` to the tokens at hand,
    /// which then live `ttl_ms`; says how many, or when the next is due.
    pub fn take_due(&self, now_ms: u64, ttl_ms: u64) -> Due {
        let due = self.body.reserved.take_due(now_ms);
        if let Due::Now(n) = due {
            self.tokens.expire_at(now_ms.saturating_add(ttl_ms));
            self.tokens.add(n);
            self.body.rate.added(n);
        }
        due
    }

    // -- store answers --

    /// The size of the next lease, updating the rate estimate from what was
    /// spent since the last grant (tokens taken back unspent since then, by
    /// any path, do not count); `asking` is 1 when a request without a
    /// token is asking (its hit counts too), 0 for a background refill.
    ///
    /// `min` and `max` count requests' worth: `unit` tokens each (see
    /// [`Lease::note_unit`]).
    pub fn next_size(&self, sizing: &Sizing, capacity: u64, now_ms: u64, asking: u64) -> u64 {
        let qps = self
            .body
            .rate
            .next_qps(&self.tokens, sizing.lookahead_ms, now_ms, asking);
        let unit = self.body.unit.load(Ordering::Relaxed).max(1);
        sizing.lease_size_in(qps, capacity, unit)
    }

    /// What one request took (its reserve when it asks the store, its
    /// settled cost when its response ends): the unit of the next leases'
    /// `min` and `max` follows it, each sample counting for half.
    pub fn note_unit(&self, tokens: u64) {
        let _ = self.body.unit.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
            Some(if u == 0 {
                tokens
            } else {
                u.saturating_add(tokens).div_ceil(2)
            })
        });
    }

    /// Adds granted tokens; the lease then lives `ttl_ms` from now.
    pub fn add(&self, g: Granted, now_ms: u64, ttl_ms: u64) {
        // The new expiry and window first: a sweeper that sees the new
        // tokens must not take them as expired under the old ones.
        self.tokens.expire_at(now_ms.saturating_add(ttl_ms));
        self.body.window_ms.store(g.window_ms, Ordering::Release);
        let level = self.tokens.add(g.tokens);
        self.body.rate.granted(level);
        self.touch(now_ms);
        self.tokens
            .set_store_view(g.remaining, now_ms.saturating_add(g.reset_ms));
    }

    /// Records a store answer that granted nothing, with `remaining` left
    /// (0, unless the request needed more at once).
    pub fn refused(&self, remaining: u64, reset_ms: u64, now_ms: u64) {
        self.tokens.set_store_view(remaining, now_ms.saturating_add(reset_ms));
    }

    /// The store answered: tokens spent since the last answer, plus
    /// `admitted_now` (the asking request, when it was granted), join the
    /// decayed admitted count. Only answers call this: while the store is
    /// away the average stays what it was.
    pub fn record_admitted(&self, admitted_now: u64, now_ms: u64) {
        self.body.rate.record_admitted(admitted_now, now_ms);
    }

    /// This instance's admitted rate for the key, per second, averaged over
    /// about a minute as of the store's last answer: while the store is away
    /// nothing updates it, so it stays the rate from before the outage. An
    /// average younger than a minute is scaled up by the share of the minute
    /// it has seen (at least a second), so a new key is not under-rated.
    pub fn admitted_rate(&self) -> f64 {
        self.body.rate.admitted_rate()
    }

    /// This instance's admitted count for the key in about the last
    /// minute, as of the store's last answer: the average above before it
    /// is scaled up for its youth (a key's first burst is its count).
    pub fn admitted_last_minute(&self) -> f64 {
        self.body.rate.admitted_last_minute()
    }

    /// The store window the tokens at hand were counted in.
    pub fn window_ms(&self) -> u64 {
        self.body.window_ms.load(Ordering::Relaxed)
    }

    /// Remembers the quota tokens are taken under.
    pub fn set_spec(&self, spec: crate::quota::Spec) {
        *self.body.spec.lock().recover() = Some(spec);
    }

    pub fn spec(&self) -> Option<crate::quota::Spec> {
        *self.body.spec.lock().recover()
    }

    /// Marks the lease as used now (store calls only; spending does not).
    pub fn touch(&self, now_ms: u64) {
        self.body.touched.store(now_ms, Ordering::Relaxed);
    }

    // -- refusals --

    /// Counts one more request over the quota and returns how many there
    /// were in the last `period_ms` (a window, not since the last grant: a
    /// refill in between does not make a key look less over).
    pub fn count_over(&self, now_ms: u64, period_ms: u64) -> u64 {
        let since = self.body.over_since.load(Ordering::Relaxed);
        if since == 0 || now_ms.saturating_sub(since) >= period_ms || now_ms < since {
            self.body.over_since.store(now_ms.max(1), Ordering::Relaxed);
            self.body.over.store(1, Ordering::Relaxed);
            return 1;
        }
        self.body.over.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The over-quota window still open at `now_ms` (`period_ms` long), if
    /// any: its refusals and when it closes.
    pub fn over_window(&self, now_ms: u64, period_ms: u64) -> Option<(u64, u64)> {
        let refusals = self.refusals_in_window(now_ms, period_ms);
        (refusals > 0).then(|| {
            let since = self.body.over_since.load(Ordering::Relaxed);
            (refusals, since.saturating_add(period_ms))
        })
    }

    /// Requests refused in the over-quota window that is still open at
    /// `now_ms` (`period_ms` long), without counting one: 0 once it closed.
    pub fn refusals_in_window(&self, now_ms: u64, period_ms: u64) -> u64 {
        let since = self.body.over_since.load(Ordering::Relaxed);
        if since == 0 || now_ms < since || now_ms.saturating_sub(since) >= period_ms {
            return 0;
        }
        self.body.over.load(Ordering::Relaxed)
    }

    // -- the table and threads' fronts --

    /// Marks the lease as forgotten by the table: tokens added later go
    /// back at once, and threads' fronts stop believing it.
    pub fn evict(&self) {
        self.tokens.evict();
    }

    #[inline]
    pub fn is_evicted(&self) -> bool {
        self.tokens.is_evicted()
    }

    /// How many threads' fronts keep this lease.
    pub fn held_near(&self) -> usize {
        self.body.near.load(Ordering::Acquire) as usize
    }

    /// A front starts (+1) or stops (-1) keeping this lease.
    pub(super) fn near_count(&self, delta: i64) {
        if delta >= 0 {
            self.body.near.fetch_add(delta as u64, Ordering::AcqRel);
        } else {
            self.body.near.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel);
        }
    }

    // -- the store call --

    /// A request starts waiting for this key's store call; it stops when
    /// the returned guard drops.
    pub fn wait_in_line(&self) -> Waiting<'_> {
        self.body.refill.wait_in_line()
    }

    /// Requests waiting for this key's store call now.
    pub fn waiting(&self) -> u64 {
        self.body.refill.waiting()
    }

    /// Claims the key's single store-call slot; released when the returned
    /// guard drops (also when the call's future is dropped midway), which
    /// wakes the requests waiting for it.
    pub fn start_refill(&self) -> Option<RefillSlot<'_>> {
        self.body.refill.start()
    }

    /// Whether a store call for this key is in flight.
    #[inline]
    pub fn refill_in_flight(&self) -> bool {
        self.body.refill.in_flight()
    }

    /// How the last store call for this key failed, if it did.
    pub fn last_failure(&self) -> Option<crate::store::StoreError> {
        self.body.refill.last_failure()
    }

    /// Waits until the store call in flight for this key ends, or claims the
    /// slot if none is (then the caller makes the call).
    pub async fn wait_for_refill(&self) -> Option<RefillSlot<'_>> {
        self.body.refill.wait().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs are the upstream's numbers: a debt saturates, never wraps
    /// to a small one (nor panics).
    #[test]
    fn a_debt_saturates_and_never_wraps() {
        let lease = Lease::default();
        assert_eq!(lease.charge(u64::MAX - 5), u64::MAX - 5);
        assert_eq!(lease.charge(10), u64::MAX);
        assert_eq!(lease.charge(u64::MAX), u64::MAX);
        assert_eq!(lease.take_debt(), u64::MAX);
        assert_eq!(lease.debt(), 0);
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
    fn a_lease_is_one_cache_line_and_its_body_is_elsewhere() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(Lease, tokens), 0);
        // With triomphe's one count (a `usize`), 64 bytes: one line.
        assert_eq!(size_of::<Lease>() + size_of::<usize>(), 64);
        let lease = SharedLease::new(Lease::new("k", 7));
        assert_eq!((lease.table_key(), lease.key()), (7, "k"));
    }

    #[test]
    fn the_eviction_mark_and_the_size_share_a_word_apart() {
        let lease = Lease::new("k", 7);
        lease.set_size_hint(40);
        assert!(!lease.is_evicted());
        lease.evict();
        assert!(lease.is_evicted());
        assert_eq!(lease.size_hint(), 40, "evicting keeps the size");
        lease.set_size_hint(u64::MAX);
        assert!(lease.is_evicted(), "a size never clears the mark");
        assert_eq!(lease.size_hint(), u64::MAX >> 1, "the largest size");
        lease.set_size_hint(3);
        assert_eq!((lease.size_hint(), lease.is_evicted()), (3, true));
    }
}
