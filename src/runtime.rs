//! The `Runtime`: what every front of the gateway holds. The config in
//! force (an `ArcSwap`'d [`Snapshot`], swapped whole on reload), the
//! limiter, the metrics, this region's share and the event emitter. The
//! HTTP request path (`gateway`), Envoy's rate limit services (`rls`),
//! `leasegate explain`, admin and reload all hold an `Arc<Runtime>`; none
//! of them holds another.
//!
//! It also holds what the request path and `explain` share about one
//! request: its route, its identity clock, its key facts and the limits
//! that apply to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use http::header;
use http::{HeaderMap, Request};
use smallvec::SmallVec;

use crate::config::Config;
use crate::events::Emitter;
use crate::identity::{Identity, Tier};
use crate::limit::key::Facts;
use crate::limit::policy::Limit;
use crate::limit::{handle, LimitRef, LimitRuntime, Limiter, Settings};
use crate::route::{Route, RouteTable};
use crate::store::FleetStore;
use crate::sync::Recover;
use crate::telemetry::metrics::{Metrics, RouteMetrics};

/// One config, compiled for serving: the config and its limits ready for
/// decisions. Swapped whole on reload; a request keeps the one it started
/// with.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub limits: Vec<Arc<LimitRuntime>>,
    /// Request metrics per route, in route order.
    pub(crate) routes: Vec<RouteMetrics>,
    /// Request metrics of requests no route matched.
    pub(crate) unrouted: RouteMetrics,
}

/// The limits a request is decided on: its route's that apply to its
/// tier, in the route's order (inline for four).
pub type Applying<'a> = SmallVec<[LimitRef<'a>; 4]>;

impl Snapshot {
    /// The limits `ids` names (a route's compiled `limits`, a usage
    /// route's), as handles into this snapshot's table.
    pub fn limits_of<'a>(&'a self, ids: &'a [usize]) -> impl Iterator<Item = LimitRef<'a>> + 'a {
        handle::resolve(&self.limits, ids)
    }

    /// `route`'s limits that apply to an identity of `tier`, in order.
    pub fn applying<'a>(&'a self, route: &'a Route, tier: Tier) -> Applying<'a> {
        self.limits_of(&route.limits)
            .filter(|l| l.config.applies_to(tier))
            .collect()
    }

    pub fn new(config: Config, metrics: &Metrics) -> Snapshot {
        let limits = config
            .limits
            .iter()
            .map(|l| Arc::new(LimitRuntime::new(l.clone(), &config.gateway.instance_id, metrics)))
            .collect();
        let routes = config.routes.iter().map(|r| RouteMetrics::new(&r.name)).collect();
        Snapshot {
            routes,
            unrouted: RouteMetrics::new("none"),
            config: Arc::new(config),
            limits,
        }
    }
}

/// A refused reload: when, and why (the config error's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadFailure {
    pub at: std::time::SystemTime,
    pub why: String,
}

pub struct Runtime {
    snapshot: ArcSwap<Snapshot>,
    pub metrics: Arc<Metrics>,
    pub limiter: Arc<Limiter>,
    /// Loads the fleet's overrides into the limiter's table and makes this
    /// instance's changes (the admin API); its task is started by the
    /// server.
    pub overrides: Arc<crate::limit::overrides::OverridesFollower>,
    /// `[events]`, when configured: swapped when a reload changes it.
    events: ArcSwapOption<Emitter>,
    draining: AtomicBool,
    /// The last reload that was refused, while no reload has succeeded
    /// since: what the status page and `/config` say, so a refused edit is
    /// not mistaken for one in force.
    reload_failure: std::sync::Mutex<Option<ReloadFailure>>,
    /// `[region] share` at start (the whole without `[region]`): `[region]`
    /// is bound at start (its link, its coordinator, the primary's grants),
    /// so a reload keeps every limit on this slice.
    share: crate::quota::Share,
    /// How the store's connection stands (`/readyz`, the status page).
    pub store_link: Arc<crate::store::link::StoreLink>,
}

impl Runtime {
    /// A runtime on `store`, whose link is taken to be up (the embedded
    /// store's); [`Runtime::with_store_link`] for one that is dialled.
    pub fn new(config: Config, metrics: Arc<Metrics>, store: Arc<dyn FleetStore>) -> Self {
        let limiter = Limiter::new(store, config.limiter_settings(), crate::clock::monotonic_clock());
        let overrides = Arc::new(crate::limit::overrides::OverridesFollower::of(&limiter));
        let events = start_events(&config, &metrics, None);
        let share = config.region.as_ref().map_or(crate::quota::Share::WHOLE, |r| r.share);
        let snapshot = Snapshot::new(config, &metrics);
        target_gauges(&metrics, None, &snapshot.config);
        Runtime {
            share,
            snapshot: ArcSwap::from_pointee(snapshot),
            metrics,
            limiter,
            overrides,
            events: ArcSwapOption::new(events),
            draining: AtomicBool::new(false),
            reload_failure: std::sync::Mutex::new(None),
            store_link: Arc::new(crate::store::link::StoreLink::always_up()),
        }
    }

    /// The link of the store this runtime was made on.
    pub fn with_store_link(mut self, link: Arc<crate::store::link::StoreLink>) -> Self {
        self.store_link = link;
        self
    }

    /// A reload was refused (`None`: one succeeded, which clears it).
    pub fn reload_failed(&self, failure: Option<ReloadFailure>) {
        *self.reload_failure.lock().recover() = failure;
    }

    /// The last refused reload, if none succeeded since.
    pub fn reload_failure(&self) -> Option<ReloadFailure> {
        self.reload_failure.lock().recover().clone()
    }

    /// This region's slice of every quota (`[region] share` at start; the
    /// whole without `[region]`): the Envoy rate limit services apply it
    /// too.
    pub fn share(&self) -> crate::quota::Share {
        self.share
    }

    /// The config in force now.
    pub fn config(&self) -> Arc<Config> {
        self.snapshot.load().config.clone()
    }

    /// Swaps in a new config. Requests in flight finish on the one they
    /// started with; leases survive for limits whose quota did not change,
    /// and go back to the store for limits changed or removed.
    pub async fn apply(&self, mut config: Config) {
        for l in &mut config.limits {
            if l.share() != self.share {
                *l = Arc::new(l.with_share(self.share));
            }
        }
        let snapshot = Snapshot::new(config, &self.metrics);
        let old = self.snapshot.load_full();
        for u in &snapshot.config.upstreams {
            if let Some(o) = old.config.upstreams.iter().find(|o| o.name == u.name) {
                u.inherit_health(o);
            }
        }
        target_gauges(&self.metrics, Some(&old.config), &snapshot.config);
        // Each upstream's checks run on its newest form only.
        for u in &old.config.upstreams {
            u.retire();
        }
        for u in &snapshot.config.upstreams {
            crate::proxy::active::start(u, &self.metrics);
        }
        // A limit changed when it is gone or its quota (any plan's) differs.
        let quota = |l: &Limit| (l.spec(), l.plans.clone(), l.share());
        let changed: std::collections::HashSet<String> = old
            .config
            .limits
            .iter()
            .filter(|o| {
                snapshot
                    .config
                    .limits
                    .iter()
                    .find(|n| n.name == o.name)
                    .is_none_or(|n| quota(n) != quota(o))
            })
            .map(|o| o.name.clone())
            .collect();
        // The store deadline is bound at start (the guard's, a restart-only
        // setting): a request's wait budget keeps it too.
        let settings = Settings {
            deadline_ms: self.limiter.settings().deadline_ms,
            ..snapshot.config.limiter_settings()
        };
        self.limiter.set_settings(settings);
        let events = start_events(&snapshot.config, &self.metrics, self.events.load_full());
        self.events.store(events);
        self.snapshot.store(Arc::new(snapshot));
        let released = self.limiter.sweeper().release_limits(&changed).await;
        if released > 0 {
            tracing::info!(
                released_tokens = released,
                "leases of changed or removed limits went back to the store"
            );
        }
    }

    /// Starts the active health checks of the upstreams in force (on the
    /// current tokio runtime: the control thread's); a reload starts its
    /// new upstreams' own.
    pub fn start_health_checks(&self) {
        for u in &self.snapshot.load().config.upstreams {
            crate::proxy::active::start(u, &self.metrics);
        }
    }

    /// Marks the gateway as shutting down (readiness turns false).
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The snapshot in force now: a request keeps the one it started with.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The event emitter, when `[events]` is configured.
    pub fn events(&self) -> arc_swap::Guard<Option<Arc<Emitter>>> {
        self.events.load()
    }
}

/// The emitter for `config`'s `[events]`: `running` when it was started
/// for the same settings (it keeps its interval table), else a new one,
/// else none.
fn start_events(config: &Config, metrics: &Metrics, running: Option<Arc<Emitter>>) -> Option<Arc<Emitter>> {
    let settings = config.events.as_ref()?;
    let instance = &config.gateway.instance_id;
    match running {
        Some(e) if e.runs(settings, instance) => Some(e),
        _ => Emitter::start(settings, instance, metrics).map(Arc::new),
    }
}

/// `leasegate_upstream_target_up` for every target of `new`'s upstreams
/// (1 in the rotation, 0 ejected), and no series for a target `old` had
/// and `new` has not.
fn target_gauges(metrics: &Metrics, old: Option<&Config>, new: &Config) {
    use crate::telemetry::metrics::UpstreamTargetLabels;
    let labels = |c: &Config| -> Vec<(UpstreamTargetLabels, bool)> {
        c.upstreams
            .iter()
            .flat_map(|u| {
                u.targets.iter().enumerate().map(|(i, t)| {
                    let labels = UpstreamTargetLabels {
                        upstream: u.name.clone(),
                        target: t.as_str().to_string(),
                    };
                    (labels, u.target_up(i))
                })
            })
            .collect()
    };
    let now = labels(new);
    if let Some(old) = old {
        for (l, _) in labels(old) {
            if !now.iter().any(|(n, _)| *n == l) {
                metrics.upstream_target_up.remove(&l);
                metrics.upstream_target_requests.remove(&l);
                for kind in crate::telemetry::metrics::TARGET_ERROR_KINDS {
                    metrics
                        .upstream_target_errors
                        .remove(&crate::telemetry::metrics::UpstreamTargetErrorLabels {
                            upstream: l.upstream.clone(),
                            target: l.target.clone(),
                            kind,
                        });
                }
            }
        }
    }
    for (l, up) in now {
        metrics.upstream_target_up.get_or_create(&l).set(i64::from(up));
    }
}

/// The route a request matches, by host (the URI's authority, else `Host`),
/// method and path: its index in `routes`. The request's target is in
/// normal form ([`crate::route::normalize::target`]); its path is matched
/// without `;` parameters. `leasegate explain` asks this too.
pub fn route_index_of<B>(routes: &RouteTable, req: &Request<B>) -> Option<usize> {
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers().get(header::HOST).and_then(|h| h.to_str().ok()));
    let path = crate::route::normalize::match_path(req.uri().path());
    routes.position(host, req.method(), &path)
}

/// The `now_secs` the identity waterfall gets: the wall clock matters only
/// for cached JWTs, so without JWTs configured, or for a request without
/// `Authorization`, it is not read (nor the header looked up).
pub fn identity_clock(identity: &crate::identity::Resolver, headers: &HeaderMap) -> u64 {
    if identity.jwt.is_some() && headers.contains_key(header::AUTHORIZATION) {
        crate::clock::unix_ms() / 1000
    } else {
        0
    }
}

/// What a request offers its limits' keys.
pub fn facts<'a>(route: &'a Route, identity: &'a Identity, headers: &'a HeaderMap) -> Facts<'a> {
    Facts {
        identity: &identity.value,
        tenant: identity.tenant.as_deref(),
        plan: identity.plan.as_deref(),
        rates: identity.rates.as_deref().unwrap_or(&[]),
        route: &route.name,
        ip: identity.client_ip,
        headers,
    }
}

/// The route's limits that apply to an identity of `tier`, in the route's
/// order: indices into the config's `limits`, for `explain`, which reads
/// the config alone (the request path holds handles:
/// [`Snapshot::applying`]).
pub fn applying_limits(limits: &[Arc<Limit>], route: &Route, tier: Tier) -> SmallVec<[usize; 4]> {
    route
        .limits
        .iter()
        .copied()
        .filter(|&i| limits.get(i).is_some_and(|l| l.applies_to(tier)))
        .collect()
}
