//! How many tokens a lease asks for: `clamp(min, qps_ewma × lookahead,
//! max)`, and never more than `fraction` of the bucket's capacity (at
//! least 1); and the low watermark below which a lease refills in the
//! background. Pure: the rate comes from the lease's [`RateEstimate`].
//!
//! [`RateEstimate`]: super::rate::RateEstimate

/// The parameters of lease sizing, from `[leasing]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    pub min: u64,
    pub max: u64,
    pub lookahead_ms: u64,
    /// Largest share of a bucket's capacity one lease may hold.
    pub fraction: f64,
    /// Leased tokens unspent after this long go back to the store.
    pub ttl_ms: u64,
}

impl Default for Sizing {
    fn default() -> Self {
        Sizing {
            min: 5,
            max: 500,
            lookahead_ms: 250,
            fraction: 0.1,
            ttl_ms: 1_000,
        }
    }
}

impl Sizing {
    /// Tokens to ask for, given the observed rate and the bucket's capacity.
    pub fn lease_size(&self, qps: f64, capacity: u64) -> u64 {
        self.lease_size_in(qps, capacity, 1)
    }

    /// [`Sizing::lease_size`] for requests taking `unit` tokens each (a
    /// cost's reserve): `min` and `max` count requests, so the store sees
    /// as many calls per request as with one token each; the share of the
    /// capacity still caps the tokens.
    pub fn lease_size_in(&self, qps: f64, capacity: u64, unit: u64) -> u64 {
        let wanted = (qps * self.lookahead_ms as f64 / 1_000.0).ceil();
        let wanted = if wanted.is_finite() && wanted > 0.0 {
            wanted as u64
        } else {
            0
        };
        let unit = unit.max(1);
        let (min, max) = (
            self.min.saturating_mul(unit),
            self.max.max(self.min).saturating_mul(unit),
        );
        let sized = wanted.clamp(min, max);
        let cap = ((capacity as f64 * self.fraction).floor() as u64).max(1);
        sized.min(cap)
    }

    /// The sizing on the embedded store: a lease looks ahead at least its
    /// TTL. The lookahead trades store calls against tokens one instance
    /// holds while others could spend them; the embedded store has no
    /// other instance, and its tokens go back unspent only after the TTL
    /// anyway, so a lease may cover that long: a key visited every 60 ms
    /// calls the store once in 16 visits rather than 5. `fraction`
    /// still caps a lease (what a burst may take beyond the bucket).
    pub fn embedded(self) -> Sizing {
        Sizing {
            lookahead_ms: self.lookahead_ms.max(self.ttl_ms),
            ..self
        }
    }

    /// Refill in the background once the local balance falls below this.
    pub fn low_watermark(size: u64) -> u64 {
        size / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_traffic_within_min_max_and_fraction() {
        let s = Sizing::default();
        assert_eq!(s.lease_size(0.0, 1_000_000), 5); // cold: min
        assert_eq!(s.lease_size(100.0, 1_000_000), 25); // 100 qps × 0.25 s
        assert_eq!(s.lease_size(1_000.0, 1_000_000), 250);
        assert_eq!(s.lease_size(1e9, 1_000_000), 500); // max
        assert_eq!(s.lease_size(1_000.0, 100), 10); // 10% of capacity
        assert_eq!(s.lease_size(1_000.0, 10), 1); // low limits: one at a time
        assert_eq!(s.lease_size(f64::NAN, 10), 1);
        assert_eq!(s.lease_size(f64::INFINITY, 1_000_000), 5);
        // Requests of 10 tokens: as many requests' worth.
        assert_eq!(s.lease_size_in(0.0, 1_000_000, 10), 50);
        assert_eq!(s.lease_size_in(1e9, 1_000_000, 10), 5_000);
        assert_eq!(s.lease_size_in(1e9, 20_000, 10), 2_000, "10% of capacity still");
    }

    #[test]
    fn on_the_embedded_store_a_lease_covers_its_ttl() {
        let s = Sizing::default().embedded();
        assert_eq!(s.lookahead_ms, 1_000);
        assert_eq!(s.lease_size(16.0, 1_000_000), 16, "16 visits a second: 16, not 5");
        assert_eq!(s.lease_size(0.0, 1_000_000), 5, "min");
        assert_eq!(s.lease_size(1e9, 1_000_000), 500, "max");
        assert_eq!(s.lease_size(1_000.0, 100), 10, "10% of capacity still");
        let long = Sizing {
            lookahead_ms: 5_000,
            ..Sizing::default()
        };
        assert_eq!(long.embedded().lookahead_ms, 5_000, "a longer lookahead stays");
    }
}
