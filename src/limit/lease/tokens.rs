//! The tokens at hand: what every decision reads and spends. The count,
//! its expiry, the size of the last lease asked for (the low watermark's
//! base, with the table's eviction mark in its top bit) and the store's
//! view of the bucket for the headers. Nothing else
//! is read on the spending path, so this part comes first in [`Lease`] and
//! fits in its first cache line; spending is one load and one
//! compare-and-swap here, nothing else written.
//!
//! Taking tokens out unspent (expired, released, evicted) also lowers the
//! rate estimate's level at grant: [`Lease`] does that, with the count this
//! part returns.
//!
//! [`Lease`]: super::Lease

use std::sync::atomic::{AtomicU64, Ordering};

/// The top bit of [`Tokens::sized`]: the lease table forgot the lease.
const EVICTED: u64 = 1 << 63;

/// The hot part of a lease. `repr(C)`: the fields stay in this order, and
/// the whole part in the 64 bytes at the start of [`super::Lease`].
#[derive(Debug, Default)]
#[repr(C)]
pub(super) struct Tokens {
    /// Tokens at hand.
    at_hand: AtomicU64,
    /// When the tokens at hand must go back to the store, ms.
    expires_at: AtomicU64,
    /// The size of the last lease asked for (for the low watermark) in
    /// the low 63 bits, and in the top bit whether the lease table has
    /// forgotten the lease ([`EVICTED`]): a front reads both in the line
    /// it spends from, which has no room for a word of its own.
    sized: AtomicU64,
    /// Remaining in the shared bucket at the last grant, for headers.
    store_remaining: AtomicU64,
    /// When the shared bucket is whole again, ms, for headers.
    reset_at: AtomicU64,
}

impl Tokens {
    /// Spends one token if one is at hand and the lease has not expired.
    #[inline]
    pub(super) fn try_take(&self, now_ms: u64) -> bool {
        self.try_take_n(1, now_ms)
    }

    /// Spends `n` tokens at once if that many are at hand (all or none).
    #[inline]
    pub(super) fn try_take_n(&self, n: u64, now_ms: u64) -> bool {
        if self.expires_at.load(Ordering::Relaxed) <= now_ms {
            return false;
        }
        self.at_hand
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(n))
            .is_ok()
    }

    /// Tokens at hand now.
    #[inline]
    pub(super) fn available(&self) -> u64 {
        self.at_hand.load(Ordering::Acquire)
    }

    /// Tokens at hand that may still be spent at `now_ms` (none once the
    /// lease has expired).
    pub(super) fn spendable(&self, now_ms: u64) -> u64 {
        if self.expires_at.load(Ordering::Relaxed) <= now_ms {
            return 0;
        }
        self.available()
    }

    /// Puts back tokens taken for a request that was then refused.
    pub(super) fn give_back(&self, tokens: u64) {
        self.at_hand.fetch_add(tokens, Ordering::AcqRel);
    }

    /// Takes every token at hand if the lease has expired; returns how many.
    pub(super) fn take_expired(&self, now_ms: u64) -> u64 {
        if self.expires_at.load(Ordering::Acquire) > now_ms {
            return 0;
        }
        let taken = self.at_hand.swap(0, Ordering::AcqRel);
        // A grant that landed between the two reads moved the expiry first
        // (see `Lease::add`): what was taken is fresh, and goes back at once.
        if taken > 0 && self.expires_at.load(Ordering::Acquire) > now_ms {
            self.at_hand.fetch_add(taken, Ordering::AcqRel);
            return 0;
        }
        taken
    }

    /// Takes up to `n` tokens at hand; returns how many.
    pub(super) fn take_up_to(&self, n: u64) -> u64 {
        match self
            .at_hand
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(t - t.min(n)))
        {
            Ok(before) | Err(before) => before.min(n),
        }
    }

    /// Takes every token at hand; returns how many.
    pub(super) fn take_all(&self) -> u64 {
        self.at_hand.swap(0, Ordering::AcqRel)
    }

    /// The tokens at hand (and any added later) must go back at `at_ms`.
    /// Moved before tokens are added: a sweeper that sees the new tokens
    /// must not take them as expired under the old expiry.
    pub(super) fn expire_at(&self, at_ms: u64) {
        self.expires_at.store(at_ms, Ordering::Release);
    }

    /// Adds granted tokens; returns the tokens at hand right after.
    pub(super) fn add(&self, tokens: u64) -> u64 {
        self.at_hand.fetch_add(tokens, Ordering::AcqRel) + tokens
    }

    /// The size of the last lease asked for.
    #[inline]
    pub(super) fn size_hint(&self) -> u64 {
        self.sized.load(Ordering::Relaxed) & !EVICTED
    }

    /// Records the size of the lease asked for (at most 2^63 - 1: a
    /// lease is never near it, a share of a capacity below 2^53), keeping
    /// the eviction mark.
    pub(super) fn set_size_hint(&self, size: u64) {
        let size = size.min(!EVICTED);
        let _ = self
            .sized
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| Some(w & EVICTED | size));
    }

    /// Marks the lease forgotten by the table: for good.
    pub(super) fn evict(&self) {
        self.sized.fetch_or(EVICTED, Ordering::Release);
    }

    #[inline]
    pub(super) fn is_evicted(&self) -> bool {
        self.sized.load(Ordering::Acquire) & EVICTED != 0
    }

    /// Records the store's view at its last answer: what the shared bucket
    /// had left, and when it is whole again (ms), for headers.
    pub(super) fn set_store_view(&self, remaining: u64, reset_at_ms: u64) {
        self.store_remaining.store(remaining, Ordering::Relaxed);
        self.reset_at.store(reset_at_ms, Ordering::Relaxed);
    }

    /// What the shared bucket had left at the store's last answer.
    #[inline]
    pub(super) fn store_remaining(&self) -> u64 {
        self.store_remaining.load(Ordering::Relaxed)
    }

    /// Remaining as the client should see it: what the store had left, plus
    /// what is at hand here.
    #[inline]
    pub(super) fn remaining(&self) -> u64 {
        self.store_remaining().saturating_add(self.available())
    }

    /// Milliseconds until the shared bucket is whole again.
    #[inline]
    pub(super) fn reset_ms(&self, now_ms: u64) -> u64 {
        self.reset_at.load(Ordering::Relaxed).saturating_sub(now_ms)
    }
}
