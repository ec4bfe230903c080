//! Envoy's rate limit APIs over gRPC (HTTP/2, cleartext or TLS): the RLS v3
//! `ShouldRateLimit` ([`should`]), answered like envoyproxy/ratelimit from
//! its YAML, and RLQS `StreamRateLimitQuotas` ([`quota`]), where each
//! Envoy's token-bucket assignment is its lease of the shared quota. Both
//! run on the runtime's limiter, store and leases.
//!
//! The generated tonic services are mounted on our own hyper connection
//! loop rather than tonic's `Server` builder, whose `add_service` needs
//! tonic's `router` feature and with it axum: two small path matches here
//! cost less than a web framework in the dependency tree.

pub mod assign;
pub mod matcher;
pub mod quota;
pub mod should;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tower_service::Service as _;

use crate::runtime::Runtime;

/// Most gRPC connections open at once (Envoys hold one or a few each).
pub const MAX_CONNECTIONS: usize = 10_000;
/// Most concurrent calls and streams on one connection.
const MAX_STREAMS_PER_CONNECTION: u32 = 1_000;

/// Largest ShouldRateLimit message decoded (tonic's default is 4 MiB): one
/// within every cap of `should` is far smaller. A larger one is refused by
/// tonic before it is decoded, `OUT_OF_RANGE`.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Largest RLQS usage report decoded: one report may carry a stream's
/// whole set of buckets (up to 10 000, a few dozen bytes each).
pub const MAX_REPORT_BYTES: usize = 1024 * 1024;

const RLS_PREFIX: &str = "/envoy.service.ratelimit.v3.RateLimitService/";
const RLQS_PREFIX: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/";

/// Both services, routed by the gRPC path.
#[derive(Clone)]
struct Routes {
    rls: RateLimitServiceServer<should::ShouldRateLimit>,
    rlqs: RateLimitQuotaServiceServer<quota::QuotaService>,
}

type Reply = http::Response<tonic::body::Body>;

impl hyper::service::Service<http::Request<Incoming>> for Routes {
    type Response = Reply;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, Infallible>> + Send>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let path = req.uri().path();
        if path.starts_with(RLS_PREFIX) {
            let mut svc = self.rls.clone();
            Box::pin(svc.call(req))
        } else if path.starts_with(RLQS_PREFIX) {
            let mut svc = self.rlqs.clone();
            Box::pin(svc.call(req))
        } else {
            let status = tonic::Status::unimplemented(format!("no such service: {path}"));
            Box::pin(std::future::ready(Ok(status.into_http())))
        }
    }
}

/// Both services, for every connection the server accepts on the `[rls]`
/// listener (`server` runs the accept loop, within [`MAX_CONNECTIONS`]).
#[derive(Clone)]
pub struct RlsService {
    routes: Routes,
}

impl RlsService {
    pub fn new(runtime: Arc<Runtime>) -> RlsService {
        RlsService {
            routes: Routes {
                rls: RateLimitServiceServer::new(should::ShouldRateLimit::new(runtime.clone()))
                    .max_decoding_message_size(MAX_MESSAGE_BYTES),
                rlqs: RateLimitQuotaServiceServer::new(quota::QuotaService::new(runtime))
                    .max_decoding_message_size(MAX_REPORT_BYTES),
            },
        }
    }

    /// Serves one connection (TCP, or TLS after the server's handshake)
    /// until the peer goes away.
    pub async fn serve_connection<I>(&self, stream: I)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // Envoys hold their connections for long: a peer that vanished
        // without a reset is found by the pings, and its streams end.
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(10))
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .serve_connection(TokioIo::new(stream), self.routes.clone());
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "rls connection ended");
        }
    }
}
