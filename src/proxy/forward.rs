//! One request sent upstream: its head made ready for the upstream
//! ([`Forward::new`]), then sent, on a pooled connection or a new one, to
//! the next target in the rotation should one be unreachable, and again
//! under `retries` should the exchange break before the response head
//! ([`Forward::send`]).

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use smallvec::SmallVec;

use super::body::Body;
use super::health::Outcome;
use super::hop_headers::{
    append_forwarded_for, is_upgrade, remove_hop_by_hop, remove_hop_by_hop_keeping, remove_internal,
};
use super::idle::{self, BodyError, Timed};
use super::pool::{self, ConnectError, Slot, UpstreamBody};
use super::request_body::RequestBody;
use super::upstream::{InFlight, Protocol, Target, Upstream};
use super::{
    connect_error, count_error, count_request, note, ForwardError, Reached, TargetError, X_FORWARDED_PROTO,
    X_LEASEGATE_IDENTITY, X_LEASEGATE_JA4, X_REQUEST_ID,
};
use crate::clock;
use crate::connection::ConnInfo;
use crate::telemetry::metrics::Metrics;

/// A request on its way to an upstream: made ready by [`Forward::new`]
/// (its place among the upstream's in flight taken, its head rewritten, a
/// target picked), then sent by [`Forward::send`].
///
/// Made ready before any wait and held in one place until it ends: a
/// future holds what it keeps across its waits, and each `async fn`
/// keeps its arguments twice (as given and as bound), so a request
/// passed down by value through the forwarding futures was copied at
/// each level and held three times. `send` and what it calls borrow it.
pub struct Forward<'a> {
    /// `None` once hyper has taken it for good.
    req: Option<Req>,
    conn: &'a ConnInfo,
    upstream: &'a Arc<Upstream>,
    /// Given to the response body (or the tunnel) when there is one.
    place: Option<InFlight>,
    index: usize,
    target: &'a Target,
    /// The client side of a WebSocket upgrade.
    client_side: Option<hyper::upgrade::OnUpgrade>,
    retries_left: u32,
    /// What sends the request again should its exchange break before the
    /// head (`retries`): its head and a body that can be sent again.
    /// Boxed: only an upstream with retries has one.
    replay: Option<Box<(Request<()>, bytes::Bytes)>>,
}

impl<'a> Forward<'a> {
    /// `req` made ready for `upstream`; `request_id`, if given, is set as
    /// its `x-request-id`. The request takes a place among the upstream's
    /// `max_in_flight`, and among its `client`'s (the client's network)
    /// `max_in_flight_per_client`, held until its response body ends (a
    /// WebSocket tunnel: until it closes); without one it is refused at
    /// once. A body streamed from the client must come at `min_body_rate`
    /// bytes a second (0: any) while the upstream waits for it.
    pub fn new(
        req: Request<RequestBody>,
        conn: &'a ConnInfo,
        (upstream, client, min_body_rate): (&'a Arc<Upstream>, Option<std::net::IpAddr>, u64),
        request_id: Option<&HeaderValue>,
        identity: Option<&str>,
    ) -> Result<Forward<'a>, ForwardError> {
        let place = upstream.enter(client).ok_or_else(|| ForwardError::UpstreamBusy {
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
        let (index, target) =
            upstream
                .pick(clock::coarse_now_ms(), &[])
                .ok_or_else(|| ForwardError::UpstreamUnreachable {
                    upstream: upstream.name.clone(),
                    target: String::new(),
                    reason: "no targets".into(),
                })?;
        // An HTTP/2 request names its host in :authority; HTTP/1.1 upstreams
        // need Host. An origin-form request (HTTP/1.1's) has no authority to
        // give: its `Host` is not looked up.
        if let Some(authority) = req.uri().authority() {
            if !req.headers().contains_key(header::HOST) {
                if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
                    req.headers_mut().insert(header::HOST, value);
                }
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
            // A value no other request repeats: kept out of an HTTP/2
            // upstream's HPACK table.
            headers.insert(X_REQUEST_ID.clone(), crate::limit::headers::changing(id.clone()));
        }
        if let Some(ja4) = ja4 {
            headers.insert(X_LEASEGATE_JA4.clone(), ja4);
        }
        if let Some(v) = identity.and_then(|id| HeaderValue::from_str(id).ok()) {
            headers.insert(X_LEASEGATE_IDENTITY.clone(), v);
        }

        let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
        // An idempotent method, a body that can be sent again: a copy of
        // its head, only for an upstream with retries.
        let retries_left = upstream.retries;
        let replay = (retries_left > 0 && !upgrade && idempotent(req.method()))
            .then(|| {
                req.body()
                    .get_ref()
                    .replayable()
                    .map(|body| Box::new((head_of(&req), body)))
            })
            .flatten();
        Ok(Forward {
            req: Some(req),
            conn,
            upstream,
            place: Some(place),
            index,
            target,
            client_side,
            retries_left,
            replay,
        })
    }

    /// Sends the request and returns its response, or the reason there is
    /// none: a target that cannot be connected to is passed over for the
    /// next in the rotation, and an exchange that breaks before the head
    /// is sent again under `retries`; all within one `request_timeout`.
    /// `reached`, the access log's, is told the target and the time to
    /// the response head; without one (the request is not logged) no
    /// clock is read for it.
    pub async fn send(
        &mut self,
        metrics: &Arc<Metrics>,
        mut reached: Option<&mut Reached>,
    ) -> Result<Response<Body>, ForwardError> {
        let upstream = self.upstream;
        // One deadline for the response head, whichever targets it takes.
        let deadline = tokio::time::Instant::now() + upstream.request_timeout;
        let mut tried: SmallVec<[usize; 4]> = SmallVec::new();
        let asked = reached.is_some().then(std::time::Instant::now);
        let (mut resp, sender, slot) = loop {
            let (index, target) = (self.index, self.target);
            let Some(req) = self.req.as_mut() else {
                // Only a retry without its replay gets here, and it has one.
                return Err(ForwardError::UpstreamFailed {
                    upstream: upstream.name.clone(),
                    target: target.as_str().to_string(),
                    reason: "the request could not be sent again".into(),
                });
            };
            address(req, upstream, target);
            if let Some(reached) = reached.as_deref_mut() {
                reached.target = Some(index);
            }
            if let Some(place) = self.place.as_mut() {
                place.at(index);
            }
            count_request(upstream, target, metrics);
            let slot = Slot::new(upstream, index);
            let failure = match tokio::time::timeout_at(deadline, exchange(&slot, upstream, target, &mut self.req))
                .await
            {
                Ok(Ok((resp, sender))) => {
                    let outcome = match resp.status() {
                        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT => {
                            count_error(upstream, target, TargetError::Status, metrics);
                            Outcome::Failure
                        }
                        _ => Outcome::Success,
                    };
                    note(upstream, index, outcome, metrics);
                    if let (Some(reached), Some(asked)) = (reached.as_deref_mut(), asked) {
                        reached.micros = Some(asked.elapsed().as_micros() as u64);
                    }
                    break (resp, sender, slot);
                }
                Ok(Err(Attempt::Connect(e))) => {
                    note(upstream, index, Outcome::Failure, metrics);
                    let failure = connect_error(upstream, target, e, metrics);
                    let kind = match failure {
                        ForwardError::UpstreamTimeout { .. } => TargetError::Timeout,
                        _ => TargetError::Unreachable,
                    };
                    count_error(upstream, target, kind, metrics);
                    tried.push(index);
                    // Nothing was sent (the request is still here): the
                    // next target in the rotation may have it at once.
                    if let Some((next, t)) = upstream.pick(clock::coarse_now_ms(), &tried) {
                        tracing::warn!(error = %failure, next = t.as_str(), "upstream connect failed; retried on another target");
                        (self.index, self.target) = (next, t);
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
                        if self.retries_left > 0 {
                            let next = upstream.pick(clock::coarse_now_ms(), &tried);
                            if let (Some((next, t)), Some(replay)) = (next, self.replay.as_deref()) {
                                self.retries_left -= 1;
                                tracing::warn!(error = %e, next = t.as_str(), "upstream exchange failed before the response head; retried on another target (retries)");
                                self.req = Some(again(&replay.0, &replay.1, upstream));
                                if self.retries_left == 0 {
                                    self.replay = None;
                                }
                                (self.index, self.target) = (next, t);
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
            if let Some(client_side) = self.client_side.take() {
                let upstream_side = hyper::upgrade::on(&mut resp);
                // The tunnel keeps the client connection's slot (connection
                // limit, drain) until it closes.
                let held = self.conn.guard.clone();
                let idle = self.conn.idle_timeout;
                let idle_closed = metrics.connections_idle_closed.clone();
                let place = self.place.take();
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
        let place = self.place.take();
        let idle_timeout = upstream.idle_timeout;
        Ok(resp.map(|body| Body::Streamed(UpstreamBody::new(body, (slot, sender), idle_timeout, place, metrics))))
    }
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
    /// No connection: the request was not sent, and is where it was.
    Connect(ConnectError),
    Failed(ForwardError),
}

/// The request in `req` sent to `target` on a pooled connection, or a new
/// one. Taken from `req` when hyper takes it for good; left there when it
/// was never sent (no connection), so it can go to another target.
async fn exchange(
    slot: &Slot,
    upstream: &Upstream,
    target: &Target,
    req: &mut Option<Req>,
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
                    Err(e) => return Err(Attempt::Connect(e)),
                }
            }
        };
        let Some(sent) = req.take() else {
            return Err(Attempt::Failed(ForwardError::UpstreamFailed {
                upstream: upstream.name.clone(),
                target: target.as_str().to_string(),
                reason: "no request to send".into(),
            }));
        };
        // hyper's own futures, each awaited here: a wrapper `async fn`
        // would hold the request once more.
        let answer = match &mut sender {
            pool::Sender::H1(s) => s.try_send_request(sent).await,
            pool::Sender::H2(s) => s.try_send_request(sent).await,
        };
        match answer {
            Ok(resp) => return Ok((resp, sender)),
            Err(mut e) => match e.take_message() {
                Some(back) if !fresh => {
                    fresh = true;
                    *req = Some(back);
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
    use super::*;

    /// The request is held once: by the `Forward` that the boxed future
    /// keeps, never by value in the futures that send it. Passed down by
    /// value, each `async fn` level held it again (twice: as given and as
    /// bound), and the box copied every byte of it.
    #[test]
    fn the_request_is_held_once_not_by_the_futures_that_send_it() {
        fn size_of_send<'a, F, Fut>(_: F) -> usize
        where
            F: FnOnce(&'a mut Forward<'a>, &'a Arc<Metrics>, Option<&'a mut Reached>) -> Fut,
        {
            std::mem::size_of::<Fut>()
        }
        let req = std::mem::size_of::<Req>();
        let forward = std::mem::size_of::<Forward<'_>>();
        let send = size_of_send(Forward::send);
        eprintln!("request {req} B, Forward {forward} B, send's future {send} B");
        // The request, the references, the place and the small state.
        assert!(forward <= req + 160, "Forward is {forward} bytes, its request {req}");
        // hyper's own send future holds the request until it is written
        // (one copy, `Result<Receiver, Request>`); nothing of ours does: a
        // request passed to `send` or `exchange` by value adds at least
        // one more (808 bytes here for 360 of request, debug build).
        assert!(send <= req + 512, "send's future is {send} bytes, a request {req}");
    }
}
