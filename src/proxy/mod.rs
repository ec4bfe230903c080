//! Forwarding a request to an upstream and its response back.
//!
//! Bodies stream both ways and are never buffered whole. Hop-by-hop headers
//! are dropped; `x-forwarded-*` and `x-request-id` are set; client-sent
//! `x-leasegate-*` headers are removed. HTTP/1.1 upgrades (WebSocket) are
//! tunnelled. Targets are spoken to in HTTP/1.1 or h2, in the clear or
//! over TLS. Each worker thread keeps its own connection pool per upstream.

pub mod active;
pub mod body;
pub mod error;
mod forward;
pub mod health;
pub mod hop_headers;
pub mod idle;
pub mod pool;
pub mod request_body;
pub mod upstream;

use http::header::HeaderName;

use crate::clock;
use crate::telemetry::metrics::{
    Metrics, UpstreamTargetErrorLabels, UpstreamTargetLabels, UpstreamTlsLabels, TARGET_ERROR_KINDS,
};
pub use error::ForwardError;
pub use forward::Forward;
use health::{Change, Outcome};
use pool::ConnectError;
use upstream::{Target, Upstream};

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub static X_LEASEGATE_JA4: HeaderName = HeaderName::from_static("x-leasegate-ja4");
pub static X_LEASEGATE_IDENTITY: HeaderName = HeaderName::from_static("x-leasegate-identity");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Which target a request reached, for the access log: the one that
/// answered (or failed last), and the time from the first pick to its
/// response head.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reached {
    /// An index into the upstream's targets.
    pub target: Option<usize>,
    pub micros: Option<u64>,
}

/// One more request sent to `target`.
fn count_request(upstream: &Upstream, target: &Target, metrics: &Metrics) {
    target
        .counters
        .requests
        .get_or_init(|| {
            metrics
                .upstream_target_requests
                .get_or_create(&UpstreamTargetLabels {
                    upstream: upstream.name.clone(),
                    target: target.as_str().to_string(),
                })
                .clone()
        })
        .inc();
}

/// How a request to a target failed, by its index in
/// [`TARGET_ERROR_KINDS`].
#[derive(Debug, Clone, Copy)]
enum TargetError {
    Unreachable = 0,
    Timeout = 1,
    Failed = 2,
    Status = 3,
}

/// One more failed request to `target`.
fn count_error(upstream: &Upstream, target: &Target, kind: TargetError, metrics: &Metrics) {
    let i = kind as usize;
    let (Some(slot), Some(&kind)) = (target.counters.errors.get(i), TARGET_ERROR_KINDS.get(i)) else {
        return;
    };
    slot.get_or_init(|| {
        metrics
            .upstream_target_errors
            .get_or_create(&UpstreamTargetErrorLabels {
                upstream: upstream.name.clone(),
                target: target.as_str().to_string(),
                kind,
            })
            .clone()
    })
    .inc();
}

/// Records how a request to target `index` went; a target that leaves or
/// rejoins the rotation is logged and its gauge set.
fn note(upstream: &Upstream, index: usize, outcome: Outcome, metrics: &Metrics) {
    let Some(change) = upstream.report(index, outcome, clock::coarse_now_ms()) else {
        return;
    };
    let Some(target) = upstream.targets.get(index) else {
        return;
    };
    let up = metrics.upstream_target_up.get_or_create(&UpstreamTargetLabels {
        upstream: upstream.name.clone(),
        target: target.as_str().to_string(),
    });
    up.set(i64::from(upstream.target_up(index)));
    match change {
        Change::Ejected { for_ms } => {
            tracing::warn!(upstream = %upstream.name, target = %target.as_str(), for_ms, "upstream target ejected");
        }
        Change::Restored => {
            tracing::info!(upstream = %upstream.name, target = %target.as_str(), "upstream target back in the rotation");
        }
    }
}

/// A connect that failed, as the request's error (logged with the target
/// and the low-level reason); a failed TLS handshake is also counted by
/// its reason.
fn connect_error(upstream: &Upstream, target: &Target, e: ConnectError, metrics: &Metrics) -> ForwardError {
    if let Some(reason) = e.tls_reason() {
        metrics
            .upstream_tls_failures
            .get_or_create(&UpstreamTlsLabels {
                upstream: upstream.name.clone(),
                reason,
            })
            .inc();
    }
    let target = target.as_str().to_string();
    match e {
        ConnectError::Timeout(ms)
        | ConnectError::Tls {
            reason: "timeout",
            timeout_ms: ms,
            ..
        } => ForwardError::UpstreamTimeout {
            upstream: upstream.name.clone(),
            target,
            timeout_ms: ms,
        },
        e => ForwardError::UpstreamUnreachable {
            upstream: upstream.name.clone(),
            target,
            reason: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::hop_headers::{append_forwarded_for, is_upgrade, remove_hop_by_hop, remove_internal};
    use super::hop_headers::{hop_by_hop_index, HOP_BY_HOP};
    use super::*;
    use crate::connection::ConnInfo;
    use http::header::{HeaderMap, HeaderValue};

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// `Connection: keep-alive` (any case) takes the short way, and strips
    /// what the long way strips: itself and a `Keep-Alive` field.
    #[test]
    fn keep_alive_alone_is_stripped_with_its_field() {
        for value in ["keep-alive", "Keep-Alive"] {
            let mut h = map(&[("connection", value), ("keep-alive", "timeout=5"), ("x-kept", "1")]);
            remove_hop_by_hop(&mut h, false);
            assert_eq!(h.len(), 1, "{value}: {h:?}");
            assert_eq!(h["x-kept"], "1");
        }
        // Beside another value, the fields that one names still go.
        let mut h = map(&[("connection", "keep-alive"), ("connection", "x-hop"), ("x-hop", "1")]);
        remove_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn the_index_match_and_the_list_agree() {
        for (i, h) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(h), Some(i), "{h}");
        }
        // As a parser makes them: any case, standard or custom.
        for (wire, i) in [("Connection", 0), ("TE", 2), ("Keep-Alive", 7), ("PROXY-CONNECTION", 8)] {
            let name = HeaderName::from_bytes(wire.as_bytes()).unwrap();
            assert_eq!(hop_by_hop_index(&name), Some(i), "{wire}");
        }
        for other in [
            "host",
            "content-length",
            "x-forwarded-for",
            "x-leasegate-identity",
            "proxy",
            "tea",
            "upgrade-insecure-requests",
            "keep-alive-x",
        ] {
            assert_eq!(hop_by_hop_index(&HeaderName::from_static(other)), None, "{other}");
        }
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = map(&[
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
        ]);
        remove_hop_by_hop(&mut h, false);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["accept"]);
    }

    #[test]
    fn only_what_is_present_goes_and_names_match_in_any_case() {
        // An upstream's usual `Connection: keep-alive`, alone.
        let mut h = map(&[("connection", "keep-alive"), ("content-length", "3")]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["content-length"]);
        // Connection options name fields in any case, hop-by-hop or not.
        let mut h = map(&[
            ("connection", "Keep-Alive, TE, X-Trace"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("x-trace", "1"),
            ("x-kept", "1"),
        ]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);
        // No hop-by-hop field at all: nothing changes.
        let mut h = map(&[("accept", "*/*"), ("x-a", "1")]);
        remove_hop_by_hop(&mut h, true);
        assert_eq!(h.len(), 2);
        assert!(h.get("connection").is_none());
    }

    #[test]
    fn an_upgrade_keeps_what_the_next_hop_needs() {
        let mut h = map(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(is_upgrade(&h));
        remove_hop_by_hop(&mut h, true);
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["sec-websocket-key"], "k");
        assert!(!is_upgrade(&map(&[("upgrade", "websocket")])));
        // Only WebSocket is tunnelled: an h2c upgrade is dropped.
        let mut h = map(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
            ("http2-settings", "AAMAAABkAAQAAP__"),
        ]);
        assert!(!is_upgrade(&h));
        remove_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn connection_cannot_name_away_the_host_or_the_gateways_fields() {
        let mut h = map(&[
            (
                "connection",
                "host, x-request-id, X-Leasegate-Identity, content-length, x-other",
            ),
            ("host", "api.example.com"),
            ("x-request-id", "r1"),
            ("content-length", "3"),
            ("x-other", "1"),
        ]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h["host"], "api.example.com");
        assert_eq!(h["x-request-id"], "r1");
        assert_eq!(h["content-length"], "3");
        assert!(h.get("x-other").is_none());
    }

    #[test]
    fn internal_headers_are_stripped_and_forwarded_for_appended() {
        let mut h = map(&[
            ("x-leasegate-identity", "user:forged"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-leasegate-ja4", "x"),
        ]);
        remove_internal(&mut h);
        assert!(h.keys().all(|k| !k.as_str().starts_with("x-leasegate-")));
        let conn = ConnInfo::new("[::ffff:192.0.2.1]:5000".parse().unwrap(), None, None);
        append_forwarded_for(&mut h, &conn);
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 192.0.2.1");
    }
}
