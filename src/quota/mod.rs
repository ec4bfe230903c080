//! The vocabulary of quotas, on the ground floor of the crate.
//!
//! This room holds pure values and math only: no clock reads, no I/O. Time
//! comes in as `now_ms` arguments. The config layer parses rates into
//! [`Rate`]; the lease core and every store share [`Spec`], [`Grant`] and the
//! algorithms, so an embedded store and Redis compute the same answers.

pub mod calendar;
pub mod fair;
pub mod fixed_window;
pub mod slice;
pub mod sliding_window;
pub mod token_bucket;

pub use calendar::Calendar;
pub use slice::Share;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Which algorithm a limit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Bursts up to a capacity, refilled at a steady rate.
    TokenBucket,
    /// At most N per period, over a weighted sliding window.
    SlidingWindow,
    /// At most N per epoch-aligned window: envoyproxy/ratelimit's counting,
    /// for the Envoy rate limit service.
    FixedWindow,
    /// At most N requests in flight at once: slots held from admission to
    /// the end of the response, never tokens. The count is the limit's
    /// `max` (per one second, for the headers' sake); a store holds them by
    /// [`crate::store::QuotaStore::hold_slots`], and grants no token of it.
    Concurrency,
}

crate::spelling::spellings!(Algorithm {
    TokenBucket => "token_bucket",
    SlidingWindow => "sliding_window",
    FixedWindow => "fixed_window",
    Concurrency => "concurrency",
});

/// Everything a store needs to decide for one key: the algorithm and its
/// parameters. One store serves many limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Spec {
    pub algorithm: Algorithm,
    /// Tokens (or requests) added per `period`.
    pub count: u64,
    period_ms: u64,
    /// Token bucket: the burst. Sliding window: the limit (= count).
    pub capacity: u64,
    /// `count` and `capacity` before [`Spec::slice`] cut this region's
    /// share out of them (equal to them when unsliced): what another
    /// region needs to compute its own slice of the same key exactly.
    whole_count: u64,
    whole_capacity: u64,
    /// A fixed window's layout: a week or a month (30 days) follows the
    /// UTC calendar ([`Calendar::of_period`]), any other period the
    /// epoch. Always the epoch for the other algorithms.
    calendar: Calendar,
}

/// Largest `capacity × period_ms`: values stay exact in a double, as they
/// must for the Redis scripts.
pub const MAX_UNITS: u64 = 1 << 53;

impl Spec {
    pub fn new(algorithm: Algorithm, rate: Rate, capacity: u64) -> Spec {
        let period_ms = u64::try_from(rate.period.as_millis()).unwrap_or(u64::MAX).max(1);
        let (count, capacity) = (rate.count.max(1), capacity.max(1));
        let calendar = match algorithm {
            Algorithm::FixedWindow => Calendar::of_period(period_ms),
            _ => Calendar::Epoch,
        };
        Spec {
            algorithm,
            count,
            period_ms,
            capacity,
            whole_count: count,
            whole_capacity: capacity,
            calendar,
        }
    }

    /// This spec with windows aligned to the epoch whatever its period:
    /// the Envoy rate limit service's fixed windows, which count a week
    /// from a Thursday and a month as 30 days, as envoyproxy/ratelimit does.
    pub fn epoch_windows(self) -> Spec {
        Spec {
            calendar: Calendar::Epoch,
            ..self
        }
    }

    /// How its windows are laid out (a fixed window's).
    pub fn calendar(&self) -> Calendar {
        self.calendar
    }

    /// This region's slice of the quota: `share` of the count and of the
    /// capacity, rounded down (so the regions' slices never add up to more
    /// than the whole) but at least 1. The whole is remembered
    /// ([`Spec::whole`]). Slicing a sliced spec slices the whole again.
    pub fn slice(&self, share: Share) -> Spec {
        Spec {
            count: share.of(self.whole_count),
            capacity: share.of(self.whole_capacity),
            ..*self
        }
    }

    /// The quota before [`Spec::slice`]: every region's slice of a key is
    /// computed from this.
    pub fn whole(&self) -> Spec {
        Spec {
            count: self.whole_count,
            capacity: self.whole_capacity,
            ..*self
        }
    }

    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// Sub-bucket `index` of `shards`: its share of the count and the
    /// capacity, the remainders going to the first sub-buckets, so the
    /// shares add up to the whole exactly.
    pub fn share(&self, index: u32, shards: u32) -> Spec {
        let n = u64::from(shards.max(1));
        let i = u64::from(index) % n;
        let part = |total: u64| (total / n + u64::from(i < total % n)).max(1);
        Spec {
            count: part(self.count),
            capacity: part(self.capacity),
            whole_count: part(self.whole_count),
            whole_capacity: part(self.whole_capacity),
            ..*self
        }
    }

    /// `1/instances` of this quota (rounded up, at least 1): what one
    /// instance of a fleet may admit on its own while the store is away.
    pub fn divided(&self, instances: u64) -> Spec {
        let n = instances.max(1);
        Spec {
            count: self.count.div_ceil(n).max(1),
            capacity: self.capacity.div_ceil(n).max(1),
            ..*self
        }
    }

    /// The window advertised in `RateLimit-Policy`, in whole seconds (≥ 1),
    /// at `now_ms` (Unix milliseconds): a calendar window's is the length
    /// of the current one (28 to 31 days for a month).
    pub fn window_secs_at(&self, now_ms: u64) -> u64 {
        self.window_secs(|| now_ms)
    }

    /// [`Spec::window_secs_at`], reading the time only for a calendar
    /// window (an epoch window's length needs none).
    #[inline]
    pub fn window_secs(&self, now_ms: impl FnOnce() -> u64) -> u64 {
        if self.calendar == Calendar::Epoch {
            return self.period_ms.div_ceil(1000).max(1);
        }
        let (start, end) = self.calendar.window(now_ms(), self.period_ms);
        (end - start).div_ceil(1000).max(1)
    }
}

/// A store's answer to an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    /// Tokens granted, `0..=want`.
    pub granted: u64,
    /// Tokens left in the shared bucket after this grant.
    pub remaining: u64,
    /// Milliseconds until the quota is whole again.
    pub reset_ms: u64,
    /// Whenever no whole token is left after this grant (`remaining == 0`),
    /// granted or not: the exact milliseconds until one more token (one
    /// more request) fits, so a client that waits this long is admitted and
    /// one that comes back a millisecond earlier is not. 0 while
    /// `remaining > 0`.
    pub retry_after_ms: u64,
    /// Sliding window: the start of the window (on the store's clock) in
    /// which the granted tokens were counted; unspent ones go back to it
    /// ([`Unspent::window_ms`]). Token bucket: 0.
    pub window_ms: u64,
    /// Token bucket, asked to reserve ([`acquire_or_reserve`]) when no
    /// whole token was left: tokens taken from the refill to come, granted
    /// none now. The first may be spent after `retry_after_ms`, the k-th
    /// (from 0) [`token_bucket::reserved_ready_ms`] after it. 0 otherwise.
    pub reserved: u64,
    /// What the key owes beyond its quota after this call: a token
    /// bucket's level below zero (charged costs, reservations), a window's
    /// count above its limit (charged costs), in tokens.
    pub owed: u64,
}

/// What a lease brings to the store besides its ask: unspent leased tokens
/// going back, and the window they were taken in (`Grant::window_ms`; 0
/// for a token bucket); costs settled above their reserve since the last
/// call (`charge`); and, on an acquire, the fewest tokens worth granting
/// (`need`: the asking request's reserve).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unspent {
    pub tokens: u64,
    pub window_ms: u64,
    /// Tokens spent after the fact (a response that cost more than its
    /// reserve): taken before the grant even when the quota has none left,
    /// which leaves the key owing ([`charge`]). A release ignores it.
    pub charge: u64,
    /// An acquire grants nothing unless at least this many tokens fit (0
    /// and 1: any), and a refusal's `retry_after_ms` is the wait until they
    /// do. A release ignores it.
    pub need: u64,
}

/// The stored state of one key, whichever the algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Bucket(token_bucket::State),
    Window(sliding_window::State),
    Fixed(fixed_window::State),
}

/// Acquire for any algorithm. A state of the other algorithm (a limit whose
/// algorithm was changed) is treated as absent.
pub fn acquire(state: Option<State>, spec: &Spec, now_ms: u64, want: u64) -> (State, Grant) {
    acquire_or_reserve(state, spec, now_ms, want, 1, false)
}

/// [`acquire`]; with `reserve`, a token bucket with no whole token left
/// reserves tokens of its refill to come instead
/// ([`token_bucket::acquire_or_reserve`]). The windows never reserve: a
/// window's quota comes back all at once (fixed) or a little at a time
/// with nobody's name on it (sliding).
///
/// Nothing is granted unless `need` tokens fit (0 and 1: any); a
/// refusal's `retry_after_ms` is the wait until they do.
pub fn acquire_or_reserve(
    state: Option<State>,
    spec: &Spec,
    now_ms: u64,
    want: u64,
    need: u64,
    reserve: bool,
) -> (State, Grant) {
    match spec.algorithm {
        Algorithm::TokenBucket => {
            let prior = match state {
                Some(State::Bucket(b)) => Some(b),
                _ => None,
            };
            let (s, g) = token_bucket::acquire_or_reserve(prior, spec, now_ms, want, need, reserve);
            (State::Bucket(s), g)
        }
        Algorithm::SlidingWindow => {
            let prior = match state {
                Some(State::Window(w)) => Some(w),
                _ => None,
            };
            let (s, g) = sliding_window::acquire_needing(prior, spec, now_ms, want, need);
            (State::Window(s), g)
        }
        Algorithm::FixedWindow => {
            let prior = match state {
                Some(State::Fixed(w)) => Some(w),
                _ => None,
            };
            let (s, g) = fixed_window::acquire_needing(prior, spec, now_ms, want, need);
            (State::Fixed(s), g)
        }
        // Slots are never acquired as tokens: a store asked anyway grants
        // nothing, and the key stays as it was.
        Algorithm::Concurrency => (
            state.unwrap_or(State::Fixed(fixed_window::State { window_ms: 0, count: 0 })),
            Grant {
                retry_after_ms: 1_000,
                ..Grant::default()
            },
        ),
    }
}

/// Release for any algorithm: gives `unspent` back (see the algorithms'
/// `release`).
pub fn release(state: Option<State>, spec: &Spec, now_ms: u64, unspent: Unspent) -> State {
    match (spec.algorithm, state) {
        // Nothing of a concurrency limit is held as tokens.
        (Algorithm::Concurrency, state) => {
            state.unwrap_or(State::Fixed(fixed_window::State { window_ms: 0, count: 0 }))
        }
        (Algorithm::TokenBucket, Some(State::Bucket(b))) => {
            State::Bucket(token_bucket::release(Some(b), spec, now_ms, unspent.tokens))
        }
        (Algorithm::TokenBucket, _) => State::Bucket(token_bucket::release(None, spec, now_ms, unspent.tokens)),
        (Algorithm::SlidingWindow, Some(State::Window(w))) => State::Window(sliding_window::release(
            Some(w),
            spec,
            now_ms,
            unspent.tokens,
            unspent.window_ms,
        )),
        (Algorithm::SlidingWindow, _) => State::Window(sliding_window::release(
            None,
            spec,
            now_ms,
            unspent.tokens,
            unspent.window_ms,
        )),
        (Algorithm::FixedWindow, state) => {
            let prior = match state {
                Some(State::Fixed(w)) => Some(w),
                _ => None,
            };
            State::Fixed(fixed_window::release(
                prior,
                spec,
                now_ms,
                unspent.tokens,
                unspent.window_ms,
            ))
        }
    }
}

/// Gives `unspent` back (when there is any), then takes up to `want`: what
/// a store does in one atomic step when a lease returns expired tokens and
/// asks for new ones in the same call.
pub fn acquire_returning(
    state: Option<State>,
    spec: &Spec,
    now_ms: u64,
    want: u64,
    unspent: Unspent,
) -> (State, Grant) {
    reserve_returning(state, spec, now_ms, want, unspent, false)
}

/// [`acquire_returning`], reserving as [`acquire_or_reserve`] does when
/// `reserve` is set.
pub fn reserve_returning(
    state: Option<State>,
    spec: &Spec,
    now_ms: u64,
    want: u64,
    unspent: Unspent,
    reserve: bool,
) -> (State, Grant) {
    let state = if unspent.tokens > 0 {
        Some(release(state, spec, now_ms, unspent))
    } else {
        state
    };
    let state = if unspent.charge > 0 {
        Some(charge(state, spec, now_ms, unspent.charge))
    } else {
        state
    };
    acquire_or_reserve(state, spec, now_ms, want, unspent.need, reserve)
}

/// Takes `tokens` spent after the fact (a cost settled above its
/// reserve), whether or not the quota has them: a token bucket's level goes
/// below zero by all of them (never forgiven), a
/// window's count above its limit. The key owes them, and is refused until
/// the refill or the window pays them off.
pub fn charge(state: Option<State>, spec: &Spec, now_ms: u64, tokens: u64) -> State {
    match spec.algorithm {
        Algorithm::TokenBucket => {
            let prior = match state {
                Some(State::Bucket(b)) => Some(b),
                _ => None,
            };
            State::Bucket(token_bucket::charge(prior, spec, now_ms, tokens))
        }
        Algorithm::SlidingWindow => {
            let prior = match state {
                Some(State::Window(w)) => Some(w),
                _ => None,
            };
            let mut s = sliding_window::roll(prior, spec, now_ms);
            s.current = s.current.saturating_add(tokens);
            State::Window(s)
        }
        Algorithm::FixedWindow => {
            let prior = match state {
                Some(State::Fixed(w)) => Some(w),
                _ => None,
            };
            let mut s = fixed_window::roll(prior, spec, now_ms);
            s.count = s.count.saturating_add(tokens);
            State::Fixed(s)
        }
        Algorithm::Concurrency => state.unwrap_or(State::Fixed(fixed_window::State { window_ms: 0, count: 0 })),
    }
}

/// True when forgetting the state changes no future decision.
pub fn is_idle(state: &State, spec: &Spec, now_ms: u64) -> bool {
    match state {
        State::Bucket(b) => token_bucket::is_idle(*b, spec, now_ms),
        State::Window(w) => sliding_window::is_idle(*w, spec, now_ms),
        State::Fixed(w) => fixed_window::is_idle(*w, spec, now_ms),
    }
}

/// Property tests: a clock step, mostly forward, often back, sometimes by
/// up to an hour either way.
#[cfg(test)]
pub(crate) fn clock_step() -> impl proptest::strategy::Strategy<Value = i64> {
    use proptest::prelude::*;
    prop_oneof![
        4 => 0i64..5_000,
        2 => -5_000i64..0,
        1 => -3_600_000i64..3_600_000,
    ]
}

/// "N requests per period", as written in `gateway.toml` (`"100/min"`, `"10/30s"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    /// How many requests the period allows; never zero.
    pub count: u64,
    /// The period; never zero.
    pub period: Duration,
}

/// Why a rate string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("expected \"N/period\" such as \"100/min\", \"10/30s\", \"5/h\" or \"1000/day\"")]
    Shape,
    #[error("the count {0:?} is not a whole number")]
    Count(String),
    #[error("the count must be at least 1")]
    ZeroCount,
    #[error("unknown period {0:?}: use s, min, h, day, week, month, or a duration such as 30s, 5m, 500ms")]
    Period(String),
    #[error("the period must be longer than zero")]
    ZeroPeriod,
}

impl Rate {
    /// Requests per second, for summaries and sizing.
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.period.as_secs_f64()
    }
}

impl FromStr for Rate {
    type Err = RateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (count, period) = s.split_once('/').ok_or(RateError::Shape)?;
        let count = count.trim();
        let count: u64 = count
            .replace('_', "")
            .parse()
            .map_err(|_| RateError::Count(count.to_string()))?;
        if count == 0 {
            return Err(RateError::ZeroCount);
        }
        let period = parse_period(period.trim())?;
        if period.is_zero() {
            return Err(RateError::ZeroPeriod);
        }
        Ok(Rate { count, period })
    }
}

/// A period is a unit (`s`, `min`, ...) with an optional leading multiplier (`30s`, `5m`).
fn parse_period(s: &str) -> Result<Duration, RateError> {
    let bad = || RateError::Period(s.to_string());
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let multiplier: u64 = if number.is_empty() {
        1
    } else {
        number.parse().map_err(|_| bad())?
    };
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "s" | "sec" | "second" | "seconds" => 1_000,
        "m" | "min" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        "w" | "wk" | "week" | "weeks" => calendar::WEEK_MS,
        "mo" | "month" | "months" => calendar::MONTH_MS,
        _ => return Err(bad()),
    };
    multiplier
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(bad)
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.period.as_millis();
        let (n, unit) = if ms == u128::from(calendar::MONTH_MS) {
            (1, "month")
        } else if ms == u128::from(calendar::WEEK_MS) {
            (1, "week")
        } else if ms.is_multiple_of(86_400_000) {
            (ms / 86_400_000, "day")
        } else if ms.is_multiple_of(3_600_000) {
            (ms / 3_600_000, "h")
        } else if ms.is_multiple_of(60_000) {
            (ms / 60_000, "min")
        } else if ms.is_multiple_of(1_000) {
            (ms / 1_000, "s")
        } else {
            (ms, "ms")
        };
        if n == 1 {
            write!(f, "{}/{unit}", self.count)
        } else {
            write!(f, "{}/{n}{unit}", self.count)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Any of the three algorithms at a random quota.
    fn any_spec() -> impl Strategy<Value = Spec> {
        (
            prop_oneof![
                Just(Algorithm::TokenBucket),
                Just(Algorithm::SlidingWindow),
                Just(Algorithm::FixedWindow),
            ],
            // Small quotas run dry in a history; large ones as the
            // per-algorithm tests had them.
            prop_oneof![1u64..50, 50u64..1_000],
            10u64..100_000,
            1u64..100,
        )
            .prop_map(|(algorithm, count, period_ms, capacity)| {
                let rate = Rate {
                    count,
                    period: Duration::from_millis(period_ms),
                };
                let capacity = if algorithm == Algorithm::TokenBucket {
                    capacity
                } else {
                    count
                };
                Spec::new(algorithm, rate, capacity)
            })
    }

    proptest! {
        /// For every algorithm, whenever a grant leaves no whole token
        /// (refused or not), over any history of requests and clock steps
        /// back and forth: coming back exactly retry_after later is
        /// admitted, a millisecond earlier is not; with room left, no wait
        /// is told.
        #[test]
        fn every_full_grant_says_exactly_when_to_retry(
            s in any_spec(),
            steps in prop::collection::vec((clock_step(), 0u64..20), 1..80),
        ) {
            let (mut state, mut now) = (None, 10_000_000u64);
            for (dt, want) in steps {
                now = now.saturating_add_signed(dt);
                let (st, g) = acquire(state, &s, now, want);
                state = Some(st);
                if g.remaining > 0 {
                    prop_assert_eq!(g.retry_after_ms, 0);
                    continue;
                }
                prop_assert!(g.retry_after_ms >= 1);
                let (_, later) = acquire(state, &s, now + g.retry_after_ms, 1);
                prop_assert_eq!(later.granted, 1, "{:?} at +{}", s.algorithm, g.retry_after_ms);
                let (_, early) = acquire(state, &s, now + g.retry_after_ms - 1, 1);
                prop_assert_eq!(early.granted, 0, "{:?} at +{} - 1", s.algorithm, g.retry_after_ms);
            }
        }
    }

    fn rate(s: &str) -> Result<Rate, RateError> {
        s.parse()
    }

    #[test]
    fn parses_named_units() {
        assert_eq!(
            rate("100/min").unwrap(),
            Rate {
                count: 100,
                period: Duration::from_secs(60)
            }
        );
        assert_eq!(rate("5/h").unwrap().period, Duration::from_secs(3600));
        assert_eq!(rate("1000/day").unwrap().period, Duration::from_secs(86_400));
        assert_eq!(rate("7/s").unwrap().period, Duration::from_secs(1));
        assert_eq!(rate(" 7 / second ").unwrap().count, 7);
    }

    #[test]
    fn parses_durations_with_multipliers() {
        assert_eq!(
            rate("10/30s").unwrap(),
            Rate {
                count: 10,
                period: Duration::from_secs(30)
            }
        );
        assert_eq!(rate("3/5m").unwrap().period, Duration::from_secs(300));
        assert_eq!(rate("1/500ms").unwrap().period, Duration::from_millis(500));
        assert_eq!(rate("1_000/2h").unwrap().count, 1000);
    }

    #[test]
    fn refuses_bad_rates_with_a_reason() {
        assert_eq!(rate("100"), Err(RateError::Shape));
        assert_eq!(rate("0/min"), Err(RateError::ZeroCount));
        assert_eq!(rate("x/min"), Err(RateError::Count("x".into())));
        assert_eq!(rate("-1/min"), Err(RateError::Count("-1".into())));
        assert_eq!(rate("5/fortnight"), Err(RateError::Period("fortnight".into())));
        assert_eq!(rate("5/0s"), Err(RateError::ZeroPeriod));
        assert_eq!(rate("5/"), Err(RateError::Period("".into())));
        assert!(matches!(rate("5/99999999999999999999s"), Err(RateError::Period(_))));
    }

    #[test]
    fn shares_add_up_to_the_whole() {
        let spec = Spec::new(Algorithm::TokenBucket, rate("100/min").unwrap(), 250);
        for shards in [1u32, 3, 7, 8, 100] {
            let parts: Vec<Spec> = (0..shards).map(|i| spec.share(i, shards)).collect();
            assert_eq!(parts.iter().map(|p| p.count).sum::<u64>(), 100, "{shards}");
            assert_eq!(parts.iter().map(|p| p.capacity).sum::<u64>(), 250, "{shards}");
            assert!(parts.iter().all(|p| p.period_ms() == 60_000));
        }
        assert_eq!(spec.share(0, 3).count, 34);
        assert_eq!(spec.share(2, 3).count, 33);
        assert_eq!(spec.divided(3).count, 34);
        assert_eq!(spec.divided(1_000).capacity, 1);
    }

    #[test]
    fn displays_in_the_shortest_unit() {
        for s in ["100/min", "10/30s", "5/h", "1000/day", "1/500ms", "3/2day"] {
            assert_eq!(rate(s).unwrap().to_string(), s);
        }
        assert!((rate("120/min").unwrap().per_second() - 2.0).abs() < 1e-9);
    }
}
