//! The store stack `[store]` and `[region]` ask for, built once at start:
//! the memory store or Redis (node, Cluster, Sentinel), `[region]`'s
//! credit inside the guard, the guard (deadline, breaker, metrics) around
//! it, the region calls under the deadline; and start's wait for the
//! store's first answer.

use std::sync::Arc;
use std::time::Duration;

use super::ServeError;
use crate::config::{Config, StoreBackend};
use crate::region::Region;
use crate::runtime::Runtime;
use crate::store::deadline::Deadlined;
use crate::store::guard::Guarded;
use crate::store::link::StoreLink;
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisStore, Target};
use crate::store::{FleetStore, NoRegions, RegionStore};
use crate::telemetry::metrics::Metrics;

/// The runtime, once built: the region link's client reads the
/// certificates in force from its config (set right after the stores).
pub(super) type RuntimeCell = Arc<std::sync::OnceLock<std::sync::Weak<Runtime>>>;

/// `[region]` as the region room takes it.
fn region_settings(r: &crate::config::Region, runtime: &RuntimeCell) -> crate::region::Settings {
    let primary = r.primary.as_ref().and_then(|u| u.authority());
    let client_tls = match (r.tls.as_ref().and_then(|t| t.client.clone()), primary) {
        (Some(at_start), Some(authority)) => {
            let runtime = runtime.clone();
            // The certificates in force at each connect: a reload with new
            // files applies to the next exchange. (The config check made
            // sure the host is a name a certificate can carry.)
            let host = authority.host().trim_matches(['[', ']']).to_string();
            rustls_pki_types::ServerName::try_from(host)
                .ok()
                .map(|server_name| crate::region::link::ClientTls {
                    config: Arc::new(move || {
                        runtime
                            .get()
                            .and_then(std::sync::Weak::upgrade)
                            .and_then(|rt| rt.config().region.as_ref()?.tls.as_ref()?.client.clone())
                            .unwrap_or_else(|| at_start.clone())
                    }),
                    server_name,
                })
        }
        _ => None,
    };
    crate::region::Settings {
        name: r.name.clone(),
        share: r.share,
        link: r.link,
        primary: primary.map(|a| a.to_string()),
        rebalance_at: r.rebalance_at,
        window_ms: r.rebalance_window.as_millis() as u64,
        id_secret: r.id_secret.clone(),
        client_tls,
    }
}

/// Limit `name` of `config` as the primary grants transfers by it: its
/// quota and its plans' (whole, before the slice), and its sub-buckets. The
/// config in force, so a reload that changes a limit changes what the
/// primary accepts with it.
pub(super) fn limit_quotas(config: &Config, name: &str) -> Option<crate::region::LimitQuotas> {
    let limit = config.limits.iter().find(|l| l.name == name)?;
    let mut specs = vec![limit.spec()];
    specs.extend(limit.plans.iter().map(|(plan, _)| limit.spec_for(Some(plan))));
    Some(crate::region::LimitQuotas {
        specs,
        shards: limit.shards,
    })
}

/// Where `[store]` puts the quota, when on Redis.
pub(super) fn redis_target(config: &Config) -> Option<Target> {
    match &config.store.backend {
        StoreBackend::Memory => None,
        StoreBackend::Redis { url } => Some(Target::Node(url.clone())),
        StoreBackend::RedisCluster { seeds } => Some(Target::Cluster(seeds.clone())),
        StoreBackend::RedisSentinel { sentinels, master } => Some(Target::Sentinel {
            sentinels: sentinels.clone(),
            master: master.clone(),
        }),
    }
}

/// The quota store the config asks for, behind the guard (deadline,
/// breaker, store metrics), with `[region]`'s credit and rebalance signal
/// inside the guard. Returns at once even if Redis is down.
pub(super) fn store(config: &Config, metrics: &Arc<Metrics>, runtime: &RuntimeCell) -> Result<Stores, ServeError> {
    let redis = redis_target(config);
    // Redis serves both the quota and the region calls; the memory store
    // has no region calls.
    let (inner, regional, link): (Arc<dyn FleetStore>, Arc<dyn RegionStore>, _) = match redis {
        None => (
            Arc::new(MemoryStore::new(config.store.max_keys)),
            Arc::new(NoRegions),
            Arc::new(StoreLink::always_up()),
        ),
        Some(target) => {
            let redis = Arc::new(
                RedisStore::start_with_ca(&target, config.store.ca.as_ref().map(|c| c.pem.clone()))?
                    .with_metrics(metrics.clone()),
            );
            // Budgets of a week or a month need a Redis that keeps them.
            let long: Vec<String> = config
                .limits
                .iter()
                .filter(|l| l.spec().period_ms() >= crate::quota::calendar::WEEK_MS)
                .map(|l| l.name.clone())
                .collect();
            crate::store::redis::warn_unless_persistent(&redis, long);
            (redis.clone(), redis.clone(), redis.link())
        }
    };
    let regional: Arc<dyn RegionStore> = Arc::new(Deadlined::new(regional, config.store.timeout));
    let (region, inner) = match &config.region {
        Some(r) => {
            let (region, wrapped) = Region::wrap(region_settings(r, runtime), inner, regional.clone());
            (Some(region), wrapped)
        }
        None => (None, inner),
    };
    let guarded = Arc::new(Guarded::new(
        inner,
        config.store.timeout,
        config.store.breaker,
        crate::clock::monotonic_clock(),
        metrics.clone(),
    ));
    Ok(Stores {
        quota: guarded.clone(),
        guard: guarded,
        link,
        regional,
        region,
    })
}

/// The stores the gateway runs on: quota for requests (guarded), the
/// guard itself (it follows the link), how the store's link stands, the
/// region calls (under the deadline), and `[region]`'s background side.
pub(super) struct Stores {
    pub(super) quota: Arc<dyn FleetStore>,
    pub(super) guard: Arc<Guarded>,
    pub(super) link: Arc<StoreLink>,
    pub(super) regional: Arc<dyn RegionStore>,
    pub(super) region: Option<Region>,
}

/// Start's wait for the store: until its link has answered, at most
/// `[store] connect_timeout_ms`. Past it the gateway serves anyway, as in
/// an outage (each route fails open or closed), and says so.
pub(super) async fn wait_for_store(link: &StoreLink, name: &str, timeout: Duration) {
    if link.is_up() {
        return;
    }
    tracing::info!(
        store = name,
        timeout_ms = timeout.as_millis() as u64,
        "waiting for the store's first answer"
    );
    if !link.wait_up(timeout).await {
        tracing::warn!(
            store = name,
            timeout_ms = timeout.as_millis() as u64,
            link = %link.describe(),
            "the store has not answered: serving as in a store outage (fail-open routes use their fallback buckets, fail-closed routes answer 503) while it is dialled in the background"
        );
    }
}
