//! The request path, top to bottom: match a route, then answer directly or
//! forward. Later rooms (identity, limits) slot in between as further steps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;

use crate::body::Body;
use crate::config::Config;
use crate::connection::ConnInfo;
use crate::metrics::{Metrics, UpstreamErrorLabels};
use crate::problem::{RequestError, Source};
use crate::proxy::{self, X_REQUEST_ID};
use crate::route::{Action, DirectResponse};

pub struct Gateway {
    config: ArcSwap<Config>,
    pub metrics: Arc<Metrics>,
    draining: AtomicBool,
}

impl Gateway {
    pub fn new(config: Config, metrics: Arc<Metrics>) -> Self {
        Gateway {
            config: ArcSwap::from_pointee(config),
            metrics,
            draining: AtomicBool::new(false),
        }
    }

    /// The config in force now.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Marks the gateway as shutting down (readiness turns false).
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// One request, start to finish. Never fails: every error becomes a response.
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        let config = self.config.load_full();
        let request_id = request_id(req.headers());
        let host = req.uri().authority().map(|a| a.as_str()).or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
        });
        let route = config
            .routes
            .find(host, req.method(), req.uri().path())
            .cloned();

        let result = match &route {
            None => Err(RequestError::NoRoute),
            Some(route) => match &route.action {
                Action::Respond(direct) => Ok(respond(direct)),
                Action::Forward(upstream) => proxy::forward(req, conn, upstream, &request_id).await,
            },
        };
        let mut resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                if e.source() == Source::Upstream {
                    let route_name = route.as_ref().map_or("", |r| r.name.as_str());
                    tracing::warn!(request_id = ?request_id, route = route_name, error = %e, "upstream error");
                    self.record_upstream_error(&e);
                }
                e.to_response()
            }
        };
        resp.headers_mut().insert(X_REQUEST_ID.clone(), request_id);
        resp
    }

    fn record_upstream_error(&self, e: &RequestError) {
        let (upstream, kind) = match e {
            RequestError::UpstreamUnreachable { upstream, .. } => (upstream, "unreachable"),
            RequestError::UpstreamTimeout { upstream, .. } => (upstream, "timeout"),
            RequestError::UpstreamFailed { upstream, .. } => (upstream, "failed"),
            _ => return,
        };
        self.metrics
            .upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                upstream: upstream.clone(),
                kind,
            })
            .inc();
    }
}

fn respond(direct: &DirectResponse) -> Response<Body> {
    let mut resp = Response::new(Body::full(direct.body.clone()));
    *resp.status_mut() = direct.status;
    *resp.headers_mut() = direct.headers.clone();
    resp
}

/// Keeps a client's `x-request-id` when it is sane, else makes a new one.
fn request_id(headers: &http::HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(&X_REQUEST_ID) {
        let b = v.as_bytes();
        if !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic()) {
            return v.clone();
        }
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = [0u8; 32];
    let mut n = fastrand::u128(..);
    for b in id.iter_mut().rev() {
        *b = HEX[(n & 0xf) as usize];
        n >>= 4;
    }
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_when_sane_and_made_otherwise() {
        let mut h = http::HeaderMap::new();
        let made = request_id(&h);
        assert_eq!(made.len(), 32);
        assert_ne!(made, request_id(&h));
        h.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h), "abc-123");
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        assert_eq!(request_id(&h).len(), 32);
    }
}
