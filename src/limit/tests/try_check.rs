//! The fast path, [`Limiter::try_check`]: what it decides from memory, and
//! how the slow path goes on from where it stopped.

use super::*;

/// The verdict from memory, served (its tokens committed), and how many
/// tokens it held before that; `None` when it needs the store.
fn try_check<'l>(
    limiter: &'l Arc<Limiter>,
    all: &'l [Arc<LimitRuntime>],
    which: &[usize],
    facts: &Facts<'_>,
) -> Option<(Verdict<'l>, usize)> {
    let mut verdict = Verdict::default();
    if limiter.try_check(&pick(all, which), &[], facts, &mut verdict) == Checked::Decided {
        let held = verdict.tokens_held();
        return Some((verdict.committed(), held));
    }
    assert!(verdict.refused_at().is_none());
    None
}

#[tokio::test(start_paused = true)]
async fn a_blocked_key_is_refused_from_memory_by_try_check_as_check_refuses_it() {
    let (store, limiter) = setup();
    let limits = vec![
        limit("wide", "10/min", None, Mode::Enforce),
        limit("narrow", "2/min", None, Mode::Enforce),
        limit("shadow", "1/min", None, Mode::Shadow),
    ];
    let h = http::HeaderMap::new();
    // Before any refusal, a key without tokens needs the store.
    assert!(try_check(&limiter, &limits, &[1], &facts("a", &h)).is_none());
    for _ in 0..2 {
        assert_eq!(
            limiter
                .check(&pick(&limits, &[0, 1]), &[], &facts("a", &h), StoreFailure::Allow)
                .await
                .committed()
                .refused_at(),
            None
        );
    }
    // The third request is refused by the store: "narrow" is now blocked.
    assert_eq!(
        limiter
            .check(&pick(&limits, &[0, 1]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed()
            .refused_at(),
        Some(1)
    );
    for _ in 0..5 {
        let (fast, held) =
            try_check(&limiter, &limits, &[0, 1], &facts("a", &h)).expect("a blocked key decides from memory");
        let slow = limiter
            .check(&pick(&limits, &[0, 1]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed();
        assert_eq!(fast.refused_at(), Some(1));
        assert_eq!(fast.refused_at(), slow.refused_at());
        assert_eq!(held, 0, "the refused request keeps no token");
        let (f, s) = (&fast.limits[1], &slow.limits[1]);
        assert_eq!((f.outcome, f.remaining, f.quota), (s.outcome, s.remaining, s.quota));
        assert!(f.retry_after_ms.abs_diff(s.retry_after_ms) <= 5);
    }
    // Refusals of the blocked key alone cost no store call.
    let calls = store.acquires.load(Ordering::SeqCst);
    for _ in 0..100 {
        let (v, _) = try_check(&limiter, &limits, &[1], &facts("a", &h)).expect("blocked");
        assert_eq!(v.refused_at(), Some(0));
    }
    assert_eq!(
        store.acquires.load(Ordering::SeqCst),
        calls,
        "no store call while blocked"
    );
    // "wide" spent only on the 2 admitted requests: refusals gave theirs back.
    assert_eq!(admitted(&limiter, &limits, &[0], &facts("a", &h), 20).await, 8);
    // A shadow limit's blocked key admits, from memory too.
    for _ in 0..2 {
        let _ = limiter
            .check(&pick(&limits, &[2]), &[], &facts("b", &h), StoreFailure::Allow)
            .await
            .committed();
    }
    let (v, _) = try_check(&limiter, &limits, &[2], &facts("b", &h)).expect("a blocked shadow key decides from memory");
    assert_eq!(v.refused_at(), None);
    assert_eq!(v.limits[0].outcome, Outcome::ShadowLimited);
}

#[tokio::test(start_paused = true)]
async fn the_slow_path_goes_on_where_the_fast_path_stopped_and_an_unserved_verdict_gives_back() {
    let (store, limiter) = setup();
    // Limit 0 keyed by route (one key for every identity), limit 1 by identity.
    let by_route = {
        let rate: Rate = "1000/min".parse().unwrap();
        let config = Arc::new(
            Limit::try_new(Draft {
                by: vec![KeyPart::Route],
                ..Draft::new("by_route", rate)
            })
            .unwrap(),
        );
        Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))
    };
    let limits = vec![by_route, limit("per_client", "1000/min", None, Mode::Enforce)];
    let h = http::HeaderMap::new();
    // Warm the route's lease.
    let first = limiter
        .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
        .await
        .committed();
    let at_hand = first.limits[0].remaining;
    let calls = store.acquires.load(Ordering::SeqCst);
    // A new client: the route's token comes from memory, its own key needs
    // the store.
    let mut partial = Verdict::default();
    let both = pick(&limits, &[0, 1]);
    let Checked::NeedsStore(pending) = limiter.try_check(&both, &[], &facts("b", &h), &mut partial) else {
        panic!("the client's key needs the store");
    };
    assert_eq!(pending, Pending { next: 1 }, "it goes on from the client's limit");
    assert_eq!((partial.limits.len(), partial.tokens_held()), (1, 1));
    assert_eq!(partial.limits[0].remaining, at_hand - 1);
    let v = limiter
        .resume(partial, pending, &both, &[], &facts("b", &h), StoreFailure::Allow)
        .await;
    assert_eq!((v.decision, v.limits.len(), v.tokens_held()), (Decision::Admit, 2, 2));
    // One store call, for the client's key only: the route's token was not
    // taken again.
    assert_eq!(store.acquires.load(Ordering::SeqCst), calls + 1);
    // Not served (say the client went away): both tokens go back.
    drop(v);
    let again = limiter
        .check(&pick(&limits, &[0]), &[], &facts("c", &h), StoreFailure::Allow)
        .await
        .committed();
    assert_eq!(
        again.limits[0].remaining,
        at_hand - 1,
        "the dropped verdict's token came back"
    );
}
