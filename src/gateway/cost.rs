//! Costs on the request path: what a request reserves under its limits
//! with a `cost` (its JSON body read first when a reserve needs it), and
//! the watch on its response that reads the real cost as the body streams
//! to the client and settles the reserve once it has ended.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};

use super::budget::Caps;
use super::priced_body;
use super::respond::RequestError;
use super::routed::{Estimates, Routed, Served};
use super::Gateway;
use crate::limit::cost::meter::{Meter, Unsettled};
use crate::limit::cost::rewrite::UsageFilter;
use crate::limit::cost::{api, Reserve, Reserves, Settle, Settlement, Settlements};
use crate::limit::slots::Held;
use crate::limit::{LimitRef, LimitRuntime, Limiter};
use crate::proxy::body::{Body, Ended, Rewrite, Watch};
use crate::proxy::request_body::RequestBody;
use crate::route::Action;
use crate::runtime::{Applying, Snapshot};
use crate::telemetry::metrics::{Metrics, UnsettledLabels};

/// What a request's limits with a `cost` need before its decision.
#[derive(Debug, Default)]
pub(super) struct Priced<'a> {
    /// The limits with a cost that apply to it.
    pub limits: smallvec::SmallVec<[LimitRef<'a>; 2]>,
    /// One of them reserves from the JSON request body.
    pub needs_body: bool,
    /// One of them settles by the request body's bytes: counted as it
    /// goes upstream.
    pub request_bytes: Option<Arc<AtomicU64>>,
    /// One of them reads the response body's JSON: it must come
    /// uncompressed.
    pub reads_json: bool,
}

/// What a request's limits with a cost make of it before its decision.
#[derive(Debug, Default)]
pub(super) struct Pricing {
    pub costs: Reserves,
    pub estimates: Estimates,
    /// A preset asks the upstream for the stream's usage the client did
    /// not ask for: the request body is rewritten, and the usage chunk
    /// removed from the response.
    pub add_usage: bool,
}

/// The limits with a `cost` among a request's `limits` (its route's that
/// apply to its tier); `None` (no allocation) for a request with none.
pub(super) fn priced<'a>(limits: &Applying<'a>) -> Option<Priced<'a>> {
    if !limits.iter().any(|l| l.config.cost.is_some()) {
        return None;
    }
    let mut p = Priced::default();
    for &limit in limits {
        let Some(cost) = limit.get().config.cost.as_ref() else {
            continue;
        };
        p.needs_body |= cost.reserve.needs_body();
        p.reads_json |= cost.settle.as_ref().is_some_and(Settle::reads_json);
        if cost.settle == Some(Settle::RequestBytes) && p.request_bytes.is_none() {
            p.request_bytes = Some(Arc::new(AtomicU64::new(0)));
        }
        p.limits.push(limit);
    }
    Some(p)
}

/// Each priced limit's reserve for a request for `path` with `headers`
/// and (when one needs it) `body`, at most the limit's capacity for the
/// caller; with what a preset read of it.
pub(super) fn reserves(
    priced: &Priced<'_>,
    path: &str,
    headers: &HeaderMap,
    body: Option<&[u8]>,
) -> Result<Pricing, RequestError> {
    let mut out = Pricing::default();
    let len = body.map_or(0, |b| b.len() as u64);
    for &limit in &priced.limits {
        let Some(cost) = &limit.get().config.cost else { continue };
        let capacity = limit.spec.capacity;
        let (n, prompt) = match &cost.reserve {
            Reserve::Api(a) => match a.endpoint(path) {
                Some(endpoint) => {
                    let r = api::read_request(*a, endpoint, body, len, cost.reserve_default);
                    out.add_usage |= r.add_usage;
                    (r.reserve.clamp(1, capacity.max(1)), Some(r.prompt))
                }
                None => (1, None),
            },
            reserve => {
                let n = reserve.of_request(headers, body, cost.reserve_default, capacity)?;
                // A preset whose reserve is written out still prices only
                // the endpoints it knows.
                let prompt = match cost.api {
                    Some(a) if a.endpoint(path).is_none() => None,
                    _ => Some(len.div_ceil(api::BYTES_PER_TOKEN)),
                };
                (n, prompt)
            }
        };
        out.costs.push((limit.to_arc(), n));
        out.estimates.push((limit.to_arc(), prompt));
    }
    Ok(out)
}

/// A priced body's `Content-Encoding` (other than identity): its bytes
/// are not what the upstream reads, so it is refused (415) rather than
/// priced as unreadable.
fn encoded(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(http::header::CONTENT_ENCODING)?;
    let text = v.to_str().unwrap_or("?").trim();
    (!text.is_empty() && !text.eq_ignore_ascii_case("identity")).then(|| text.chars().take(32).collect())
}

/// The upstream is asked for an uncompressed response (`Accept-Encoding`
/// removed: identity is always acceptable): a `json:` settle reads the
/// body's text as it passes.
pub(super) fn uncompressed(headers: &mut HeaderMap) {
    headers.remove(http::header::ACCEPT_ENCODING);
}

impl Gateway {
    /// A request priced by its JSON body: the body read (bounded), the
    /// reserves taken from it, then decided and served.
    pub(super) async fn priced_by_body<'a>(&'a self, mut routed: Routed<'a>, priced: Priced<'a>) -> Served<'a> {
        let (parts, body) = routed.take_request().into_parts();
        let snapshot = routed.snapshot;
        // A client an identity-free limit (its address's, its network's)
        // refuses now is refused before its body is read.
        if let Some((mut refusal, record)) =
            self.refused_before_identity(snapshot, routed.route, &parts.headers, routed.conn)
        {
            routed.request_id.stamp(refusal.headers_mut());
            return Served::Now(refusal, record);
        }
        let id = &snapshot.config.identity;
        let mut share = self
            .priced_bodies
            .share(routed.identity.client_ip, id.ipv4_prefix, id.ipv6_prefix);
        let (idle, total) = match &routed.route.action {
            Action::Forward(u) => (u.idle_timeout, u.request_timeout),
            Action::Respond(_) | Action::Usage(_) => {
                let idle = snapshot.config.gateway.idle_timeout;
                (idle, idle)
            }
        };
        let max = snapshot.config.gateway.max_cost_body_bytes;
        let bounds = priced_body::Bounds {
            max,
            idle,
            total,
            min_rate: snapshot.config.gateway.min_body_rate,
            caps: Caps::for_bodies_of(max),
        };
        let read = match encoded(&parts.headers) {
            Some(encoding) => Err(RequestError::BodyEncoded(encoding)),
            None => priced_body::read(&parts.headers, body, bounds, &mut share).await,
        };
        let path = parts.uri.path();
        let priced_read =
            read.and_then(|bytes| reserves(&priced, path, &parts.headers, Some(&bytes)).map(|p| (bytes, p)));
        match priced_read {
            Ok((mut bytes, pricing)) => {
                let mut parts = parts;
                if pricing.add_usage {
                    if let Some(asked) = crate::limit::cost::rewrite::ask_usage(&bytes) {
                        bytes = Bytes::from(asked);
                        parts
                            .headers
                            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(bytes.len()));
                        routed.hide_usage = true;
                    }
                }
                if let Some(n) = &routed.request_bytes {
                    n.store(bytes.len() as u64, std::sync::atomic::Ordering::Release);
                }
                routed.req = Request::from_parts(parts, RequestBody::read(bytes, Some(Box::new(share))));
                routed.costs = pricing.costs;
                routed.estimates = pricing.estimates;
                self.limited(&mut routed)
            }
            Err(e) => {
                let resp = self.finish(routed.snapshot, Some(routed.route), Err(e), routed.request_id, None);
                Served::Now(resp, routed.record)
            }
        }
    }
}

/// What a response's body holds until it ends: in-flight slots, and the
/// reserves to settle from what it says it cost.
pub(super) struct Watcher {
    held: Vec<Held>,
    /// Each limit that settles: its meter, its reserve, the limit (for its
    /// name and its rules, should the cost never come), and the prompt
    /// estimate an unsettled cost's estimate starts from (`None`: a
    /// request its preset does not price, whose reserve stands).
    settling: smallvec::SmallVec<[Settling; 1]>,
    limiter: Arc<Limiter>,
    metrics: Arc<Metrics>,
    /// The response was an upstream's error (status 400 or more): a cost
    /// it did not send is the upstream's failure, not a missing field, and
    /// costs what the limit's `errors` says.
    failed: bool,
    /// What each settled limit was charged, for the access log.
    charged: smallvec::SmallVec<[(Arc<LimitRuntime>, u64); 1]>,
}

/// One limit's part of a [`Watcher`]: its meter, its reserve (which names
/// the limit), and the prompt estimate.
type Settling = (Meter, Settlement, Option<u64>);

impl Watcher {
    /// `resp`'s body watched when it holds slots or reserves to settle.
    /// In place: most responses have neither, and one passed through by
    /// value was copied in and out for nothing.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn watch(
        resp: &mut Response<Body>,
        held: Vec<Held>,
        settlements: Settlements,
        estimates: &Estimates,
        snapshot: &Snapshot,
        limiter: &Arc<Limiter>,
        metrics: &Arc<Metrics>,
        request_bytes: Option<&Arc<AtomicU64>>,
    ) {
        if held.is_empty() && settlements.is_empty() {
            return;
        }
        let max_body = snapshot.config.gateway.max_cost_body_bytes;
        let mut settling = smallvec::SmallVec::new();
        for s in settlements {
            let Some(cost) = s.limit.config.cost.as_ref() else {
                continue;
            };
            let Some(rule) = cost.settle.as_ref() else { continue };
            let prompt = estimates
                .iter()
                .find(|(l, _)| Arc::ptr_eq(l, &s.limit))
                .and_then(|(_, p)| *p);
            let estimate = prompt.is_some() && cost.unsettled == crate::limit::cost::OnUnsettled::Estimate;
            let meter = Meter::new(rule, resp.headers(), request_bytes.cloned(), max_body, estimate);
            settling.push((meter, s, prompt));
        }
        let watcher = Watcher {
            held,
            settling,
            limiter: limiter.clone(),
            metrics: metrics.clone(),
            failed: resp.status().as_u16() >= 400,
            charged: smallvec::SmallVec::new(),
        };
        let body = std::mem::replace(resp.body_mut(), Body::empty());
        *resp.body_mut() = Body::watched(body, Box::new(watcher));
    }
}

impl Watch for Watcher {
    fn charged(&self) -> &[(Arc<LimitRuntime>, u64)] {
        &self.charged
    }

    fn frame(&mut self, frame: &http_body::Frame<Bytes>) {
        for (meter, _, _) in &mut self.settling {
            if let Some(data) = frame.data_ref() {
                meter.data(data);
            } else if let Some(trailers) = frame.trailers_ref() {
                meter.trailers(trailers);
            }
        }
    }

    fn end(&mut self, how: Ended) {
        // In flight no more.
        self.held.clear();
        for (meter, s, prompt) in self.settling.drain(..) {
            let limit = &s.limit;
            let cut = matches!(how, Ended::Failed | Ended::Dropped);
            let seen = meter.seen();
            let content = meter.content();
            let outcome = if cut { Err(Unsettled::Cut) } else { meter.finish() };
            match outcome {
                Ok(cost) => {
                    self.limiter.settle(&s, cost);
                    self.charged.push((s.limit.clone(), cost));
                }
                Err(Unsettled::Missing | Unsettled::TooLarge) if self.failed => {
                    // An error that reports no usage served nothing.
                    if errors_are_free(limit) {
                        self.limiter.settle(&s, 0);
                        self.charged.push((s.limit.clone(), 0));
                    }
                    unsettled(&self.metrics, &limit.config.name, Unsettled::UpstreamStatus);
                }
                Err(why) => {
                    // Cut, missing or oversized: charged by the limit's
                    // `unsettled` rule, never less than the reserve or what
                    // the response showed before it was cut (a client
                    // cannot make a completion free by hanging up).
                    let rule = match (prompt, limit.config.cost.as_ref()) {
                        (Some(_), Some(c)) => c.unsettled,
                        _ => crate::limit::cost::OnUnsettled::Reserve,
                    };
                    let estimate = prompt
                        .unwrap_or(0)
                        .saturating_add(content.div_ceil(api::BYTES_PER_TOKEN));
                    let cost = rule.charge(s.reserve, seen, estimate);
                    if cost != s.reserve {
                        self.limiter.settle(&s, cost);
                    }
                    self.charged.push((s.limit.clone(), cost));
                    unsettled(&self.metrics, &limit.config.name, why);
                }
            }
        }
    }
}

/// A `text/event-stream` to a client that did not ask for its usage, with
/// the usage chunk the preset asked for in its name removed.
impl Rewrite for UsageFilter {
    fn data(&mut self, chunk: Bytes) -> Bytes {
        self.push(chunk)
    }

    fn end(&mut self) -> Bytes {
        self.finish()
    }
}

/// `resp` with the usage chunk removed from its stream, when the preset
/// asked the upstream for it: a successful event stream. The bytes change,
/// so a `Content-Length` goes.
pub(super) fn hide_usage(resp: &mut Response<Body>, max: usize) {
    let streams =
        crate::limit::cost::meter::stream_kind(resp.headers()) == Some(crate::limit::cost::meter::Stream::Sse);
    if !streams || !resp.status().is_success() {
        return;
    }
    resp.headers_mut().remove(http::header::CONTENT_LENGTH);
    let body = std::mem::replace(resp.body_mut(), Body::empty());
    *resp.body_mut() = Body::rewritten(body, Box::new(UsageFilter::new(max)));
}

/// Whether `limit`'s cost makes an upstream's failure free (`errors =
/// "free"`, the default).
pub(super) fn errors_are_free(limit: &LimitRuntime) -> bool {
    limit
        .config
        .cost
        .as_ref()
        .is_some_and(|c| c.errors == crate::limit::cost::OnError::Free)
}

/// One more response whose cost under `limit` never arrived.
pub(super) fn unsettled(metrics: &Metrics, limit: &str, why: Unsettled) {
    metrics
        .cost_unsettled
        .get_or_create(&UnsettledLabels {
            limit: limit.to_string(),
            reason: why.reason(),
        })
        .inc();
}
