//! The local short-circuit after a refusal.
//!
//! When the store refuses a key, the key is blocked here until the store's
//! retry time, capped so a long window cannot silence a key for long if the
//! store's view changes (tokens released by other instances). A key holding
//! tokens the store reserved for it is blocked until the next is due, with
//! no cap: those are this instance's already, and asking sooner brings
//! nothing. While blocked, refusals cost no store call: a client hammering
//! after its 429 is answered from memory.

use std::sync::atomic::Ordering;

use super::lease::Lease;

/// Until when a key refused with `retry_after_ms` stays blocked locally.
pub fn until(now_ms: u64, retry_after_ms: u64, cap_ms: u64) -> u64 {
    now_ms.saturating_add(retry_after_ms.min(cap_ms).max(1))
}

/// Blocks `lease` after a refusal.
pub fn block(lease: &Lease, now_ms: u64, retry_after_ms: u64, cap_ms: u64) {
    block_needing(lease, now_ms, retry_after_ms, cap_ms, 0);
}

/// Blocks `lease` after a refusal of a request that needed more tokens at
/// once than the store had (`room`): a request needing at most `room` is
/// not blocked by it (it may still fit), one needing more is.
pub fn block_needing(lease: &Lease, now_ms: u64, retry_after_ms: u64, cap_ms: u64, room: u64) {
    lease.body().block_room.store(room, Ordering::Relaxed);
    lease
        .body()
        .retry_at
        .store(now_ms.saturating_add(retry_after_ms.max(1)), Ordering::Relaxed);
    lease
        .body()
        .blocked_until
        .store(until(now_ms, retry_after_ms, cap_ms), Ordering::Relaxed);
}

/// Ends `lease`'s block: what it was set on no longer holds (a settled
/// cost left the key in debt). The next request asks the store.
pub fn unblock(lease: &Lease) {
    lease.body().blocked_until.store(0, Ordering::Relaxed);
}

/// Whether the block refuses a request needing `need` tokens at `now_ms`.
#[inline]
pub fn refuses(lease: &Lease, now_ms: u64, need: u64) -> bool {
    remaining(lease, now_ms).is_some() && need > lease.body().block_room.load(Ordering::Relaxed)
}

/// Blocks `lease` after a refusal that sends the whole fleet's instances
/// back at about the same time (a drained token bucket whose queue of
/// reservations is full: they all wait for it to drain): the local block
/// ends up to a quarter of the wait (capped at `cap_ms`) early (`jitter`,
/// 0..=1 of that quarter), so their next asks spread out instead of
/// landing together. Clients are still told the full wait.
pub fn block_spread(lease: &Lease, now_ms: u64, retry_after_ms: u64, cap_ms: u64, jitter: f64) -> u64 {
    let wait = retry_after_ms.min(cap_ms);
    let early = (wait as f64 / 4.0 * jitter.clamp(0.0, 1.0)) as u64;
    lease.body().block_room.store(0, Ordering::Relaxed);
    lease
        .body()
        .retry_at
        .store(now_ms.saturating_add(retry_after_ms.max(1)), Ordering::Relaxed);
    let until = until(now_ms, wait - early, cap_ms);
    lease.body().blocked_until.store(until, Ordering::Relaxed);
    until - now_ms
}

/// Milliseconds until the store expects a token for a refused key (at
/// least 1): what `Retry-After` says.
pub fn retry_after(lease: &Lease, now_ms: u64) -> u64 {
    retry_pending(lease, now_ms).max(1)
}

/// Milliseconds until the store's retry time of the key's last refusal,
/// 0 when it has passed (or there was none): unlike [`retry_after`], which
/// answers a refused client and is never 0.
pub fn retry_pending(lease: &Lease, now_ms: u64) -> u64 {
    lease.body().retry_at.load(Ordering::Relaxed).saturating_sub(now_ms)
}

/// If the lease is blocked at `now_ms`, the milliseconds left.
pub fn remaining(lease: &Lease, now_ms: u64) -> Option<u64> {
    let until = lease.body().blocked_until.load(Ordering::Relaxed);
    (until > now_ms).then(|| until - now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_until_the_retry_time_capped() {
        let lease = Lease::default();
        assert_eq!(remaining(&lease, 1_000), None);
        block(&lease, 1_000, 700, 5_000);
        assert_eq!(remaining(&lease, 1_000), Some(700));
        assert_eq!(remaining(&lease, 1_699), Some(1));
        assert_eq!(remaining(&lease, 1_700), None);
        block(&lease, 1_000, 60_000, 5_000);
        assert_eq!(remaining(&lease, 1_000), Some(5_000));
        assert_eq!(retry_after(&lease, 1_000), 60_000);
        assert_eq!(retry_after(&lease, 70_000), 1);
        assert_eq!(until(0, 0, 5_000), 1);
    }

    #[test]
    fn a_block_for_want_of_room_refuses_only_what_needs_more() {
        let lease = Lease::default();
        block_needing(&lease, 1_000, 2_000, 5_000, 7);
        assert!(!refuses(&lease, 1_000, 7), "7 may still fit");
        assert!(refuses(&lease, 1_000, 8));
        assert!(!refuses(&lease, 3_000, 8), "over");
        block(&lease, 1_000, 2_000, 5_000);
        assert!(refuses(&lease, 1_000, 1), "a plain refusal blocks all");
    }

    #[test]
    fn a_spread_block_ends_up_to_a_quarter_early_and_tells_the_full_wait() {
        let lease = Lease::default();
        assert_eq!(block_spread(&lease, 1_000, 800, 5_000, 0.0), 800);
        assert_eq!(block_spread(&lease, 1_000, 800, 5_000, 1.0), 600);
        assert_eq!(block_spread(&lease, 1_000, 800, 5_000, 0.5), 700);
        assert_eq!(retry_after(&lease, 1_000), 800, "clients hear the whole wait");
        assert_eq!(block_spread(&lease, 1_000, 80_000, 5_000, 0.0), 5_000, "capped");
        assert_eq!(
            block_spread(&lease, 1_000, 80_000, 5_000, 1.0),
            3_750,
            "spread within the cap"
        );
    }
}
