//! Costs: a reserve taken all or nothing, a settle that refunds to the
//! lease or leaves the key owing, and the debt's exact wait, on a memory
//! store and a manual clock.

use super::*;
use crate::limit::cost::{Cost, Reserve, Settle};

/// `100/100s`, burst 100, with a cost (1 token a second).
fn priced(name: &str) -> Vec<Arc<LimitRuntime>> {
    let rate: Rate = "100/100s".parse().unwrap();
    let config = Arc::new(
        Limit::try_new(Draft {
            cost: Some(Cost::new(Reserve::Fixed(10), Some(Settle::ResponseBytes))),
            ..Draft::new(name, rate)
        })
        .unwrap(),
    );
    vec![Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))]
}

/// One request reserving `n`: its verdict, and its settlement when admitted.
async fn reserve<'l>(
    limiter: &'l Arc<Limiter>,
    limits: &'l [Arc<LimitRuntime>],
    n: u64,
) -> (Verdict<'l>, Option<crate::limit::cost::Settlement>) {
    let h = http::HeaderMap::new();
    let mut v = Verdict::default();
    let costs = [(limits[0].clone(), n)];
    let facts = facts("a", &h);
    let which = pick(limits, &[0]);
    if let Checked::NeedsStore(pending) = limiter.try_check(&which, &costs, &facts, &mut v) {
        v = limiter
            .resume(v, pending, &which, &costs, &facts, StoreFailure::Allow)
            .await;
    }
    let s = if v.decision == Decision::Admit {
        v.settlements(&costs).pop()
    } else {
        None
    };
    (v.committed(), s)
}

#[tokio::test(start_paused = true)]
async fn a_settle_refunds_to_the_lease_or_leaves_a_debt_with_its_exact_wait() {
    let (now, store, limiter) = at(1_000_000);
    let limits = priced("tokens");
    let (v, s) = reserve(&limiter, &limits, 10).await;
    assert_eq!(v.limits[0].remaining, 90);
    let calls = store.acquires.load(Ordering::SeqCst);
    // Cost 4: 6 back to the lease, no store call.
    assert_eq!(limiter.settle(&s.unwrap(), 4), 0);
    assert_eq!(
        store.acquires.load(Ordering::SeqCst),
        calls,
        "settling made no store call"
    );
    let (v, s) = reserve(&limiter, &limits, 10).await;
    assert_eq!(v.limits[0].remaining, 86, "the refund shows");
    // Cost 150: 140 more, more than the lease holds: owed.
    let owed = limiter.settle(&s.unwrap(), 150);
    assert!(owed > 0);
    // The next call carries the debt: 154 of 100 spent, 54 owed; 10 more
    // fit after 64 s, not a millisecond earlier.
    let (v, _) = reserve(&limiter, &limits, 10).await;
    assert_eq!(v.decision, Decision::Refuse { at: 0 });
    assert_eq!(v.limits[0].retry_after_ms, 64_000);
    now.fetch_add(63_999, Ordering::SeqCst);
    let (v, _) = reserve(&limiter, &limits, 10).await;
    assert_eq!(v.decision, Decision::Refuse { at: 0 }, "a millisecond early");
    now.fetch_add(1, Ordering::SeqCst);
    let (v, _) = reserve(&limiter, &limits, 10).await;
    assert_eq!(v.decision, Decision::Admit, "{v:?}");
}

#[tokio::test(start_paused = true)]
async fn a_reserve_that_does_not_fit_refuses_it_alone() {
    let (_now, _store, limiter) = at(1_000_000);
    let limits = priced("tokens");
    // 95 of 100 spent (each reserve is all or nothing).
    for n in [50, 45] {
        let (v, _) = reserve(&limiter, &limits, n).await;
        assert_eq!(v.decision, Decision::Admit, "{n}");
    }
    let (v, _) = reserve(&limiter, &limits, 10).await;
    assert_eq!(v.decision, Decision::Refuse { at: 0 });
    assert_eq!(v.limits[0].retry_after_ms, 5_000, "5 more tokens at 1 a second");
    // Nothing was taken, and a smaller request is not blocked by it.
    for _ in 0..5 {
        let (v, _) = reserve(&limiter, &limits, 1).await;
        assert_eq!(v.decision, Decision::Admit);
    }
    let (v, _) = reserve(&limiter, &limits, 1).await;
    assert_eq!(v.decision, Decision::Refuse { at: 0 });
}

#[tokio::test(start_paused = true)]
async fn a_reserve_above_the_capacity_is_the_capacity() {
    let (_now, _store, limiter) = at(1_000_000);
    let limits = priced("tokens");
    let (v, s) = reserve(&limiter, &limits, 1_000).await;
    assert_eq!(v.decision, Decision::Admit);
    assert_eq!(s.unwrap().reserve, 100);
}
