//! `leasegate explain`: what the gateway would do with one request, and why.
//!
//! It runs the request path's own steps, not a copy of their rules: route
//! matching ([`runtime::route_index_of`]), the identity waterfall
//! ([`Resolver::resolve`], JWTs verified as the gateway verifies them, and
//! [`Resolver::passed_over`] for why higher tiers did not apply), the tier
//! filter ([`runtime::applying_limits`]), the key facts ([`runtime::facts`])
//! and the store keys ([`crate::limit::store_key`], shards included). Pure: no I/O, no
//! store; `now_secs` is the wall clock JWTs are checked against. The one
//! piece of I/O, asking a running gateway for the live state of those keys
//! (`--admin`), is the [`admin`] room's; its answer is attached with
//! [`Explanation::attach_live`].

pub mod admin;
pub mod identity;
mod render;

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};

use crate::config::Config;
use crate::identity as waterfall;
use crate::limit::policy::Mode;
use crate::limit::report::KeyState;
use crate::limit::stage;
use crate::quota::{Rate, Spec};
use crate::route::Action;
use crate::runtime;

/// Why a command line does not describe a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("bad --header {0:?}: want 'Name: value'")]
    HeaderShape(String),
    #[error("bad --header {0:?}: {1}")]
    Header(String, String),
    #[error("bad --ip {0:?}: want an IPv4 or IPv6 address such as 198.51.100.7")]
    Ip(String),
    #[error("bad METHOD {0:?}: want an HTTP method such as GET")]
    Method(String),
    #[error("bad PATH {0:?}: want a path starting with '/' (or an absolute URL)")]
    Path(String),
    #[error("PATH {0:?}: the gateway answers 400 to it: {1}")]
    Refused(String, crate::route::normalize::TargetError),
}

/// One request, as the command line describes it.
#[derive(Debug)]
pub struct Probe {
    pub request: Request<()>,
    /// The TCP peer the request comes from.
    pub peer: IpAddr,
    /// `--client-cert`: the subject (common name) of a client certificate
    /// `[tls] client_ca` verified, for the `cert` tier.
    pub client_cert: Option<String>,
    /// `--identity`: the caller to explain as, in place of the waterfall
    /// (no credentials needed).
    pub named: Option<identity::Named>,
}

/// The peer `explain` assumes without `--ip`.
pub const DEFAULT_PEER: &str = "127.0.0.1";

impl Probe {
    /// Builds a request from `METHOD`, `PATH`, `--header 'Name: value'`s and
    /// `--ip`.
    pub fn parse(method: &str, path: &str, headers: &[String], ip: Option<&str>) -> Result<Probe, ArgError> {
        let method = Method::from_bytes(method.as_bytes())
            .ok()
            .filter(|m| method.bytes().all(|b| b.is_ascii_alphabetic()) && !m.as_str().is_empty())
            .ok_or_else(|| ArgError::Method(method.to_string()))?;
        let uri: http::Uri = path.parse().map_err(|_| ArgError::Path(path.to_string()))?;
        if !uri.path().starts_with('/') || (uri.authority().is_none() && !path.starts_with('/')) {
            return Err(ArgError::Path(path.to_string()));
        }
        let mut map = HeaderMap::new();
        for h in headers {
            let (name, value) = h.split_once(':').ok_or_else(|| ArgError::HeaderShape(h.clone()))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|e| ArgError::Header(h.clone(), format!("header name: {e}")))?;
            let value = HeaderValue::from_str(value.trim())
                .map_err(|e| ArgError::Header(h.clone(), format!("header value: {e}")))?;
            map.append(name, value);
        }
        let peer_text = ip.unwrap_or(DEFAULT_PEER);
        let peer: IpAddr = peer_text
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| ArgError::Ip(peer_text.to_string()))?;
        let mut request = Request::new(());
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = map;
        // Explained as the gateway serves it: normalised first.
        crate::route::normalize::target(&mut request).map_err(|e| ArgError::Refused(path.to_string(), e))?;
        Ok(Probe {
            request,
            peer,
            client_cert: None,
            named: None,
        })
    }
}

/// What the gateway would do with a [`Probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub method: String,
    pub path: String,
    pub route: Option<RouteFacts>,
    pub identity: Option<IdentityFacts>,
    /// Invalid credentials the gateway refuses with 401 before any limit
    /// (`[identity] reject_invalid`).
    pub rejected: Option<String>,
    /// The setting that makes the rejection a 401.
    pub rejected_by: &'static str,
    /// The limits that apply, in the order the gateway checks them.
    pub limits: Vec<LimitFacts>,
    /// The route's limits that do not apply to this identity's tier.
    pub skipped: Vec<(String, String)>,
    /// The admin URL the live state came from (`--admin`), if asked.
    pub live_from: Option<String>,
    /// `[gateway] request_id`: what becomes of the request's `x-request-id`.
    pub request_id: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFacts {
    pub name: String,
    pub path_prefix: String,
    /// `false`: the prefix matched without ASCII case.
    pub case_sensitive: bool,
    pub host: Option<String>,
    /// `upstream NAME` or `responds STATUS`.
    pub action: String,
    pub on_store_failure: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFacts {
    /// `tier:value`.
    pub value: String,
    pub tier: &'static str,
    pub tenant: Option<String>,
    pub plan: Option<String>,
    pub client_ip: IpAddr,
    /// Each higher tier, and why it did not apply.
    pub passed_over: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitFacts {
    pub name: String,
    pub mode: &'static str,
    /// `canary` only: whether this config's instance enforces.
    pub canary_enforcing: Option<bool>,
    pub algorithm: &'static str,
    /// The key's rate: the plan's when one applies, a shard's share when
    /// sharded.
    pub rate: String,
    pub capacity: u64,
    /// The plan whose rate applies.
    pub plan: Option<String>,
    /// The sub-bucket, of how many.
    pub shard: Option<(u32, u32)>,
    /// The store key, `rl:{...}`.
    pub key: String,
    /// [`key_hash`](crate::limit::key_hash) of `key`, as the access log
    /// names it.
    pub key_hash: String,
    /// The key's state on a running gateway (`--admin`); `None` when not
    /// asked, or when the gateway's answer did not name the key.
    pub live: Option<KeyState>,
    /// The limit's cost rule (`reserve 1000, settle json:usage.total_tokens`),
    /// with this request's reserve when its headers say (a `json:` reserve
    /// reads a body, which explain does not have).
    pub cost: Option<String>,
    /// The limit's `headers`: which responses show its `RateLimit*` fields.
    pub headers: &'static str,
}

/// Explains `probe` under `config`.
pub fn explain(config: &Config, probe: &Probe, now_secs: u64) -> Explanation {
    let req = &probe.request;
    let mut out = Explanation {
        method: req.method().to_string(),
        path: req.uri().to_string(),
        route: None,
        identity: None,
        rejected: None,
        rejected_by: "",
        limits: Vec::new(),
        skipped: Vec::new(),
        live_from: None,
        request_id: config.gateway.request_id.as_str(),
    };
    let Some(route) = runtime::route_index_of(&config.routes, req).and_then(|i| config.routes.get(i)) else {
        return out;
    };
    out.route = Some(RouteFacts {
        name: route.name.clone(),
        path_prefix: route.path_prefix.clone(),
        case_sensitive: route.case_sensitive,
        host: route.host.clone(),
        action: match &route.action {
            Action::Forward(u) => format!("upstream {}", u.name),
            Action::Respond(d) => format!("responds {}", d.status.as_u16()),
            Action::Usage(_) => "answers usage (JSON)".to_string(),
        },
        on_store_failure: route.on_store_failure.as_str(),
    });

    // No TLS here: the fingerprint tier needs a ClientHello.
    let conn = waterfall::Connection {
        peer: probe.peer,
        ja4: None,
        client_cert: probe.client_cert.as_deref(),
    };
    let resolved = match &probe.named {
        Some(named) => {
            let client_ip = waterfall::client_ip(probe.peer, req.headers(), &config.identity.trusted_proxies);
            Ok(named.identity(client_ip))
        }
        None => config.identity.resolve(req.headers(), conn, now_secs),
    };
    let id = match resolved {
        Ok(id) => id,
        Err(rejection) => {
            out.rejected_by = match rejection {
                waterfall::Rejection::TooLong { .. } => "[identity] max_token_bytes",
                _ => "[identity] on_invalid_credentials = \"reject\"",
            };
            out.rejected = Some(rejection.to_string());
            return out;
        }
    };
    out.identity = Some(IdentityFacts {
        value: id.value.clone(),
        tier: id.tier.name(),
        tenant: id.tenant.as_deref().map(str::to_string),
        plan: id.plan.as_deref().map(str::to_string),
        client_ip: id.client_ip,
        // Named on the command line: no tier above was tried.
        passed_over: match probe.named {
            Some(_) => Vec::new(),
            None => config
                .identity
                .passed_over(req.headers(), conn, now_secs, id.tier)
                .into_iter()
                .map(|(tier, why)| (tier.name(), why))
                .collect(),
        },
    });

    let applying = runtime::applying_limits(&config.limits, route, id.tier);
    for &i in &route.limits {
        let Some(limit) = config.limits.get(i) else { continue };
        if !applying.contains(&i) {
            let tiers: Vec<&str> = limit.tiers.iter().flatten().map(|t| t.name()).collect();
            out.skipped.push((
                limit.name.clone(),
                format!("applies to tiers {} only, not {}", tiers.join(", "), id.tier.name()),
            ));
        }
    }
    let facts = runtime::facts(route, &id, req.headers());
    for &i in &applying {
        let Some(limit) = config.limits.get(i) else { continue };
        // The limiter's own choice of a key's quota and store key.
        let plan = id
            .plan
            .as_deref()
            .filter(|p| limit.plans.iter().any(|(name, _)| name == p));
        let (spec, sub_bucket) = crate::limit::key_spec(limit, limit.spec(), limit.shards, &facts);
        let store_key = crate::limit::store_key(limit, &facts, sub_bucket);
        let shard = sub_bucket.map(|s| (s, limit.shards));
        out.limits.push(LimitFacts {
            name: limit.name.clone(),
            mode: limit.mode.as_str(),
            canary_enforcing: (limit.mode == Mode::Canary)
                .then(|| stage::canary_enforces(&config.gateway.instance_id, limit.canary_percent)),
            algorithm: spec.algorithm.as_str(),
            rate: rate_of(&spec).to_string(),
            capacity: spec.capacity,
            plan: plan.map(str::to_string),
            shard,
            key_hash: format!("{:016x}", crate::limit::key_hash(&store_key)),
            key: store_key,
            headers: limit.headers.as_str(),
            live: None,
            cost: limit.cost.as_ref().map(|c| {
                let rule = c.describe();
                if c.reserve.needs_body() {
                    return rule;
                }
                match c
                    .reserve
                    .of_request(req.headers(), None, c.reserve_default, spec.capacity)
                {
                    Ok(n) => format!("{rule} (this request reserves {n})"),
                    Err(e) => format!("{rule} (this request: 400, {e})"),
                }
            }),
        });
    }
    out
}

fn rate_of(spec: &Spec) -> Rate {
    Rate {
        count: spec.count,
        period: std::time::Duration::from_millis(spec.period_ms()),
    }
}

impl Explanation {
    /// The store keys of the applying limits, in order: what `--admin` asks
    /// the gateway about.
    pub fn keys(&self) -> Vec<&str> {
        self.limits.iter().map(|l| l.key.as_str()).collect()
    }

    /// Attaches the live state `from` (the admin URL) answered to the limit
    /// of each key.
    pub fn attach_live(&mut self, from: &str, states: Vec<KeyState>) {
        self.live_from = Some(from.to_string());
        for state in states {
            for l in self.limits.iter_mut().filter(|l| l.key == state.key) {
                l.live = Some(state.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::render::live_text;
    use super::*;
    use serde_json::Value;

    fn config(text: &str) -> Config {
        crate::config::parse(std::path::Path::new("/tmp/gateway.toml"), text).unwrap()
    }

    const CONFIG: &str = r#"
[listeners]
http = "127.0.0.1:0"

[[identity.api_keys]]
key = "test-key-1"
tenant = "acme"
plan = "enterprise"

[[routes]]
name = "api"
path_prefix = "/v1/"
response = { status = 200, body = "ok" }
limits = ["per_client", "per_subnet", "users_only"]

[[limits]]
name = "per_client"
rate = "100/min"
plans = { enterprise = "50000/min" }

[[limits]]
name = "per_subnet"
rate = "1000/min"
by = ["subnet"]
shards = 4

[[limits]]
name = "users_only"
rate = "10/s"
tiers = ["user"]
"#;

    #[test]
    fn a_known_api_key_gets_its_plan_and_every_key_is_the_limiters() {
        let c = config(CONFIG);
        let probe = Probe::parse(
            "GET",
            "/v1/orders",
            &["X-API-Key: test-key-1".into()],
            Some("198.51.100.7"),
        )
        .unwrap();
        let e = explain(&c, &probe, 0);
        assert_eq!(e.route.as_ref().unwrap().name, "api");
        let id = e.identity.as_ref().unwrap();
        assert_eq!(id.value, "key:acme");
        assert_eq!(id.passed_over.len(), 1);
        assert_eq!(e.limits.len(), 2);
        assert_eq!(e.limits[0].rate, "50000/min");
        assert_eq!(e.limits[0].capacity, 50_000);
        assert_eq!(e.limits[0].key, "rl:{per_client:key:acme}");
        let (shard, of) = e.limits[1].shard.unwrap();
        assert_eq!(of, 4);
        assert_eq!(
            e.limits[1].key,
            format!("rl:{{per_subnet:198.51.100.0/24:s{shard:02}}}")
        );
        assert_eq!(e.limits[1].capacity, 250);
        assert_eq!(
            e.skipped,
            vec![(
                "users_only".to_string(),
                "applies to tiers user only, not key".to_string()
            )]
        );
    }

    #[test]
    fn live_state_is_attached_to_the_limit_of_its_key() {
        let c = config(CONFIG);
        let probe = Probe::parse("GET", "/v1/orders", &["X-API-Key: test-key-1".into()], None).unwrap();
        let mut e = explain(&c, &probe, 0);
        // Without --admin: no live line, no `live` field.
        assert!(!e.to_text().contains("live"), "{}", e.to_text());
        assert!(e.to_json()["limits"][0].get("live").is_none());
        let keys: Vec<String> = e.keys().iter().map(|k| k.to_string()).collect();
        assert_eq!(keys.len(), 2);
        let state = KeyState {
            key: keys[0].clone(),
            tracked: true,
            tokens_at_hand: 4,
            tokens_reserved: 0,
            blocked_for_ms: 0,
            retry_after_ms: 0,
            store_remaining: 95,
            reset_ms: 1200,
            last_store_failure: None,
            overridden: None,
        };
        // The gateway answered for the first key only.
        e.attach_live("http://127.0.0.1:9901/limits/state", vec![state.clone()]);
        assert_eq!(e.limits[0].live.as_ref(), Some(&state));
        assert_eq!(e.limits[1].live, None);
        let text = e.to_text();
        assert!(
            text.contains("          live 4 token(s) at hand; not blocked; store: 95 left, whole in 1200 ms\n"),
            "{text}"
        );
        assert!(
            text.contains("          live unknown: the gateway's answer did not name this key\n"),
            "{text}"
        );
        assert!(
            text.contains("live      from http://127.0.0.1:9901/limits/state"),
            "{text}"
        );
        let j = e.to_json();
        assert_eq!(j["limits"][0]["live"]["tokens_at_hand"], 4);
        assert_eq!(j["limits"][0]["live"]["store_remaining"], 95);
        assert!(j["limits"][1]["live"].is_null());
        assert_eq!(j["live_from"], "http://127.0.0.1:9901/limits/state");

        let blocked = KeyState {
            key: "k".into(),
            tracked: true,
            tokens_at_hand: 0,
            tokens_reserved: 0,
            blocked_for_ms: 800,
            retry_after_ms: 1000,
            store_remaining: 0,
            reset_ms: 0,
            last_store_failure: Some("store_timeout".into()),
            overridden: None,
        };
        assert_eq!(
            live_text(Some(&blocked)),
            "0 token(s) at hand; blocked for 800 ms, Retry-After 1000 ms; store: 0 left, whole in 0 ms; last store failure: store_timeout"
        );
        let untracked = KeyState {
            key: "k".into(),
            ..KeyState::default()
        };
        assert_eq!(
            live_text(Some(&untracked)),
            "not tracked on this instance (no lease, no block): its next request asks the store"
        );
    }

    #[test]
    fn headers_and_request_ids_are_shown() {
        let text = |request_id: &str, headers: &str| {
            format!(
                "[gateway]\n{request_id}[listeners]\nhttp = \"127.0.0.1:0\"\n\
                 [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nresponse = {{ status = 200, body = \"ok\" }}\n\
                 limits = [\"l\"]\n[[limits]]\nname = \"l\"\nrate = \"5/s\"\n{headers}"
            )
        };
        let probe = Probe::parse("GET", "/", &[], None).unwrap();
        let e = explain(&config(&text("", "")), &probe, 0);
        assert_eq!((e.request_id, e.limits[0].headers), ("generate", "all"));
        assert!(
            e.to_text().contains("request   x-request-id generate ("),
            "{}",
            e.to_text()
        );
        assert!(!e.to_text().contains("headers"), "{}", e.to_text());
        let e = explain(
            &config(&text("request_id = \"off\"\n", "headers = \"refusals\"\n")),
            &probe,
            0,
        );
        assert!(e.to_text().contains("request   x-request-id off ("), "{}", e.to_text());
        assert!(
            e.to_text()
                .contains("          headers refusals (RateLimit* fields on 429s only)\n"),
            "{}",
            e.to_text()
        );
        let json = e.to_json();
        assert_eq!(
            (json["request_id"].as_str(), json["limits"][0]["headers"].as_str()),
            (Some("off"), Some("refusals"))
        );
        let summary = config(&text("request_id = \"forward\"\n", "headers = \"none\"\n")).summary();
        assert!(summary.contains("workers, x-request-id forward)"), "{summary}");
        assert!(summary.contains("(enforce), headers none\n"), "{summary}");
    }

    #[test]
    fn canary_limits_say_whether_this_instance_enforces() {
        let text = |percent: u8| {
            format!(
                "[gateway]\ninstance_id = \"gw-a\"\n[listeners]\nhttp = \"127.0.0.1:0\"\n\
                 [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nresponse = {{ status = 200, body = \"ok\" }}\n\
                 limits = [\"trial\"]\n[[limits]]\nname = \"trial\"\nrate = \"5/s\"\nmode = \"canary\"\n\
                 canary_percent = {percent}\n"
            )
        };
        let probe = Probe::parse("GET", "/", &[], None).unwrap();
        for percent in [0u8, 100] {
            let e = explain(&config(&text(percent)), &probe, 0);
            assert_eq!(e.limits[0].mode, "canary");
            assert_eq!(
                e.limits[0].canary_enforcing,
                Some(stage::canary_enforces("gw-a", percent))
            );
        }
        let e = explain(&config(&text(100)), &probe, 0);
        assert!(
            e.to_text().contains("canary (enforces on this instance)"),
            "{}",
            e.to_text()
        );
    }

    #[test]
    fn bad_arguments_are_named() {
        assert!(matches!(
            Probe::parse("GET", "/", &["nocolon".into()], None),
            Err(ArgError::HeaderShape(_))
        ));
        assert!(matches!(
            Probe::parse("GET", "/", &[], Some("300.1.1.1")),
            Err(ArgError::Ip(_))
        ));
        assert!(matches!(Probe::parse("G E", "/", &[], None), Err(ArgError::Method(_))));
        assert!(matches!(Probe::parse("GET", "v1", &[], None), Err(ArgError::Path(_))));
        assert!(Probe::parse("GET", "/", &[], Some("2001:db8::1")).is_ok());
    }

    #[test]
    fn an_unmatched_path_says_so() {
        let c = config(CONFIG);
        let e = explain(&c, &Probe::parse("GET", "/other", &[], None).unwrap(), 0);
        assert!(e.route.is_none() && e.limits.is_empty());
        assert!(e.to_text().starts_with("no route matches GET /other"));
        assert_eq!(e.to_json()["route"], Value::Null);
    }
}
