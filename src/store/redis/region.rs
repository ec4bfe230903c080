//! The region calls on Redis ([`RegionStore`]): each one atomic Lua
//! script of `lua/region/`. The primary's transfer-out wraps the acquire
//! script of each algorithm, so the bucket math exists once; the
//! requesting region's credit, its spending and the claim that elects one
//! asker per key and window live in keys beside the bucket's, in its hash
//! slot.

use std::sync::LazyLock;

use redis::Script;

use super::RedisStore;
use crate::quota::{Algorithm, Spec};
use crate::store::{BoxFuture, Credit, RegionStore, StoreError};

static TRANSFER_OUT_BUCKET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../../lua/region/transfer_out_head.lua"),
        include_str!("../../../lua/token_bucket.lua"),
        include_str!("../../../lua/region/transfer_out_tail.lua"),
    ))
});
static TRANSFER_OUT_WINDOW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../../lua/region/transfer_out_head.lua"),
        include_str!("../../../lua/sliding_window.lua"),
        include_str!("../../../lua/region/transfer_out_tail.lua"),
    ))
});
static TRANSFER_OUT_FIXED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../../lua/region/transfer_out_head.lua"),
        include_str!("../../../lua/calendar.lua"),
        include_str!("../../../lua/fixed_window.lua"),
        include_str!("../../../lua/region/transfer_out_tail.lua"),
    ))
});
static CREDIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/region/credit.lua")));
static SPEND_CREDIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/region/spend_credit.lua")));
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/region/claim.lua")));
static UNCLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/region/unclaim.lua")));

/// The scripts of this file, loaded on every new connection.
pub(super) fn scripts() -> [&'static Script; 7] {
    [
        &TRANSFER_OUT_BUCKET,
        &TRANSFER_OUT_WINDOW,
        &TRANSFER_OUT_FIXED,
        &CREDIT,
        &SPEND_CREDIT,
        &CLAIM,
        &UNCLAIM,
    ]
}

/// A key beside a bucket, outside its braces: the same hash slot, so a
/// script may touch both in a Redis Cluster.
fn beside(key: &str, suffix: &str) -> String {
    format!("{key}:{suffix}")
}

impl RegionStore for RedisStore {
    fn transfer_out<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        id: u64,
        want: u64,
        keep: u64,
        remember_ms: u64,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let keys = vec![key.to_owned(), beside(key, &format!("xfer:{id:016x}"))];
        let call = match spec.algorithm {
            Algorithm::TokenBucket => self.call_keys(
                &TRANSFER_OUT_BUCKET,
                keys,
                vec![
                    spec.count,
                    spec.period_ms(),
                    spec.capacity,
                    want,
                    0,
                    0,
                    remember_ms,
                    keep,
                    4,
                ],
            ),
            Algorithm::SlidingWindow => self.call_keys(
                &TRANSFER_OUT_WINDOW,
                keys,
                vec![spec.capacity, spec.period_ms(), want, 0, 0, 0, remember_ms, keep, 3],
            ),
            Algorithm::FixedWindow => self.call_keys(
                &TRANSFER_OUT_FIXED,
                keys,
                vec![
                    spec.capacity,
                    spec.period_ms(),
                    want,
                    0,
                    0,
                    spec.calendar().code(),
                    remember_ms,
                    keep,
                    3,
                ],
            ),
            Algorithm::Concurrency => return Box::pin(std::future::ready(Ok(0))),
        };
        Box::pin(async move { call.await.map(|r| r[0]) })
    }

    fn credit<'a>(&'a self, key: &'a str, id: u64, tokens: u64, ttl_ms: u64) -> BoxFuture<'a, Result<u64, StoreError>> {
        let keys = vec![
            beside(key, "credit"),
            beside(key, &format!("credited:{id:016x}")),
            beside(key, "pending"),
        ];
        let call = self.call_keys(&CREDIT, keys, vec![tokens, ttl_ms.max(1)]);
        Box::pin(async move { call.await.map(|r| r[0]) })
    }

    fn spend_credit<'a>(
        &'a self,
        key: &'a str,
        want: u64,
        period_ms: u64,
    ) -> BoxFuture<'a, Result<Credit, StoreError>> {
        let keys = [beside(key, "credit"), beside(key, "pending"), beside(key, "short")];
        let Some(mut connection) = self.connection.get().cloned() else {
            return Box::pin(std::future::ready(Err(super::not_connected())));
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let period_ms = period_ms.max(1);
        self.io.spawn(async move {
            let refund = keys[0].clone();
            let keys_ref: Vec<&str> = keys.iter().map(String::as_str).collect();
            let result = connection.run_keys(&SPEND_CREDIT, &keys_ref, &[want, period_ms]).await;
            // The caller stopped waiting (its deadline passed) after the
            // script spent credit: the tokens go back as a batch of their
            // own, for a period, instead of being spent for nobody.
            if let Err(Ok([spent, ..])) = answer.send(result) {
                if spent > 0 {
                    let marker = format!("{refund}ed:{:016x}", fastrand::u64(..));
                    let keys = [refund.as_str(), marker.as_str(), &format!("{refund}:refund")];
                    if let Err(e) = connection.run_keys(&CREDIT, &keys, &[spent, period_ms]).await {
                        tracing::debug!(key = %refund, error = %e.classify(), "giving back late spent credit failed");
                    }
                }
            }
        });
        Box::pin(async move {
            match answered.await {
                Ok(Ok([spent, left, pending, short, ..])) => Ok(Credit {
                    spent,
                    left,
                    pending: pending == 1,
                    short,
                }),
                Ok(Err(e)) => Err(e.classify()),
                Err(_) => Err(StoreError::Failed("the Redis I/O thread stopped".into())),
            }
        })
    }

    fn claim<'a>(&'a self, key: &'a str, window: u64, ttl_ms: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        // Pending for as long as the asker may keep asking (half the
        // claim's life: the window it is for).
        let call = self.call_keys(
            &CLAIM,
            vec![beside(key, &format!("claim:{window}")), beside(key, "pending")],
            vec![ttl_ms.max(1), (ttl_ms / 2).max(1)],
        );
        Box::pin(async move { call.await.map(|r| r[0] == 1) })
    }

    fn unclaim<'a>(&'a self, key: &'a str, window: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        let call = self.call_keys(
            &UNCLAIM,
            vec![beside(key, &format!("claim:{window}")), beside(key, "pending")],
            vec![],
        );
        Box::pin(async move { call.await.map(|_| ()) })
    }
}
