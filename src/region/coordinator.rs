//! The background side of a region with a primary: takes the asks the
//! request path signalled, elects one gateway of the region per key and
//! window (a claim in the regional store), asks the primary over the link,
//! and credits what it grants to the regional store.
//!
//! Nothing here runs in a request's await. A hung or refused link costs
//! this task [`LINK_TIMEOUT`](super::link::LINK_TIMEOUT) per ask (at most
//! [`IN_FLIGHT`] at once; more asks are dropped), and requests keep being
//! decided against the region's own slice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, Semaphore};

use super::link::LinkClient;
use super::rebalancing::Ask;
use super::threshold;
use super::wire::TransferRequest;
use crate::clock::Clock;
use crate::store::QuotaStore;

/// Transfers asked at once; asks beyond it are dropped (the key asks
/// again on its next store call).
pub const IN_FLIGHT: usize = 16;
/// Attempts per transfer (the same id each time).
const ATTEMPTS: usize = 2;
/// While the link is down, a probe this often finds it back.
const PROBE_EVERY: Duration = Duration::from_secs(2);

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
    pub store: Arc<dyn QuotaStore>,
    pub client: LinkClient,
    pub metrics: LinkMetrics,
    pub clock: Clock,
    in_flight: Arc<Semaphore>,
    /// Key → the last window this gateway handled it in: repeated asks of
    /// a hot key cost a map lookup, not a store call.
    asked: Mutex<HashMap<String, u64>>,
}

impl Coordinator {
    pub fn new(
        region: String,
        window_ms: u64,
        store: Arc<dyn QuotaStore>,
        client: LinkClient,
        metrics: LinkMetrics,
        clock: Clock,
    ) -> Arc<Coordinator> {
        // Up until an exchange says otherwise.
        metrics.link_up.set(1);
        Arc::new(Coordinator {
            region,
            window_ms: window_ms.max(1),
            store,
            client,
            metrics,
            clock,
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
            asked: Mutex::new(HashMap::new()),
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
        let Ok(mut asked) = self.asked.lock() else { return false };
        if asked.get(key) == Some(&window) {
            return false;
        }
        if asked.len() >= 100_000 {
            asked.retain(|_, w| *w >= window);
        }
        asked.insert(key.to_owned(), window);
        true
    }

    fn forget(&self, key: &str) {
        if let Ok(mut asked) = self.asked.lock() {
            asked.remove(key);
        }
    }

    /// One ask: claim, transfer, credit, count.
    pub async fn rebalance(&self, ask: &Ask, window: u64) -> Outcome {
        let started = (self.clock)();
        match self.store.claim(&ask.key, self.window_ms).await {
            Ok(true) => {}
            Ok(false) => return Outcome::NotElected,
            Err(e) => {
                // Without the regional store there is nothing to credit to.
                tracing::debug!(key = %ask.key, error = %e, "region: claim failed");
                self.forget(&ask.key);
                return Outcome::Error;
            }
        }
        let id = threshold::transfer_id(&self.region, &ask.key, window);
        let request = TransferRequest::new(
            id,
            &self.region,
            &ask.key,
            &ask.spec,
            threshold::ask(&ask.spec),
            self.window_ms,
        );
        let mut answer = None;
        for attempt in 1..=ATTEMPTS {
            match self.client.transfer(&request).await {
                Ok(a) => {
                    self.metrics.link_up.set(1);
                    answer = Some(a);
                    break;
                }
                Err(e) => {
                    self.metrics.link_up.set(0);
                    tracing::warn!(key = %ask.key, id, attempt, error = %e, "region: transfer failed");
                }
            }
        }
        let Some(answer) = answer else {
            self.metrics.error.inc();
            return Outcome::Error;
        };
        if answer.granted == 0 {
            self.metrics.refused.inc();
            return Outcome::Refused;
        }
        // The tokens last for what is left of the window they were asked in.
        let ttl = self
            .window_ms
            .saturating_sub((self.clock)().saturating_sub(started))
            .max(1);
        match self.store.credit(&ask.key, id, answer.granted, ttl).await {
            Ok(_) => {
                self.metrics.granted.inc();
                tracing::info!(key = %ask.key, id, granted = answer.granted, "region: transfer credited");
                Outcome::Granted(answer.granted)
            }
            Err(e) => {
                // Granted by the primary, lost here: under-admission, never over.
                tracing::warn!(key = %ask.key, id, error = %e, "region: crediting a transfer failed");
                self.metrics.error.inc();
                Outcome::Error
            }
        }
    }

    /// While the last exchange failed, probes the link every
    /// [`PROBE_EVERY`] so `link_up` comes back without waiting for a hot
    /// key. A healthy link sees no probes.
    async fn probe_while_down(self: Arc<Self>) {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            if self.metrics.link_up.get() == 0 && self.client.health().await.is_ok() {
                self.metrics.link_up.set(1);
                tracing::info!("region: link to the primary is back");
            }
        }
    }
}
