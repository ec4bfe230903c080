//! A limit's policy, in the core's own vocabulary: what a `[[limits]]`
//! entry says once validated. `config` builds these from `gateway.toml`;
//! nothing here knows the file. [`Limit::try_new`] is the one constructor
//! that checks a limit, so every rule a limit obeys is written once, here.

use crate::identity::Tier;
use crate::quota::{Algorithm, Rate, Share, Spec, MAX_UNITS};
use crate::spelling::spellings;

/// The rollout stage of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shadow,
    Soft,
    Canary,
    Enforce,
}

spellings!(Mode {
    Shadow => "shadow",
    Soft => "soft",
    Canary => "canary",
    Enforce => "enforce",
});

/// Which rate-limit headers responses carry (`[gateway] rate_limit_headers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// The IETF `RateLimit`/`RateLimit-Policy` pair and the legacy trio.
    #[default]
    All,
    Ietf,
    Legacy,
    None,
}

spellings!(HeaderStyle {
    All => "all",
    Ietf => "ietf",
    Legacy => "legacy",
    None => "none",
});

/// Which responses show a limit's `RateLimit*` fields (`[[limits]]
/// headers`); the style of those fields is `[gateway] rate_limit_headers`'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitHeaders {
    /// Every response the limit decided: admitted and refused.
    #[default]
    All,
    /// 429s only, as Envoy's ratelimit filter does by default.
    Refusals,
    /// None: a 429 it makes says only when to retry (`Retry-After` and the
    /// problem+json body).
    None,
}

spellings!(LimitHeaders {
    All => "all",
    Refusals => "refusals",
    None => "none",
});

impl LimitHeaders {
    /// Whether a response shows the limit's fields: `refusal` for a 429.
    pub fn shown(self, refusal: bool) -> bool {
        match self {
            LimitHeaders::All => true,
            LimitHeaders::Refusals => refusal,
            LimitHeaders::None => false,
        }
    }
}

/// One part of a limit's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Identity,
    Tenant,
    Route,
    Ip,
    /// The client's network, whatever its identity tier: a ceiling that a
    /// client minting identities (random header names under one TLS
    /// fingerprint) cannot escape. Bare `subnet` is /24 (IPv4) or /64
    /// (IPv6); `subnet/48` sets the IPv6 prefix, `subnet/16/48` both.
    Subnet {
        v4: u8,
        v6: u8,
    },
    Header(http::HeaderName),
}

/// What picks a request's sub-bucket of a sharded limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardBy {
    Ip,
    Identity,
}

spellings!(ShardBy {
    Ip => "ip",
    Identity => "identity",
});

/// What a route does while the store is away (`on_store_failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailure {
    /// Fail open: admit against a local fallback bucket.
    Allow,
    /// Fail closed: answer 503.
    Deny,
}

spellings!(StoreFailure {
    Allow => "allow",
    Deny => "deny",
});

/// Most sub-buckets one key may be split into.
pub const MAX_SHARDS: u32 = 1_000;

/// A limit before it is checked: every field, public, with
/// [`Draft::new`]'s defaults for the ones a caller leaves out.
/// [`Limit::try_new`] turns it into a [`Limit`].
#[derive(Debug, Clone)]
pub struct Draft {
    pub name: String,
    pub algorithm: Algorithm,
    pub rate: Rate,
    /// Token bucket capacity; for a sliding window, equal to the rate's count.
    pub burst: u64,
    pub by: Vec<KeyPart>,
    pub mode: Mode,
    pub canary_percent: u8,
    /// `YYYY-MM-DD`, announced by `soft` warnings.
    pub enforce_after: Option<String>,
    /// Plan name → rate override.
    pub plans: Vec<(String, Rate)>,
    /// Identity tiers this limit applies to; `None`: all.
    pub tiers: Option<Vec<Tier>>,
    /// Rate of the local fallback bucket while the store is away; `None`:
    /// the limit's own rate divided by `[store] fleet_size`.
    pub fallback_rate: Option<Rate>,
    /// Sub-buckets per key (1: not sharded).
    pub shards: u32,
    pub shard_by: ShardBy,
    /// This region's slice of every quota of the limit (`[region] share`;
    /// the whole without `[region]`). Applied last, by
    /// [`crate::limit::key_spec`], after the plan and the sub-bucket.
    pub share: Share,
    /// How long a request this limit refuses may wait, in arrival order,
    /// for a token instead (0: refused at once).
    pub queue_ms: u64,
    /// Most requests waiting at once per key; one more is refused at once.
    pub queue_max: u32,
    /// `rate_from = "claim:NAME"`: a caller with a verified JWT carrying
    /// a rate in that claim gets it, clamped by `max_rate`.
    pub rate_from: Option<RateFrom>,
    /// `cost = { reserve, settle }`: what a request takes at admission,
    /// and where its real cost is read once the response ends (`None`: 1).
    pub cost: Option<super::cost::Cost>,
    /// Which responses show the limit's `RateLimit*` fields.
    pub headers: LimitHeaders,
}

/// Where a limit takes a caller's rate from: a verified JWT claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateFrom {
    /// The claim's name.
    pub claim: String,
    /// Its place in the identity's rate claims
    /// ([`crate::identity::Identity::rates`]).
    pub index: usize,
    /// The most a claim may give (`max_rate`): a larger rate is cut to it.
    pub max: Rate,
}

impl RateFrom {
    /// The rate and capacity a caller gets from a claim's text: its rate,
    /// cut to `max` per second, with a capacity of at most `max`'s count
    /// (a `864000/day` claim under `600/min` gets 10/s, not a burst of
    /// 864 000); `None` for a claim that is not a rate, or one past the
    /// 2^53 rule every configured rate obeys (the limit's own rate then).
    pub fn quota(&self, claim: &str) -> Option<(Rate, u64)> {
        let rate: Rate = claim.parse().ok()?;
        if !fits(rate.count, &rate) {
            return None;
        }
        let rate = self.clamp(rate);
        Some((rate, rate.count.min(self.max.count)))
    }

    /// The rate a caller gets from `claimed`: its own, or `max` when
    /// `claimed` allows more per second.
    pub fn clamp(&self, claimed: Rate) -> Rate {
        let per = |r: &Rate| (u128::from(r.count), r.period.as_nanos().max(1));
        let ((c, cp), (m, mp)) = (per(&claimed), per(&self.max));
        if c * mp > m * cp {
            self.max
        } else {
            claimed
        }
    }
}

/// `queue_max` by default.
pub const DEFAULT_QUEUE_MAX: u32 = 100;

impl Draft {
    /// A token-bucket limit at `rate` with every other field at its default:
    /// burst = the rate's count, keyed by identity, enforced, no plans,
    /// tiers, fallback rate or shards.
    pub fn new(name: &str, rate: Rate) -> Draft {
        Draft {
            name: name.to_string(),
            algorithm: Algorithm::TokenBucket,
            rate,
            burst: rate.count,
            by: vec![KeyPart::Identity],
            mode: Mode::Enforce,
            canary_percent: 5,
            enforce_after: None,
            plans: vec![],
            tiers: None,
            fallback_rate: None,
            shards: 1,
            shard_by: ShardBy::Ip,
            share: Share::WHOLE,
            queue_ms: 0,
            queue_max: DEFAULT_QUEUE_MAX,
            rate_from: None,
            cost: None,
            headers: LimitHeaders::All,
        }
    }

    /// Every rule this draft breaks, in field order (none: it makes a
    /// [`Limit`]).
    pub fn problems(&self) -> Vec<PolicyError> {
        let mut out = Vec::new();
        let name_ok = !self.name.is_empty()
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !name_ok {
            out.push(PolicyError::Name(self.name.clone()));
        }
        if self.burst == 0 {
            out.push(PolicyError::Burst(self.burst));
        } else if !fits(self.burst, &self.rate) {
            out.push(PolicyError::TooLarge(Field::Rate));
        }
        if self.by.is_empty() {
            out.push(PolicyError::NoKeyParts);
        }
        if self.canary_percent > 100 {
            out.push(PolicyError::CanaryPercent(self.canary_percent));
        }
        for (plan, rate) in &self.plans {
            if !fits(rate.count, rate) {
                out.push(PolicyError::TooLarge(Field::Plan(plan.clone())));
            }
        }
        if let Some(rate) = &self.fallback_rate {
            if !fits(rate.count, rate) {
                out.push(PolicyError::TooLarge(Field::FallbackRate));
            }
        }
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            out.push(PolicyError::ShardsRange(self.shards));
        } else {
            // Every sub-bucket needs at least one token of every quota.
            let smallest = self
                .plans
                .iter()
                .map(|(_, r)| r.count)
                .chain([self.rate.count, self.burst])
                .min()
                .unwrap_or(1);
            if u64::from(self.shards) > smallest {
                out.push(PolicyError::Shards {
                    shards: self.shards,
                    smallest,
                });
            }
        }
        out
    }
}

/// True when a bucket of `capacity` tokens refilled at `rate` stays exact in
/// a double: levels are kept in units of capacity × period (ms), and the
/// Redis scripts compute in doubles, exact only below 2^53.
pub fn fits(capacity: u64, rate: &Rate) -> bool {
    fits_ms(
        capacity,
        u64::try_from(rate.period.as_millis()).unwrap_or(u64::MAX).max(1),
    )
}

/// [`fits`] for a period in milliseconds: the one place the rule is
/// written (the Envoy YAML and the region link check their quotas by it).
pub fn fits_ms(capacity: u64, period_ms: u64) -> bool {
    u128::from(capacity) * u128::from(period_ms) < u128::from(MAX_UNITS)
}

/// The field of a [`Draft`] a [`PolicyError`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Name,
    Rate,
    Burst,
    By,
    CanaryPercent,
    Plan(String),
    FallbackRate,
    Shards,
}

/// A rule a limit breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{0:?}: use letters, digits, '_', '-' and '.' only")]
    Name(String),
    #[error("{0} is out of range: use 1 or more")]
    Burst(u64),
    #[error("{} is too large (keep it below 2^53 token-milliseconds)", match .0 { Field::Rate => "burst × period", _ => "count × period" })]
    TooLarge(Field),
    #[error("list at least one key part")]
    NoKeyParts,
    #[error("{0} is out of range: use 0 to 100")]
    CanaryPercent(u8),
    #[error("{0} is out of range: use 1 to {MAX_SHARDS}")]
    ShardsRange(u32),
    #[error("{shards} sub-buckets for a quota of {smallest}: each needs at least one token")]
    Shards { shards: u32, smallest: u64 },
}

impl PolicyError {
    /// The field the rule is about.
    pub fn field(&self) -> Field {
        match self {
            PolicyError::Name(_) => Field::Name,
            PolicyError::Burst(_) => Field::Burst,
            PolicyError::TooLarge(f) => f.clone(),
            PolicyError::NoKeyParts => Field::By,
            PolicyError::CanaryPercent(_) => Field::CanaryPercent,
            PolicyError::ShardsRange(_) | PolicyError::Shards { .. } => Field::Shards,
        }
    }
}

/// A checked limit: a [`Draft`] that passed every rule, made only by
/// [`Limit::try_new`]. Its fields are the draft's, read through `Deref`;
/// nothing outside this module can build or change one.
#[derive(Debug, Clone)]
pub struct Limit(Draft);

impl std::ops::Deref for Limit {
    type Target = Draft;

    fn deref(&self) -> &Draft {
        &self.0
    }
}

impl Limit {
    /// The one way to make a limit: `draft` checked against every rule of
    /// [`Draft::problems`]; the first it breaks is the error.
    pub fn try_new(draft: Draft) -> Result<Limit, PolicyError> {
        match draft.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(Limit(draft)),
        }
    }

    /// This region's slice of every quota of the limit.
    pub fn share(&self) -> Share {
        self.0.share
    }

    /// The same limit on another slice of its quota (a share is a valid
    /// fraction by construction, so nothing needs checking again).
    pub fn with_share(&self, share: Share) -> Limit {
        Limit(Draft {
            share,
            ..self.0.clone()
        })
    }

    /// Whether the limit applies to a request whose identity came from
    /// `tier` (`tiers` unset: every tier).
    pub fn applies_to(&self, tier: Tier) -> bool {
        self.tiers.as_ref().is_none_or(|t| t.contains(&tier))
    }

    /// True when the identity changes nothing about this limit: it applies
    /// to every tier, has no plans, is not split by identity, and its key
    /// is made of `ip`, `subnet`, `route` and `header:` parts only. Such a
    /// limit can refuse a request before its identity is resolved.
    pub fn identity_free(&self) -> bool {
        self.tiers.is_none()
            && self.plans.is_empty()
            && (self.shards <= 1 || self.shard_by == ShardBy::Ip)
            && self.by.iter().all(|p| {
                matches!(
                    p,
                    KeyPart::Ip | KeyPart::Subnet { .. } | KeyPart::Route | KeyPart::Header(_)
                )
            })
    }

    /// The quota for callers without a plan override.
    pub fn spec(&self) -> Spec {
        Spec::new(self.algorithm, self.rate, self.burst)
    }

    /// The quota for a caller on `plan`: the plan's rate, with a capacity of
    /// its count, or the limit's own quota when the plan has no override.
    pub fn spec_for(&self, plan: Option<&str>) -> Spec {
        match plan.and_then(|p| self.plans.iter().find(|(name, _)| name == p)) {
            Some((_, rate)) => Spec::new(self.algorithm, *rate, rate.count),
            None => self.spec(),
        }
    }

    /// The quota of the local fallback bucket for a key of `spec` while the
    /// store is away: `fallback_rate` (this region's slice of it) when set,
    /// else `spec` divided over the fleet (`[store] fleet_size`).
    pub fn fallback_spec(&self, spec: &Spec, fleet_size: u64) -> Spec {
        match self.fallback_rate {
            Some(rate) => Spec::new(self.algorithm, rate, rate.count).slice(self.share),
            None => spec.divided(fleet_size),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_claimed_rate_is_cut_to_max_rate_per_second() {
        let rf = super::RateFrom {
            claim: "r".into(),
            index: 0,
            max: "600/min".parse().unwrap(),
        };
        let r = |s: &str| s.parse::<crate::quota::Rate>().unwrap();
        assert_eq!(rf.clamp(r("5/s")), r("5/s"));
        assert_eq!(rf.clamp(r("10/s")), r("10/s"), "equal per second: its own");
        assert_eq!(rf.clamp(r("11/s")), r("600/min"));
        assert_eq!(rf.clamp(r("1000000/day")), r("600/min"), "11.6/s over a day: cut");
        assert_eq!(rf.clamp(r("800000/day")), r("800000/day"), "9.3/s: its own");
        // The capacity: never above max_rate's count.
        assert_eq!(rf.quota("5/s"), Some((r("5/s"), 5)));
        assert_eq!(rf.quota("800000/day"), Some((r("800000/day"), 600)));
        assert_eq!(rf.quota("lots"), None);
        assert_eq!(
            rf.quota("100000000000/day"),
            None,
            "past 2^53 token-ms: not a rate to take"
        );
    }

    use super::*;

    fn rate(s: &str) -> Rate {
        s.parse().unwrap()
    }

    #[test]
    fn a_default_draft_is_a_limit() {
        let l = Limit::try_new(Draft::new("api", rate("10/s"))).unwrap();
        assert_eq!((l.burst, l.shards, l.share()), (10, 1, Share::WHOLE));
    }

    #[test]
    fn every_broken_rule_is_listed_with_its_field() {
        let d = Draft {
            burst: 0,
            by: vec![],
            canary_percent: 101,
            shards: 0,
            ..Draft::new("bad name", rate("10/s"))
        };
        let fields: Vec<Field> = d.problems().iter().map(PolicyError::field).collect();
        assert_eq!(
            fields,
            [
                Field::Name,
                Field::Burst,
                Field::By,
                Field::CanaryPercent,
                Field::Shards
            ]
        );
        assert!(Limit::try_new(d).is_err());
    }

    #[test]
    fn the_2_pow_53_rule_holds_for_every_quota_of_a_limit() {
        // 10^9 per day: 10^9 × 86 400 000 ms is above 2^53.
        let huge = rate("1000000000/day");
        assert!(!fits(huge.count, &huge));
        assert!(fits(1_000_000, &rate("1000000/day")));
        let d = Draft {
            plans: vec![("gold".into(), huge)],
            fallback_rate: Some(huge),
            ..Draft::new("api", huge)
        };
        let fields: Vec<Field> = d.problems().iter().map(PolicyError::field).collect();
        assert_eq!(fields, [Field::Rate, Field::Plan("gold".into()), Field::FallbackRate]);
        assert_eq!(
            d.problems()[0].to_string(),
            "burst × period is too large (keep it below 2^53 token-milliseconds)"
        );
        assert_eq!(
            d.problems()[1].to_string(),
            "count × period is too large (keep it below 2^53 token-milliseconds)"
        );
    }

    #[test]
    fn every_sub_bucket_needs_a_token_of_every_quota() {
        let d = Draft {
            shards: 4,
            plans: vec![("free".into(), rate("3/min"))],
            ..Draft::new("api", rate("100/min"))
        };
        assert_eq!(d.problems(), [PolicyError::Shards { shards: 4, smallest: 3 }]);
        let ok = Draft { shards: 3, ..d };
        assert!(Limit::try_new(ok).is_ok());
    }

    #[test]
    fn a_new_share_keeps_everything_else() {
        let l = Limit::try_new(Draft::new("api", rate("10/s"))).unwrap();
        let half = Share::from_fraction(0.5).unwrap();
        let s = l.with_share(half);
        assert_eq!((s.share(), s.name.as_str(), s.burst), (half, "api", 10));
    }
}
