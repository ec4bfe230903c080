//! The store of a region that has a primary: the regional store, plus
//! credit spending and the non-blocking rebalance signal.
//!
//! Sits inside the guard (`Guarded(Rebalancing(store))`), so a request's
//! store call, credit included, stays within the one deadline. The request
//! path adds at most one regional call (spending credit, only when the
//! bucket came up short) and a `try_send` on a bounded channel: it never
//! waits on the link, and a full channel drops the signal.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::threshold;
use crate::quota::{Grant, Spec, Unspent};
use crate::store::{Acquire as _, BoxFuture, Credit, FleetStore, FleetTables, QuotaStore, RegionStore, StoreError};

/// A key that crossed `rebalance_at` of its slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub key: String,
    pub spec: Spec,
    /// The region's shortfall of the key over the last period, as the
    /// credit spend measured it (0: none yet, or not asked).
    pub short: u64,
}

/// How many asks may wait for the coordinator; more are dropped.
pub const ASK_QUEUE: usize = 1_024;

pub struct Rebalancing {
    inner: Arc<dyn FleetStore>,
    /// The same store's region calls: the credit spent after the bucket.
    credit: Arc<dyn RegionStore>,
    rebalance_at: f64,
    asks: mpsc::Sender<Ask>,
}

impl Rebalancing {
    pub fn new(
        inner: Arc<dyn FleetStore>,
        credit: Arc<dyn RegionStore>,
        rebalance_at: f64,
        asks: mpsc::Sender<Ask>,
    ) -> Rebalancing {
        Rebalancing {
            inner,
            credit,
            rebalance_at,
            asks,
        }
    }

    /// Tells the coordinator when the answer shows the key crossed its
    /// threshold. Never waits: a full queue drops the ask (the next store
    /// call of that key will signal again).
    /// Envoy RLS keys are never asked for: the primary has no `[[limits]]`
    /// to check them against and refuses them, so an ask would only cost a
    /// claim, a link call and a warning per hot key and window.
    fn signal(&self, key: &str, spec: &Spec, remaining: u64, short: u64) {
        if threshold::crossed(spec, remaining, self.rebalance_at) && super::wire::key_limit(key) != Some("rls") {
            let _ = self.asks.try_send(Ask {
                key: key.to_owned(),
                spec: *spec,
                short,
            });
        }
    }
}

/// Tokens a grant took from the bucket, given back if the grant's future
/// is dropped before it answers (its caller's deadline passed while the
/// credit was being spent): taken for nobody, they would be lost.
struct GiveBack<'a> {
    store: &'a Arc<dyn FleetStore>,
    key: &'a str,
    spec: &'a Spec,
    unspent: Unspent,
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if self.unspent.tokens == 0 {
            return;
        }
        let (store, key, spec, unspent) = (self.store.clone(), self.key.to_owned(), *self.spec, self.unspent);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = store.release(&key, &spec, unspent).await {
                    tracing::debug!(%key, error = %e, "giving back a grant nobody waited for failed");
                }
            });
        }
    }
}

/// The grant once credit was spent: what credit is left counts as what
/// the key has left, so a key living on credit is not taken for drained
/// (blocked locally, refused with a retry time) while credit remains.
///
/// With no credit left but a transfer on its way, the retry is cut to
/// [`PENDING_RETRY_MS`]: the key is blocked that long at most, on every
/// gateway of the region, so the credit is spent as soon as it lands
/// rather than after a whole block.
fn spent_credit(grant: &mut Grant, credit: Credit) {
    grant.granted += credit.spent;
    if credit.left > 0 {
        grant.remaining = grant.remaining.max(credit.left);
        grant.retry_after_ms = 0;
    } else if credit.pending && grant.retry_after_ms > PENDING_RETRY_MS {
        grant.retry_after_ms = PENDING_RETRY_MS;
    }
}

/// The longest a key refused while its transfer is pending is blocked
/// locally: the gateway asks its store again this soon (one call per key
/// at a time), at most until the transfer is settled.
pub const PENDING_RETRY_MS: u64 = 50;

impl QuotaStore for Rebalancing {
    /// A region's slice never reserves (`reserve` is ignored): when it is
    /// spent, tokens other regions transfer arrive as credit, which only an
    /// ask finds, and a lease holding a reservation does not ask until it
    /// is due. A drained key here costs a call per block, as before
    /// reservations.
    fn grant<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        _reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        Box::pin(async move {
            let mut grant = self.inner.acquire(key, spec, want, unspent).await?;
            let remaining = grant.remaining;
            let mut short = 0;
            if grant.granted < want {
                // The bucket's tokens go back if the caller stops waiting
                // (the guard's deadline) while the credit is spent: a
                // second round trip within the same deadline.
                let mut taken = GiveBack {
                    store: &self.inner,
                    key,
                    spec,
                    unspent: Unspent {
                        tokens: grant.granted,
                        window_ms: grant.window_ms,
                        ..Unspent::default()
                    },
                };
                // The slice is spent: tokens another region transferred
                // come next. Their failure is not the acquire's.
                match self
                    .credit
                    .spend_credit(key, want - grant.granted, spec.period_ms())
                    .await
                {
                    Ok(credit) => {
                        short = credit.short;
                        spent_credit(&mut grant, credit);
                    }
                    Err(e) => tracing::debug!(%key, error = %e, "spending region credit failed"),
                }
                taken.unspent.tokens = 0;
            }
            // The bucket's own answer says whether the key crossed its
            // threshold; the shortfall sizes the ask.
            self.signal(key, spec, remaining, short);
            Ok(grant)
        })
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.release(key, spec, unspent)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.ping()
    }
}

impl FleetTables for Rebalancing {
    fn heartbeat(&self, member: u64, ttl_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.heartbeat(member, ttl_ms)
    }

    fn fair_share<'a>(&'a self, d: crate::store::Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.fair_share(d)
    }

    /// Slots are the region's own: its store holds its slice of `max`.
    fn hold_slots<'a>(&'a self, h: crate::store::Hold<'a>) -> BoxFuture<'a, Result<crate::store::Slots, StoreError>> {
        self.inner.hold_slots(h)
    }

    fn watch_overrides(&self, wake: std::sync::Arc<tokio::sync::Notify>) {
        self.inner.watch_overrides(wake)
    }

    fn overrides<'a>(
        &'a self,
        op: crate::store::OverrideOp<'a>,
    ) -> BoxFuture<'a, Result<crate::store::Overridden, StoreError>> {
        self.inner.overrides(op)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::quota::{Algorithm, Rate};
    use crate::store::memory::MemoryStore;
    use crate::store::testing::Scripted;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// The memory store, with a credit of `credit` tokens.
    fn with_credit(credit: u64) -> Arc<Scripted> {
        let store = Arc::new(Scripted::with_memory(MemoryStore::new(1_000)));
        store.credit.store(credit, Ordering::Relaxed);
        store
    }

    fn spec() -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            Rate {
                count: 10,
                period: Duration::from_secs(3_600),
            },
            10,
        )
    }

    #[tokio::test]
    async fn below_the_threshold_nothing_is_asked_and_at_it_once_per_call() {
        let (tx, mut rx) = mpsc::channel(8);
        let inner = with_credit(0);
        let store = Rebalancing::new(inner.clone(), inner, 0.8, tx);
        let s = spec();
        // 7 of 10 used: below 0.8.
        store.acquire("rl:{a:1}", &s, 7, Unspent::default()).await.unwrap();
        assert!(rx.try_recv().is_err());
        // 8 of 10: at the threshold.
        store.acquire("rl:{a:1}", &s, 1, Unspent::default()).await.unwrap();
        let ask = rx.try_recv().unwrap();
        assert_eq!(ask.key, "rl:{a:1}");
        assert_eq!(ask.spec, s);
        // An Envoy RLS key past its threshold asks nothing: the primary
        // would refuse it.
        store
            .acquire("rl:{rls:edge:k=v}", &s, 9, Unspent::default())
            .await
            .unwrap();
        assert!(rx.try_recv().is_err());
    }

    /// A drained key whose transfer is on its way is blocked for
    /// [`PENDING_RETRY_MS`] at most, not the bucket's retry time: the credit
    /// is spent as soon as it lands.
    #[tokio::test]
    async fn a_pending_transfer_cuts_the_retry_of_a_drained_key() {
        let (tx, mut rx) = mpsc::channel(8);
        let inner = with_credit(0);
        let store = Rebalancing::new(inner.clone(), inner.clone(), 0.8, tx);
        let s = spec();
        let g = store.acquire("rl:{a:1}", &s, 11, Unspent::default()).await.unwrap();
        assert_eq!(g.granted, 10);
        assert!(g.retry_after_ms > 60_000, "10/h: a token in 6 minutes: {g:?}");
        // The shortfall the spend measured sizes the ask (1 short here).
        let ask = rx.try_recv().expect("the drained key asked");
        assert_eq!(ask.short, 1, "{ask:?}");
        inner.pending.store(true, Ordering::SeqCst);
        let g = store.acquire("rl:{a:1}", &s, 1, Unspent::default()).await.unwrap();
        assert_eq!((g.granted, g.retry_after_ms), (0, PENDING_RETRY_MS));
        // Landed: spent at once.
        inner.credit.store(3, Ordering::SeqCst);
        inner.pending.store(false, Ordering::SeqCst);
        let g = store.acquire("rl:{a:1}", &s, 1, Unspent::default()).await.unwrap();
        assert_eq!((g.granted, g.remaining, g.retry_after_ms), (1, 2, 0));
    }

    #[tokio::test]
    async fn a_short_bucket_spends_credit_and_a_full_queue_never_blocks() {
        let (tx, _rx) = mpsc::channel(1);
        let inner = with_credit(4);
        let store = Rebalancing::new(inner.clone(), inner.clone(), 0.5, tx);
        let s = spec();
        let g = store.acquire("rl:{a:1}", &s, 12, Unspent::default()).await.unwrap();
        assert_eq!(g.granted, 12, "10 from the bucket and 2 of the credit");
        // The bucket is empty but credit is left: the grant says so, so
        // the limiter does not block the key as drained.
        assert_eq!((g.remaining, g.retry_after_ms), (2, 0));
        let g = store.acquire("rl:{a:1}", &s, 5, Unspent::default()).await.unwrap();
        assert_eq!(g.granted, 2, "the rest of the credit, and no more");
        // The queue (1) is full from the first call: these return at once.
        for _ in 0..10 {
            let g = tokio::time::timeout(
                Duration::from_millis(50),
                store.acquire("rl:{a:1}", &s, 1, Unspent::default()),
            )
            .await
            .unwrap()
            .unwrap();
            assert_eq!(g.granted, 0);
        }
    }

    /// The guard's deadline passes while the credit is spent (a second
    /// round trip in the same deadline): the bucket's tokens the grant
    /// took go back, not to nobody.
    #[tokio::test(start_paused = true)]
    async fn a_grant_dropped_while_spending_credit_gives_the_buckets_tokens_back() {
        let (tx, _rx) = mpsc::channel(8);
        let inner = with_credit(5);
        inner.delay(crate::store::testing::Call::SpendCredit, 50);
        let store = Rebalancing::new(inner.clone(), inner.clone(), 0.8, tx);
        let s = spec();
        let dropped = tokio::time::timeout(
            Duration::from_millis(10),
            store.acquire("rl:{a:1}", &s, 12, Unspent::default()),
        )
        .await;
        assert!(dropped.is_err(), "the deadline passed mid-spend");
        tokio::time::sleep(Duration::from_millis(1)).await;
        // All 10 of the bucket's are there again.
        let probe = inner
            .memory()
            .acquire("rl:{a:1}", &s, 20, Unspent::default())
            .await
            .unwrap();
        assert_eq!(probe.granted, 10, "{probe:?}");
    }
}
