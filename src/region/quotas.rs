//! The primary's own view of a key's quota: a transfer takes tokens out of
//! the primary's bucket, so the primary decides with its own limits, never
//! with the quota the request carries. The request's quota is checked
//! against them: a mismatch (limits that differ between regions, or a
//! forged request) is refused, since running the bucket script with other
//! parameters would reset the primary's bucket.

use std::sync::Arc;

use super::wire::{key_limit, TransferRequest};
use crate::quota::{Share, Spec};

/// A limit of the primary's config, as transfers need it: its whole quotas
/// (before any region's slice) and its sub-buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitQuotas {
    /// The limit's quota, then each plan's: a key does not name its plan,
    /// so a key's quota is one of these.
    pub specs: Vec<Spec>,
    /// Sub-buckets per key (1: not sharded).
    pub shards: u32,
}

/// Looks a limit up by name in the config in force (`None`: no such limit).
/// Built by the server; `region` never reads the config itself.
pub type Quotas = Arc<dyn Fn(&str) -> Option<LimitQuotas> + Send + Sync>;

/// Why the primary refuses a transfer it understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("key {0:?} is not a rate-limit key")]
    Key(String),
    #[error("RLS keys (rl:{{rls:...}}) have no [[limits]] here to check them against")]
    Rls,
    #[error("no limit {0:?} here: the regions' limits differ")]
    NoLimit(String),
    #[error("key {0:?} names no sub-bucket of its limit here")]
    Shard(String),
    #[error("the quota asked with ({0}) is not limit {1:?}'s here: the regions' limits differ")]
    Mismatch(String, String),
}

/// The primary's own quota for the key of `t`, as its own limiter slices it
/// with `share`: the limit's quota (or one of its plans'), its sub-bucket's
/// share when sharded, then the slice; refused unless the request asked
/// with exactly that quota.
pub fn resolve(t: &TransferRequest, quotas: &Quotas, share: Share) -> Result<Spec, Refusal> {
    let limit = key_limit(&t.key).ok_or_else(|| Refusal::Key(t.key.clone()))?;
    if limit == "rls" {
        return Err(Refusal::Rls);
    }
    let q = quotas(limit).ok_or_else(|| Refusal::NoLimit(limit.to_owned()))?;
    let shard = match q.shards {
        0 | 1 => None,
        n => Some(
            shard_of(&t.key)
                .filter(|s| *s < n)
                .ok_or_else(|| Refusal::Shard(t.key.clone()))?,
        ),
    };
    let asked = (t.algorithm.as_str(), t.count, t.period_ms, t.capacity);
    q.specs
        .iter()
        .map(|s| match shard {
            Some(i) => s.share(i, q.shards),
            None => *s,
        })
        .find(|s| (s.algorithm.as_str(), s.count, s.period_ms(), s.capacity) == asked)
        .map(|s| s.slice(share))
        .ok_or_else(|| {
            Refusal::Mismatch(
                format!(
                    "{} {}/{} ms, capacity {}",
                    t.algorithm, t.count, t.period_ms, t.capacity
                ),
                limit.to_owned(),
            )
        })
}

/// The sub-bucket a sharded key names: its last part, `s<digits>`.
fn shard_of(key: &str) -> Option<u32> {
    let inner = key.strip_suffix('}')?;
    let (_, last) = inner.rsplit_once(':')?;
    let digits = last.strip_prefix('s')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::quota::{Algorithm, Rate};
    use std::time::Duration;

    fn rate(count: u64, secs: u64) -> Rate {
        Rate {
            count,
            period: Duration::from_secs(secs),
        }
    }

    fn quotas() -> Quotas {
        Arc::new(|name: &str| match name {
            "api" => Some(LimitQuotas {
                specs: vec![
                    Spec::new(Algorithm::TokenBucket, rate(1_000, 60), 1_500),
                    Spec::new(Algorithm::TokenBucket, rate(5_000, 60), 5_000),
                ],
                shards: 1,
            }),
            "hot" => Some(LimitQuotas {
                specs: vec![Spec::new(Algorithm::SlidingWindow, rate(1_001, 60), 1_001)],
                shards: 4,
            }),
            _ => None,
        })
    }

    fn request(key: &str, spec: &Spec) -> TransferRequest {
        TransferRequest::new(
            1,
            "eu",
            key,
            &spec.slice(Share::from_fraction(0.3).unwrap()),
            10,
            20_000,
        )
    }

    #[test]
    fn the_primary_slices_its_own_quota_of_the_key() {
        let half = Share::from_fraction(0.5).unwrap();
        let plain = Spec::new(Algorithm::TokenBucket, rate(1_000, 60), 1_500);
        let got = resolve(&request("rl:{api:k}", &plain), &quotas(), half).unwrap();
        assert_eq!(got, plain.slice(half));
        // A plan's quota is the limit's too.
        let plan = Spec::new(Algorithm::TokenBucket, rate(5_000, 60), 5_000);
        assert_eq!(
            resolve(&request("rl:{api:k}", &plan), &quotas(), half).unwrap(),
            plan.slice(half)
        );
        // A sub-bucket's share, named by the key.
        let whole = Spec::new(Algorithm::SlidingWindow, rate(1_001, 60), 1_001);
        let sub = whole.share(2, 4);
        assert_eq!(
            resolve(&request("rl:{hot:k:s02}", &sub), &quotas(), half).unwrap(),
            sub.slice(half)
        );
    }

    #[test]
    fn a_quota_that_is_not_the_primarys_is_refused() {
        let q = quotas();
        let whole = Share::WHOLE;
        let plain = Spec::new(Algorithm::TokenBucket, rate(1_000, 60), 1_500);
        for other in [
            Spec::new(Algorithm::TokenBucket, rate(1_001, 60), 1_500),
            Spec::new(Algorithm::TokenBucket, rate(1_000, 30), 1_500),
            Spec::new(Algorithm::TokenBucket, rate(1_000, 60), 1_000_000),
            Spec::new(Algorithm::SlidingWindow, rate(1_000, 60), 1_000),
            Spec::new(Algorithm::FixedWindow, rate(1_000, 60), 1_000),
        ] {
            assert!(
                matches!(
                    resolve(&request("rl:{api:k}", &other), &q, whole),
                    Err(Refusal::Mismatch(..))
                ),
                "{other:?}"
            );
        }
        assert_eq!(
            resolve(&request("rl:{nope:k}", &plain), &q, whole),
            Err(Refusal::NoLimit("nope".into()))
        );
        assert_eq!(
            resolve(&request("rl:{rls:edge:k=v}", &plain), &q, whole),
            Err(Refusal::Rls)
        );
        // 251, 250, 250, 250.
        let sub = Spec::new(Algorithm::SlidingWindow, rate(1_001, 60), 1_001).share(1, 4);
        for key in ["rl:{hot:k}", "rl:{hot:k:s04}", "rl:{hot:k:sx}"] {
            assert!(
                matches!(resolve(&request(key, &sub), &q, whole), Err(Refusal::Shard(_))),
                "{key}"
            );
        }
        // Another sub-bucket's share is not this one's.
        assert!(matches!(
            resolve(&request("rl:{hot:k:s00}", &sub), &q, whole),
            Err(Refusal::Mismatch(..))
        ));
    }
}
