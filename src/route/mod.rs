//! The route table: which route a request belongs to.
//!
//! Matching is pure: longest `path_prefix` wins; among equal prefixes a route
//! that names a host beats one that does not, and one that names methods beats
//! one that does not; then file order. Never does I/O.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use crate::proxy::upstream::Upstream;

pub mod normalize;

#[derive(Debug)]
pub struct Route {
    pub name: String,
    pub path_prefix: String,
    /// Lower-case host without port; `None` matches any host.
    pub host: Option<String>,
    /// `None` matches any method.
    pub methods: Option<Vec<Method>>,
    pub action: Action,
    /// The limits that apply, in order: indices into the config's limits.
    pub limits: Vec<usize>,
    pub on_store_failure: StoreFailure,
}

#[derive(Debug)]
pub enum Action {
    Forward(Arc<Upstream>),
    Respond(DirectResponse),
    /// `usage = [...]`: answers the caller's own state under these limits
    /// (indices into the config's limits) as JSON, consuming nothing.
    Usage(Vec<usize>),
}

#[derive(Debug)]
pub struct DirectResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub use crate::limit::policy::StoreFailure;

#[derive(Debug, Default)]
pub struct RouteTable {
    /// Sorted so that the first match is the best match.
    routes: Vec<Arc<Route>>,
}

impl RouteTable {
    pub fn new(mut routes: Vec<Arc<Route>>) -> Self {
        // Stable sort keeps file order among equals.
        routes.sort_by(|a, b| {
            b.path_prefix
                .len()
                .cmp(&a.path_prefix.len())
                .then(b.host.is_some().cmp(&a.host.is_some()))
                .then(b.methods.is_some().cmp(&a.methods.is_some()))
        });
        RouteTable { routes }
    }

    /// The best route for a request. `host` may carry a port, a trailing
    /// dot and any case; `path` is the normal form's match path
    /// ([`normalize::match_path`]).
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> Option<&Arc<Route>> {
        self.position(host, method, path).and_then(|i| self.routes.get(i))
    }

    /// The index (in match order) of the route that matches.
    pub fn position(&self, host: Option<&str>, method: &Method, path: &str) -> Option<usize> {
        let host = host.map(normalize::host);
        self.routes.iter().position(|r| {
            path.starts_with(r.path_prefix.as_str())
                && r.host
                    .as_deref()
                    .is_none_or(|want| host.is_some_and(|h| h.eq_ignore_ascii_case(want)))
                && r.methods.as_ref().is_none_or(|m| m.contains(method))
        })
    }

    /// The route at `index` (from [`Routes::position`]).
    pub fn get(&self, index: usize) -> Option<&Arc<Route>> {
        self.routes.get(index)
    }

    /// Routes in match order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, prefix: &str, host: Option<&str>, methods: Option<&[Method]>) -> Arc<Route> {
        Arc::new(Route {
            name: name.into(),
            path_prefix: prefix.into(),
            host: host.map(str::to_string),
            methods: methods.map(<[Method]>::to_vec),
            action: Action::Respond(DirectResponse {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                body: Bytes::new(),
            }),
            limits: vec![],
            on_store_failure: StoreFailure::Allow,
        })
    }

    fn find<'a>(t: &'a RouteTable, host: Option<&str>, m: Method, path: &str) -> Option<&'a str> {
        t.find(host, &m, path).map(|r| r.name.as_str())
    }

    #[test]
    fn longest_prefix_wins_regardless_of_file_order() {
        let t = RouteTable::new(vec![
            route("root", "/", None, None),
            route("v1", "/v1/", None, None),
            route("users", "/v1/users", None, None),
        ]);
        assert_eq!(find(&t, None, Method::GET, "/v1/users/7"), Some("users"));
        assert_eq!(find(&t, None, Method::GET, "/v1/orders"), Some("v1"));
        assert_eq!(find(&t, None, Method::GET, "/v1"), Some("root"));
        assert_eq!(find(&t, None, Method::GET, "/"), Some("root"));
    }

    #[test]
    fn no_match_without_a_catch_all() {
        let t = RouteTable::new(vec![route("v1", "/v1/", None, None)]);
        assert_eq!(find(&t, None, Method::GET, "/v2/x"), None);
        assert_eq!(find(&t, None, Method::GET, ""), None);
        assert!(RouteTable::default().find(None, &Method::GET, "/").is_none());
    }

    #[test]
    fn host_is_matched_without_port_and_case() {
        let t = RouteTable::new(vec![
            route("any", "/", None, None),
            route("api", "/", Some("api.example.com"), None),
            route("v6", "/", Some("[::1]"), None),
        ]);
        assert_eq!(find(&t, Some("API.example.com:8443"), Method::GET, "/x"), Some("api"));
        assert_eq!(find(&t, Some("api.example.com"), Method::GET, "/x"), Some("api"));
        assert_eq!(find(&t, Some("[::1]:8080"), Method::GET, "/"), Some("v6"));
        assert_eq!(find(&t, Some("other.example.com"), Method::GET, "/x"), Some("any"));
        assert_eq!(find(&t, None, Method::GET, "/x"), Some("any"));
    }

    #[test]
    fn methods_restrict_and_more_specific_wins() {
        let t = RouteTable::new(vec![
            route("read", "/items", None, None),
            route("write", "/items", None, Some(&[Method::POST, Method::PUT])),
        ]);
        assert_eq!(find(&t, None, Method::POST, "/items/1"), Some("write"));
        assert_eq!(find(&t, None, Method::GET, "/items/1"), Some("read"));
        let only = RouteTable::new(vec![route("w", "/", None, Some(&[Method::DELETE]))]);
        assert_eq!(find(&only, None, Method::GET, "/"), None);
    }

    #[test]
    fn a_trailing_dot_names_the_same_host() {
        let t = RouteTable::new(vec![
            route("any", "/", None, None),
            route("api", "/", Some("api.example.com"), None),
        ]);
        assert_eq!(find(&t, Some("api.example.com."), Method::GET, "/x"), Some("api"));
        assert_eq!(find(&t, Some("API.Example.COM.:80"), Method::GET, "/x"), Some("api"));
    }
}
