//! The request path, top to bottom: match a route, decide its limits, then
//! answer directly or forward. Each step is a call into its own room.

use std::sync::Arc;

use http::{HeaderMap, Response};

use crate::events;
use crate::identity::Identity;
use crate::limit::stage::Outcome;
use crate::limit::{Costs, Decision, Verdict};
use crate::proxy::body::Body;
use crate::route::Route;
use crate::runtime::{facts, Runtime, Snapshot};
use crate::telemetry::metrics::{ReasonLabels, UpstreamErrorLabels};
use respond::{add_warnings, visible_statuses, RequestError, Statuses};

mod budget;
mod cost;
mod hpack;
mod logged;
mod priced_body;
mod queue;
mod request_id;
pub mod respond;
mod routed;
mod serve;
mod usage;

pub use request_id::request_id;

/// The HTTP request path over a [`Runtime`]: route, identity, decide,
/// then answer or forward.
pub struct Gateway {
    runtime: Arc<Runtime>,
    /// The lines of requests waiting for a token (`queue_ms`).
    queues: queue::Queues,
    /// The memory request bodies read whole to price them (a `json:`
    /// reserve) hold, in all and per client: bounded whatever the
    /// clients send ([`budget`]).
    priced_bodies: Arc<budget::Budget>,
}

impl Gateway {
    pub fn new(runtime: Arc<Runtime>) -> Gateway {
        Gateway {
            runtime,
            queues: queue::Queues::default(),
            priced_bodies: budget::Budget::new(),
        }
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Shadow- and soft-limited decisions to the event pipeline, at most one
    /// per key per interval. Queued without waiting: never slows a request.
    fn send_events(&self, route: &Route, identity: &Identity, headers: &HeaderMap, verdict: &Verdict) {
        let kind = |o: Outcome| match o {
            Outcome::ShadowLimited => Some(events::Kind::Shadow),
            Outcome::SoftLimited => Some(events::Kind::Soft),
            Outcome::Admitted | Outcome::Limited => None,
        };
        if !verdict.limits.iter().any(|lv| kind(lv.outcome).is_some()) {
            return;
        }
        let emitter = self.runtime.events();
        let Some(emitter) = emitter.as_deref() else {
            return;
        };
        let facts = facts(route, identity, headers);
        let now_ms = self.runtime.limiter.now_ms();
        for lv in &verdict.limits {
            let Some(kind) = kind(lv.outcome) else {
                continue;
            };
            let limit = lv.limit;
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
    fn refusal(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        verdict: &Verdict,
        costs: Costs<'_>,
    ) -> Option<Response<Body>> {
        if let (Decision::Bypass { .. } | Decision::Unavailable { .. }, Some(e)) =
            (verdict.decision, &verdict.store_error)
        {
            log_store_failure(&route.name, e);
        }
        match verdict.decision {
            Decision::Admit => None,
            Decision::Bypass { reason } => {
                self.runtime
                    .metrics
                    .bypassed
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
                None
            }
            Decision::Refuse { at } => {
                let refused = verdict.limits.get(at)?;
                let limit = refused.limit;
                let mut statuses = Statuses::new();
                let focus = visible_statuses(verdict, Some(at), &mut statuses);
                let mut resp = respond::too_many_requests(
                    &limit.config.name,
                    refused.retry_after_ms,
                    snapshot.config.gateway.rate_limit_headers,
                    &statuses,
                    focus,
                );
                add_warnings(resp.headers_mut(), verdict);
                // Refused for want of room for this request's own reserve
                // (its max_tokens, say): the problem says so, for the
                // client that would otherwise retry the same request.
                let reserve = costs.iter().find(|(l, _)| limit.is(l)).map_or(1, |(_, n)| *n);
                if reserve > 1 && reserve > refused.remaining {
                    respond::reserve_does_not_fit(&mut resp, &limit.config.name, reserve, refused.remaining);
                }
                Some(resp)
            }
            Decision::Unavailable { retry_after_ms } => {
                Some(respond::store_unavailable(retry_after_ms.div_ceil(1_000).max(1)))
            }
        }
    }

    fn record_upstream_error(&self, e: &RequestError) {
        let RequestError::Forward(f) = e else { return };
        let Some((upstream, kind)) = f.upstream_fault() else {
            return;
        };
        self.runtime
            .metrics
            .upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                upstream: upstream.to_string(),
                kind,
            })
            .inc();
    }
}

/// A store failure the route's `on_store_failure` decided, in the log: an
/// open circuit is logged once, by the guard, not per request; other
/// failures at most once per 10 s per reason, with how many were held back.
fn log_store_failure(route: &str, e: &crate::store::StoreError) {
    use crate::store::StoreError;
    use crate::telemetry::log_limit::{STORE_ERROR, STORE_TIMEOUT};
    let gate = match e {
        StoreError::CircuitOpen { .. } => return,
        StoreError::Timeout(_) => &STORE_TIMEOUT,
        StoreError::Unavailable(_) | StoreError::NotConnected(_) | StoreError::Failed(_) => &STORE_ERROR,
    };
    if let Some(held_back) = gate.check(crate::clock::coarse_now_ms()) {
        tracing::warn!(route, error = %e, held_back, "quota store failed");
    }
}
