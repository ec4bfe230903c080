//! Every refusal the gateway makes, and the one place that maps it to an
//! HTTP status and an `application/problem+json` body (RFC 9457).

use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::body::Body;

/// Where the fault lies: decides the status family and whether it is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Client,
    Upstream,
}

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("no route matches this request")]
    NoRoute,
    #[error("upstream {upstream:?} is unreachable: {reason}")]
    UpstreamUnreachable { upstream: String, reason: String },
    #[error("upstream {upstream:?} did not answer within {timeout_ms} ms")]
    UpstreamTimeout { upstream: String, timeout_ms: u128 },
    #[error("upstream {upstream:?} failed: {reason}")]
    UpstreamFailed { upstream: String, reason: String },
    /// The client's request body broke off while it was being forwarded:
    /// malformed chunked framing (a chunk size that is not hex, or above
    /// 2^64), or a client that went away mid-body. Its fault, not ours.
    #[error("the request body could not be read: {reason}")]
    BadRequestBody { reason: String },
}

impl RequestError {
    pub fn source(&self) -> Source {
        match self {
            RequestError::NoRoute | RequestError::BadRequestBody { .. } => Source::Client,
            RequestError::UpstreamUnreachable { .. }
            | RequestError::UpstreamTimeout { .. }
            | RequestError::UpstreamFailed { .. } => Source::Upstream,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            RequestError::NoRoute => StatusCode::NOT_FOUND,
            RequestError::BadRequestBody { .. } => StatusCode::BAD_REQUEST,
            RequestError::UpstreamUnreachable { .. } | RequestError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            RequestError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            RequestError::NoRoute => "No route",
            RequestError::BadRequestBody { .. } => "Bad Request",
            RequestError::UpstreamUnreachable { .. } => "Upstream unreachable",
            RequestError::UpstreamTimeout { .. } => "Upstream timeout",
            RequestError::UpstreamFailed { .. } => "Upstream failed",
        }
    }

    /// What the client is told. Upstream failures name no upstream, address
    /// or OS error: those are for the log, not for whoever sent the request.
    fn public_detail(&self) -> String {
        match self {
            RequestError::NoRoute | RequestError::BadRequestBody { .. } => self.to_string(),
            RequestError::UpstreamUnreachable { .. } => "the service behind this route could not be reached".into(),
            RequestError::UpstreamTimeout { .. } => "the service behind this route did not answer in time".into(),
            RequestError::UpstreamFailed { .. } => "the service behind this route failed to answer".into(),
        }
    }

    /// The response the client gets.
    pub fn to_response(&self) -> Response<Body> {
        problem(self.status(), self.title(), &self.public_detail())
    }
}

/// The 429 for a refused request: names the limit, says when to retry.
/// `Retry-After` is whole seconds, at least 1, rounded up.
///
/// A flood of refusals repeats the same body (one limit, a retry time that
/// changes once a second), so each thread keeps the last one it wrote: a
/// repeat costs a reference count, not a JSON document.
pub fn too_many_requests(limit: &str, retry_after_ms: u64) -> Response<Body> {
    thread_local! {
        static LAST: std::cell::RefCell<(String, u64, bytes::Bytes)> =
            const { std::cell::RefCell::new((String::new(), 0, bytes::Bytes::new())) };
    }
    let secs = retry_after_ms.div_ceil(1000).max(1);
    let body = LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.1 != secs || last.0 != limit || last.2.is_empty() {
            *last = (
                limit.to_string(),
                secs,
                bytes::Bytes::from(too_many_requests_body(limit, secs)),
            );
        }
        last.2.clone()
    });
    with_retry_after(StatusCode::TOO_MANY_REQUESTS, Body::full(body), secs)
}

/// The problem+json of a 429, members in the order serde_json's map
/// writes them (sorted), as it was written through `serde_json::Value`.
fn too_many_requests_body(limit: &str, secs: u64) -> Vec<u8> {
    let name = serde_json::to_string(limit).unwrap_or_default();
    // The name inside `detail` is the same escaped text, between escaped quotes.
    let inner = name.get(1..name.len().saturating_sub(1)).unwrap_or_default();
    format!(
        "{{\"detail\":\"rate limit \\\"{inner}\\\" exceeded; retry in {secs} s\",\"limit\":{name},\"retry_after\":{secs},\
         \"status\":429,\"title\":\"Too Many Requests\",\"type\":\"about:blank\"}}"
    )
    .into_bytes()
}

/// The 401 for credentials that were presented and are not valid, under
/// `[identity] on_invalid_credentials = "reject"`.
pub fn unauthorized(reason: &str) -> Response<Body> {
    let mut resp = problem(StatusCode::UNAUTHORIZED, "Unauthorized", reason);
    resp.headers_mut()
        .insert(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// The 503 of a fail-closed route whose quota store is unreachable: the
/// client did nothing wrong, so not a 429.
pub fn store_unavailable(retry_after_secs: u64) -> Response<Body> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "rate limiting is unavailable and this route fails closed; retry shortly",
    });
    with_retry_after(
        StatusCode::SERVICE_UNAVAILABLE,
        Body::full(body.to_string()),
        retry_after_secs.max(1),
    )
}

fn with_retry_after(status: StatusCode, body: Body, secs: u64) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(RETRY_AFTER, HeaderValue::from(secs));
    resp
}

/// A problem+json response. Never cached: it describes this moment.
pub fn problem(status: StatusCode, title: &str, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut resp = Response::new(Body::full(body.to_string()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_429_body_is_the_problem_json_document_it_always_was() {
        for (limit, retry_ms) in [
            ("per_client", 1),
            ("per_client", 3_600_000),
            ("a \"quoted\" \\ name", 1_500),
            ("ünïcödé ☃ \u{1} \t", 61_000),
            ("", 0),
        ] {
            let secs = u64::div_ceil(retry_ms, 1000).max(1);
            let expected = serde_json::json!({
                "type": "about:blank",
                "title": "Too Many Requests",
                "status": 429,
                "detail": format!("rate limit \"{limit}\" exceeded; retry in {secs} s"),
                "limit": limit,
                "retry_after": secs,
            })
            .to_string();
            // Twice: the second comes from the thread's last body.
            for _ in 0..2 {
                let resp = too_many_requests(limit, retry_ms);
                assert_eq!(resp.headers()[RETRY_AFTER], secs.to_string().as_str());
                let Body::Full(Some(body)) = resp.into_body() else {
                    panic!("a full body")
                };
                assert_eq!(std::str::from_utf8(&body).unwrap(), expected);
            }
        }
    }

    #[test]
    fn statuses_follow_the_source() {
        assert_eq!(RequestError::NoRoute.status(), StatusCode::NOT_FOUND);
        let u = || "backend".to_string();
        assert_eq!(
            RequestError::UpstreamUnreachable {
                upstream: u(),
                reason: "refused".into()
            }
            .status(),
            StatusCode::BAD_GATEWAY
        );
        let t = RequestError::UpstreamTimeout {
            upstream: u(),
            timeout_ms: 5,
        };
        assert_eq!(t.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(t.source(), Source::Upstream);
        let r = t.to_response();
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        let body = RequestError::BadRequestBody {
            reason: "invalid chunk size: overflow".into(),
        };
        assert_eq!(body.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body.source(), Source::Client);
    }
}
