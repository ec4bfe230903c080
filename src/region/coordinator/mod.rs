//! The background side of a region with a primary: takes the asks the
//! request path signalled, elects one gateway of the region per key and
//! window (a claim in the regional store), asks the primary over the link,
//! and credits what it grants to the regional store.
//!
//! Nothing here runs in a request's await. A failed exchange (timeout,
//! refused connection, 5xx) is asked again with the same transfer id and
//! [`BACKOFF`] until the window ends, so a grant that landed while its
//! answer was lost is still credited; a hung link keeps at most
//! [`IN_FLIGHT`] asks retrying (more are dropped), and requests keep being
//! decided against the region's own slice. A transfer given up releases
//! its claim.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, Semaphore};

use super::link::{LinkClient, LinkError};
use super::rebalancing::Ask;
use super::threshold;
use super::wire::{TransferAnswer, TransferRequest};
use crate::clock::Clock;
use crate::store::RegionStore;
use crate::sync::Recover;

/// Transfers asked at once; asks beyond it are dropped (the key asks
/// again on its next store call).
pub const IN_FLIGHT: usize = 16;
/// Between attempts of one transfer (the same id each time): the first
/// pause, doubled after each failure up to the second.
pub const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(4));
/// While the link is down, a probe this often finds it back.
const PROBE_EVERY: Duration = Duration::from_secs(2);

/// Keys remembered per window on one gateway; past it, the set starts over.
const MAX_ASKED: usize = 100_000;

/// The keys one gateway handled in `window`.
#[derive(Debug, Default)]
struct Asked {
    window: u64,
    keys: HashSet<String>,
}

/// The region's metrics: `leasegate_region_link_up` and
/// `leasegate_region_transfers_total{result}`.
#[derive(Clone, Debug)]
pub struct LinkMetrics {
    pub link_up: Gauge,
    pub granted: Counter,
    pub refused: Counter,
    pub error: Counter,
}

/// What an ask came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Another gateway of the region asks for this key in this window (or
    /// this one already did).
    NotElected,
    Granted(u64),
    /// The primary had nothing to give.
    Refused,
    Error,
}

pub struct Coordinator {
    pub region: String,
    pub window_ms: u64,
    pub store: Arc<dyn RegionStore>,
    pub client: LinkClient,
    pub metrics: LinkMetrics,
    pub clock: Clock,
    /// `[region] id_secret_file`: keys the transfer ids.
    pub id_secret: Option<threshold::IdSecret>,
    in_flight: Arc<Semaphore>,
    /// The keys this gateway handled in the current window: repeated asks
    /// of a hot key cost a set lookup, not a store call.
    asked: Mutex<Asked>,
    /// [`BACKOFF`], shorter in tests.
    pub backoff: (Duration, Duration),
}

impl Coordinator {
    pub fn new(
        region: String,
        window_ms: u64,
        store: Arc<dyn RegionStore>,
        client: LinkClient,
        metrics: LinkMetrics,
        clock: Clock,
        id_secret: Option<threshold::IdSecret>,
    ) -> Arc<Coordinator> {
        // Unknown (0) until the first probe, right at the start of `run`.
        Arc::new(Coordinator {
            region,
            window_ms: window_ms.max(1),
            store,
            client,
            metrics,
            clock,
            id_secret,
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
            asked: Mutex::new(Asked::default()),
            backoff: BACKOFF,
        })
    }

    /// Takes asks until the channel closes.
    pub async fn run(self: Arc<Self>, mut asks: mpsc::Receiver<Ask>) {
        tokio::spawn(self.clone().probe_while_down());
        while let Some(ask) = asks.recv().await {
            let window = threshold::window_index((self.clock)(), self.window_ms);
            if !self.first_here(&ask.key, window) {
                continue;
            }
            let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
                // Busy with others: forget it, so a later ask may try.
                self.forget(&ask.key);
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move {
                me.rebalance(&ask, window).await;
                drop(permit);
            });
        }
    }

    fn first_here(&self, key: &str, window: u64) -> bool {
        let mut asked = self.asked.lock().recover();
        // A new window starts afresh: no scan of the old keys, ever.
        if asked.window != window {
            asked.window = window;
            asked.keys.clear();
        }
        if asked.keys.len() >= MAX_ASKED && !asked.keys.contains(key) {
            // Bounded: start over (one clear per MAX_ASKED keys); the
            // region's claim still stops a second transfer.
            asked.keys.clear();
        }
        asked.keys.insert(key.to_owned())
    }

    fn forget(&self, key: &str) {
        {
            let mut asked = self.asked.lock().recover();
            asked.keys.remove(key);
        }
    }

    /// One ask: claim, transfer, credit, count.
    pub async fn rebalance(&self, ask: &Ask, window: u64) -> Outcome {
        let started = (self.clock)();
        // One claim per key and (wall-clock aligned) window, the window the
        // transfer id names too; kept a window past its end so a gateway
        // whose clock lags a little still finds it.
        match self
            .store
            .claim(&ask.key, window, self.window_ms.saturating_mul(2))
            .await
        {
            Ok(true) => {}
            Ok(false) => return Outcome::NotElected,
            Err(e) => {
                // Without the regional store there is nothing to credit to.
                tracing::warn!(key = %ask.key, error = %e, "region: claim failed");
                self.metrics.error.inc();
                self.forget(&ask.key);
                return Outcome::Error;
            }
        }
        let id = threshold::transfer_id(self.id_secret.as_ref(), &self.region, &ask.key, window);
        let request = TransferRequest::new(
            id,
            &self.region,
            &ask.key,
            &ask.spec,
            threshold::ask(&ask.spec, ask.short),
            self.window_ms,
        );
        // Retries carry the same id, so a grant that landed on the primary
        // while its answer was lost is answered again, never taken twice.
        // Worth it while the grant could still be credited (`credit_ttl`:
        // one period of the limit, at most two windows), which is always
        // before the primary forgets the id (two windows after it took
        // the tokens).
        let creditable = credit_ttl(ask.spec.period_ms(), started, started).unwrap_or(0);
        let budget = Duration::from_millis(creditable.min(self.window_ms.saturating_mul(2)));
        let answer = match self.ask_primary(&request, &ask.key, budget).await {
            Ok(a) => a,
            Err(LinkError::Refused(why)) => {
                // The primary's limits differ from ours: asking again in
                // this window gets the same answer, so the claim stays.
                tracing::warn!(key = %ask.key, id, error = %why, "region: the primary refused the transfer");
                self.metrics.refused.inc();
                self.settled(&ask.key, id).await;
                return Outcome::Refused;
            }
            Err(e) if !e.is_retryable() => {
                // A 4xx or an unreadable answer: the same again on a new
                // ask, so the claim stays for the window.
                tracing::warn!(key = %ask.key, id, error = %e, "region: transfer given up");
                self.metrics.error.inc();
                self.settled(&ask.key, id).await;
                return Outcome::Error;
            }
            Err(_) => return self.give_up(ask, window).await,
        };
        if answer.granted == 0 {
            self.metrics.refused.inc();
            self.settled(&ask.key, id).await;
            return Outcome::Refused;
        }
        let Some(ttl) = credit_ttl(ask.spec.period_ms(), started, (self.clock)()) else {
            // Granted too late to be spent: lost here, under-admission.
            tracing::warn!(key = %ask.key, id, granted = answer.granted, "region: transfer landed after its window");
            self.metrics.error.inc();
            return Outcome::Error;
        };
        match self.store.credit(&ask.key, id, answer.granted, ttl).await {
            Ok(_) => {
                self.metrics.granted.inc();
                tracing::debug!(key = %ask.key, id, granted = answer.granted, "region: transfer credited");
                Outcome::Granted(answer.granted)
            }
            Err(e) => {
                // Granted by the primary, not credited here (yet): the next
                // ask of the key, here or on another gateway, retries the
                // same id and gets the recorded grant to credit.
                tracing::warn!(key = %ask.key, id, error = %e, "region: crediting a transfer failed");
                self.give_up(ask, window).await
            }
        }
    }

    /// Asks the primary for `request`, again with backoff after a failure
    /// worth retrying, for at most `budget`; the last failure when none
    /// answered.
    async fn ask_primary(
        &self,
        request: &TransferRequest,
        key: &str,
        budget: Duration,
    ) -> Result<TransferAnswer, LinkError> {
        let until = tokio::time::Instant::now() + budget;
        let mut backoff = self.backoff.0;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self.client.transfer(request).await {
                Ok(a) => {
                    self.metrics.link_up.set(1);
                    return Ok(a);
                }
                Err(e) => {
                    // Only the link itself failing says it is down.
                    self.metrics.link_up.set(if e.is_transport() { 0 } else { 1 });
                    if matches!(e, LinkError::Refused(_)) {
                        return Err(e);
                    }
                    tracing::warn!(key, id = request.id, attempt, error = %e, "region: transfer failed");
                    if !e.is_retryable() || tokio::time::Instant::now() + backoff >= until {
                        return Err(e);
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.backoff.1);
        }
    }

    /// A transfer that will credit nothing: its pending mark goes (a credit
    /// of no tokens), so the region's gateways block the key for the
    /// bucket's whole retry time again.
    async fn settled(&self, key: &str, id: u64) {
        if let Err(e) = self.store.credit(key, id, 0, 1).await {
            tracing::debug!(%key, error = %e, "region: clearing a pending transfer failed");
        }
    }

    /// After an ask failed: counted, and the key's claim is released (here
    /// and in the region), so its next ask is elected again.
    async fn give_up(&self, ask: &Ask, window: u64) -> Outcome {
        self.metrics.error.inc();
        if let Err(e) = self.store.unclaim(&ask.key, window).await {
            tracing::debug!(key = %ask.key, error = %e, "region: releasing the claim failed");
        }
        self.forget(&ask.key);
        Outcome::Error
    }

    /// Probes the link once at the start, so `link_up` says from the start
    /// whether the primary answers; then, while the last exchange failed,
    /// every [`PROBE_EVERY`] so it comes back without waiting for a hot
    /// key. A healthy link sees no probes after the first.
    async fn probe_while_down(self: Arc<Self>) {
        let up = reachable(&self.client.health().await);
        self.metrics.link_up.set(i64::from(up));
        if !up {
            tracing::warn!("region: the primary's link does not answer");
        }
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            if self.metrics.link_up.get() == 0 && reachable(&self.client.health().await) {
                self.metrics.link_up.set(1);
                tracing::info!("region: link to the primary is back");
            }
        }
    }
}

/// Whether an exchange's outcome says the link works: anything but a
/// transport failure (a peer that answers, even with an error, is there).
fn reachable(r: &Result<(), LinkError>) -> bool {
    match r {
        Ok(()) => true,
        Err(e) => !e.is_transport(),
    }
}

/// How long a grant may be spent, credited at `now_ms` (`None`: no
/// longer): one period of the limit after the ask (`asked_ms`, before the
/// primary took the tokens). By then the primary's own bucket has refilled
/// what it gave, so credit still alive would be spent twice, once here and
/// once there. Not cut at the end of the window it was asked in: a surge
/// that straddles a window's end would lose what was granted just before
/// it (the next window's transfer is another, with its own period).
pub fn credit_ttl(period_ms: u64, asked_ms: u64, now_ms: u64) -> Option<u64> {
    let ttl = asked_ms.saturating_add(period_ms).saturating_sub(now_ms);
    (ttl > 0).then_some(ttl)
}

#[cfg(test)]
mod tests;
