//! What the limiter can tell an operator about its keys: the state of one
//! store key (`GET /limits/state` on the admin listener, read by
//! `leasegate explain --admin`) and a bounded sample of the busiest and
//! most-refused keys (the admin status page).
//!
//! Read-only: nothing here spends, counts, blocks or calls the store. Both
//! are for the admin listener, not for requests: a key is found by a scan of
//! the lease table (see [`LeaseTable::find`](super::table::LeaseTable::find)),
//! and the hot keys come from at most [`HOT_KEY_SAMPLE`] leases.

use serde::Serialize;

use super::blocked;
use super::table::SHARDS;
use super::Limiter;

/// Most leases [`Report::hot_keys`] looks at, whatever the table holds.
pub const HOT_KEY_SAMPLE: usize = 4_096;

/// Most keys [`Report::hot_keys`] ranks per list.
pub const MAX_HOT_KEYS: usize = 100;

/// This instance's view of one store key. All zeros (and `tracked: false`)
/// when the instance has no lease for it. The wire format of
/// `/limits/state`, read back by `leasegate explain --admin` (a field a
/// gateway did not send reads as zero).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct KeyState {
    pub key: String,
    /// The instance holds a lease for the key.
    pub tracked: bool,
    /// Tokens leased and not yet spent or expired: requests admitted here
    /// without asking the store.
    pub tokens_at_hand: u64,
    /// Tokens a drained token bucket reserved for this instance and not
    /// moved to those at hand yet: spent here as they come due, with no
    /// store call.
    pub tokens_reserved: u64,
    /// How long requests for the key are still refused from memory, after
    /// the store refused it (or until its next reserved token is due).
    pub blocked_for_ms: u64,
    /// Until the store's retry time of the last refusal (0: passed or none).
    pub retry_after_ms: u64,
    /// What the store had left at its last answer.
    pub store_remaining: u64,
    /// Until the shared bucket is whole again, as of the store's last answer.
    pub reset_ms: u64,
    /// How the key's last store call failed, or `None` when it answered.
    pub last_store_failure: Option<String>,
    /// The override in force for the caller under the key's limit, when
    /// the request named the caller (`who=`): `who`, `rate`, `burst` and
    /// `expires`, as `GET /overrides` lists it.
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    pub overridden: Option<ShownOverride>,
}

/// An override as `/limits/state` and `explain --admin` show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ShownOverride {
    pub who: String,
    pub rate: String,
    pub burst: u64,
    pub expires: Option<String>,
}

/// One key of the status page's hot lists.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HotKey {
    pub key: String,
    /// This instance's admitted rate for the key, per second, averaged over
    /// about a minute as of the store's last answer (`Lease::admitted_rate`).
    pub admitted_per_sec: f64,
    /// Admitted in about the last minute (the same average, not scaled up
    /// while young): the figure for a quota per minute or longer.
    pub admitted_last_minute: f64,
    /// The period of the key's quota, ms: the unit its rate is shown in.
    pub period_ms: u64,
    /// Requests refused in the key's current over-quota window (one period
    /// of its quota).
    pub refusals: u64,
}

/// The busiest and most-refused keys of a bounded sample of the lease table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HotKeys {
    /// Leases looked at (at most [`HOT_KEY_SAMPLE`]).
    pub sampled: usize,
    /// Leases in the table (approximate: shards are counted one at a time).
    pub tracked: usize,
    /// By admitted rate, highest first; keys with none are left out.
    pub busiest: Vec<HotKey>,
    /// By refusals in their window, most first; keys with none are left out.
    pub most_limited: Vec<HotKey>,
}

/// What an operator may read of a limiter, and nothing else: its keys,
/// the fleet as counted, the overrides in force, the store's name. Got
/// from [`Limiter::report`]; borrowed, so it never outlives a reload.
pub struct Report<'a> {
    limiter: &'a Limiter,
}

impl<'a> Report<'a> {
    pub(super) fn of(limiter: &'a Limiter) -> Report<'a> {
        Report { limiter }
    }

    /// Tokens at hand over every lease of this instance (what it would
    /// strand if it died now).
    pub fn tokens_at_hand(&self) -> u64 {
        let mut n = 0;
        self.limiter.leases.for_each(|l| n += l.available());
        n
    }

    /// Keys with a lease now.
    pub fn tracked_keys(&self) -> usize {
        self.limiter.leases.len()
    }

    /// Background releases waiting or in flight.
    pub fn pending_releases(&self) -> usize {
        self.limiter.releases.pending()
    }

    /// Keys with in-flight slots tracked on this instance.
    pub fn slot_keys(&self) -> usize {
        self.limiter.slots.len()
    }

    /// The store's name (`memory`, `redis`).
    pub fn store_name(&self) -> &'static str {
        self.limiter.store.name()
    }

    /// The fleet as counted now.
    pub fn fleet(&self) -> super::fleet::FleetView {
        let l = self.limiter;
        super::fleet::FleetView::now(&l.fleet, l.settings().fleet_size, l.now_ms())
    }

    /// Every override in force: (limit, who, override), sorted.
    pub fn overrides(&self) -> Vec<(String, String, super::overrides::Override)> {
        self.limiter.overrides.in_force(self.limiter.wall_ms())
    }

    /// The state of the lease of store key `key` (`rl:{...}`), if this
    /// instance holds one. A scan of the lease table: admin use only.
    pub fn key_state(&self, key: &str) -> KeyState {
        self.key_states(&[key])
            .pop()
            .unwrap_or_else(|| self.state_of(key, None))
    }

    /// The states of `keys`, in their order, from one scan of the table.
    pub fn key_states(&self, keys: &[&str]) -> Vec<KeyState> {
        let leases = self.limiter.leases.find_all(keys);
        keys.iter().zip(leases).map(|(k, l)| self.state_of(k, l)).collect()
    }

    fn state_of(&self, key: &str, lease: Option<super::lease::SharedLease>) -> KeyState {
        let Some(lease) = lease else {
            return KeyState {
                key: key.to_string(),
                tracked: false,
                tokens_at_hand: 0,
                tokens_reserved: 0,
                blocked_for_ms: 0,
                retry_after_ms: 0,
                store_remaining: 0,
                reset_ms: 0,
                last_store_failure: None,
                overridden: None,
            };
        };
        let now = self.limiter.now_ms();
        let at_hand = lease.spendable(now);
        KeyState {
            key: key.to_string(),
            tracked: true,
            tokens_at_hand: at_hand,
            tokens_reserved: lease.reserved(),
            blocked_for_ms: blocked::remaining(&lease, now).unwrap_or(0),
            retry_after_ms: blocked::retry_pending(&lease, now),
            store_remaining: lease.store_remaining(),
            reset_ms: lease.reset_ms(now),
            last_store_failure: lease.last_failure().map(|e| e.to_string()),
            overridden: None,
        }
    }

    /// The `n` busiest and `n` most-refused keys (at most
    /// [`MAX_HOT_KEYS`]) among at most [`HOT_KEY_SAMPLE`] leases, whole
    /// shards from a random one on: exact while the table holds fewer, a
    /// sample beyond. Key strings are copied only for keys that make a list.
    pub fn hot_keys(&self, n: usize) -> HotKeys {
        let n = n.min(MAX_HOT_KEYS);
        let now = self.limiter.now_ms();
        let mut busiest: Vec<HotKey> = Vec::with_capacity(n + 1);
        let mut most_limited: Vec<HotKey> = Vec::with_capacity(n + 1);
        let sampled = self
            .limiter
            .leases
            .sample(fastrand::usize(..SHARDS), HOT_KEY_SAMPLE, |lease| {
                let rate = lease.admitted_rate();
                let period = lease.spec().map_or(60_000, |s| s.period_ms());
                let refusals = lease.refusals_in_window(now, period);
                let entry = || HotKey {
                    key: lease.key().to_string(),
                    admitted_per_sec: rate,
                    admitted_last_minute: lease.admitted_last_minute(),
                    period_ms: period,
                    refusals,
                };
                if rate > 0.0 {
                    keep_top(&mut busiest, n, rate, |h| h.admitted_per_sec, entry);
                }
                if refusals > 0 {
                    keep_top(&mut most_limited, n, refusals, |h| h.refusals, entry);
                }
            });
        // Keys refused in a window still open whose lease was forgotten
        // since: they stay on the list for their window.
        for (key, refusals) in self.limiter.forgotten.open(now) {
            if n == 0 || most_limited.iter().any(|h| *h.key == *key) {
                continue;
            }
            let entry = || HotKey {
                key: key.to_string(),
                admitted_per_sec: 0.0,
                admitted_last_minute: 0.0,
                period_ms: 0,
                refusals,
            };
            keep_top(&mut most_limited, n, refusals, |h| h.refusals, entry);
        }
        HotKeys {
            sampled,
            tracked: self.limiter.leases.len(),
            busiest,
            most_limited,
        }
    }
}

/// Puts the key `entry` makes into `list` (highest `of` first, at most
/// `n`) if its `score` earns a place; the key string is made only then.
fn keep_top<S: PartialOrd + Copy>(
    list: &mut Vec<HotKey>,
    n: usize,
    score: S,
    of: impl Fn(&HotKey) -> S,
    entry: impl FnOnce() -> HotKey,
) {
    if n == 0 || (list.len() >= n && !list.last().is_some_and(|l| score > of(l))) {
        return;
    }
    let at = list.partition_point(|h| of(h) >= score);
    list.insert(at, entry());
    list.truncate(n);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::monotonic_clock;
    use crate::limit::policy::{Draft, Limit, StoreFailure};
    use crate::limit::testing::{facts, settings};
    use crate::limit::LimitRuntime;
    use crate::store::memory::MemoryStore;
    use crate::telemetry::metrics::Metrics;

    fn limiter() -> Arc<Limiter> {
        Limiter::new(Arc::new(MemoryStore::new(10_000)), settings(), monotonic_clock())
    }

    #[tokio::test]
    async fn a_refused_key_reports_its_block_and_an_unknown_key_zeros() {
        let limiter = limiter();
        let limits = vec![Arc::new(LimitRuntime::new(
            Arc::new(Limit::try_new(Draft::new("five", "5/min".parse().unwrap())).unwrap()),
            "test",
            &Metrics::new(),
        ))];
        let h = http::HeaderMap::new();
        for _ in 0..5 {
            assert_eq!(
                limiter
                    .check(
                        &crate::limit::testing::pick(&limits, &[0]),
                        &[],
                        &facts("a", &h),
                        StoreFailure::Allow
                    )
                    .await
                    .committed()
                    .refused_at(),
                None
            );
        }
        for _ in 0..3 {
            assert_eq!(
                limiter
                    .check(
                        &crate::limit::testing::pick(&limits, &[0]),
                        &[],
                        &facts("a", &h),
                        StoreFailure::Allow
                    )
                    .await
                    .committed()
                    .refused_at(),
                Some(0)
            );
        }
        let s = limiter.report().key_state("rl:{five:a}");
        assert!(s.tracked);
        assert_eq!(s.tokens_at_hand, 0);
        assert_eq!(s.store_remaining, 0);
        assert!(s.blocked_for_ms > 0 && s.blocked_for_ms <= 5_000, "{s:?}");
        assert!(s.retry_after_ms > 10_000 && s.retry_after_ms <= 12_000, "{s:?}");
        assert!(s.reset_ms > 0, "{s:?}");
        assert_eq!(s.last_store_failure, None);

        let none = limiter.report().key_state("rl:{five:nobody}");
        assert!(!none.tracked);
        assert_eq!(
            none.tokens_at_hand + none.blocked_for_ms + none.retry_after_ms + none.reset_ms,
            0
        );

        let hot = limiter.report().hot_keys(10);
        assert_eq!(hot.sampled, 1);
        assert_eq!(hot.most_limited.len(), 1);
        assert_eq!(hot.most_limited[0].key, "rl:{five:a}");
        assert_eq!(hot.most_limited[0].refusals, 3);
    }

    #[tokio::test]
    async fn hot_keys_rank_by_rate_and_refusals_within_the_bound() {
        let limiter = limiter();
        let limits = vec![Arc::new(LimitRuntime::new(
            Arc::new(Limit::try_new(Draft::new("two", "2/min".parse().unwrap())).unwrap()),
            "test",
            &Metrics::new(),
        ))];
        let h = http::HeaderMap::new();
        // Key kN is refused N times.
        for n in 0..6u64 {
            let id = format!("k{n}");
            for _ in 0..(2 + n) {
                limiter
                    .check(
                        &crate::limit::testing::pick(&limits, &[0]),
                        &[],
                        &facts(&id, &h),
                        StoreFailure::Allow,
                    )
                    .await
                    .committed();
            }
        }
        let hot = limiter.report().hot_keys(3);
        let keys: Vec<_> = hot.most_limited.iter().map(|k| (k.key.as_str(), k.refusals)).collect();
        assert_eq!(keys, [("rl:{two:k5}", 5), ("rl:{two:k4}", 4), ("rl:{two:k3}", 3)]);
        assert!(hot.busiest.len() <= 3);
        assert!(hot
            .busiest
            .windows(2)
            .all(|w| w[0].admitted_per_sec >= w[1].admitted_per_sec));
        assert_eq!(limiter.report().hot_keys(0).busiest.len(), 0);
    }

    /// The status page promises a refused key stays on the most-limited
    /// list for its window (one period of its quota): past the sweeper,
    /// which forgets an idle lease within seconds.
    #[tokio::test]
    async fn a_refused_key_stays_listed_for_its_window_after_its_lease_is_forgotten() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let now = Arc::new(AtomicU64::new(1_000_000));
        let read = now.clone();
        let clock: crate::clock::Clock = Arc::new(move || read.load(Ordering::SeqCst));
        let store = Arc::new(MemoryStore::with_clock(10_000, clock.clone()));
        let limiter = Limiter::new(store, settings(), clock);
        let limits = vec![Arc::new(LimitRuntime::new(
            Arc::new(Limit::try_new(Draft::new("two", "2/min".parse().unwrap())).unwrap()),
            "test",
            &Metrics::new(),
        ))];
        let h = http::HeaderMap::new();
        for _ in 0..5 {
            limiter
                .check(
                    &crate::limit::testing::pick(&limits, &[0]),
                    &[],
                    &facts("k", &h),
                    StoreFailure::Allow,
                )
                .await
                .committed();
        }
        let listed = |limiter: &Limiter| {
            let hot = limiter.report().hot_keys(10);
            hot.most_limited
                .iter()
                .map(|k| (k.key.clone(), k.refusals))
                .collect::<Vec<_>>()
        };
        assert_eq!(listed(&limiter), [("rl:{two:k}".to_string(), 3)]);
        // Idle for 10 s: the sweeper forgets the lease; the key stays.
        now.fetch_add(10_000, Ordering::SeqCst);
        limiter.sweeper().sweep(6_000).await;
        assert_eq!(limiter.report().tracked_keys(), 0);
        assert_eq!(listed(&limiter), [("rl:{two:k}".to_string(), 3)]);
        // Until its window (a minute from the first refusal) closes.
        now.fetch_add(50_000, Ordering::SeqCst);
        assert!(listed(&limiter).is_empty());
    }
}
