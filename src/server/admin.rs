//! The admin listener: `/healthz`, `/readyz`, `/metrics`, `/config`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::body::Body;
use crate::gateway::Gateway;

pub async fn serve(listener: TcpListener, gateway: Arc<Gateway>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let resp = handle(&req, &gateway);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Body::full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn handle(req: &Request<Incoming>, gateway: &Gateway) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "use GET\n".into());
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if gateway.is_draining() => text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".into()),
        // A store outage does not fail readiness: every instance shares the
        // store, so it would take the whole fleet out of its load balancer,
        // fail-open routes included. The body says how the store is.
        "/readyz" => {
            let store = if gateway.metrics.circuit_open.get() == 1 {
                "circuit open: fail-open routes use their fallback buckets, fail-closed routes answer 503"
            } else {
                "ok"
            };
            text(
                StatusCode::OK,
                "text/plain",
                format!("ready\nstore {}: {store}\n", gateway.limiter.store_name()),
            )
        }
        "/metrics" => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            gateway.metrics.encode(),
        ),
        "/config" => {
            let config = gateway.config();
            let body = serde_json::json!({
                "sha256": config.source.sha256_hex(),
                "path": config.source.path.display().to_string(),
                "loaded_at": humantime::format_rfc3339_seconds(config.source.loaded_at).to_string(),
                "instance_id": config.gateway.instance_id,
                "routes": config.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
                "limits": config.limits.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
                "upstreams": config.upstreams.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
            });
            text(StatusCode::OK, "application/json", format!("{body}\n"))
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /healthz /readyz /metrics /config\n".into(),
        ),
    }
}
