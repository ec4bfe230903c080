//! How many instances share the store: counted from their heartbeats in
//! the store (`lua/fleet.lua`), bounded by `[store] fleet_size` when it is
//! set. The local fallback divides a key's quota by it, so a fleet that
//! falls back together admits about its quota, not its size times it.
//!
//! The count is the store's last answer: while the store is away (when the
//! fallback needs it) it stays what it was before the outage.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Limiter;

/// How often an instance renews its heartbeat.
pub const HEARTBEAT_EVERY_MS: u64 = 2_000;

/// How long a heartbeat lives: three renewals missed and the instance is
/// no longer counted.
pub const HEARTBEAT_TTL_MS: u64 = 3 * HEARTBEAT_EVERY_MS;

/// The live count, as of the store's last heartbeat answer.
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

impl Limiter {
    /// Renews this instance's heartbeat (`member`) in the store and keeps
    /// the live count it answers. A failed heartbeat keeps the last count.
    pub async fn heartbeat(&self, member: u64) -> Result<u64, crate::store::StoreError> {
        let live = self.store.heartbeat(member, HEARTBEAT_TTL_MS).await?;
        self.fleet.live.store(live.max(1), Ordering::Relaxed);
        self.fleet.counted_at.store(self.now_ms(), Ordering::Relaxed);
        Ok(live)
    }

    /// This instance leaves the fleet (shutdown): the others stop counting
    /// it at once rather than when its heartbeat expires.
    pub async fn leave_fleet(&self, member: u64) {
        if let Err(e) = self.store.heartbeat(member, 0).await {
            tracing::debug!(error = %e, "leaving the fleet's heartbeats failed; they expire on their own");
        }
    }

    /// What the fallback divides a quota by now.
    pub(super) fn fleet_divisor(&self, settings: &super::Settings) -> u64 {
        divisor(self.live(), settings.fleet_size)
    }

    fn live(&self) -> Option<u64> {
        match self.fleet.live.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// The fleet as counted now.
    pub fn fleet(&self) -> FleetView {
        let live = self.live();
        let configured = self.settings().fleet_size;
        FleetView {
            live,
            counted_ms_ago: live.map(|_| {
                self.now_ms()
                    .saturating_sub(self.fleet.counted_at.load(Ordering::Relaxed))
            }),
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
