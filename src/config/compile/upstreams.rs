//! `[[upstreams]]` and their targets.

use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use toml::Spanned;

use super::{in_range, Check};
use crate::config::raw;
use crate::proxy::upstream::Upstream;

/// Upstreams in file order.
pub(super) fn upstreams(c: &mut Check, list: Vec<Spanned<raw::Upstream>>) -> Vec<Arc<Upstream>> {
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
        if out.iter().any(|o| o.name == name) {
            c.at(
                u.name.span(),
                format!("{key}.name"),
                format!("duplicate upstream name {name:?}"),
            );
        }
        let limits = crate::proxy::upstream::Limits {
            idle_timeout: body_idle,
            max_in_flight,
        };
        out.push(Arc::new(
            Upstream::new(name, targets, connect, request, idle, max_idle).with_limits(limits),
        ));
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
        return Err("a target has no path: the request's (normalised) path is forwarded as it is".into());
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
