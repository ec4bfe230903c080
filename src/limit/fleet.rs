//! How many instances share the store: counted from their heartbeats in
//! the store (`lua/fleet.lua`), bounded by `[store] fleet_size` when it is
//! set. The local fallback divides a key's quota by it, so a fleet that
//! falls back together admits about its quota, not its size times it.
//!
//! The count is the store's last answer: while the store is away (when the
//! fallback needs it) it stays what it was before the outage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Limiter;
use crate::clock::Clock;
use crate::store::{FleetStore, StoreError};

/// How often an instance renews its heartbeat.
pub const HEARTBEAT_EVERY_MS: u64 = 2_000;

/// How long a heartbeat lives: three renewals missed and the instance is
/// no longer counted.
pub const HEARTBEAT_TTL_MS: u64 = 3 * HEARTBEAT_EVERY_MS;

/// The live count, as of the store's last heartbeat answer: written by
/// the [`Heartbeat`], read by the limiter.
#[derive(Debug, Default)]
pub(super) struct Fleet {
    /// Live instances, 0 until the store first answered.
    live: AtomicU64,
    /// When it answered, ms on the limiter's clock.
    counted_at: AtomicU64,
}

/// The fleet as an operator sees it (`/config`, the status page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FleetView {
    /// Live instances by their heartbeats; `None` until the store answered.
    pub live: Option<u64>,
    /// Milliseconds since the store last answered a heartbeat.
    pub counted_ms_ago: Option<u64>,
    /// `[store] fleet_size`, the upper bound, if set.
    pub fleet_size: Option<u64>,
    /// What the fallback divides a quota by now.
    pub divisor: u64,
}

/// What the fallback divides a quota by: the live count, bounded by the
/// configured size; the configured size until the store has answered; 1
/// when neither is known.
pub fn divisor(live: Option<u64>, configured: Option<u64>) -> u64 {
    match (live, configured) {
        (Some(live), Some(size)) => live.min(size),
        (Some(n), None) | (None, Some(n)) => n,
        (None, None) => 1,
    }
    .max(1)
}

impl Fleet {
    fn live(&self) -> Option<u64> {
        match self.live.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

/// This instance's heartbeat in the fleet's table: a task of its own,
/// started by the composition root, that writes the live count the
/// limiter's fallback reads.
pub struct Heartbeat {
    store: Arc<dyn FleetStore>,
    fleet: Arc<Fleet>,
    clock: Clock,
    member: u64,
}

impl Heartbeat {
    /// The heartbeat of `member` (this instance: random per process,
    /// unique in the fleet) for `limiter`'s store and count.
    pub fn of(limiter: &Limiter, member: u64) -> Heartbeat {
        Heartbeat {
            store: limiter.store.clone(),
            fleet: limiter.fleet.clone(),
            clock: limiter.clock.clone(),
            member,
        }
    }

    /// Renews the heartbeat in the store and keeps the live count it
    /// answers. A failed heartbeat keeps the last count.
    pub async fn beat(&self) -> Result<u64, StoreError> {
        let live = self.store.heartbeat(self.member, HEARTBEAT_TTL_MS).await?;
        self.fleet.live.store(live.max(1), Ordering::Relaxed);
        self.fleet.counted_at.store((self.clock)(), Ordering::Relaxed);
        Ok(live)
    }

    /// This instance leaves the fleet (shutdown): the others stop counting
    /// it at once rather than when its heartbeat expires.
    pub async fn leave(&self) {
        if let Err(e) = self.store.heartbeat(self.member, 0).await {
            tracing::debug!(error = %e, "leaving the fleet's heartbeats failed; they expire on their own");
        }
    }

    /// Beats every [`HEARTBEAT_EVERY_MS`] for as long as the task runs,
    /// logging the live count when it changes.
    pub async fn run(self: Arc<Self>) {
        let every = std::time::Duration::from_millis(HEARTBEAT_EVERY_MS);
        let mut last = None;
        loop {
            match self.beat().await {
                Ok(live) if last != Some(live) => {
                    tracing::info!(live, "fleet: instances live by their heartbeats");
                    last = Some(live);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "fleet heartbeat failed; the last count stands"),
            }
            tokio::time::sleep(every).await;
        }
    }
}

impl Limiter {
    /// What the fallback divides a quota by now.
    pub(super) fn fleet_divisor(&self, settings: &super::Settings) -> u64 {
        divisor(self.fleet.live(), settings.fleet_size)
    }
}

impl FleetView {
    /// `fleet` as counted at `now_ms`, bounded by the configured size.
    pub(super) fn now(fleet: &Fleet, configured: Option<u64>, now_ms: u64) -> FleetView {
        let live = fleet.live();
        FleetView {
            live,
            counted_ms_ago: live.map(|_| now_ms.saturating_sub(fleet.counted_at.load(Ordering::Relaxed))),
            fleet_size: configured,
            divisor: divisor(live, configured),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_count_rules_and_a_configured_size_bounds_it() {
        assert_eq!(divisor(None, None), 1);
        assert_eq!(divisor(None, Some(4)), 4);
        assert_eq!(divisor(Some(3), None), 3);
        assert_eq!(divisor(Some(3), Some(10)), 3);
        assert_eq!(divisor(Some(12), Some(10)), 10);
        assert_eq!(divisor(Some(0), None), 1);
    }
}
