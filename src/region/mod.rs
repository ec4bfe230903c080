//! Multi-region quota slices: every region enforces its `share` of every
//! quota on its own store, and asks the primary region for more when a key
//! runs hot.
//!
//! - The slice itself is applied where a key's quota is computed
//!   ([`crate::limit::key_spec`], with [`crate::quota::Spec::slice`]): a
//!   request never crosses a region.
//! - [`rebalancing`]: the regional store of a region with a primary. It
//!   spends transferred credit after the bucket, and signals a key that
//!   used `rebalance_at` of its slice with a `try_send` (never a wait).
//! - [`coordinator`]: in the background, one gateway of the region per key
//!   and window (a claim in the regional store) asks the primary for a
//!   transfer, and credits the grant for the rest of the window.
//! - [`link`]: the HTTP/1.1 link (server and client), [`wire`] its JSON.
//! - [`threshold`]: the pure rules (when, how much, which id).
//!
//! A partition changes nothing for requests: the link is only ever used by
//! the coordinator, whose failures are counted and logged.

pub mod coordinator;
pub mod link;
pub mod quotas;
pub mod rebalancing;
pub mod threshold;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::quota::Share;
use crate::store::{FleetStore, RegionStore};
use crate::telemetry::metrics::{Metrics, RegionLabels, ResultLabels};
use coordinator::{Coordinator, LinkMetrics};
use link::{Grantor, LinkClient, LINK_TIMEOUT};
pub use quotas::{LimitQuotas, Quotas};
use rebalancing::{Ask, Rebalancing, ASK_QUEUE};

/// The shortest `rebalance_window_ms` the config accepts: four times
/// [`LINK_TIMEOUT`], so a transfer whose answer was lost has time to be
/// asked again (same id) and credited within its window.
pub const MIN_WINDOW_MS: u64 = 4 * LINK_TIMEOUT.as_millis() as u64;

/// `[region]`, as this room uses it (built by the server from the config).
#[derive(Debug, Clone)]
pub struct Settings {
    pub name: String,
    pub share: Share,
    pub link: SocketAddr,
    /// `host:port` of the primary's link; `None` on the primary.
    pub primary: Option<String>,
    pub rebalance_at: f64,
    pub window_ms: u64,
    /// Keys the transfer ids (`[region] id_secret_file`).
    pub id_secret: Option<threshold::IdSecret>,
    /// TLS to the primary (`[region] tls_cert`, `tls_key`, `client_ca`).
    pub client_tls: Option<link::ClientTls>,
}

/// A region's store for requests, and what its background tasks need.
pub struct Region {
    settings: Settings,
    asks: Option<mpsc::Receiver<Ask>>,
}

impl Region {
    /// Wraps the regional store for requests: a region with a primary
    /// spends credit (`credit`, the same store's region calls) and signals
    /// hot keys; the primary uses its store as it is.
    pub fn wrap(
        settings: Settings,
        store: Arc<dyn FleetStore>,
        credit: Arc<dyn RegionStore>,
    ) -> (Region, Arc<dyn FleetStore>) {
        if settings.primary.is_none() {
            return (Region { settings, asks: None }, store);
        }
        let (tx, rx) = mpsc::channel(ASK_QUEUE);
        let wrapped = Arc::new(Rebalancing::new(store, credit, settings.rebalance_at, tx));
        (
            Region {
                settings,
                asks: Some(rx),
            },
            wrapped,
        )
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Runs the coordinator (with a primary) on the caller's runtime, and
    /// returns the link's service for the server to serve its listener
    /// with. `store`: the store's region calls under the store deadline;
    /// `quotas`: this gateway's limits, which the primary grants by.
    pub fn start(self, store: Arc<dyn RegionStore>, quotas: Quotas, metrics: &Metrics) -> link::LinkService {
        let s = self.settings;
        let grantor = s.primary.is_none().then(|| {
            Arc::new(Grantor {
                store: store.clone(),
                share: s.share,
                quotas,
                window_ms: s.window_ms,
                rebalance_at: s.rebalance_at,
            })
        });
        let service = link::LinkService {
            grantor,
            limits: link::ServeLimits::default(),
            budget: Arc::default(),
        };
        let (Some(primary), Some(asks)) = (s.primary, self.asks) else {
            return service;
        };
        let family = &metrics.region_transfers;
        let count = |result| family.get_or_create(&ResultLabels { result }).clone();
        let link_metrics = LinkMetrics {
            link_up: metrics
                .region_link_up
                .get_or_create(&RegionLabels { region: s.name.clone() })
                .clone(),
            granted: count("granted"),
            refused: count("refused"),
            error: count("error"),
        };
        let coordinator = Coordinator::new(
            s.name,
            s.window_ms,
            store,
            match s.client_tls {
                Some(tls) => LinkClient::new(primary, LINK_TIMEOUT).with_tls(tls),
                None => LinkClient::new(primary, LINK_TIMEOUT),
            },
            link_metrics,
            // Wall-clock windows, so every gateway of the region names a
            // window (and so a transfer id) alike.
            crate::clock::system_clock(),
            s.id_secret,
        );
        tokio::spawn(coordinator.run(asks));
        service
    }
}
