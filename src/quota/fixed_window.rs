//! Fixed window: at most `limit` requests per window, windows aligned to
//! multiples of the period since the Unix epoch. This is the counting
//! envoyproxy/ratelimit does (`floor(now / unit) × unit`), kept so a fleet
//! switching from it sees the same resets: a day starts at 00:00 UTC, a
//! week on a Thursday (the epoch's weekday). In `gateway.toml` a week and
//! a month follow the UTC calendar instead ([`super::Calendar`]): Monday
//! 00:00, and the 1st 00:00, a window of the month's own length.
//!
//! Accuracy: exact within a window; across a boundary a client may send
//! `limit` at the end of one window and `limit` at the start of the next
//! (the classic 2× burst, which the sliding window halves). Refused calls
//! are not counted, so a blocked client does not push its own reset away.
//!
//! A count above the limit (costs charged past it: a debt) is not forgiven
//! when its window ends: each window that turns pays off `limit` of it, and
//! the rest is counted in the next ([`roll`]).

use super::{Grant, Spec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Start of the window counted, a multiple of the period.
    pub window_ms: u64,
    pub count: u64,
}

/// The state as seen from `now_ms`: a new window starts at zero, less
/// the overshoot still owed (a count above the limit carries into the
/// windows after it, `limit` paid off by each).
///
/// A state from a later window than `now_ms`'s (the clock went back) is
/// re-anchored to `now_ms`'s window with its count, so it neither waits for
/// the clock to catch up (no stall beyond one period) nor is forgotten (no
/// over-admission): the count leaves when `now_ms`'s window ends.
pub fn roll(state: Option<State>, spec: &Spec, now_ms: u64) -> State {
    let (start, _) = spec.calendar().window(now_ms, spec.period_ms());
    match state {
        Some(s) if s.window_ms == start => s,
        Some(s) if s.window_ms > start => State {
            window_ms: start,
            count: s.count,
        },
        Some(s) => {
            let turns = spec.calendar().turns(s.window_ms, start, spec.period_ms());
            State {
                window_ms: start,
                count: s.count.saturating_sub(spec.capacity.saturating_mul(turns)),
            }
        }
        None => State {
            window_ms: start,
            count: 0,
        },
    }
}

/// Takes up to `want` requests' worth at `now_ms`.
pub fn acquire(state: Option<State>, spec: &Spec, now_ms: u64, want: u64) -> (State, Grant) {
    acquire_needing(state, spec, now_ms, want, 1)
}

/// [`acquire`], granting nothing unless `need` fit (0 and 1: any); a
/// refusal then waits for the next window, where they do (`need` is at
/// most the limit).
pub fn acquire_needing(state: Option<State>, spec: &Spec, now_ms: u64, want: u64, need: u64) -> (State, Grant) {
    let limit = spec.capacity;
    let mut s = roll(state, spec, now_ms);
    let room = limit.saturating_sub(s.count);
    let granted = if room >= need { want.min(room) } else { 0 };
    s.count += granted;
    let remaining = limit.saturating_sub(s.count);
    let reset_ms = window_end(spec, s.window_ms).saturating_sub(now_ms).max(1);
    let short = granted == 0 && want > 0 && remaining < need;
    let grant = Grant {
        granted,
        remaining,
        reset_ms,
        // Nothing fits before the next window, and everything does then.
        retry_after_ms: if remaining == 0 || short { reset_ms } else { 0 },
        window_ms: s.window_ms,
        reserved: 0,
        owed: s.count.saturating_sub(limit),
    };
    (s, grant)
}

/// Gives back `unused` requests' worth taken in the window starting at
/// `window_ms`, while that window is still the one counted (or a later one,
/// re-anchored into it); a window that has ended no longer matters.
pub fn release(state: Option<State>, spec: &Spec, now_ms: u64, unused: u64, window_ms: u64) -> State {
    let mut s = roll(state, spec, now_ms);
    if window_ms >= s.window_ms {
        s.count = s.count.saturating_sub(unused);
    }
    s
}

/// True when the state no longer affects any decision at `now_ms`: it
/// counts nothing, or its window has ended with nothing owed beyond it.
pub fn is_idle(state: State, spec: &Spec, now_ms: u64) -> bool {
    state.count == 0 || (now_ms >= window_end(spec, state.window_ms) && roll(Some(state), spec, now_ms).count == 0)
}

/// Where the window starting at `start_ms` ends.
fn window_end(spec: &Spec, start_ms: u64) -> u64 {
    spec.calendar().window(start_ms, spec.period_ms()).1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{self, clock_step, Algorithm, Rate};
    use proptest::prelude::*;
    use std::time::Duration;

    fn spec(limit: u64, period_ms: u64) -> Spec {
        Spec::new(
            Algorithm::FixedWindow,
            Rate {
                count: limit,
                period: Duration::from_millis(period_ms),
            },
            limit,
        )
    }

    #[test]
    fn admits_the_limit_then_refuses_until_the_window_ends() {
        let s = spec(5, 60_000);
        let (mut st, now) = (None, 130_000);
        for i in 0..5 {
            let (n, g) = acquire(st, &s, now, 1);
            assert_eq!((g.granted, g.remaining, g.window_ms), (1, 4 - i, 120_000));
            st = Some(n);
        }
        let (n, g) = acquire(st, &s, now, 1);
        assert_eq!((g.granted, g.retry_after_ms, g.reset_ms), (0, 50_000, 50_000));
        // Refused calls are not counted.
        assert_eq!(n.count, 5);
        assert_eq!(acquire(Some(n), &s, 179_999, 1).1.granted, 0);
        let (_, g) = acquire(Some(n), &s, 180_000, 5);
        assert_eq!((g.granted, g.remaining, g.window_ms), (5, 0, 180_000));
    }

    /// A week and a month follow the UTC calendar: the window starts on
    /// Monday, or the 1st, and a refusal waits for the next one exactly.
    #[test]
    fn a_charge_counts_past_the_limit_and_a_need_waits_for_the_next_window() {
        let s = spec(10, 60_000);
        let st = quota::charge(None, &s, 1_000, 14);
        let quota::State::Fixed(st) = st else { panic!() };
        let (st, g) = acquire_needing(Some(st), &s, 2_000, 5, 5);
        assert_eq!((g.granted, g.remaining, g.owed), (0, 0, 4));
        assert_eq!(g.retry_after_ms, 58_000, "the next window");
        let (_, g) = acquire_needing(Some(st), &s, 60_000, 5, 5);
        assert_eq!((g.granted, g.owed), (5, 0), "a window's debt ends with it");
        let (st, g) = acquire_needing(None, &s, 1_000, 8, 8);
        assert_eq!(g.granted, 8);
        let (_, g) = acquire_needing(Some(st), &s, 1_000, 3, 3);
        assert_eq!(
            (g.granted, g.remaining, g.retry_after_ms),
            (0, 2, 59_000),
            "2 left, 3 needed"
        );
    }

    fn fixed(st: quota::State) -> Option<State> {
        match st {
            quota::State::Fixed(f) => Some(f),
            _ => None,
        }
    }

    #[test]
    fn an_overshoot_is_carried_into_the_windows_after_it() {
        let s = spec(10, 60_000);
        // 35 counted against 10: 25 owed when the window turns.
        let st = quota::charge(None, &s, 1_000, 35);
        let (st2, g) = acquire(fixed(st), &s, 61_000, 1);
        assert_eq!((g.granted, g.owed, st2.count), (0, 15, 25), "{g:?}");
        assert_eq!(g.retry_after_ms, 59_000, "refused to the window's end");
        assert!(!is_idle(st2, &s, 121_000), "still owed after its window");
        // Two more windows pay off 20: 5 counted in the fourth.
        let (st3, g) = acquire(Some(st2), &s, 181_000, 1);
        assert_eq!((g.granted, g.remaining, st3.count), (1, 4, 6));
        // Within a window's limit, nothing carries (as before).
        let (st4, _) = acquire(None, &s, 0, 10);
        assert_eq!(roll(Some(st4), &s, 60_000).count, 0);
        assert!(is_idle(st4, &s, 60_000));
        // A month's overshoot carries into the next month.
        let m = Spec::new(Algorithm::FixedWindow, "1000/month".parse::<Rate>().unwrap(), 1000);
        let dec = 1_796_185_800_000; // 2026-12-02
        let st = fixed(quota::charge(None, &m, dec, 2500));
        let jan = dec + 31 * 86_400_000;
        assert_eq!(roll(st, &m, jan).count, 1500);
        assert_eq!(roll(st, &m, jan + 31 * 86_400_000).count, 500);
    }

    #[test]
    fn a_week_and_a_month_follow_the_calendar() {
        use crate::clock::days_from_civil;
        use crate::quota::calendar::{MONTH_MS, WEEK_MS};
        let day = 86_400_000;
        // 2026-12-02T04:30:00Z, a Wednesday.
        let now = 1_796_185_800_000;
        let month = spec(2, MONTH_MS);
        let (st, _) = acquire(None, &month, now, 2);
        let (_, g) = acquire(Some(st), &month, now, 1);
        assert_eq!(st.window_ms, days_from_civil(2026, 12, 1) * day);
        assert_eq!(g.retry_after_ms, days_from_civil(2027, 1, 1) * day - now);
        assert_eq!(month.window_secs_at(now), 31 * 86_400);
        // The next month starts afresh.
        let (_, g) = acquire(Some(st), &month, days_from_civil(2027, 1, 1) * day, 2);
        assert_eq!(g.granted, 2);
        let week = spec(1, WEEK_MS);
        let (st, g) = acquire(None, &week, now, 1);
        assert_eq!(st.window_ms, days_from_civil(2026, 11, 30) * day, "Monday");
        assert_eq!(g.reset_ms, days_from_civil(2026, 12, 7) * day - now);
        assert!(!is_idle(st, &week, days_from_civil(2026, 12, 6) * day));
        assert!(is_idle(st, &week, days_from_civil(2026, 12, 7) * day));
        // The Envoy rate limit service's week stays envoyproxy/ratelimit's.
        let envoy = week.epoch_windows();
        let (st, _) = acquire(None, &envoy, now, 1);
        assert_eq!((st.window_ms / day + 3) % 7, 3, "a Thursday");
    }

    #[test]
    fn windows_are_epoch_aligned_like_envoyproxy_ratelimit() {
        // A day resets at 00:00 UTC: 2026-11-30T17:00:00Z is 17 h into it.
        let day = spec(10, 86_400_000);
        let now = 1_796_058_000_000;
        let (_, g) = acquire(None, &day, now, 1);
        assert_eq!(g.reset_ms, 7 * 3_600_000);
        assert_eq!(g.window_ms % 86_400_000, 0);
    }

    #[test]
    fn release_returns_to_its_own_window_only() {
        let s = spec(10, 1_000);
        let (st, g) = acquire(None, &s, 900, 6);
        assert_eq!(release(Some(st), &s, 950, 4, g.window_ms).count, 2);
        assert_eq!(release(Some(st), &s, 950, 40, g.window_ms).count, 0);
        // The window ended: giving back changes nothing.
        assert_eq!(release(Some(st), &s, 1_100, 4, g.window_ms).count, 0);
        let (st2, _) = acquire(Some(st), &s, 1_100, 3);
        assert_eq!(release(Some(st2), &s, 1_200, 3, g.window_ms).count, 3);
    }

    #[test]
    fn a_clock_going_back_keeps_the_count_in_the_current_window() {
        let s = spec(5, 60_000);
        let (st, _) = acquire(None, &s, 3_600_000, 5);
        let (st, g) = acquire(Some(st), &s, 1_000, 1);
        assert_eq!(g.granted, 0);
        assert_eq!((st.window_ms, st.count), (0, 5));
        assert_eq!(g.retry_after_ms, 59_000);
        assert_eq!(acquire(Some(st), &s, 60_000, 1).1.granted, 1);
    }

    #[test]
    fn idle_once_the_window_ends() {
        let s = spec(3, 1_000);
        let (st, _) = acquire(None, &s, 500, 1);
        assert!(!is_idle(st, &s, 999));
        assert!(is_idle(st, &s, 1_000));
        assert!(is_idle(roll(None, &s, 10), &s, 10));
    }

    proptest! {
        /// Never more than the limit in an aligned window (the exact retry
        /// is `quota::tests::every_full_grant_says_exactly_when_to_retry`).
        #[test]
        fn windows_hold_the_limit(
            limit in 1u64..50, period_ms in 10u64..100_000,
            steps in prop::collection::vec((0u64..3_000, 0u64..5), 1..200),
        ) {
            let s = spec(limit, period_ms);
            let (mut st, mut now) = (None, 10_000_000u64);
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (dt, want) in steps {
                now += dt;
                let (n, g) = acquire(st, &s, now, want);
                st = Some(n);
                if g.granted > 0 { admitted.push((now, g.granted)); }
            }
            for &(t, _) in &admitted {
                let start = t - t % period_ms;
                let n: u64 = admitted.iter().filter(|(u, _)| *u >= start && *u < start + period_ms).map(|(_, n)| n).sum();
                prop_assert!(n <= limit);
            }
        }

        /// No stall: whatever the clock did, one period after the latest
        /// call a request fits.
        #[test]
        fn a_clock_step_back_never_stalls_beyond_one_period(
            limit in 1u64..50, period_ms in 10u64..100_000,
            steps in prop::collection::vec((clock_step(), 0u64..60), 1..80),
        ) {
            let s = spec(limit, period_ms);
            let (mut st, mut now) = (None, 10_000_000u64);
            for (dt, want) in steps {
                now = now.saturating_add_signed(dt);
                let (n, g) = acquire(st, &s, now, want);
                st = Some(n);
                prop_assert!(g.retry_after_ms <= period_ms);
                prop_assert_eq!(acquire(st, &s, now + period_ms, 1).1.granted, 1);
            }
        }

        /// No over-admission from a step back: over any clock sequence,
        /// what is kept (granted less given back) never exceeds the limit
        /// once, plus once per window boundary the clock crossed going
        /// forward. A step back alone frees nothing: the count comes along
        /// into the earlier window. (Crossing the same boundary forward
        /// again does start a fresh window, as it would for a clock that
        /// never stepped back; envoyproxy/ratelimit, which keys by the
        /// window, also gives a step back a fresh, empty window.)
        #[test]
        fn clock_steps_never_over_admit(
            limit in 1u64..50, period_ms in 10u64..100_000,
            steps in prop::collection::vec((clock_step(), 0u64..60, 0u64..4), 1..100),
        ) {
            let s = spec(limit, period_ms);
            let (mut st, mut now) = (None, 10_000_000u64);
            let (mut kept, mut crossed) = (0u64, 0u64);
            let mut held: Vec<(u64, u64)> = Vec::new();
            for (i, (dt, want, back)) in steps.into_iter().enumerate() {
                if i > 0 {
                    let before = now / period_ms;
                    now = now.saturating_add_signed(dt);
                    crossed += (now / period_ms).saturating_sub(before);
                }
                let unspent = match held.pop() {
                    Some((window_ms, n)) => {
                        let tokens = back.min(n);
                        if n > tokens { held.push((window_ms, n - tokens)); }
                        quota::Unspent { tokens, window_ms, ..quota::Unspent::default() }
                    }
                    None => quota::Unspent::default(),
                };
                let (n, g) = quota::acquire_returning(st.map(quota::State::Fixed), &s, now, want, unspent);
                let quota::State::Fixed(n) = n else { panic!("not a fixed window") };
                st = Some(n);
                kept = kept - unspent.tokens + g.granted;
                if g.granted > 0 { held.insert(0, (g.window_ms, g.granted)); }
                prop_assert!(kept <= limit * (crossed + 1), "kept {} after {} boundaries", kept, crossed);
            }
        }
    }
}
