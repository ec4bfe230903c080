//! Sliding-window counter: the previous and the current fixed window, the
//! previous one weighted by how much of it the sliding window still covers.
//!
//! Windows are aligned to multiples of the period since the epoch, so every
//! store agrees on the boundaries. Integer arithmetic throughout: estimates
//! are kept scaled by `period_ms`.
//!
//! A current count above the limit (costs charged past it: a debt) is not
//! forgiven when the window turns: the next window's previous count is the
//! limit and its current count the overshoot, `limit` paid off by each
//! window that turns ([`roll`]). Below the limit this is the plain counter.
//!
//! Accuracy: within one aligned window at most `limit` requests are
//! admitted. Across a boundary the estimate assumes the previous window's
//! requests were spread evenly; if they all came at its very end, a sliding
//! window of one period can see up to `2 × limit` (the classic worst case).
//! Under evenly spread traffic the estimate is exact.

use super::{Grant, Spec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Start of the current window, a multiple of the period.
    pub window_ms: u64,
    pub current: u64,
    pub previous: u64,
}

/// The state as seen from `now_ms`: windows rolled forward as needed.
///
/// A state from a later window than `now_ms`'s (the clock went back: NTP
/// stepping the wall clock, Redis `TIME` after a failover to a skewed
/// replica) is re-anchored to `now_ms`'s window, so it neither waits for
/// the clock to catch up nor is forgotten. Its counts stay, conservatively:
/// the state says nothing of where in its window it was last used, and the
/// previous window weighs most at a window's start, so both counts go to
/// the current window, where they weigh fully. Re-anchored thus, no step
/// back ever lowers the estimate (no over-admission), and the counts leave
/// as they would have, over at most two periods of forward time (no stall
/// for the size of the step).
pub fn roll(state: Option<State>, spec: &Spec, now_ms: u64) -> State {
    let p = spec.period_ms();
    let start = now_ms - now_ms % p;
    let limit = spec.capacity;
    match state {
        Some(s) if s.window_ms == start => s,
        Some(s) if s.window_ms > start => State {
            window_ms: start,
            current: s.current.saturating_add(s.previous),
            previous: 0,
        },
        Some(s) => {
            // `turns` windows on, `limit` of the overshoot paid off by each:
            // the window before now's counted what was left of it then (at
            // most the limit), now's counts the rest.
            let turns = (start - s.window_ms) / p;
            State {
                window_ms: start,
                current: s.current.saturating_sub(limit.saturating_mul(turns)),
                previous: s.current.saturating_sub(limit.saturating_mul(turns - 1)).min(limit),
            }
        }
        None => State {
            window_ms: start,
            current: 0,
            previous: 0,
        },
    }
}

/// Scaled estimate of requests in the sliding window ending at `now_ms`.
fn estimate(s: &State, p: u64, now_ms: u64) -> u64 {
    let into = now_ms.saturating_sub(s.window_ms).min(p);
    s.previous
        .saturating_mul(p - into)
        .saturating_add(s.current.saturating_mul(p))
}

/// Takes up to `want` requests' worth at `now_ms`.
pub fn acquire(state: Option<State>, spec: &Spec, now_ms: u64, want: u64) -> (State, Grant) {
    acquire_needing(state, spec, now_ms, want, 1)
}

/// [`acquire`], granting nothing unless `need` fit (0 and 1: any); a
/// refusal's `retry_after_ms` is then the exact wait until they do.
pub fn acquire_needing(state: Option<State>, spec: &Spec, now_ms: u64, want: u64, need: u64) -> (State, Grant) {
    let p = spec.period_ms();
    let limit = spec.capacity;
    let mut s = roll(state, spec, now_ms);
    let budget = limit.saturating_mul(p);
    let available = budget.saturating_sub(estimate(&s, p, now_ms)) / p;
    let granted = if available >= need { want.min(available) } else { 0 };
    s.current += granted;
    let remaining = budget.saturating_sub(estimate(&s, p, now_ms)) / p;
    let window_end = s.window_ms + p;
    let refused_short = granted == 0 && want > 0 && need > 1 && remaining < need;
    let grant = Grant {
        granted,
        remaining,
        reset_ms: window_end.saturating_sub(now_ms),
        retry_after_ms: if refused_short {
            retry_after(&s, spec, now_ms, need.min(limit))
        } else if remaining == 0 {
            retry_after(&s, spec, now_ms, 1)
        } else {
            0
        },
        window_ms: s.window_ms,
        reserved: 0,
        owed: estimate(&s, p, now_ms).saturating_sub(budget).div_ceil(p),
    };
    (s, grant)
}

/// Gives back `unused` requests' worth taken in the window starting at
/// `window_ms` ([`Grant::window_ms`]): off the current count while that
/// window is still the current one (or a later one, re-anchored into it),
/// off the previous count once it has turned, and nowhere once it is
/// older: it no longer weighs on any decision.
pub fn release(state: Option<State>, spec: &Spec, now_ms: u64, unused: u64, window_ms: u64) -> State {
    let mut s = roll(state, spec, now_ms);
    if window_ms >= s.window_ms {
        s.current = s.current.saturating_sub(unused);
    } else if window_ms.saturating_add(spec.period_ms()) == s.window_ms {
        s.previous = s.previous.saturating_sub(unused);
    }
    s
}

/// Milliseconds until `n` more requests' worth fit (`1 ≤ n ≤ limit`).
fn retry_after(s: &State, spec: &Spec, now_ms: u64, n: u64) -> u64 {
    let p = spec.period_ms();
    let limit = spec.capacity;
    let n = n.clamp(1, limit.max(1));
    let into = now_ms.saturating_sub(s.window_ms).min(p);
    // In this window: previous × (p − e) ≤ (limit − n − current) × p.
    if s.current.saturating_add(n) <= limit {
        let room = (limit - n - s.current) * p;
        if s.previous == 0 {
            return 1; // only reachable if the estimate already fits
        }
        let need_e = p.saturating_sub(room / s.previous);
        if need_e < p {
            return need_e.saturating_sub(into).max(1);
        }
    }
    // A later window j (1 = the next): its previous count is what was left
    // of the overshoot (at most the limit), its current count the rest;
    // the first window whose current count leaves room for n, and in it
    // previous × (p − e) ≤ (limit − n − current) × p.
    let to_next = p - into;
    let c = s.current;
    let j = c.saturating_sub(limit).saturating_add(n).div_ceil(limit.max(1)).max(1);
    let cur = c.saturating_sub(limit.saturating_mul(j));
    let prev = c.saturating_sub(limit.saturating_mul(j - 1)).min(limit);
    let room = (limit - n).saturating_sub(cur) * p;
    let need_e = room.checked_div(prev).map_or(0, |fit| p.saturating_sub(fit));
    to_next + (j - 1) * p + need_e
}

/// True when the state no longer affects any decision at `now_ms`: both
/// counts are zero, or every request it counts has left the sliding window
/// (two windows on; one when the current window counted none).
pub fn is_idle(state: State, spec: &Spec, now_ms: u64) -> bool {
    let p = spec.period_ms();
    // An overshoot lasts a window more for each limit it holds.
    let owed = state.current.saturating_sub(1) / spec.capacity.max(1);
    let ends = if state.current == 0 {
        p
    } else {
        (2 + owed).saturating_mul(p)
    };
    (state.current == 0 && state.previous == 0) || now_ms >= state.window_ms.saturating_add(ends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{self, clock_step, Algorithm, Rate};
    use proptest::prelude::*;
    use std::time::Duration;

    fn spec(limit: u64, period_ms: u64) -> Spec {
        Spec::new(
            Algorithm::SlidingWindow,
            Rate {
                count: limit,
                period: Duration::from_millis(period_ms),
            },
            limit,
        )
    }

    #[test]
    fn an_overshoot_is_carried_into_the_windows_after_it() {
        let s = spec(5, 60_000);
        // 17 counted against 5: the next window's previous count is 5 and
        // its current 12, and the one after: 5 and 7, then 5 and 2.
        let st = State {
            window_ms: 0,
            current: 17,
            previous: 0,
        };
        let at = |n: u64| roll(Some(st), &s, n * 60_000);
        assert_eq!((at(1).previous, at(1).current), (5, 12));
        assert_eq!((at(3).previous, at(3).current), (5, 2));
        assert_eq!((at(4).previous, at(4).current), (2, 0));
        assert_eq!((at(5).previous, at(5).current), (0, 0));
        // Rolling in steps is rolling at once.
        assert_eq!(roll(Some(at(1)), &s, 3 * 60_000), at(3));
        assert!(!is_idle(st, &s, 4 * 60_000) && is_idle(st, &s, 5 * 60_000));
        // Refused until one fits, and the wait says exactly when: in the
        // third window on (current 2), when 5 × (p − e) ≤ (5 − 1 − 2) × p.
        let (_, g) = acquire(Some(st), &s, 30_000, 1);
        assert_eq!(g.granted, 0);
        let e = 60_000 - 2 * 60_000 / 5;
        assert_eq!(g.retry_after_ms, 30_000 + 2 * 60_000 + e);
        let (_, g) = acquire(Some(st), &s, 30_000 + g.retry_after_ms, 1);
        assert_eq!(g.granted, 1, "admitted at the wait's end: {g:?}");
        let (_, g) = acquire(Some(st), &s, 30_000 + 2 * 60_000 + e - 1, 1);
        assert_eq!(g.granted, 0, "not a millisecond earlier");
    }

    #[test]
    fn admits_the_limit_then_refuses_until_the_window_moves() {
        let s = spec(5, 60_000);
        let (mut st, mut now) = (None, 120_000);
        for i in 0..5 {
            let (n, g) = acquire(st, &s, now, 1);
            assert_eq!((g.granted, g.remaining), (1, 4 - i));
            st = Some(n);
        }
        let (n, g) = acquire(st, &s, now, 1);
        assert_eq!(g.granted, 0);
        // All 5 at the start of the window: the next window starts with
        // previous = 5, so one more fits once 1/5 of it has passed.
        assert_eq!(g.retry_after_ms, 60_000 + 12_000);
        now += g.retry_after_ms;
        let (_, g) = acquire(Some(n), &s, now, 1);
        assert_eq!(g.granted, 1);
    }

    #[test]
    fn a_window_two_periods_old_is_forgotten() {
        let s = spec(3, 1_000);
        let (st, _) = acquire(None, &s, 500, 3);
        assert!(!is_idle(st, &s, 1_999));
        assert!(is_idle(st, &s, 2_000));
        // Once the window counts none, only the previous one weighs, and
        // only until the window ends; with both at zero, nothing does.
        let turned = roll(Some(st), &s, 1_100);
        assert!(!is_idle(turned, &s, 1_999));
        assert!(is_idle(turned, &s, 2_000));
        assert!(is_idle(roll(None, &s, 2_100), &s, 2_100));
        assert_eq!(
            roll(Some(st), &s, 2_100),
            State {
                window_ms: 2_000,
                current: 0,
                previous: 0
            }
        );
        assert_eq!(
            roll(Some(st), &s, 1_100),
            State {
                window_ms: 1_000,
                current: 0,
                previous: 3
            }
        );
    }

    #[test]
    fn release_returns_to_the_current_window() {
        let s = spec(10, 1_000);
        let (st, g) = acquire(None, &s, 0, 6);
        assert_eq!(g.window_ms, 0);
        assert_eq!(release(Some(st), &s, 10, 4, g.window_ms).current, 2);
        assert_eq!(release(Some(st), &s, 10, 40, g.window_ms).current, 0);
    }

    #[test]
    fn release_goes_back_to_the_window_it_was_taken_from() {
        let s = spec(10, 1_000);
        let (st, g) = acquire(None, &s, 900, 6);
        let (st, g2) = acquire(Some(st), &s, 1_100, 3);
        assert_eq!((g.window_ms, g2.window_ms), (0, 1_000));
        // The window turned: the 6 now weigh as the previous window's.
        let st = release(Some(st), &s, 1_200, 4, g.window_ms);
        assert_eq!((st.previous, st.current), (2, 3));
        let st = release(Some(st), &s, 1_200, 1, g2.window_ms);
        assert_eq!((st.previous, st.current), (2, 2));
        // Two windows on, the first no longer counts: nothing to take back.
        let st = release(Some(st), &s, 2_100, 1, g.window_ms);
        assert_eq!((st.window_ms, st.previous, st.current), (2_000, 2, 0));
    }

    #[test]
    fn a_clock_going_back_re_anchors_instead_of_stalling() {
        let s = spec(5, 60_000);
        let (st, _) = acquire(None, &s, 3_600_000, 5);
        // An hour back: the full window is re-anchored to now's, not kept
        // "from the future" for an hour.
        let (st, g) = acquire(Some(st), &s, 1_000, 1);
        assert_eq!(g.granted, 0);
        assert_eq!((st.window_ms, st.current, st.previous), (0, 5, 0));
        assert_eq!(g.window_ms, 0);
        assert_eq!(g.retry_after_ms, 59_000 + 12_000);
        assert_eq!(acquire(Some(st), &s, 1_000 + g.retry_after_ms, 1).1.granted, 1);
    }

    #[test]
    fn a_clock_going_back_across_a_boundary_admits_nothing_more() {
        // 5 in the last millisecond of a window, refused 2 ms later in the
        // next one, then the clock steps back those 2 ms. Keeping the
        // previous count as the previous window's would weigh it at 1/60 000
        // there and admit 4 more; a monotonic clock 4 ms on admits none.
        let s = spec(5, 60_000);
        let (st, _) = acquire(None, &s, 59_999, 5);
        let (st, g) = acquire(Some(st), &s, 60_001, 1);
        assert_eq!(g.granted, 0);
        let (_, g) = acquire(Some(st), &s, 59_999, 5);
        assert_eq!(g.granted, 0);
    }

    #[test]
    fn a_grant_that_fills_the_window_says_when_the_next_fits() {
        // 5/min: 5 at the start of a window; the fifth grant (not only the
        // refusal after it) says when a sixth fits: 1/5 into the next one.
        let s = spec(5, 60_000);
        let (st, _) = acquire(None, &s, 120_000, 4);
        let (st, g) = acquire(Some(st), &s, 120_000, 1);
        assert_eq!((g.granted, g.remaining, g.retry_after_ms), (1, 0, 72_000));
        assert_eq!(acquire(Some(st), &s, 191_999, 1).1.granted, 0);
        assert_eq!(acquire(Some(st), &s, 192_000, 1).1.granted, 1);
    }

    proptest! {
        /// Never more than the limit in an aligned window; never more than
        /// twice the limit in any sliding window of one period.
        #[test]
        fn aligned_windows_hold_the_limit(
            limit in 1u64..50, period_ms in 10u64..10_000,
            steps in prop::collection::vec((0u64..3_000, 1u64..5), 1..200),
        ) {
            let s = spec(limit, period_ms);
            let (mut st, mut now) = (None, 0u64);
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (dt, want) in steps {
                now += dt;
                let (n, g) = acquire(st, &s, now, want);
                st = Some(n);
                if g.granted > 0 { admitted.push((now, g.granted)); }
            }
            for &(t, _) in &admitted {
                let start = t - t % period_ms;
                let in_aligned: u64 = admitted.iter().filter(|(u, _)| *u >= start && *u < start + period_ms).map(|(_, n)| n).sum();
                prop_assert!(in_aligned <= limit);
                let in_sliding: u64 = admitted.iter().filter(|(u, _)| *u + period_ms > t && *u <= t).map(|(_, n)| n).sum();
                prop_assert!(in_sliding <= 2 * limit);
            }
        }

    }

    proptest! {
        /// A request needing `need` at once, refused, fits exactly
        /// `retry_after_ms` later and not a millisecond earlier, whatever
        /// was charged above the limit before.
        #[test]
        fn a_need_says_exactly_when_it_fits(
            limit in 2u64..50, period_ms in 10u64..10_000,
            steps in prop::collection::vec((0u64..3_000, 1u64..5, 0u64..30), 1..40),
            need in 2u64..50,
        ) {
            let s = spec(limit, period_ms);
            let need = need.min(limit);
            let (mut st, mut now) = (None, 0u64);
            for (dt, want, charged) in steps {
                now += dt;
                if charged > 25 {
                    st = Some(match quota::charge(st.map(quota::State::Window), &s, now, charged - 25) {
                        quota::State::Window(w) => w,
                        other => panic!("{other:?}"),
                    });
                }
                let (n, g) = acquire_needing(st, &s, now, want.max(need), need);
                st = Some(n);
                if g.granted == 0 {
                    prop_assert!(g.retry_after_ms >= 1);
                    let (_, later) = acquire_needing(st, &s, now + g.retry_after_ms, need, need);
                    prop_assert_eq!(later.granted, need, "at +{}", g.retry_after_ms);
                    if g.retry_after_ms > 1 {
                        let (_, early) = acquire_needing(st, &s, now + g.retry_after_ms - 1, need, need);
                        prop_assert_eq!(early.granted, 0);
                    }
                }
            }
        }
    }

    proptest! {

        /// No stall: whatever the clock did (steps back of up to an hour
        /// included), two periods after the latest call a request fits, as
        /// it does with a monotonic clock (a window full at its start, with
        /// a limit of 1, lets the next request in two periods later).
        #[test]
        fn a_clock_step_back_never_stalls_beyond_two_periods(
            limit in 1u64..50, period_ms in 10u64..100_000,
            steps in prop::collection::vec((clock_step(), 0u64..60), 1..80),
        ) {
            let s = spec(limit, period_ms);
            let (mut st, mut now) = (None, 10_000_000u64);
            for (dt, want) in steps {
                now = now.saturating_add_signed(dt);
                let (n, g) = acquire(st, &s, now, want);
                st = Some(n);
                prop_assert!(g.retry_after_ms <= 2 * period_ms);
                prop_assert_eq!(acquire(st, &s, now + 2 * period_ms, 1).1.granted, 1);
            }
        }

        /// No over-admission: over any clock sequence, the requests kept
        /// (granted less given back, to the windows they came from) never
        /// exceed what a monotonic clock moving forward by the same total
        /// allows: the limit, plus the limit per period of forward movement
        /// (the weighted estimate falls by at most limit/period per ms).
        #[test]
        fn clock_steps_never_over_admit(
            limit in 1u64..50, period_ms in 10u64..100_000,
            steps in prop::collection::vec((clock_step(), 0u64..60, 0u64..4), 1..100),
        ) {
            let s = spec(limit, period_ms);
            let (mut st, mut now) = (None, 10_000_000u64);
            let (mut kept, mut forward) = (0u64, 0u64);
            let mut held: Vec<(u64, u64)> = Vec::new(); // (window, tokens)
            for (i, (dt, want, back)) in steps.into_iter().enumerate() {
                if i > 0 {
                    forward += u64::try_from(dt).unwrap_or(0);
                    now = now.saturating_add_signed(dt);
                }
                let unspent = match held.pop() {
                    Some((window_ms, n)) => {
                        let tokens = back.min(n);
                        if n > tokens { held.push((window_ms, n - tokens)); }
                        quota::Unspent { tokens, window_ms, ..quota::Unspent::default() }
                    }
                    None => quota::Unspent::default(),
                };
                let (n, g) = quota::acquire_returning(st.map(quota::State::Window), &s, now, want, unspent);
                let quota::State::Window(n) = n else { panic!("not a window") };
                st = Some(n);
                kept = kept - unspent.tokens + g.granted;
                if g.granted > 0 { held.insert(0, (g.window_ms, g.granted)); }
                prop_assert!(
                    u128::from(kept) * u128::from(period_ms)
                        <= u128::from(limit) * u128::from(period_ms) + u128::from(limit) * u128::from(forward),
                    "kept {} after {} ms forward", kept, forward
                );
            }
        }
    }
}
