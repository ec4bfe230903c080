//! The request path, top to bottom: match a route, decide its limits, then
//! answer directly or forward. Each step is a call into its own room.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;

use crate::access_log;
use crate::body::Body;
use crate::config::{AccessLog, Config, Limit};
use crate::connection::ConnInfo;
use crate::events::{self, Emitter};
use crate::identity::{self, Identity, Tier};
use crate::limit::key::Facts;
use crate::limit::stage::Outcome;
use crate::limit::{LimitRuntime, Limiter, Settings, Verdict};
use crate::metrics::{Metrics, ReasonLabels, RouteMetrics, UpstreamErrorLabels};
use crate::problem::{self, RequestError, Source};
use crate::proxy::{self, X_REQUEST_ID};
use crate::route::{Action, DirectResponse, Route, RouteTable, StoreFailure};
use crate::store::{QuotaStore, StoreError};
use smallvec::SmallVec;
use verdict_headers::{add_limit_headers, add_warnings, visible_statuses};

mod verdict_headers;

/// One config, compiled for serving: the config and its limits ready for
/// decisions. Swapped whole on reload; a request keeps the one it started
/// with.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub limits: Vec<Arc<LimitRuntime>>,
    /// Request metrics per route, in route order.
    routes: Vec<RouteMetrics>,
    /// Request metrics of requests no route matched.
    unrouted: RouteMetrics,
}

impl Snapshot {
    pub fn new(config: Config, metrics: &Metrics) -> Snapshot {
        let limits = config
            .limits
            .iter()
            .map(|l| Arc::new(LimitRuntime::new(l.clone(), &config.gateway.instance_id, metrics)))
            .collect();
        let routes = config.routes.iter().map(|r| RouteMetrics::new(&r.name)).collect();
        Snapshot {
            routes,
            unrouted: RouteMetrics::new("none"),
            config: Arc::new(config),
            limits,
        }
    }
}

pub struct Gateway {
    snapshot: ArcSwap<Snapshot>,
    pub metrics: Arc<Metrics>,
    pub limiter: Arc<Limiter>,
    /// `[events]`, when configured: swapped when a reload changes it.
    events: ArcSwapOption<Emitter>,
    draining: AtomicBool,
    /// `[region] share` at start (the whole without `[region]`): `[region]`
    /// is bound at start (its link, its coordinator, the primary's grants),
    /// so a reload keeps every limit on this slice.
    share: crate::quota::Share,
}

impl Gateway {
    pub fn new(config: Config, metrics: Arc<Metrics>, store: Arc<dyn QuotaStore>) -> Self {
        let limiter = Limiter::new(store, Settings::from_config(&config), crate::clock::monotonic_clock());
        let events = start_events(&config, &metrics, None);
        let share = config.region.as_ref().map_or(crate::quota::Share::WHOLE, |r| r.share);
        let snapshot = Snapshot::new(config, &metrics);
        Gateway {
            share,
            snapshot: ArcSwap::from_pointee(snapshot),
            metrics,
            limiter,
            events: ArcSwapOption::new(events),
            draining: AtomicBool::new(false),
        }
    }

    /// This region's slice of every quota (`[region] share` at start; the
    /// whole without `[region]`): the Envoy rate limit services apply it
    /// too.
    pub fn share(&self) -> crate::quota::Share {
        self.share
    }

    /// The config in force now.
    pub fn config(&self) -> Arc<Config> {
        self.snapshot.load().config.clone()
    }

    /// Swaps in a new config. Requests in flight finish on the one they
    /// started with; leases survive for limits whose quota did not change,
    /// and go back to the store for limits changed or removed.
    pub async fn apply(&self, mut config: Config) {
        for l in &mut config.limits {
            if l.share != self.share {
                *l = Arc::new(Limit {
                    share: self.share,
                    ..(**l).clone()
                });
            }
        }
        let snapshot = Snapshot::new(config, &self.metrics);
        let old = self.snapshot.load_full();
        // A limit changed when it is gone or its quota (any plan's) differs.
        let quota = |l: &crate::config::Limit| (l.spec(), l.plans.clone(), l.share);
        let changed: std::collections::HashSet<String> = old
            .config
            .limits
            .iter()
            .filter(|o| {
                snapshot
                    .config
                    .limits
                    .iter()
                    .find(|n| n.name == o.name)
                    .is_none_or(|n| quota(n) != quota(o))
            })
            .map(|o| o.name.clone())
            .collect();
        // The store deadline is bound at start (the guard's, a restart-only
        // setting): a request's wait budget keeps it too.
        let settings = Settings {
            deadline_ms: self.limiter.settings().deadline_ms,
            ..Settings::from_config(&snapshot.config)
        };
        self.limiter.set_settings(settings);
        let events = start_events(&snapshot.config, &self.metrics, self.events.load_full());
        self.events.store(events);
        self.snapshot.store(Arc::new(snapshot));
        let released = self.limiter.release_limits(&changed).await;
        if released > 0 {
            tracing::info!(
                released_tokens = released,
                "leases of changed or removed limits went back to the store"
            );
        }
    }

    /// Marks the gateway as shutting down (readiness turns false).
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// One request, start to finish, and its access-log line. Never fails:
    /// every error becomes a response.
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        let snapshot = self.snapshot.load_full();
        let started = std::time::Instant::now();
        crate::clock::publish(started);
        let mut route = None;
        let log = match snapshot.config.gateway.access_log {
            AccessLog::Off => None,
            _ => access_log::format(),
        };
        let resp = match log {
            None => self.serve(&snapshot, req, conn, None, &mut route).await,
            Some(format) => {
                let method = req.method().clone();
                let uri = req.uri().clone();
                let mut record = Record::default();
                let resp = self.serve(&snapshot, req, conn, Some(&mut record), &mut route).await;
                let matched = route.and_then(|i| snapshot.config.routes.get(i));
                let line = access_log::Line {
                    request_id: resp
                        .headers()
                        .get(&X_REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or(""),
                    route: matched.map_or("-", |r| r.name.as_str()),
                    method: method.as_str(),
                    path: uri.path(),
                    status: resp.status().as_u16(),
                    identity: record.identity.unwrap_or("-"),
                    limit: if record.outcome.is_empty() { "-" } else { record.outcome },
                    upstream: matched
                        .and_then(|r| match &r.action {
                            Action::Forward(u) => Some(u.name.as_str()),
                            Action::Respond(_) => None,
                        })
                        .unwrap_or("-"),
                    micros: started.elapsed().as_micros() as u64,
                };
                match format {
                    access_log::Format::Json => access_log::record_json(&line),
                    access_log::Format::Text => log_text(&line),
                }
                resp
            }
        };
        route
            .and_then(|i| snapshot.routes.get(i))
            .unwrap_or(&snapshot.unrouted)
            .record(&self.metrics, resp.status().as_u16(), started.elapsed());
        resp
    }

    /// Serves one request; `route_index` learns which route matched.
    async fn serve(
        &self,
        snapshot: &Snapshot,
        req: Request<Incoming>,
        conn: &ConnInfo,
        mut record: Option<&mut Record>,
        route_index: &mut Option<usize>,
    ) -> Response<Body> {
        let request_id = request_id(req.headers());
        *route_index = route_index_of(&snapshot.config.routes, &req);
        let route = route_index.and_then(|i| snapshot.config.routes.get(i)).cloned();

        let identity = match &route {
            Some(_) => {
                let ja4 = conn
                    .tls
                    .as_ref()
                    .and_then(|t| t.ja4.as_ref())
                    .and_then(|v| v.to_str().ok());
                let seen = identity::Connection {
                    peer: conn.peer.ip(),
                    ja4,
                };
                let now_secs = identity_clock(req.headers());
                match snapshot.config.identity.resolve(req.headers(), seen, now_secs) {
                    Ok(id) => {
                        if let Some(r) = record.as_deref_mut() {
                            r.identity = Some(id.tier.name());
                        }
                        Some(id)
                    }
                    Err(rejection) => {
                        let mut resp = problem::unauthorized(&rejection.to_string());
                        resp.headers_mut().insert(X_REQUEST_ID.clone(), request_id);
                        return resp;
                    }
                }
            }
            None => None,
        };
        let verdict = match (&route, &identity) {
            (Some(route), Some(identity)) if !route.limits.is_empty() => {
                let verdict = self.decide(snapshot, route, &req, identity).await;
                if let Some(r) = record {
                    r.outcome = verdict_outcome(&verdict);
                }
                self.send_events(snapshot, route, identity, req.headers(), &verdict);
                if let Some(mut refusal) = self.refusal(snapshot, route, &verdict) {
                    refusal.headers_mut().insert(X_REQUEST_ID.clone(), request_id);
                    return refusal;
                }
                Some(verdict)
            }
            _ => None,
        };

        let result = match &route {
            None => Err(RequestError::NoRoute),
            Some(route) => match &route.action {
                Action::Respond(direct) => Ok(respond(direct)),
                Action::Forward(upstream) => {
                    let identity = identity.as_ref().map(|id| id.value.as_str());
                    // Boxed: inline, its ~1.6 KB would be part of every
                    // request's future (a 429's too), which hyper moves
                    // into place per request.
                    Box::pin(proxy::forward(req, conn, upstream, &request_id, identity)).await
                }
            },
        };
        let mut resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                if e.source() == Source::Upstream {
                    let route_name = route.as_ref().map_or("", |r| r.name.as_str());
                    tracing::warn!(request_id = ?request_id, route = route_name, error = %e, "upstream error");
                    self.record_upstream_error(&e);
                } else {
                    tracing::debug!(request_id = ?request_id, error = %e, "client error");
                }
                e.to_response()
            }
        };
        if let Some(verdict) = &verdict {
            add_limit_headers(resp.headers_mut(), snapshot, verdict);
        }
        resp.headers_mut().insert(X_REQUEST_ID.clone(), request_id);
        resp
    }

    /// The limiter's verdict on a request: every route limit that applies
    /// to the identity's tier, in order.
    async fn decide(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        req: &Request<Incoming>,
        identity: &Identity,
    ) -> Verdict {
        let facts = facts(route, identity, req.headers());
        let which = applying_limits(&snapshot.config.limits, route, identity.tier);
        // Tokens at hand decide without building a future that waits.
        let mut verdict = Verdict::default();
        if self.limiter.try_check(&snapshot.limits, &which, &facts, &mut verdict) {
            return verdict;
        }
        // Boxed: the waiting path is rare, and inline it would make every
        // request's future (moved into hyper's box per request) larger.
        let fail_open = route.on_store_failure == StoreFailure::Allow;
        Box::pin(self.limiter.check(&snapshot.limits, &which, &facts, fail_open)).await
    }

    /// Shadow- and soft-limited decisions to the event pipeline, at most one
    /// per key per interval. Queued without waiting: never slows a request.
    fn send_events(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        identity: &Identity,
        headers: &HeaderMap,
        verdict: &Verdict,
    ) {
        let kind = |o: Outcome| match o {
            Outcome::ShadowLimited => Some(events::Kind::Shadow),
            Outcome::SoftLimited => Some(events::Kind::Soft),
            Outcome::Admitted | Outcome::Limited => None,
        };
        if !verdict.limits.iter().any(|lv| kind(lv.outcome).is_some()) {
            return;
        }
        let emitter = self.events.load();
        let Some(emitter) = emitter.as_deref() else {
            return;
        };
        let facts = facts(route, identity, headers);
        let now_ms = self.limiter.now_ms();
        for lv in &verdict.limits {
            let (Some(kind), Some(limit)) = (kind(lv.outcome), snapshot.limits.get(lv.limit)) else {
                continue;
            };
            emitter.offer(&limit.config, &facts, now_ms, |instance| events::Event {
                kind,
                limit: limit.config.name.clone(),
                route: route.name.clone(),
                tier: identity.tier.name(),
                identity: identity.value.clone(),
                over_percent: lv.over_percent,
                instance: instance.to_string(),
            });
        }
    }

    /// The response for a request the verdict does not let through, if any.
    fn refusal(&self, snapshot: &Snapshot, route: &Route, verdict: &Verdict) -> Option<Response<Body>> {
        // A limit that refused decides, whatever another limit's store did.
        if let Some(i) = verdict.refused {
            let refused = verdict.limits.get(i)?;
            let limit = snapshot.limits.get(refused.limit)?;
            let (statuses, focus) = visible_statuses(snapshot, verdict, Some(i));
            let mut resp = problem::too_many_requests(
                &limit.config.name,
                refused.retry_after_ms,
                snapshot.config.gateway.rate_limit_headers,
                &statuses,
                focus,
            );
            add_warnings(resp.headers_mut(), snapshot, verdict);
            return Some(resp);
        }
        if let Some(e) = &verdict.store_error {
            // An open circuit is logged once, by the guard, not per request;
            // other failures at most once per 10 s per reason.
            use crate::log_limit::{STORE_ERROR, STORE_TIMEOUT};
            let (reason, retry_after_ms, gate) = match e {
                StoreError::CircuitOpen { retry_after_ms } => ("store_circuit_open", *retry_after_ms, None),
                StoreError::Timeout(_) => ("store_timeout", 0, Some(&STORE_TIMEOUT)),
                StoreError::Unavailable(_) | StoreError::Failed(_) => ("store_error", 0, Some(&STORE_ERROR)),
            };
            if let Some(held_back) = gate.and_then(|g| g.check(crate::clock::coarse_now_ms())) {
                tracing::warn!(route = %route.name, error = %e, held_back, "quota store failed");
            }
            return match route.on_store_failure {
                StoreFailure::Allow => {
                    self.metrics.bypassed.get_or_create(&ReasonLabels { reason }).inc();
                    None
                }
                StoreFailure::Deny => {
                    // The request is not served: tokens other limits took go back.
                    self.limiter.undo(verdict);
                    Some(problem::store_unavailable(retry_after_ms.div_ceil(1_000).max(1)))
                }
            };
        }
        None
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

/// The emitter for `config`'s `[events]`: `running` when it was started
/// for the same settings (it keeps its interval table), else a new one,
/// else none.
fn start_events(config: &Config, metrics: &Metrics, running: Option<Arc<Emitter>>) -> Option<Arc<Emitter>> {
    let settings = config.events.as_ref()?;
    let instance = &config.gateway.instance_id;
    match running {
        Some(e) if e.runs(settings, instance) => Some(e),
        _ => Emitter::start(settings, instance, metrics).map(Arc::new),
    }
}

/// The route a request matches, by host (the URI's authority, else `Host`),
/// method and path: its index in `routes`. `leasegate explain` asks this too.
pub fn route_index_of<B>(routes: &RouteTable, req: &Request<B>) -> Option<usize> {
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers().get(header::HOST).and_then(|h| h.to_str().ok()));
    routes.position(host, req.method(), req.uri().path())
}

/// The `now_secs` the identity waterfall gets: the wall clock matters only
/// for cached JWTs, so a request without `Authorization` does not read it.
pub fn identity_clock(headers: &HeaderMap) -> u64 {
    if headers.contains_key(header::AUTHORIZATION) {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    } else {
        0
    }
}

/// What a request offers its limits' keys.
pub fn facts<'a>(route: &'a Route, identity: &'a Identity, headers: &'a HeaderMap) -> Facts<'a> {
    Facts {
        identity: &identity.value,
        tenant: identity.tenant.as_deref(),
        plan: identity.plan.as_deref(),
        route: &route.name,
        ip: identity.client_ip,
        headers,
    }
}

/// The route's limits that apply to an identity of `tier`, in the route's
/// order: indices into `limits` (the config's, which a snapshot's limit
/// runtimes follow one for one).
pub fn applying_limits(limits: &[Arc<Limit>], route: &Route, tier: Tier) -> SmallVec<[usize; 4]> {
    route
        .limits
        .iter()
        .copied()
        .filter(|&i| limits.get(i).is_some_and(|l| l.applies_to(tier)))
        .collect()
}

/// What the access log says about a request, filled in as it is served.
#[derive(Debug, Default)]
struct Record {
    identity: Option<&'static str>,
    outcome: &'static str,
}

/// The access-log line in the text format, through `tracing`'s fmt layer.
fn log_text(line: &access_log::Line<'_>) {
    tracing::info!(
        target: "access",
        request_id = line.request_id,
        route = line.route,
        method = line.method,
        path = %line.path,
        status = line.status,
        identity = line.identity,
        limit = line.limit,
        upstream = line.upstream,
        // Whole microseconds: 0.263, not 0.26327300000000003.
        ms = line.micros as f64 / 1_000.0,
    );
}

/// The worst outcome among a verdict's limits, for the access log.
fn verdict_outcome(v: &Verdict) -> &'static str {
    if v.refused.is_some() {
        return "limited";
    }
    if v.store_error.is_some() {
        return "bypassed";
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

/// Keeps a client's `x-request-id` when it is sane, else makes a new one.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
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
        let mut h = HeaderMap::new();
        let made = request_id(&h);
        assert_eq!(made.len(), 32);
        assert_ne!(made, request_id(&h));
        h.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h), "abc-123");
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        assert_eq!(request_id(&h).len(), 32);
    }
}
