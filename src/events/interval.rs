//! At most one event per key per interval, in bounded memory (pure: time
//! comes in as an argument).
//!
//! A set-associative table: a key's hash picks one set of [`WAYS`] slots;
//! a key not in its set takes an empty slot or the one that sent longest
//! ago. Memory is fixed at construction, whatever the number of keys: a
//! flood of identities evicts older keys (which may then send again before
//! their interval is over) instead of growing the table.

/// Slots per set.
pub const WAYS: usize = 4;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The key's hash with its low bit set, so 0 means empty.
    tag: u64,
    /// When this key last sent, in ms.
    sent_ms: u64,
}

#[derive(Debug)]
pub struct IntervalTable {
    slots: Box<[Slot]>,
    sets: usize,
}

impl IntervalTable {
    /// A table of `sets` × [`WAYS`] keys (`sets` at least 1).
    pub fn new(sets: usize) -> IntervalTable {
        let sets = sets.max(1);
        IntervalTable {
            slots: vec![Slot::default(); sets * WAYS].into_boxed_slice(),
            sets,
        }
    }

    /// Keys the table can remember at once.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Whether `key` may send at `now_ms`: its first time, or `interval_ms`
    /// since it last sent. Records the send when it may.
    pub fn admit(&mut self, key: u64, now_ms: u64, interval_ms: u64) -> bool {
        let tag = key | 1;
        let set = ((key >> 1) % self.sets as u64) as usize;
        let Some(ways) = self.slots.get_mut(set * WAYS..(set + 1) * WAYS) else {
            return false;
        };
        if let Some(slot) = ways.iter_mut().find(|s| s.tag == tag) {
            if now_ms.saturating_sub(slot.sent_ms) < interval_ms {
                return false;
            }
            slot.sent_ms = now_ms;
            return true;
        }
        // Not remembered: an empty slot, else the one that sent longest ago.
        let victim = ways
            .iter_mut()
            .min_by_key(|s| if s.tag == 0 { (0, 0) } else { (1, s.sent_ms) });
        if let Some(slot) = victim {
            *slot = Slot { tag, sent_ms: now_ms };
        }
        true
    }
}

/// A token bucket over all keys: the events a flood of distinct keys
/// could send are capped at `per_sec`, with `burst` at once, so the agent
/// (and the event pipeline's bill) sees a bounded rate whatever the
/// traffic. The limiter's own bucket math ([`crate::quota::token_bucket`]);
/// time as an argument.
#[derive(Debug)]
pub struct Budget {
    spec: crate::quota::Spec,
    state: Option<crate::quota::token_bucket::State>,
}

impl Budget {
    /// Starts full.
    pub fn new(per_sec: u64, burst: u64) -> Budget {
        let rate = crate::quota::Rate {
            count: per_sec,
            period: std::time::Duration::from_secs(1),
        };
        Budget {
            spec: crate::quota::Spec::new(crate::quota::Algorithm::TokenBucket, rate, burst),
            state: None,
        }
    }

    /// Whether one more event may go at `now_ms` (spending it if so).
    pub fn take(&mut self, now_ms: u64) -> bool {
        let (state, grant) = crate::quota::token_bucket::acquire(self.state, &self.spec, now_ms, 1);
        self.state = Some(state);
        grant.granted == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_send_per_key_per_interval() {
        let mut t = IntervalTable::new(16);
        assert!(t.admit(42, 1_000, 10_000));
        for now in [1_000, 1_001, 5_000, 10_999] {
            assert!(!t.admit(42, now, 10_000), "at {now}");
        }
        assert!(t.admit(42, 11_000, 10_000));
        assert!(!t.admit(42, 11_000, 10_000));
        assert!(t.admit(42, 21_000, 10_000));
    }

    #[test]
    fn keys_are_independent() {
        let mut t = IntervalTable::new(16);
        assert!(t.admit(1, 0, 10_000));
        assert!(t.admit(2, 0, 10_000));
        assert!(!t.admit(1, 5, 10_000));
        assert!(!t.admit(2, 5, 10_000));
        // Keys that differ only in the low bit share a tag: documented, and
        // the hashes fed here are 64-bit, so that is a 1 in 2^63 chance.
        assert!(!t.admit(3, 5, 10_000));
    }

    #[test]
    fn a_flood_of_keys_stays_bounded_and_evicts_the_oldest() {
        let mut t = IntervalTable::new(8);
        assert_eq!(t.capacity(), 32);
        // The key that sent first, then a flood of others in every set.
        let first = 7 << 1;
        assert!(t.admit(first, 0, 10_000));
        for k in 1..100_000u64 {
            assert!(t.admit(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k, 10_000));
        }
        assert_eq!(t.capacity(), 32, "memory does not grow");
        // Evicted: it may send again, early.
        assert!(t.admit(first, 100_000, 1_000_000));
    }

    #[test]
    fn eviction_keeps_the_keys_that_sent_recently() {
        let mut t = IntervalTable::new(1);
        for k in 0..WAYS as u64 {
            assert!(t.admit(k << 1, k, 10_000));
        }
        // A fifth key evicts key 0 (sent longest ago), not the others.
        assert!(t.admit(100 << 1, 10, 10_000));
        for k in 1..WAYS as u64 {
            assert!(!t.admit(k << 1, 11, 10_000), "key {k} was kept");
        }
        assert!(t.admit(0, 12, 10_000), "key 0 was evicted");
    }

    #[test]
    fn the_budget_caps_the_rate_over_all_keys() {
        let mut b = Budget::new(100, 10);
        assert_eq!((0..50).filter(|_| b.take(0)).count(), 10, "the burst");
        assert!(!b.take(5));
        assert!(b.take(10), "one token per 10 ms");
        assert!(!b.take(10));
        // A second: 100 more, never more than the burst at once.
        assert_eq!((0..200).filter(|_| b.take(1_010)).count(), 10);
        let mut b = Budget::new(100, 1_000);
        let sent = (0..10_000u64).filter(|i| b.take(i / 10)).count();
        assert_eq!(sent, 1_000 + 99, "burst, then 100/s over 999 ms");
        // Time going backwards refills nothing, and stalls nothing either
        // (the limiter's rule: the bucket is re-anchored at the new time).
        let mut b = Budget::new(100, 1);
        assert!(b.take(1_000));
        assert!(!b.take(0));
        assert!(!b.take(5));
        assert!(b.take(10), "one token per 10 ms from the step on");
    }

    #[test]
    fn a_zero_interval_never_suppresses() {
        let mut t = IntervalTable::new(4);
        assert!(t.admit(9, 0, 0));
        assert!(t.admit(9, 0, 0));
    }
}
