//! Token bucket: `capacity` tokens, refilled at `count` per `period`.
//!
//! Integer arithmetic only, so the memory store and the Redis script agree
//! to the token: the level is kept in "units" where one token is
//! `period_ms` units and each elapsed millisecond adds `count` units.
//! Every value stays below 2^53 for any valid config (capacity ≤ 10^9,
//! period ≤ a day), so the Lua port on doubles computes the same results.

use super::{Grant, Spec};

/// A bucket's state: its level in units, and when that level was measured.
/// A level below zero is a debt: tokens reserved for later
/// ([`acquire_or_reserve`]), paid off by the refill before anyone else is
/// granted one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub units: i64,
    pub at_ms: u64,
}

/// Takes up to `want` tokens at `now_ms`. A missing state is a full bucket.
/// Grants `min(want, whole tokens available)`: a partial grant beats a
/// refusal at the end of a window.
pub fn acquire(state: Option<State>, spec: &Spec, now_ms: u64, want: u64) -> (State, Grant) {
    acquire_or_reserve(state, spec, now_ms, want, 1, false)
}

/// [`acquire`]; and, with `reserve`, when no whole token is left to grant:
/// reserves up to `want` tokens of the refill to come instead, GCRA-style,
/// so a fleet on a drained key is served in turn rather than polling.
///
/// The reserved tokens are taken now (the level goes below zero by them)
/// and become spendable one by one as the refill would have brought them:
/// the first after [`Grant::retry_after_ms`], the k-th (from 0)
/// `ceil(k × period / count)` ms after the first at the latest
/// ([`reserved_ready_ms`]). Reserving changes when tokens are spent, never
/// how many: a holder that spends each at its time admits exactly what the
/// bucket would have granted then.
///
/// The debt stays within [`max_debt`] tokens. A reservation that would
/// pass it is cut to what fits; when not even one fits, nothing is
/// reserved and `retry_after_ms` is the exact wait for a token free of
/// every reservation.
///
/// Nothing is granted unless `need` whole tokens are there (a request
/// that costs that many: 0 and 1 mean any); then `retry_after_ms` is the
/// exact wait until they are.
pub fn acquire_or_reserve(
    state: Option<State>,
    spec: &Spec,
    now_ms: u64,
    want: u64,
    need: u64,
    reserve: bool,
) -> (State, Grant) {
    let per_token = per_token(spec);
    let cap = capacity_units(spec);
    let mut units = level(state, spec, now_ms);
    let whole = u64::try_from(units.max(0) / per_token).unwrap_or(0);
    let granted = if whole >= need { want.min(whole) } else { 0 };
    units -= granted as i64 * per_token;
    let retry_after_ms = if granted == 0 && need > 1 && want > 0 {
        retry_after_for(units, spec, need)
    } else {
        retry_after(units, spec)
    };
    let mut reserved = 0;
    if reserve && granted == 0 && want > 0 {
        // Room: how many tokens the debt may still grow by.
        let floor = -(max_debt(spec) as i64) * per_token;
        let room = u64::try_from((units - floor).max(0) / per_token).unwrap_or(0);
        reserved = want.min(room);
        units -= reserved as i64 * per_token;
    }
    let grant = Grant {
        granted,
        remaining: u64::try_from(units.max(0) / per_token).unwrap_or(0),
        reset_ms: ceil_div(cap - units, spec.count),
        retry_after_ms,
        window_ms: 0,
        reserved,
        owed: owed(units, spec),
    };
    (State { units, at_ms: now_ms }, grant)
}

/// Takes `tokens` spent after the fact, whether the bucket has them or
/// not: the level goes below zero by them, however deep (a debt is never
/// forgiven: what a request cost is charged in full, and the key waits
/// until the refill has repaid it), bounded only by [`max_charged_debt`],
/// which keeps the Lua scripts' doubles exact. The refill pays the debt off
/// before anyone gets a token.
pub fn charge(state: Option<State>, spec: &Spec, now_ms: u64, tokens: u64) -> State {
    let floor = -(max_charged_debt(spec) as i64).saturating_mul(per_token(spec));
    let taken = i64::try_from(tokens)
        .unwrap_or(i64::MAX)
        .saturating_mul(per_token(spec));
    let units = level(state, spec, now_ms).saturating_sub(taken).max(floor);
    State { units, at_ms: now_ms }
}

/// Whole tokens owed below zero at `units` (rounded up).
fn owed(units: i64, spec: &Spec) -> u64 {
    ceil_div(-units, spec.period_ms())
}

/// How many tokens reservations may owe a bucket at most: one burst or one
/// period's count, whichever is more (and no more than keeps every level
/// within 2^53 units, for the Lua scripts' doubles). A fleet whose
/// instances each hold a reservation of one lease fits in that for
/// `max_debt / lease` instances; past that, an instance that asks is told
/// when a token free of every reservation comes.
pub fn max_debt(spec: &Spec) -> u64 {
    let exact = (super::MAX_UNITS / spec.period_ms().max(1)).saturating_sub(spec.capacity);
    spec.capacity.max(spec.count).min(exact)
}

/// The deepest debt a bucket can hold, in tokens: what keeps every level
/// within 2^53 units (the Lua scripts' doubles), about 2.5 billion tokens
/// for an hourly rate. Charges go this deep; reservations stop at
/// [`max_debt`].
pub fn max_charged_debt(spec: &Spec) -> u64 {
    (super::MAX_UNITS / spec.period_ms().max(1)).saturating_sub(spec.capacity)
}

/// When the k-th (from 0) of a reservation's tokens may be spent, in ms
/// after the first: `ceil(k × period / count)`, never earlier than the
/// refill brings it.
pub fn reserved_ready_ms(spec: &Spec, k: u64) -> u64 {
    let ms = (u128::from(k) * u128::from(spec.period_ms())).div_ceil(u128::from(spec.count.max(1)));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Gives back `tokens` (unspent lease), clamped to the capacity.
pub fn release(state: Option<State>, spec: &Spec, now_ms: u64, tokens: u64) -> State {
    let back = i64::try_from(tokens)
        .unwrap_or(i64::MAX)
        .saturating_mul(per_token(spec));
    let units = level(state, spec, now_ms)
        .saturating_add(back)
        .min(capacity_units(spec));
    State { units, at_ms: now_ms }
}

/// The level at `now_ms`, refilled for the time elapsed (below zero while
/// reservations or charges are owed, never below [`max_charged_debt`]).
///
/// A clock that went backwards (NTP stepping the wall clock, Redis `TIME`
/// after a failover to a skewed replica) refills nothing, and the caller
/// stores the level measured at `now_ms`, the earlier time: refills resume
/// from there as the clock moves on, instead of waiting for it to catch up
/// with the old timestamp. Only forward movement ever refills, so no
/// sequence of steps admits more than a monotonic clock moving as far.
pub fn level(state: Option<State>, spec: &Spec, now_ms: u64) -> i64 {
    let cap = capacity_units(spec);
    match state {
        None => cap,
        Some(s) => {
            let elapsed = i64::try_from(now_ms.saturating_sub(s.at_ms)).unwrap_or(i64::MAX);
            // A debt is kept whole (only the doubles' bound cuts it); a
            // level above the capacity (a reload lowered it) is cut.
            let floor = -(max_charged_debt(spec) as i64).saturating_mul(per_token(spec));
            s.units
                .saturating_add(elapsed.saturating_mul(spec.count as i64))
                .clamp(floor, cap)
        }
    }
}

/// One token in units: the period in ms (at most a day's worth of them,
/// and every valid config keeps `capacity × period` below 2^53).
fn per_token(spec: &Spec) -> i64 {
    i64::try_from(spec.period_ms()).unwrap_or(i64::MAX).max(1)
}

fn capacity_units(spec: &Spec) -> i64 {
    i64::try_from(spec.capacity.saturating_mul(spec.period_ms())).unwrap_or(i64::MAX)
}

/// With `units` left: the exact milliseconds until one whole token exists,
/// or 0 while one does.
fn retry_after(units: i64, spec: &Spec) -> u64 {
    let per_token = per_token(spec);
    if units < per_token {
        ceil_div(per_token - units, spec.count)
    } else {
        0
    }
}

/// With `units` left: the exact milliseconds until `n` whole tokens exist,
/// or 0 while they do.
fn retry_after_for(units: i64, spec: &Spec, n: u64) -> u64 {
    let wanted = i64::try_from(n).unwrap_or(i64::MAX).saturating_mul(per_token(spec));
    if units < wanted {
        ceil_div(wanted - units, spec.count)
    } else {
        0
    }
}

/// True when the bucket is full at `now_ms`: its state can be forgotten.
pub fn is_idle(state: State, spec: &Spec, now_ms: u64) -> bool {
    level(Some(state), spec, now_ms) >= capacity_units(spec)
}

/// `ceil(a / b)` for `a ≥ 0` (0 for a negative `a`).
fn ceil_div(a: i64, b: u64) -> u64 {
    u64::try_from(a.max(0)).unwrap_or(0).div_ceil(b.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{self, clock_step, Algorithm, Rate};
    use proptest::prelude::*;
    use std::time::Duration;

    fn spec(count: u64, period_ms: u64, capacity: u64) -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            Rate {
                count,
                period: Duration::from_millis(period_ms),
            },
            capacity,
        )
    }

    #[test]
    fn a_new_bucket_is_full_and_drains() {
        let s = spec(10, 60_000, 10);
        let (st, g) = acquire(None, &s, 1_000, 4);
        assert_eq!((g.granted, g.remaining, g.retry_after_ms), (4, 6, 0));
        assert_eq!(g.reset_ms, 24_000); // 4 tokens at one per 6 s
        let (st, g) = acquire(Some(st), &s, 1_000, 100);
        assert_eq!((g.granted, g.remaining), (6, 0)); // partial grant
        let (_, g) = acquire(Some(st), &s, 1_000, 1);
        assert_eq!((g.granted, g.retry_after_ms), (0, 6_000));
    }

    #[test]
    fn refills_by_elapsed_time_and_clamps_at_capacity() {
        let s = spec(1, 1_000, 5);
        let (st, _) = acquire(None, &s, 0, 5);
        assert_eq!(level(Some(st), &s, 2_500) / 1_000, 2);
        assert_eq!(level(Some(st), &s, 100_000), 5_000);
        assert!(is_idle(st, &s, 5_000));
        assert!(!is_idle(st, &s, 4_999));
    }

    #[test]
    fn release_clamps_to_capacity() {
        let s = spec(1, 1_000, 5);
        let (st, _) = acquire(None, &s, 0, 3);
        let st = release(Some(st), &s, 0, 2);
        assert_eq!(st.units, 4_000);
        let st = release(Some(st), &s, 0, 100);
        assert_eq!(st.units, 5_000);
    }

    #[test]
    fn a_clock_going_backwards_refills_nothing_and_resumes_from_there() {
        let s = spec(1, 1_000, 5);
        let (st, _) = acquire(None, &s, 3_600_000, 5);
        // An hour back: nothing refills, and the state is measured anew.
        let (st, g) = acquire(Some(st), &s, 0, 1);
        assert_eq!(g.granted, 0);
        assert_eq!(st, State { units: 0, at_ms: 0 });
        assert_eq!(g.retry_after_ms, 1_000);
        // One second later (not an hour): a token.
        let (_, g) = acquire(Some(st), &s, 1_000, 1);
        assert_eq!(g.granted, 1);
    }

    #[test]
    fn a_grant_that_empties_the_bucket_says_when_the_next_token_comes() {
        // 5/min, capacity 5: one token per 12 s. One at 0 s, four at 10 s:
        // the four leave 10 s × 5/60 s = 5/6 of a token, and the sixth
        // twelfth comes 2 s later (not 12 s, one token's whole refill).
        let s = spec(5, 60_000, 5);
        let (st, g) = acquire(None, &s, 0, 1);
        assert_eq!((g.granted, g.remaining, g.retry_after_ms), (1, 4, 0));
        let (st, g) = acquire(Some(st), &s, 10_000, 4);
        assert_eq!((g.granted, g.remaining, g.retry_after_ms), (4, 0, 2_000));
        assert_eq!(acquire(Some(st), &s, 11_999, 1).1.granted, 0);
        assert_eq!(acquire(Some(st), &s, 12_000, 1).1.granted, 1);
    }

    #[test]
    fn a_debt_is_never_forgiven_however_deep() {
        // 10/s, burst 10: a charge of 1 000 tokens (a hundred bursts) is
        // owed whole, and repaid by the refill alone.
        let s = spec(10, 1_000, 10);
        let st = charge(None, &s, 0, 1_010);
        assert_eq!(level(Some(st), &s, 0), -1_000_000);
        let (st, g) = acquire(Some(st), &s, 0, 1);
        assert_eq!((g.granted, g.owed), (0, 1_000));
        assert_eq!(g.retry_after_ms, 100_100, "the wait of a debt of 1 000, and one token");
        assert_eq!(acquire(Some(st), &s, 100_099, 1).1.granted, 0);
        assert_eq!(acquire(Some(st), &s, 100_100, 1).1.granted, 1);
        // Reservations still stop at one burst of debt: none is made on
        // top of a charge that deep.
        let (_, r) = acquire_or_reserve(Some(st), &s, 0, 5, 1, true);
        assert_eq!(r.reserved, 0);
    }

    proptest! {
        /// Reservations go no deeper than `max_debt`: whatever is asked,
        /// granted and reserved together stay within the capacity, the
        /// refill so far and that one debt.
        #[test]
        fn reservations_never_owe_more_than_max_debt(
            count in 1u64..1_000, period_ms in 1u64..100_000, capacity in 1u64..1_000,
            steps in prop::collection::vec((0u64..5_000, 0u64..50, any::<bool>()), 1..60),
        ) {
            let s = spec(count, period_ms, capacity);
            let (mut state, mut now, mut total) = (None, 0u64, 0u64);
            for (dt, want, reserve) in steps {
                now += dt;
                let (st, g) = acquire_or_reserve(state, &s, now, want, 1, reserve);
                prop_assert!(g.granted + g.reserved <= want);
                prop_assert!(g.granted == 0 || g.reserved == 0);
                prop_assert!(st.units >= -(max_debt(&s) as i64) * period_ms as i64);
                total += g.granted + g.reserved;
                state = Some(st);
            }
            prop_assert!(total <= capacity + now * count / period_ms + max_debt(&s));
        }
    }

    proptest! {
        /// Over any run of requests, granted ≤ capacity + refill over the span.
        #[test]
        fn never_grants_more_than_capacity_plus_refill(
            count in 1u64..1_000, period_ms in 1u64..100_000, capacity in 1u64..1_000,
            steps in prop::collection::vec((0u64..5_000, 0u64..50), 1..60),
        ) {
            let s = spec(count, period_ms, capacity);
            let (mut state, mut now, mut total) = (None, 0u64, 0u64);
            for (dt, want) in steps {
                now += dt;
                let (st, g) = acquire(state, &s, now, want);
                prop_assert!(g.granted <= want);
                total += g.granted;
                state = Some(st);
            }
            // refill over [0, now] is now*count/period tokens
            prop_assert!(total <= capacity + now * count / period_ms);
        }

        /// A charge leaves the bucket owing all of it (never forgiven: the
        /// level is exactly the tokens left less the charge), and a
        /// request needing `need` tokens at once is refused
        /// until exactly the moment the refill has paid the debt and
        /// brought them: a millisecond earlier it is refused still.
        #[test]
        fn a_debt_and_a_need_say_exactly_when_they_fit(
            count in 1u64..1_000, period_ms in 1u64..100_000, capacity in 1u64..100,
            spent in 0u64..100, charged in 1u64..300, need in 1u64..100,
        ) {
            let s = spec(count, period_ms, capacity);
            let need = need.min(capacity);
            let (st, _) = acquire(None, &s, 1_000, spent.min(capacity));
            let before = level(Some(st), &s, 1_000);
            let st = charge(Some(st), &s, 1_000, charged);
            prop_assert_eq!(level(Some(st), &s, 1_000), before - charged as i64 * period_ms as i64);
            let (st, g) = acquire_or_reserve(Some(st), &s, 1_000, need + 3, need, false);
            if g.granted > 0 {
                prop_assert!(g.granted >= need);
                return Ok(());
            }
            prop_assert!(g.retry_after_ms >= 1);
            prop_assert!(g.owed > 0 || need > 1);
            let (_, later) = acquire_or_reserve(Some(st), &s, 1_000 + g.retry_after_ms, need, need, false);
            prop_assert_eq!(later.granted, need);
            let (_, early) = acquire_or_reserve(Some(st), &s, 1_000 + g.retry_after_ms - 1, need, need, false);
            prop_assert_eq!(early.granted, 0);
        }

        /// Remaining never exceeds capacity, reset is the time to full.
        #[test]
        fn remaining_and_reset_are_consistent(
            count in 1u64..1_000, period_ms in 1u64..100_000, capacity in 1u64..1_000,
            want in 0u64..2_000, now in 0u64..1_000_000,
        ) {
            let s = spec(count, period_ms, capacity);
            let (st, g) = acquire(None, &s, now, want);
            prop_assert!(g.remaining <= capacity);
            prop_assert_eq!(g.granted + g.remaining, capacity);
            prop_assert!(is_idle(st, &s, now + g.reset_ms));
        }
    }

    proptest! {

        /// No stall: whatever the clock did before (steps back of up to an
        /// hour included), one period after the latest call a token is
        /// there again.
        #[test]
        fn a_clock_step_back_never_stalls_beyond_one_period(
            count in 1u64..1_000, period_ms in 1u64..100_000, capacity in 1u64..100,
            steps in prop::collection::vec((clock_step(), 0u64..200), 1..60),
        ) {
            let s = spec(count, period_ms, capacity);
            let (mut state, mut now) = (None, 10_000_000u64);
            for (dt, want) in steps {
                now = now.saturating_add_signed(dt);
                let (st, g) = acquire(state, &s, now, want);
                state = Some(st);
                prop_assert!(g.retry_after_ms <= period_ms);
                prop_assert_eq!(acquire(state, &s, now + period_ms, 1).1.granted, 1);
            }
        }

        /// No over-admission: over any clock sequence, the tokens kept
        /// (granted less given back) never exceed what a monotonic clock
        /// moving forward by the same total allows: the capacity plus the
        /// refill over the forward steps alone. Give-backs ride on acquires.
        #[test]
        fn clock_steps_never_over_admit(
            count in 1u64..1_000, period_ms in 1u64..100_000, capacity in 1u64..100,
            steps in prop::collection::vec((clock_step(), 0u64..200, 0u64..4), 1..80),
        ) {
            let s = spec(count, period_ms, capacity);
            let (mut state, mut now) = (None, 10_000_000u64);
            let (mut kept, mut held, mut forward) = (0u64, 0u64, 0u64);
            for (i, (dt, want, back)) in steps.into_iter().enumerate() {
                if i > 0 {
                    forward += u64::try_from(dt).unwrap_or(0);
                    now = now.saturating_add_signed(dt);
                }
                let back = back.min(held);
                let unspent = quota::Unspent { tokens: back, window_ms: 0, ..quota::Unspent::default() };
                let (st, g) = quota::acquire_returning(state.map(quota::State::Bucket), &s, now, want, unspent);
                let quota::State::Bucket(st) = st else { panic!("not a bucket") };
                state = Some(st);
                held = held - back + g.granted;
                kept = kept - back + g.granted;
                // In units: kept × period ≤ capacity × period + count × forward.
                prop_assert!(
                    u128::from(kept) * u128::from(period_ms)
                        <= u128::from(capacity) * u128::from(period_ms) + u128::from(count) * u128::from(forward),
                    "kept {} after {} ms forward", kept, forward
                );
            }
        }
    }
}
