//! The Prometheus registry and the names of every metric.
//!
//! Labels are bounded: listener kinds, reasons and configured names only,
//! never a client key or identity.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// `leasegate_rls_requests_total`: a configured domain (or `unknown`, so a
/// client cannot grow the series), and `OK` or `OVER_LIMIT`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RlsLabels {
    pub domain: String,
    pub code: &'static str,
}

/// The gateway's own `[region] name`: one series per gateway.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegionLabels {
    pub region: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamErrorLabels {
    pub upstream: String,
    pub kind: &'static str,
}

/// `leasegate_upstream_tls_handshake_failures`: by upstream and a bounded
/// reason (`unknown_ca`, `bad_name`, `expired`, `alert`, `alpn`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamTlsLabels {
    pub upstream: String,
    pub reason: &'static str,
}

/// `leasegate_upstream_target_up`: one series per target of each upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamTargetLabels {
    pub upstream: String,
    pub target: String,
}

/// `leasegate_upstream_target_errors`: by target and a bounded kind
/// ([`TARGET_ERROR_KINDS`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamTargetErrorLabels {
    pub upstream: String,
    pub target: String,
    pub kind: &'static str,
}

/// The kinds of `leasegate_upstream_target_errors`: no connection, no
/// answer in time, a broken exchange, a `502`/`503`/`504` answer.
pub const TARGET_ERROR_KINDS: [&str; 4] = ["unreachable", "timeout", "failed", "status"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub limit: String,
    pub outcome: &'static str,
}

/// `leasegate_queue_wait_seconds`: by limit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: String,
}

/// `leasegate_cost_unsettled_total`: a configured limit, and why the
/// response's cost never arrived.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnsettledLabels {
    pub limit: String,
    pub reason: &'static str,
}

/// Builds a queue-wait histogram: 1 ms to a minute.
#[derive(Clone, Debug, Default)]
pub struct QueueBounds;

impl prometheus_client::metrics::family::MetricConstructor<Histogram> for QueueBounds {
    fn new_metric(&self) -> Histogram {
        Histogram::new([
            0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ])
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreCallLabels {
    pub op: &'static str,
    pub result: &'static str,
}

/// `leasegate_store_call_phase_seconds`: where a Redis call's time went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorePhaseLabels {
    /// `gateway`: in this process (waiting for the Redis I/O thread to send
    /// it, and for the caller to take the reply); `redis`: from sending to
    /// the reply (the network, Redis, the connection's pipeline).
    pub phase: &'static str,
    /// `ok`, `error`, or `timeout` (the caller stopped waiting first).
    pub result: &'static str,
}

/// Builds a store-call histogram with the deadline's bounds.
#[derive(Clone, Debug)]
pub struct StoreCallBounds(Vec<f64>);

impl prometheus_client::metrics::family::MetricConstructor<Histogram> for StoreCallBounds {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// A configured route name, or `none` (no route matched).
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
}

/// A counter striped over cache lines, for counts every request bumps from
/// every worker: a shared atomic would bounce between cores on each
/// increment. Reads (scrapes) add the stripes up.
#[derive(Debug, Default)]
pub struct StripedCounter {
    stripes: std::sync::Arc<[Stripe; STRIPES]>,
}

const STRIPES: usize = 8;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Stripe(std::sync::atomic::AtomicU64);

impl Clone for StripedCounter {
    fn clone(&self) -> Self {
        StripedCounter {
            stripes: self.stripes.clone(),
        }
    }
}

thread_local! {
    static STRIPE: usize = {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % STRIPES
    };
}

impl StripedCounter {
    pub fn inc(&self) {
        let i = STRIPE.with(|s| *s);
        self.stripes[i].0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}

impl prometheus_client::metrics::TypedMetric for StripedCounter {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Counter;
}

impl prometheus_client::encoding::EncodeMetric for StripedCounter {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        <Self as prometheus_client::metrics::TypedMetric>::TYPE
    }
}

/// Upper bounds of request latency buckets, in seconds (+Inf is implied):
/// from a direct response or a refusal (well under a millisecond) to a slow
/// upstream (seconds). Ten bounds: every (route, status) series costs one
/// line per bound.
const LATENCY_BOUNDS: [f64; 10] = [0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10.0];

/// Upper bounds of store call buckets, in seconds: from a loopback Redis
/// (tens of microseconds) up to `deadline`, the last bound. A call that
/// timed out took a little longer than the deadline and lands above it, so
/// `+Inf` minus the deadline's bucket counts the timeouts.
pub fn store_call_bounds(deadline: std::time::Duration) -> Vec<f64> {
    const LADDER: [f64; 19] = [
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 25.0, 60.0,
    ];
    let deadline = deadline.as_secs_f64();
    let mut bounds: Vec<f64> = LADDER.iter().copied().filter(|b| *b < deadline * 0.999).collect();
    bounds.push(deadline);
    bounds
}

/// A latency histogram striped like [`StripedCounter`]: every request
/// observes one, from every worker, without a lock or a shared cache line.
#[derive(Debug, Default, Clone)]
pub struct StripedHistogram {
    stripes: std::sync::Arc<[HistogramStripe; STRIPES]>,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct HistogramStripe {
    /// Per bucket (not cumulative); the last is +Inf.
    buckets: [std::sync::atomic::AtomicU64; LATENCY_BOUNDS.len() + 1],
    sum_nanos: std::sync::atomic::AtomicU64,
}

impl StripedHistogram {
    pub fn observe(&self, elapsed: std::time::Duration) {
        let secs = elapsed.as_secs_f64();
        let bucket = LATENCY_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BOUNDS.len());
        let stripe = &self.stripes[STRIPE.with(|s| *s)];
        stripe.buckets[bucket].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        stripe.sum_nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// (sum in seconds, count, per-bucket counts with their upper bounds).
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut buckets: Vec<(f64, u64)> = LATENCY_BOUNDS.iter().map(|b| (*b, 0)).chain([(f64::MAX, 0)]).collect();
        let mut sum = 0u64;
        for stripe in self.stripes.iter() {
            for (i, b) in stripe.buckets.iter().enumerate() {
                buckets[i].1 += b.load(std::sync::atomic::Ordering::Relaxed);
            }
            sum = sum.saturating_add(stripe.sum_nanos.load(std::sync::atomic::Ordering::Relaxed));
        }
        let count = buckets.iter().map(|b| b.1).sum();
        (sum as f64 / 1e9, count, buckets)
    }
}

impl prometheus_client::metrics::TypedMetric for StripedHistogram {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for StripedHistogram {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        <Self as prometheus_client::metrics::TypedMetric>::TYPE
    }
}

/// Every `reason` of `rate_limit_bypassed_total`, exported from the start.
pub const BYPASS_REASONS: [&str; 3] = ["store_circuit_open", "store_timeout", "store_error"];

/// Statuses whose request metrics a route keeps handles to, so that a
/// request finds them by a short scan, without building labels or taking
/// the family's lock.
const COMMON_STATUSES: [u16; 16] = [
    200, 201, 204, 301, 302, 304, 400, 401, 403, 404, 429, 431, 500, 502, 503, 504,
];

/// One route's request counter and latency histogram per status. A series
/// is made at its route's first request with that status, not before: a
/// fresh gateway exports no request series at all (16 statuses × 11 buckets
/// per route would otherwise be scraped as zeros).
pub struct RouteMetrics {
    route: String,
    common: [std::sync::OnceLock<(StripedCounter, StripedHistogram)>; COMMON_STATUSES.len()],
}

impl RouteMetrics {
    pub fn new(route: &str) -> RouteMetrics {
        RouteMetrics {
            route: route.to_string(),
            common: Default::default(),
        }
    }

    pub fn record(&self, metrics: &Metrics, status: u16, elapsed: std::time::Duration) {
        let labels = || RequestLabels {
            route: self.route.clone(),
            status,
        };
        if let Some(i) = COMMON_STATUSES.iter().position(|s| *s == status) {
            if let Some(slot) = self.common.get(i) {
                let (count, latency) = slot.get_or_init(|| {
                    let labels = labels();
                    (
                        metrics.requests.get_or_create(&labels).clone(),
                        metrics.request_seconds.get_or_create(&labels).clone(),
                    )
                });
                count.inc();
                latency.observe(elapsed);
                return;
            }
        }
        let labels = labels();
        metrics.requests.get_or_create(&labels).inc();
        metrics.request_seconds.get_or_create(&labels).observe(elapsed);
    }
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, StripedCounter>,
    pub request_seconds: Family<RequestLabels, StripedHistogram>,
    pub lease_tokens: Histogram,
    pub connections_open: Gauge,
    pub connections_accepted: Family<ListenerLabels, Counter>,
    /// Connections closed at accept, by why: `per_ip`.
    pub connections_refused: Family<ReasonLabels, Counter>,
    /// Connections closed for being idle (`idle_timeout_ms`).
    pub connections_idle_closed: Counter,
    pub tls_handshake_failures: Family<ReasonLabels, Counter>,
    pub upstream_errors: Family<UpstreamErrorLabels, Counter>,
    /// TLS handshakes with an upstream's target that failed, by reason.
    pub upstream_tls_failures: Family<UpstreamTlsLabels, Counter>,
    /// 1: the target is in its upstream's rotation; 0: ejected.
    pub upstream_target_up: Family<UpstreamTargetLabels, Gauge>,
    /// Requests sent to each target (each attempt: a retry on another
    /// target counts there too).
    pub upstream_target_requests: Family<UpstreamTargetLabels, Counter>,
    /// Attempts on a target that failed, by kind.
    pub upstream_target_errors: Family<UpstreamTargetErrorLabels, Counter>,
    pub decisions: Family<DecisionLabels, StripedCounter>,
    pub bypassed: Family<ReasonLabels, Counter>,
    pub lease_keys: Gauge,
    pub config_reloads: Family<ResultLabels, Counter>,
    pub store_calls: Family<StoreCallLabels, Counter>,
    pub store_call_seconds: Histogram,
    pub store_call_phase_seconds: Family<StorePhaseLabels, Histogram, StoreCallBounds>,
    pub circuit_open: Gauge,
    pub events: Family<ResultLabels, Counter>,
    pub rls_requests: Family<RlsLabels, Counter>,
    /// Born when a region with a primary starts (a gateway without one has
    /// no link to report on).
    pub region_link_up: Family<RegionLabels, Gauge>,
    /// By result: `granted`, `refused`, `error`; born at 0 with the
    /// coordinator.
    pub region_transfers: Family<ResultLabels, Counter>,
    /// How long requests waited in a limit's queue (`queue_ms`), admitted
    /// or refused in the end; a limit's series appears with its first wait.
    pub queue_wait: Family<LimitLabels, Histogram, QueueBounds>,
    /// Responses whose cost never arrived (their reserve stands), by limit
    /// and reason: `missing`, `too_large`, `cut`, `upstream_error`, `upstream_status`.
    pub cost_unsettled: Family<UnsettledLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Metrics for a store with the default 5 ms deadline.
    pub fn new() -> Self {
        Self::with_store_deadline(std::time::Duration::from_millis(5))
    }

    /// Metrics whose store call histogram ends at `deadline` (`[store]
    /// timeout_ms`, fixed at start).
    pub fn with_store_deadline(deadline: std::time::Duration) -> Self {
        let mut registry = Registry::default();
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register("leasegate_build_info", "Build of the running binary", build);
        let connections_open = Gauge::default();
        registry.register(
            "leasegate_connections_open",
            "Client connections open now",
            connections_open.clone(),
        );
        let connections_refused = Family::default();
        registry.register(
            "leasegate_connections_refused",
            "Connections closed at accept, by reason (per_ip: the client address holds max_connections_per_ip)",
            connections_refused.clone(),
        );
        let connections_idle_closed = Counter::default();
        registry.register(
            "leasegate_connections_idle_closed",
            "Connections closed after idle_timeout_ms with nothing in flight",
            connections_idle_closed.clone(),
        );
        let connections_accepted = Family::default();
        registry.register(
            "leasegate_connections_accepted",
            "Client connections accepted, by listener",
            connections_accepted.clone(),
        );
        let tls_handshake_failures = Family::default();
        registry.register(
            "leasegate_tls_handshake_failures",
            "TLS connections dropped before a request, by reason",
            tls_handshake_failures.clone(),
        );
        let upstream_errors = Family::default();
        registry.register(
            "leasegate_upstream_errors",
            "Requests that got no upstream response, by upstream and kind",
            upstream_errors.clone(),
        );
        let upstream_tls_failures = Family::default();
        registry.register(
            "leasegate_upstream_tls_handshake_failures",
            "TLS handshakes with an upstream's target that failed, by upstream and reason",
            upstream_tls_failures.clone(),
        );
        let upstream_target_up = Family::default();
        registry.register(
            "leasegate_upstream_target_up",
            "1 while an upstream's target is in the rotation, 0 while it is ejected or fails its health checks",
            upstream_target_up.clone(),
        );
        let upstream_target_requests = Family::default();
        registry.register(
            "leasegate_upstream_target_requests",
            "Requests sent to each target of an upstream (a retry counts on the target it went to)",
            upstream_target_requests.clone(),
        );
        let upstream_target_errors = Family::default();
        registry.register(
            "leasegate_upstream_target_errors",
            "Requests to a target that failed, by upstream, target and kind (unreachable, timeout, failed, status)",
            upstream_target_errors.clone(),
        );
        let decisions = Family::default();
        registry.register(
            "leasegate_decisions",
            "Rate-limit decisions, by limit and outcome",
            decisions.clone(),
        );
        let bypassed = Family::<ReasonLabels, Counter>::default();
        // Alerts divide by and take increases of these: a series born at
        // its first event would hide that event from `rate` and `increase`.
        for reason in BYPASS_REASONS {
            drop(bypassed.get_or_create(&ReasonLabels { reason }));
        }
        registry.register(
            "rate_limit_bypassed",
            "Requests admitted by a local fallback bucket because the quota store failed, by reason",
            bypassed.clone(),
        );
        let lease_keys = Gauge::default();
        registry.register(
            "leasegate_lease_keys",
            "Keys with a local lease now",
            lease_keys.clone(),
        );
        let config_reloads = Family::<ResultLabels, Counter>::default();
        for result in ["ok", "error"] {
            drop(config_reloads.get_or_create(&ResultLabels { result }));
        }
        registry.register(
            "leasegate_config_reloads",
            "Config reloads, by result",
            config_reloads.clone(),
        );
        let store_calls = Family::default();
        registry.register(
            "leasegate_store_calls",
            "Calls to the quota store, by operation and result",
            store_calls.clone(),
        );
        let store_call_seconds = Histogram::new(store_call_bounds(deadline));
        registry.register(
            "leasegate_store_call_seconds",
            "Duration of quota store calls, as the caller saw them (at most the deadline)",
            store_call_seconds.clone(),
        );
        // Its series appear with the first call of their kind: a fresh
        // scrape stays small, and a memory store never has any.
        let store_call_phase_seconds = Family::new_with_constructor(StoreCallBounds(store_call_bounds(deadline)));
        registry.register(
            "leasegate_store_call_phase_seconds",
            "Redis quota store calls: time spent in this process (gateway) and waiting for Redis (redis), by result",
            store_call_phase_seconds.clone(),
        );
        let circuit_open = Gauge::default();
        registry.register(
            "leasegate_circuit_open",
            "1 while the store circuit breaker is open (no store calls are made), else 0",
            circuit_open.clone(),
        );
        let requests = Family::default();
        registry.register(
            "leasegate_requests",
            "Requests answered, by route and status",
            requests.clone(),
        );
        let request_seconds = Family::default();
        registry.register(
            "leasegate_request_duration_seconds",
            "Time from request head to response head, by route and status",
            request_seconds.clone(),
        );
        let lease_tokens = Histogram::new([1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1_000.0, 5_000.0]);
        registry.register(
            "leasegate_lease_tokens",
            "Tokens the store granted per lease acquire (the lease size)",
            lease_tokens.clone(),
        );
        let events = Family::default();
        registry.register(
            "leasegate_events",
            "Shadow and soft events for the DogStatsD agent, by result (sent, dropped, failed)",
            events.clone(),
        );
        let rls_requests = Family::default();
        registry.register(
            "leasegate_rls_requests",
            "Envoy rate limit service decisions (ShouldRateLimit), by domain and overall code",
            rls_requests.clone(),
        );
        let region_link_up = Family::default();
        registry.register(
            "leasegate_region_link_up",
            "1 while the last exchange with the primary region's link succeeded, else 0",
            region_link_up.clone(),
        );
        let region_transfers = Family::default();
        registry.register(
            "leasegate_region_transfers",
            "Quota transfers this region asked the primary for, by result (granted, refused, error)",
            region_transfers.clone(),
        );
        let queue_wait = Family::new_with_constructor(QueueBounds);
        registry.register(
            "leasegate_queue_wait_seconds",
            "Time requests waited in a limit's queue (queue_ms) before they were admitted or refused, by limit",
            queue_wait.clone(),
        );
        let cost_unsettled = Family::default();
        registry.register(
            "leasegate_cost_unsettled",
            "Responses whose cost never arrived, so their reserve stands, by limit and reason",
            cost_unsettled.clone(),
        );
        Metrics {
            cost_unsettled,
            queue_wait,
            rls_requests,
            region_link_up,
            region_transfers,
            events,
            requests,
            request_seconds,
            lease_tokens,
            store_calls,
            store_call_seconds,
            store_call_phase_seconds,
            circuit_open,
            config_reloads,
            registry,
            connections_open,
            connections_accepted,
            connections_refused,
            connections_idle_closed,
            tls_handshake_failures,
            upstream_errors,
            upstream_tls_failures,
            upstream_target_up,
            upstream_target_requests,
            upstream_target_errors,
            decisions,
            bypassed,
            lease_keys,
        }
    }

    /// OpenMetrics text exposition (Prometheus reads it).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn request_series_appear_at_their_first_request() {
        let m = Metrics::new();
        let routes = ["api", "demo", "none"].map(RouteMetrics::new);
        let fresh = m.encode();
        assert!(lines(&fresh, "leasegate_requests_total").is_empty(), "{fresh}");
        assert!(
            lines(&fresh, "leasegate_request_duration_seconds").is_empty(),
            "{fresh}"
        );
        // What alerts take a rate or an increase of is there at 0.
        for reason in BYPASS_REASONS {
            assert!(
                fresh.contains(&format!("rate_limit_bypassed_total{{reason=\"{reason}\"}} 0\n")),
                "{fresh}"
            );
        }
        for result in ["ok", "error"] {
            assert!(
                fresh.contains(&format!("leasegate_config_reloads_total{{result=\"{result}\"}} 0\n")),
                "{fresh}"
            );
        }
        assert!(fresh.len() < 6_000, "{} bytes:\n{fresh}", fresh.len());

        routes[0].record(&m, 200, Duration::from_micros(300));
        routes[0].record(&m, 200, Duration::from_millis(3));
        routes[1].record(&m, 418, Duration::from_millis(1));
        let text = m.encode();
        let mut requests = lines(&text, "leasegate_requests_total{");
        requests.sort_unstable();
        assert_eq!(
            requests,
            [
                "leasegate_requests_total{route=\"api\",status=\"200\"} 2",
                "leasegate_requests_total{route=\"demo\",status=\"418\"} 1"
            ],
            "{text}"
        );
        let buckets = lines(&text, "leasegate_request_duration_seconds_bucket{");
        assert_eq!(buckets.len(), 2 * (LATENCY_BOUNDS.len() + 1), "{text}");
        assert!(
            text.contains("leasegate_request_duration_seconds_bucket{le=\"0.0005\",route=\"api\",status=\"200\"} 1")
                || text.contains(
                    "leasegate_request_duration_seconds_bucket{route=\"api\",status=\"200\",le=\"0.0005\"} 1"
                ),
            "{text}"
        );
    }

    #[test]
    fn store_call_buckets_run_from_50_microseconds_to_the_deadline() {
        let five = store_call_bounds(Duration::from_millis(5));
        assert_eq!(five, [0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005]);
        let seven = store_call_bounds(Duration::from_millis(7));
        assert_eq!(seven.last(), Some(&0.007));
        assert_eq!(seven.get(seven.len() - 2), Some(&0.005));
        assert_eq!(store_call_bounds(Duration::from_millis(1)).last(), Some(&0.001));
        assert_eq!(store_call_bounds(Duration::from_millis(1)).len(), 5);
        let minute = store_call_bounds(Duration::from_secs(60));
        assert_eq!(minute.last(), Some(&60.0));
        assert!(minute.windows(2).all(|w| w[0] < w[1]), "{minute:?}");
    }
}
