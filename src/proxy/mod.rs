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
pub mod health;
pub mod hop_headers;
pub mod idle;
pub mod pool;
pub mod request_body;
pub mod upstream;

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;

use std::sync::Arc;

use crate::clock;
use crate::connection::ConnInfo;
use crate::telemetry::metrics::{
    Metrics, UpstreamTargetErrorLabels, UpstreamTargetLabels, UpstreamTlsLabels, TARGET_ERROR_KINDS,
};
use body::Body;
pub use error::ForwardError;
use health::{Change, Outcome};
use hop_headers::{append_forwarded_for, is_upgrade, remove_hop_by_hop, remove_hop_by_hop_keeping, remove_internal};
use idle::{BodyError, Timed};
use pool::{ConnectError, Slot, UpstreamBody};
use request_body::RequestBody;
use smallvec::SmallVec;
use upstream::{Protocol, Target, Upstream};

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

/// Forwards `req` to `upstream` and returns its response, or the reason it
/// could not; `request_id`, if given, is set as its `x-request-id`. The
/// request holds a place among the upstream's `max_in_flight`, and among
/// its `client`'s (the client's network) `max_in_flight_per_client`,
/// until its response body ends (a WebSocket tunnel: until it closes);
/// without one it is refused at once. A body streamed from the client must
/// come at `min_body_rate` bytes a second (0: any) while the upstream
/// waits for it.
pub async fn forward(
    req: Request<RequestBody>,
    conn: &ConnInfo,
    (upstream, client, min_body_rate): (&Arc<Upstream>, Option<std::net::IpAddr>, u64),
    request_id: Option<&HeaderValue>,
    identity: Option<&str>,
    metrics: &Arc<Metrics>,
    reached: &mut Reached,
) -> Result<Response<Body>, ForwardError> {
    let mut place = upstream.enter(client).ok_or_else(|| ForwardError::UpstreamBusy {
        upstream: upstream.name.clone(),
        max: upstream.max_in_flight,
    })?;
    let mut req = req.map(|body| {
        let streamed = !matches!(body, RequestBody::Read(..));
        let timed = Timed::new(body, upstream.idle_timeout);
        if streamed {
            timed.with_min_rate(min_body_rate)
        } else {
            timed
        }
    });
    let (mut index, mut target) =
        upstream
            .pick(clock::coarse_now_ms(), &[])
            .ok_or_else(|| ForwardError::UpstreamUnreachable {
                upstream: upstream.name.clone(),
                target: String::new(),
                reason: "no targets".into(),
            })?;
    // An HTTP/2 request names its host in :authority; HTTP/1.1 upstreams need Host.
    if !req.headers().contains_key(header::HOST) {
        if let Some(value) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, value);
        }
    }
    let h2 = upstream.protocol == Protocol::H2;
    // An h2 stream cannot be taken over by another protocol.
    let upgrade = !h2 && req.version() == Version::HTTP_11 && is_upgrade(req.headers());
    // The upstream gets origin-form: the path as routed (normalised by
    // the gateway), with its query.
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        let path = req.uri().path_and_query().cloned();
        *req.uri_mut() = path.map_or_else(|| Uri::from_static("/"), Uri::from);
    }
    *req.version_mut() = if h2 { Version::HTTP_2 } else { Version::HTTP_11 };

    let headers = req.headers_mut();
    remove_hop_by_hop_keeping(headers, upgrade, &upstream.kept_headers);
    remove_internal(headers);
    let ja4 = conn.tls.as_ref().and_then(|t| t.ja4.clone());
    // The fields set below, so the map grows at most once (a client's own
    // `x-forwarded-*` count too: rarely sent, and one slot is cheap).
    let _ = headers.try_reserve(
        2 + usize::from(request_id.is_some()) + usize::from(ja4.is_some()) + usize::from(identity.is_some()),
    );
    append_forwarded_for(headers, conn);
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(conn.scheme()));
    // `None`: the request carries the id it should already (the client's,
    // kept), or the gateway sets none (`request_id = "off"`).
    if let Some(id) = request_id {
        headers.insert(X_REQUEST_ID.clone(), id.clone());
    }
    if let Some(ja4) = ja4 {
        headers.insert(X_LEASEGATE_JA4.clone(), ja4);
    }
    if let Some(v) = identity.and_then(|id| HeaderValue::from_str(id).ok()) {
        headers.insert(X_LEASEGATE_IDENTITY.clone(), v);
    }

    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    // What sends the request again should its exchange break before the
    // head (`retries`): an idempotent method, a body that can be sent
    // again. A copy of its head: only for an upstream with retries.
    let mut retries_left = upstream.retries;
    let mut replay = (retries_left > 0 && !upgrade && idempotent(req.method()))
        .then(|| req.body().get_ref().replayable().map(|body| (head_of(&req), body)))
        .flatten();
    // One deadline for the response head, whichever targets it takes.
    let deadline = tokio::time::Instant::now() + upstream.request_timeout;
    let mut tried: SmallVec<[usize; 4]> = SmallVec::new();
    let asked = std::time::Instant::now();
    let (mut resp, sender, slot) = loop {
        address(&mut req, upstream, target);
        reached.target = Some(index);
        place.at(index);
        count_request(upstream, target, metrics);
        let slot = Slot::new(upstream, index);
        let failure = match tokio::time::timeout_at(deadline, exchange(&slot, upstream, target, req)).await {
            Ok(Ok((resp, sender))) => {
                let outcome = match resp.status() {
                    StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT => {
                        count_error(upstream, target, TargetError::Status, metrics);
                        Outcome::Failure
                    }
                    _ => Outcome::Success,
                };
                note(upstream, index, outcome, metrics);
                reached.micros = Some(asked.elapsed().as_micros() as u64);
                break (resp, sender, slot);
            }
            Ok(Err(Attempt::Connect(e, back))) => {
                note(upstream, index, Outcome::Failure, metrics);
                let failure = connect_error(upstream, target, e, metrics);
                let kind = match failure {
                    ForwardError::UpstreamTimeout { .. } => TargetError::Timeout,
                    _ => TargetError::Unreachable,
                };
                count_error(upstream, target, kind, metrics);
                tried.push(index);
                // Nothing was sent: the next target in the rotation may
                // have it at once.
                if let Some((next, t)) = upstream.pick(clock::coarse_now_ms(), &tried) {
                    tracing::warn!(error = %failure, next = t.as_str(), "upstream connect failed; retried on another target");
                    (index, target, req) = (next, t, *back);
                    continue;
                }
                failure
            }
            Ok(Err(Attempt::Failed(e))) => {
                // A client body that stalled or broke is no fault of the
                // target's.
                if matches!(e, ForwardError::UpstreamFailed { .. }) {
                    note(upstream, index, Outcome::Failure, metrics);
                    count_error(upstream, target, TargetError::Failed, metrics);
                    tried.push(index);
                    if retries_left > 0 {
                        let next = upstream.pick(clock::coarse_now_ms(), &tried);
                        if let (Some((next, t)), Some((head, body))) = (next, replay.as_ref()) {
                            retries_left -= 1;
                            tracing::warn!(error = %e, next = t.as_str(), "upstream exchange failed before the response head; retried on another target (retries)");
                            let again = again(head, body, upstream);
                            if retries_left == 0 {
                                replay = None;
                            }
                            (index, target, req) = (next, t, again);
                            continue;
                        }
                    }
                }
                e
            }
            Err(_) => {
                note(upstream, index, Outcome::Failure, metrics);
                count_error(upstream, target, TargetError::Timeout, metrics);
                ForwardError::UpstreamTimeout {
                    upstream: upstream.name.clone(),
                    target: target.as_str().to_string(),
                    timeout_ms: upstream.request_timeout.as_millis(),
                }
            }
        };
        return Err(failure);
    };

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let upstream_side = hyper::upgrade::on(&mut resp);
            // The tunnel keeps the client connection's slot (connection
            // limit, drain) until it closes.
            let held = conn.guard.clone();
            let idle = conn.idle_timeout;
            let idle_closed = metrics.connections_idle_closed.clone();
            tokio::spawn(async move {
                let _held = held;
                let _place = place;
                if let (Ok(c), Ok(u)) = (client_side.await, upstream_side.await) {
                    idle::tunnel(TokioIo::new(c), TokioIo::new(u), idle, idle_closed).await;
                }
            });
            return Ok(resp.map(|_| Body::empty()));
        }
    }
    remove_hop_by_hop(resp.headers_mut(), false);
    let metrics = metrics.clone();
    Ok(resp.map(|body| Body::Streamed(UpstreamBody::new(body, slot, sender, place, metrics))))
}

type Req = Request<Timed<RequestBody>>;

/// `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`: methods a retry may send
/// twice (RFC 9110 §9.2.2; `TRACE` is never forwarded twice either way).
fn idempotent(m: &http::Method) -> bool {
    use http::Method;
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::PUT, Method::DELETE].contains(m)
}

/// A request's head, to send it again.
fn head_of(req: &Req) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = req.uri().clone();
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    head
}

/// The request of `head` with `body`, as it is sent again.
fn again(head: &Request<()>, body: &bytes::Bytes, upstream: &Upstream) -> Req {
    let mut req = Request::new(Timed::new(RequestBody::read(body.clone(), None), upstream.idle_timeout));
    *req.method_mut() = head.method().clone();
    *req.uri_mut() = head.uri().clone();
    *req.version_mut() = head.version();
    *req.headers_mut() = head.headers().clone();
    req
}

/// Why one target gave no response.
enum Attempt {
    /// No connection: the request, never sent, is handed back (boxed: a
    /// failed connect is rare, the result of every exchange is not).
    Connect(ConnectError, Box<Req>),
    Failed(ForwardError),
}

/// The request sent to `target` on a pooled connection, or a new one.
async fn exchange(
    slot: &Slot,
    upstream: &Upstream,
    target: &Target,
    mut req: Req,
) -> Result<(Response<hyper::body::Incoming>, pool::Sender), Attempt> {
    // A pooled connection that turns out closed before the request was
    // written hands the request back: send it once more, on a new one.
    let mut fresh = false;
    loop {
        let reused = if fresh { None } else { slot.reuse().await };
        let mut sender = match reused {
            Some(s) => s,
            None => {
                fresh = true;
                // Boxed: a new connection is rare, and its future
                // (connect, handshake) would otherwise be part of
                // every request's.
                match Box::pin(slot.connect(upstream, target)).await {
                    Ok(s) => s,
                    Err(e) => return Err(Attempt::Connect(e, Box::new(req))),
                }
            }
        };
        match sender.try_send_request(req).await {
            Ok(resp) => return Ok((resp, sender)),
            Err(mut e) => match e.take_message() {
                Some(back) if !fresh => {
                    fresh = true;
                    req = back;
                }
                _ => {
                    // The connection is never checked back in: hyper shut
                    // it down, and one whose request broke off mid-body
                    // must not carry another.
                    drop(sender);
                    let e = e.into_error();
                    let target = target.as_str().to_string();
                    if let Some(rate) = slow_body(&e) {
                        return Err(Attempt::Failed(ForwardError::BodyTooSlow { rate }));
                    }
                    if stalled_body(&e) {
                        return Err(Attempt::Failed(ForwardError::UpstreamTimeout {
                            upstream: upstream.name.clone(),
                            target,
                            timeout_ms: upstream.idle_timeout.as_millis(),
                        }));
                    }
                    return Err(Attempt::Failed(match client_body_error(&e) {
                        Some(reason) => ForwardError::BadRequestBody { reason },
                        None => ForwardError::UpstreamFailed {
                            upstream: upstream.name.clone(),
                            target,
                            reason: e.to_string(),
                        },
                    }));
                }
            },
        }
    }
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

/// Addresses `req` to `target`. Over TLS the target is sent its own name
/// as `Host`: a hosted API (a CDN, a SaaS) routes and checks by the name
/// it is reached at, and answers the gateway's own host with a 421 or a
/// 404; in the clear the client's `Host` passes as it came (an internal
/// service may route by it). h2 carries the host in `:authority`, from
/// the absolute URI, and no `Host` (RFC 9113 §8.3.1).
fn address(req: &mut Req, upstream: &Upstream, target: &Target) {
    if let Some(host) = &target.host {
        req.headers_mut().insert(header::HOST, host.clone());
    }
    if upstream.protocol != Protocol::H2 {
        return;
    }
    let authority = match req.headers_mut().remove(header::HOST) {
        Some(host) => http::uri::Authority::try_from(host.as_bytes()).ok(),
        None => None,
    }
    .unwrap_or_else(|| target.authority.clone());
    let scheme = if upstream.tls.is_some() {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    };
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    parts.scheme = Some(scheme);
    parts.authority = Some(authority);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
}

/// The request body moved no byte for the upstream's idle timeout.
/// The client's request body came slower than its minimum rate: the rate.
fn slow_body(e: &hyper::Error) -> Option<u64> {
    use std::error::Error as _;
    if !e.is_user() {
        return None;
    }
    match e.source()?.downcast_ref::<BodyError>()? {
        BodyError::TooSlow(rate) => Some(*rate),
        _ => None,
    }
}

fn stalled_body(e: &hyper::Error) -> bool {
    use std::error::Error as _;
    e.is_user()
        && e.source()
            .and_then(|s| s.downcast_ref::<BodyError>())
            .is_some_and(|b| matches!(b, BodyError::Idle(_)))
}

/// Why the client's request body failed, if that is what ended the
/// exchange. hyper reports an error of the body it was sending as a "user
/// body" error whose source is the body's own error: for the client's
/// `Incoming`, a `hyper::Error` (a malformed chunk size, a client gone
/// mid-body). Any other failure is the upstream's.
fn client_body_error(e: &hyper::Error) -> Option<String> {
    use std::error::Error as _;
    if !e.is_user() {
        return None;
    }
    let body = match e.source()?.downcast_ref::<BodyError>()? {
        BodyError::Hyper(e) => e,
        // A client that stops sending mid-body is the upstream
        // exchange's timeout, counted as such; a slow one is told so
        // before this is asked.
        BodyError::Idle(_) | BodyError::TooSlow(_) => return None,
    };
    // The innermost cause says what was wrong ("invalid chunk size: overflow").
    let mut cause: &dyn std::error::Error = body;
    while let Some(next) = cause.source() {
        cause = next;
    }
    Some(cause.to_string())
}

#[cfg(test)]
mod tests {
    use super::hop_headers::{hop_by_hop_index, HOP_BY_HOP};
    use super::*;
    use http::header::HeaderMap;

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

    #[test]
    fn the_index_match_and_the_list_agree() {
        for (i, h) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(h), Some(i), "{h}");
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
