//! `gateway.toml`: raw → validated → compiled.
//!
//! [`load`] reads a file, parses it into the serde mirror ([`raw`]), and
//! compiles it into an immutable [`Config`]: routes resolved to upstreams,
//! limits resolved by name, rates parsed, TLS material loaded. `leasegate
//! check` and `leasegate run` run exactly this pipeline. A config either
//! compiles whole or not at all.

mod compile;
pub mod error;
pub mod raw;
pub mod reload;
pub mod rls;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

pub use error::{ConfigError, Problem};

use crate::quota::Rate;
use crate::route::RouteTable;
use crate::upstream::Upstream;

/// A validated, compiled config. Immutable once built; a reload builds a new one.
#[derive(Debug)]
pub struct Config {
    pub source: Source,
    pub gateway: Gateway,
    pub listeners: Listeners,
    pub tls: Option<Tls>,
    pub store: Store,
    pub leasing: Leasing,
    /// The identity waterfall, compiled from `[identity]`.
    pub identity: crate::identity::Resolver,
    pub upstreams: Vec<Arc<Upstream>>,
    pub routes: RouteTable,
    pub limits: Vec<Arc<Limit>>,
    /// `[events]`; `None`: no events are sent.
    pub events: Option<Events>,
    /// `[rls]`; `None`: no Envoy rate limit service.
    pub rls: Option<Rls>,
    /// `[region]`; `None`: this gateway enforces whole quotas and has no
    /// inter-region link.
    pub region: Option<Region>,
}

/// `[rls]`: Envoy's rate limit services over gRPC.
#[derive(Debug, Clone)]
pub struct Rls {
    pub listen: SocketAddr,
    /// The YAML file or directory, resolved against gateway.toml's directory.
    pub config_path: PathBuf,
    pub on_store_failure: RlsFailure,
    pub rules: Arc<rls::RlsRules>,
}

/// What ShouldRateLimit answers when the store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlsFailure {
    /// gRPC `UNAVAILABLE`: Envoy applies its `failure_mode_deny` per route.
    Unavailable,
    /// `OK`: every request passes.
    Allow,
}

impl RlsFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            RlsFailure::Unavailable => "unavailable",
            RlsFailure::Allow => "allow",
        }
    }
}

/// Where a config came from.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    /// SHA-256 of the file's bytes.
    pub sha256: [u8; 32],
    pub loaded_at: SystemTime,
}

impl Source {
    pub fn sha256_hex(&self) -> String {
        self.sha256.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

#[derive(Debug, Clone)]
pub struct Gateway {
    pub instance_id: String,
    /// Worker threads, each a single-threaded runtime with its own listeners.
    pub workers: usize,
    /// How long a shutdown waits for in-flight requests.
    pub grace_period: Duration,
    /// Open client connections across all listeners and workers.
    pub max_connections: usize,
    /// Largest request head (HTTP/1.1 buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
    /// A client must finish sending its request head within this time.
    pub header_read_timeout: Duration,
    /// Open connections from one client address (an IPv6 client: its /64);
    /// `trusted_proxies` are exempt.
    pub max_connections_per_ip: usize,
    /// An HTTP/1.1 connection with no request in flight, an HTTP/2
    /// connection with no open stream, or a tunnel that moves no byte, is
    /// closed after this long.
    pub idle_timeout: Duration,
    /// Which rate-limit headers responses carry.
    pub rate_limit_headers: HeaderStyle,
    /// One line per request on stdout.
    pub access_log: AccessLog,
}

/// `[gateway] access_log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessLog {
    #[default]
    Json,
    Text,
    Off,
}

/// `[gateway] rate_limit_headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// The IETF `RateLimit`/`RateLimit-Policy` pair and the legacy trio.
    #[default]
    All,
    Ietf,
    Legacy,
    None,
}

#[derive(Debug, Clone, Default)]
pub struct Listeners {
    pub http: Option<SocketAddr>,
    pub https: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
}

#[derive(Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub server_config: Arc<rustls::ServerConfig>,
    /// A client must deliver its whole ClientHello within this time.
    pub client_hello_timeout: Duration,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_hello_timeout", &self.client_hello_timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreBackend {
    Memory,
    Redis {
        url: String,
    },
    RedisCluster {
        seeds: Vec<String>,
    },
    /// The master the sentinels name for `master`.
    RedisSentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

#[derive(Debug, Clone)]
pub struct Store {
    pub backend: StoreBackend,
    /// Deadline of every store call.
    pub timeout: Duration,
    /// Most keys the memory store tracks.
    pub max_keys: usize,
    /// How many instances share the store: the default fallback rate of a
    /// limit while the store is away is its rate divided by this.
    pub fleet_size: u64,
    pub breaker: crate::store::guard::BreakerSettings,
}

#[derive(Debug, Clone)]
pub struct Leasing {
    pub min: u64,
    pub max: u64,
    pub lookahead: Duration,
    pub ttl: Duration,
    /// Largest share of a bucket one lease may take.
    pub max_fraction: f64,
    /// Longest local block after a refusal.
    pub max_block: Duration,
}

/// `[events]`: shadow and soft decisions as DogStatsD events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Events {
    /// The agent's UDP address.
    pub dogstatsd: SocketAddr,
    /// At most one event per key per this long.
    pub min_interval: Duration,
}

/// `[region]`: this region's slice of every quota and its link to the
/// other regions.
#[derive(Debug, Clone, PartialEq)]
pub struct Region {
    pub name: String,
    /// This region's slice of every limit's quota.
    pub share: crate::quota::Share,
    /// Where this gateway serves the inter-region link.
    pub link: SocketAddr,
    /// The primary region's link (`http://host:port`); `None`: this gateway
    /// is in the primary region.
    pub primary: Option<http::Uri>,
    /// Ask the primary for more once a key used this much of its slice ...
    pub rebalance_at: f64,
    /// ... and at most once per key per this long, for tokens that last
    /// this long.
    pub rebalance_window: Duration,
}

pub use crate::quota::Algorithm;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shadow,
    Soft,
    Canary,
    Enforce,
}

impl Mode {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Shadow => "shadow",
            Mode::Soft => "soft",
            Mode::Canary => "canary",
            Mode::Enforce => "enforce",
        }
    }
}

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

#[derive(Debug, Clone)]
pub struct Limit {
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
    pub tiers: Option<Vec<crate::identity::Tier>>,
    /// Rate of the local fallback bucket while the store is away; `None`:
    /// the limit's own rate divided by `[store] fleet_size`.
    pub fallback_rate: Option<Rate>,
    /// Sub-buckets per key (1: not sharded).
    pub shards: u32,
    pub shard_by: ShardBy,
    /// This region's slice of every quota of the limit (`[region] share`;
    /// the whole without `[region]`). Applied last, by
    /// [`crate::limit::key_spec`], after the plan and the sub-bucket.
    pub share: crate::quota::Share,
}

/// What picks a request's sub-bucket of a sharded limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardBy {
    Ip,
    Identity,
}

impl ShardBy {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ShardBy::Ip => "ip",
            ShardBy::Identity => "identity",
        }
    }
}

impl Limit {
    /// A token-bucket limit at `rate` with every other key at its default
    /// (burst = the rate's count, keyed by identity, enforced, no plans,
    /// tiers, fallback rate or shards): for tests and benchmarks, with
    /// struct update for the keys they vary.
    pub fn new(name: &str, rate: Rate) -> Limit {
        Limit {
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
            share: crate::quota::Share::WHOLE,
        }
    }

    /// Whether the limit applies to a request whose identity came from
    /// `tier` (`tiers` unset: every tier).
    pub fn applies_to(&self, tier: crate::identity::Tier) -> bool {
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
    pub fn spec(&self) -> crate::quota::Spec {
        crate::quota::Spec::new(self.algorithm, self.rate, self.burst)
    }

    /// The quota for a caller on `plan`: the plan's rate, with a capacity of
    /// its count, or the limit's own quota when the plan has no override.
    pub fn spec_for(&self, plan: Option<&str>) -> crate::quota::Spec {
        match plan.and_then(|p| self.plans.iter().find(|(name, _)| name == p)) {
            Some((_, rate)) => crate::quota::Spec::new(self.algorithm, *rate, rate.count),
            None => self.spec(),
        }
    }

    /// The quota of the local fallback bucket for a key of `spec` while the
    /// store is away: `fallback_rate` (this region's slice of it) when set,
    /// else `spec` divided over the fleet (`[store] fleet_size`).
    pub fn fallback_spec(&self, spec: &crate::quota::Spec, fleet_size: u64) -> crate::quota::Spec {
        match self.fallback_rate {
            Some(rate) => crate::quota::Spec::new(self.algorithm, rate, rate.count).slice(self.share),
            None => spec.divided(fleet_size),
        }
    }
}

/// Lives with the Redis store, which logs its addresses too: a store
/// imports nothing from `config`.
pub use crate::store::redis::redact;

/// Combines gateway.toml's digest with the `[rls]` files' digest.
pub fn inputs_digest(toml: &[u8; 32], rls: Option<&[u8; 32]>) -> [u8; 32] {
    match rls {
        None => *toml,
        Some(r) => {
            let mut d = Sha256::new();
            d.update(toml);
            d.update(r);
            d.finalize().into()
        }
    }
}

/// Reads, parses and compiles a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        ConfigError::Invalid(vec![Problem {
            file: path.display().to_string(),
            line: None,
            key: "(document)".into(),
            reason: format!("not UTF-8 text: {e}"),
        }])
    })?;
    parse(path, &text)
}

/// Parses and compiles config text as if read from `path` (relative paths in
/// it resolve against `path`'s directory).
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let raw: raw::File =
        toml::from_str(text).map_err(|e| ConfigError::Invalid(vec![error::from_toml(&file, text, &e)]))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let source = Source {
        path: path.to_path_buf(),
        sha256: Sha256::digest(text.as_bytes()).into(),
        loaded_at: SystemTime::now(),
    };
    compile::compile(raw, source, &file, text, &base)
}

impl Config {
    /// SHA-256 of everything this config was read from: gateway.toml's
    /// bytes, and the `[rls]` YAML files' when there are any. A reload
    /// compares it with the files on disk.
    pub fn inputs_sha256(&self) -> [u8; 32] {
        match &self.rls {
            None => self.source.sha256,
            Some(r) => inputs_digest(&self.source.sha256, Some(&r.rules.digest)),
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
            "instance  {} ({} workers)",
            self.gateway.instance_id, self.gateway.workers
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
        let store = match &self.store.backend {
            StoreBackend::Memory => "memory".to_string(),
            StoreBackend::Redis { url } => format!("redis {}", redact(url)),
            StoreBackend::RedisCluster { seeds } => {
                format!("redis cluster ({} seeds)", seeds.len())
            }
            StoreBackend::RedisSentinel { sentinels, master } => {
                format!("redis sentinel, master {master:?} ({} sentinels)", sentinels.len())
            }
        };
        let _ = writeln!(s, "store     {store}, timeout {} ms", self.store.timeout.as_millis());
        for u in &self.upstreams {
            let targets: Vec<_> = u.targets.iter().map(|t| t.as_str()).collect();
            let _ = writeln!(s, "upstream  {} -> {}", u.name, targets.join(", "));
        }
        for r in self.routes.iter() {
            let target = match &r.action {
                crate::route::Action::Forward(u) => format!("upstream {}", u.name),
                crate::route::Action::Respond(d) => format!("responds {}", d.status.as_u16()),
            };
            let host = r.host.as_deref().map(|h| format!(" host {h}")).unwrap_or_default();
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
            let _ = writeln!(s, "route     {} {}{host} -> {target}{limits}", r.name, r.path_prefix);
        }
        for lim in &self.limits {
            let _ = write!(
                s,
                "limit     {} {:?} {} burst {} ({:?})",
                lim.name, lim.algorithm, lim.rate, lim.burst, lim.mode
            );
            if lim.shards > 1 {
                let _ = write!(s, ", {} shards by {}", lim.shards, lim.shard_by.as_str());
            }
            if let Some(f) = lim.fallback_rate {
                let _ = write!(s, ", fallback {f}");
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
        if self.store.backend == StoreBackend::Memory {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, lim) in self.limits.iter().enumerate() {
            let Some(fallback) = lim.fallback_rate else { continue };
            if matches!(lim.mode, Mode::Shadow | Mode::Soft) {
                continue;
            }
            let routes: Vec<&str> = self
                .routes
                .iter()
                .filter(|r| r.on_store_failure == crate::route::StoreFailure::Allow && r.limits.contains(&i))
                .map(|r| r.name.as_str())
                .collect();
            let fleet = fallback.per_second() * self.store.fleet_size as f64;
            if routes.is_empty() || fleet <= lim.rate.per_second() * 1.000_001 {
                continue;
            }
            out.push(format!(
                "limit {}: fallback_rate {fallback} on each of {} instance(s) ([store] fleet_size) admits up to {:.3}/s \
                 while the store is away, more than its rate {} ({:.3}/s); fail-open route(s): {}",
                lim.name,
                self.store.fleet_size,
                fleet,
                lim.rate,
                lim.rate.per_second(),
                routes.join(", ")
            ));
        }
        out
    }
}
