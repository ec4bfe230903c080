//! Envoy's RLQS (`StreamRateLimitQuotas`) against the real binary, from a
//! real gRPC client: what a bucket is assigned, in the whole seconds
//! Envoy's client reads, and a fleet of two instances on one Redis whose
//! assignments stay within the shared quota and follow demand.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::support::redis::Redis;
use crate::support::Gateway;

const YAML: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: a
    value: "1"
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 60, name: nested}
  - key: open
    rate_limit: {unlimited: true}
  - key: shared
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket}
"#;

fn gateway_toml(store: &str) -> String {
    format!(
        r#"
[gateway]
workers = 1

[listeners]
http = "127.0.0.1:0"

{store}

[rls]
listen = "127.0.0.1:0"
config = "ratelimit.yaml"

[[routes]]
name = "all"
path_prefix = "/"
response = {{ status = 200, body = "ok" }}
"#
    )
}

/// One Envoy's RLQS stream.
struct Envoy {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

/// A bucket id as a map key: its entries, sorted.
type Key = Vec<(String, String)>;

fn k(id: &BucketId) -> Key {
    let mut entries: Key = id.bucket.clone().into_iter().collect();
    entries.sort();
    entries
}

impl Envoy {
    async fn connect(gw: &Gateway) -> Envoy {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", gw.addr("rls")))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(8);
        let rx = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Envoy { tx, rx }
    }

    /// Reports `(bucket, allowed, denied)` over `elapsed` seconds; the
    /// server's answer, by bucket.
    async fn report(&mut self, usages: &[(BucketId, u64, u64)], elapsed: i64) -> HashMap<Key, Action> {
        let reports = RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: usages
                .iter()
                .map(|(id, allowed, denied)| BucketQuotaUsage {
                    bucket_id: Some(id.clone()),
                    time_elapsed: Some(PbDuration {
                        seconds: elapsed,
                        nanos: 0,
                    }),
                    num_requests_allowed: *allowed,
                    num_requests_denied: *denied,
                })
                .collect(),
        };
        self.tx.send(reports).await.unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(5), self.rx.message())
            .await
            .expect("an answer to every report")
            .unwrap()
            .unwrap();
        reply
            .bucket_action
            .into_iter()
            .map(|a| (k(&a.bucket_id.unwrap()), a.bucket_action.unwrap()))
            .collect()
    }
}

/// A token bucket's (tokens per fill, fill seconds, ttl seconds), checking
/// the shape Envoy's client needs: whole seconds ≥ 1, max_tokens equal to
/// the fill.
fn token_bucket(a: &Action) -> Option<(u64, u64, u64)> {
    let Action::QuotaAssignmentAction(q) = a else {
        return None;
    };
    let ttl = q.assignment_time_to_live.unwrap();
    assert!(ttl.seconds >= 1 && ttl.nanos == 0, "{ttl:?}");
    match q.rate_limit_strategy.as_ref().unwrap().strategy.as_ref().unwrap() {
        Strategy::TokenBucket(tb) => {
            let fill = tb.fill_interval.unwrap();
            assert!(fill.seconds >= 1 && fill.nanos == 0, "{fill:?}");
            let per_fill = tb.tokens_per_fill.unwrap().value;
            assert_eq!(tb.max_tokens, per_fill);
            assert!(per_fill >= 1);
            Some((u64::from(per_fill), fill.seconds as u64, ttl.seconds as u64))
        }
        _ => None,
    }
}

fn blanket(a: &Action) -> Option<BlanketRule> {
    match a {
        Action::QuotaAssignmentAction(q) => match q.rate_limit_strategy.as_ref()?.strategy.as_ref()? {
            Strategy::BlanketRule(r) => BlanketRule::try_from(*r).ok(),
            _ => None,
        },
        Action::AbandonAction(_) => None,
    }
}

#[tokio::test]
async fn buckets_get_token_buckets_in_whole_seconds_and_unmatched_ones_allow_all() {
    let gw = Gateway::start_with(&gateway_toml(""), &[("ratelimit.yaml", YAML)]);
    let mut envoy = Envoy::connect(&gw).await;
    let acme = bucket(&[("tenant", "acme")]);
    // Entries are matched sorted by key name, whatever the map's order.
    let nested = bucket(&[("b", "x"), ("a", "1")]);
    let other = bucket(&[("path", "/x")]);
    let open = bucket(&[("open", "y")]);
    let answer = envoy
        .report(
            &[
                (acme.clone(), 1, 0),
                (nested.clone(), 1, 0),
                (other.clone(), 1, 0),
                (open.clone(), 1, 0),
            ],
            0,
        )
        .await;
    let (tokens, fill, ttl) = token_bucket(&answer[&k(&acme)]).expect("a token bucket for a matched bucket");
    assert!(tokens / fill <= 100, "within the limit's rate: {tokens}/{fill}s");
    // Before the stream's report interval is known, an assignment outlives
    // a slow timer: two intervals of 10 s.
    assert_eq!(ttl, 20, "outlives the next report");
    // 60 per minute: one per second at most.
    let (tokens, fill, _) = token_bucket(&answer[&k(&nested)]).expect("the nested rule matched");
    assert!(tokens as f64 / fill as f64 <= 1.0, "{tokens}/{fill}s");
    assert_eq!(blanket(&answer[&k(&other)]), Some(BlanketRule::AllowAll));
    assert_eq!(blanket(&answer[&k(&open)]), Some(BlanketRule::AllowAll), "unlimited");
}

#[tokio::test]
async fn a_fleet_on_one_redis_stays_within_the_quota_and_follows_demand() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 50\n",
        redis.url()
    );
    let a = Gateway::start_with(&gateway_toml(&store), &[("ratelimit.yaml", YAML)]);
    let b = Gateway::start_with(&gateway_toml(&store), &[("ratelimit.yaml", YAML)]);
    let (mut ea, mut eb) = (Envoy::connect(&a).await, Envoy::connect(&b).await);
    let acme = bucket(&[("tenant", "acme")]);
    // Both busy, each asking for more than the whole limit (100/s). The
    // first reports learn the interval (until then assignments are paid
    // ten seconds ahead, so they start small).
    let mut rates = Vec::new();
    let second = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    for round in 0..7 {
        let before = second();
        let ra = ea.report(&[(acme.clone(), 150, 150)], 1).await;
        let rb = eb.report(&[(acme.clone(), 150, 150)], 1).await;
        let same_window = before == second();
        let ta = token_bucket(&ra[&k(&acme)]);
        let tb = token_bucket(&rb[&k(&acme)]);
        let rate = |t: Option<(u64, u64, u64)>| t.map_or(0.0, |(k, f, _)| k as f64 / f as f64);
        let sum = rate(ta) + rate(tb);
        println!("round {round}: a {ta:?} b {tb:?} (sum {sum}/s)");
        // Reports paid within one second's window share its 100.
        if same_window {
            assert!(sum <= 100.0, "round {round}: {ta:?} + {tb:?} exceed 100/s");
        }
        rates.push((rate(ta), rate(tb)));
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    let busy: f64 = rates.iter().skip(3).map(|(x, y)| x + y).sum::<f64>() / 4.0;
    assert!(busy >= 40.0, "busy streams use the quota: {rates:?}");
    // a goes idle; b stays busy: a's share flows to b within a few reports.
    let mut last = (0.0, 0.0);
    for round in 0..6 {
        let ra = ea.report(&[(acme.clone(), 0, 0)], 1).await;
        let rb = eb.report(&[(acme.clone(), 150, 150)], 1).await;
        let rate = |t: Option<(u64, u64, u64)>| t.map_or(0.0, |(k, f, _)| k as f64 / f as f64);
        last = (rate(token_bucket(&ra[&k(&acme)])), rate(token_bucket(&rb[&k(&acme)])));
        println!("idle round {round}: a {:?} b {:?}", ra[&k(&acme)], last.1);
        assert!(last.0 + last.1 <= 100.0, "{last:?}");
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    assert!(last.0 <= 2.0, "the idle stream keeps the floor only: {last:?}");
    assert!(last.1 >= 80.0, "the busy one has the rest: {last:?}");

    // A token bucket refills continuously, so two busy streams that report
    // at different moments each find part of it: both get a share.
    let shared = bucket(&[("shared", "s")]);
    let mut both = Vec::new();
    for round in 0..6 {
        let ra = ea.report(&[(shared.clone(), 150, 150)], 1).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rb = eb.report(&[(shared.clone(), 150, 150)], 1).await;
        let rate = |t: Option<(u64, u64, u64)>| t.map_or(0.0, |(k, f, _)| k as f64 / f as f64);
        let (x, y) = (
            rate(token_bucket(&ra[&k(&shared)])),
            rate(token_bucket(&rb[&k(&shared)])),
        );
        println!("shared round {round}: a {x} b {y}");
        both.push((x, y));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (sa, sb) = both[2..].iter().fold((0.0, 0.0), |(p, q), (x, y)| (p + x, q + y));
    assert!(sa > 0.0 && sb > 0.0, "both busy streams get a share: {both:?}");
}

/// Two streams each asking for 80/s of the 100/s bucket `tenant=value`,
/// over six reports a second apart: every round's assignments add up to
/// at most 100/s, and in the end each stream has 40-60/s.
async fn eighty_each_of_a_hundred(ea: &mut Envoy, eb: &mut Envoy, value: &str) {
    let id = bucket(&[("tenant", value)]);
    let rate = |t: Option<(u64, u64, u64)>| t.map_or(0.0, |(k, f, _)| k as f64 / f as f64);
    let mut last = (0.0, 0.0);
    for round in 0..6 {
        let ra = ea.report(&[(id.clone(), 80, 0)], 1).await;
        let rb = eb.report(&[(id.clone(), 80, 0)], 1).await;
        last = (rate(token_bucket(&ra[&k(&id)])), rate(token_bucket(&rb[&k(&id)])));
        println!("round {round}: {last:?}");
        assert!(last.0 + last.1 <= 100.0, "round {round}: {last:?} exceed 100/s");
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    assert!(
        (40.0..=60.0).contains(&last.0) && (40.0..=60.0).contains(&last.1),
        "{last:?}"
    );
}

/// After [`eighty_each_of_a_hundred`], `ea` (on gateway `at`) closes its
/// stream: its demand leaves the bucket's fair share at once, so within one
/// report interval of the close (and half of one of slack) `eb`, reporting
/// on its 1 s timer, is assigned the whole 100/s. Before, it kept 50/s.
async fn a_closed_stream_leaves_its_share_at_once(at: &Gateway, ea: Envoy, eb: &mut Envoy, value: &str) {
    let id = bucket(&[("tenant", value)]);
    let rate = |t: Option<(u64, u64, u64)>| t.map_or(0.0, |(k, f, _)| k as f64 / f as f64);
    let closed = Instant::now();
    drop(ea);
    // Waits without blocking the runtime, whose tasks send the close.
    while !at.log().contains("rlqs stream closed") {
        assert!(closed.elapsed() < Duration::from_secs(1), "the stream's end is seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut seen = Vec::new();
    // eb's next report is due now; it holds 50/s of the 80/s it wants.
    while closed.elapsed() < Duration::from_millis(1_500) {
        let rb = eb.report(&[(id.clone(), 50, 30)], 1).await;
        seen.push((closed.elapsed(), rate(token_bucket(&rb[&k(&id)]))));
        if seen.last().is_some_and(|(_, r)| *r == 100.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    println!("after the close: {seen:?}");
    assert!(
        seen.last()
            .is_some_and(|(after, r)| *r == 100.0 && *after < Duration::from_millis(1_500)),
        "the open stream gets the whole rate within a report interval of the close: {seen:?}"
    );
}

#[tokio::test]
async fn two_streams_wanting_most_of_a_bucket_share_it_fairly() {
    // Before, the first to report kept 100/s and the other got nothing.
    let gw = Gateway::start_with(&gateway_toml(""), &[("ratelimit.yaml", YAML)]);
    let (mut ea, mut eb) = (Envoy::connect(&gw).await, Envoy::connect(&gw).await);
    eighty_each_of_a_hundred(&mut ea, &mut eb, "fair").await;
}

#[tokio::test]
async fn a_closed_stream_gives_its_share_to_the_other_at_once() {
    let gw = Gateway::start_with(&gateway_toml(""), &[("ratelimit.yaml", YAML)]);
    let (mut ea, mut eb) = (Envoy::connect(&gw).await, Envoy::connect(&gw).await);
    eighty_each_of_a_hundred(&mut ea, &mut eb, "close").await;
    a_closed_stream_leaves_its_share_at_once(&gw, ea, &mut eb, "close").await;
}

#[tokio::test]
async fn two_gateways_share_a_bucket_fairly_through_the_store() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 200\n",
        redis.url()
    );
    let a = Gateway::start_with(&gateway_toml(&store), &[("ratelimit.yaml", YAML)]);
    let b = Gateway::start_with(&gateway_toml(&store), &[("ratelimit.yaml", YAML)]);
    let (mut ea, mut eb) = (Envoy::connect(&a).await, Envoy::connect(&b).await);
    eighty_each_of_a_hundred(&mut ea, &mut eb, "fleet-fair").await;
    // The demands live beside the bucket, and go with their streams' TTL.
    let keys = redis.cli(&["--scan", "--pattern", "*:demand"]);
    assert!(keys.contains("fleet-fair"), "{keys:?}");
}

#[tokio::test]
async fn a_stream_closed_on_one_gateway_gives_its_share_to_the_other_at_once() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 200\n",
        redis.url()
    );
    let a = Gateway::start_with(&gateway_toml(&store), &[("ratelimit.yaml", YAML)]);
    let b = Gateway::start_with(&gateway_toml(&store), &[("ratelimit.yaml", YAML)]);
    let (mut ea, mut eb) = (Envoy::connect(&a).await, Envoy::connect(&b).await);
    eighty_each_of_a_hundred(&mut ea, &mut eb, "fleet-close").await;
    let key = redis.cli(&["--scan", "--pattern", "*fleet-close*:demand"]);
    let key = key.trim();
    assert_eq!(redis.cli(&["HLEN", key]).trim(), "2", "{key:?}: both streams' demands");
    a_closed_stream_leaves_its_share_at_once(&a, ea, &mut eb, "fleet-close").await;
    // The closed stream's entry went with it, not with its TTL.
    assert_eq!(redis.cli(&["HLEN", key]).trim(), "1", "{key:?}: only the open stream's");
}

#[tokio::test]
async fn an_idle_bucket_is_abandoned() {
    let gw = Gateway::start_with(&gateway_toml(""), &[("ratelimit.yaml", YAML)]);
    let mut envoy = Envoy::connect(&gw).await;
    let acme = bucket(&[("tenant", "idle")]);
    let other = bucket(&[("path", "/nothing-matches")]);
    let first = envoy.report(&[(acme.clone(), 5, 0), (other.clone(), 1, 0)], 0).await;
    assert!(token_bucket(&first[&k(&acme)]).is_some());
    assert_eq!(blanket(&first[&k(&other)]), Some(BlanketRule::AllowAll));
    let (mut acme_after, mut other_after) = (None, None);
    for i in 1..=10 {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let mut usages = Vec::new();
        if acme_after.is_none() {
            usages.push((acme.clone(), 0, 0));
        }
        if other_after.is_none() {
            usages.push((other.clone(), 0, 0));
        }
        let answer = envoy.report(&usages, 1).await;
        if answer
            .get(&k(&acme))
            .is_some_and(|a| matches!(a, Action::AbandonAction(_)))
        {
            acme_after = Some(i);
        }
        if answer
            .get(&k(&other))
            .is_some_and(|a| matches!(a, Action::AbandonAction(_)))
        {
            other_after = Some(i);
        }
        if acme_after.is_some() && other_after.is_some() {
            break;
        }
    }
    let after = acme_after.expect("abandoned within 10 idle reports");
    assert!(after >= 6, "not before six idle intervals: {after}");
    // An ALLOW_ALL bucket that goes idle is abandoned too.
    let after = other_after.expect("the unmatched bucket abandoned within 10 idle reports");
    assert!(after >= 6, "{after}");
    // Traffic again: a new bucket, a new assignment.
    let again = envoy.report(&[(acme.clone(), 3, 0)], 0).await;
    assert!(token_bucket(&again[&k(&acme)]).is_some());
}

/// A client cannot grow a stream's state without bound, nor crash it with
/// the numbers it reports: past 10 000 buckets new ones get ALLOW_ALL, and
/// absurd counts and elapsed times still get an answer.
#[tokio::test]
async fn a_stream_holds_a_bounded_number_of_buckets_and_survives_absurd_reports() {
    let gw = Gateway::start_with(&gateway_toml(""), &[("ratelimit.yaml", YAML)]);
    let mut envoy = Envoy::connect(&gw).await;
    let many: Vec<(BucketId, u64, u64)> = (0..10_001)
        .map(|i| (bucket(&[("tenant", &format!("t{i}"))]), 1, 0))
        .collect();
    let answer = envoy.report(&many, 0).await;
    assert_eq!(answer.len(), 10_001);
    assert!(
        token_bucket(&answer[&k(&many[9_999].0)]).is_some(),
        "the 10 000th is tracked"
    );
    assert_eq!(
        blanket(&answer[&k(&many[10_000].0)]),
        Some(BlanketRule::AllowAll),
        "the 10 001st is not"
    );
    // u64::MAX requests over i64::MAX seconds: answered, and the stream lives.
    let reports = RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(many[0].0.clone()),
            time_elapsed: Some(PbDuration {
                seconds: i64::MAX,
                nanos: 0,
            }),
            num_requests_allowed: u64::MAX,
            num_requests_denied: u64::MAX,
        }],
    };
    envoy.tx.send(reports).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(5), envoy.rx.message())
        .await
        .expect("an answer")
        .unwrap()
        .unwrap();
    assert_eq!(reply.bucket_action.len(), 1);
    let again = envoy.report(&[(many[1].0.clone(), 1, 0)], 1).await;
    assert!(token_bucket(&again[&k(&many[1].0)]).is_some());
}

/// Bucket ids are bounded in bytes: one over 4 KiB is refused (`DENY_ALL`,
/// nothing of it kept), and past 1 MiB of ids on one stream new buckets
/// get `ALLOW_ALL` untracked, so one stream cannot pin gigabytes.
#[tokio::test]
async fn oversized_bucket_ids_are_refused_and_a_stream_holds_a_bounded_number_of_bytes() {
    let gw = Gateway::start_with(&gateway_toml(""), &[("ratelimit.yaml", YAML)]);
    let mut envoy = Envoy::connect(&gw).await;
    let fits = "f".repeat(4 * 1024 - "tenant".len());
    let over = "o".repeat(4 * 1024 - "tenant".len() + 1);
    let answer = envoy
        .report(
            &[
                (bucket(&[("tenant", fits.as_str())]), 1, 0),
                (bucket(&[("tenant", over.as_str())]), 1, 0),
            ],
            0,
        )
        .await;
    assert!(token_bucket(&answer[&k(&bucket(&[("tenant", fits.as_str())]))]).is_some());
    assert_eq!(
        blanket(&answer[&k(&bucket(&[("tenant", over.as_str())]))]),
        Some(BlanketRule::DenyAll),
        "4 KiB + 1 byte"
    );
    // 4 000-byte ids, in reports under the 1 MiB message cap: the 262nd
    // (1 MiB / 4 000, beside the first) is the last one tracked.
    let ids: Vec<BucketId> = (0..300)
        .map(|i| bucket(&[("tenant", format!("{i:04}{}", "x".repeat(4_000 - 6 - 4)).as_str())]))
        .collect();
    let mut answers = HashMap::new();
    for chunk in ids.chunks(100) {
        let usages: Vec<(BucketId, u64, u64)> = chunk.iter().map(|id| (id.clone(), 1, 0)).collect();
        answers.extend(envoy.report(&usages, 0).await);
    }
    let tracked = ids
        .iter()
        .take_while(|id| token_bucket(&answers[&k(id)]).is_some())
        .count();
    assert!(
        (250..=262).contains(&tracked),
        "{tracked} buckets of 4 000 bytes tracked"
    );
    for id in &ids[tracked..] {
        assert_eq!(blanket(&answers[&k(id)]), Some(BlanketRule::AllowAll));
    }
}

/// Idle `ALLOW_ALL` buckets are state too: they count in the service's
/// cap of 100 000 buckets, so ten streams of 10 000 idle unmatched buckets
/// leave no room for an eleventh stream's new bucket (`ALLOW_ALL`,
/// untracked) instead of growing the state past the cap.
#[tokio::test]
async fn idle_allow_all_buckets_count_in_the_global_bucket_cap() {
    let gw = Gateway::start_with(&gateway_toml(""), &[("ratelimit.yaml", YAML)]);
    let mut streams = Vec::new();
    for s in 0..10 {
        let mut envoy = Envoy::connect(&gw).await;
        let idle: Vec<(BucketId, u64, u64)> = (0..10_000)
            .map(|i| (bucket(&[("path", &format!("/s{s}/{i}"))]), 0, 0))
            .collect();
        let answer = envoy.report(&idle, 0).await;
        assert_eq!(answer.len(), 10_000);
        streams.push(envoy);
    }
    let mut last = Envoy::connect(&gw).await;
    let acme = bucket(&[("tenant", "acme")]);
    let answer = last.report(&[(acme.clone(), 1, 0)], 0).await;
    assert_eq!(
        blanket(&answer[&k(&acme)]),
        Some(BlanketRule::AllowAll),
        "the cap is full of idle buckets"
    );
    // One stream closes: its buckets leave the cap, and a new bucket is
    // paid for again.
    drop(streams.pop());
    crate::support::eventually(
        Duration::from_secs(5),
        async || {
            let answer = last.report(&[(bucket(&[("tenant", "beta")]), 1, 0)], 0).await;
            token_bucket(&answer[&k(&bucket(&[("tenant", "beta")]))]).map(|_| ())
        },
        || "the closed stream's buckets never left the cap".into(),
    )
    .await;
}
