//! A region's share of every quota, in parts per million: exact integer
//! math, so every region (and the primary granting a transfer) computes
//! the same slice of the same key.

use std::fmt;

/// A fraction in (0, 1], in millionths. Built only through
/// [`Share::from_fraction`] (or [`Share::WHOLE`]), so it is never 0 and
/// never above the whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Share(u32);

const PPM: u64 = 1_000_000;

impl Share {
    /// All of the quota: a gateway without `[region]`.
    pub const WHOLE: Share = Share(PPM as u32);

    /// `fraction` rounded to the nearest millionth; `None` unless it is in
    /// (0, 1] and at least one millionth.
    pub fn from_fraction(fraction: f64) -> Option<Share> {
        if !fraction.is_finite() || fraction <= 0.0 || fraction > 1.0 {
            return None;
        }
        let ppm = (fraction * PPM as f64).round() as u64;
        (1..=PPM).contains(&ppm).then_some(Share(ppm as u32))
    }

    pub fn ppm(self) -> u32 {
        self.0
    }

    pub fn is_whole(self) -> bool {
        self == Share::WHOLE
    }

    /// `floor(total × share)`, at least 1 (a quota is never zero).
    pub fn of(self, total: u64) -> u64 {
        // The whole (every gateway without `[region]`), without the
        // 128-bit division every decision would otherwise pay.
        if self == Share::WHOLE {
            return total.max(1);
        }
        let part = u128::from(total) * u128::from(self.0) / u128::from(PPM);
        u64::try_from(part).unwrap_or(u64::MAX).max(1)
    }

    /// `ceil(total × share)`: the first level at which a fraction of a
    /// quota counts as reached.
    pub fn of_ceil(self, total: u64) -> u64 {
        if self == Share::WHOLE {
            return total;
        }
        let part = (u128::from(total) * u128::from(self.0)).div_ceil(u128::from(PPM));
        u64::try_from(part).unwrap_or(u64::MAX)
    }
}

impl Default for Share {
    fn default() -> Self {
        Share::WHOLE
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", f64::from(self.0) / PPM as f64)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::quota::{Algorithm, Rate, Spec};
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn only_fractions_in_zero_to_one_are_shares() {
        for bad in [0.0, -0.1, 1.000_001, 1.5, f64::NAN, f64::INFINITY, 0.000_000_4] {
            assert_eq!(Share::from_fraction(bad), None, "{bad}");
        }
        assert_eq!(Share::from_fraction(1.0), Some(Share::WHOLE));
        assert_eq!(Share::from_fraction(0.3).unwrap().ppm(), 300_000);
        assert_eq!(Share::from_fraction(0.000_001).unwrap().ppm(), 1);
        assert!(Share::WHOLE.is_whole());
    }

    #[test]
    fn a_slice_rounds_down_but_never_to_zero() {
        let s = Share::from_fraction(0.3).unwrap();
        assert_eq!(s.of(10_000), 3_000);
        assert_eq!(s.of(10), 3);
        assert_eq!(s.of(3), 1); // 0.9
        assert_eq!(s.of(1), 1); // 0.3, but a quota is never zero
        assert_eq!(s.of_ceil(10), 3);
        assert_eq!(s.of_ceil(11), 4); // 3.3
        assert_eq!(Share::WHOLE.of(u64::MAX), u64::MAX);
    }

    fn spec(count: u64, capacity: u64) -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            Rate {
                count,
                period: Duration::from_secs(60),
            },
            capacity,
        )
    }

    #[test]
    fn a_spec_slice_scales_rate_and_burst_and_remembers_the_whole() {
        let whole = spec(10_000, 12_000);
        let s = whole.slice(Share::from_fraction(0.3).unwrap());
        assert_eq!((s.count, s.capacity), (3_000, 3_600));
        assert_eq!(s.period_ms(), 60_000);
        assert_eq!(s.whole(), whole);
        // Slicing again slices the whole, not the slice.
        assert_eq!(s.slice(Share::from_fraction(0.5).unwrap()).count, 5_000);
        assert_eq!(whole.slice(Share::WHOLE), whole);
    }

    #[test]
    fn a_sub_bucket_of_a_slice_is_the_slice_of_the_sub_bucket() {
        // The primary computes a requester's key's quota as
        // whole-of-the-sub-bucket, then its own slice: that must be what its
        // own limiter computes for the same key (sub-bucket first, slice last).
        let whole = spec(1_000, 1_500);
        let share = Share::from_fraction(0.4).unwrap();
        for i in 0..7 {
            let here = whole.share(i, 7).slice(share);
            let rebuilt = spec(here.whole().count, here.whole().capacity).slice(share);
            assert_eq!((here.count, here.capacity), (rebuilt.count, rebuilt.capacity));
        }
    }

    proptest! {
        /// Shares that add up to at most 1 never slice more than the whole
        /// (above the 1-per-region floor a tiny quota needs).
        #[test]
        fn slices_never_add_up_to_more_than_the_whole(
            total in 1u64..10_000_000,
            a in 1u32..=1_000_000,
            b in 0u32..=1_000_000,
        ) {
            let b = b.min(1_000_000 - a.min(1_000_000));
            let mut shares = vec![Share(a)];
            if b > 0 { shares.push(Share(b)); }
            let rest = 1_000_000 - a - b;
            if rest > 0 { shares.push(Share(rest)); }
            let sum: u64 = shares.iter().map(|s| s.of(total)).sum();
            // Each slice is floor(total × s) or the floor of 1.
            prop_assert!(sum <= total.max(shares.len() as u64));
            for s in &shares {
                prop_assert!(s.of_ceil(total) >= s.of(total) || s.of(total) == 1);
                prop_assert!(s.of(total) <= total);
            }
        }
    }
}
