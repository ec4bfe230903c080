//! When a key asks for more, how much, and under which transfer id: pure
//! functions of the key's quota, the store's answer and the time.

use sha2::{Digest, Sha256};

use crate::quota::Spec;

/// Tokens of its slice a key has used for a grant to leave `remaining`:
/// measured by the region's bucket itself, so it counts every gateway of
/// the region, net of what the bucket refilled.
pub fn used(spec: &Spec, remaining: u64) -> u64 {
    spec.capacity.saturating_sub(remaining)
}

/// The use at which a key of `spec` asks for more: `rebalance_at` of its
/// slice, rounded up, at least one token.
pub fn trigger_level(spec: &Spec, rebalance_at: f64) -> u64 {
    let level = (spec.capacity as f64 * rebalance_at).ceil();
    if level.is_finite() && level >= 1.0 {
        (level.min(spec.capacity as f64) as u64).max(1)
    } else {
        1
    }
}

/// Whether a store answer that left `remaining` means the key crossed
/// `rebalance_at` of its slice.
pub fn crossed(spec: &Spec, remaining: u64, rebalance_at: f64) -> bool {
    used(spec, remaining) >= trigger_level(spec, rebalance_at)
}

/// What a region asks the primary for: one more slice of the key's quota,
/// or the region's measured shortfall over the last period when that is
/// more (the excess demand its store saw), never more than the whole
/// quota. The primary grants less when it has less to spare.
pub fn ask(spec: &Spec, short: u64) -> u64 {
    spec.capacity.max(short).min(spec.whole().capacity.max(spec.capacity))
}

/// The rebalance window `now_ms` falls in.
pub fn window_index(now_ms: u64, window_ms: u64) -> u64 {
    now_ms / window_ms.max(1)
}

/// `[region] id_secret_file`'s secret, shared by every gateway of the
/// fleet: it keys transfer ids. Never shown (not in `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub struct IdSecret(Vec<u8>);

impl IdSecret {
    pub fn new(secret: &[u8]) -> IdSecret {
        IdSecret(secret.to_vec())
    }
}

impl std::fmt::Debug for IdSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdSecret(..)")
    }
}

/// HMAC-SHA256 (RFC 2104) of `parts`, each followed by a 0 byte.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for p in parts {
        inner.update(p);
        inner.update([0]);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The id of the transfer `region` asks for `key` in `window`: the same for
/// every gateway of the region and every retry in that window, so that
/// neither two askers nor a retry can move tokens twice (the primary
/// answers a known id from its record). Keyed with `secret` when there is
/// one: a peer without it cannot name another region's next transfer in
/// advance and have it recorded as a zero grant.
pub fn transfer_id(secret: Option<&IdSecret>, region: &str, key: &str, window: u64) -> u64 {
    let window = window.to_be_bytes();
    let parts: [&[u8]; 3] = [region.as_bytes(), key.as_bytes(), &window];
    let d = match secret {
        Some(s) => hmac_sha256(&s.0, &parts),
        None => {
            let mut h = Sha256::new();
            for p in parts {
                h.update(p);
                h.update([0]);
            }
            h.finalize().into()
        }
    };
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    u64::from_be_bytes(id)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::quota::{Algorithm, Rate};
    use proptest::prelude::*;
    use std::time::Duration;

    fn spec(capacity: u64) -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            Rate {
                count: capacity,
                period: Duration::from_secs(60),
            },
            capacity,
        )
    }

    #[test]
    fn a_key_asks_once_it_used_rebalance_at_of_its_slice() {
        let s = spec(100);
        assert_eq!(trigger_level(&s, 0.8), 80);
        assert!(!crossed(&s, 21, 0.8)); // used 79
        assert!(crossed(&s, 20, 0.8)); // used 80
        assert!(crossed(&s, 0, 0.8));
        // Rounded up: 0.75 of 10 is 7.5, so 8.
        assert_eq!(trigger_level(&spec(10), 0.75), 8);
        // A tiny slice asks after one token; rebalance_at 1 after the last.
        assert_eq!(trigger_level(&spec(1), 0.1), 1);
        assert_eq!(trigger_level(&spec(50), 1.0), 50);
        assert!(!crossed(&spec(50), 1, 1.0));
        assert!(crossed(&spec(50), 0, 1.0));
        // A remaining above the capacity (a burst shrunk by a reload) is unused.
        assert!(!crossed(&s, 500, 0.8));
    }

    #[test]
    fn an_ask_is_one_more_slice_or_the_measured_shortfall_up_to_the_whole() {
        assert_eq!(ask(&spec(3_000), 0), 3_000, "nothing measured yet: a slice");
        assert_eq!(ask(&spec(3_000), 1_000), 3_000, "a small shortfall: still a slice");
        let slice = spec(1_000).slice(crate::quota::Share::from_fraction(0.3).unwrap());
        assert_eq!(ask(&slice, 0), 300);
        assert_eq!(ask(&slice, 700), 700, "the shortfall, when more than a slice");
        assert_eq!(ask(&slice, 5_000), 1_000, "never more than the whole quota");
    }

    #[test]
    fn keyed_ids_follow_rfc_4231_and_differ_by_secret() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for
        // nothing?" (here as one part, so with the 0 byte after it, the
        // vector is checked through the unkeyed-parts path below).
        let mac = hmac_sha256(b"Jefe", &[]);
        let mut inner = Sha256::new();
        let mut k = [0u8; 64];
        k[..4].copy_from_slice(b"Jefe");
        inner.update(k.map(|b| b ^ 0x36));
        let mut outer = Sha256::new();
        outer.update(k.map(|b| b ^ 0x5c));
        outer.update(inner.finalize());
        assert_eq!(mac, <[u8; 32]>::from(outer.finalize()));
        let rfc = {
            // The published vector, through the same pads.
            let mut inner = Sha256::new();
            inner.update(k.map(|b| b ^ 0x36));
            inner.update(b"what do ya want for nothing?");
            let mut outer = Sha256::new();
            outer.update(k.map(|b| b ^ 0x5c));
            outer.update(inner.finalize());
            outer.finalize()
        };
        let hex: String = rfc.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        let (a, b) = (IdSecret::new(b"one secret"), IdSecret::new(b"another"));
        let keyed = transfer_id(Some(&a), "eu", "rl:{l:k}", 7);
        assert_eq!(keyed, transfer_id(Some(&a), "eu", "rl:{l:k}", 7));
        assert_ne!(keyed, transfer_id(Some(&b), "eu", "rl:{l:k}", 7));
        assert_ne!(keyed, transfer_id(None, "eu", "rl:{l:k}", 7));
        assert_eq!(format!("{a:?}"), "IdSecret(..)");
    }

    #[test]
    fn transfer_ids_are_one_per_region_key_and_window() {
        let id = |r, k, w| transfer_id(None, r, k, w);
        let a = id("eu", "rl:{l:k}", 7);
        assert_eq!(a, id("eu", "rl:{l:k}", 7));
        assert_ne!(a, id("us", "rl:{l:k}", 7));
        assert_ne!(a, id("eu", "rl:{l:k2}", 7));
        assert_ne!(a, id("eu", "rl:{l:k}", 8));
        // No ambiguity between region and key boundaries.
        assert_ne!(id("e", "url", 1), id("eu", "rl", 1));
        assert_eq!(window_index(39_999, 20_000), 1);
        assert_eq!(window_index(40_000, 20_000), 2);
        assert_eq!(window_index(5, 0), 5);
    }

    proptest! {
        #[test]
        fn crossing_is_monotonic_in_use(cap in 1u64..1_000_000, at in 0.000_001f64..=1.0, remaining in 0u64..1_000_000) {
            let s = spec(cap);
            let level = trigger_level(&s, at);
            prop_assert!(level >= 1 && level <= cap);
            if crossed(&s, remaining, at) {
                // Any lower remaining (more use) crosses too.
                prop_assert!(crossed(&s, remaining.saturating_sub(1), at));
                prop_assert!(used(&s, remaining) as f64 >= (cap as f64 * at).min(cap as f64) - 1e-9 || level == 1);
            } else {
                prop_assert!((used(&s, remaining) as f64) < (cap as f64 * at).ceil());
            }
        }
    }
}
