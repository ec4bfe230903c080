//! Validation: turns the serde mirror into a compiled [`Config`], collecting
//! every problem with its line rather than stopping at the first.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use ipnet::IpNet;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use toml::Spanned;

use super::error::{line_of, Problem};
use super::*;
use crate::route::{Action, DirectResponse, Route, StoreFailure};

/// Collects problems, each located by a span of the source text.
struct Check<'a> {
    file: &'a str,
    text: &'a str,
    problems: Vec<Problem>,
}

impl Check<'_> {
    fn at(&mut self, span: Range<usize>, key: impl Into<String>, reason: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_string(),
            line: Some(line_of(self.text, span.start)),
            key: key.into(),
            reason: reason.into(),
        });
    }
}

pub(super) fn compile(
    raw: raw::File,
    source: Source,
    file: &str,
    text: &str,
    base: &Path,
) -> Result<Config, ConfigError> {
    let mut c = Check {
        file,
        text,
        problems: Vec::new(),
    };

    let gateway = gateway(&mut c, raw.gateway);
    let listeners = listeners(&mut c, &raw.listeners);
    let tls = match (&raw.tls, listeners.https) {
        (Some(t), _) => tls(&mut c, t, base),
        (None, Some(_)) => {
            let span = raw.listeners.get_ref().https.as_ref().map_or(0..0, Spanned::span);
            c.at(
                span,
                "listeners.https",
                "an https listener needs a [tls] section with cert and key",
            );
            None
        }
        (None, None) => None,
    };
    let store = store(&mut c, raw.store);
    let leasing = leasing(&mut c, raw.leasing);
    let identity = identity(&mut c, raw.identity, base);
    let upstreams = upstreams(&mut c, raw.upstreams);
    let limits = limits(&mut c, raw.limits);
    let routes = routes(&mut c, raw.routes, &upstreams, &limits);

    if !c.problems.is_empty() {
        return Err(ConfigError::Invalid(c.problems));
    }
    Ok(Config {
        source,
        gateway,
        listeners,
        tls,
        store,
        leasing,
        identity,
        upstreams,
        routes: RouteTable::new(routes),
        limits: limits.into_iter().map(Arc::new).collect(),
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "leasegate".to_string())
}

fn in_range<T: PartialOrd + Copy + std::fmt::Display>(
    c: &mut Check,
    v: &Option<Spanned<T>>,
    key: &str,
    lo: T,
    hi: T,
    default: T,
) -> T {
    match v {
        None => default,
        Some(s) if *s.get_ref() >= lo && *s.get_ref() <= hi => *s.get_ref(),
        Some(s) => {
            c.at(
                s.span(),
                key,
                format!("{} is out of range: use {lo} to {hi}", s.get_ref()),
            );
            default
        }
    }
}

fn gateway(c: &mut Check, g: raw::Gateway) -> Gateway {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Gateway {
        instance_id: g.instance_id.filter(|s| !s.is_empty()).unwrap_or_else(host_name),
        workers: in_range(c, &g.workers, "gateway.workers", 1, 1024, cpus),
        grace_period: Duration::from_millis(in_range(
            c,
            &g.grace_period_ms,
            "gateway.grace_period_ms",
            0,
            3_600_000,
            10_000,
        )),
        max_connections: in_range(c, &g.max_connections, "gateway.max_connections", 1, 10_000_000, 10_000),
        // hyper's HTTP/1.1 reader needs at least 8 KiB of buffer.
        max_header_bytes: in_range(
            c,
            &g.max_header_bytes,
            "gateway.max_header_bytes",
            8_192,
            1 << 20,
            65_536,
        ),
        rate_limit_headers: match g.rate_limit_headers.as_ref().map(|h| (h.get_ref().as_str(), h.span())) {
            None | Some(("all", _)) => HeaderStyle::All,
            Some(("ietf", _)) => HeaderStyle::Ietf,
            Some(("legacy", _)) => HeaderStyle::Legacy,
            Some(("none", _)) => HeaderStyle::None,
            Some((other, span)) => {
                c.at(
                    span,
                    "gateway.rate_limit_headers",
                    format!("{other:?}: use \"all\", \"ietf\", \"legacy\" or \"none\""),
                );
                HeaderStyle::All
            }
        },
        access_log: match g.access_log.as_ref().map(|h| (h.get_ref().as_str(), h.span())) {
            None | Some(("json", _)) => AccessLog::Json,
            Some(("text", _)) => AccessLog::Text,
            Some(("off", _)) => AccessLog::Off,
            Some((other, span)) => {
                c.at(
                    span,
                    "gateway.access_log",
                    format!("{other:?}: use \"json\", \"text\" or \"off\""),
                );
                AccessLog::Json
            }
        },
        header_read_timeout: Duration::from_millis(in_range(
            c,
            &g.header_read_timeout_ms,
            "gateway.header_read_timeout_ms",
            1,
            3_600_000,
            10_000,
        )),
    }
}

fn socket_addr(c: &mut Check, v: &Option<Spanned<String>>, key: &str) -> Option<SocketAddr> {
    let v = v.as_ref()?;
    match v.get_ref().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            c.at(
                v.span(),
                key,
                format!(
                    "{:?} is not a socket address such as \"127.0.0.1:8080\" or \"[::1]:8080\"",
                    v.get_ref()
                ),
            );
            None
        }
    }
}

fn listeners(c: &mut Check, l: &Spanned<raw::Listeners>) -> Listeners {
    let raw = l.get_ref();
    let out = Listeners {
        http: socket_addr(c, &raw.http, "listeners.http"),
        https: socket_addr(c, &raw.https, "listeners.https"),
        admin: socket_addr(c, &raw.admin, "listeners.admin"),
    };
    if raw.http.is_none() && raw.https.is_none() {
        c.at(l.span(), "listeners", "set at least one of http or https");
    }
    let mut seen = HashMap::new();
    for (name, addr, v) in [
        ("http", out.http, &raw.http),
        ("https", out.https, &raw.https),
        ("admin", out.admin, &raw.admin),
    ] {
        if let (Some(addr), Some(v)) = (addr, v) {
            if addr.port() != 0 {
                if let Some(other) = seen.insert(addr, name) {
                    c.at(
                        v.span(),
                        format!("listeners.{name}"),
                        format!("{addr} is already used by listeners.{other}"),
                    );
                }
            }
        }
    }
    out
}

fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

fn tls(c: &mut Check, t: &Spanned<raw::Tls>, base: &Path) -> Option<Tls> {
    let raw = t.get_ref();
    let cert = resolve(base, raw.cert.get_ref());
    let key = resolve(base, raw.key.get_ref());
    let timeout = in_range(
        c,
        &raw.client_hello_timeout_ms,
        "tls.client_hello_timeout_ms",
        1,
        600_000,
        5_000,
    );

    let chain: Result<Vec<CertificateDer<'static>>, _> = match CertificateDer::pem_file_iter(&cert) {
        Ok(it) => it.collect(),
        Err(e) => Err(e),
    };
    let chain = match chain {
        Ok(chain) if !chain.is_empty() => Some(chain),
        Ok(_) => {
            c.at(
                raw.cert.span(),
                "tls.cert",
                format!("{}: no PEM certificate in the file", cert.display()),
            );
            None
        }
        Err(e) => {
            c.at(raw.cert.span(), "tls.cert", format!("{}: {e}", cert.display()));
            None
        }
    };
    let private = match PrivateKeyDer::from_pem_file(&key) {
        Ok(k) => Some(k),
        Err(e) => {
            c.at(raw.key.span(), "tls.key", format!("{}: {e}", key.display()));
            None
        }
    };
    let (chain, private) = (chain?, private?);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let built = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private));
    match built {
        Ok(mut sc) => {
            sc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Some(Tls {
                cert,
                key,
                server_config: Arc::new(sc),
                client_hello_timeout: Duration::from_millis(timeout),
            })
        }
        Err(e) => {
            c.at(
                raw.key.span(),
                "tls.key",
                format!("the certificate and key do not make a TLS identity: {e}"),
            );
            None
        }
    }
}

fn redis_url(c: &mut Check, span: Range<usize>, key: &str, url: &str, cluster: bool) -> bool {
    let shown = redact(url);
    let why = if url.starts_with("rediss://") {
        Some(format!(
            "{shown:?}: TLS to Redis (rediss://) is not supported by this build; use redis:// (through a TLS tunnel if the network needs one)"
        ))
    } else if !url.starts_with("redis://") && !url.starts_with("redis+unix://") {
        Some(format!("{shown:?} is not a redis:// or redis+unix:// URL"))
    } else if cluster && url.starts_with("redis+unix://") {
        Some(format!(
            "{shown:?}: cluster seeds must be redis://host:port (cluster nodes announce TCP addresses)"
        ))
    } else {
        // The client's own parser: what passes here, `run` can dial.
        redis::IntoConnectionInfo::into_connection_info(url)
            .err()
            .map(|e| format!("{shown:?}: {e}"))
    };
    match why {
        Some(why) => {
            c.at(span, key, why);
            false
        }
        None => true,
    }
}

fn store(c: &mut Check, s: raw::Store) -> Store {
    let timeout = in_range(c, &s.timeout_ms, "store.timeout_ms", 1, 60_000, 5);
    let backend = match s.backend.as_ref().map(|b| (b.get_ref().as_str(), b.span())) {
        None | Some(("memory", _)) => {
            // A Redis address with the memory backend is a half-done edit.
            if let Some(url) = &s.url {
                c.at(url.span(), "store.url", "is set but backend is not \"redis\"");
            }
            if let Some(cl) = &s.cluster {
                c.at(cl.span(), "store.cluster", "is set but backend is not \"redis\"");
            }
            StoreBackend::Memory
        }
        Some(("redis", span)) => match (s.url, s.cluster) {
            (Some(_), Some(cl)) => {
                c.at(
                    cl.span(),
                    "store.cluster",
                    "set either url (one node) or cluster (seeds), not both",
                );
                StoreBackend::Memory
            }
            (Some(url), None) => {
                redis_url(c, url.span(), "store.url", url.get_ref(), false);
                StoreBackend::Redis { url: url.into_inner() }
            }
            (None, Some(cl)) => {
                let span = cl.span();
                let seeds = cl.into_inner();
                if seeds.is_empty() {
                    c.at(span.clone(), "store.cluster", "list at least one seed");
                }
                for s in &seeds {
                    redis_url(c, span.clone(), "store.cluster", s, true);
                }
                StoreBackend::RedisCluster { seeds }
            }
            (None, None) => {
                c.at(span, "store.backend", "backend \"redis\" needs url or cluster");
                StoreBackend::Memory
            }
        },
        Some((other, span)) => {
            c.at(
                span,
                "store.backend",
                format!("unknown backend {other:?}: use \"memory\" or \"redis\""),
            );
            StoreBackend::Memory
        }
    };
    let max_keys = in_range(c, &s.max_keys, "store.max_keys", 1_000, 100_000_000, 1_000_000);
    let fleet_size = in_range(c, &s.fleet_size, "store.fleet_size", 1, 10_000, 1);
    let breaker = crate::store::guard::BreakerSettings {
        failures: in_range(c, &s.breaker.failures, "store.breaker.failures", 1, 1_000, 3),
        open_ms: in_range(c, &s.breaker.open_ms, "store.breaker.open_ms", 10, 600_000, 2_000),
    };
    Store {
        backend,
        timeout: Duration::from_millis(timeout),
        max_keys,
        fleet_size,
        breaker,
    }
}

fn leasing(c: &mut Check, l: raw::Leasing) -> Leasing {
    let min = in_range(c, &l.min, "leasing.min", 1, 1_000_000, 5);
    let max = in_range(c, &l.max, "leasing.max", 1, 1_000_000, 500);
    if max < min {
        let span = l.max.as_ref().or(l.min.as_ref()).map_or(0..0, Spanned::span);
        c.at(span, "leasing.max", format!("{max} is below leasing.min ({min})"));
    }
    let lookahead = in_range(c, &l.lookahead_ms, "leasing.lookahead_ms", 1, 60_000, 250);
    let ttl = in_range(c, &l.ttl_ms, "leasing.ttl_ms", 1, 600_000, 1_000);
    let max_fraction = in_range(c, &l.max_fraction, "leasing.max_fraction", 0.0001, 1.0, 0.1);
    let max_block = in_range(c, &l.max_block_ms, "leasing.max_block_ms", 1, 3_600_000, 5_000);
    Leasing {
        min,
        max,
        lookahead: Duration::from_millis(lookahead),
        ttl: Duration::from_millis(ttl),
        max_fraction,
        max_block: Duration::from_millis(max_block),
    }
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let hi = (chunk[0] as char).to_digit(16)?;
        let lo = (chunk[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

const JWT_ALGORITHMS: &[&str] = &[
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

fn identity(c: &mut Check, i: raw::Identity, base: &Path) -> crate::identity::Resolver {
    let mut trusted = Vec::new();
    for (n, p) in i.trusted_proxies.iter().enumerate() {
        let s = p.get_ref().trim();
        let parsed = s.parse::<IpNet>().or_else(|_| s.parse::<IpAddr>().map(IpNet::from));
        match parsed {
            Ok(net) => trusted.push(net.trunc()),
            Err(_) => c.at(
                p.span(),
                format!("identity.trusted_proxies[{n}]"),
                format!("{s:?} is not a CIDR such as \"10.0.0.0/8\" or an IP address"),
            ),
        }
    }
    let ipv4_prefix = in_range(c, &i.ipv4_prefix, "identity.ipv4_prefix", 0, 32, 24);
    let ipv6_prefix = in_range(c, &i.ipv6_prefix, "identity.ipv6_prefix", 0, 128, 64);

    let verifier = i.jwt.and_then(|j| jwt(c, j, base));

    let mut keys = api_keys(c, i.api_keys, "identity.api_keys");
    if let Some(file) = &i.api_keys_file {
        for k in api_keys_file(c, file, base) {
            if keys.iter().any(|o| o.sha256 == k.sha256) {
                let name = k.id.as_deref().or(k.tenant.as_deref()).unwrap_or("?");
                c.at(
                    file.span(),
                    "identity.api_keys_file",
                    format!("key {name:?} is also in [[identity.api_keys]]"),
                );
            }
            keys.push(k);
        }
    }
    let reject_invalid = match i
        .on_invalid_credentials
        .as_ref()
        .map(|v| (v.get_ref().as_str(), v.span()))
    {
        None | Some(("fall_through", _)) => false,
        Some(("reject", _)) => true,
        Some((other, span)) => {
            c.at(
                span,
                "identity.on_invalid_credentials",
                format!("{other:?}: use \"fall_through\" or \"reject\""),
            );
            false
        }
    };
    crate::identity::Resolver {
        trusted_proxies: trusted,
        ipv4_prefix,
        ipv6_prefix,
        api_keys: keys,
        reject_invalid,
        jwt: verifier.map(Arc::new),
    }
}

/// `[identity.jwt]`: the algorithms allowed and the keys to verify with,
/// loaded now so a bad key is a config error, not a request-time surprise.
fn jwt(c: &mut Check, j: Spanned<raw::Jwt>, base: &Path) -> Option<crate::identity::jwt::Verifier> {
    use crate::identity::jwt::{self, Keys};
    use jsonwebtoken::{Algorithm, DecodingKey};
    let span = j.span();
    let j = j.into_inner();
    let mut algorithms = Vec::new();
    for a in j.algorithms.get_ref() {
        match (JWT_ALGORITHMS.contains(&a.as_str()), a.parse::<Algorithm>()) {
            (true, Ok(alg)) => algorithms.push(alg),
            _ => c.at(
                j.algorithms.span(),
                "identity.jwt.algorithms",
                format!("unknown algorithm {a:?}: use {}", JWT_ALGORITHMS.join(", ")),
            ),
        }
    }
    if j.algorithms.get_ref().is_empty() {
        c.at(
            j.algorithms.span(),
            "identity.jwt.algorithms",
            "list at least one algorithm",
        );
    }
    let symmetric = algorithms
        .iter()
        .any(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512));
    let asymmetric = algorithms
        .iter()
        .any(|a| !matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512));
    let mut keys = Vec::new();
    let mut ok = true;
    match (&j.secret, &j.secret_env) {
        (Some(_), Some(_)) => {
            c.at(
                span.clone(),
                "identity.jwt.secret",
                "set secret or secret_env, not both",
            );
            ok = false;
        }
        (Some(secret), None) if secret.is_empty() => {
            c.at(
                span.clone(),
                "identity.jwt.secret",
                "must not be empty: anyone could sign tokens",
            );
            ok = false;
        }
        (Some(secret), None) => keys.push(Keys::Secret(secret.as_bytes().to_vec())),
        (None, Some(var)) => match std::env::var(var) {
            Ok(secret) if !secret.is_empty() => keys.push(Keys::Secret(secret.into_bytes())),
            _ => {
                c.at(
                    span.clone(),
                    "identity.jwt.secret_env",
                    format!("environment variable {var:?} is not set"),
                );
                ok = false;
            }
        },
        (None, None) if symmetric => {
            c.at(
                span.clone(),
                "identity.jwt.secret",
                "HS* algorithms need secret or secret_env",
            );
            ok = false;
        }
        (None, None) => {}
    }
    if let Some(p) = &j.public_key {
        let path = resolve(base, p);
        let pem = std::fs::read(&path);
        let parsed = pem.map_err(|e| e.to_string()).and_then(|pem| {
            let family = algorithms
                .iter()
                .find(|a| !matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512));
            match family {
                Some(Algorithm::ES256 | Algorithm::ES384) => DecodingKey::from_ec_pem(&pem),
                Some(Algorithm::EdDSA) => DecodingKey::from_ed_pem(&pem),
                _ => DecodingKey::from_rsa_pem(&pem),
            }
            .map_err(|e| e.to_string())
        });
        match parsed {
            Ok(key) => keys.push(Keys::Public(key)),
            Err(e) => {
                c.at(
                    span.clone(),
                    "identity.jwt.public_key",
                    format!("{}: {e}", path.display()),
                );
                ok = false;
            }
        }
    }
    if let Some(p) = &j.jwks_file {
        let path = resolve(base, p);
        match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|json| jwt::jwks(&json))
        {
            Ok(set) => keys.push(Keys::Set(set)),
            Err(e) => {
                c.at(
                    span.clone(),
                    "identity.jwt.jwks_file",
                    format!("{}: {e}", path.display()),
                );
                ok = false;
            }
        }
    }
    if asymmetric && j.public_key.is_none() && j.jwks_file.is_none() {
        c.at(
            span.clone(),
            "identity.jwt.public_key",
            "RS/PS/ES/EdDSA algorithms need public_key = \"PATH.pem\" or jwks_file",
        );
        ok = false;
    }
    let leeway = j.leeway_secs.unwrap_or(5);
    if leeway > 300 {
        c.at(
            span,
            "identity.jwt.leeway_secs",
            format!("{leeway} is out of range: use 0 to 300"),
        );
    }
    (ok && !algorithms.is_empty()).then(|| {
        jwt::Verifier::new(jwt::Settings {
            algorithms,
            keys,
            issuer: j.issuer,
            audience: j.audience,
            tenant_claim: j.tenant_claim,
            plan_claim: j.plan_claim,
            leeway_secs: leeway,
        })
    })
}

/// `[[api_keys]]` entries, from the config or from a keys file.
fn api_keys(c: &mut Check, list: Vec<Spanned<raw::ApiKey>>, prefix: &str) -> Vec<crate::identity::ApiKey> {
    let mut out: Vec<crate::identity::ApiKey> = Vec::new();
    for (n, k) in list.into_iter().enumerate() {
        let span = k.span();
        let k = k.into_inner();
        let key = format!("{prefix}[{n}]");
        let sha256 = match (&k.key, &k.sha256) {
            (Some(plain), None) if !plain.is_empty() => Some(Sha256::digest(plain.as_bytes()).into()),
            (None, Some(h)) => {
                let parsed = hex32(&h.get_ref().to_ascii_lowercase());
                if parsed.is_none() {
                    c.at(
                        h.span(),
                        format!("{key}.sha256"),
                        "must be 64 hex digits (the SHA-256 of the key)",
                    );
                }
                parsed
            }
            (Some(_), Some(_)) => {
                c.at(span.clone(), key, "set key or sha256, not both");
                None
            }
            _ => {
                c.at(span.clone(), key, "set key or sha256");
                None
            }
        };
        if k.id.is_none() && k.tenant.is_none() {
            c.at(
                span.clone(),
                format!("{prefix}[{n}]"),
                "set id or tenant: the identity is key:<id or tenant>",
            );
        }
        if let Some(sha256) = sha256 {
            if out.iter().any(|o| o.sha256 == sha256) {
                c.at(span, format!("{prefix}[{n}]"), "the same key is listed twice");
            }
            out.push(crate::identity::ApiKey {
                sha256,
                id: k.id.map(Arc::from),
                tenant: k.tenant.map(Arc::from),
                plan: k.plan.map(Arc::from),
            });
        }
    }
    out
}

/// Keys kept outside gateway.toml (so secrets can live elsewhere): a TOML
/// file of `[[api_keys]]` tables. Its problems name its own file and lines.
fn api_keys_file(c: &mut Check, file: &Spanned<String>, base: &Path) -> Vec<crate::identity::ApiKey> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct KeysFile {
        #[serde(default)]
        api_keys: Vec<Spanned<raw::ApiKey>>,
    }
    let path = resolve(base, file.get_ref());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            c.at(
                file.span(),
                "identity.api_keys_file",
                format!("{}: {e}", path.display()),
            );
            return Vec::new();
        }
    };
    let name = path.display().to_string();
    match toml::from_str::<KeysFile>(&text) {
        Ok(keys) => {
            let mut inner = Check {
                file: &name,
                text: &text,
                problems: Vec::new(),
            };
            let out = api_keys(&mut inner, keys.api_keys, "api_keys");
            c.problems.extend(inner.problems);
            out
        }
        Err(e) => {
            c.problems.push(super::error::from_toml(&name, &text, &e));
            Vec::new()
        }
    }
}

/// Upstreams in file order.
fn upstreams(c: &mut Check, list: Vec<Spanned<raw::Upstream>>) -> Vec<Arc<Upstream>> {
    let mut out: Vec<Arc<Upstream>> = Vec::new();
    for (n, u) in list.into_iter().enumerate() {
        let u = u.into_inner();
        let key = format!("upstreams[{n}]");
        let name = u.name.get_ref().clone();
        if name.is_empty() {
            c.at(u.name.span(), format!("{key}.name"), "must not be empty");
        }
        if u.targets.get_ref().is_empty() {
            c.at(
                u.targets.span(),
                format!("{key}.targets"),
                format!("upstream {name:?} has no targets"),
            );
        }
        let mut targets = Vec::new();
        for t in u.targets.get_ref() {
            match target(t.get_ref()) {
                Ok(a) => targets.push(a),
                Err(why) => c.at(t.span(), format!("{key}.targets"), format!("{:?}: {why}", t.get_ref())),
            }
        }
        let mut ms = |v: &Option<Spanned<u64>>, field: &str, default: u64| {
            Duration::from_millis(in_range(c, v, &format!("{key}.{field}"), 1, 3_600_000, default))
        };
        let connect = ms(&u.connect_timeout_ms, "connect_timeout_ms", 1_000);
        let request = ms(&u.request_timeout_ms, "request_timeout_ms", 30_000);
        let idle = ms(&u.pool_idle_timeout_ms, "pool_idle_timeout_ms", 90_000);
        let max_idle = in_range(
            c,
            &u.pool_max_idle_per_host,
            &format!("{key}.pool_max_idle_per_host"),
            0,
            100_000,
            1_024,
        );
        if out.iter().any(|o| o.name == name) {
            c.at(
                u.name.span(),
                format!("{key}.name"),
                format!("duplicate upstream name {name:?}"),
            );
        }
        out.push(Arc::new(Upstream::new(name, targets, connect, request, idle, max_idle)));
    }
    out
}

/// An upstream target: `http://host:port`, nothing after the authority.
fn target(s: &str) -> Result<Authority, String> {
    let uri: Uri = s.parse().map_err(|e| format!("not a URL ({e})"))?;
    match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => {}
        Some(s) if *s == Scheme::HTTPS => return Err("https upstreams are not supported yet; use http://".into()),
        _ => return Err("expected http://host:port".into()),
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err("a target has no path: the request path is forwarded unchanged".into());
    }
    let authority = uri.authority().ok_or("expected http://host:port")?.clone();
    if authority.as_str().contains('@') {
        return Err("credentials in a target URL are not supported".into());
    }
    if authority.port_u16().is_none() {
        // Make the port explicit so pooling and logs never guess.
        return format!("{}:80", authority.host()).parse().map_err(|e| format!("{e}"));
    }
    Ok(authority)
}

fn limits(c: &mut Check, list: Vec<Spanned<raw::Limit>>) -> Vec<Limit> {
    let mut out: Vec<Limit> = Vec::new();
    for (n, l) in list.into_iter().enumerate() {
        let l = l.into_inner();
        let key = format!("limits[{n}]");
        let name = l.name.get_ref().clone();
        // Names appear in store keys, metric labels and structured headers.
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
            c.at(
                l.name.span(),
                format!("{key}.name"),
                format!("{name:?}: use letters, digits, '_', '-' and '.' only"),
            );
        }
        if out.iter().any(|o| o.name == name) {
            c.at(
                l.name.span(),
                format!("{key}.name"),
                format!("duplicate limit name {name:?}"),
            );
        }
        let algorithm = match l.algorithm.as_ref().map(|a| a.get_ref().as_str()) {
            None | Some("token_bucket") => Algorithm::TokenBucket,
            Some("sliding_window") => Algorithm::SlidingWindow,
            Some(other) => {
                let span = l.algorithm.as_ref().map_or(0..0, Spanned::span);
                c.at(
                    span,
                    format!("{key}.algorithm"),
                    format!("unknown algorithm {other:?}: use \"token_bucket\" or \"sliding_window\""),
                );
                Algorithm::TokenBucket
            }
        };
        let rate = match l.rate.get_ref().parse::<Rate>() {
            Ok(r) => r,
            Err(e) => {
                c.at(
                    l.rate.span(),
                    format!("{key}.rate"),
                    format!("{:?}: {e}", l.rate.get_ref()),
                );
                Rate {
                    count: 1,
                    period: Duration::from_secs(1),
                }
            }
        };
        let burst = match &l.burst {
            None => rate.count,
            Some(b) if algorithm == Algorithm::SlidingWindow => {
                c.at(
                    b.span(),
                    format!("{key}.burst"),
                    "burst applies to token_bucket only; a sliding window allows the rate's count",
                );
                rate.count
            }
            Some(b) if *b.get_ref() == 0 => {
                c.at(b.span(), format!("{key}.burst"), "must be at least 1");
                rate.count
            }
            Some(b) => *b.get_ref(),
        };
        // Bucket levels are kept in units of capacity × period; they must
        // stay exact in a double for the Redis scripts.
        let too_big =
            |cap: u64, r: &Rate| u128::from(cap) * r.period.as_millis().max(1) >= u128::from(crate::quota::MAX_UNITS);
        if too_big(burst, &rate) {
            c.at(
                l.rate.span(),
                format!("{key}.rate"),
                "burst × period is too large (keep it below 2^53 token-milliseconds)",
            );
        }
        let mut by = Vec::new();
        let parts = l.by.as_ref().map(|b| (b.get_ref().clone(), b.span()));
        match parts {
            None => by.push(KeyPart::Identity),
            Some((parts, span)) => {
                if parts.is_empty() {
                    c.at(span.clone(), format!("{key}.by"), "list at least one key part");
                }
                for p in parts {
                    match key_part(&p) {
                        Ok(part) => by.push(part),
                        Err(why) => c.at(span.clone(), format!("{key}.by"), why),
                    }
                }
            }
        }
        let mode = match l.mode.as_ref().map(|m| m.get_ref().as_str()) {
            None | Some("enforce") => Mode::Enforce,
            Some("shadow") => Mode::Shadow,
            Some("soft") => Mode::Soft,
            Some("canary") => Mode::Canary,
            Some(other) => {
                let span = l.mode.as_ref().map_or(0..0, Spanned::span);
                c.at(
                    span,
                    format!("{key}.mode"),
                    format!("unknown mode {other:?}: use shadow, soft, canary or enforce"),
                );
                Mode::Enforce
            }
        };
        let canary_percent = in_range(c, &l.canary_percent, &format!("{key}.canary_percent"), 0, 100, 5);
        if let Some(d) = &l.enforce_after {
            if !is_date(d.get_ref()) {
                c.at(
                    d.span(),
                    format!("{key}.enforce_after"),
                    format!("{:?} is not a date such as \"2027-01-31\"", d.get_ref()),
                );
            }
        }
        let mut plans = Vec::new();
        for (plan, r) in &l.plans {
            match r.get_ref().parse::<Rate>() {
                Ok(rate) if too_big(rate.count, &rate) => c.at(
                    r.span(),
                    format!("{key}.plans.{plan}"),
                    "count × period is too large (keep it below 2^53 token-milliseconds)",
                ),
                Ok(rate) => plans.push((plan.clone(), rate)),
                Err(e) => c.at(
                    r.span(),
                    format!("{key}.plans.{plan}"),
                    format!("{:?}: {e}", r.get_ref()),
                ),
            }
        }
        let tiers = l.tiers.as_ref().map(|t| {
            let mut tiers = Vec::new();
            for name in t.get_ref() {
                match crate::identity::Tier::parse(name) {
                    Some(tier) => tiers.push(tier),
                    None => c.at(
                        t.span(),
                        format!("{key}.tiers"),
                        format!("unknown tier {name:?}: use user, key, fingerprint or subnet"),
                    ),
                }
            }
            tiers
        });
        let fallback_rate = l
            .fallback_rate
            .as_ref()
            .and_then(|r| match r.get_ref().parse::<Rate>() {
                Ok(rate) if too_big(rate.count, &rate) => {
                    c.at(
                        r.span(),
                        format!("{key}.fallback_rate"),
                        "count × period is too large (keep it below 2^53 token-milliseconds)",
                    );
                    None
                }
                Ok(rate) => Some(rate),
                Err(e) => {
                    c.at(
                        r.span(),
                        format!("{key}.fallback_rate"),
                        format!("{:?}: {e}", r.get_ref()),
                    );
                    None
                }
            });
        let shards = in_range(c, &l.shards, &format!("{key}.shards"), 1, 1_000, 1);
        // Every sub-bucket needs at least one token of every quota.
        let smallest = plans
            .iter()
            .map(|(_, r)| r.count)
            .chain([rate.count, burst])
            .min()
            .unwrap_or(1);
        if u64::from(shards) > smallest {
            let span = l.shards.as_ref().map_or(0..0, Spanned::span);
            c.at(
                span,
                format!("{key}.shards"),
                format!("{shards} sub-buckets for a quota of {smallest}: each needs at least one token"),
            );
        }
        let shard_by = match l.shard_by.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
            None | Some(("ip", _)) => ShardBy::Ip,
            Some(("identity", _)) => ShardBy::Identity,
            Some((other, span)) => {
                c.at(
                    span,
                    format!("{key}.shard_by"),
                    format!("unknown shard_by {other:?}: use \"ip\" or \"identity\""),
                );
                ShardBy::Ip
            }
        };
        if shards == 1 {
            if let Some(sb) = &l.shard_by {
                c.at(sb.span(), format!("{key}.shard_by"), "applies only with shards > 1");
            }
        }
        out.push(Limit {
            fallback_rate,
            shards,
            shard_by,
            tiers,
            name,
            algorithm,
            rate,
            burst,
            by,
            mode,
            canary_percent,
            enforce_after: l.enforce_after.map(Spanned::into_inner),
            plans,
        });
    }
    out
}

fn key_part(p: &str) -> Result<KeyPart, String> {
    Ok(match p {
        "identity" => KeyPart::Identity,
        "tenant" => KeyPart::Tenant,
        "route" => KeyPart::Route,
        "ip" => KeyPart::Ip,
        _ => match p.strip_prefix("header:") {
            Some(h) => KeyPart::Header(
                HeaderName::from_bytes(h.trim().as_bytes())
                    .map_err(|_| format!("{p:?}: {h:?} is not a header name"))?,
            ),
            None => {
                return Err(format!(
                    "unknown key part {p:?}: use identity, tenant, route, ip or header:NAME"
                ))
            }
        },
    })
}

fn same_methods(a: &Option<Vec<Method>>, b: &Option<Vec<Method>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.iter().all(|m| b.contains(m)) && b.iter().all(|m| a.contains(m)),
        (None, None) => true,
        _ => false,
    }
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: Range<usize>| b.get(r.clone()).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' || !digits(0..4) || !digits(5..7) || !digits(8..10) {
        return false;
    }
    let year: u32 = s[0..4].parse().unwrap_or(0);
    let month: u32 = s[5..7].parse().unwrap_or(0);
    let day: u32 = s[8..10].parse().unwrap_or(0);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

fn routes(
    c: &mut Check,
    list: Vec<Spanned<raw::Route>>,
    upstreams: &[Arc<Upstream>],
    limits: &[Limit],
) -> Vec<Arc<Route>> {
    let mut out: Vec<Arc<Route>> = Vec::new();
    let mut names = HashSet::new();
    for (n, r) in list.into_iter().enumerate() {
        let span = r.span();
        let r = r.into_inner();
        let key = format!("routes[{n}]");
        let name = r.name.get_ref().clone();
        if name.is_empty() {
            c.at(r.name.span(), format!("{key}.name"), "must not be empty");
        }
        if !names.insert(name.clone()) {
            c.at(
                r.name.span(),
                format!("{key}.name"),
                format!("duplicate route name {name:?}"),
            );
        }
        let prefix = r.path_prefix.get_ref().clone();
        if !prefix.starts_with('/') {
            c.at(
                r.path_prefix.span(),
                format!("{key}.path_prefix"),
                format!("{prefix:?} must start with '/'"),
            );
        }
        let host = r.host.as_ref().map(|h| h.get_ref().trim().to_ascii_lowercase());
        if let (Some(h), Some(raw)) = (&host, &r.host) {
            if h.is_empty()
                || h.parse::<Authority>().is_err()
                || h.contains('@')
                || (h.contains(':') && !(h.starts_with('[') && h.ends_with(']')))
            {
                c.at(
                    raw.span(),
                    format!("{key}.host"),
                    format!("{h:?} is not a host name (without port)"),
                );
            }
        }
        let methods = r.methods.as_ref().map(|m| {
            let mut out = Vec::new();
            for name in m.get_ref() {
                match Method::from_bytes(name.to_ascii_uppercase().as_bytes()) {
                    Ok(method) => out.push(method),
                    Err(_) => c.at(
                        m.span(),
                        format!("{key}.methods"),
                        format!("{name:?} is not an HTTP method"),
                    ),
                }
            }
            if out.is_empty() {
                c.at(
                    m.span(),
                    format!("{key}.methods"),
                    "list at least one method, or leave methods out",
                );
            }
            out
        });
        let action = match (&r.upstream, r.response) {
            (Some(u), None) => match upstreams.iter().find(|up| up.name == *u.get_ref()) {
                Some(up) => Some(Action::Forward(up.clone())),
                None => {
                    let mut known: Vec<_> = upstreams.iter().map(|up| up.name.as_str()).collect();
                    known.sort_unstable();
                    c.at(
                        u.span(),
                        format!("{key}.upstream"),
                        format!(
                            "unknown upstream {:?} (known: {})",
                            u.get_ref(),
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    );
                    None
                }
            },
            (None, Some(resp)) => direct_response(c, resp, &key).map(Action::Respond),
            (Some(_), Some(_)) => {
                c.at(span.clone(), key.clone(), "set either upstream or response, not both");
                None
            }
            (None, None) => {
                c.at(
                    span.clone(),
                    key.clone(),
                    "set upstream = \"NAME\" or response = { status = 200, body = \"...\" }",
                );
                None
            }
        };
        let mut route_limits: Vec<usize> = Vec::new();
        for l in &r.limits {
            if let Some(index) = limits.iter().position(|lim| lim.name == *l.get_ref()) {
                if route_limits.contains(&index) {
                    c.at(
                        l.span(),
                        format!("{key}.limits"),
                        format!("limit {:?} is listed twice", l.get_ref()),
                    );
                }
                route_limits.push(index);
            } else {
                let known: Vec<_> = limits.iter().map(|l| l.name.as_str()).collect();
                c.at(
                    l.span(),
                    format!("{key}.limits"),
                    format!(
                        "unknown limit {:?} (known: {})",
                        l.get_ref(),
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
            }
        }
        let on_store_failure = match r.on_store_failure.as_ref().map(|s| (s.get_ref().as_str(), s.span())) {
            None | Some(("allow", _)) => StoreFailure::Allow,
            Some(("deny", _)) => StoreFailure::Deny,
            Some((other, span)) => {
                c.at(
                    span,
                    format!("{key}.on_store_failure"),
                    format!("{other:?}: use \"allow\" or \"deny\""),
                );
                StoreFailure::Allow
            }
        };
        if let Some(other) = out
            .iter()
            .find(|o| o.path_prefix == prefix && o.host == host && same_methods(&o.methods, &methods))
        {
            c.at(
                r.path_prefix.span(),
                format!("{key}.path_prefix"),
                format!(
                    "route {name:?} matches exactly what route {:?} matches, so it can never be chosen",
                    other.name
                ),
            );
        }
        if let Some(action) = action {
            out.push(Arc::new(Route {
                name,
                path_prefix: prefix,
                host,
                methods,
                action,
                limits: route_limits,
                on_store_failure,
            }));
        }
    }
    out
}

fn direct_response(c: &mut Check, r: Spanned<raw::DirectResponse>, key: &str) -> Option<DirectResponse> {
    let span = r.span();
    let r = r.into_inner();
    let status = match StatusCode::from_u16(r.status) {
        Ok(s) if (200..=599).contains(&s.as_u16()) => Some(s),
        _ => {
            c.at(
                span.clone(),
                format!("{key}.response.status"),
                format!("{} is not a final HTTP status (200 to 599)", r.status),
            );
            None
        }
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &r.headers {
        match (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            _ => c.at(
                span.clone(),
                format!("{key}.response.headers.{name}"),
                "not a valid header name and value",
            ),
        }
    }
    Some(DirectResponse {
        status: status?,
        headers,
        body: Bytes::from(r.body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_know_their_calendar() {
        for ok in ["2027-01-31", "2028-02-29", "2000-02-29", "2026-12-01"] {
            assert!(is_date(ok), "{ok}");
        }
        for bad in [
            "2027-02-29",
            "1900-02-29",
            "2027-04-31",
            "2027-13-01",
            "2027-00-10",
            "2027-1-01",
            "27-01-01x",
            "2027/01/01",
        ] {
            assert!(!is_date(bad), "{bad}");
        }
    }

    #[test]
    fn targets_are_plain_http_authorities() {
        assert_eq!(target("http://127.0.0.1:9000").unwrap().as_str(), "127.0.0.1:9000");
        assert_eq!(target("http://backend").unwrap().as_str(), "backend:80");
        assert_eq!(target("http://backend/").unwrap().as_str(), "backend:80");
        assert!(target("https://backend:443").unwrap_err().contains("not supported"));
        assert!(target("http://backend:80/api").unwrap_err().contains("no path"));
        assert!(target("http://user:pw@backend:80").unwrap_err().contains("credentials"));
        assert!(target("backend:80").is_err());
    }

    #[test]
    fn method_sets_compare_without_order() {
        let a = Some(vec![Method::GET, Method::POST]);
        let b = Some(vec![Method::POST, Method::GET]);
        assert!(same_methods(&a, &b));
        assert!(!same_methods(&a, &Some(vec![Method::GET])));
        assert!(!same_methods(&a, &None));
        assert!(same_methods(&None, &None));
    }

    #[test]
    fn key_parts_parse() {
        assert_eq!(key_part("identity"), Ok(KeyPart::Identity));
        assert_eq!(
            key_part("header:X-Tenant"),
            Ok(KeyPart::Header(HeaderName::from_static("x-tenant")))
        );
        assert!(key_part("header:bad header").is_err());
        assert!(key_part("cookie").is_err());
    }
}
