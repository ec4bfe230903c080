//! What `leasegate check` prints of a valid config: the one-screen
//! summary, and the warnings about what is valid but likely not meant
//! (also logged at start).

use std::fmt::Write as _;

use super::{Config, StoreBackend};
use crate::limit::policy::Mode;
use crate::store::redis::redact;

impl Config {
    /// The store, as the summary and `check --ping-store` name it (no
    /// password).
    pub fn store_shown(&self) -> String {
        match &self.store.backend {
            StoreBackend::Memory => "memory".to_string(),
            StoreBackend::Redis { url } => format!("redis {}", redact(url)),
            StoreBackend::RedisCluster { seeds } => {
                format!("redis cluster ({} seeds)", seeds.len())
            }
            StoreBackend::RedisSentinel { sentinels, master } => {
                format!("redis sentinel, master {master:?} ({} sentinels)", sentinels.len())
            }
        }
    }

    /// The one-screen summary printed by `leasegate check`.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: OK (sha256 {})",
            self.source.path.display(),
            self.source.sha256_hex()
        );
        let _ = writeln!(
            s,
            "instance  {} ({} workers, x-request-id {})",
            self.gateway.instance_id,
            self.gateway.workers,
            self.gateway.request_id.as_str()
        );
        let l = &self.listeners;
        for (name, addr) in [("http", l.http), ("https", l.https), ("admin", l.admin)] {
            if let Some(addr) = addr {
                let _ = writeln!(s, "listener  {name:<6} {addr}");
            }
        }
        if let Some(tls) = &self.tls {
            let _ = writeln!(s, "tls       cert {}", tls.cert.display());
        }
        let store = self.store_shown();
        let _ = writeln!(s, "store     {store}, timeout {} ms", self.store.timeout.as_millis());
        for u in &self.upstreams {
            let scheme = if u.tls.is_some() { "https://" } else { "" };
            let targets: Vec<_> = u.targets.iter().map(|t| format!("{scheme}{}", t.as_str())).collect();
            let h2 = if u.protocol == crate::proxy::upstream::Protocol::H2 {
                " (h2)"
            } else {
                ""
            };
            let mut extra = String::new();
            if u.balance == crate::proxy::upstream::Balance::LeastRequest {
                extra.push_str(", least_request");
            }
            if let Some(h) = &u.active {
                let _ = write!(extra, ", health {} every {} ms", h.path, h.interval.as_millis());
            }
            if u.retries > 0 {
                let _ = write!(extra, ", retries {}", u.retries);
            }
            let _ = writeln!(s, "upstream  {} -> {}{h2}{extra}", u.name, targets.join(", "));
        }
        for r in self.routes.iter() {
            let target = match &r.action {
                crate::route::Action::Forward(u) => format!("upstream {}", u.name),
                crate::route::Action::Respond(d) => format!("responds {}", d.status.as_u16()),
                crate::route::Action::Usage(_) => "answers usage".to_string(),
            };
            let host = r.host.as_deref().map(|h| format!(" host {h}")).unwrap_or_default();
            let case = if r.case_sensitive { "" } else { " (any case)" };
            let limits = if r.limits.is_empty() {
                String::new()
            } else {
                let names: Vec<&str> = r
                    .limits
                    .iter()
                    .filter_map(|&i| self.limits.get(i))
                    .map(|l| l.name.as_str())
                    .collect();
                format!(", limits {}", names.join(", "))
            };
            let _ = writeln!(
                s,
                "route     {} {}{case}{host} -> {target}{limits}",
                r.name, r.path_prefix
            );
        }
        for lim in &self.limits {
            if lim.algorithm == crate::quota::Algorithm::Concurrency {
                let _ = write!(
                    s,
                    "limit     {} concurrency max {} in flight ({})",
                    lim.name,
                    lim.burst,
                    lim.mode.as_str()
                );
            } else {
                let _ = write!(
                    s,
                    "limit     {} {} {} burst {} ({})",
                    lim.name,
                    lim.algorithm.as_str(),
                    lim.rate,
                    lim.burst,
                    lim.mode.as_str()
                );
            }
            if lim.shards > 1 {
                let _ = write!(s, ", {} shards by {}", lim.shards, lim.shard_by.as_str());
            }
            if let Some(f) = lim.fallback_rate {
                let _ = write!(s, ", fallback {f}");
            }
            if let Some(c) = &lim.cost {
                let _ = write!(s, ", cost {}", c.describe());
            }
            if lim.headers != super::LimitHeaders::All {
                let _ = write!(s, ", headers {}", lim.headers.as_str());
            }
            s.push('\n');
        }
        if let Some(r) = &self.region {
            let primary = match &r.primary {
                Some(p) => format!("primary {p}"),
                None => "the primary".to_string(),
            };
            let _ = writeln!(
                s,
                "region    {}: share {} of every limit, link {}, {primary}",
                r.name, r.share, r.link
            );
        }
        if let Some(r) = &self.rls {
            let _ = writeln!(
                s,
                "rls       grpc {}: {} domain(s), {} rule(s) with a limit, from {}; on store failure {}",
                r.listen,
                r.rules.domains.len(),
                r.rules.limit_count(),
                r.config_path.display(),
                r.on_store_failure.as_str()
            );
        }
        if let Some(e) = &self.events {
            let _ = writeln!(
                s,
                "events    dogstatsd {}, at most one per key per {} ms",
                e.dogstatsd,
                e.min_interval.as_millis()
            );
        }
        for w in self.warnings() {
            let _ = writeln!(s, "warning   {w}");
        }
        s
    }

    /// What is valid but likely not meant: a Redis-backed, fail-open route
    /// whose limit would let a fleet falling back together admit more than
    /// the quota (a `fallback_rate` that, on `[store] fleet_size`
    /// instances, adds up to more than the limit's rate). The default
    /// fallback is bounded by twice what the fleet was admitting, so it is
    /// never named here.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.open_planes();
        out.extend(self.llm_warnings());
        if self.store.backend == StoreBackend::Memory {
            return out;
        }
        for (i, lim) in self.limits.iter().enumerate() {
            let Some(fallback) = lim.fallback_rate else { continue };
            if matches!(lim.mode, Mode::Shadow | Mode::Soft) {
                continue;
            }
            let routes: Vec<&str> = self
                .routes
                .iter()
                .filter(|r| r.on_store_failure == crate::limit::policy::StoreFailure::Allow && r.limits.contains(&i))
                .map(|r| r.name.as_str())
                .collect();
            let instances = self.store.fleet_size.unwrap_or(1);
            let fleet = fallback.per_second() * instances as f64;
            if routes.is_empty() || fleet <= lim.rate.per_second() * 1.000_001 {
                continue;
            }
            out.push(format!(
                "limit {}: fallback_rate {fallback} on each of {} instance(s) ([store] fleet_size) admits up to {:.3}/s \
                 while the store is away, more than its rate {} ({:.3}/s); fail-open route(s): {}",
                lim.name,
                instances,
                fleet,
                lim.rate,
                lim.rate.per_second(),
                routes.join(", ")
            ));
        }
        out
    }

    /// A route that forwards to an LLM API (a limit with a cost preset)
    /// through an upstream that keeps the default 30 s
    /// `request_timeout_ms`: a long completion that is not streamed sends
    /// its head only when it is done, and would be cut with a 504.
    fn llm_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in self.routes.iter() {
            let crate::route::Action::Forward(u) = &r.action else {
                continue;
            };
            let preset = r
                .limits
                .iter()
                .filter_map(|&i| self.limits.get(i))
                .find_map(|l| l.cost.as_ref().and_then(|c| c.api));
            if let Some(api) = preset {
                if u.request_timeout == std::time::Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS) {
                    out.push(format!(
                        "route {}: a limit reads the {} API, and upstream {} keeps the default request_timeout_ms \
                         ({DEFAULT_REQUEST_TIMEOUT_MS}): a long completion that is not streamed answers only when it \
                         is done and would be cut with a 504; set request_timeout_ms = 600000 on the upstream",
                        r.name,
                        api.as_str(),
                        u.name
                    ));
                }
            }
        }
        out
    }
}

/// `[[upstreams]] request_timeout_ms` when not set.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
