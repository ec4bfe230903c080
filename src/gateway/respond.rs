//! Everything the client is told, in one place: every refusal the gateway
//! makes mapped to an HTTP status and an `application/problem+json` body
//! (RFC 9457), the 429 with its `Retry-After`, the 401 and the 503, and the
//! `RateLimit-*` fields and `RateLimit-Warning`s a verdict shows (the
//! statuses are picked here; `limit::headers` writes their bytes).

use std::cell::RefCell;

use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use smallvec::SmallVec;

use crate::limit::headers::{self as rl_headers, Status, RATELIMIT_WARNING};
use crate::limit::policy::{LimitHeaders, Mode};
use crate::limit::stage::{self, Outcome};
use crate::limit::Verdict;
use crate::proxy::body::Body;
use crate::proxy::ForwardError;
use crate::runtime::Snapshot;

/// Where the fault lies: decides the status family and whether it is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Client,
    Upstream,
}

/// Why a request got no answer of its own.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("no route matches this request")]
    NoRoute,
    /// A target that upstreams could read in more than one way: an
    /// encoded `/`, `..` above the root, two `Host` lines, ...
    #[error("the request target is refused: {0}")]
    BadTarget(#[from] crate::route::normalize::TargetError),
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A cost reserve's header is not a number.
    #[error("{0}")]
    BadReserve(#[from] crate::limit::cost::ReserveError),
    /// A body a `json:` cost reserve reads is larger than
    /// `[gateway] max_cost_body_bytes`.
    #[error("the request body is larger than {0} bytes, the most read to price it")]
    BodyTooLarge(usize),
    /// The body a `json:` cost reserve reads broke off, or stalled.
    #[error("the request body could not be read: {0}")]
    BodyUnread(String),
    /// The body a `json:` cost reserve reads took longer than the route's
    /// request timeout.
    #[error("the request body took longer than {0} ms to arrive")]
    BodySlow(u64),
    /// The bodies being read to price them hold all the memory they may
    /// ([`super::budget`]), in all or the client's share.
    #[error("too many request bodies are being read to price them; retry shortly")]
    BodiesBusy,
    /// The body a `json:` cost reserve reads came slower than `[gateway]
    /// min_body_rate` bytes/s over 5 s.
    #[error("the request body arrived slower than {0} bytes/s")]
    BodyTooSlow(u64),
    /// A body a cost reserve reads came with a `Content-Encoding`: its
    /// bytes are not what the upstream reads, so it cannot be priced.
    #[error("a request body this route prices must not be encoded (Content-Encoding {0:?}); send it as it is")]
    BodyEncoded(String),
}

impl RequestError {
    pub fn source(&self) -> Source {
        match self {
            RequestError::NoRoute
            | RequestError::BadTarget(_)
            | RequestError::BadReserve(_)
            | RequestError::BodyTooLarge(_)
            | RequestError::BodySlow(_)
            | RequestError::BodyTooSlow(_)
            | RequestError::BodiesBusy
            | RequestError::BodyEncoded(_)
            | RequestError::BodyUnread(_) => Source::Client,
            RequestError::Forward(f) if f.upstream_fault().is_none() => Source::Client,
            RequestError::Forward(_) => Source::Upstream,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            RequestError::NoRoute => StatusCode::NOT_FOUND,
            RequestError::BadTarget(_)
            | RequestError::BadReserve(_)
            | RequestError::BodyUnread(_)
            | RequestError::Forward(ForwardError::BadRequestBody { .. }) => StatusCode::BAD_REQUEST,
            RequestError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            RequestError::BodySlow(_)
            | RequestError::BodyTooSlow(_)
            | RequestError::Forward(ForwardError::BodyTooSlow { .. }) => StatusCode::REQUEST_TIMEOUT,
            RequestError::BodiesBusy => StatusCode::SERVICE_UNAVAILABLE,
            RequestError::BodyEncoded(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            RequestError::Forward(ForwardError::UpstreamBusy { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            RequestError::Forward(ForwardError::UpstreamUnreachable { .. } | ForwardError::UpstreamFailed { .. }) => {
                StatusCode::BAD_GATEWAY
            }
            RequestError::Forward(ForwardError::UpstreamTimeout { .. }) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            RequestError::NoRoute => "No route",
            RequestError::BadTarget(_)
            | RequestError::BadReserve(_)
            | RequestError::BodyUnread(_)
            | RequestError::Forward(ForwardError::BadRequestBody { .. }) => "Bad Request",
            RequestError::BodyTooLarge(_) => "Payload Too Large",
            RequestError::BodySlow(_)
            | RequestError::BodyTooSlow(_)
            | RequestError::Forward(ForwardError::BodyTooSlow { .. }) => "Request Timeout",
            RequestError::BodiesBusy => "Service Unavailable",
            RequestError::BodyEncoded(_) => "Unsupported Media Type",
            RequestError::Forward(ForwardError::UpstreamBusy { .. }) => "Upstream busy",
            RequestError::Forward(ForwardError::UpstreamUnreachable { .. }) => "Upstream unreachable",
            RequestError::Forward(ForwardError::UpstreamTimeout { .. }) => "Upstream timeout",
            RequestError::Forward(ForwardError::UpstreamFailed { .. }) => "Upstream failed",
        }
    }

    /// What the client is told. Upstream failures name no upstream, address
    /// or OS error: those are for the log, not for whoever sent the request.
    fn public_detail(&self) -> String {
        match self {
            RequestError::NoRoute
            | RequestError::BadTarget(_)
            | RequestError::BadReserve(_)
            | RequestError::BodyTooLarge(_)
            | RequestError::BodySlow(_)
            | RequestError::BodyTooSlow(_)
            | RequestError::BodiesBusy
            | RequestError::BodyEncoded(_)
            | RequestError::BodyUnread(_)
            | RequestError::Forward(ForwardError::BadRequestBody { .. } | ForwardError::BodyTooSlow { .. }) => {
                self.to_string()
            }
            RequestError::Forward(ForwardError::UpstreamBusy { .. }) => {
                "the service behind this route is at capacity".into()
            }
            RequestError::Forward(ForwardError::UpstreamUnreachable { .. }) => {
                "the service behind this route could not be reached".into()
            }
            RequestError::Forward(ForwardError::UpstreamTimeout { .. }) => {
                "the service behind this route did not answer in time".into()
            }
            RequestError::Forward(ForwardError::UpstreamFailed { .. }) => {
                "the service behind this route failed to answer".into()
            }
        }
    }

    /// The response the client gets.
    pub fn to_response(&self) -> Response<Body> {
        let mut resp = problem(self.status(), self.title(), &self.public_detail());
        if matches!(
            self,
            RequestError::Forward(ForwardError::UpstreamBusy { .. }) | RequestError::BodiesBusy
        ) {
            // In flight ends within moments: come back in a second.
            resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// The 429 for a refused request: names the limit, says when to retry, and
/// carries the `RateLimit-*` fields of `statuses` (rendered in `style`,
/// the trio describing `focus`). `Retry-After` is whole seconds, at least
/// 1, rounded up.
///
/// A flood of refusals repeats the same response (one limit, numbers that
/// change once a second), so each thread keeps the last one it made: a
/// repeat costs a clone of its header map and a reference count for its
/// body, not a JSON document and eight header values built and inserted.
pub fn too_many_requests(
    limit: &str,
    retry_after_ms: u64,
    style: rl_headers::Style,
    statuses: &[Status<'_>],
    focus: Option<usize>,
) -> Response<Body> {
    thread_local! {
        static LAST: RefCell<Option<Refusal>> = const { RefCell::new(None) };
    }
    let secs = retry_after_ms.div_ceil(1000).max(1);
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        let refusal = match &mut *last {
            Some(r) if r.is_for(limit, secs, style, statuses, focus) => r,
            other => other.insert(Refusal::new(limit, secs, style, statuses, focus)),
        };
        let mut resp = Response::new(Body::full(refusal.body.clone()));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        *resp.headers_mut() = refusal.headers.clone();
        resp
    })
}

/// A 429 as made, and what it was made from.
struct Refusal {
    limit: String,
    secs: u64,
    style: rl_headers::Style,
    focus: Option<usize>,
    /// (name, quota, window, remaining, reset) of each status.
    statuses: Vec<(String, [u64; 4])>,
    headers: HeaderMap,
    body: bytes::Bytes,
}

impl Refusal {
    fn new(limit: &str, secs: u64, style: rl_headers::Style, statuses: &[Status<'_>], focus: Option<usize>) -> Refusal {
        let mut headers = problem_headers(Some(secs));
        rl_headers::render(&mut headers, style, statuses, focus);
        Refusal {
            limit: limit.to_string(),
            secs,
            style,
            focus,
            statuses: statuses.iter().map(|s| (s.name.to_string(), numbers(s))).collect(),
            headers,
            body: bytes::Bytes::from(too_many_requests_body(limit, secs)),
        }
    }

    fn is_for(
        &self,
        limit: &str,
        secs: u64,
        style: rl_headers::Style,
        statuses: &[Status<'_>],
        focus: Option<usize>,
    ) -> bool {
        self.secs == secs
            && self.focus == focus
            && self.style == style
            && self.limit == limit
            && self.statuses.len() == statuses.len()
            && self
                .statuses
                .iter()
                .zip(statuses)
                .all(|((name, n), s)| *n == numbers(s) && name == s.name)
    }
}

fn numbers(s: &Status<'_>) -> [u64; 4] {
    [s.quota, s.window_secs, s.remaining, s.reset_secs]
}

/// A 429's body, for a request refused because its own reserve does not
/// fit in what remains: it says so (`this request reserves 1990; 1738
/// remain`), with the reserve and what remains as members, so a client
/// can ask for less rather than retry the same request.
pub fn reserve_does_not_fit(resp: &mut Response<Body>, limit: &str, reserve: u64, remaining: u64) {
    let secs = resp
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": format!(
            "rate limit \"{limit}\": this request reserves {reserve}; {remaining} remain; it fits in {secs} s"
        ),
        "limit": limit,
        "reserve": reserve,
        "remaining": remaining,
        "retry_after": secs,
    });
    *resp.body_mut() = Body::full(serde_json::to_vec(&body).unwrap_or_default());
    resp.headers_mut().remove(http::header::CONTENT_LENGTH);
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

/// The 401 for credentials that were presented and are not valid (under
/// `[identity] on_invalid_credentials = "reject"`), or longer than
/// `[identity] max_token_bytes`.
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
    *resp.headers_mut() = problem_headers(Some(secs));
    resp
}

/// What every problem+json response carries, and `Retry-After` if given.
fn problem_headers(retry_after_secs: Option<u64>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(secs) = retry_after_secs {
        h.insert(RETRY_AFTER, rl_headers::number(secs));
    }
    h
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
    *resp.headers_mut() = problem_headers(None);
    resp
}

// What a client is told of a verdict.
/// `RateLimit-*` headers for every limit the client may see on an admitted
/// response (shadow limits stay invisible, and so do limits with `headers`
/// `"refusals"` or `"none"`), and a `RateLimit-Warning` per soft-limited
/// one. `also`: how many fields the caller adds next, so the map grows at
/// most once, to its final size.
pub fn add_limit_headers(headers: &mut HeaderMap, snapshot: &Snapshot, verdict: &Verdict, also: usize) {
    let mut statuses = Statuses::new();
    let focus = visible_statuses(verdict, None, &mut statuses);
    let style = snapshot.config.gateway.rate_limit_headers;
    let warnings = verdict
        .limits
        .iter()
        .filter(|lv| lv.outcome == Outcome::SoftLimited)
        .count();
    let _ = headers.try_reserve(rl_headers::fields(style, statuses.len()) + warnings + also);
    add_warnings(headers, verdict);
    rl_headers::render(headers, style, &statuses, focus);
}

/// What the client may see of each limit of the verdict (shadow limits stay
/// invisible, and each limit's `headers` says whether this response shows
/// it), and where the verdict's limit at `focus` is among them.
///
/// `focus` is the refusing limit's position: the response is its 429,
/// which shows the limits whose `headers` is `"all"` or `"refusals"`,
/// unless the refusing limit's is `"none"`: then it shows none, as the
/// trio would have to describe another limit, with tokens left, on a
/// refusal. Without `focus` (an admitted response) only `"all"` ones show.
///
/// Into `statuses` (empty), in place: every response has them, and a
/// list returned (~300 bytes) was copied out and again.
pub fn visible_statuses<'s>(verdict: &Verdict<'s>, focus: Option<usize>, statuses: &mut Statuses<'s>) -> Option<usize> {
    let mut focus_at = None;
    let refusal = focus.is_some();
    if let Some(refuser) = focus.and_then(|i| verdict.limits.get(i)) {
        if refuser.limit.config.headers == LimitHeaders::None {
            return None;
        }
    }
    for (position, lv) in verdict.limits.iter().enumerate() {
        let limit = lv.limit.get();
        if limit.config.mode == Mode::Shadow || !limit.config.headers.shown(refusal) {
            continue;
        }
        if focus == Some(position) {
            focus_at = Some(statuses.len());
        }
        statuses.push(Status {
            name: &limit.config.name,
            quota: lv.quota,
            window_secs: lv.window_secs,
            remaining: lv.remaining,
            reset_secs: rl_headers::secs(lv.reset_ms),
            policy: limit.policy.item(lv.quota, lv.window_secs),
            limit: limit.policy.limit(lv.quota),
        });
    }
    focus_at
}

/// What the client may see of each limit of a verdict.
pub type Statuses<'s> = SmallVec<[Status<'s>; 4]>;

/// A `RateLimit-Warning` per soft-limited limit of the verdict.
pub fn add_warnings(headers: &mut HeaderMap, verdict: &Verdict) {
    for lv in verdict.limits.iter().filter(|lv| lv.outcome == Outcome::SoftLimited) {
        let limit = lv.limit;
        if limit.config.mode == Mode::Shadow {
            continue;
        }
        let text = stage::warning(lv.over_percent, limit.config.enforce_after.as_deref());
        if let Ok(v) = HeaderValue::from_str(&text) {
            headers.append(RATELIMIT_WARNING.clone(), v);
        }
    }
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
            // Twice: the second comes from the thread's last refusal.
            for _ in 0..2 {
                let resp = too_many_requests(limit, retry_ms, rl_headers::Style::All, &[], None);
                assert_eq!(resp.headers()[RETRY_AFTER], secs.to_string().as_str());
                let Body::Full(Some(body)) = resp.into_body() else {
                    panic!("a full body")
                };
                assert_eq!(std::str::from_utf8(&body).unwrap(), expected);
            }
        }
    }

    #[test]
    fn a_refusal_made_again_changes_with_every_input() {
        let st = |name, remaining, reset_secs| Status {
            name,
            quota: 10,
            window_secs: 60,
            remaining,
            reset_secs,
            policy: None,
            limit: None,
        };
        let made = |resp: Response<Body>| {
            let (parts, body) = resp.into_parts();
            let Body::Full(Some(body)) = body else {
                panic!("a full body")
            };
            (parts.headers, body)
        };
        let all = rl_headers::Style::All;
        let a = [st("a", 0, 7), st("b", 3, 50)];
        let (first, _) = made(too_many_requests("a", 7_000, all, &a, Some(0)));
        assert_eq!(first["ratelimit"], r#""a";r=0;t=7, "b";r=3;t=50"#);
        assert_eq!(first["retry-after"], "7");
        // Each input on its own, right after the first: what a thread made
        // afresh, never the last refusal.
        let cases = [
            ("a", 7_000, all, [st("a", 0, 6), st("b", 3, 50)], Some(0)),
            ("a", 7_000, all, [st("a", 0, 7), st("b", 2, 50)], Some(0)),
            ("a", 7_000, all, [st("a", 0, 7), st("c", 3, 50)], Some(0)),
            ("a", 8_000, all, a.clone(), Some(0)),
            ("b", 7_000, all, a.clone(), Some(1)),
            ("a", 7_000, all, a.clone(), Some(1)),
            ("a", 7_000, rl_headers::Style::Legacy, a.clone(), Some(0)),
        ];
        for (limit, retry_ms, style, statuses, focus) in cases {
            let again = made(too_many_requests(limit, retry_ms, style, &statuses, focus));
            let fresh = Refusal::new(limit, retry_ms / 1000, style, &statuses, focus);
            assert_eq!(
                again,
                (fresh.headers, fresh.body),
                "{limit} {retry_ms} {style:?} {statuses:?} {focus:?}"
            );
            assert_ne!(again.0, first, "{limit} {retry_ms} {style:?} {statuses:?} {focus:?}");
            let (back, _) = made(too_many_requests("a", 7_000, all, &a, Some(0)));
            assert_eq!(back, first);
        }
    }

    /// A snapshot of limits `a` (headers `a`) and `b` (headers `b`), and a
    /// verdict of both with tokens left.
    fn two_limits(a: &str, b: &str) -> Snapshot {
        let text = format!(
            "[listeners]\nhttp = \"127.0.0.1:0\"\n\
             [[limits]]\nname = \"a\"\nrate = \"10/min\"\nheaders = \"{a}\"\n\
             [[limits]]\nname = \"b\"\nrate = \"5/min\"\nheaders = \"{b}\"\n"
        );
        let config = crate::config::parse(std::path::Path::new("gw.toml"), &text).unwrap();
        Snapshot::new(config, &crate::telemetry::metrics::Metrics::new())
    }

    fn verdict_of(snapshot: &Snapshot, refused: Option<usize>) -> Verdict<'_> {
        let mut v = Verdict::default();
        for (i, quota) in [(0, 10), (1, 5)] {
            v.limits.push(crate::limit::LimitVerdict {
                limit: crate::limit::LimitRef::new(&snapshot.limits[i]),
                key_hash: i as u64,
                outcome: if refused == Some(i) {
                    Outcome::Limited
                } else {
                    Outcome::Admitted
                },
                quota,
                window_secs: 60,
                remaining: if refused == Some(i) { 0 } else { 2 },
                reset_ms: 7_000,
                retry_after_ms: 7_000,
                over_percent: 0,
            });
        }
        if let Some(at) = refused {
            v.decision = crate::limit::Decision::Refuse { at };
        }
        v
    }

    /// The visible statuses, and the focus among them.
    fn visible<'s>(verdict: &Verdict<'s>, focus: Option<usize>) -> (Statuses<'s>, Option<usize>) {
        let mut statuses = Statuses::new();
        let at = visible_statuses(verdict, focus, &mut statuses);
        (statuses, at)
    }

    fn names(statuses: &[Status<'_>]) -> Vec<String> {
        statuses.iter().map(|s| s.name.to_string()).collect()
    }

    #[test]
    fn each_limit_says_which_responses_show_it() {
        let admitted = |a: &str, b: &str| {
            let snapshot = two_limits(a, b);
            let mut h = HeaderMap::new();
            add_limit_headers(&mut h, &snapshot, &verdict_of(&snapshot, None), 1);
            let (statuses, _) = visible(&verdict_of(&snapshot, None), None);
            (names(&statuses), h)
        };
        let (shown, h) = admitted("all", "all");
        assert_eq!(shown, ["a", "b"]);
        assert_eq!(h.len(), 5);
        let (shown, h) = admitted("refusals", "all");
        assert_eq!(shown, ["b"]);
        assert_eq!(h["ratelimit-policy"], r#""b";q=5;w=60"#);
        for (a, b) in [("refusals", "refusals"), ("none", "refusals"), ("none", "none")] {
            let (shown, h) = admitted(a, b);
            assert!(shown.is_empty() && h.is_empty(), "{a} {b}: {h:?}");
        }
        // A 429 (of `a`, at 0): every limit but the `none` ones, the trio
        // the refusing limit's...
        let refused = |a: &str, b: &str| {
            let snapshot = two_limits(a, b);
            let (statuses, focus) = visible(&verdict_of(&snapshot, Some(0)), Some(0));
            (names(&statuses), focus)
        };
        assert_eq!(refused("refusals", "refusals"), (vec!["a".into(), "b".into()], Some(0)));
        assert_eq!(refused("all", "none"), (vec!["a".into()], Some(0)));
        assert_eq!(refused("refusals", "none"), (vec!["a".into()], Some(0)));
        // ...and none at all when the refusing limit's are `none`.
        assert_eq!(refused("none", "all"), (vec![], None));
        assert_eq!(refused("none", "refusals"), (vec![], None));
    }

    #[test]
    fn a_limits_policy_item_is_the_one_made_at_load() {
        let snapshot = two_limits("all", "all");
        let (statuses, _) = visible(&verdict_of(&snapshot, None), None);
        let made = snapshot.limits[0].policy.item(10, 60).unwrap();
        assert_eq!(
            statuses[0].policy.map(|v| v.as_bytes().as_ptr()),
            Some(made.as_bytes().as_ptr())
        );
        // A key with another quota than the limit's (a plan's) gets none.
        let mut v = verdict_of(&snapshot, None);
        v.limits[0].quota = 3;
        let (statuses, _) = visible(&v, None);
        assert!(statuses[0].policy.is_none());
    }

    #[test]
    fn statuses_follow_the_source() {
        assert_eq!(RequestError::NoRoute.status(), StatusCode::NOT_FOUND);
        let u = || "backend".to_string();
        assert_eq!(
            RequestError::from(ForwardError::UpstreamUnreachable {
                upstream: u(),
                target: "127.0.0.1:1".into(),
                reason: "refused".into()
            })
            .status(),
            StatusCode::BAD_GATEWAY
        );
        let t = RequestError::from(ForwardError::UpstreamTimeout {
            upstream: u(),
            target: "127.0.0.1:1".into(),
            timeout_ms: 5,
        });
        assert_eq!(t.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(t.source(), Source::Upstream);
        let r = t.to_response();
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        let body = RequestError::from(ForwardError::BadRequestBody {
            reason: "invalid chunk size: overflow".into(),
        });
        assert_eq!(body.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body.source(), Source::Client);
    }
}
