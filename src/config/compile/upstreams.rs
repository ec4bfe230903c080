//! `[[upstreams]]`: their targets, and TLS to the `https://` ones.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use rustls::RootCertStore;
use toml::Spanned;

use super::listeners::{identity, provider, roots};
use super::{choice, in_range, Check};
use crate::config::raw;
use crate::proxy::health::ActiveCheck;
use crate::proxy::health::Ejection;
use crate::proxy::upstream::{Balance, Protocol, Target, Upstream, UpstreamTls};

/// Upstreams in file order.
/// `kept`: the request fields the gateway reads, which a client's
/// `Connection` may not strip on the way to any upstream.
pub(super) fn upstreams(
    c: &mut Check,
    list: Vec<Spanned<raw::Upstream>>,
    base: &Path,
    kept: &Arc<[http::HeaderName]>,
) -> Vec<Arc<Upstream>> {
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
        let mut parsed = Vec::new();
        for t in u.targets.get_ref() {
            match target(t.get_ref()) {
                Ok(a) => parsed.push(a),
                Err(why) => c.at(t.span(), format!("{key}.targets"), format!("{:?}: {why}", t.get_ref())),
            }
        }
        let https = parsed.iter().any(|(_, tls)| *tls);
        if https && parsed.iter().any(|(_, tls)| !*tls) {
            c.at(
                u.targets.span(),
                format!("{key}.targets"),
                "mixes http:// and https:// targets: one upstream's targets are reached alike",
            );
        }
        let protocol = choice(
            c,
            u.protocol.as_ref(),
            &format!("{key}.protocol"),
            &[("http1", Protocol::Http1), ("h2", Protocol::H2)],
            Protocol::Http1,
        );
        let tls = if https {
            upstream_tls(c, base, &key, &u, protocol)
        } else {
            for (v, field) in [
                (&u.ca, "ca"),
                (&u.server_name, "server_name"),
                (&u.tls_cert, "tls_cert"),
                (&u.tls_key, "tls_key"),
            ] {
                if let Some(v) = v {
                    c.at(
                        v.span(),
                        format!("{key}.{field}"),
                        "applies to https:// targets only, and this upstream has none",
                    );
                }
            }
            None
        };
        let server_name = u.server_name.as_ref().map(|s| s.get_ref().as_str());
        let mut targets = Vec::new();
        for (authority, tls) in parsed {
            if !tls {
                targets.push(Target::plain(authority));
                continue;
            }
            match Target::tls(authority.clone(), server_name) {
                Some(t) => targets.push(t),
                None => {
                    let (span, field) = match &u.server_name {
                        Some(s) => (s.span(), "server_name"),
                        None => (u.targets.span(), "targets"),
                    };
                    c.at(
                        span,
                        format!("{key}.{field}"),
                        format!(
                            "{:?} is not a DNS name or an IP address a certificate can be checked against",
                            server_name.unwrap_or(authority.host())
                        ),
                    );
                }
            }
        }
        let mut ms = |v: &Option<Spanned<i64>>, field: &str, default: u64| {
            Duration::from_millis(in_range(c, v, &format!("{key}.{field}"), 1, 3_600_000, default))
        };
        let connect = ms(&u.connect_timeout_ms, "connect_timeout_ms", 1_000);
        let request = ms(
            &u.request_timeout_ms,
            "request_timeout_ms",
            crate::config::summary::DEFAULT_REQUEST_TIMEOUT_MS,
        );
        let idle = ms(&u.pool_idle_timeout_ms, "pool_idle_timeout_ms", 90_000);
        let body_idle = ms(&u.idle_timeout_ms, "idle_timeout_ms", 60_000);
        let eject_ms = ms(&u.eject_ms, "eject_ms", 10_000);
        let max_idle = in_range(
            c,
            &u.pool_max_idle_per_host,
            &format!("{key}.pool_max_idle_per_host"),
            0,
            100_000,
            1_024,
        );
        let max_in_flight = in_range(
            c,
            &u.max_in_flight,
            &format!("{key}.max_in_flight"),
            1,
            10_000_000,
            1_024,
        );
        let max_in_flight_per_client = in_range(
            c,
            &u.max_in_flight_per_client,
            &format!("{key}.max_in_flight_per_client"),
            1,
            max_in_flight,
            crate::proxy::upstream::Limits::default_share(max_in_flight),
        );
        if out.iter().any(|o| o.name == name) {
            c.at(
                u.name.span(),
                format!("{key}.name"),
                format!("duplicate upstream name {name:?}"),
            );
        }
        let ejection = Ejection {
            after: in_range(c, &u.eject_after, &format!("{key}.eject_after"), 0, 1_000, 5),
            first: eject_ms,
        };
        let limits = crate::proxy::upstream::Limits {
            idle_timeout: body_idle,
            max_in_flight,
            max_in_flight_per_client,
        };
        let active = u.health.as_ref().and_then(|h| active_check(c, &key, h));
        let balance = choice(
            c,
            u.balance.as_ref(),
            &format!("{key}.balance"),
            &[
                ("round_robin", Balance::RoundRobin),
                ("least_request", Balance::LeastRequest),
            ],
            Balance::RoundRobin,
        );
        out.push(Arc::new(
            Upstream::new(name, targets, (tls, protocol), connect, request, idle, max_idle)
                .with_limits(limits)
                .with_ejection(ejection)
                .with_kept_headers(kept.clone())
                .with_active(active)
                .with_balance(balance)
                .with_retries(in_range(c, &u.retries, &format!("{key}.retries"), 0, 10, 0)),
        ));
    }
    out
}

/// `health = { path, interval_ms, timeout_ms, unhealthy, healthy }`.
fn active_check(c: &mut Check, key: &str, h: &Spanned<raw::HealthCheck>) -> Option<ActiveCheck> {
    let h = h.get_ref();
    let key = format!("{key}.health");
    let path = h.path.get_ref();
    let parsed = if path.starts_with('/') {
        path.parse::<http::uri::PathAndQuery>().ok()
    } else {
        None
    };
    if parsed.is_none() {
        c.at(
            h.path.span(),
            format!("{key}.path"),
            format!("{path:?} is not a path: write one that starts with / (\"/healthz\")"),
        );
    }
    let interval: u64 = in_range(c, &h.interval_ms, &format!("{key}.interval_ms"), 100, 3_600_000, 5_000);
    let timeout: u64 = in_range(
        c,
        &h.timeout_ms,
        &format!("{key}.timeout_ms"),
        1,
        3_600_000,
        interval.min(1_000),
    );
    if timeout > interval {
        if let Some(t) = &h.timeout_ms {
            c.at(
                t.span(),
                format!("{key}.timeout_ms"),
                format!("{timeout} is longer than interval_ms ({interval}): a check must end before the next"),
            );
        }
    }
    let unhealthy = in_range(c, &h.unhealthy, &format!("{key}.unhealthy"), 1, 1_000, 3);
    let healthy = in_range(c, &h.healthy, &format!("{key}.healthy"), 1, 1_000, 2);
    Some(ActiveCheck {
        path: parsed?,
        interval: Duration::from_millis(interval),
        timeout: Duration::from_millis(timeout),
        unhealthy,
        healthy,
    })
}

/// TLS to an upstream's `https://` targets: the roots (`ca`, else the
/// system's), the client certificate (`tls_cert`, `tls_key`) and ALPN
/// for `protocol`.
fn upstream_tls(c: &mut Check, base: &Path, key: &str, u: &raw::Upstream, protocol: Protocol) -> Option<UpstreamTls> {
    let mut files = Vec::new();
    let trusted = match &u.ca {
        Some(ca) => {
            let (path, store) = roots(c, base, ca, &format!("{key}.ca"))?;
            files.push(path);
            store
        }
        None => system_roots(c, key, u)?,
    };
    let client = match (&u.tls_cert, &u.tls_key) {
        (Some(cert), Some(k)) => {
            let id = identity(
                c,
                base,
                (cert, &format!("{key}.tls_cert")),
                (k, &format!("{key}.tls_key")),
            )?;
            files.extend([id.cert.clone(), id.key.clone()]);
            Some(id)
        }
        (None, None) => None,
        (Some(v), None) | (None, Some(v)) => {
            c.at(v.span(), format!("{key}.tls_cert"), "set tls_cert and tls_key together");
            return None;
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(trusted));
    let built = match (builder, client) {
        (Ok(b), None) => Ok(b.with_no_client_auth()),
        (Ok(b), Some(id)) => b.with_client_auth_cert(id.chain, id.private),
        (Err(e), _) => Err(e),
    };
    let mut config = match built {
        Ok(config) => config,
        Err(e) => {
            let (span, field) = match &u.tls_key {
                Some(k) => (k.span(), "tls_key"),
                None => (u.name.span(), "name"),
            };
            c.at(span, format!("{key}.{field}"), format!("cannot make a TLS client: {e}"));
            return None;
        }
    };
    config.alpn_protocols = match protocol {
        Protocol::Http1 => vec![b"http/1.1".to_vec()],
        Protocol::H2 => vec![b"h2".to_vec()],
    };
    let paths: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let digest = crate::config::tls_files_digest(&paths);
    Some(UpstreamTls {
        config: Arc::new(config),
        files,
        digest,
    })
}

/// The system's trust roots (the OS bundle, or `SSL_CERT_FILE` /
/// `SSL_CERT_DIR`), read at every load like any other certificate file.
fn system_roots(c: &mut Check, key: &str, u: &raw::Upstream) -> Option<Arc<RootCertStore>> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_string(), |e| e.to_string());
        c.at(
            u.targets.span(),
            format!("{key}.ca"),
            format!(
                "https:// targets are verified against the system's root certificates, and none could be read \
                 ({why}): install the CA bundle (ca-certificates) or set `ca`"
            ),
        );
        return None;
    }
    Some(Arc::new(store))
}

/// An upstream target: `http://host:port` or `https://host:port`, nothing
/// after the authority; `true` for https.
fn target(s: &str) -> Result<(Authority, bool), String> {
    let uri: Uri = s.parse().map_err(|e| format!("not a URL ({e})"))?;
    let (tls, default_port) = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => (false, 80),
        Some(s) if *s == Scheme::HTTPS => (true, 443),
        _ => return Err("expected http://host:port or https://host:port".into()),
    };
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err("a target has no path: the request's (normalised) path is forwarded as it is".into());
    }
    let authority = uri.authority().ok_or("expected http://host:port")?.clone();
    if authority.as_str().contains('@') {
        return Err("credentials in a target URL are not supported".into());
    }
    if authority.port_u16().is_none() {
        // Make the port explicit so pooling and logs never guess.
        let authority = format!("{}:{default_port}", authority.host())
            .parse()
            .map_err(|e| format!("{e}"))?;
        return Ok((authority, tls));
    }
    Ok((authority, tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_authorities_with_their_port() {
        let t = |s| target(s).map(|(a, tls)| (a.as_str().to_string(), tls));
        assert_eq!(t("http://127.0.0.1:9000").unwrap(), ("127.0.0.1:9000".into(), false));
        assert_eq!(t("http://backend").unwrap(), ("backend:80".into(), false));
        assert_eq!(t("http://backend/").unwrap(), ("backend:80".into(), false));
        assert_eq!(
            t("https://api.example.com").unwrap(),
            ("api.example.com:443".into(), true)
        );
        assert_eq!(t("https://10.0.0.1:8443/").unwrap(), ("10.0.0.1:8443".into(), true));
        assert!(target("ftp://backend:21").is_err());
        assert!(target("http://backend:80/api").unwrap_err().contains("no path"));
        assert!(target("http://user:pw@backend:80").unwrap_err().contains("credentials"));
        assert!(target("backend:80").is_err());
    }
}
