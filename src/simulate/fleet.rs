//! The virtual fleet: instances built as `run` builds them, driven
//! millisecond by millisecond on a paused tokio clock.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderMap;

use super::report::{Outcomes, Report};
use super::store::SimStore;
use super::traffic::{arrivals, Traffic};
use super::{find_limit, Options, SimError};
use crate::clock::Clock;
use crate::config::Config;
use crate::limit::fleet::HEARTBEAT_EVERY_MS;
use crate::limit::key::Facts;
use crate::limit::policy::{Limit, StoreFailure};
use crate::limit::{Checked, Decision, LimitRef, LimitRuntime, Limiter, Verdict};
use crate::store::guard::Guarded;
use crate::store::memory::MemoryStore;
use crate::store::FleetStore;
use crate::sync::Recover;
use crate::telemetry::metrics::Metrics;

/// The store's (Unix) clock at virtual time 0: 2026-01-01T00:00:00Z, so
/// minute, hour and day windows start with the simulation.
pub const WALL_EPOCH_MS: u64 = 1_767_225_600_000;

/// One key's request facts (a client's address is its own).
struct KeyFacts {
    identity: String,
    tenant: String,
}

/// Client `c`'s address: 10.0.0.0/8 and on, distinct per client (what a
/// sharded limit's `shard_by = "ip"` spreads).
fn client_ip(c: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0A00_0000u32.wrapping_add(c as u32)))
}

/// What every request of the simulation shares.
struct Shared {
    keys: Vec<KeyFacts>,
    route: String,
    headers: HeaderMap,
    rates: Vec<Option<Arc<str>>>,
    on_failure: StoreFailure,
    outcomes: Mutex<Outcomes>,
    clock: Clock,
}

impl Shared {
    fn facts(&self, c: u64, k: usize) -> Option<Facts<'_>> {
        let key = self.keys.get(k)?;
        Some(Facts {
            identity: &key.identity,
            tenant: Some(&key.tenant),
            plan: None,
            rates: &self.rates,
            route: &self.route,
            ip: client_ip(c),
            headers: &self.headers,
        })
    }

    /// Counts a decided request at the virtual second it was decided.
    fn record(&self, verdict: &mut Verdict<'_>, key: usize) {
        let now = (self.clock)().saturating_sub(1);
        let mut o = self.outcomes.lock().recover();
        o.record(now, key, verdict.decision);
        if matches!(verdict.decision, Decision::Admit | Decision::Bypass { .. }) {
            verdict.commit();
        }
    }
}

struct Instance {
    limiter: Arc<Limiter>,
    /// The limit simulated, as this instance compiled it.
    limit: Arc<LimitRuntime>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Runs the simulation of `o` for limit `name` of `config`.
pub fn run(config: &Config, name: &str, o: &Options) -> Result<Report, SimError> {
    o.check()?;
    let (index, limit) = find_limit(config, name)?;
    // Every instance's own randomness (its table's seed, its block
    // jitter) comes from this thread's generator: seeded, it repeats.
    fastrand::seed(o.seed);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| SimError::Argument {
            flag: "runtime",
            why: e.to_string(),
        })?;
    Ok(rt.block_on(simulate(config, index, limit, o)))
}

async fn simulate(config: &Config, index: usize, limit: Arc<Limit>, o: &Options) -> Report {
    let start = tokio::time::Instant::now();
    let mono: Clock =
        Arc::new(move || tokio::time::Instant::now().saturating_duration_since(start).as_millis() as u64 + 1);
    let wall: Clock = {
        let m = mono.clone();
        Arc::new(move || WALL_EPOCH_MS + m() - 1)
    };
    let metrics = Arc::new(Metrics::new());
    let ms = |s: f64| (s * 1000.0).round() as u64 + 1;
    let store = Arc::new(SimStore::new(
        MemoryStore::with_clock(config.store.max_keys, wall.clone()),
        Duration::from_secs_f64(o.store_rtt_ms / 1000.0),
        o.store_down.map(|(a, b)| (ms(a), ms(b))),
        mono.clone(),
        o.seconds,
    ));
    let route = config.routes.iter().find(|r| r.limits.contains(&index));
    let shared = Arc::new(Shared {
        keys: (0..o.keys)
            .map(|k| KeyFacts {
                identity: format!("key:sim-{k}"),
                tenant: format!("tenant-{k}"),
            })
            .collect(),
        route: route.map_or_else(|| "simulated".to_string(), |r| r.name.clone()),
        headers: HeaderMap::new(),
        rates: Vec::new(),
        on_failure: route.map_or(StoreFailure::Allow, |r| r.on_store_failure),
        outcomes: Mutex::new(Outcomes::new(o.seconds, o.keys)),
        clock: mono.clone(),
    });
    let settings = config.shared_limiter_settings();
    let mut fleet: Vec<Instance> = (0..o.instances)
        .map(|i| {
            let guarded: Arc<dyn FleetStore> = Arc::new(Guarded::new(
                store.clone(),
                config.store.timeout,
                config.store.breaker,
                mono.clone(),
                metrics.clone(),
            ));
            let limiter = Limiter::with_wall_clock(guarded, settings, mono.clone(), wall.clone());
            let runtime = Arc::new(LimitRuntime::new(limit.clone(), &format!("sim-{i}"), &metrics));
            let tasks = vec![
                tokio::spawn(sweep(limiter.clone())),
                tokio::spawn(heartbeat(limiter.clone(), fastrand::u64(..))),
            ];
            Instance {
                limiter,
                limit: runtime,
                tasks,
            }
        })
        .collect();
    let mut live = vec![true; fleet.len()];
    let mut traffic = Traffic::new(o.seed, o.clients, o.keys, o.zipf, o.spread, o.instances);
    let kill = o.kill.map(|(k, t)| (k, ms(t) - 1));
    let mut stranded_max = 0u64;
    let mut in_flight: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    for t in 0..o.seconds * 1000 {
        tokio::time::sleep_until(start + Duration::from_millis(t)).await;
        if let Some((k, at)) = kill {
            if t == at {
                let dying: Vec<usize> = (0..fleet.len()).filter(|&i| live[i]).take(k as usize).collect();
                for i in dying {
                    live[i] = false;
                    for task in fleet[i].tasks.drain(..) {
                        task.abort();
                    }
                }
            }
            if t >= at && (t == at || t % 100 == 0) {
                let held: u64 = fleet
                    .iter()
                    .zip(&live)
                    .filter(|(_, l)| !**l)
                    .map(|(inst, _)| inst.limiter.report().tokens_at_hand())
                    .sum();
                stranded_max = stranded_max.max(held);
            }
        }
        if t % 1000 == 0 {
            in_flight.retain(|h| !h.is_finished());
        }
        for _ in 0..arrivals(o.offered, t) {
            let (c, k) = traffic.client();
            let inst = &fleet[traffic.instance(&live)];
            let Some(facts) = shared.facts(c, k) else { continue };
            let mut verdict = Verdict::default();
            let limits = [LimitRef::new(&inst.limit)];
            if inst.limiter.try_check(&limits, &[], &facts, &mut verdict) == Checked::Decided {
                shared.record(&mut verdict, k);
                continue;
            }
            drop(verdict);
            let (limiter, limit, shared) = (inst.limiter.clone(), inst.limit.clone(), shared.clone());
            in_flight.push(tokio::spawn(async move {
                let Some(facts) = shared.facts(c, k) else { return };
                let limits = [LimitRef::new(&limit)];
                let mut verdict = limiter.check(&limits, &[], &facts, shared.on_failure).await;
                shared.record(&mut verdict, k);
            }));
        }
    }
    tokio::time::sleep_until(start + Duration::from_millis(o.seconds * 1000)).await;
    // Requests still waiting for the store end within their deadline.
    for h in in_flight {
        let _ = h.await;
    }
    let outcomes = shared.outcomes.lock().recover().clone();
    Report::new(
        o,
        &limit,
        &config.shared_limiter_settings(),
        outcomes,
        store.counts(),
        stranded_max,
    )
}

/// The sweeper of `run` (`server::sweep_leases`): expired leases go back.
async fn sweep(limiter: Arc<Limiter>) {
    loop {
        let (every, idle_ms) = crate::limit::sweep::sweep_timing(&limiter.settings());
        tokio::time::sleep(every).await;
        limiter.sweeper().sweep(idle_ms).await;
    }
}

/// The heartbeat of `run`: the live count the fallback divides by.
async fn heartbeat(limiter: Arc<Limiter>, member: u64) {
    let heartbeat = crate::limit::fleet::Heartbeat::of(&limiter, member);
    loop {
        let _ = heartbeat.beat().await;
        tokio::time::sleep(Duration::from_millis(HEARTBEAT_EVERY_MS)).await;
    }
}
