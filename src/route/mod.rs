//! The route table: which route a request belongs to.
//!
//! Matching is pure: longest `path_prefix` wins; among equal prefixes a route
//! that names a host beats one that does not, a case-sensitive one beats one
//! that is not, and one that names methods beats one that does not; then
//! file order. `HEAD` is matched as `GET` by a route that lists `GET` but
//! not `HEAD` (frameworks run the GET handler for it), unless a route as
//! specific lists `HEAD` itself. Never does I/O.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use crate::proxy::upstream::Upstream;

pub mod normalize;

#[derive(Debug)]
pub struct Route {
    pub name: String,
    pub path_prefix: String,
    /// `false`: the prefix matches without ASCII case (`/V1/Login` under
    /// `/v1/login`), for upstreams that route that way.
    pub case_sensitive: bool,
    /// Lower-case host without port; `None` matches any host.
    pub host: Option<String>,
    /// `None` matches any method.
    pub methods: Option<Vec<Method>>,
    pub action: Action,
    /// The limits that apply, in order: indices into the config's limits.
    pub limits: Vec<usize>,
    pub on_store_failure: StoreFailure,
}

impl Route {
    /// `path` (a match path) starts with this route's prefix, in ASCII
    /// case or not as the route says. The prefix is normal, its escapes
    /// upper-cased like the path's, so ignoring case never makes two
    /// different escapes equal.
    pub fn prefix_of(&self, path: &str) -> bool {
        if self.case_sensitive {
            return path.starts_with(self.path_prefix.as_str());
        }
        path.as_bytes()
            .get(..self.path_prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(self.path_prefix.as_bytes()))
    }

    /// Whether `other` sorts as specific as this route (methods aside):
    /// same prefix length, host or not, case or not.
    fn as_specific(&self, other: &Route) -> bool {
        self.path_prefix.len() == other.path_prefix.len()
            && self.host.is_some() == other.host.is_some()
            && self.case_sensitive == other.case_sensitive
    }
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

use crate::limit::policy::StoreFailure;

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
                .then(b.case_sensitive.cmp(&a.case_sensitive))
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
        // A GET-only route that takes this HEAD, kept until a route as
        // specific that names HEAD (or a broader one) is reached.
        let mut as_get: Option<usize> = None;
        for (i, r) in self.routes.iter().enumerate() {
            if !(r.prefix_of(path)
                && r.host
                    .as_deref()
                    .is_none_or(|want| host.is_some_and(|h| h.eq_ignore_ascii_case(want))))
            {
                continue;
            }
            match &r.methods {
                None => return Some(as_get.unwrap_or(i)),
                Some(m) if m.contains(method) => {
                    return Some(match as_get {
                        Some(g) if !self.routes.get(g).is_some_and(|g| g.as_specific(r)) => g,
                        _ => i,
                    });
                }
                Some(m) if *method == Method::HEAD && m.contains(&Method::GET) => {
                    as_get.get_or_insert(i);
                }
                Some(_) => {}
            }
        }
        as_get
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
            case_sensitive: true,
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

    fn any_case(r: Arc<Route>) -> Arc<Route> {
        let mut r = Arc::into_inner(r).unwrap();
        r.case_sensitive = false;
        Arc::new(r)
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

    #[test]
    fn a_route_without_case_matches_any_ascii_case() {
        let t = RouteTable::new(vec![
            route("open", "/", None, None),
            any_case(route("login", "/v1/login", None, None)),
            route("admin", "/Admin/", None, None),
        ]);
        for p in ["/v1/login", "/V1/LOGIN", "/v1/Login/x", "/V1/lOgIn?"] {
            assert_eq!(find(&t, None, Method::GET, p), Some("login"), "{p}");
        }
        assert_eq!(find(&t, None, Method::GET, "/v1/logi"), Some("open"));
        assert_eq!(find(&t, None, Method::GET, "/v2/login"), Some("open"));
        // Case-sensitive by default.
        assert_eq!(find(&t, None, Method::GET, "/Admin/x"), Some("admin"));
        assert_eq!(find(&t, None, Method::GET, "/admin/x"), Some("open"));
        // Among equal prefixes, the route that minds case is the more specific.
        let both = RouteTable::new(vec![
            any_case(route("loose", "/a/B", None, None)),
            route("exact", "/a/B", None, None),
        ]);
        assert_eq!(find(&both, None, Method::GET, "/a/B"), Some("exact"));
        assert_eq!(find(&both, None, Method::GET, "/A/b"), Some("loose"));
    }

    #[test]
    fn head_goes_where_get_goes_unless_a_route_names_head() {
        let t = RouteTable::new(vec![
            route("open", "/", None, None),
            route("login", "/v1/login", None, Some(&[Method::GET])),
        ]);
        assert_eq!(find(&t, None, Method::HEAD, "/v1/login"), Some("login"));
        assert_eq!(find(&t, None, Method::POST, "/v1/login"), Some("open"));
        assert_eq!(find(&t, None, Method::HEAD, "/v2"), Some("open"));
        // A GET route beats an any-method route of the same prefix for HEAD,
        // as it does for GET.
        let same = RouteTable::new(vec![
            route("any", "/items", None, None),
            route("read", "/items", None, Some(&[Method::GET])),
        ]);
        assert_eq!(find(&same, None, Method::HEAD, "/items/1"), Some("read"));
        // A route as specific that names HEAD takes it, in any file order;
        // a broader one does not.
        for routes in [
            vec![
                route("read", "/items", None, Some(&[Method::GET])),
                route("head", "/items", None, Some(&[Method::HEAD])),
            ],
            vec![
                route("head", "/items", None, Some(&[Method::HEAD])),
                route("read", "/items", None, Some(&[Method::GET])),
            ],
        ] {
            let t = RouteTable::new(routes);
            assert_eq!(find(&t, None, Method::HEAD, "/items"), Some("head"));
            assert_eq!(find(&t, None, Method::GET, "/items"), Some("read"));
        }
        let broader = RouteTable::new(vec![
            route("head", "/", None, Some(&[Method::HEAD])),
            route("read", "/items", None, Some(&[Method::GET])),
        ]);
        assert_eq!(find(&broader, None, Method::HEAD, "/items"), Some("read"));
        assert_eq!(find(&broader, None, Method::HEAD, "/other"), Some("head"));
        // GET and HEAD both listed: HEAD is its own.
        let both = RouteTable::new(vec![route("r", "/", None, Some(&[Method::GET, Method::HEAD]))]);
        assert_eq!(find(&both, None, Method::HEAD, "/"), Some("r"));
        // Only the GET route: HEAD now has one.
        let only = RouteTable::new(vec![route("r", "/", None, Some(&[Method::GET]))]);
        assert_eq!(find(&only, None, Method::HEAD, "/"), Some("r"));
    }
}
