//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: the
//! envoyproxy/ratelimit contract on leasegate's limiter.
//!
//! Each descriptor is matched against its domain's rules
//! ([`super::matcher`]) and decided on its own key, with the same leases,
//! store, deadline and breaker as HTTP requests. As in envoyproxy/ratelimit
//! every descriptor is counted, whatever the others say; unlike it, a
//! refused call takes nothing, so a blocked client does not push its own
//! reset away.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::{Request, Response, Status};

use super::matcher;
use crate::config::rls::{RlsLimit, Unit};
use crate::config::RlsFailure;
use crate::limit::keyed::KeyDecision;
use crate::quota::Algorithm;
use crate::runtime::Runtime;
use crate::telemetry::metrics::RlsLabels;

/// Most descriptors one call may carry (envoyproxy/ratelimit has no cap;
/// Envoy's own actions make a handful). Each is a decision, awaited one
/// after another, so an unbounded list is unbounded work for one call.
pub const MAX_DESCRIPTORS: usize = 64;

/// Most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 16;

/// Longest entry, key and value together, in bytes: entries become store
/// keys.
pub const MAX_ENTRY_BYTES: usize = 256;

/// Why a call is refused before any rule is looked at: `None` when it is
/// within every cap.
fn over_a_cap(req: &RateLimitRequest) -> Option<Status> {
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Some(Status::invalid_argument(format!(
            "{} descriptors in one call; at most {MAX_DESCRIPTORS}",
            req.descriptors.len()
        )));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Some(Status::invalid_argument(format!(
                "descriptor {i} has {} entries; at most {MAX_ENTRIES}",
                d.entries.len()
            )));
        }
        if let Some(e) = d.entries.iter().find(|e| e.key.len() + e.value.len() > MAX_ENTRY_BYTES) {
            return Some(Status::invalid_argument(format!(
                "descriptor {i} has an entry of {} bytes (key {:?}...); at most {MAX_ENTRY_BYTES} for key and value together",
                e.key.len() + e.value.len(),
                e.key.chars().take(32).collect::<String>()
            )));
        }
    }
    None
}

/// The RLS v3 service over the runtime's limiter and config.
pub struct ShouldRateLimit {
    runtime: Arc<Runtime>,
    overrides_seen: std::sync::Mutex<OverridesSeen>,
}

impl ShouldRateLimit {
    pub fn new(runtime: Arc<Runtime>) -> ShouldRateLimit {
        ShouldRateLimit {
            runtime,
            overrides_seen: std::sync::Mutex::default(),
        }
    }
}

/// The distinct overrides (requests per unit, unit) obeyed so far in each
/// domain, for `[rls] max_override_values`: each one is a key family of
/// its own in the store, so a caller cycling `requests_per_unit` would
/// otherwise make a fresh, full quota per value. Forgotten at a reload
/// that changes the YAML (a new set of rules).
#[derive(Default)]
pub struct OverridesSeen {
    /// The rules the sets were counted under (their address).
    rules: usize,
    domains: std::collections::HashMap<String, std::collections::HashSet<(u32, Unit)>>,
}

impl OverridesSeen {
    /// Whether the override `(requests_per_unit, unit)` in `domain` is
    /// obeyed: one seen before, or a new one within `max` per domain.
    pub fn admit(&mut self, rules: usize, domain: &str, value: (u32, Unit), max: usize) -> bool {
        if self.rules != rules {
            self.rules = rules;
            self.domains.clear();
        }
        let seen = match self.domains.get_mut(domain) {
            Some(s) => s,
            None => self.domains.entry(domain.to_string()).or_default(),
        };
        if seen.contains(&value) {
            return true;
        }
        if seen.len() >= max {
            return false;
        }
        seen.insert(value);
        true
    }
}

/// The largest `hits_addend` a descriptor may carry against a limit of
/// `capacity`: `fraction` of it, at least 1.
pub fn max_hits(capacity: u64, fraction: f64) -> u64 {
    ((capacity as f64 * fraction).floor() as u64).max(1)
}

/// What one descriptor is checked against.
enum Check {
    /// No rule: OK, no limit reported, nothing counted.
    None,
    /// `unlimited`: OK with the largest remaining.
    Unlimited,
    Limit {
        limit: Arc<RlsLimit>,
        key: String,
    },
}

#[tonic::async_trait]
impl RateLimitService for ShouldRateLimit {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        if req.domain.is_empty() {
            return Err(Status::invalid_argument("rate limit domain must not be empty"));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument("rate limit descriptor list must not be empty"));
        }
        if let Some(refused) = over_a_cap(&req) {
            return Err(refused);
        }
        let config = self.runtime.config();
        let rls = config.rls.as_ref();
        let domain = rls.and_then(|r| r.rules.domains.get(&req.domain));
        let mut checks: Vec<Check> = req
            .descriptors
            .iter()
            .map(|d| match (domain, rls) {
                (Some(level), Some(rls)) => {
                    let allowed = self.override_allowed(rls, &req.domain, d);
                    check_for(&req.domain, level, d, if allowed { overrides(rls) } else { None })
                }
                _ => Check::None,
            })
            .collect();
        apply_replaces(&mut checks);

        let limiter = &self.runtime.limiter;
        // In a region, each region's store holds its slice, as for HTTP.
        let share = self.runtime.share();
        // Each limited descriptor's hits and quota, all checked against
        // `max_hits_fraction` before any is counted: a refused call takes
        // nothing.
        let fraction = rls.map_or(0.1, |r| r.max_hits_fraction);
        let mut plans = Vec::with_capacity(checks.len());
        for (check, d) in checks.iter().zip(&req.descriptors) {
            let Check::Limit { limit, .. } = check else {
                plans.push(None);
                continue;
            };
            let hits = match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(req.hits_addend.max(1)),
            };
            let rule = limit.spec();
            let keyed = limiter.keyed();
            let overridden = keyed
                .has_overrides()
                .then(|| keyed.rls_override(&req.domain, &entries_of(d), &rule, share))
                .flatten();
            let spec = overridden.unwrap_or_else(|| rule.slice(share));
            let most = max_hits(spec.capacity, fraction);
            if limit.requests_per_unit > 0 && hits > most {
                return Err(Status::invalid_argument(format!(
                    "hits_addend {hits} is above {most}, the most one call may take of this limit's {} \
                     ([rls] max_hits_fraction = {fraction})",
                    spec.capacity
                )));
            }
            plans.push(Some((hits, spec)));
        }
        let mut statuses = Vec::with_capacity(checks.len());
        let mut quota_over = (0usize, 0usize); // (quota-mode descriptors, of which over)
        for (check, plan) in checks.iter().zip(plans) {
            let status = match (check, plan) {
                (Check::None, _) | (Check::Limit { .. }, None) => status(Code::Ok, None, 0, 0),
                (Check::Unlimited, _) => status(Code::Ok, None, u64::from(u32::MAX), 0),
                (Check::Limit { limit, key }, Some((hits, spec))) => {
                    let decision = if limit.requests_per_unit == 0 || hits > spec.capacity {
                        // Nothing is ever allowed (no limit, or more hits
                        // than the whole quota): no store call to make, and
                        // nothing taken, so one absurd addend cannot drain
                        // the key for everyone else.
                        Ok(KeyDecision {
                            admitted: hits == 0,
                            remaining: 0,
                            reset_ms: 0,
                            retry_after_ms: 0,
                        })
                    } else {
                        limiter.keyed().check_key(key, &spec, hits).await
                    };
                    match decision {
                        Ok(dec) => {
                            let over = !dec.admitted;
                            if limit.quota_mode {
                                quota_over.0 += 1;
                                quota_over.1 += usize::from(over);
                            }
                            let code = if over && !limit.shadow_mode {
                                Code::OverLimit
                            } else {
                                Code::Ok
                            };
                            if over && limit.shadow_mode {
                                tracing::debug!(key = %key, "rls shadow_mode over limit");
                            }
                            status(code, Some(limit), if over { 0 } else { dec.remaining }, dec.reset_ms)
                        }
                        Err(e) => match rls.map_or(RlsFailure::Unavailable, |r| r.on_store_failure) {
                            RlsFailure::Unavailable => {
                                return Err(Status::unavailable(format!("quota store: {e}")));
                            }
                            RlsFailure::Allow => status(Code::Ok, Some(limit), 0, 0),
                        },
                    }
                }
            };
            statuses.push(status);
        }
        // Quota-mode descriptors refuse only when every one of them is over.
        if quota_over.0 > 0 && quota_over.1 < quota_over.0 {
            for (s, check) in statuses.iter_mut().zip(&checks) {
                if matches!(check, Check::Limit { limit, .. } if limit.quota_mode) && s.code == Code::OverLimit as i32 {
                    s.code = Code::Ok as i32;
                }
            }
        }
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        let overall = if over { Code::OverLimit } else { Code::Ok };
        let label = if domain.is_some() {
            req.domain.clone()
        } else {
            "unknown".to_string()
        };
        self.runtime
            .metrics
            .rls_requests
            .get_or_create(&RlsLabels {
                domain: label,
                code: overall.as_str_name(),
            })
            .inc();
        Ok(Response::new(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

impl ShouldRateLimit {
    /// Whether `d`'s own `limit`, if any, may be obeyed: overrides are on
    /// and it is one of the first `max_override_values` distinct ones of
    /// its domain (past them, the descriptor is matched against the YAML).
    fn override_allowed(&self, rls: &crate::config::Rls, domain: &str, d: &RateLimitDescriptor) -> bool {
        let (Some(o), true) = (&d.limit, rls.allow_overrides) else {
            return true;
        };
        let (Some(unit), Some(cap)) = (unit_of(o.unit), rls.rules.longest_unit) else {
            return true;
        };
        let rules = Arc::as_ptr(&rls.rules) as usize;
        let admitted = match self.overrides_seen.lock() {
            Ok(mut seen) => seen.admit(
                rules,
                domain,
                (o.requests_per_unit, unit.min(cap)),
                rls.max_override_values,
            ),
            Err(_) => false,
        };
        if !admitted {
            tracing::debug!(
                domain,
                max = rls.max_override_values,
                "rls override past max_override_values: the YAML's rules apply"
            );
        }
        admitted
    }
}

/// What a descriptor's own `limit` may do: `None`, ignored (`[rls]
/// allow_overrides = false`); else its unit is capped at this one (the
/// longest of the YAML's rules; `None` inside: no rule has a unit, so no
/// override applies either).
type Overrides = Option<Option<crate::config::rls::Unit>>;

fn overrides(rls: &crate::config::Rls) -> Overrides {
    rls.allow_overrides.then_some(rls.rules.longest_unit)
}

/// The rule a descriptor is checked against in a known domain. A limit
/// the request carries (Envoy's per-action override) replaces the rules
/// and is never in shadow mode, as in envoyproxy/ratelimit; unless
/// `[rls] allow_overrides = false`, and with its unit capped at the
/// longest unit of the YAML (a caller cannot make year-long keys).
fn check_for(domain: &str, level: &crate::config::rls::Level, d: &RateLimitDescriptor, overrides: Overrides) -> Check {
    let entries: Vec<(&str, &str)> = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
    if let (Some(o), Some(cap)) = (&d.limit, overrides) {
        let (Some(unit), Some(cap)) = (unit_of(o.unit), cap) else {
            return Check::None;
        };
        let unit = unit.min(cap);
        let limit = Arc::new(RlsLimit {
            full_key: String::new(),
            name: String::new(),
            requests_per_unit: o.requests_per_unit,
            unit,
            unlimited: false,
            replaces: Vec::new(),
            shadow_mode: false,
            quota_mode: false,
            share_threshold: false,
            algorithm: Algorithm::FixedWindow,
        });
        // The override's quota is part of its key: two overrides on the
        // same entries count apart, as theirs do.
        let mut key = matcher::store_key(domain, &entries, None);
        key.insert_str(key.len() - 1, &format!(":@{}/{}", o.requests_per_unit, unit.as_str()));
        return Check::Limit { limit, key };
    }
    match matcher::find(level, &entries) {
        None => Check::None,
        Some(m) if m.limit.unlimited => Check::Unlimited,
        Some(m) => Check::Limit {
            key: matcher::store_key(domain, &entries, m.shared_pattern),
            limit: Arc::clone(m.limit),
        },
    }
}

/// A descriptor's entries, as the matcher and the overrides read them.
fn entries_of(d: &RateLimitDescriptor) -> smallvec::SmallVec<[(&str, &str); 4]> {
    d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect()
}

/// `replaces`: a matched limit named by another matched limit's
/// `replaces` is not checked.
fn apply_replaces(checks: &mut [Check]) {
    let replaced: Vec<String> = checks
        .iter()
        .filter_map(|c| match c {
            Check::Limit { limit, .. } => Some(limit.replaces.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for c in checks.iter_mut() {
        if let Check::Limit { limit, .. } = c {
            if !limit.name.is_empty() && replaced.contains(&limit.name) {
                *c = Check::None;
            }
        }
    }
}

fn unit_of(unit: i32) -> Option<Unit> {
    Some(match PbUnit::try_from(unit).ok()? {
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
        PbUnit::Unknown => return None,
    })
}

fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn status(code: Code, limit: Option<&Arc<RlsLimit>>, remaining: u64, reset_ms: u64) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit.map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: pb_unit(l.unit) as i32,
        }),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: limit.map(|_| PbDuration {
            seconds: i64::try_from(reset_ms / 1_000).unwrap_or(i64::MAX),
            nanos: ((reset_ms % 1_000) * 1_000_000) as i32,
        }),
        quota: None,
    }
}
