//! `[store]` (backend, Redis URLs, Sentinel, breaker) and `[leasing]`.

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::{in_range, Check};
use crate::config::{raw, Leasing, Store, StoreBackend, StoreCa};
use crate::store::redis::redact;

/// A sentinel URL's database: the gateway asks the sentinels with the URL
/// as written, and a sentinel knows no `SELECT`, so only database 0 works.
fn sentinel_url_extras(c: &mut Check, span: Range<usize>, key: &str, url: &str) {
    if let Ok(info) = redis::IntoConnectionInfo::into_connection_info(url) {
        if info.redis_settings().db() != 0 {
            c.at(
                span,
                key,
                format!(
                    "{:?}: a sentinel has no databases (it refuses SELECT); the master is used with database 0",
                    redact(url)
                ),
            );
        }
    }
}

/// `tcp_only`: cluster seeds and sentinels (both announce TCP addresses).
fn redis_url(c: &mut Check, span: Range<usize>, key: &str, url: &str, tcp_only: bool) -> bool {
    let shown = redact(url);
    let why = if !["redis://", "rediss://", "redis+unix://"]
        .iter()
        .any(|s| url.starts_with(s))
    {
        Some(format!("{shown:?} is not a redis://, rediss:// or redis+unix:// URL"))
    } else if url.starts_with("rediss://") && url.contains('#') {
        Some(format!(
            "{shown:?}: the certificate is always verified (no #insecure); for a private CA set [store] ca"
        ))
    } else if tcp_only && url.starts_with("redis+unix://") {
        let what = if key.starts_with("store.sentinel") {
            "sentinels must be redis://host:port (they name the master by a TCP address)"
        } else {
            "cluster seeds must be redis://host:port (cluster nodes announce TCP addresses)"
        };
        Some(format!("{shown:?}: {what}"))
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

/// `backend = "redis"`: exactly one of `url` (one node), `cluster` (seeds)
/// and `sentinel` (with `sentinel_master`).
fn redis_backend(
    c: &mut Check,
    span: Range<usize>,
    url: Option<Spanned<String>>,
    cluster: Option<Spanned<Vec<String>>>,
    sentinel: Option<Spanned<Vec<String>>>,
    master: Option<Spanned<String>>,
) -> StoreBackend {
    if sentinel.is_none() {
        if let Some(m) = &master {
            c.at(
                m.span(),
                "store.sentinel_master",
                "is set but sentinel (the sentinels' addresses) is not",
            );
        }
    }
    let set = [url.is_some(), cluster.is_some(), sentinel.is_some()];
    if set.iter().filter(|s| **s).count() > 1 {
        // Point at the second key set, in the order url, cluster, sentinel.
        let (key, second) = match (&url, &cluster, &sentinel) {
            (Some(_), Some(cl), _) => ("store.cluster", cl.span()),
            (_, _, Some(se)) => ("store.sentinel", se.span()),
            _ => ("store.backend", span),
        };
        c.at(
            second,
            key,
            "set one of url (one node), cluster (seeds) or sentinel (with sentinel_master), not several",
        );
        return StoreBackend::Memory;
    }
    match (url, cluster, sentinel) {
        (Some(url), _, _) => {
            redis_url(c, url.span(), "store.url", url.get_ref(), false);
            StoreBackend::Redis { url: url.into_inner() }
        }
        (_, Some(cl), _) => {
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
        (_, _, Some(se)) => {
            let span = se.span();
            let sentinels = se.into_inner();
            if sentinels.is_empty() {
                c.at(
                    span.clone(),
                    "store.sentinel",
                    "list at least one sentinel (redis://host:port)",
                );
            }
            for (i, s) in sentinels.iter().enumerate() {
                let key = format!("store.sentinel[{i}]");
                if redis_url(c, span.clone(), &key, s, true) {
                    sentinel_url_extras(c, span.clone(), &key, s);
                }
                if sentinels[..i].contains(s) {
                    // Each sentinel has one vote on who the master is.
                    c.at(span.clone(), &key, format!("{:?} is listed twice", redact(s)));
                }
            }
            let master = match master {
                Some(m) if m.get_ref().trim().is_empty() => {
                    c.at(
                        m.span(),
                        "store.sentinel_master",
                        "name the master the sentinels monitor",
                    );
                    String::new()
                }
                Some(m) => m.into_inner(),
                None => {
                    c.at(
                        span,
                        "store.sentinel_master",
                        "sentinel needs sentinel_master: the name the sentinels monitor (sentinel monitor <name> ...)",
                    );
                    String::new()
                }
            };
            StoreBackend::RedisSentinel { sentinels, master }
        }
        (None, None, None) => {
            c.at(
                span,
                "store.backend",
                "backend \"redis\" needs url, cluster or sentinel",
            );
            StoreBackend::Memory
        }
    }
}

/// `[store] ca`: the PEM CA certificates `rediss://` addresses are
/// verified against (else the system's roots).
fn store_ca(c: &mut Check, v: &Spanned<String>, base: &Path, tls: bool) -> Option<StoreCa> {
    let path = super::resolve(base, v.get_ref());
    let pem = match std::fs::read(&path) {
        Ok(pem) => pem,
        Err(e) => {
            c.at(v.span(), "store.ca", format!("cannot read {}: {e}", path.display()));
            return None;
        }
    };
    use rustls_pki_types::pem::PemObject as _;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(&pem)
        .filter(Result::is_ok)
        .count();
    if certs == 0 {
        c.at(
            v.span(),
            "store.ca",
            format!("{}: no PEM certificate in the file", path.display()),
        );
        return None;
    }
    if !tls {
        c.at(
            v.span(),
            "store.ca",
            "is set but no Redis address is rediss:// (TLS): use rediss://host:port",
        );
    }
    Some(StoreCa { path, pem })
}

pub(super) fn store(c: &mut Check, s: raw::Store, base: &Path) -> Store {
    let timeout = in_range(c, &s.timeout_ms, "store.timeout_ms", 1, 60_000, 5);
    let connect_timeout = in_range(c, &s.connect_timeout_ms, "store.connect_timeout_ms", 0, 600_000, 2_000);
    let ready_without_store = s.ready_without_store.as_ref().is_none_or(|v| *v.get_ref());
    #[derive(Clone, Copy)]
    enum Kind {
        Memory,
        Redis,
    }
    let kind = super::choice(
        c,
        s.backend.as_ref(),
        "store.backend",
        &[("memory", Kind::Memory), ("redis", Kind::Redis)],
        Kind::Memory,
    );
    let backend = match (kind, &s.backend) {
        (Kind::Redis, Some(b)) => redis_backend(c, b.span(), s.url, s.cluster, s.sentinel, s.sentinel_master),
        _ => {
            // A Redis address with the memory backend is a half-done edit
            // (not said again when the backend itself is unknown).
            if s.backend.as_ref().is_none_or(|b| b.get_ref() == "memory") {
                if let Some(url) = &s.url {
                    c.at(url.span(), "store.url", "is set but backend is not \"redis\"");
                }
                if let Some(cl) = &s.cluster {
                    c.at(cl.span(), "store.cluster", "is set but backend is not \"redis\"");
                }
                if let Some(se) = &s.sentinel {
                    c.at(se.span(), "store.sentinel", "is set but backend is not \"redis\"");
                }
                if let Some(m) = &s.sentinel_master {
                    c.at(m.span(), "store.sentinel_master", "is set but backend is not \"redis\"");
                }
            }
            StoreBackend::Memory
        }
    };
    let tls = match &backend {
        StoreBackend::Memory => false,
        StoreBackend::Redis { url } => url.starts_with("rediss://"),
        StoreBackend::RedisCluster { seeds: urls } | StoreBackend::RedisSentinel { sentinels: urls, .. } => {
            urls.iter().any(|u| u.starts_with("rediss://"))
        }
    };
    let ca = s.ca.as_ref().and_then(|v| store_ca(c, v, base, tls));
    let max_keys = in_range(c, &s.max_keys, "store.max_keys", 1_000, 100_000_000, 1_000_000);
    let fleet_size = s
        .fleet_size
        .is_some()
        .then(|| in_range(c, &s.fleet_size, "store.fleet_size", 1, 10_000, 1));
    let breaker = crate::store::guard::BreakerSettings {
        failures: in_range(c, &s.breaker.failures, "store.breaker.failures", 1, 1_000, 3),
        open_ms: in_range(c, &s.breaker.open_ms, "store.breaker.open_ms", 10, 600_000, 2_000),
    };
    Store {
        backend,
        ca,
        timeout: Duration::from_millis(timeout),
        connect_timeout: Duration::from_millis(connect_timeout),
        ready_without_store,
        max_keys,
        fleet_size,
        breaker,
    }
}

pub(super) fn leasing(c: &mut Check, l: raw::Leasing) -> Leasing {
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
        reserve: l.reserve.as_ref().is_none_or(|r| *r.get_ref()),
    }
}
