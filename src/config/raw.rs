//! The serde mirror of `gateway.toml`: exactly the keys a user may write.
//!
//! Every struct denies unknown fields, so a typo is an error rather than a
//! silence. Values that need checking after parsing are `Spanned` so the
//! compile step can point at their line.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    #[serde(default)]
    pub gateway: Gateway,
    pub listeners: Spanned<Listeners>,
    pub tls: Option<Spanned<Tls>>,
    #[serde(default)]
    pub store: Store,
    #[serde(default)]
    pub leasing: Leasing,
    #[serde(default)]
    pub identity: Identity,
    #[serde(default)]
    pub upstreams: Vec<Spanned<Upstream>>,
    #[serde(default)]
    pub routes: Vec<Spanned<Route>>,
    #[serde(default)]
    pub limits: Vec<Spanned<Limit>>,
    pub events: Option<Spanned<Events>>,
    pub rls: Option<Spanned<Rls>>,
    pub region: Option<Spanned<Region>>,
    pub admin: Option<Spanned<Admin>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    pub token_file: Spanned<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gateway {
    pub instance_id: Option<String>,
    pub workers: Option<Spanned<i64>>,
    pub grace_period_ms: Option<Spanned<i64>>,
    pub max_connections: Option<Spanned<i64>>,
    pub max_header_bytes: Option<Spanned<i64>>,
    /// Most bytes of a request body read for a `json:` reserve, and of a
    /// response body (or one event) kept for a `json:` settle.
    pub max_cost_body_bytes: Option<Spanned<i64>>,
    /// Bytes per second a body read to price it must arrive at, averaged
    /// over 5 s; 0: no minimum.
    pub min_body_rate: Option<Spanned<i64>>,
    pub header_read_timeout_ms: Option<Spanned<i64>>,
    pub max_connections_per_ip: Option<Spanned<i64>>,
    pub idle_timeout_ms: Option<Spanned<i64>>,
    pub rate_limit_headers: Option<Spanned<String>>,
    /// `"generate"` | `"forward"` | `"off"`: what becomes of `x-request-id`.
    pub request_id: Option<Spanned<String>>,
    pub access_log: Option<Spanned<String>>,
    /// The access-log fields to keep, or (each `-name`) to drop.
    pub access_log_fields: Option<Spanned<Vec<String>>>,
    /// `true`: refuse `[rls]` or the region link open beyond loopback.
    pub strict: Option<Spanned<bool>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listeners {
    pub http: Option<Spanned<String>>,
    pub https: Option<Spanned<String>>,
    pub admin: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
    pub client_ca: Option<Spanned<String>>,
    pub client_hello_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    pub backend: Option<Spanned<String>>,
    pub url: Option<Spanned<String>>,
    pub cluster: Option<Spanned<Vec<String>>>,
    pub sentinel: Option<Spanned<Vec<String>>>,
    pub sentinel_master: Option<Spanned<String>>,
    pub ca: Option<Spanned<String>>,
    pub timeout_ms: Option<Spanned<i64>>,
    pub connect_timeout_ms: Option<Spanned<i64>>,
    pub ready_without_store: Option<Spanned<bool>>,
    pub max_keys: Option<Spanned<i64>>,
    pub fleet_size: Option<Spanned<i64>>,
    #[serde(default)]
    pub breaker: Breaker,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Breaker {
    pub failures: Option<Spanned<i64>>,
    pub open_ms: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Leasing {
    pub min: Option<Spanned<i64>>,
    pub max: Option<Spanned<i64>>,
    pub lookahead_ms: Option<Spanned<i64>>,
    pub ttl_ms: Option<Spanned<i64>>,
    pub max_fraction: Option<Spanned<f64>>,
    pub max_block_ms: Option<Spanned<i64>>,
    pub reserve: Option<Spanned<bool>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    #[serde(default)]
    pub trusted_proxies: Vec<Spanned<String>>,
    pub ipv4_prefix: Option<Spanned<i64>>,
    pub ipv6_prefix: Option<Spanned<i64>>,
    pub jwt: Option<Spanned<Jwt>>,
    #[serde(default)]
    pub api_keys: Vec<Spanned<ApiKey>>,
    pub api_keys_file: Option<Spanned<String>>,
    pub on_invalid_credentials: Option<Spanned<String>>,
    pub max_token_bytes: Option<Spanned<i64>>,
    pub order: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Jwt {
    pub algorithms: Spanned<Vec<String>>,
    pub secret: Option<String>,
    pub secret_env: Option<String>,
    pub public_key: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub tenant_claim: Option<String>,
    pub plan_claim: Option<String>,
    pub jwks_file: Option<String>,
    pub leeway_secs: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub key: Option<String>,
    pub sha256: Option<Spanned<String>>,
    pub tenant: Option<String>,
    pub plan: Option<String>,
    pub id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    pub name: Spanned<String>,
    pub targets: Spanned<Vec<Spanned<String>>>,
    pub connect_timeout_ms: Option<Spanned<i64>>,
    pub request_timeout_ms: Option<Spanned<i64>>,
    pub pool_idle_timeout_ms: Option<Spanned<i64>>,
    pub pool_max_idle_per_host: Option<Spanned<i64>>,
    pub idle_timeout_ms: Option<Spanned<i64>>,
    pub max_in_flight: Option<Spanned<i64>>,
    /// One client's share of `max_in_flight` (default an eighth).
    pub max_in_flight_per_client: Option<Spanned<i64>>,
    /// `https://` targets: a private CA (PEM) instead of the system roots.
    pub ca: Option<Spanned<String>>,
    pub server_name: Option<Spanned<String>>,
    pub tls_cert: Option<Spanned<String>>,
    pub tls_key: Option<Spanned<String>>,
    /// `"http1"` | `"h2"`.
    pub protocol: Option<Spanned<String>>,
    pub eject_after: Option<Spanned<i64>>,
    pub eject_ms: Option<Spanned<i64>>,
    /// Active health checks.
    pub health: Option<Spanned<HealthCheck>>,
    /// `"round_robin"` | `"least_request"`.
    pub balance: Option<Spanned<String>>,
    /// Retries of an idempotent request whose exchange broke.
    pub retries: Option<Spanned<i64>>,
}

/// `[[upstreams]] health = { path = "/healthz", ... }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    pub path: Spanned<String>,
    pub interval_ms: Option<Spanned<i64>>,
    pub timeout_ms: Option<Spanned<i64>>,
    pub unhealthy: Option<Spanned<i64>>,
    pub healthy: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub name: Spanned<String>,
    pub path_prefix: Spanned<String>,
    /// `false`: `path_prefix` matches without ASCII case.
    pub case_sensitive: Option<Spanned<bool>>,
    pub host: Option<Spanned<String>>,
    pub methods: Option<Spanned<Vec<String>>>,
    pub upstream: Option<Spanned<String>>,
    pub response: Option<Spanned<DirectResponse>>,
    /// Limits whose state the route answers the caller (a usage route).
    pub usage: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub limits: Vec<Spanned<String>>,
    pub on_store_failure: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectResponse {
    pub status: Spanned<i64>,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub name: Spanned<String>,
    pub algorithm: Option<Spanned<String>>,
    /// Required, except for a concurrency limit, which takes `max`.
    pub rate: Option<Spanned<String>>,
    pub max: Option<Spanned<i64>>,
    /// `"claim:NAME"`: the rate from a verified JWT's claim.
    pub rate_from: Option<Spanned<String>>,
    pub max_rate: Option<Spanned<String>>,
    pub burst: Option<Spanned<i64>>,
    pub by: Option<Spanned<Vec<String>>>,
    pub mode: Option<Spanned<String>>,
    pub canary_percent: Option<Spanned<i64>>,
    pub enforce_after: Option<Spanned<String>>,
    #[serde(default)]
    pub plans: BTreeMap<String, Spanned<String>>,
    pub tiers: Option<Spanned<Vec<String>>>,
    pub fallback_rate: Option<Spanned<String>>,
    pub shards: Option<Spanned<i64>>,
    pub shard_by: Option<Spanned<String>>,
    pub queue_ms: Option<Spanned<i64>>,
    pub queue_max: Option<Spanned<i64>>,
    /// `{ reserve = N | "header:NAME" | "json:PATH", settle = "..." }`.
    pub cost: Option<Spanned<Cost>>,
    /// `"all"` | `"refusals"` | `"none"`: which responses show the limit's
    /// `RateLimit*` fields.
    pub headers: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// `"openai" | "anthropic" | "ollama"`: a preset's rules.
    pub api: Option<Spanned<String>>,
    pub reserve: Option<Spanned<NumberOrText>>,
    pub settle: Option<Spanned<String>>,
    pub errors: Option<Spanned<String>>,
    pub reserve_default: Option<Spanned<i64>>,
    /// `"estimate" | "reserve" | N`
    pub unsettled: Option<Spanned<NumberOrText>>,
}

/// A value written as a number or as a string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum NumberOrText {
    Number(i64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Events {
    pub dogstatsd: Option<Spanned<String>>,
    pub min_interval_ms: Option<Spanned<i64>>,
}

/// `[rls]`: the Envoy rate limit services.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rls {
    pub listen: Option<Spanned<String>>,
    pub config: Option<Spanned<String>>,
    pub on_store_failure: Option<Spanned<String>>,
    pub tls_cert: Option<Spanned<String>>,
    pub tls_key: Option<Spanned<String>>,
    pub client_ca: Option<Spanned<String>>,
    pub workers: Option<Spanned<i64>>,
    pub allow_overrides: Option<Spanned<bool>>,
    pub max_override_values: Option<Spanned<i64>>,
    pub max_hits_fraction: Option<Spanned<f64>>,
    pub allow_subjects: Option<Spanned<Vec<String>>>,
}

/// `[region]`: this gateway's region and its quota slice.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    pub name: Spanned<String>,
    pub share: Spanned<f64>,
    pub link: Spanned<String>,
    pub primary: Option<Spanned<String>>,
    pub rebalance_at: Option<Spanned<f64>>,
    pub rebalance_window_ms: Option<Spanned<i64>>,
    pub tls_cert: Option<Spanned<String>>,
    pub tls_key: Option<Spanned<String>>,
    pub client_ca: Option<Spanned<String>>,
    pub allow_subjects: Option<Spanned<Vec<String>>>,
    pub id_secret_file: Option<Spanned<String>>,
}
