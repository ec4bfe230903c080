//! Per-tenant limits changed at run time: an override gives one caller
//! (`tier:value`, such as `key:acme`, or `tenant:acme` for every identity
//! of a tenant) its own rate and burst under one limit, until it is
//! deleted or expires.
//!
//! Overrides live in the store ([`crate::store::FleetTables::overrides`]: one hash per
//! limit and a version on Redis, so they outlive restarts and reach the
//! whole fleet; in memory on the memory store). Each instance loads them
//! all when the version moved: at once when the store announces a change
//! (Redis pub/sub), and at the latest at its poll each second
//! ([`OverridesFollower::run`]), so a notice lost to a reconnect costs a
//! second, not the change. The request path
//! reads a table swapped in whole: with no override at all, one relaxed
//! load per limit.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::key::Facts;
use super::policy::fits;
use super::{LimitRuntime, Limiter};
use crate::clock::Clock;
use crate::quota::{Algorithm, Rate, Spec};
use crate::store::{FleetStore, OverrideOp, StoreError};
use crate::sync::Recover as _;

/// How often an instance asks the store for the overrides' version.
pub const POLL_MS: u64 = 1_000;

/// One caller's quota under one limit, in place of the limit's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Override {
    pub rate: Rate,
    /// The token bucket's capacity (a window's is the rate's count).
    pub burst: u64,
    /// When it stops applying, in Unix milliseconds; `None`: never.
    pub expires_ms: Option<u64>,
}

/// Why an override was refused (the admin API's 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    #[error("the body must be JSON such as {{\"rate\": \"20/min\", \"burst\": 20, \"expires\": \"2027-01-31T00:00:00Z\"}}: {0}")]
    Body(String),
    #[error("rate {0:?}: {1}")]
    Rate(String, crate::quota::RateError),
    #[error("burst must be 1 or more, and burst × period below 2^53 token-milliseconds")]
    Burst,
    #[error("burst applies to token buckets only; a {0} allows the rate's count")]
    BurstNotBucket(&'static str),
    #[error("expires {0:?} is not an RFC 3339 time in the future, such as 2027-01-31T00:00:00Z")]
    Expires(String),
    #[error("{0:?} is not tier:value (user, key, cert, fingerprint, subnet or tenant, such as key:acme), or for rls:<domain> an Envoy descriptor's entries (key=value joined by commas)")]
    Who(String),
    #[error("a concurrency limit has no rate to override")]
    Concurrency,
    #[error("at most {} overrides per limit", crate::store::MAX_OVERRIDES_PER_LIMIT)]
    Full,
}

/// 9999-12-31T23:59:59.999Z: the latest expiry an RFC 3339 time can say
/// (humantime's formatting panics past it).
const MAX_EXPIRES_MS: u64 = 253_402_300_799_999;

/// The admin API's body.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    rate: String,
    burst: Option<u64>,
    expires: Option<String>,
}

/// The stored form.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    rate: String,
    burst: u64,
    expires_ms: Option<u64>,
}

impl Override {
    /// An admin request's body for a limit of `algorithm`, checked.
    pub fn from_request(body: &[u8], algorithm: Algorithm, now_unix_ms: u64) -> Result<Override, OverrideError> {
        if algorithm == Algorithm::Concurrency {
            return Err(OverrideError::Concurrency);
        }
        let r: Request = serde_json::from_slice(body).map_err(|e| OverrideError::Body(e.to_string()))?;
        let rate: Rate = r.rate.parse().map_err(|e| OverrideError::Rate(r.rate.clone(), e))?;
        let burst = match (r.burst, algorithm) {
            (None, _) => rate.count,
            (Some(_), Algorithm::SlidingWindow | Algorithm::FixedWindow) => {
                return Err(OverrideError::BurstNotBucket(algorithm.as_str()))
            }
            (Some(b), _) => b,
        };
        if burst == 0 || !fits(burst, &rate) || !fits(rate.count, &rate) {
            return Err(OverrideError::Burst);
        }
        let expires_ms = match r.expires {
            None => None,
            Some(text) => {
                let at = humantime::parse_rfc3339_weak(&text).map_err(|_| OverrideError::Expires(text.clone()))?;
                let ms = at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|_| OverrideError::Expires(text.clone()))?
                    .as_millis() as u64;
                if ms <= now_unix_ms || ms > MAX_EXPIRES_MS {
                    return Err(OverrideError::Expires(text));
                }
                Some(ms)
            }
        };
        Ok(Override {
            rate,
            burst,
            expires_ms,
        })
    }

    /// As the store keeps it.
    pub fn encode(&self) -> String {
        serde_json::to_string(&Stored {
            rate: self.rate.to_string(),
            burst: self.burst,
            expires_ms: self.expires_ms,
        })
        .unwrap_or_default()
    }

    /// From the store; `None` for what this version cannot read (among it
    /// an `expires_ms` past the last second of year 9999, which no admin
    /// request can set and no RFC 3339 time can show).
    pub fn decode(text: &str) -> Option<Override> {
        let s: Stored = serde_json::from_str(text).ok()?;
        let rate: Rate = s.rate.parse().ok()?;
        if s.expires_ms.is_some_and(|e| e > MAX_EXPIRES_MS) {
            return None;
        }
        (s.burst > 0 && fits(s.burst, &rate)).then_some(Override {
            rate,
            burst: s.burst,
            expires_ms: s.expires_ms,
        })
    }

    pub fn in_force(&self, now_unix_ms: u64) -> bool {
        self.expires_ms.is_none_or(|e| e > now_unix_ms)
    }

    /// The override as the admin API and `/config` show it.
    pub fn json(&self, limit: &str, who: &str) -> serde_json::Value {
        serde_json::json!({
            "limit": limit,
            "who": who,
            "rate": self.rate.to_string(),
            "burst": self.burst,
            "expires": self.expires_ms.map(|ms| {
                let at = std::time::UNIX_EPOCH + Duration::from_millis(ms.min(MAX_EXPIRES_MS));
                humantime::format_rfc3339_seconds(at).to_string()
            }),
        })
    }
}

/// Whether `who` names a caller as an override may: `tier:value`.
pub fn valid_who(who: &str) -> Result<(), OverrideError> {
    let ok = who.split_once(':').is_some_and(|(tier, value)| {
        matches!(tier, "user" | "key" | "cert" | "fingerprint" | "subnet" | "tenant")
            && !value.is_empty()
            && value.len() <= 512
            && !value.chars().any(char::is_control)
    });
    ok.then_some(()).ok_or_else(|| OverrideError::Who(who.to_string()))
}

/// Whether `who` names an Envoy descriptor as an override of an `[rls]`
/// domain (`rls:<domain>`) may: its entries, `key=value` joined by commas,
/// in Envoy's order (`tenant=acme` or `tenant=acme,path=/v1`), with `%`,
/// `,` and `=` inside a key or value written `%25`, `%2C` and `%3D`
/// ([`descriptor_part`]), so no value can pass for several entries.
pub fn valid_descriptor(who: &str) -> Result<(), OverrideError> {
    let ok = !who.is_empty()
        && who.len() <= 1_024
        && who.split(',').all(|e| {
            let mut kv = e.split('=');
            matches!((kv.next(), kv.next(), kv.next()), (Some(k), Some(_), None) if !k.is_empty())
        })
        && !who.chars().any(char::is_control);
    ok.then_some(()).ok_or_else(|| OverrideError::Who(who.to_string()))
}

/// A descriptor entry's key or value as an override names it: `%`, `,`
/// and `=` percent-encoded, so a client's value (`bigcorp,path=/v1`)
/// cannot read as another descriptor's entries.
fn descriptor_part(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            ',' => out.push_str("%2C"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

/// limit → who → override.
type Table = HashMap<String, HashMap<String, Override>>;

/// This instance's copy of the fleet's overrides.
#[derive(Default)]
pub(super) struct Overrides {
    /// Whether any is loaded: the request path's one test.
    any: AtomicBool,
    /// The store's version this copy was loaded at.
    version: AtomicU64,
    /// The limits it was loaded for (a reload may name others).
    loaded_for: Mutex<Vec<String>>,
    table: ArcSwap<Table>,
    /// Rung by the store's change notices: poll now.
    changed: Arc<tokio::sync::Notify>,
}

impl Limiter {
    /// The quota of `limit`'s key for `facts`, its sub-bucket, and the
    /// override in force for the caller (its identity's, else its
    /// tenant's), if any. What every decision asks.
    ///
    /// Inline, and the override's lookup out of line: the common case (no
    /// override loaded) is a few compares, not a call that saves and
    /// restores every register the lookup would use.
    #[inline]
    pub(super) fn spec_of<'s>(&self, limit: &'s LimitRuntime, facts: &Facts<'_>) -> (Cow<'s, Spec>, Option<u32>) {
        let (spec, shard) = limit.spec_for(facts);
        if !self.overrides.any.load(Ordering::Relaxed) {
            return (spec, shard);
        }
        self.spec_overridden(limit, facts, spec, shard)
    }

    #[inline(never)]
    fn spec_overridden<'s>(
        &self,
        limit: &'s LimitRuntime,
        facts: &Facts<'_>,
        spec: Cow<'s, Spec>,
        shard: Option<u32>,
    ) -> (Cow<'s, Spec>, Option<u32>) {
        match self.overrides.for_caller(&limit.config.name, facts, self.wall_ms()) {
            Some(o) => (Cow::Owned(overridden(limit, &o, shard)), shard),
            None => (spec, shard),
        }
    }
}

impl Overrides {
    /// Whether any is loaded: one relaxed load.
    pub(super) fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// The override in force at `now` (Unix ms) for a caller under
    /// `limit`: its identity's, else its tenant's.
    pub(super) fn for_caller(&self, limit: &str, facts: &Facts<'_>, now: u64) -> Option<Override> {
        let table = self.table.load();
        let of_limit = table.get(limit)?;
        let found = of_limit.get(facts.identity).filter(|o| o.in_force(now));
        found.copied().or_else(|| {
            let tenant = facts.tenant?;
            of_limit
                .get(&format!("tenant:{tenant}"))
                .filter(|o| o.in_force(now))
                .copied()
        })
    }

    /// The override in force at `now` for an Envoy descriptor of `domain`
    /// (its entries), and the quota it gives a rule of `rule`'s algorithm
    /// with this region's `share`. One relaxed load when none is loaded.
    pub(super) fn for_descriptor(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        rule: &Spec,
        share: crate::quota::Share,
        now: u64,
    ) -> Option<Spec> {
        if !self.any() {
            return None;
        }
        let table = self.table.load();
        let of_domain = table.get(&format!("rls:{domain}"))?;
        let mut who = String::with_capacity(64);
        for (i, (k, v)) in entries.iter().enumerate() {
            if i > 0 {
                who.push(',');
            }
            descriptor_part(&mut who, k);
            who.push('=');
            descriptor_part(&mut who, v);
        }
        let o = of_domain.get(&who).filter(|o| o.in_force(now))?;
        let burst = match rule.algorithm {
            Algorithm::TokenBucket => o.burst,
            _ => o.rate.count,
        };
        Some(Spec::new(rule.algorithm, o.rate, burst).slice(share))
    }

    /// Every override in force at `now` (Unix ms): (limit, who, override),
    /// sorted.
    pub(super) fn in_force(&self, now: u64) -> Vec<(String, String, Override)> {
        let mut all: Vec<_> = self
            .table
            .load()
            .iter()
            .flat_map(|(l, m)| {
                m.iter()
                    .filter(|(_, o)| o.in_force(now))
                    .map(|(w, o)| (l.clone(), w.clone(), *o))
            })
            .collect();
        all.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        all
    }
}

/// The overrides follower: a task of its own, started by the composition
/// root, that loads the fleet's overrides into the table the limiter reads
/// (at each change notice, and at the latest every [`POLL_MS`]), and makes
/// this instance's own changes (the admin API).
pub struct OverridesFollower {
    store: Arc<dyn FleetStore>,
    overrides: Arc<Overrides>,
    wall: Clock,
}

impl OverridesFollower {
    /// The follower of `limiter`'s store, filling its table.
    pub fn of(limiter: &Limiter) -> OverridesFollower {
        OverridesFollower {
            store: limiter.store.clone(),
            overrides: limiter.overrides.clone(),
            wall: limiter.wall.clone(),
        }
    }

    /// Sets (`Some`) or drops `limit`'s override for `who` in the store,
    /// then loads the fleet's overrides at once, so this instance applies
    /// it before answering (if that load fails, the poll brings it: the
    /// change is made). `limits`: every limit of the config in force.
    /// `Ok(None)`: refused, the limit holds its most overrides already.
    pub async fn change(
        &self,
        limits: &[String],
        limit: &str,
        who: &str,
        to: Option<Override>,
    ) -> Result<Option<u64>, StoreError> {
        let value = to.map(|o| o.encode());
        let op = match &value {
            Some(value) => OverrideOp::Set { limit, who, value },
            None => OverrideOp::Delete { limit, who },
        };
        let answer = self.store.overrides(op).await?;
        if answer.full {
            return Ok(None);
        }
        if let Err(e) = self.poll(limits).await {
            tracing::debug!(error = %e, "overrides: loading after a change failed; the poll brings it");
        }
        Ok(Some(answer.version))
    }

    /// Loads the overrides of `limits` when the store's version moved (or
    /// the limits did): true when the version or the table changed, so a
    /// store that never had an override (version 0, reloaded at each poll)
    /// is no news. Expired overrides are dropped from the store as they
    /// are met.
    pub async fn poll(&self, limits: &[String]) -> Result<bool, StoreError> {
        let version = self.store.overrides(OverrideOp::Version).await?.version;
        let same_limits = *self.overrides.loaded_for.lock().recover() == limits;
        if same_limits && version == self.overrides.version.load(Ordering::Acquire) && version != 0 {
            return Ok(false);
        }
        let loaded = self.store.overrides(OverrideOp::Load(limits)).await?;
        let now = (self.wall)();
        let mut table = Table::new();
        let mut expired = Vec::new();
        for (limit, who, value) in loaded.entries {
            match Override::decode(&value) {
                Some(o) if o.in_force(now) => {
                    table.entry(limit).or_default().insert(who, o);
                }
                Some(_) => expired.push((limit, who)),
                None => tracing::warn!(%limit, %who, "an override this version cannot read is ignored"),
            }
        }
        self.overrides.any.store(!table.is_empty(), Ordering::Relaxed);
        // Swapped, not stored: of two loads racing (the poll woken by a
        // notice, an admin call's own), only one finds news to log.
        let table = Arc::new(table);
        let before = self.overrides.table.swap(table.clone());
        let was = self.overrides.version.swap(loaded.version, Ordering::AcqRel);
        let changed = was != loaded.version || *before != *table;
        *self.overrides.loaded_for.lock().recover() = limits.to_vec();
        for (limit, who) in expired {
            let _ = self
                .store
                .overrides(OverrideOp::Delete {
                    limit: &limit,
                    who: &who,
                })
                .await;
        }
        // Logged here, whoever asked (the poll, a notice, this instance's
        // own admin call), and only on news: an idle poll is silent.
        if changed {
            tracing::info!(
                version = loaded.version,
                overrides = table.values().map(HashMap::len).sum::<usize>(),
                "overrides loaded"
            );
        }
        Ok(changed)
    }

    /// The poller, for as long as the process runs: `limits` names the
    /// limits of the config in force at each poll.
    pub async fn run(self: Arc<Self>, limits: impl Fn() -> Vec<String> + Send + Sync) {
        self.store.watch_overrides(self.overrides.changed.clone());
        let mut failing = false;
        loop {
            match self.poll(&limits()).await {
                Ok(_) => failing = false,
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "overrides: the store did not answer; the last ones stand");
                    }
                    failing = true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(POLL_MS)) => {}
                _ = self.overrides.changed.notified() => {}
            }
        }
    }
}

/// `limit`'s quota under override `o`: the limit's algorithm at the
/// override's rate and burst, then the key's sub-bucket, then this
/// region's slice, as [`super::key_spec`] orders them.
fn overridden(limit: &LimitRuntime, o: &Override, shard: Option<u32>) -> Spec {
    let burst = match limit.spec.algorithm {
        Algorithm::TokenBucket => o.burst,
        _ => o.rate.count,
    };
    let spec = Spec::new(limit.spec.algorithm, o.rate, burst);
    let spec = match shard {
        Some(i) => spec.share(i, limit.config.shards),
        None => spec,
    };
    spec.slice(limit.config.share())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `expires_ms` planted in the store (no admin request can set
    /// one past year 9999) is not read, and showing one never panics.
    #[test]
    fn a_planted_far_expiry_is_ignored_and_never_panics() {
        let planted = r#"{"rate":"1/s","burst":1,"expires_ms":18446744073709551615}"#;
        assert_eq!(Override::decode(planted), None);
        let last = r#"{"rate":"1/s","burst":1,"expires_ms":253402300799999}"#;
        let o = Override::decode(last).unwrap();
        assert_eq!(o.json("l", "key:a")["expires"], "9999-12-31T23:59:59Z");
        let mut far = o;
        far.expires_ms = Some(u64::MAX);
        assert_eq!(far.json("l", "key:a")["expires"], "9999-12-31T23:59:59Z");
    }

    #[test]
    fn requests_are_checked_and_round_trip_through_the_store_form() {
        let now = 1_800_000_000_000;
        let o = Override::from_request(br#"{"rate": "20/min", "burst": 30}"#, Algorithm::TokenBucket, now).unwrap();
        assert_eq!((o.rate.count, o.burst, o.expires_ms), (20, 30, None));
        assert_eq!(Override::decode(&o.encode()), Some(o));
        let later = Override::from_request(
            br#"{"rate": "5/s", "expires": "2027-01-31T00:00:00Z"}"#,
            Algorithm::SlidingWindow,
            now,
        )
        .unwrap();
        assert_eq!(later.burst, 5);
        assert!(later.in_force(now) && !later.in_force(later.expires_ms.unwrap()));
        let refused = |body: &str, alg| Override::from_request(body.as_bytes(), alg, now).unwrap_err();
        assert!(matches!(
            refused(r#"{"rate": "x"}"#, Algorithm::TokenBucket),
            OverrideError::Rate(..)
        ));
        assert_eq!(
            refused(r#"{"rate": "1/s", "burst": 0}"#, Algorithm::TokenBucket),
            OverrideError::Burst
        );
        assert!(matches!(
            refused(r#"{"rate": "1/s", "burst": 3}"#, Algorithm::SlidingWindow),
            OverrideError::BurstNotBucket(_)
        ));
        assert!(matches!(
            refused(
                r#"{"rate": "1/s", "expires": "2001-01-01T00:00:00Z"}"#,
                Algorithm::TokenBucket
            ),
            OverrideError::Expires(_)
        ));
        assert!(matches!(
            refused(r#"{"rate": "1/s", "x": 1}"#, Algorithm::TokenBucket),
            OverrideError::Body(_)
        ));
        assert_eq!(
            refused(r#"{"rate": "1/s"}"#, Algorithm::Concurrency),
            OverrideError::Concurrency
        );
        assert!(valid_who("key:acme").is_ok() && valid_who("tenant:acme").is_ok());
        assert!(valid_descriptor("tenant=acme,path=/v1").is_ok());
        assert!(valid_descriptor("tenant=a%3Db%2Cc").is_ok());
        for bad in ["", "tenant", "=x", "tenant=a=b", "a=b,", "a=\n"] {
            assert!(valid_descriptor(bad).is_err(), "{bad:?}");
        }
        let mut s = String::new();
        descriptor_part(&mut s, "bigcorp,path=/v1%");
        assert_eq!(s, "bigcorp%2Cpath%3D/v1%25");
        for bad in ["acme", "team:acme", "key:", "key:a\nb"] {
            assert!(valid_who(bad).is_err(), "{bad}");
        }
    }
}
