//! Tokens reserved in the shared bucket for later: what a drained token
//! bucket grants instead of nothing ([`crate::quota::Grant::reserved`]).
//!
//! They were taken from the store already, so the lease never asks for
//! more while some are still to come. They become spendable one by one, as
//! the refill would have brought them: the first at `first_at`, the k-th
//! (from 0) `ceil(k × period / count)` ms later, never earlier than the
//! store's own refill (so no client is admitted before the bucket allows).
//! Requests move those that are due into the tokens at hand; the rest wait
//! here. Unspent, they go back with the lease's other tokens: at expiry
//! (a lease TTL after the last is due), on eviction and at shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::quota::{token_bucket, Spec};
use crate::sync::Recover;

/// A reservation being spent.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    /// Tokens reserved in all.
    total: u64,
    /// Tokens moved to the tokens at hand so far.
    moved: u64,
    /// When the first is due, ms.
    first_at: u64,
    /// The quota they were reserved under (the spacing of the rest).
    spec: Spec,
    /// How long after the last is due unmoved ones are still kept, ms.
    ttl_ms: u64,
}

impl Schedule {
    /// When the k-th (from 0) token is due.
    fn due_at(&self, k: u64) -> u64 {
        self.first_at
            .saturating_add(token_bucket::reserved_ready_ms(&self.spec, k))
    }

    /// How many are due at `now_ms`, in all.
    fn due(&self, now_ms: u64) -> u64 {
        if now_ms < self.first_at {
            return 0;
        }
        let elapsed = u128::from(now_ms - self.first_at);
        let refilled = elapsed * u128::from(self.spec.count) / u128::from(self.spec.period_ms().max(1));
        u64::try_from(refilled.saturating_add(1))
            .unwrap_or(u64::MAX)
            .min(self.total)
    }
}

/// What a request finds in the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// No reservation.
    None,
    /// `n` tokens were due: they are the caller's to add to the tokens at
    /// hand.
    Now(u64),
    /// None is due before this time, ms.
    At(u64),
}

/// A lease's reservation, if it holds one.
#[derive(Debug, Default)]
pub(super) struct Reserved {
    /// Whether a reservation is held: read without the lock by the refill
    /// in the background, which must not ask the store meanwhile.
    held: AtomicBool,
    schedule: Mutex<Option<Schedule>>,
}

impl Reserved {
    /// Holds `tokens` reserved under `spec`, the first due at `first_at`.
    /// The lease asks for no reservation while it holds one; should one
    /// still be held, its tokens join the new one's and come due from
    /// `first_at` on with them: later than they might, never earlier.
    pub(super) fn hold(&self, tokens: u64, first_at: u64, spec: Spec, ttl_ms: u64) {
        if tokens == 0 {
            return;
        }
        let mut schedule = self.schedule.lock().recover();
        let (left, first_at) = match *schedule {
            Some(s) => (s.total - s.moved, first_at.max(s.due_at(s.moved))),
            None => (0, first_at),
        };
        *schedule = Some(Schedule {
            total: left + tokens,
            moved: 0,
            first_at,
            spec,
            ttl_ms,
        });
        self.held.store(true, Ordering::Release);
    }

    /// Tokens still reserved, due or not.
    pub(super) fn left(&self) -> u64 {
        if !self.is_held() {
            return 0;
        }
        self.schedule.lock().recover().map_or(0, |s| s.total - s.moved)
    }

    #[inline]
    pub(super) fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Takes the tokens due at `now_ms` out of the reservation.
    pub(super) fn take_due(&self, now_ms: u64) -> Due {
        if !self.is_held() {
            return Due::None;
        }
        let mut guard = self.schedule.lock().recover();
        let Some(s) = guard.as_mut() else {
            return Due::None;
        };
        let due = s.due(now_ms);
        if due > s.moved {
            let n = due - s.moved;
            s.moved = due;
            if s.moved == s.total {
                *guard = None;
                self.held.store(false, Ordering::Release);
            }
            return Due::Now(n);
        }
        Due::At(s.due_at(s.moved))
    }

    /// Takes every token still reserved (eviction, shutdown, a changed
    /// limit): they go back to the store.
    pub(super) fn take_all(&self) -> u64 {
        if !self.is_held() {
            return 0;
        }
        let mut guard = self.schedule.lock().recover();
        self.held.store(false, Ordering::Release);
        guard.take().map_or(0, |s| s.total - s.moved)
    }

    /// Takes the reserved tokens that came due a lease TTL ago or more and
    /// that nobody moved: the store's again, like leased tokens unspent
    /// for a TTL. (An instance whose clients stopped coming gives back its
    /// reservation a token at a time, not at the end of the whole schedule.)
    pub(super) fn take_expired(&self, now_ms: u64) -> u64 {
        if !self.is_held() {
            return 0;
        }
        let mut guard = self.schedule.lock().recover();
        let Some(s) = guard.as_mut() else {
            return 0;
        };
        let Some(cutoff) = now_ms.checked_sub(s.ttl_ms) else {
            return 0;
        };
        let stale = s.due(cutoff);
        if stale <= s.moved {
            return 0;
        }
        let taken = stale - s.moved;
        s.moved = stale;
        if s.moved == s.total {
            *guard = None;
            self.held.store(false, Ordering::Release);
        }
        taken
    }

    /// The quota the reservation was made under, if one is held.
    pub(super) fn spec(&self) -> Option<Spec> {
        if !self.is_held() {
            return None;
        }
        self.schedule.lock().recover().map(|s| s.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Algorithm, Rate};
    use std::time::Duration;

    fn spec(count: u64, period_ms: u64) -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            Rate {
                count,
                period: Duration::from_millis(period_ms),
            },
            count,
        )
    }

    #[test]
    fn tokens_come_due_one_by_one_as_the_refill_brings_them() {
        let r = Reserved::default();
        assert_eq!(r.take_due(0), Due::None);
        // 3 per 10 ms: one every 3.33 ms, due at 100, 104, 107, 110.
        r.hold(4, 100, spec(3, 10), 1_000);
        assert_eq!(r.take_due(99), Due::At(100));
        assert_eq!(r.take_due(100), Due::Now(1));
        assert_eq!(r.take_due(103), Due::At(104));
        assert_eq!(r.take_due(107), Due::Now(2));
        assert_eq!(r.take_due(107), Due::At(110));
        assert!(r.is_held());
        assert_eq!(r.take_due(500), Due::Now(1));
        assert!(!r.is_held());
        assert_eq!(r.take_due(500), Due::None);
    }

    #[test]
    fn what_nobody_spent_goes_back_after_the_last_was_due_and_a_ttl() {
        let r = Reserved::default();
        r.hold(5, 1_000, spec(1, 100), 1_000); // due at 1000, 1100, ..., 1400
        assert_eq!(r.take_due(1_150), Due::Now(2));
        // A token goes back a TTL after it was due, if nobody moved it.
        assert_eq!(r.take_expired(2_199), 0);
        assert_eq!(r.take_expired(2_200), 1);
        assert_eq!(r.take_expired(2_399), 1);
        assert_eq!(r.take_expired(2_400), 1);
        assert!(!r.is_held());
        r.hold(2, 5_000, spec(1, 100), 1_000);
        assert_eq!(r.take_all(), 2);
        assert_eq!(r.take_all(), 0);
    }

    #[test]
    fn a_second_reservation_is_never_spent_early() {
        let r = Reserved::default();
        r.hold(2, 100, spec(1, 10), 1_000);
        r.hold(2, 120, spec(1, 10), 1_000);
        assert_eq!(r.take_due(119), Due::At(120));
        assert_eq!(r.take_due(125), Due::Now(1));
        assert_eq!(r.take_due(125), Due::At(130));
        assert_eq!(r.take_due(150), Due::Now(3));
    }

    /// No token is ever due before the store's refill brings it: the k-th
    /// reserved token exists in the bucket `ceil((k + 1) × period − level)
    /// / count` ms after the reservation, and the schedule's first token is
    /// due exactly when the store said.
    #[test]
    fn never_due_before_the_store_would_have_granted_it() {
        use crate::quota::token_bucket::{acquire, acquire_or_reserve, level, State};
        for (count, period, want, at) in [
            (3, 10, 7, 3),
            (7, 1_000, 5, 140),
            (100, 10_000, 10, 1),
            (1, 60_000, 3, 7),
        ] {
            let s = spec(count, period);
            let (drained, _) = acquire(None, &s, 0, count);
            let (st, g) = acquire_or_reserve(Some(drained), &s, at, want, 1, true);
            assert_eq!(g.granted, 0);
            assert_eq!(g.reserved, want.min(count));
            let r = Reserved::default();
            r.hold(g.reserved, at + g.retry_after_ms, s, 1_000);
            let mut moved = 0;
            let mut t = at;
            while moved < g.reserved {
                if let Due::Now(n) = r.take_due(t) {
                    moved += n;
                    // The bucket, without the reservation, holds `moved`
                    // tokens by now.
                    let without = State {
                        units: st.units + (g.reserved as i64) * s.period_ms() as i64,
                        at_ms: at,
                    };
                    assert!(
                        level(Some(without), &s, t) >= (moved as i64) * s.period_ms() as i64,
                        "{moved} due at {t} for {count}/{period}"
                    );
                }
                t += 1;
            }
        }
    }
}
