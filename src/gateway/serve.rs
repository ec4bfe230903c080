//! One request, start to finish: resolve its route and identity, decide
//! its limits, answer at once or forward, then log it and count it.
//!
//! Synchronous up to the first wait. A refusal, a rejected identity or a
//! direct response is answered without a future of its own; only a wait
//! (the store, the upstream) becomes one, boxed. hyper moves each
//! request's future into place, so it is kept small.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;

use super::cost::{self, Watcher};
use super::logged::{Logged, Pending, Record};
use super::request_id::RequestId;
use super::respond::add_limit_headers;
use super::respond::{self, RequestError, Source};
use super::routed::{Routed, Served};
use super::Gateway;
use crate::config::AccessLog;
use crate::connection::ConnInfo;
use crate::identity;
use crate::limit::cost::meter::Unsettled;
use crate::limit::cost::{Reserves, Settlements};
use crate::limit::stage::Outcome;
use crate::limit::{Checked, Decision, LimitRuntime, Verdict};
use crate::proxy;
use crate::proxy::body::Body;
use crate::proxy::request_body::RequestBody;
use crate::proxy::ForwardError;
use crate::route::{Action, DirectResponse, Route};
use crate::runtime::{facts, identity_clock, route_index_of, Snapshot};
use crate::telemetry::access_log;

impl Gateway {
    /// One request, start to finish, and its access-log line. Never fails:
    /// every error becomes a response.
    ///
    /// Not an `async fn`: one binds its arguments again in its body, so
    /// the request would be copied from the future into that binding
    /// before it is used; the block uses it where the future holds it.
    ///
    /// `wrap` makes the response's body what the connection sends (the
    /// server's watch on the client taking it): applied here, where the
    /// response is made, the response is not handed out of this future
    /// and wrapped by another one around it, which copied it twice more
    /// per request.
    #[allow(clippy::manual_async_fn)]
    pub fn handle<B, W>(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        conn: Arc<ConnInfo>,
        wrap: W,
    ) -> impl std::future::Future<Output = Result<Response<B>, Infallible>> + Send
    where
        W: FnOnce(Body) -> B + Send,
    {
        async move {
            let snapshot = self.runtime.snapshot();
            let started = std::time::Instant::now();
            crate::clock::publish(started);
            // What the log line needs of the request, taken before it is
            // consumed. Boxed: hyper moves this future into place per request,
            // logged or not, so it holds a pointer; the box goes on to watch
            // the response body and write the line at its end.
            let gateway = &snapshot.config.gateway;
            let logged = match gateway.access_log {
                AccessLog::Off => None,
                _ => access_log::format().map(|format| Logged::new(format, gateway.access_log_fields, &req)),
            };
            // Dropped before its response (the client went away): a 499.
            let mut pending = Pending {
                gateway: &self,
                snapshot: &snapshot,
                conn: &conn,
                started,
                route: None,
                logged,
                open: true,
                h2: req.version() == http::Version::HTTP_2,
            };
            let logging = pending.logged.is_some();
            // In a block: nothing of the routing is held across the wait, so
            // hyper's per-request future stays as small as it was.
            let wait = {
                let request_id = RequestId::of(req.headers(), snapshot.config.gateway.request_id);
                let route = match route_of(&snapshot, &mut req) {
                    Ok((index, route)) => {
                        // Known before any wait: a client gone while its
                        // request waits is logged (499) under its route.
                        pending.route = Some(index);
                        route
                    }
                    Err(e) => {
                        let mut resp = self.finish(&snapshot, None, Err(e), request_id, None);
                        pending.done(Record::default(), &mut resp);
                        return Ok(resp.map(wrap));
                    }
                };
                match self.serve(&snapshot, req, &conn, route, request_id, logging) {
                    Served::Now(mut resp, record) => {
                        pending.done(record, &mut resp);
                        return Ok(resp.map(wrap));
                    }
                    Served::Later(wait) => wait,
                }
            };
            let (mut resp, record) = wait.await;
            pending.done(record, &mut resp);
            Ok(resp.map(wrap))
        }
    }

    /// Serves one request on its route.
    ///
    /// Synchronous up to the first wait: a refusal, a rejected identity or
    /// a direct response is answered at once, and only a wait (the store,
    /// the upstream) becomes a future, boxed. hyper moves each request's
    /// future into place, so it is kept small: an inline wait would carry
    /// the request, identity and verdict in it (~1.2 KB) for a 429 too.
    fn serve<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        req: Request<Incoming>,
        conn: &'a ConnInfo,
        route: &'a Route,
        request_id: RequestId,
        logging: bool,
    ) -> Served<'a> {
        // Cheap refusals first: a bearer token may cost a signature check,
        // so a client already refused by a limit that needs no identity
        // (its network's ceiling) is refused before the token is looked at.
        if snapshot.config.identity.jwt.is_some()
            && !route.limits.is_empty()
            && req.headers().contains_key(http::header::AUTHORIZATION)
        {
            if let Some((mut refusal, record)) = self.refused_before_identity(snapshot, route, req.headers(), conn) {
                request_id.stamp(refusal.headers_mut());
                return Served::Now(refusal, record);
            }
        }

        let ja4 = conn
            .tls
            .as_ref()
            .and_then(|t| t.ja4.as_ref())
            .and_then(|v| v.to_str().ok());
        let seen = identity::Connection {
            peer: conn.peer.ip(),
            ja4,
            client_cert: conn.tls.as_ref().and_then(|t| t.client_cert.as_deref()),
        };
        let now_secs = identity_clock(&snapshot.config.identity, req.headers());
        let identity = match snapshot.config.identity.resolve(req.headers(), seen, now_secs) {
            Ok(id) => id,
            Err(rejection) => {
                let mut resp = respond::unauthorized(&rejection.to_string());
                request_id.stamp(resp.headers_mut());
                return Served::Now(resp, Record::default());
            }
        };
        let mut record = Record {
            identity: Some(identity.tier.name()),
            ..Record::new(logging)
        };
        let limits = snapshot.applying(route, identity.tier);
        let priced = cost::priced(&limits);
        let mut request_bytes = priced.as_ref().and_then(|p| p.request_bytes.clone());
        if let Some(client) = record.client.as_deref_mut() {
            client.bytes_in = bytes_in(req.headers(), req.body(), &mut request_bytes);
        }
        let mut req = req.map(|b| RequestBody::streamed(b, request_bytes.clone()));
        if priced.as_ref().is_some_and(|p| p.reads_json) {
            cost::uncompressed(req.headers_mut());
        }
        let mut routed = Routed {
            snapshot,
            req,
            conn,
            route,
            identity,
            limits,
            request_id,
            record,
            costs: Reserves::new(),
            estimates: super::routed::Estimates::new(),
            hide_usage: false,
            request_bytes,
        };
        let Some(priced) = priced else {
            return self.limited(&mut routed);
        };
        if priced.needs_body {
            // A reserve read from the JSON body: the body first, then the
            // decision; it is forwarded as it was read.
            return Served::Later(Box::pin(async move {
                match self.priced_by_body(routed, priced).await {
                    Served::Now(resp, record) => (resp, record),
                    Served::Later(wait) => wait.await,
                }
            }));
        }
        match cost::reserves(&priced, routed.req.uri().path(), routed.req.headers(), None) {
            Ok(pricing) => {
                routed.costs = pricing.costs;
                routed.estimates = pricing.estimates;
            }
            Err(e) => {
                let resp = self.finish(snapshot, Some(route), Err(e), routed.request_id, None);
                return Served::Now(resp, routed.record);
            }
        }
        self.limited(&mut routed)
    }

    /// A routed request, identified and priced: decided by its limits,
    /// then refused or served.
    ///
    /// The request and its verdict are handed on by reference (a few
    /// hundred bytes each, a kilobyte together): moved into a call after
    /// being borrowed here, each would be copied first. Only a wait (the
    /// store's, the line's) takes them, into its box.
    pub(super) fn limited<'a>(&'a self, routed: &mut Routed<'a>) -> Served<'a> {
        // A route with limits of which none applies to the tier is still
        // decided (an empty verdict, logged as admitted).
        if routed.route.limits.is_empty() {
            return self.respond_or_forward(routed, None, Settlements::new());
        }
        let mut verdict = Verdict::default();
        match self.decide_now(routed, &mut verdict) {
            // [`Gateway::decided`], without moving either.
            Checked::Decided => match self.ticket(&verdict) {
                Some(ticket) => self.queued(routed.take(), verdict, ticket),
                None => self.refused_or_served(routed, &mut verdict),
            },
            Checked::NeedsStore(pending) => Served::Later(Box::pin({
                let routed = routed.take();
                async move {
                    let verdict = self.decide_later(&routed, verdict, pending).await;
                    match self.decided(routed, verdict, true) {
                        Served::Now(resp, record) => (resp, record),
                        Served::Later(wait) => wait.await,
                    }
                }
            })),
        }
    }

    /// The 429 for a request whose identity-free limit is blocked, if one
    /// is ([`crate::limit::Limiter::refused_before_identity`]).
    pub(super) fn refused_before_identity(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        headers: &HeaderMap,
        conn: &ConnInfo,
    ) -> Option<(Response<crate::proxy::body::Body>, Record)> {
        let ip = identity::client_ip(conn.peer.ip(), headers, &snapshot.config.identity.trusted_proxies);
        let facts = crate::limit::key::Facts {
            identity: "",
            tenant: None,
            plan: None,
            rates: &[],
            route: &route.name,
            ip,
            headers,
        };
        let mut verdict = Verdict::default();
        if !self
            .runtime
            .limiter
            .refused_before_identity(snapshot.limits_of(&route.limits), &facts, &mut verdict)
        {
            return None;
        }
        let record = Record {
            identity: None,
            outcome: "limited",
            limit: logged_limit(snapshot, &verdict, &facts),
            ..Record::default()
        };
        Some((self.refusal(snapshot, route, &verdict, &[])?, record))
    }

    /// The rest of a request once its verdict is in: in line for a token
    /// (a limit with `queue_ms` refused it, and `may_queue`: not a request
    /// that waited already), refused, or served.
    pub(super) fn decided<'a>(&'a self, mut r: Routed<'a>, mut verdict: Verdict<'a>, may_queue: bool) -> Served<'a> {
        if may_queue {
            if let Some(ticket) = self.ticket(&verdict) {
                return self.queued(r, verdict, ticket);
            }
        }
        self.refused_or_served(&mut r, &mut verdict)
    }

    /// A request its verdict does not put in line: refused, or served.
    /// What the answer needs of `r` and `verdict` is taken from them.
    fn refused_or_served<'a>(&'a self, r: &mut Routed<'a>, verdict: &mut Verdict<'a>) -> Served<'a> {
        r.record.outcome = verdict_outcome(verdict);
        if r.snapshot.config.gateway.access_log != AccessLog::Off && r.record.outcome != "admitted" {
            let facts = facts(r.route, &r.identity, r.req.headers());
            r.record.limit = logged_limit(r.snapshot, verdict, &facts);
        }
        self.send_events(r.route, &r.identity, r.req.headers(), verdict);
        if let Some(mut refusal) = self.refusal(r.snapshot, r.route, verdict, &r.costs) {
            std::mem::take(&mut r.request_id).stamp(refusal.headers_mut());
            if let Some(client) = r.record.client.as_deref_mut() {
                client.identified(r.identity.take());
            }
            return Served::Now(refusal, std::mem::take(&mut r.record));
        }
        if let Some(client) = r.record.client.as_deref_mut() {
            client.costs.clone_from(&r.costs);
        }
        // Served (answered here or forwarded, whatever the upstream does):
        // the request's tokens are spent, and its reserves under limits
        // that settle from the response wait for its end.
        let settlements = verdict.settlements(&r.costs);
        verdict.commit();
        self.respond_or_forward(r, Some(verdict), settlements)
    }

    /// A route's direct response, or the upstream's. What the answer
    /// needs of `r` and `verdict` is taken from them: a wait moves it into
    /// its box once, and a direct response only borrows the verdict.
    fn respond_or_forward<'a>(
        &'a self,
        r: &mut Routed<'a>,
        mut verdict: Option<&mut Verdict<'a>>,
        settlements: Settlements,
    ) -> Served<'a> {
        // In-flight slots are held until the response ends, not the verdict.
        let held = verdict.as_deref_mut().map(Verdict::take_held).unwrap_or_default();
        let (snapshot, conn, route, hide_usage) = (r.snapshot, r.conn, r.route, r.hide_usage);
        let mut record = std::mem::take(&mut r.record);
        let estimates = std::mem::take(&mut r.estimates);
        let request_bytes = r.request_bytes.take();
        let watch = move |resp: &mut Response<Body>, held, settlements| {
            Watcher::watch(
                resp,
                held,
                settlements,
                &estimates,
                snapshot,
                &self.runtime.limiter,
                &self.runtime.metrics,
                request_bytes.as_ref(),
            );
            if hide_usage {
                // After the watch: the meter reads the usage chunk the
                // client does not receive.
                cost::hide_usage(resp, snapshot.config.gateway.max_cost_body_bytes);
            }
        };
        match &route.action {
            Action::Respond(direct) => {
                if let Some(client) = record.client.as_deref_mut() {
                    client.identified(r.identity.take());
                }
                let request_id = std::mem::take(&mut r.request_id);
                let mut resp = self.finish(
                    snapshot,
                    Some(route),
                    Ok(respond(direct)),
                    request_id,
                    verdict.as_deref(),
                );
                watch(&mut resp, held, settlements);
                Served::Now(resp, record)
            }
            Action::Usage(which) => {
                let req = r.take_request();
                let identity = r.identity.take();
                let request_id = std::mem::take(&mut r.request_id);
                let verdict = verdict.map(std::mem::take);
                Served::Later(Box::pin(async move {
                    let answer = self.usage(snapshot, route, &identity, req.headers(), which).await;
                    if let Some(client) = record.client.as_deref_mut() {
                        client.identified(identity);
                    }
                    let mut resp = self.finish(snapshot, Some(route), Ok(answer), request_id, verdict.as_ref());
                    watch(&mut resp, held, settlements);
                    (resp, record)
                }))
            }
            Action::Forward(upstream) => {
                // A client's share of the upstream's places: its network
                // as the connection door counts it (IPv4 by address).
                let client = crate::identity::subnet(r.identity.client_ip, 32, snapshot.config.identity.ipv6_prefix);
                // Made ready before the box: the future holds it once.
                let req = r.take_request();
                let mut forward = proxy::Forward::new(
                    req,
                    conn,
                    (upstream, Some(client.network()), snapshot.config.gateway.min_body_rate),
                    r.request_id.upstream(),
                    Some(&r.identity.value),
                );
                // The log's part of the identity, taken now (nothing reads
                // it before the line is written): the box holds no identity.
                if let Some(client) = record.client.as_deref_mut() {
                    client.identified(r.identity.take());
                }
                let request_id = std::mem::take(&mut r.request_id);
                let verdict = verdict.map(std::mem::take);
                Served::Later(Box::pin(async move {
                    let result = match forward {
                        Ok(ref mut forward) => {
                            let reached = record.client.as_deref_mut().map(|c| &mut c.reached);
                            forward.send(&self.runtime.metrics, reached).await
                        }
                        Err(e) => Err(e),
                    };
                    let failed = result.is_err();
                    if failed {
                        // No response: nothing served, so nothing charged
                        // (`errors = "free"`), or the reserve stands.
                        for s in &settlements {
                            if cost::errors_are_free(&s.limit) {
                                self.runtime.limiter.settle(s, 0);
                                let charged = record
                                    .client
                                    .as_deref_mut()
                                    .and_then(|c| c.costs.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &s.limit)));
                                if let Some(c) = charged {
                                    c.1 = 0;
                                }
                            }
                            cost::unsettled(&self.runtime.metrics, &s.limit.config.name, Unsettled::UpstreamError);
                        }
                    }
                    let mut resp = self.finish(
                        snapshot,
                        Some(route),
                        result.map_err(RequestError::from),
                        request_id,
                        verdict.as_ref(),
                    );
                    let settlements = if failed { Settlements::new() } else { settlements };
                    watch(&mut resp, held, settlements);
                    (resp, record)
                }))
            }
        }
    }

    /// The response to send: the error's if the request failed, with the
    /// verdict's `RateLimit-*` fields and the request id.
    pub(super) fn finish(
        &self,
        snapshot: &Snapshot,
        route: Option<&Route>,
        result: Result<Response<Body>, RequestError>,
        request_id: RequestId,
        verdict: Option<&Verdict<'_>>,
    ) -> Response<Body> {
        let mut resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                if e.source() == Source::Upstream {
                    let route_name = route.map_or("", |r| r.name.as_str());
                    if let RequestError::Forward(ForwardError::UpstreamBusy { .. }) = e {
                        // A flood of these is the overload itself: counted, not logged each.
                        tracing::debug!(request_id = ?request_id.shown(), route = route_name, error = %e, "upstream busy");
                    } else {
                        tracing::warn!(request_id = ?request_id.shown(), route = route_name, error = %e, "upstream error");
                    }
                    self.record_upstream_error(&e);
                } else {
                    tracing::debug!(request_id = ?request_id.shown(), error = %e, "client error");
                }
                e.to_response()
            }
        };
        if let Some(verdict) = verdict {
            add_limit_headers(resp.headers_mut(), snapshot, verdict, request_id.fields());
        }
        request_id.stamp(resp.headers_mut());
        resp
    }

    /// The limiter's verdict on a request (every route limit that applies
    /// to the identity's tier, in order) if the tokens at hand decide it;
    /// else false, with the part decided so far in `verdict` for
    /// [`Gateway::decide_later`]. In place: a verdict is a few hundred bytes.
    pub(super) fn decide_now<'a>(&'a self, r: &Routed<'a>, verdict: &mut Verdict<'a>) -> Checked {
        let facts = facts(r.route, &r.identity, r.req.headers());
        self.runtime.limiter.try_check(&r.limits, &r.costs, &facts, verdict)
    }

    /// The verdict when it waits on the store, from the part decided
    /// without waiting.
    pub(super) async fn decide_later<'a>(
        &'a self,
        r: &Routed<'a>,
        partial: Verdict<'a>,
        pending: crate::limit::Pending,
    ) -> Verdict<'a> {
        let facts = facts(r.route, &r.identity, r.req.headers());
        self.runtime
            .limiter
            .resume(partial, pending, &r.limits, &r.costs, &facts, r.route.on_store_failure)
            .await
    }
}

/// The request body's length for the log: its `Content-Length`, else
/// counted as it goes (in `counter`, made if the request has none yet).
fn bytes_in(
    headers: &HeaderMap,
    body: &Incoming,
    counter: &mut Option<Arc<std::sync::atomic::AtomicU64>>,
) -> super::logged::BytesIn {
    use super::logged::BytesIn;
    use http_body::Body as _;
    if let Some(n) = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        return BytesIn::Known(n);
    }
    if body.is_end_stream() {
        return BytesIn::None;
    }
    BytesIn::Counted(counter.get_or_insert_with(Default::default).clone())
}

/// The limit the access log names for `verdict` (the one that refused,
/// else the first over its quota in shadow or soft mode) with its key's
/// [`key_hash`](crate::limit::key_hash); `None` when the log is off (the
/// key is not worth deriving then) or no limit was over.
fn logged_limit(
    snapshot: &Snapshot,
    verdict: &Verdict<'_>,
    facts: &crate::limit::key::Facts<'_>,
) -> Option<Box<(Arc<LimitRuntime>, u64)>> {
    if snapshot.config.gateway.access_log == AccessLog::Off {
        return None;
    }
    let over = match verdict.refused() {
        Some(refused) => Some(refused),
        None => verdict
            .limits
            .iter()
            .find(|l| matches!(l.outcome, Outcome::SoftLimited | Outcome::ShadowLimited)),
    }?;
    let limit = &over.limit.config;
    let (_, shard) = crate::limit::key_spec(limit, limit.spec(), limit.shards, facts);
    let key = crate::limit::store_key(limit, facts, shard);
    Some(Box::new((over.limit.to_arc(), crate::limit::key_hash(&key))))
}

/// The worst outcome among a verdict's limits, for the access log.
fn verdict_outcome(v: &Verdict<'_>) -> &'static str {
    match v.decision {
        Decision::Refuse { .. } => return "limited",
        Decision::Bypass { .. } | Decision::Unavailable { .. } => return "bypassed",
        Decision::Admit => {}
    }
    if v.limits.is_empty() {
        return "-"; // every limit skipped this identity's tier
    }
    let mut out = "admitted";
    for lv in &v.limits {
        match lv.outcome {
            Outcome::SoftLimited => out = "soft_limited",
            Outcome::ShadowLimited if out == "admitted" => out = "shadow_limited",
            _ => {}
        }
    }
    out
}

fn respond(direct: &DirectResponse) -> Response<Body> {
    let mut resp = Response::new(Body::full(direct.body.clone()));
    *resp.status_mut() = direct.status;
    *resp.headers_mut() = direct.headers.clone();
    resp
}

/// The route of a request, once its target is in the one form it is
/// limited and forwarded in (one request, one meaning: routed as the
/// upstream will read it), with its index in the config.
fn route_of<'s>(snapshot: &'s Snapshot, req: &mut Request<Incoming>) -> Result<(usize, &'s Route), RequestError> {
    crate::route::normalize::target(req)?;
    let index = route_index_of(&snapshot.config.routes, req).ok_or(RequestError::NoRoute)?;
    let route = snapshot.config.routes.get(index).ok_or(RequestError::NoRoute)?;
    Ok((index, route))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hyper moves each request's future into place: what it holds across
    /// its waits is copied per request. With the waits inline (the store's,
    /// the upstream's) it was 2.2 KB; boxed, 632 bytes (debug and release builds).
    #[test]
    fn a_requests_future_stays_small() {
        fn size_of_future<F, Fut>(_: F) -> usize
        where
            F: FnOnce(Arc<Gateway>, Request<Incoming>, Arc<ConnInfo>, fn(Body) -> Body) -> Fut,
        {
            std::mem::size_of::<Fut>()
        }
        let size = size_of_future(Gateway::handle::<Body, fn(Body) -> Body>);
        assert!(size <= 768, "a request's future is {size} bytes");
    }
}
