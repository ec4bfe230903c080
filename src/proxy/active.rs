//! Active health checks (`[[upstreams]] health = { path, ... }`): one
//! background task per upstream asks every target for `path` each
//! `interval_ms`, on a connection of its own, and takes a target out of
//! the rotation after `unhealthy` failed checks in a row (no answer within
//! `timeout_ms`, or a status outside 2xx), back after `healthy` passed
//! ones. It needs no client request.
//!
//! Combined with passive health: a target is picked only if both let it.
//! When every target fails its checks, the checks are ignored and requests
//! go to every target (Envoy's "panic routing"): the checks may be what is
//! wrong (a moved `/healthz`), and refusing every request would turn a
//! partial outage into a total one.
//!
//! The task holds its upstream weakly and stops once the upstream is
//! retired by a reload (its successor starts its own) or dropped.

use std::sync::{Arc, Weak};

use http::{header, HeaderValue, Request, Uri, Version};

use super::health::ActiveCheck;
use super::idle::Timed;
use super::pool::Slot;
use super::request_body::RequestBody;
use super::upstream::{Protocol, Upstream};
use crate::telemetry::metrics::{Metrics, UpstreamTargetLabels};

/// Starts `upstream`'s checker on the current tokio runtime, if it has
/// checks and a runtime is there.
pub fn start(upstream: &Arc<Upstream>, metrics: &Arc<Metrics>) {
    let Some(check) = upstream.active.clone() else {
        return;
    };
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(upstream);
    let metrics = metrics.clone();
    handle.spawn(run(weak, check, metrics));
}

async fn run(weak: Weak<Upstream>, check: ActiveCheck, metrics: Arc<Metrics>) {
    // Per target: failed and passed checks in a row.
    let mut streaks: Vec<(u32, u32)> = Vec::new();
    let mut tick = tokio::time::interval(check.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(upstream) = weak.upgrade() else { return };
        if upstream.is_retired() {
            return;
        }
        streaks.resize(upstream.targets.len(), (0, 0));
        let checks = (0..upstream.targets.len()).map(|i| {
            let upstream = upstream.clone();
            let check = check.clone();
            async move { probe(&upstream, i, &check).await }
        });
        let results = join_all(checks.collect()).await;
        if upstream.is_retired() {
            return;
        }
        for (i, passed) in results.into_iter().enumerate() {
            let Some(streak) = streaks.get_mut(i) else { continue };
            *streak = if passed {
                (0, streak.1.saturating_add(1))
            } else {
                (streak.0.saturating_add(1), 0)
            };
            let change = if passed && streak.1 >= check.healthy {
                upstream.set_active(i, true)
            } else if !passed && streak.0 >= check.unhealthy {
                upstream.set_active(i, false)
            } else {
                false
            };
            if change {
                announce(&upstream, i, passed, &metrics);
            }
        }
    }
}

/// Runs the futures at once; their results in order. Each one's own
/// task: a slow target does not hold up the others' checks.
async fn join_all(futures: Vec<impl std::future::Future<Output = bool> + Send + 'static>) -> Vec<bool> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap_or(false));
    }
    out
}

/// A target's place in the rotation changed by its checks: its gauge and
/// a log line.
fn announce(upstream: &Upstream, index: usize, up: bool, metrics: &Metrics) {
    let Some(target) = upstream.targets.get(index) else {
        return;
    };
    metrics
        .upstream_target_up
        .get_or_create(&UpstreamTargetLabels {
            upstream: upstream.name.clone(),
            target: target.as_str().to_string(),
        })
        .set(i64::from(upstream.target_up(index)));
    if up {
        tracing::info!(upstream = %upstream.name, target = %target.as_str(), "upstream target passed its health checks; back in the rotation");
    } else if upstream.all_actively_down() {
        tracing::warn!(upstream = %upstream.name, target = %target.as_str(), "upstream target failed its health checks; every target fails them, so requests go to all of them (panic routing)");
    } else {
        tracing::warn!(upstream = %upstream.name, target = %target.as_str(), "upstream target failed its health checks; out of the rotation");
    }
}

/// One check of target `index`: a `GET` of the path on a new connection,
/// answered 2xx within the timeout.
async fn probe(upstream: &Upstream, index: usize, check: &ActiveCheck) -> bool {
    let Some(target) = upstream.targets.get(index) else {
        return false;
    };
    let attempt = async {
        let slot = Slot::new(upstream, index);
        let mut sender = slot.connect(upstream, target).await.ok()?;
        let h2 = upstream.protocol == Protocol::H2;
        let uri = if h2 {
            let scheme = if upstream.tls.is_some() { "https" } else { "http" };
            format!("{scheme}://{}{}", target.authority, check.path)
                .parse::<Uri>()
                .ok()?
        } else {
            Uri::from(check.path.clone())
        };
        let mut req = Request::get(uri)
            .version(if h2 { Version::HTTP_2 } else { Version::HTTP_11 })
            .header(header::USER_AGENT, HeaderValue::from_static("leasegate-health-check"))
            .body(Timed::new(RequestBody::read(bytes::Bytes::new(), None), check.timeout))
            .ok()?;
        if !h2 {
            let host = target
                .host
                .clone()
                .or_else(|| HeaderValue::from_str(target.as_str()).ok())?;
            req.headers_mut().insert(header::HOST, host);
            req.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let resp = sender.try_send_request(req).await.ok()?;
        Some(resp.status().is_success())
    };
    matches!(tokio::time::timeout(check.timeout, attempt).await, Ok(Some(true)))
}
