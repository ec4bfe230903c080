//! The limiter's companions, each a task of its own on the paused clock:
//! the fleet heartbeat and the overrides follower hand the limiter values
//! through the tables they share with it (the slot renewer's are in
//! `limit/slots/tests.rs`).

use super::*;
use crate::limit::fleet::{Heartbeat, HEARTBEAT_EVERY_MS};
use crate::limit::overrides::{OverridesFollower, POLL_MS};

#[tokio::test(start_paused = true)]
async fn the_heartbeat_counts_the_fleet_the_limiter_divides_by_and_leaves_it() {
    let store = Arc::new(Scripted::new());
    store.fleet.store(3, Ordering::SeqCst);
    let limiter = Limiter::new(store.clone(), settings(), monotonic_clock());
    assert_eq!(limiter.report().fleet().live, None, "not counted before a heartbeat");
    let heartbeat = Arc::new(Heartbeat::of(&limiter, 7));
    let task = tokio::spawn(heartbeat.clone().run());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        (limiter.report().fleet().live, limiter.report().fleet().divisor),
        (Some(3), 3)
    );
    assert_eq!(store.heartbeats.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(2 * HEARTBEAT_EVERY_MS)).await;
    assert_eq!(
        store.heartbeats.load(Ordering::SeqCst),
        3,
        "one every {HEARTBEAT_EVERY_MS} ms"
    );
    // A failed beat keeps the last count.
    store.answer(
        Call::Ping,
        Answer::Fail(crate::store::StoreError::Unavailable("down".into())),
    );
    tokio::time::sleep(Duration::from_millis(HEARTBEAT_EVERY_MS)).await;
    assert_eq!(limiter.report().fleet().live, Some(3));
    task.abort();
    store.answer(Call::Ping, Answer::Real);
    heartbeat.leave().await;
    assert_eq!(
        store.heartbeats.load(Ordering::SeqCst),
        5,
        "leaving is a heartbeat of ttl 0"
    );
}

#[tokio::test(start_paused = true)]
async fn the_follower_brings_another_instances_change_within_a_poll() {
    // Two instances of one fleet on one store that sends no change notices.
    let store = Arc::new(MemoryStore::new(1_000));
    let a = Limiter::new(store.clone(), settings(), monotonic_clock());
    let b = Limiter::new(store, settings(), monotonic_clock());
    let limits = vec!["api".to_string()];
    let b_follows = Arc::new(OverridesFollower::of(&b));
    let listed = limits.clone();
    let task = tokio::spawn(b_follows.run(move || listed.clone()));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let o = overrides::Override::from_request(br#"{"rate": "5/s"}"#, Algorithm::TokenBucket, 0).unwrap();
    let changed = OverridesFollower::of(&a).change(&limits, "api", "key:a", Some(o)).await;
    assert!(changed.unwrap().is_some());
    let h = http::HeaderMap::new();
    assert_eq!(
        a.overrides.for_caller("api", &facts("key:a", &h), a.wall_ms()),
        Some(o),
        "its own change at once"
    );
    assert!(b.report().overrides().is_empty(), "the other before its poll");
    tokio::time::sleep(Duration::from_millis(POLL_MS + 1)).await;
    assert_eq!(
        b.overrides.for_caller("api", &facts("key:a", &h), b.wall_ms()),
        Some(o),
        "within a poll"
    );
    task.abort();
}

/// An override's expiry is read on the limiter's wall clock (an argument,
/// not the system's), so it lapses when that clock says so.
#[tokio::test(start_paused = true)]
async fn an_override_lapses_on_the_limiters_wall_clock() {
    let day = 86_400_000;
    let (wall, wall_clock) = manual_clock(crate::clock::days_from_civil(2027, 1, 30) * day);
    let store = Arc::new(MemoryStore::new(1_000));
    let limiter = Limiter::with_wall_clock(store, settings(), monotonic_clock(), wall_clock);
    let limits = ["api".to_string()];
    let o = overrides::Override::from_request(
        br#"{"rate": "5/s", "expires": "2027-01-31T00:00:00Z"}"#,
        Algorithm::TokenBucket,
        limiter.wall_ms(),
    )
    .unwrap();
    let follower = overrides::OverridesFollower::of(&limiter);
    assert!(follower
        .change(&limits, "api", "key:a", Some(o))
        .await
        .unwrap()
        .is_some());
    let h = http::HeaderMap::new();
    assert_eq!(
        limiter
            .overrides
            .for_caller("api", &facts("key:a", &h), limiter.wall_ms()),
        Some(o)
    );
    assert_eq!(limiter.report().overrides().len(), 1);
    wall.store(crate::clock::days_from_civil(2027, 1, 31) * day, Ordering::SeqCst);
    assert_eq!(
        limiter
            .overrides
            .for_caller("api", &facts("key:a", &h), limiter.wall_ms()),
        None
    );
    assert!(limiter.report().overrides().is_empty());
}
