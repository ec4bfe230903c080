//! The link's messages: JSON over HTTP/1.1, `POST /v1/transfer`.

use serde::{Deserialize, Serialize};

use crate::quota::{Algorithm, Rate, Share, Spec};

/// The path transfers are asked on.
pub const TRANSFER_PATH: &str = "/v1/transfer";
/// The path that answers 200 while the link serves (a probe).
pub const HEALTH_PATH: &str = "/v1/health";
/// Largest request body the link reads.
pub const MAX_BODY: usize = 16 * 1024;
/// Longest transfer window (and so record) the primary accepts.
pub const MAX_WINDOW_MS: u64 = 86_400_000;

/// A region asks the primary for tokens of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferRequest {
    /// One per (region, key, window): a retry sends the same id.
    pub id: u64,
    /// The asking region's name (for logs).
    pub region: String,
    /// The store key, `rl:{...}`.
    pub key: String,
    /// `token_bucket`, `sliding_window` or `fixed_window`.
    pub algorithm: String,
    /// The key's whole quota (before any region's slice): the primary
    /// checks it against its own limit for the key and refuses a
    /// difference ([`super::quotas::resolve`]); it never runs on it.
    pub count: u64,
    pub period_ms: u64,
    pub capacity: u64,
    /// Tokens asked for.
    pub want: u64,
    /// How long the tokens may be spent, and so how long the primary
    /// remembers the id (twice that).
    pub window_ms: u64,
}

/// The primary's answer: what it moved for this id (the same on a retry).
/// Fields it may add later are ignored, so a newer primary still answers
/// an older region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferAnswer {
    pub id: u64,
    pub granted: u64,
}

/// Why a transfer request was refused before any store call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    #[error("not a transfer request: {0}")]
    Json(String),
    #[error("key {0:?} is not a rate-limit key (rl:{{...}})")]
    Key(String),
    #[error("unknown algorithm {0:?}")]
    Algorithm(String),
    #[error("quota out of range (count, period_ms and capacity ≥ 1, capacity × period below 2^53)")]
    Quota,
    #[error("window_ms out of range (1 to {MAX_WINDOW_MS})")]
    Window,
}

/// The limit a store key belongs to: `rl:{<limit>}` or
/// `rl:{<limit>:<parts>}`, the whole key one hash tag, nothing after the
/// closing brace and no brace inside (part values never hold one), at most
/// 1 KiB; the limit named as the config names limits.
pub fn key_limit(key: &str) -> Option<&str> {
    if key.len() > 1024 {
        return None;
    }
    let inner = key.strip_prefix("rl:{")?.strip_suffix('}')?;
    if inner.contains(['{', '}']) {
        return None;
    }
    let limit = inner.split(':').next()?;
    let named = !limit.is_empty() && limit.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    named.then_some(limit)
}

impl TransferRequest {
    /// A request for `want` tokens of `key`, whose quota here is `spec`.
    pub fn new(id: u64, region: &str, key: &str, spec: &Spec, want: u64, window_ms: u64) -> TransferRequest {
        let whole = spec.whole();
        TransferRequest {
            id,
            region: region.to_string(),
            key: key.to_string(),
            algorithm: whole.algorithm.as_str().to_string(),
            count: whole.count,
            period_ms: whole.period_ms(),
            capacity: whole.capacity,
            want,
            window_ms,
        }
    }

    /// Parses and checks a request body.
    pub fn parse(body: &[u8]) -> Result<TransferRequest, BadRequest> {
        let r: TransferRequest = serde_json::from_slice(body).map_err(|e| BadRequest::Json(e.to_string()))?;
        // The link touches rate-limit buckets only, never another key.
        if key_limit(&r.key).is_none() {
            return Err(BadRequest::Key(r.key));
        }
        if r.window_ms == 0 || r.window_ms > MAX_WINDOW_MS {
            return Err(BadRequest::Window);
        }
        r.spec(Share::WHOLE)?;
        Ok(r)
    }

    /// The key's quota in a region of `share`: what that region's limiter
    /// uses for the key.
    pub fn spec(&self, share: Share) -> Result<Spec, BadRequest> {
        // The store transfers out of a fixed window too
        // (TRANSFER_OUT_FIXED): the algorithm of the RLS rules. A
        // concurrency limit holds slots, not tokens to transfer.
        let algorithm = match Algorithm::from_spelling(&self.algorithm) {
            Some(a) if a != Algorithm::Concurrency => a,
            _ => return Err(BadRequest::Algorithm(self.algorithm.clone())),
        };
        let ok = self.count >= 1
            && self.capacity >= 1
            && self.period_ms >= 1
            && crate::limit::policy::fits_ms(self.capacity, self.period_ms);
        if !ok {
            return Err(BadRequest::Quota);
        }
        let rate = Rate {
            count: self.count,
            period: std::time::Duration::from_millis(self.period_ms),
        };
        Ok(Spec::new(algorithm, rate, self.capacity).slice(share))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn whole() -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            Rate {
                count: 10_000,
                period: Duration::from_secs(60),
            },
            10_000,
        )
    }

    #[test]
    fn a_request_carries_the_whole_quota_and_the_primary_slices_it() {
        let eu = whole().slice(Share::from_fraction(0.3).unwrap());
        let r = TransferRequest::new(7, "eu", "rl:{api:k}", &eu, eu.capacity, 20_000);
        assert_eq!((r.count, r.capacity, r.want), (10_000, 10_000, 3_000));
        let body = serde_json::to_vec(&r).unwrap();
        let back = TransferRequest::parse(&body).unwrap();
        assert_eq!(back, r);
        let primary = back.spec(Share::from_fraction(0.4).unwrap()).unwrap();
        assert_eq!(primary, whole().slice(Share::from_fraction(0.4).unwrap()));
    }

    #[test]
    fn every_algorithm_the_store_transfers_out_of_crosses_the_link() {
        for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindow, Algorithm::FixedWindow] {
            let spec = Spec::new(
                algorithm,
                Rate {
                    count: 100,
                    period: Duration::from_secs(60),
                },
                100,
            );
            let r = TransferRequest::new(3, "eu", "rl:{api:k}", &spec, 10, 20_000);
            assert_eq!(r.algorithm, algorithm.as_str());
            let back = TransferRequest::parse(&serde_json::to_vec(&r).unwrap()).unwrap();
            assert_eq!(back.spec(Share::WHOLE).unwrap(), spec, "{algorithm:?}");
        }
    }

    #[test]
    fn the_link_refuses_what_is_not_a_bucket_transfer() {
        let ok = TransferRequest::new(1, "eu", "rl:{api:k}", &whole(), 5, 1_000);
        let with = |f: &dyn Fn(&mut TransferRequest)| {
            let mut r = ok.clone();
            f(&mut r);
            TransferRequest::parse(&serde_json::to_vec(&r).unwrap())
        };
        assert!(with(&|_| {}).is_ok());
        assert!(matches!(with(&|r| r.key = "config:x".into()), Err(BadRequest::Key(_))));
        // One hash tag, the whole key: nothing after it, no brace inside.
        for key in [
            "rl:{api:k}x",
            "rl:{api:k}:credit",
            "rl:{api:k}}",
            "rl:{api:{k}",
            "rl:{}",
            "rl:{:k}",
            "rl:{a b:k}",
            "rl:{api:k",
        ] {
            assert!(
                matches!(with(&|r| r.key = key.into()), Err(BadRequest::Key(_))),
                "{key}"
            );
        }
        assert_eq!(key_limit("rl:{api:k:s03}"), Some("api"));
        assert_eq!(key_limit("rl:{global}"), Some("global"));
        assert_eq!(key_limit("rl:{rls:edge:k=v}"), Some("rls"));
        assert!(matches!(
            with(&|r| r.algorithm = "leaky".into()),
            Err(BadRequest::Algorithm(_))
        ));
        assert!(matches!(with(&|r| r.capacity = 0), Err(BadRequest::Quota)));
        assert!(matches!(with(&|r| r.capacity = 1 << 50), Err(BadRequest::Quota)));
        assert!(matches!(with(&|r| r.window_ms = 0), Err(BadRequest::Window)));
        assert!(matches!(
            TransferRequest::parse(b"{\"id\":1}"),
            Err(BadRequest::Json(_))
        ));
        assert!(matches!(
            TransferRequest::parse(b"{\"id\":1,\"extra\":2}"),
            Err(BadRequest::Json(_))
        ));
    }
}
