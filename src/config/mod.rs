//! `gateway.toml`: raw → validated → compiled.
//!
//! [`load`] reads a file, parses it into the serde mirror ([`raw`]), and
//! compiles it into an immutable [`Config`]: routes resolved to upstreams,
//! limits resolved by name, rates parsed, TLS material loaded. `leasegate
//! check` and `leasegate run` run exactly this pipeline. A config either
//! compiles whole or not at all.

pub mod admin;
mod compile;
pub mod error;
mod open_planes;
pub mod peer_tls;
pub mod raw;
pub mod rls;
mod summary;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

pub use error::{ConfigError, Problem};

use crate::proxy::upstream::Upstream;
use crate::route::RouteTable;

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
    pub events: Option<crate::events::Settings>,
    /// `[rls]`; `None`: no Envoy rate limit service.
    pub rls: Option<Rls>,
    /// `[region]`; `None`: this gateway enforces whole quotas and has no
    /// inter-region link.
    pub region: Option<Region>,
    /// [`tls_files_digest`] of [`Config::tls_files`] as read at load;
    /// `None` without any.
    pub tls_files_sha256: Option<[u8; 32]>,
}

/// `[rls]`: Envoy's rate limit services over gRPC.
#[derive(Debug, Clone)]
pub struct Rls {
    pub listen: SocketAddr,
    /// The YAML file or directory, resolved against gateway.toml's directory.
    pub config_path: PathBuf,
    pub on_store_failure: RlsFailure,
    pub rules: Arc<rls::RlsRules>,
    /// `tls_cert`, `tls_key`, `client_ca`; `None`: cleartext h2c.
    pub tls: Option<PeerTls>,
    /// Threads of the RLS runtime: a flood of calls cannot delay admin,
    /// the region link, the lease sweeps or a reload.
    pub workers: usize,
    /// Whether a descriptor's own `limit` (RateLimitOverride) is obeyed;
    /// its unit is capped at the longest unit of the YAML.
    pub allow_overrides: bool,
    /// Most distinct overrides (requests per unit and unit) obeyed per
    /// domain; a descriptor carrying another is matched against the YAML.
    pub max_override_values: usize,
    /// Largest `hits_addend` one descriptor may carry, as a fraction of
    /// its limit's capacity (at least 1 hit); above it the call is
    /// `INVALID_ARGUMENT`.
    pub max_hits_fraction: f64,
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
    /// Open connections from one client address (an IPv6 client: its
    /// network at `[identity] ipv6_prefix`);
    /// `trusted_proxies` are exempt.
    pub max_connections_per_ip: usize,
    /// An HTTP/1.1 connection with no request in flight, an HTTP/2
    /// connection with no open stream, or a tunnel that moves no byte, is
    /// closed after this long.
    pub idle_timeout: Duration,
    /// Most bytes of a request body read for a `json:` cost reserve (a
    /// larger body is refused, 413), and of a response body (or one
    /// event) kept for a `json:` settle.
    pub max_cost_body_bytes: usize,
    /// Bytes per second a body read to price it must arrive at, averaged
    /// over each 5 s ([`MIN_BODY_RATE_WINDOW`]); slower is `408`. 0: no
    /// minimum.
    pub min_body_rate: u64,
    /// Which rate-limit headers responses carry.
    pub rate_limit_headers: HeaderStyle,
    /// What becomes of `x-request-id`, on the way up and back.
    pub request_id: RequestIds,
    /// `true`: what `check` would warn of as an open plane is refused.
    pub strict: bool,
    /// One line per request on stdout.
    pub access_log: AccessLog,
    /// The fields its lines carry (`access_log_fields`).
    pub access_log_fields: crate::telemetry::access_log::Fields,
}

/// The window `[gateway] min_body_rate` is averaged over.
pub const MIN_BODY_RATE_WINDOW: Duration = Duration::from_secs(5);

/// `[gateway] request_id`: who sets a request's `x-request-id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestIds {
    /// The client's sane id is kept, else one is made; the upstream gets
    /// it and the client gets it back, in place of any the upstream set.
    #[default]
    Generate,
    /// As `Generate` on the way up; a response that carries its own id
    /// (the upstream's) keeps it, and only one without gets the request's.
    Forward,
    /// None is made or added: the header passes as the client and the
    /// upstream send it, and the gateway's own answers carry none.
    Off,
}

impl RequestIds {
    pub const SPELLINGS: [(&'static str, RequestIds); 3] = [
        ("generate", RequestIds::Generate),
        ("forward", RequestIds::Forward),
        ("off", RequestIds::Off),
    ];

    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestIds::Generate => "generate",
            RequestIds::Forward => "forward",
            RequestIds::Off => "off",
        }
    }
}

/// `[gateway] access_log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessLog {
    #[default]
    Json,
    Text,
    Off,
}

#[derive(Debug, Clone, Default)]
pub struct Listeners {
    pub http: Option<SocketAddr>,
    pub https: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    /// `[admin] token_file`: the admin listener's bearer token; `None`: no
    /// authentication (then the listener must be on a loopback address).
    pub admin_token: Option<admin::AdminToken>,
}

#[derive(Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `client_ca`: clients are asked for a certificate signed by it (not
    /// required); a verified one's subject is the `client_cert` identity.
    pub client_ca: Option<PathBuf>,
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
    /// `ca`: the CA `rediss://` addresses are verified against.
    pub ca: Option<StoreCa>,
    /// Deadline of every store call.
    pub timeout: Duration,
    /// How long start waits for the store's first answer before serving
    /// as in an outage.
    pub connect_timeout: Duration,
    /// `/readyz` answers 200 (true) or 503 (false) while the store has
    /// never answered.
    pub ready_without_store: bool,
    /// Most keys the memory store tracks.
    pub max_keys: usize,
    /// The most instances that share the store, if set: a bound on the
    /// live count by heartbeats, which the default fallback divides a
    /// limit's quota by while the store is away.
    pub fleet_size: Option<u64>,
    pub breaker: crate::store::guard::BreakerSettings,
}

/// `[store] ca`, read at load.
#[derive(Clone)]
pub struct StoreCa {
    pub path: PathBuf,
    pub pem: Vec<u8>,
}

impl std::fmt::Debug for StoreCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCa")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub struct Leasing {
    pub min: u64,
    pub max: u64,
    pub lookahead: Duration,
    pub ttl: Duration,
    /// Largest share of a bucket one lease may take.
    pub max_fraction: f64,
    /// Longest local block after a refusal (a key holding reserved tokens
    /// is blocked until they are due, however long).
    pub max_block: Duration,
    /// Whether a drained token bucket reserves its refill to come for the
    /// instance that asks (off only while a fleet still runs instances that
    /// predate reservations).
    pub reserve: bool,
}

pub use peer_tls::PeerTls;

/// `[region]`: this region's slice of every quota and its link to the
/// other regions.
#[derive(Debug, Clone)]
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
    /// `tls_cert`, `tls_key`, `client_ca`: the link in both directions.
    pub tls: Option<PeerTls>,
    /// `id_secret_file`'s secret: transfer ids are keyed with it, so a peer
    /// without it cannot predict (and pre-record) another's transfer.
    pub id_secret: Option<crate::region::threshold::IdSecret>,
}

use crate::limit::policy::{Draft, HeaderStyle, KeyPart, Limit, LimitHeaders, Mode, ShardBy};
use crate::quota::Algorithm;

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

/// [`inputs_digest`] with the digest of every TLS file
/// ([`tls_files_digest`]) when there is any.
pub fn inputs_digest_with_tls(toml: &[u8; 32], rls: Option<&[u8; 32]>, tls: Option<&[u8; 32]>) -> [u8; 32] {
    let base = inputs_digest(toml, rls);
    match tls {
        None => base,
        Some(t) => {
            let mut d = Sha256::new();
            d.update(base);
            d.update(b"tls");
            d.update(t);
            d.finalize().into()
        }
    }
}

/// SHA-256 of TLS files' bytes, in order (zeros if one cannot be read:
/// unlike any digest in force, so a reload runs and reports it).
pub fn tls_files_digest(files: &[&Path]) -> [u8; 32] {
    let mut d = Sha256::new();
    for f in files {
        match std::fs::read(f) {
            Ok(bytes) => {
                d.update((bytes.len() as u64).to_le_bytes());
                d.update(&bytes);
            }
            Err(_) => return [0; 32],
        }
    }
    d.finalize().into()
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
        toml::from_str(text).map_err(|e| ConfigError::Invalid(error::every_toml_problem(&file, text, e)))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let source = Source {
        path: path.to_path_buf(),
        sha256: Sha256::digest(text.as_bytes()).into(),
        loaded_at: crate::clock::wall_now(),
    };
    compile::compile(raw, source, &file, text, &base)
}

impl Config {
    /// `[leasing]` and `[store]`, as the limiter uses them.
    pub fn limiter_settings(&self) -> crate::limit::Settings {
        let shared = self.shared_limiter_settings();
        match self.store.backend {
            // One instance, its own store: see `Sizing::embedded`.
            StoreBackend::Memory => crate::limit::Settings {
                sizing: shared.sizing.embedded(),
                ..shared
            },
            _ => shared,
        }
    }

    /// [`Config::limiter_settings`] for an instance of a fleet sharing one
    /// store, whatever `[store]` says: the lease sizing as configured.
    /// `leasegate simulate` runs its fleet on these.
    pub fn shared_limiter_settings(&self) -> crate::limit::Settings {
        crate::limit::Settings {
            sizing: crate::limit::lease::Sizing {
                min: self.leasing.min,
                max: self.leasing.max,
                lookahead_ms: self.leasing.lookahead.as_millis() as u64,
                fraction: self.leasing.max_fraction,
                ttl_ms: self.leasing.ttl.as_millis() as u64,
            },
            max_block_ms: self.leasing.max_block.as_millis() as u64,
            reserve: self.leasing.reserve,
            max_keys: self.store.max_keys,
            fleet_size: self.store.fleet_size,
            deadline_ms: self.store.timeout.as_millis() as u64,
        }
    }

    /// SHA-256 of everything this config was read from: gateway.toml's
    /// bytes, the `[rls]` YAML files' when there are any, and every TLS
    /// file ([`Config::tls_files`]). A reload compares it with the files on
    /// disk, so a certificate replaced on disk is reloaded like an edit.
    pub fn inputs_sha256(&self) -> [u8; 32] {
        inputs_digest_with_tls(
            &self.source.sha256,
            self.rls.as_ref().map(|r| &r.rules.digest),
            self.tls_files_sha256.as_ref(),
        )
    }

    /// Every certificate, key and CA file: `[tls]`'s, `[rls]`'s, the
    /// region link's and the upstreams', in that order.
    pub fn tls_files(&self) -> Vec<&Path> {
        let mut files: Vec<&Path> = Vec::new();
        if let Some(t) = &self.tls {
            files.extend([t.cert.as_path(), t.key.as_path()]);
            files.extend(t.client_ca.as_deref());
        }
        if let Some(t) = self.rls.as_ref().and_then(|r| r.tls.as_ref()) {
            files.extend(t.files());
        }
        if let Some(t) = self.region.as_ref().and_then(|r| r.tls.as_ref()) {
            files.extend(t.files());
        }
        for u in &self.upstreams {
            if let Some(t) = &u.tls {
                files.extend(t.files.iter().map(PathBuf::as_path));
            }
        }
        files
    }
}
