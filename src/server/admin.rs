//! The admin listener: `/` (the status page, see [`super::status`]),
//! `/healthz`, `/readyz`, `/metrics`, `/config` and `/limits/state`.
//!
//! Everything here reads; nothing changes the runtime's state. It runs on
//! the control runtime, never on a worker. With `[admin] token_file`,
//! every path but `/healthz` and `/readyz` needs the bearer token (see
//! [`crate::config::admin`]); without it, the config check keeps the
//! listener on a loopback address.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::admin_response::{json, text};
use crate::proxy::body::Body;
use crate::runtime::Runtime;

/// Most admin connections at once (scrapers, health checks, operators).
const MAX_CONNECTIONS: usize = 256;
/// Connections beyond [`MAX_CONNECTIONS`] kept for health checks: while
/// the others are all taken (slow scrapes, idle clients, a flood), a
/// probe still gets `/healthz` and `/readyz` on one of these. Each serves
/// one request, whose head must come within [`PROBE_HEAD_TIMEOUT`], and
/// only those two paths (any other is `503`).
const PROBE_CONNECTIONS: usize = 32;
const PROBE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn serve(listener: TcpListener, runtime: Arc<Runtime>) {
    let general = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let total = MAX_CONNECTIONS + PROBE_CONNECTIONS;
    super::accept::serve_each(listener, "admin", total, move |stream, _peer| {
        let runtime = runtime.clone();
        let place = general.clone().try_acquire_owned();
        async move {
            let Ok(_place) = place else {
                return serve_probe(stream, runtime).await;
            };
            let service = service_fn(move |req: Request<Incoming>| {
                let runtime = runtime.clone();
                async move {
                    if req.uri().path().starts_with("/overrides") {
                        if let Some(refused) = unauthorized(&req, &runtime) {
                            return Ok::<_, Infallible>(refused);
                        }
                        return Ok(super::overrides::serve(req, &runtime).await);
                    }
                    Ok(handle(&req, &runtime))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    })
    .await;
}

/// A connection on one of the [`PROBE_CONNECTIONS`]: one request, and
/// only a health check.
async fn serve_probe(stream: tokio::net::TcpStream, runtime: Arc<Runtime>) {
    let service = service_fn(move |req: Request<Incoming>| {
        let runtime = runtime.clone();
        async move {
            if matches!(req.uri().path(), "/healthz" | "/readyz") {
                return Ok::<_, Infallible>(handle(&req, &runtime));
            }
            Ok(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "every admin connection is taken: only /healthz and /readyz are served now\n".into(),
            ))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(PROBE_HEAD_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// The 401 for a request without the admin token, when one is set.
fn unauthorized(req: &Request<Incoming>, runtime: &Runtime) -> Option<Response<Body>> {
    let config = runtime.config();
    let token = config.listeners.admin_token.as_ref()?;
    let presented = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    if token.admits(presented) {
        return None;
    }
    let mut resp = text(
        StatusCode::UNAUTHORIZED,
        "text/plain",
        "this admin path needs Authorization: Bearer <the token of [admin] token_file>\n".into(),
    );
    resp.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"leasegate admin\""),
    );
    Some(resp)
}

/// `/readyz`: 200 `ready` with a line on the store, which says `ok` only
/// for a connection that has answered. A store outage after start does not
/// fail readiness: every instance shares the store, so it would take the
/// whole fleet out of its load balancer, fail-open routes included. Before
/// the store has ever answered, `[store] ready_without_store = false` makes
/// it 503.
fn readyz(runtime: &Runtime) -> Response<Body> {
    let link = &runtime.store_link;
    let open = runtime.metrics.circuit_open.get() == 1;
    let store = if !link.is_up() {
        format!(
            "{}{}: fail-open routes use their fallback buckets, fail-closed routes answer 503",
            if open { "circuit open, " } else { "" },
            link.describe()
        )
    } else if open {
        "circuit open: fail-open routes use their fallback buckets, fail-closed routes answer 503".to_string()
    } else {
        "ok".to_string()
    };
    let ready = link.has_answered() || runtime.config().store.ready_without_store;
    let (status, word) = if ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    };
    text(
        status,
        "text/plain",
        format!("{word}\nstore {}: {store}\n", runtime.limiter.report().store_name()),
    )
}

fn handle(req: &Request<Incoming>, runtime: &Runtime) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "use GET\n".into());
    }
    let path = req.uri().path();
    // Health checks stay open (load balancers and orchestrators probe
    // them); everything else shows the metrics, the config or the keys.
    if !matches!(path, "/healthz" | "/readyz") {
        if let Some(refused) = unauthorized(req, runtime) {
            return refused;
        }
    }
    match path {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if runtime.is_draining() => text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".into()),
        "/readyz" => readyz(runtime),
        "/metrics" => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            runtime.metrics.encode(),
        ),
        "/config" => {
            let mut body = config_json(&runtime.config(), runtime.limiter.report().fleet());
            body["overrides"] = super::overrides::list(runtime);
            body["last_reload_failure"] = match runtime.reload_failure() {
                Some(f) => serde_json::json!({
                    "at": humantime::format_rfc3339_seconds(f.at).to_string(),
                    "why": f.why,
                }),
                None => serde_json::Value::Null,
            };
            json(StatusCode::OK, &body)
        }
        "/limits/state" => limits_state(req.uri().query(), runtime),
        "/" => {
            let page = super::status::page(runtime, req.uri().query());
            let mut resp = text(StatusCode::OK, "text/html; charset=utf-8", page);
            resp.headers_mut()
                .insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            resp
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try / /healthz /readyz /metrics /config /limits/state?key= /overrides\n".into(),
        ),
    }
}

/// Most keys one `/limits/state` request may ask about: each is a probe of
/// every shard's key index (no walk of the leases).
const MAX_STATE_KEYS: usize = 64;

/// `GET /limits/state?key=<store key>[&key=...]`: this instance's lease of
/// each key (`leasegate explain --admin` reads it).
fn limits_state(query: Option<&str>, runtime: &Runtime) -> Response<Body> {
    let mut keys = Vec::new();
    let mut whos = Vec::new();
    for (name, value) in super::query::query_pairs(query.unwrap_or("")) {
        if name == "who" {
            // The caller: the override in force for it is shown per key.
            whos.extend(value.filter(|w| !w.is_empty()).into_iter().take(4 - whos.len().min(4)));
            continue;
        }
        if name != "key" {
            continue;
        }
        match value {
            Some(k) if !k.is_empty() => keys.push(k),
            _ => return text(
                StatusCode::BAD_REQUEST,
                "text/plain",
                "a key must be a URL-encoded UTF-8 store key, e.g. ?key=rl%3A%7Bper_client%3Aip%3A198.51.100.7%7D\n"
                    .into(),
            ),
        }
    }
    if keys.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "name at least one key: /limits/state?key=<URL-encoded store key>[&key=...] (leasegate explain prints them)\n".into(),
        );
    }
    if keys.len() > MAX_STATE_KEYS {
        return text(
            StatusCode::BAD_REQUEST,
            "text/plain",
            format!("at most {MAX_STATE_KEYS} keys per request, got {}\n", keys.len()),
        );
    }
    let keys: Vec<&str> = keys.iter().map(|k| k.as_ref()).collect();
    let mut states = runtime.limiter.report().key_states(&keys);
    if !whos.is_empty() {
        let overrides = runtime.limiter.report().overrides();
        for st in &mut states {
            // `rl:{<limit>:...}`: limit names hold no colon.
            let limit = st
                .key
                .strip_prefix("rl:{")
                .and_then(|k| k.split(':').next())
                .unwrap_or("");
            st.overridden = whos.iter().find_map(|who| {
                overrides
                    .iter()
                    .find(|(l, w, _)| l == limit && w == who)
                    .map(|(_, w, o)| crate::limit::report::ShownOverride {
                        who: w.clone(),
                        rate: o.rate.to_string(),
                        burst: o.burst,
                        expires: o.json("", "")["expires"].as_str().map(str::to_string),
                    })
            });
        }
    }
    json(StatusCode::OK, &serde_json::json!({ "keys": states }))
}

/// `/config`: what is loaded, and the effective values of every route and
/// limit (defaults filled in, plans applied), so a reload can be confirmed.
fn config_json(config: &crate::config::Config, fleet: crate::limit::fleet::FleetView) -> serde_json::Value {
    use crate::limit::policy::KeyPart;
    use crate::route::Action;
    let limit_name = |i: &usize| config.limits.get(*i).map(|l| l.name.as_str());
    let routes: Vec<_> = config
        .routes
        .iter()
        .map(|r| {
            let (upstream, respond) = match &r.action {
                Action::Forward(u) => (Some(u.name.as_str()), None),
                Action::Respond(d) => (None, Some(d.status.as_u16())),
                Action::Usage(_) => (None, Some(200)),
            };
            serde_json::json!({
                "name": r.name,
                "path_prefix": r.path_prefix,
                "host": r.host,
                "methods": r.methods.as_ref().map(|m| m.iter().map(|m| m.as_str()).collect::<Vec<_>>()),
                "upstream": upstream,
                "respond": respond,
                "limits": r.limits.iter().filter_map(limit_name).collect::<Vec<_>>(),
                "on_store_failure": r.on_store_failure.as_str(),
            })
        })
        .collect();
    let limits: Vec<_> = config
        .limits
        .iter()
        .map(|l| {
            let by: Vec<String> = l
                .by
                .iter()
                .map(|p| match p {
                    KeyPart::Identity => "identity".into(),
                    KeyPart::Tenant => "tenant".into(),
                    KeyPart::Route => "route".into(),
                    KeyPart::Ip => "ip".into(),
                    KeyPart::Subnet { v4: 24, v6: 64 } => "subnet".into(),
                    KeyPart::Subnet { v4: 24, v6 } => format!("subnet/{v6}"),
                    KeyPart::Subnet { v4, v6 } => format!("subnet/{v4}/{v6}"),
                    KeyPart::Header(h) => format!("header:{h}"),
                })
                .collect();
            let concurrency = l.algorithm == crate::quota::Algorithm::Concurrency;
            let mut limit = serde_json::json!({
                "name": l.name,
                "mode": l.mode.as_str(),
                "canary_percent": (l.mode == crate::limit::policy::Mode::Canary).then_some(l.canary_percent),
                "algorithm": l.algorithm.as_str(),
                "rate": l.rate.to_string(),
                "burst": l.burst,
                "by": by,
                "fallback_rate": l.fallback_rate.map(|r| r.to_string()),
                "shards": l.shards,
                "shard_by": l.shard_by.as_str(),
                "plans": l.plans.iter().map(|(p, r)| (p.clone(), serde_json::Value::from(r.to_string()))).collect::<serde_json::Map<_, _>>(),
                "tiers": l.tiers.as_ref().map(|t| t.iter().map(|t| t.name()).collect::<Vec<_>>()),
                "enforce_after": l.enforce_after,
                "max": concurrency.then_some(l.burst),
                "queue_ms": l.queue_ms,
                "queue_max": l.queue_max,
                "rate_from": l.rate_from.as_ref().map(|r| format!("claim:{}", r.claim)),
                "max_rate": l.rate_from.as_ref().map(|r| r.max.to_string()),
                "cost": l.cost.as_ref().map(|c| serde_json::json!({
                    "api": c.api.map(|a| a.as_str()),
                    "reserve": c.reserve.describe(),
                    "reserve_default": c.reserve_default,
                    "settle": c.settle.as_ref().map(|s| s.describe()),
                    "unsettled": c.unsettled.describe(),
                    "errors": c.errors.as_str(),
                })),
            });
            // A concurrency limit has no rate: its `max` is what it allows.
            if let (true, Some(fields)) = (concurrency, limit.as_object_mut()) {
                fields.remove("rate");
                fields.remove("burst");
            }
            limit
        })
        .collect();
    serde_json::json!({
        "sha256": config.source.sha256_hex(),
        "path": config.source.path.display().to_string(),
        "loaded_at": humantime::format_rfc3339_seconds(config.source.loaded_at).to_string(),
        "instance_id": config.gateway.instance_id,
        "routes": config.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        "limits": config.limits.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        "upstreams": config.upstreams.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
        "fleet": fleet,
        "rls": config.rls.as_ref().map(|r| serde_json::json!({ "domains": r.rules.domain_sha256 })),
        "effective": { "routes": routes, "limits": limits },
    })
}
