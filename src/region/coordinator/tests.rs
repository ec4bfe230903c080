//! The coordinator against fake stores and a real link on 127.0.0.1.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::quota::{Algorithm, Rate, Share, Spec};
use crate::region::link::{Grantor, LinkService, ServeLimits};
use crate::store::testing::{Answer, Call, Scripted};
use crate::store::StoreError;
use std::sync::atomic::Ordering;

/// A primary's store granting transfers once per id from `tokens`.
fn primary_with(tokens: u64) -> Arc<Scripted> {
    let store = Arc::new(Scripted::new());
    store.transferable.store(tokens, Ordering::SeqCst);
    store
}

fn spec() -> Spec {
    let whole = Spec::new(
        Algorithm::TokenBucket,
        Rate {
            count: 1_000,
            period: Duration::from_secs(60),
        },
        1_000,
    );
    whole.slice(Share::from_fraction(0.3).unwrap())
}

fn metrics() -> LinkMetrics {
    LinkMetrics {
        link_up: Gauge::default(),
        granted: Counter::default(),
        refused: Counter::default(),
        error: Counter::default(),
    }
}

/// A primary's link on an ephemeral port, granting from `primary`.
async fn primary_link(primary: Arc<Scripted>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grantor = Arc::new(Grantor {
        store: primary,
        share: Share::from_fraction(0.5).unwrap(),
        quotas: Arc::new(|limit: &str| {
            let spec = match limit {
                "l" => spec().whole(),
                "fast" => fast().whole(),
                _ => return None,
            };
            Some(crate::region::LimitQuotas {
                specs: vec![spec],
                shards: 1,
            })
        }),
        window_ms: 20_000,
        // The primary keeps nothing back here: what a transfer takes is
        // what the tests count (the keep is tested on the real script).
        rebalance_at: 1.0,
    });
    let link = LinkService {
        grantor: Some(grantor),
        limits: ServeLimits::default(),
        budget: Arc::default(),
    };
    tokio::spawn(link.serve(listener));
    addr.to_string()
}

/// The window the tests' clock is in: 20 s windows, the clock at the
/// start of window 50.
const NOW: u64 = 1_000_000;
const W: u64 = 50;

fn coordinator(region: Arc<Scripted>, primary: String, timeout: Duration) -> Arc<Coordinator> {
    coordinator_at(region, primary, timeout, NOW)
}

fn coordinator_at(region: Arc<Scripted>, primary: String, timeout: Duration, now: u64) -> Arc<Coordinator> {
    windowed(region, primary, timeout, 20_000, now)
}

/// With `window_ms` windows, the clock at `now`, short backoffs.
fn windowed(region: Arc<Scripted>, primary: String, timeout: Duration, window_ms: u64, now: u64) -> Arc<Coordinator> {
    let mut c = Coordinator::new(
        "eu".into(),
        window_ms,
        region,
        LinkClient::new(primary, timeout),
        metrics(),
        Arc::new(move || now),
        None,
    );
    Arc::get_mut(&mut c).unwrap().backoff = (Duration::from_millis(50), Duration::from_millis(100));
    c
}

fn ask() -> Ask {
    Ask {
        key: "rl:{l:k}".into(),
        spec: spec(),
        short: 0,
    }
}

fn ask_of(key: &str, spec: Spec) -> Ask {
    Ask {
        key: key.into(),
        spec,
        short: 0,
    }
}

/// A 100/s limit, sliced 0.3.
fn fast() -> Spec {
    Spec::new(
        Algorithm::TokenBucket,
        Rate {
            count: 100,
            period: Duration::from_secs(1),
        },
        100,
    )
    .slice(Share::from_fraction(0.3).unwrap())
}

#[test]
fn credit_lasts_one_period_from_the_ask_whatever_the_window() {
    // Asked and credited at once, a 60 s limit: the whole period.
    assert_eq!(credit_ttl(60_000, 1_000_000, 1_000_000), Some(60_000));
    // Credited 1 s after the ask: the rest of the period, not 60 s from now
    // (and not cut where an aligned window would end).
    assert_eq!(credit_ttl(60_000, 1_014_000, 1_015_000), Some(59_000));
    // A 1 s limit: one period after the ask.
    assert_eq!(credit_ttl(1_000, 1_000_000, 1_000_300), Some(700));
    // Past it: nothing to credit.
    assert_eq!(credit_ttl(1_000, 1_000_000, 1_001_000), None);
    assert_eq!(credit_ttl(60_000, 1_000_000, 1_060_000), None);
}

#[tokio::test]
async fn a_limit_shorter_than_the_window_gets_credit_for_one_period_only() {
    // 100/s with a 20 s window: credit living 20 s would be spent while
    // the primary's bucket refills what it gave, 20 times over.
    let primary = primary_with(500);
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::new());
    let c = coordinator(region.clone(), link, Duration::from_secs(2));
    assert_eq!(
        c.rebalance(&ask_of("rl:{fast:k}", fast()), W).await,
        Outcome::Granted(30)
    );
    let credits = region.credits.lock().unwrap().clone();
    assert_eq!(credits.len(), 1);
    assert_eq!(credits[0].2, 1_000, "one period of the limit, not the window");
}

#[tokio::test]
async fn credit_asked_late_in_its_window_still_lasts_a_period() {
    let primary = primary_with(500);
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::new());
    // 15 s into window 50 (of 20 s), a 60 s limit: 60 s, not the 5 s left
    // of the window.
    let c = coordinator_at(region.clone(), link, Duration::from_secs(2), NOW + 15_000);
    assert_eq!(c.rebalance(&ask(), W).await, Outcome::Granted(300));
    assert_eq!(region.credits.lock().unwrap()[0].2, 60_000);
}

#[tokio::test]
async fn one_elected_gateway_gets_a_transfer_credited_for_the_window() {
    let primary = primary_with(500);
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::new());
    let a = coordinator(region.clone(), link.clone(), Duration::from_secs(2));
    let b = coordinator(region.clone(), link, Duration::from_secs(2));
    // One more slice (300) of the primary's 500.
    assert_eq!(a.rebalance(&ask(), W).await, Outcome::Granted(300));
    // Another gateway of the region, same key and window: not elected.
    assert_eq!(b.rebalance(&ask(), W).await, Outcome::NotElected);
    let credits = region.credits.lock().unwrap().clone();
    let id = threshold::transfer_id(None, "eu", "rl:{l:k}", W);
    assert_eq!(credits, vec![(id, 300, 60_000)]);
    assert_eq!((a.metrics.granted.get(), a.metrics.link_up.get()), (1, 1));
    assert_eq!(primary.transferable.load(Ordering::SeqCst), 200);
}

#[tokio::test]
async fn an_empty_primary_refuses_and_a_claim_failure_asks_nobody() {
    let primary = Arc::new(Scripted::new());
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::new());
    let c = coordinator(region.clone(), link, Duration::from_secs(2));
    assert_eq!(c.rebalance(&ask(), W).await, Outcome::Refused);
    assert_eq!(c.metrics.refused.get(), 1);
    // Nothing credited: the one call settles the pending transfer.
    let credits = region.credits.lock().unwrap().clone();
    assert!(credits.iter().all(|c| c.1 == 0), "{credits:?}");

    region.answer(Call::Claim, Answer::Fail(StoreError::Unavailable("down".into())));
    assert_eq!(c.rebalance(&ask(), W + 1).await, Outcome::Error);
    assert_eq!(primary.takes.load(Ordering::SeqCst), 1, "no second transfer");
    assert_eq!(c.metrics.error.get(), 1, "a failed claim is an error");
}

#[tokio::test]
async fn a_quota_the_primary_does_not_have_is_refused_and_takes_nothing() {
    let primary = primary_with(500);
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::new());
    let c = coordinator(region.clone(), link, Duration::from_secs(2));
    // Limit "l" is 1000/min at the primary; this region says 100/s.
    assert_eq!(c.rebalance(&ask_of("rl:{l:k}", fast()), W).await, Outcome::Refused);
    assert_eq!(c.rebalance(&ask_of("rl:{nope:k}", spec()), W).await, Outcome::Refused);
    assert_eq!(primary.takes.load(Ordering::SeqCst), 0);
    assert_eq!((c.metrics.refused.get(), c.metrics.error.get()), (2, 0));
    assert_eq!(c.metrics.link_up.get(), 1, "the link works");
    assert!(
        region.unclaimed.lock().unwrap().is_empty(),
        "the claim stays for the window"
    );
}

#[tokio::test]
async fn a_slow_link_is_asked_again_with_the_same_id_until_the_landed_grant_is_credited() {
    // The primary takes the tokens at once but its answers come after
    // the client gave up, three times: the fourth attempt (same id)
    // gets the recorded grant, which is credited; nothing moves twice.
    let primary = primary_with(500);
    primary.delay_first(Call::TransferOut, 3, 400);
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::new());
    let c = coordinator(region.clone(), link, Duration::from_millis(150));
    assert_eq!(c.rebalance(&ask(), W).await, Outcome::Granted(300));
    assert_eq!(primary.takes.load(Ordering::SeqCst), 1);
    assert_eq!(primary.transferable.load(Ordering::SeqCst), 200);
    assert_eq!(region.credits.lock().unwrap().len(), 1);
    assert_eq!((c.metrics.granted.get(), c.metrics.error.get()), (1, 0));
}

#[tokio::test]
async fn retries_stop_once_a_grant_could_no_longer_be_credited() {
    // A 100/s limit: credit could live one second, so the transfer is not
    // retried for the rest of the 20 s window.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let c = coordinator(Arc::new(Scripted::new()), closed, Duration::from_millis(100));
    let started = std::time::Instant::now();
    assert_eq!(c.rebalance(&ask_of("rl:{fast:k}", fast()), W).await, Outcome::Error);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_failed_transfer_releases_the_claim_so_the_key_asks_again() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let region = Arc::new(Scripted::new());
    // 1 s windows, at the start of one: a second of retries.
    let c = windowed(region.clone(), closed, Duration::from_millis(100), 1_000, NOW);
    assert_eq!(c.rebalance(&ask(), NOW / 1_000).await, Outcome::Error);
    let claim = format!("rl:{{l:k}}:{}", NOW / 1_000);
    assert_eq!(*region.unclaimed.lock().unwrap(), vec![claim]);
    // Elected again, here and in the region.
    assert!(c.first_here("rl:{l:k}", NOW / 1_000));
    assert_eq!(c.rebalance(&ask(), NOW / 1_000).await, Outcome::Error);
    assert_eq!(c.metrics.error.get(), 2);
}

#[tokio::test]
async fn a_retry_after_a_lost_answer_moves_tokens_once() {
    // The primary applied the transfer, the answer was lost: the retry
    // carries the same id and gets the recorded answer.
    let primary = primary_with(1_000);
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::new());
    let c = coordinator(region.clone(), link, Duration::from_secs(2));
    let id = threshold::transfer_id(None, "eu", "rl:{l:k}", W);
    primary.transfers.lock().unwrap().insert(id, 120);
    assert_eq!(c.rebalance(&ask(), W).await, Outcome::Granted(120));
    assert_eq!(primary.takes.load(Ordering::SeqCst), 0);
    assert_eq!(primary.transferable.load(Ordering::SeqCst), 1_000);
}

#[tokio::test]
async fn a_refused_or_hanging_link_is_an_error_within_the_timeouts() {
    // Refused: nothing listens.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // 1 s windows, at the start of one: retried for a second at most.
    let region = Arc::new(Scripted::new());
    let c = windowed(region.clone(), closed, Duration::from_millis(200), 1_000, NOW);
    assert_eq!(c.rebalance(&ask(), NOW / 1_000).await, Outcome::Error);
    assert_eq!((c.metrics.error.get(), c.metrics.link_up.get()), (1, 0));

    // Hanging: accepts, never answers. Attempts cut at the timeout,
    // again after a pause, until the window ends.
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hang.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = hang.accept().await {
            conns.push(s);
        }
    });
    let region = Arc::new(Scripted::new());
    let c = windowed(region.clone(), addr, Duration::from_millis(200), 1_000, NOW);
    let started = std::time::Instant::now();
    assert_eq!(c.rebalance(&ask(), NOW / 1_000).await, Outcome::Error);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(region.credits.lock().unwrap().is_empty());
    held.abort();
}

#[tokio::test]
async fn link_up_comes_from_a_probe_at_the_start_and_only_transport_failures_lower_it() {
    // Nothing listens: down from the start, before any ask.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let c = coordinator(Arc::new(Scripted::new()), closed, Duration::from_millis(200));
    c.metrics.link_up.set(1);
    let (_tx, rx) = mpsc::channel(1);
    let task = tokio::spawn(c.clone().run(rx));
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while c.metrics.link_up.get() != 0 {
        assert!(std::time::Instant::now() < deadline, "the start probe never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();

    // A primary that answers: up from the start; a refusal (it
    // answered) leaves it up.
    let link = primary_link(Arc::new(Scripted::new())).await;
    let c = coordinator(Arc::new(Scripted::new()), link, Duration::from_secs(2));
    let (_tx, rx) = mpsc::channel(1);
    let task = tokio::spawn(c.clone().run(rx));
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while c.metrics.link_up.get() != 1 {
        assert!(std::time::Instant::now() < deadline, "the start probe never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(c.rebalance(&ask_of("rl:{nope:k}", spec()), W).await, Outcome::Refused);
    assert_eq!(c.metrics.link_up.get(), 1);
    task.abort();
    assert!(reachable(&Err(LinkError::Status(503))));
    assert!(!reachable(&Err(LinkError::Timeout(1))));
}

#[tokio::test]
async fn the_run_loop_handles_a_key_once_per_window_here() {
    let region = Arc::new(Scripted::new());
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let c = coordinator(region.clone(), closed, Duration::from_millis(100));
    assert!(c.first_here("k", 1));
    assert!(!c.first_here("k", 1));
    assert!(c.first_here("j", 1));
    assert!(c.first_here("k", 2));
    c.forget("k");
    assert!(c.first_here("k", 2));
    // The new window dropped the old one's keys at once.
    assert_eq!(c.asked.lock().unwrap().keys.len(), 1);
}

/// Issue 37 on fakes, deterministic: the region's bucket (300, on a
/// stopped clock: no refill) crosses its threshold, the ask is granted one
/// more slice, and right after the grant the primary's own traffic spends
/// all it had left, so the next window's ask is refused. Nothing the
/// primary does after granting reaches what was credited: the region
/// admits its whole slice, then every token of the grant, then nothing.
#[tokio::test]
async fn credit_granted_is_spent_whatever_the_primary_does_next() {
    use crate::quota::Unspent;
    use crate::region::rebalancing::Rebalancing;
    use crate::store::memory::MemoryStore;
    use crate::store::Acquire as _;

    let primary = primary_with(500);
    let link = primary_link(primary.clone()).await;
    let region = Arc::new(Scripted::with_memory(MemoryStore::with_clock(100, Arc::new(|| NOW))));
    let (tx, mut rx) = mpsc::channel(8);
    let store = Rebalancing::new(region.clone(), region.clone(), 0.8, tx);
    let c = coordinator(region.clone(), link, Duration::from_secs(2));
    let s = spec();
    let take = |n: u64| {
        let store = &store;
        async move { store.acquire("rl:{l:k}", &s, n, Unspent::default()).await.unwrap() }
    };
    assert_eq!(take(240).await.granted, 240);
    let ask = rx.try_recv().expect("240 of 300 crossed 0.8");
    assert_eq!(c.rebalance(&ask, W).await, Outcome::Granted(300));
    // The primary's own demand rises at once and spends the rest of its
    // slice: the next window's ask is refused.
    primary.transferable.store(0, Ordering::SeqCst);
    assert_eq!(c.rebalance(&ask, W + 1).await, Outcome::Refused);
    let mut admitted = 240;
    loop {
        let g = take(1).await;
        if g.granted == 0 {
            break;
        }
        admitted += g.granted;
        assert!(admitted <= 900, "more than the slice and the grant");
    }
    assert_eq!(admitted, 300 + 300, "the slice, then the whole grant");
    assert_eq!(region.credit.load(Ordering::SeqCst), 0);
}
