//! The local fallback: while the store is away, a fail-open route's limits
//! decide against a bucket per key in this instance's memory.
//!
//! Its quota is the limit's `fallback_rate` when set. By default it is
//! about twice what this instance was admitting for the key before the
//! outage (a one-minute decaying average), with a floor of 1 % of the quota
//! (at least one per period) for keys it had not seen, and never more than
//! the quota divided by the fleet's size (its live count by heartbeats,
//! bounded by `[store] fleet_size`; see `fleet`). A fleet that falls back
//! together therefore admits about twice what it was admitting, whatever
//! its size, instead of its size times the quota.
//!
//! A key's default fallback bucket starts with one second of its fallback
//! rate, or one lease for its recent rate if that is more, never more than
//! its burst; not full. A fleet that falls back together then starts with
//! about two seconds of what it was admitting, instead of `instances ×
//! burst`.

use std::time::Duration;

use super::stage::{self, Outcome};
use super::{LimitRef, LimitRuntime, LimitVerdict, Limiter, Settings};
use crate::quota::{Rate, Spec};

/// The default fallback quota of a key whose quota is `spec`, from this
/// instance's recent admitted rate for it (requests per second).
pub fn default_spec(spec: &Spec, admitted_per_sec: f64, fleet_size: u64) -> Spec {
    let ceiling = spec.divided(fleet_size);
    let period_ms = spec.period_ms();
    let wanted = (2.0 * admitted_per_sec * period_ms as f64 / 1_000.0).ceil();
    let wanted = if wanted.is_finite() && wanted > 0.0 {
        wanted.min(u64::MAX as f64) as u64
    } else {
        0
    };
    let floor = (spec.count / 100).max(1);
    let count = wanted.max(floor).min(ceiling.count).max(1);
    // The burst keeps the quota's proportion of burst to rate.
    let capacity = (u128::from(ceiling.capacity) * u128::from(count) / u128::from(ceiling.count.max(1))).max(1);
    Spec::new(
        spec.algorithm,
        Rate {
            count,
            period: Duration::from_millis(period_ms),
        },
        u64::try_from(capacity).unwrap_or(u64::MAX),
    )
}

/// What a default fallback bucket starts with: one second of its rate or
/// one lease (`lease`), whichever is more, and never more than its burst.
pub fn starting_tokens(fallback: &Spec, lease: u64) -> u64 {
    let per_second = (u128::from(fallback.count) * 1_000).div_ceil(u128::from(fallback.period_ms().max(1)));
    let per_second = u64::try_from(per_second).unwrap_or(u64::MAX);
    per_second.max(lease).clamp(1, fallback.capacity.max(1))
}

impl Limiter {
    /// The fallback quota of a key: `fallback_rate` (a sub-bucket's share
    /// of it when the limit is sharded), or [`default_spec`].
    fn fallback_spec(
        &self,
        limit: &LimitRuntime,
        h: u64,
        spec: &Spec,
        shard: Option<u32>,
        settings: &Settings,
    ) -> Spec {
        match limit.config.fallback_rate {
            Some(rate) => {
                let set = Spec::new(limit.config.algorithm, rate, rate.count);
                // A set fallback_rate is the whole key's: a sub-bucket gets
                // its share, and a region its slice, as the quota does.
                match shard {
                    Some(s) => set.share(s, limit.shards),
                    None => set,
                }
                .slice(limit.config.share())
            }
            None => {
                let rate = self.leases.with(h, |l| l.admitted_rate()).unwrap_or(0.0);
                default_spec(spec, rate, self.fleet_divisor(settings))
            }
        }
    }

    /// The verdict of the local fallback bucket of `key`, for a request
    /// taking `n` tokens (1, or its reserve under a limit with a cost; at
    /// most the bucket's capacity). The rare path: the limiter's settings
    /// are read here, not passed down.
    pub(super) fn fallback<'l>(
        &self,
        limit: LimitRef<'l>,
        h: u64,
        key: &str,
        spec: &Spec,
        shard: Option<u32>,
        n: u64,
    ) -> LimitVerdict<'l> {
        let settings = &self.settings();
        let fallback = self.fallback_spec(&limit, h, spec, shard, settings);
        // A key's default bucket does not start full: tokens this instance
        // leased before the outage are spent before the fallback is asked,
        // and a full bucket on every instance would let the fleet admit its
        // size times the burst. A set `fallback_rate` is the operator's
        // per-instance bucket, full as configured.
        let start = match limit.config.fallback_rate {
            Some(_) => fallback.capacity,
            None => {
                let rate = self.leases.with(h, |l| l.admitted_rate()).unwrap_or(0.0);
                starting_tokens(&fallback, settings.sizing.lease_size(rate, fallback.capacity))
            }
        };
        self.fallback_used.store(true, std::sync::atomic::Ordering::Release);
        let grant = self
            .fallback
            .acquire_starting(key, &fallback, n.min(fallback.capacity).max(1), start)
            .unwrap_or_default();
        let (outcome, reset_ms) = if grant.granted > 0 {
            (Outcome::Admitted, grant.reset_ms)
        } else {
            (
                stage::on_refusal(limit.config.mode, limit.enforcing),
                grant.retry_after_ms,
            )
        };
        LimitVerdict {
            limit,
            key_hash: h,
            outcome,
            quota: fallback.count,
            window_secs: self.window_secs(&fallback),
            remaining: grant.remaining.min(fallback.count),
            reset_ms,
            retry_after_ms: grant.retry_after_ms,
            over_percent: if grant.granted > 0 { 0 } else { 100 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Algorithm;

    fn spec(rate: &str) -> Spec {
        let rate: Rate = rate.parse().unwrap();
        Spec::new(Algorithm::TokenBucket, rate, rate.count)
    }

    #[test]
    fn twice_the_recent_rate_within_a_floor_and_the_quota() {
        let s = spec("6000/min");
        // 10/s admitted recently: 20/s, i.e. 1200 per minute.
        let f = default_spec(&s, 10.0, 1);
        assert_eq!((f.count, f.capacity, f.period_ms()), (1_200, 1_200, 60_000));
        // Unseen key: the floor, 1 % of the quota.
        assert_eq!(default_spec(&s, 0.0, 1).count, 60);
        // Never more than the quota, or its share of a declared fleet.
        assert_eq!(default_spec(&s, 1e6, 1).count, 6_000);
        assert_eq!(default_spec(&s, 1e6, 3).count, 2_000);
        assert_eq!(default_spec(&s, f64::NAN, 1).count, 60);
        assert_eq!(default_spec(&spec("5/min"), 0.0, 1).count, 1, "at least one per period");
    }

    #[test]
    fn a_fallback_bucket_starts_with_a_second_of_its_rate_not_its_burst() {
        let rate: Rate = "10/s".parse().unwrap();
        let f = Spec::new(Algorithm::TokenBucket, rate, 100);
        assert_eq!(starting_tokens(&f, 5), 10, "one second of 10/s");
        assert_eq!(starting_tokens(&f, 40), 40, "a larger lease");
        assert_eq!(starting_tokens(&f, 500), 100, "never above the burst");
        let slow = Spec::new(Algorithm::TokenBucket, "1/h".parse().unwrap(), 1);
        assert_eq!(starting_tokens(&slow, 0), 1, "at least one");
    }

    #[test]
    fn the_burst_keeps_its_proportion() {
        let rate: Rate = "100/s".parse().unwrap();
        let s = Spec::new(Algorithm::TokenBucket, rate, 300);
        let f = default_spec(&s, 10.0, 1);
        assert_eq!((f.count, f.capacity), (20, 60));
    }
}
