//! `[[routes]]`: matching, action (forward or direct response), limits.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use toml::Spanned;

use super::Check;
use crate::config::{raw, Draft};
use crate::limit::policy::StoreFailure;
use crate::proxy::upstream::Upstream;
use crate::route::{Action, DirectResponse, Route};

pub(super) fn routes(
    c: &mut Check,
    list: Vec<Spanned<raw::Route>>,
    upstreams: &[Arc<Upstream>],
    limits: &[Draft],
) -> Vec<Arc<Route>> {
    let mut out: Vec<Arc<Route>> = Vec::new();
    let mut names = HashSet::new();
    for (n, r) in list.into_iter().enumerate() {
        let span = r.span();
        let r = r.into_inner();
        let key = format!("routes[{n}]");
        let name = r.name.get_ref().clone();
        if name.is_empty() {
            c.at(r.name.span(), format!("{key}.name"), "must not be empty");
        }
        if !names.insert(name.clone()) {
            c.at(
                r.name.span(),
                format!("{key}.name"),
                format!("duplicate route name {name:?}"),
            );
        }
        let prefix = r.path_prefix.get_ref().clone();
        if !prefix.starts_with('/') {
            c.at(
                r.path_prefix.span(),
                format!("{key}.path_prefix"),
                format!("{prefix:?} must start with '/'"),
            );
        } else {
            // Requests are normalised before they are matched: a prefix
            // that is not in normal form could never match as written.
            let normal =
                crate::route::normalize::path(&prefix).map(|p| crate::route::normalize::match_path(&p).into_owned());
            match normal {
                Ok(p) if p == prefix => {}
                Ok(p) => c.at(
                    r.path_prefix.span(),
                    format!("{key}.path_prefix"),
                    format!("{prefix:?} is not a normal path (requests are matched normalised): write {p:?}"),
                ),
                Err(e) => c.at(
                    r.path_prefix.span(),
                    format!("{key}.path_prefix"),
                    format!("{prefix:?} can never match: {e}"),
                ),
            }
        }
        // Envoy's default: a prefix means its bytes.
        let case_sensitive = r.case_sensitive.as_ref().is_none_or(|c| *c.get_ref());
        // Compared as requests' hosts are: lower case, no trailing dot.
        let host = r.host.as_ref().map(|h| {
            let h = h.get_ref().trim().to_ascii_lowercase();
            h.strip_suffix('.').map(str::to_string).unwrap_or(h)
        });
        if let (Some(h), Some(raw)) = (&host, &r.host) {
            if h.is_empty()
                || h.parse::<Authority>().is_err()
                || h.contains('@')
                || (h.contains(':') && !(h.starts_with('[') && h.ends_with(']')))
            {
                c.at(
                    raw.span(),
                    format!("{key}.host"),
                    format!("{h:?} is not a host name (without port)"),
                );
            }
        }
        let methods = r.methods.as_ref().map(|m| {
            let mut out = Vec::new();
            for name in m.get_ref() {
                match Method::from_bytes(name.to_ascii_uppercase().as_bytes()) {
                    Ok(method) => out.push(method),
                    Err(_) => c.at(
                        m.span(),
                        format!("{key}.methods"),
                        format!("{name:?} is not an HTTP method"),
                    ),
                }
            }
            if out.is_empty() {
                c.at(
                    m.span(),
                    format!("{key}.methods"),
                    "list at least one method, or leave methods out",
                );
            }
            out
        });
        let usage = r.usage.as_ref().map(|u| usage_limits(c, u, limits, &key));
        let conflict = usage.is_some() && (r.upstream.is_some() || r.response.is_some());
        if let (Some(u), true) = (&r.usage, r.limits.is_empty()) {
            c.at(
                u.span(),
                format!("{key}.usage"),
                "a usage route asks the store for every limit it shows, on every call: give it limits of its own",
            );
        }
        let action = match (&r.upstream, r.response) {
            _ if conflict => {
                c.at(
                    span.clone(),
                    key.clone(),
                    "a usage route answers by itself: set usage, upstream or response, one of them",
                );
                None
            }
            (None, None) if usage.is_some() => usage.map(Action::Usage),
            (Some(u), None) => match upstreams.iter().find(|up| up.name == *u.get_ref()) {
                Some(up) => Some(Action::Forward(up.clone())),
                None => {
                    let mut known: Vec<_> = upstreams.iter().map(|up| up.name.as_str()).collect();
                    known.sort_unstable();
                    c.at(
                        u.span(),
                        format!("{key}.upstream"),
                        format!(
                            "unknown upstream {:?} (known: {})",
                            u.get_ref(),
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    );
                    None
                }
            },
            (None, Some(resp)) => direct_response(c, resp, &key).map(Action::Respond),
            (Some(_), Some(_)) => {
                c.at(span.clone(), key.clone(), "set either upstream or response, not both");
                None
            }
            (None, None) => {
                c.at(
                    span.clone(),
                    key.clone(),
                    "set upstream = \"NAME\" or response = { status = 200, body = \"...\" }",
                );
                None
            }
        };
        let mut route_limits: Vec<usize> = Vec::new();
        for l in &r.limits {
            if let Some(index) = limits.iter().position(|lim| lim.name == *l.get_ref()) {
                if route_limits.contains(&index) {
                    c.at(
                        l.span(),
                        format!("{key}.limits"),
                        format!("limit {:?} is listed twice", l.get_ref()),
                    );
                }
                route_limits.push(index);
            } else {
                let known: Vec<_> = limits.iter().map(|l| l.name.as_str()).collect();
                c.at(
                    l.span(),
                    format!("{key}.limits"),
                    format!(
                        "unknown limit {:?} (known: {})",
                        l.get_ref(),
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
            }
        }
        cost_rules(c, &key, &r.limits, limits, action.as_ref(), methods.as_deref());
        let on_store_failure = super::choice(
            c,
            r.on_store_failure.as_ref(),
            &format!("{key}.on_store_failure"),
            StoreFailure::SPELLINGS,
            StoreFailure::Allow,
        );
        let same_prefix = |o: &Route| {
            o.case_sensitive == case_sensitive
                && if case_sensitive {
                    o.path_prefix == prefix
                } else {
                    o.path_prefix.eq_ignore_ascii_case(&prefix)
                }
        };
        if let Some(other) = out
            .iter()
            .find(|o| same_prefix(o) && o.host == host && same_methods(&o.methods, &methods))
        {
            c.at(
                r.path_prefix.span(),
                format!("{key}.path_prefix"),
                format!(
                    "route {name:?} matches exactly what route {:?} matches, so it can never be chosen",
                    other.name
                ),
            );
        }
        if let Some(action) = action {
            out.push(Arc::new(Route {
                name,
                path_prefix: prefix,
                case_sensitive,
                host,
                methods,
                action,
                limits: route_limits,
                on_store_failure,
            }));
        }
    }
    out
}

/// What a route's limits' cost rules need of it: a `settle` reads an
/// upstream's response (a route that answers by itself has none), and a
/// `json:` reserve reads a request body (a route only for methods without
/// one never has it).
fn cost_rules(
    c: &mut Check,
    key: &str,
    written_limits: &[Spanned<String>],
    limits: &[Draft],
    action: Option<&Action>,
    methods: Option<&[Method]>,
) {
    for written in written_limits {
        let Some(cost) = limits
            .iter()
            .find(|l| l.name == *written.get_ref())
            .and_then(|l| l.cost.as_ref())
        else {
            continue;
        };
        let name = written.get_ref();
        if cost.settle.is_some() && matches!(action, Some(Action::Respond(_) | Action::Usage(_))) {
            c.at(
                written.span(),
                format!("{key}.limits"),
                format!(
                    "limit {name:?} settles its cost from the upstream's response, and this route answers by itself"
                ),
            );
        }
        let bodiless = |m: &Method| {
            [
                Method::GET,
                Method::HEAD,
                Method::DELETE,
                Method::OPTIONS,
                Method::TRACE,
                Method::CONNECT,
            ]
            .contains(m)
        };
        if cost.reserve.needs_body() && methods.is_some_and(|m| m.iter().all(bodiless)) {
            c.at(
                written.span(),
                format!("{key}.limits"),
                format!(
                    "limit {name:?} reserves from the JSON request body ({}), and this route's methods send none",
                    cost.reserve.describe()
                ),
            );
        }
    }
}

fn same_methods(a: &Option<Vec<Method>>, b: &Option<Vec<Method>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.iter().all(|m| b.contains(m)) && b.iter().all(|m| a.contains(m)),
        (None, None) => true,
        _ => false,
    }
}

/// A usage route's limits, by name, each once.
fn usage_limits(c: &mut Check, u: &Spanned<Vec<String>>, limits: &[Draft], key: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for name in u.get_ref() {
        match limits.iter().position(|l| l.name == *name) {
            Some(i) if !out.contains(&i) => out.push(i),
            Some(_) => c.at(
                u.span(),
                format!("{key}.usage"),
                format!("limit {name:?} is listed twice"),
            ),
            None => {
                let known: Vec<_> = limits.iter().map(|l| l.name.as_str()).collect();
                c.at(
                    u.span(),
                    format!("{key}.usage"),
                    format!(
                        "unknown limit {name:?} (known: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
            }
        }
    }
    if u.get_ref().is_empty() {
        c.at(
            u.span(),
            format!("{key}.usage"),
            "name at least one limit whose state the route answers",
        );
    }
    out
}

fn direct_response(c: &mut Check, r: Spanned<raw::DirectResponse>, key: &str) -> Option<DirectResponse> {
    let span = r.span();
    let r = r.into_inner();
    let code = u16::try_from(*r.status.get_ref()).unwrap_or(0);
    let status = match StatusCode::from_u16(code) {
        Ok(s) if (200..=599).contains(&s.as_u16()) => Some(s),
        _ => {
            c.at(
                r.status.span(),
                format!("{key}.response.status"),
                format!("{} is not a final HTTP status: use 200 to 599", r.status.get_ref()),
            );
            None
        }
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &r.headers {
        match (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            _ => c.at(
                span.clone(),
                format!("{key}.response.headers.{name}"),
                "not a valid header name and value",
            ),
        }
    }
    Some(DirectResponse {
        status: status?,
        headers,
        body: Bytes::from(r.body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[listeners]\nhttp = \"127.0.0.1:0\"\n";

    fn route(lines: &str) -> String {
        format!("[[routes]]\nresponse = {{ status = 200 }}\n{lines}\n")
    }

    #[test]
    fn case_sensitive_defaults_to_true_and_shows_when_off() {
        let text = format!(
            "{BASE}{}{}",
            route("name = \"a\"\npath_prefix = \"/v1/login\"\ncase_sensitive = false"),
            route("name = \"b\"\npath_prefix = \"/v1/other\"")
        );
        let c = crate::config::parse(std::path::Path::new("g.toml"), &text).unwrap();
        let by_name = |n: &str| c.routes.iter().find(|r| r.name == n).map(|r| r.case_sensitive);
        assert_eq!(by_name("a"), Some(false));
        assert_eq!(by_name("b"), Some(true));
        let summary = c.summary();
        assert!(
            summary.contains("route     a /v1/login (any case) -> responds 200"),
            "{summary}"
        );
        assert!(summary.contains("route     b /v1/other -> responds 200"), "{summary}");
    }

    #[test]
    fn two_routes_without_case_on_one_prefix_are_refused() {
        let text = format!(
            "{BASE}{}{}{}",
            route("name = \"a\"\npath_prefix = \"/v1/Login\"\ncase_sensitive = false"),
            route("name = \"b\"\npath_prefix = \"/v1/login\""),
            route("name = \"c\"\npath_prefix = \"/V1/login\"\ncase_sensitive = false"),
        );
        let Err(crate::config::ConfigError::Invalid(problems)) =
            crate::config::parse(std::path::Path::new("g.toml"), &text)
        else {
            panic!("accepted");
        };
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0]
                .reason
                .contains("route \"c\" matches exactly what route \"a\" matches"),
            "{problems:?}"
        );
    }

    #[test]
    fn method_sets_compare_without_order() {
        let a = Some(vec![Method::GET, Method::POST]);
        let b = Some(vec![Method::POST, Method::GET]);
        assert!(same_methods(&a, &b));
        assert!(!same_methods(&a, &Some(vec![Method::GET])));
        assert!(!same_methods(&a, &None));
        assert!(same_methods(&None, &None));
    }
}
