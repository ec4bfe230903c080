//! Max-min fair shares (pure): how a rate is split among streams that
//! want it. The RLQS assignments follow it, through the store
//! (`QuotaStore::fair_share`: the memory store here, `lua/fair_share.lua`
//! on Redis, the same water-fill).

/// The max-min fair share of `rate` for a stream wanting `own` (requests
/// per second, headroom included) beside streams wanting `others`: a stream that wants less
/// than an equal split gets what it wants, and the rest is split equally
/// among the others. A lone stream gets what it wants, up to `rate`, as
/// it would beside streams that all want less than their split (the water
/// fill has no special case, as `lua/fair_share.lua` has none); the shares
/// of all streams add up to at most `rate`.
pub fn max_min_share(own: f64, others: &[f64], rate: f64) -> f64 {
    let clean = |d: f64| if d.is_finite() && d > 0.0 { d } else { 0.0 };
    let mut all: Vec<f64> = others.iter().map(|d| clean(*d)).collect();
    let own = clean(own);
    all.push(own);
    all.sort_by(f64::total_cmp);
    let mut left = rate;
    let mut n = all.len() as f64;
    for d in all {
        let equal = left / n;
        if d >= equal {
            // This and every larger demand get the equal split.
            return if own >= equal { equal } else { own };
        }
        if d == own {
            return own;
        }
        left -= d;
        n -= 1.0;
    }
    own.min(left.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fair_shares_split_what_busy_streams_want() {
        assert_eq!(max_min_share(80.0, &[], 100.0), 80.0, "alone: what it wants");
        assert_eq!(max_min_share(120.0, &[], 100.0), 100.0, "alone: up to the rate");
        assert_eq!(max_min_share(80.0, &[80.0], 100.0), 50.0);
        assert_eq!(
            max_min_share(10.0, &[80.0], 100.0),
            10.0,
            "wants less than half: gets it"
        );
        assert_eq!(max_min_share(80.0, &[10.0], 100.0), 80.0, "the other: what it wants");
        assert_eq!(max_min_share(95.0, &[10.0], 100.0), 90.0, "up to the rest");
        assert_eq!(max_min_share(f64::NAN, &[f64::INFINITY, -3.0], 100.0), 0.0);
    }

    proptest! {
        #[test]
        fn fair_shares_add_up_to_at_most_the_rate(
            demands in proptest::collection::vec(0.0f64..1_000.0, 1..12),
            rate in 1.0f64..500.0,
        ) {
            let mut sum = 0.0;
            for (i, d) in demands.iter().enumerate() {
                let others: Vec<f64> = demands.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, x)| *x).collect();
                let share = max_min_share(*d, &others, rate);
                prop_assert!(share <= d.max(0.0) + 1e-9, "{share} > demand {d}");
                sum += share;
            }
            prop_assert!(sum <= rate + 1e-6, "{sum} > {rate}: {demands:?}");
        }
    }
}
