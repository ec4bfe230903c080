//! The fleet's tables beside the quota buckets, each a hash named after
//! its key (outside the braces: the same Cluster slot): a concurrency
//! limit's slots per instance (`lua/slots.lua`) and RLQS streams' demands
//! (`lua/fair_share.lua`).

use std::sync::LazyLock;

use redis::Script;

use super::RedisStore;
use crate::store::{BoxFuture, Demand, Hold, Slots, StoreError};

static SLOTS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/slots.lua")));
static FAIR_SHARE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/fair_share.lua")));

/// The scripts of this file, loaded on every new connection.
pub(super) fn scripts() -> [&'static Script; 2] {
    [&SLOTS, &FAIR_SHARE]
}

impl RedisStore {
    /// `lua/slots.lua` on a hash named after the key (outside its braces:
    /// the same Cluster slot).
    pub(super) fn slots_call<'a>(&'a self, h: Hold<'a>) -> BoxFuture<'a, Result<Slots, StoreError>> {
        let call = self.call_keys(
            &SLOTS,
            vec![format!("{}:slots", h.key)],
            vec![h.member, h.hold, h.want, h.max, h.ttl_ms],
        );
        Box::pin(async move {
            call.await.map(|r| Slots {
                granted: r[0],
                held: r[1],
            })
        })
    }

    /// `lua/fair_share.lua` on a hash beside the bucket (outside its
    /// braces: the same Cluster slot).
    pub(super) fn fair_share_call<'a>(&'a self, d: Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        let call = self.call_keys(
            &FAIR_SHARE,
            vec![format!("{}:demand", d.key)],
            vec![d.member, d.demand, d.rate, d.ttl_ms],
        );
        Box::pin(async move { call.await.map(|r| r[0]) })
    }
}
