//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`
//! (RLQS): each Envoy reports its buckets' usage on a stream, and each
//! matched bucket gets a token-bucket assignment that is that Envoy's lease
//! of the shared quota ([`super::assign`]), paid to the same store with the
//! same scripts as every other lease, so all streams on all instances add
//! up to at most the limit.
//!
//! A bucket matches its stream's domain by its `bucket_id` entries sorted by
//! key name, under the RLS rules. Every report is answered with renewed
//! assignments sized to the demand it shows: an idle stream's share shrinks
//! to the floor and the quota it no longer pays for goes to the busy ones
//! within a report or two. Unmatched and unlimited buckets get `ALLOW_ALL`;
//! buckets idle for six report intervals get `abandon_action`; when the quota is spent
//! a bucket gets `DENY_ALL` until the next report finds some. A closed
//! stream pays for nothing more, and its demands leave the fair shares at
//! once (their TTL is for an instance that dies), so the other streams get
//! its share at their next report; what it paid for is spent, not given
//! back (Envoy keeps enforcing an assignment until its TTL).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as PbStrategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::assign::{self, Held, Refill};
use super::matcher;
use crate::quota::{Spec, Unspent};
use crate::runtime::Runtime;

/// How long an `ALLOW_ALL` for an unmatched bucket lasts; every report
/// renews it, and a rule added by a reload replaces it at the next one.
const ALLOW_ALL_TTL_SECS: u64 = 60;
/// A bucket that reports no request for this many report intervals is
/// abandoned: Envoy forgets it, and reports it anew when traffic returns.
const IDLE_INTERVALS: u64 = 6;
/// The longest report interval believed (Envoy's are seconds to minutes).
const MAX_INTERVAL_SECS: u64 = 3_600;

/// Most RLQS streams open at once, over every connection; one more is
/// refused `RESOURCE_EXHAUSTED` (an Envoy holds one per filter config).
pub const MAX_STREAMS: usize = 1_000;
/// Most buckets tracked over every stream, paid ones and idle `ALLOW_ALL`
/// ones alike; past it, new buckets get `ALLOW_ALL` (as past
/// [`MAX_BUCKETS_PER_STREAM`]) and are not tracked until some go.
pub const MAX_BUCKETS: usize = 100_000;
/// Largest bucket id, its keys and values together, in bytes: a larger one
/// (a header value an attacker chose, as a rule keyed on it makes) is
/// refused, `DENY_ALL`, and nothing of it is kept.
pub const MAX_BUCKET_ID_BYTES: usize = 4 * 1024;
/// Most bytes of bucket ids one stream holds; past it, new buckets get
/// `ALLOW_ALL` untracked, as past [`MAX_BUCKETS_PER_STREAM`].
pub const MAX_STREAM_ID_BYTES: usize = 1024 * 1024;
/// Most bytes of bucket ids held over every stream.
pub const MAX_ID_BYTES: usize = 64 * 1024 * 1024;

/// Streams and buckets open over the whole service.
#[derive(Default)]
struct Totals {
    streams: AtomicUsize,
    buckets: AtomicUsize,
    /// Bytes of the buckets' ids.
    bytes: AtomicUsize,
}

/// A stream's place in [`Totals`], given back when the stream ends.
struct StreamSlot {
    totals: Arc<Totals>,
    /// This stream's buckets, as counted in the totals.
    buckets: usize,
    /// Their ids' bytes, as counted in the totals.
    bytes: usize,
    /// This stream among the fleet's demands for a bucket
    /// ([`crate::store::FleetTables::fair_share`]).
    id: u64,
}

impl StreamSlot {
    fn take(totals: &Arc<Totals>) -> Option<StreamSlot> {
        let taken = totals.streams.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < MAX_STREAMS).then_some(n + 1)
        });
        taken.is_ok().then(|| StreamSlot {
            totals: totals.clone(),
            buckets: 0,
            bytes: 0,
            // Random: the fleet's streams meet in the store's demands.
            id: fastrand::u64(..),
        })
    }

    /// Buckets and id bytes the other streams hold (as last counted).
    fn others(&self) -> Footprint {
        Footprint {
            buckets: self.totals.buckets.load(Ordering::Relaxed).saturating_sub(self.buckets),
            bytes: self.totals.bytes.load(Ordering::Relaxed).saturating_sub(self.bytes),
        }
    }

    /// Counts this stream's buckets and id bytes as `now`.
    fn count(&mut self, now: Footprint) {
        fn set(total: &AtomicUsize, mine: &mut usize, now: usize) {
            if now >= *mine {
                total.fetch_add(now - *mine, Ordering::Relaxed);
            } else {
                total.fetch_sub(*mine - now, Ordering::Relaxed);
            }
            *mine = now;
        }
        set(&self.totals.buckets, &mut self.buckets, now.buckets);
        set(&self.totals.bytes, &mut self.bytes, now.bytes);
    }
}

/// Buckets tracked, and the bytes of their ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Footprint {
    buckets: usize,
    bytes: usize,
}

impl Footprint {
    /// Whether one more bucket of `size` bytes fits beside `others`.
    fn fits(self, others: Footprint, size: usize) -> bool {
        self.buckets < MAX_BUCKETS_PER_STREAM
            && others.buckets + self.buckets < MAX_BUCKETS
            && self.bytes + size <= MAX_STREAM_ID_BYTES
            && others.bytes + self.bytes + size <= MAX_ID_BYTES
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.count(Footprint::default());
        self.totals.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct QuotaService {
    runtime: Arc<Runtime>,
    totals: Arc<Totals>,
}

impl QuotaService {
    pub fn new(runtime: Arc<Runtime>) -> QuotaService {
        QuotaService {
            runtime,
            totals: Arc::default(),
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let Some(mut slot) = StreamSlot::take(&self.totals) else {
            return Err(Status::resource_exhausted(format!(
                "{MAX_STREAMS} quota streams are open: no more"
            )));
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let runtime = self.runtime.clone();
        tokio::spawn(async move {
            let mut stream = StreamState::default();
            loop {
                let reports = match inbound.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) | Err(_) => break,
                };
                let reply = stream.on_reports(&runtime, reports, &slot).await;
                slot.count(stream.held());
                if !reply.bucket_action.is_empty() && tx.send(Ok(reply)).await.is_err() {
                    break;
                }
            }
            stream.leave(&runtime, &slot).await;
            tracing::debug!(buckets = stream.buckets.len(), "rlqs stream closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One bucket of one stream.
struct Bucket {
    /// The store key its demand was last reported under.
    key: String,
    /// What Envoy holds now, as paid for (`None`: nothing paid, or DENY_ALL).
    held: Option<Held>,
    last_report_ms: u64,
    /// Since when the bucket has reported no request, if it has not.
    idle_since_ms: Option<u64>,
}

#[derive(Default)]
struct StreamState {
    domain: String,
    buckets: HashMap<Entries, Bucket>,
    /// When the last periodic report came (one naming a bucket already
    /// known: Envoy reports a new bucket at once, then all of them on one
    /// timer).
    last_periodic_ms: Option<u64>,
    /// The gap between periodic reports (a stalled one fading out, see
    /// [`next_interval`]): Envoy's
    /// `reporting_interval` for this stream, once two have come.
    interval_ms: Option<u64>,
    /// `ALLOW_ALL` buckets that report no request, and since when.
    allowed_idle_since: HashMap<Entries, u64>,
}

/// The report interval assumed until a stream's own is seen: assignments
/// then outlive a slow timer (Envoy's examples use 1 s to 60 s).
const FIRST_INTERVAL_SECS: u64 = 10;
/// Most buckets one stream may hold state for; beyond, new buckets get
/// `ALLOW_ALL` until some are abandoned.
const MAX_BUCKETS_PER_STREAM: usize = 10_000;

impl StreamState {
    async fn on_reports(
        &mut self,
        runtime: &Arc<Runtime>,
        reports: RateLimitQuotaUsageReports,
        slot: &StreamSlot,
    ) -> RateLimitQuotaResponse {
        let others = slot.others();
        let mut held = self.held();
        if !reports.domain.is_empty() {
            self.domain = reports.domain;
        }
        let now = runtime.limiter.now_ms();
        // Each bucket's entries sorted by key, once: the descriptor it is.
        let usages: Vec<(BucketId, Entries, BucketQuotaUsage)> = reports
            .bucket_quota_usages
            .into_iter()
            .filter_map(|mut u| {
                let id = u.bucket_id.take()?;
                let entries = sorted(&id);
                Some((id, entries, u))
            })
            .collect();
        let known = usages.iter().any(|(_, entries, _)| self.buckets.contains_key(entries));
        if known {
            if let Some(last) = self.last_periodic_ms {
                let gap = now.saturating_sub(last).min(MAX_INTERVAL_SECS * 1_000);
                self.interval_ms = Some(next_interval(self.interval_ms, gap));
            }
            self.last_periodic_ms = Some(now);
        }
        let interval_ms = self.interval_ms.unwrap_or(FIRST_INTERVAL_SECS * 1_000).max(1_000);
        let config = runtime.config();
        let domain = config.rls.as_ref().and_then(|r| r.rules.domains.get(&self.domain));
        let mut actions = Vec::with_capacity(usages.len());
        for (id, entries, usage) in usages {
            let size = id_bytes(&entries);
            if size > MAX_BUCKET_ID_BYTES {
                // Refused, and nothing of it kept: its requests are denied.
                tracing::debug!(
                    bytes = size,
                    "rlqs: a bucket id over {MAX_BUCKET_ID_BYTES} bytes refused"
                );
                actions.push(BucketAction {
                    bucket_id: Some(id),
                    bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                        assignment_time_to_live: Some(secs(ALLOW_ALL_TTL_SECS)),
                        rate_limit_strategy: Some(blanket(BlanketRule::DenyAll)),
                    })),
                });
                continue;
            }
            let borrowed: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let matched = domain.and_then(|d| matcher::find(d, &borrowed));
            let known = self.buckets.contains_key(&entries) || self.allowed_idle_since.contains_key(&entries);
            // A new bucket is counted as held here, whether it ends up
            // paid or idle-allowed (over-counting one that is neither
            // until the report's end, when `held` is counted again).
            let room = known || held.fits(others, size);
            if room && !known {
                held.buckets += 1;
                held.bytes += size;
            }
            let action = match matched {
                Some(m) if !m.limit.unlimited && room => {
                    let key = matcher::store_key(&self.domain, &borrowed, m.shared_pattern);
                    let spec = m.limit.spec().slice(runtime.share());
                    self.assign(runtime, entries, &usage, (&key, &spec), interval_ms, slot)
                        .await
                }
                // No rule, or an unlimited one: Envoy allows all. What the
                // bucket held is forgotten, so a rule that comes back (a
                // reload) starts it as the new bucket Envoy will make.
                _ => {
                    self.buckets.remove(&entries);
                    let used = usage.num_requests_allowed.saturating_add(usage.num_requests_denied);
                    if self.idle_allowed(entries, used, now, interval_ms, room) {
                        Some(Action::AbandonAction(AbandonAction {}))
                    } else {
                        Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                            assignment_time_to_live: Some(secs(ALLOW_ALL_TTL_SECS)),
                            rate_limit_strategy: Some(blanket(BlanketRule::AllowAll)),
                        }))
                    }
                }
            };
            if let Some(action) = action {
                actions.push(BucketAction {
                    bucket_id: Some(id),
                    bucket_action: Some(action),
                });
            }
        }
        RateLimitQuotaResponse { bucket_action: actions }
    }

    /// Takes the ended stream's demands out of its buckets' fair shares,
    /// one store call per bucket, so the streams left get the whole rate
    /// at their next report. A store out of reach keeps a demand until its
    /// TTL, as it would for an instance that died.
    async fn leave(&self, runtime: &Runtime, slot: &StreamSlot) {
        for bucket in self.buckets.values() {
            let gone = crate::store::Demand::leave(&bucket.key, slot.id);
            if let Err(e) = runtime.limiter.keyed().fair_share(gone).await {
                tracing::debug!(key = %bucket.key, error = %e, "rlqs: a closed stream's demand stays until its TTL");
            }
        }
    }

    /// Buckets this stream tracks, paid and idle-allowed, and their ids'
    /// bytes.
    fn held(&self) -> Footprint {
        let ids = self.buckets.keys().chain(self.allowed_idle_since.keys());
        Footprint {
            buckets: self.buckets.len() + self.allowed_idle_since.len(),
            bytes: ids.map(id_bytes).sum(),
        }
    }

    /// Whether an `ALLOW_ALL` bucket has been idle for long enough to be
    /// abandoned (then forgotten); a new one is tracked only with `room`
    /// (within the stream's and the service's caps), else it is allowed
    /// untracked.
    fn idle_allowed(&mut self, entries: Entries, used: u64, now: u64, interval_ms: u64, room: bool) -> bool {
        if used > 0 {
            self.allowed_idle_since.remove(&entries);
            return false;
        }
        if !self.allowed_idle_since.contains_key(&entries) && !room {
            return false;
        }
        let since = *self.allowed_idle_since.entry(entries.clone()).or_insert(now);
        if now.saturating_sub(since) >= IDLE_INTERVALS * interval_ms {
            self.allowed_idle_since.remove(&entries);
            return true;
        }
        false
    }

    /// The assignment for one matched bucket, paid to the store; `None`
    /// when the store failed (Envoy keeps what it has until it expires,
    /// then its `expired_assignment_behavior` decides).
    async fn assign(
        &mut self,
        runtime: &Arc<Runtime>,
        entries: Entries,
        usage: &BucketQuotaUsage,
        (key, spec): (&str, &Spec),
        interval_ms: u64,
        slot: &StreamSlot,
    ) -> Option<Action> {
        let now = runtime.limiter.now_ms();
        let bucket = self.buckets.entry(entries.clone()).or_insert_with(|| Bucket {
            key: key.to_string(),
            held: None,
            last_report_ms: now,
            idle_since_ms: None,
        });
        if bucket.key != key {
            // A reload moved the bucket: its old demand goes with its TTL.
            bucket.key = key.to_string();
        }
        let used = usage.num_requests_allowed.saturating_add(usage.num_requests_denied);
        // Envoy sends whole seconds and may send 0: our own clock then.
        // A client's number: clamped before any arithmetic.
        let reported = usage.time_elapsed.map_or(0, |d| {
            u64::try_from(d.seconds).unwrap_or(0).min(MAX_INTERVAL_SECS) * 1_000
        });
        let since = now.saturating_sub(bucket.last_report_ms);
        let elapsed_ms = if reported > 0 { reported } else { since }.max(1_000);
        bucket.last_report_ms = now;
        if used == 0 {
            let idle_since = *bucket.idle_since_ms.get_or_insert(now);
            if now.saturating_sub(idle_since) >= IDLE_INTERVALS * interval_ms {
                self.buckets.remove(&entries);
                return Some(Action::AbandonAction(AbandonAction {}));
            }
        } else {
            bucket.idle_since_ms = None;
        }
        let demand = used as f64 * 1_000.0 / elapsed_ms as f64;
        // An expired bucket is still owed the fills it had before it ended.
        let held = bucket.held;
        let live = held.filter(|h| h.expires_ms > now).map(|h| h.refill);
        // Up to this stream's fair share beside the others that want the
        // bucket (heard within two of their reports), through the store.
        // Without an answer the store will most likely not pay for an
        // assignment either: the limit's rate bounds it then.
        let wanted = demand * assign::HEADROOM;
        let rate = assign::limit_rate(spec);
        let milli = |x: f64| (x * 1_000.0).clamp(0.0, 1e15) as u64;
        let demand_of_stream = crate::store::Demand {
            key,
            member: slot.id,
            demand: milli(wanted),
            rate: milli(rate),
            ttl_ms: 2 * interval_ms,
        };
        let share = match runtime.limiter.keyed().fair_share(demand_of_stream).await {
            Ok(share) => share as f64 / 1_000.0,
            Err(e) => {
                tracing::debug!(key, error = %e, "rlqs: the fleet's demands are out of reach");
                rate
            }
        };
        let next = assign::strategy_within(demand, spec, live, share);
        let offer = assign::offer(next, held, now, interval_ms);
        let limiter = &runtime.limiter;
        let grant = match limiter.keyed().acquire_direct(key, spec, offer.cost).await {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(key, error = %e, "rlqs: the store failed; the assignment is not renewed");
                return None;
            }
        };
        let sent = if grant.granted >= offer.cost {
            Some(offer)
        } else {
            let (sent, back) = assign::within_grant(offer, held, now, interval_ms, grant.granted);
            limiter.keyed().give_back_later(
                key,
                spec,
                Unspent {
                    tokens: back,
                    window_ms: grant.window_ms,
                    ..Unspent::default()
                },
            );
            sent
        };
        bucket.held = sent.map(|o| o.held);
        Some(Action::QuotaAssignmentAction(match sent {
            Some(o) => QuotaAssignmentAction {
                assignment_time_to_live: Some(secs(o.ttl_secs(now))),
                rate_limit_strategy: Some(token_bucket(o.held.refill)),
            },
            // The quota is spent: deny until a report finds some.
            None => QuotaAssignmentAction {
                assignment_time_to_live: Some(secs((2 * interval_ms).div_ceil(1_000))),
                rate_limit_strategy: Some(blanket(BlanketRule::DenyAll)),
            },
        }))
    }
}

/// The report interval learned so far, after a report `gap` ms after the
/// last: never below the latest gap (each report pays the fills up to the
/// next, so an interval shorter than Envoy's would leave tokens unpaid),
/// but a stalled report's long gap fades by a quarter a report instead of
/// ruling the stream (paying up to an hour of fills at once) for good.
fn next_interval(learned: Option<u64>, gap: u64) -> u64 {
    learned.map_or(gap, |i| (i - i / 4).max(gap))
}

fn secs(s: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(s.max(1)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

fn blanket(rule: BlanketRule) -> RateLimitStrategy {
    RateLimitStrategy {
        strategy: Some(PbStrategy::BlanketRule(rule as i32)),
    }
}

fn token_bucket(s: Refill) -> RateLimitStrategy {
    let tokens = u32::try_from(s.tokens).unwrap_or(u32::MAX);
    RateLimitStrategy {
        strategy: Some(PbStrategy::TokenBucket(TokenBucket {
            max_tokens: tokens,
            tokens_per_fill: Some(UInt32Value { value: tokens }),
            fill_interval: Some(secs(s.fill_secs)),
        })),
    }
}

/// A bucket id's entries sorted by key name: the descriptor it is matched as.
type Entries = Vec<(String, String)>;

/// The bytes of a bucket id: its keys and values.
fn id_bytes(entries: &Entries) -> usize {
    entries.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// `id`'s [`Entries`].
fn sorted(id: &BucketId) -> Entries {
    let mut entries: Entries = id.bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    entries.sort();
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_buckets_are_capped_over_the_whole_service() {
        let totals = Arc::new(Totals::default());
        let mut slots: Vec<StreamSlot> = (0..MAX_STREAMS).map(|_| StreamSlot::take(&totals).unwrap()).collect();
        assert!(StreamSlot::take(&totals).is_none(), "one stream past the cap");
        // Buckets: one stream's count moves the total both ways.
        let n = |buckets: usize| Footprint {
            buckets,
            bytes: buckets * 10,
        };
        slots[0].count(n(MAX_BUCKETS - 10));
        slots[1].count(n(5));
        assert_eq!(slots[1].others(), n(MAX_BUCKETS - 10));
        assert_eq!(slots[0].others(), n(5));
        slots[1].count(n(2));
        assert_eq!(totals.buckets.load(Ordering::Relaxed), MAX_BUCKETS - 8);
        assert_eq!(totals.bytes.load(Ordering::Relaxed), (MAX_BUCKETS - 8) * 10);
        // The caps: buckets per stream and over all, bytes per stream and
        // over all.
        assert!(n(2).fits(n(MAX_BUCKETS - 10), 10));
        assert!(!n(8).fits(n(MAX_BUCKETS - 8), 10));
        assert!(!n(MAX_BUCKETS_PER_STREAM).fits(n(0), 10));
        let bytes = |bytes: usize| Footprint { buckets: 1, bytes };
        assert!(bytes(MAX_STREAM_ID_BYTES - 10).fits(bytes(0), 10));
        assert!(!bytes(MAX_STREAM_ID_BYTES - 9).fits(bytes(0), 10));
        assert!(!bytes(0).fits(bytes(MAX_ID_BYTES), 1));
        // A stream that ends gives back its place and its buckets.
        drop(slots.swap_remove(0));
        assert_eq!(totals.buckets.load(Ordering::Relaxed), 2);
        assert!(StreamSlot::take(&totals).is_some());
        drop(slots);
        assert_eq!(totals.streams.load(Ordering::Relaxed), 0);
        assert_eq!(totals.buckets.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_learned_interval_follows_reports_and_forgets_a_stall() {
        assert_eq!(next_interval(None, 5_000), 5_000);
        // A later, longer gap is taken at once: fills are paid up to it.
        assert_eq!(next_interval(Some(5_000), 7_000), 7_000);
        // One stalled report, then on-time ones: back to 5 s, never below.
        let mut i = next_interval(Some(5_000), 3_600_000);
        let mut reports = 0;
        while i > 5_000 {
            i = next_interval(Some(i), 5_000);
            reports += 1;
        }
        assert_eq!(i, 5_000);
        assert!(reports < 30, "{reports} reports to forget a stall");
    }
}
