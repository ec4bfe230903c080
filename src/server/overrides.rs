//! The admin API's overrides: `GET /overrides`, and with the admin token
//! `PUT` and `DELETE /overrides/<limit>/<tier:value>`. A change goes to
//! the store, which every instance polls (see [`crate::limit::overrides`]);
//! this instance applies it before it answers.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::admin_response::{json, text};
use crate::limit::overrides::{valid_descriptor, valid_who, Override};
use crate::proxy::body::Body;
use crate::runtime::Runtime;

/// The most an override's body may be.
const MAX_BODY: usize = 4_096;

/// `/overrides` and below. The caller checked the token where one is set.
pub async fn serve(req: Request<Incoming>, runtime: &Runtime) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if path == "/overrides" || path == "/overrides/" {
        if method != Method::GET && method != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "use GET /overrides, or PUT and DELETE /overrides/<limit>/<tier:value>\n".into(),
            );
        }
        return json(StatusCode::OK, &list(runtime));
    }
    if method != Method::PUT && method != Method::DELETE {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use PUT or DELETE /overrides/<limit>/<tier:value>\n".into(),
        );
    }
    let config = runtime.config();
    if config.listeners.admin_token.is_none() {
        return text(
            StatusCode::FORBIDDEN,
            "text/plain",
            "changing overrides needs the admin token: set [admin] token_file\n".into(),
        );
    }
    let rest = path.trim_start_matches("/overrides/");
    let Some((limit, who)) = rest.split_once('/') else {
        return bad("name the limit and the caller: /overrides/<limit>/<tier:value>");
    };
    let (Some(limit), Some(who)) = (
        crate::server::query::path_decode(limit),
        crate::server::query::path_decode(who),
    ) else {
        return bad("the path must be UTF-8 once percent-decoded");
    };
    // A limit of gateway.toml, or `rls:<domain>` of the [rls] YAML.
    let algorithm = match limit.strip_prefix("rls:") {
        Some(domain)
            if config
                .rls
                .as_ref()
                .is_some_and(|r| r.rules.domains.contains_key(domain)) =>
        {
            if let Err(e) = valid_descriptor(&who) {
                return bad(&e.to_string());
            }
            // The rule's algorithm decides at each call; a burst is for
            // gateway.toml's token buckets.
            crate::quota::Algorithm::FixedWindow
        }
        _ => {
            let Some(l) = config.limits.iter().find(|l| l.name == limit) else {
                return text(
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    format!("no limit {limit:?} in the config in force (an Envoy domain is rls:<domain>)\n"),
                );
            };
            if let Err(e) = valid_who(&who) {
                return bad(&e.to_string());
            }
            l.algorithm
        }
    };
    let to = if method == Method::PUT {
        let body = match tokio::time::timeout(
            Duration::from_secs(10),
            http_body_util::Limited::new(req.into_body(), MAX_BODY).collect(),
        )
        .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => return bad(&format!("the body must be at most {MAX_BODY} bytes of JSON")),
            Err(_) => return bad("the body did not come within 10 s"),
        };
        let now = crate::clock::unix_ms();
        match Override::from_request(&body, algorithm, now) {
            Ok(o) => Some(o),
            Err(e) => return bad(&e.to_string()),
        }
    } else {
        None
    };
    let limits = overridable(&config);
    match runtime.overrides.change(&limits, &limit, &who, to).await {
        Ok(None) => bad(&crate::limit::overrides::OverrideError::Full.to_string()),
        Ok(Some(version)) => {
            let mut body = match &to {
                Some(o) => o.json(&limit, &who),
                None => serde_json::json!({"limit": limit, "who": who, "deleted": true}),
            };
            body["version"] = version.into();
            body["store"] = where_kept(runtime).into();
            if runtime.limiter.report().store_name() == "memory" {
                body["note"] =
                    "the memory store keeps overrides in this instance's memory: not shared, and lost at restart"
                        .into();
            }
            json(StatusCode::OK, &body)
        }
        Err(e) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("the store did not take the change: {e}\n"),
        ),
    }
}

fn bad(why: &str) -> Response<Body> {
    text(StatusCode::BAD_REQUEST, "text/plain", format!("{why}\n"))
}

/// `redis` (shared by the fleet, kept across restarts) or `memory`.
fn where_kept(runtime: &Runtime) -> &'static str {
    runtime.limiter.report().store_name()
}

/// Every override in force, and how many per limit.
pub fn list(runtime: &Runtime) -> serde_json::Value {
    let all = runtime.limiter.report().overrides();
    let mut per_limit = serde_json::Map::new();
    for (limit, _, _) in &all {
        let n = per_limit.get(limit).and_then(serde_json::Value::as_u64).unwrap_or(0);
        per_limit.insert(limit.clone(), (n + 1).into());
    }
    serde_json::json!({
        "store": where_kept(runtime),
        "shared": runtime.limiter.report().store_name() != "memory",
        "count": per_limit,
        "overrides": all.iter().map(|(l, w, o)| o.json(l, w)).collect::<Vec<_>>(),
    })
}

/// Every name an override may be under: the limits of gateway.toml, and
/// `rls:<domain>` for each domain of the `[rls]` YAML.
pub fn overridable(config: &crate::config::Config) -> Vec<String> {
    let mut names: Vec<String> = config.limits.iter().map(|l| l.name.clone()).collect();
    if let Some(rls) = &config.rls {
        let mut domains: Vec<String> = rls.rules.domains.keys().map(|d| format!("rls:{d}")).collect();
        domains.sort();
        names.extend(domains);
    }
    names
}
