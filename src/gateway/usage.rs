//! A usage route (`[[routes]] usage = [...]`): the caller's own state
//! under some limits, as JSON, consuming nothing. The caller is identified
//! as on every route, and the route's own `limits` apply to it first.

use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::Gateway;
use crate::identity::Identity;
use crate::proxy::body::Body;
use crate::route::Route;
use crate::runtime::{facts, Snapshot};

impl Gateway {
    /// `{"identity": "key:acme", "limits": [{"name", "limit", "remaining",
    /// "reset", "window", "debt"}]}`, seconds for `reset` and `window`.
    pub(super) async fn usage(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        identity: &Identity,
        headers: &HeaderMap,
        which: &[usize],
    ) -> Response<Body> {
        let facts = facts(route, identity, headers);
        let mut limits = Vec::with_capacity(which.len());
        for limit in snapshot.limits_of(which) {
            limits.push(self.runtime.limiter.usage(&limit, &facts).await);
        }
        let body = serde_json::json!({ "identity": identity.value, "limits": limits });
        let mut resp = Response::new(Body::full(format!("{body}\n")));
        *resp.status_mut() = StatusCode::OK;
        let h = resp.headers_mut();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }
}
