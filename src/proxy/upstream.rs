//! An upstream: the targets a route forwards to, how they are spoken to
//! (plain or TLS, HTTP/1.1 or h2), their timeouts, and the round-robin
//! choice between them. Pure data; the sockets live in `proxy`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::sync::Recover;

use super::health::{ActiveCheck, Admit, Change, Ejection, Health, Outcome};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use http::uri::Authority;
use http::HeaderValue;
use rustls_pki_types::ServerName;

/// How requests are written to an upstream's targets (`protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    #[default]
    Http1,
    /// HTTP/2: by ALPN over TLS, by prior knowledge (h2c) in the clear.
    H2,
}

/// How a request's target is chosen (`balance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Balance {
    /// Each target in turn.
    #[default]
    RoundRobin,
    /// Of two targets drawn at random, the one with fewer requests in
    /// flight (power of two choices, Envoy's `LEAST_REQUEST`).
    LeastRequest,
}

/// TLS to an upstream's `https://` targets.
#[derive(Clone)]
pub struct UpstreamTls {
    /// Roots (the system's or `ca`), the client certificate if any, ALPN.
    pub config: Arc<rustls::ClientConfig>,
    /// `ca`, `tls_cert`, `tls_key` as given: reloaded like the listener's.
    pub files: Vec<PathBuf>,
    /// SHA-256 of those files' bytes: part of the pool key, so new
    /// certificates never ride on connections made with the old ones.
    pub digest: [u8; 32],
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// One target of an upstream.
#[derive(Debug)]
pub struct Target {
    /// `host:port`, the port always explicit.
    pub authority: Authority,
    /// Over TLS: the name sent as SNI and required in the certificate
    /// (`server_name`, else the target's host).
    pub tls_name: Option<ServerName<'static>>,
    /// Over TLS: the `Host` (h2: `:authority`) the target is sent, its
    /// own name rather than the client's (see docs/configuration.md,
    /// "HTTPS upstreams").
    pub host: Option<HeaderValue>,
    /// Its place in the rotation (passive health).
    pub health: Health,
    /// Requests in flight to it, from this instance (`least_request`).
    load: AtomicUsize,
    /// Its series of the per-target counters, found once.
    pub counters: TargetCounters,
}

/// A target's `leasegate_upstream_target_requests` and `_errors` series,
/// looked up at first use: counting is then one atomic add, no label
/// built per request.
#[derive(Debug, Default)]
pub struct TargetCounters {
    pub requests: std::sync::OnceLock<prometheus_client::metrics::counter::Counter>,
    /// By [`crate::telemetry::metrics::TARGET_ERROR_KINDS`].
    pub errors: [std::sync::OnceLock<prometheus_client::metrics::counter::Counter>; 4],
}

impl Target {
    /// A plain `http://` target.
    pub fn plain(authority: Authority) -> Target {
        Target {
            authority,
            tls_name: None,
            host: None,
            health: Health::default(),
            load: AtomicUsize::new(0),
            counters: TargetCounters::default(),
        }
    }

    /// An `https://` target: SNI and certificate name `server_name`, else
    /// the target's host. The `Host` it is sent is that name, with the
    /// port unless it is 443. `None`: the name is not a DNS name or an IP
    /// address.
    pub fn tls(authority: Authority, server_name: Option<&str>) -> Option<Target> {
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        let name = server_name.unwrap_or(host);
        let tls_name = ServerName::try_from(name.to_string()).ok()?;
        let name_in_host = if name.contains(':') {
            format!("[{name}]")
        } else {
            name.to_string()
        };
        let host_value = match authority.port_u16() {
            Some(443) | None => name_in_host,
            Some(p) => format!("{name_in_host}:{p}"),
        };
        Some(Target {
            host: HeaderValue::from_str(&host_value).ok(),
            authority,
            tls_name: Some(tls_name),
            health: Health::default(),
            load: AtomicUsize::new(0),
            counters: TargetCounters::default(),
        })
    }

    pub fn as_str(&self) -> &str {
        self.authority.as_str()
    }

    /// Requests in flight to it now.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    /// Never empty (the config refuses an upstream without targets).
    pub targets: Vec<Target>,
    /// `Some`: every target is `https://`.
    pub tls: Option<UpstreamTls>,
    pub protocol: Protocol,
    pub connect_timeout: Duration,
    /// Time allowed from sending the request until the response head arrives.
    pub request_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// A body that moves no byte this long ends the exchange.
    pub idle_timeout: Duration,
    /// Requests forwarded at once, from admission to the response body's end.
    pub max_in_flight: usize,
    /// ... and from one client (its network, as the connection door counts
    /// it), so that no client holds every place.
    pub max_in_flight_per_client: usize,
    /// `eject_after`, `eject_ms`.
    pub ejection: Ejection,
    /// Request fields the gateway reads (identity, limit keys, costs): a
    /// client's `Connection` may not name them to strip them, so the
    /// upstream sees what the request was keyed and priced by.
    pub kept_headers: Arc<[http::HeaderName]>,
    /// `health = { ... }`: active checks, run by a task of their own.
    pub active: Option<ActiveCheck>,
    /// `balance`.
    pub balance: Balance,
    /// `retries`: an idempotent request whose exchange broke before the
    /// response head is sent again on another target, this many times.
    pub retries: u32,
    /// Replaced by a reload: its checker stops.
    retired: AtomicBool,
    /// Targets out by their active checks now.
    active_out: AtomicUsize,
    in_flight: AtomicUsize,
    /// Places held per client, striped by the client's hash.
    per_client: [Mutex<ClientPlaces>; STRIPES],
    next: AtomicUsize,
    /// Targets out of the rotation now.
    out: AtomicUsize,
    id: u64,
}

/// Stripes of the per-client counts: clients on different stripes never
/// wait for each other.
const STRIPES: usize = 16;

/// The places each client holds. Its keys are the clients' networks, so
/// clients choose them: hashed under a per-process random seed (foldhash,
/// where SipHash cost ~190 instructions a lookup, two a request).
type ClientPlaces = HashMap<IpAddr, usize, foldhash::fast::RandomState>;

/// What an upstream bounds besides its connections: `idle_timeout_ms`,
/// `max_in_flight` and `max_in_flight_per_client`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub idle_timeout: Duration,
    pub max_in_flight: usize,
    pub max_in_flight_per_client: usize,
}

impl Limits {
    /// A client's share of `max_in_flight` when none is configured: an
    /// eighth, rounded up.
    pub fn default_share(max_in_flight: usize) -> usize {
        max_in_flight.div_ceil(8).max(1)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle_timeout: Duration::from_secs(60),
            max_in_flight: 1_024,
            max_in_flight_per_client: Limits::default_share(1_024),
        }
    }
}

/// One request's place among an upstream's `max_in_flight`, its
/// client's, and among its target's requests in flight once it has one;
/// given back on drop.
#[derive(Debug)]
pub struct InFlight {
    upstream: Arc<Upstream>,
    client: Option<IpAddr>,
    target: Option<usize>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(client) = self.client {
            let mut held = self.upstream.stripe(client).lock().recover();
            if let Some(n) = held.get_mut(&client) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.remove(&client);
                }
            }
        }
        self.upstream.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.leave_target();
    }
}

impl InFlight {
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The request goes to target `index` (a retry: instead of the one
    /// before).
    pub fn at(&mut self, index: usize) {
        self.leave_target();
        if let Some(t) = self.upstream.targets.get(index) {
            t.load.fetch_add(1, Ordering::Relaxed);
            self.target = Some(index);
        }
    }

    fn leave_target(&mut self) {
        if let Some(t) = self.target.take().and_then(|i| self.upstream.targets.get(i)) {
            t.load.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Upstream {
    pub fn new(
        name: String,
        targets: Vec<Target>,
        (tls, protocol): (Option<UpstreamTls>, Protocol),
        connect_timeout: Duration,
        request_timeout: Duration,
        pool_idle_timeout: Duration,
        pool_max_idle_per_host: usize,
    ) -> Self {
        // The pool key: equal for equal settings, so a reload that keeps an
        // upstream keeps its pooled connections; different when anything a
        // pooled connection depends on changes.
        let id = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(
                &(
                    &name,
                    targets.iter().map(Target::as_str).collect::<Vec<_>>(),
                    targets.iter().map(|t| format!("{:?}", t.tls_name)).collect::<Vec<_>>(),
                    tls.as_ref().map(|t| t.digest),
                    protocol,
                    connect_timeout,
                    request_timeout,
                    pool_idle_timeout,
                    pool_max_idle_per_host,
                ),
                &mut h,
            );
            std::hash::Hasher::finish(&h)
        };
        Upstream {
            name,
            targets,
            tls,
            protocol,
            connect_timeout,
            request_timeout,
            pool_idle_timeout,
            pool_max_idle_per_host,
            idle_timeout: Limits::default().idle_timeout,
            max_in_flight: Limits::default().max_in_flight,
            max_in_flight_per_client: Limits::default().max_in_flight_per_client,
            ejection: Ejection::default(),
            kept_headers: Arc::from(Vec::new()),
            active: None,
            balance: Balance::default(),
            retries: 0,
            retired: AtomicBool::new(false),
            active_out: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            per_client: Default::default(),
            next: AtomicUsize::new(0),
            out: AtomicUsize::new(0),
            id,
        }
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.idle_timeout = limits.idle_timeout;
        self.max_in_flight = limits.max_in_flight;
        self.max_in_flight_per_client = limits.max_in_flight_per_client;
        self
    }

    /// A place among the requests in flight, for `client` (its network)
    /// among its own, or `None` when all `max_in_flight` are taken, or
    /// the client's `max_in_flight_per_client`.
    pub fn enter(self: &Arc<Self>, client: Option<IpAddr>) -> Option<InFlight> {
        let was = self.in_flight.fetch_add(1, Ordering::Relaxed);
        if was >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // Taken from here on: given back on drop, with the client's place.
        let mut place = InFlight {
            upstream: self.clone(),
            client: None,
            target: None,
        };
        if let Some(client) = client {
            let mut held = self.stripe(client).lock().recover();
            let n = held.entry(client).or_insert(0);
            if *n >= self.max_in_flight_per_client {
                return None;
            }
            *n += 1;
            place.client = Some(client);
        }
        Some(place)
    }

    fn stripe(&self, client: IpAddr) -> &Mutex<ClientPlaces> {
        let h = match client {
            IpAddr::V4(a) => u64::from(u32::from(a)),
            IpAddr::V6(a) => {
                let n = u128::from(a);
                (n as u64) ^ ((n >> 64) as u64)
            }
        };
        let mut hasher = crate::int_hash::IntHasher::default();
        std::hash::Hasher::write_u64(&mut hasher, h);
        &self.per_client[(std::hash::Hasher::finish(&hasher) as usize) % STRIPES]
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn with_ejection(mut self, ejection: Ejection) -> Self {
        self.ejection = ejection;
        self
    }

    pub fn with_kept_headers(mut self, kept: Arc<[http::HeaderName]>) -> Self {
        self.kept_headers = kept;
        self
    }

    pub fn with_balance(mut self, balance: Balance) -> Self {
        self.balance = balance;
        self
    }

    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    pub fn with_active(mut self, active: Option<ActiveCheck>) -> Self {
        self.active = active;
        self
    }

    /// A reload replaced this upstream: its checker stops.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Sets target `index`'s active verdict; whether it changed.
    pub fn set_active(&self, index: usize, up: bool) -> bool {
        let Some(t) = self.targets.get(index) else {
            return false;
        };
        if !t.health.set_actively_down(!up) {
            return false;
        }
        if up {
            self.active_out.fetch_sub(1, Ordering::AcqRel);
        } else {
            self.active_out.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// Every target fails its active checks: they are ignored (panic
    /// routing).
    pub fn all_actively_down(&self) -> bool {
        self.active_out.load(Ordering::Relaxed) >= self.targets.len()
    }

    /// Whether target `index` takes requests now, for its gauge: in the
    /// rotation, and not out by its checks (unless all are).
    pub fn target_up(&self, index: usize) -> bool {
        self.targets
            .get(index)
            .is_some_and(|t| t.health.in_rotation() && (!t.health.actively_down() || self.all_actively_down()))
    }

    /// The next target in round-robin order that is in the rotation (or
    /// due its trial), skipping `tried`. With none in the rotation (the
    /// others ejected, a trial out) the first try takes the next target
    /// all the same; a retry gives up.
    pub fn pick(&self, now: u64, tried: &[usize]) -> Option<(usize, &Target)> {
        let n = self.targets.len();
        let start = match n {
            0 => return None,
            1 => 0,
            n if self.balance == Balance::LeastRequest => fastrand::usize(..n),
            n => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        // A trial whose request never reported (dropped) is given again
        // after this long.
        let stale_ms = (self.connect_timeout + self.request_timeout).as_millis() as u64;
        let panic = self.all_actively_down();
        if self.balance == Balance::LeastRequest && n > 1 {
            if let Some(picked) = self.least_request(now, stale_ms, tried, panic) {
                return Some(picked);
            }
        }
        for k in 0..n {
            let i = (start + k) % n;
            if tried.contains(&i) {
                continue;
            }
            let Some(t) = self.targets.get(i) else { continue };
            if !panic && t.health.actively_down() {
                continue;
            }
            match t.health.admit(now, stale_ms) {
                Admit::Yes | Admit::Trial => return Some((i, t)),
                Admit::No => {}
            }
        }
        if tried.is_empty() {
            return self.targets.get(start).map(|t| (start, t));
        }
        None
    }

    /// `least_request`: a due trial of an ejected target first (else it
    /// would never get one), then of two targets in the rotation drawn
    /// at random the one with fewer requests in flight. `None`: no target
    /// in the rotation (the round-robin walk decides then).
    fn least_request(&self, now: u64, stale_ms: u64, tried: &[usize], panic: bool) -> Option<(usize, &Target)> {
        let mut open: smallvec::SmallVec<[usize; 8]> = smallvec::SmallVec::new();
        for (i, t) in self.targets.iter().enumerate() {
            if tried.contains(&i) || (!panic && t.health.actively_down()) {
                continue;
            }
            if t.health.in_rotation() {
                open.push(i);
            } else if t.health.admit(now, stale_ms) == Admit::Trial {
                return Some((i, t));
            }
        }
        let k = open.len();
        let i = match k {
            0 => return None,
            1 => open[0],
            k => {
                let a = fastrand::usize(..k);
                let mut b = fastrand::usize(..k - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (open[a], open[b]);
                let load = |i: usize| self.targets.get(i).map_or(usize::MAX, Target::load);
                if load(b) < load(a) {
                    b
                } else {
                    a
                }
            }
        };
        self.targets.get(i).map(|t| (i, t))
    }

    /// Records how a request to target `index` went.
    pub fn report(&self, index: usize, outcome: Outcome, now: u64) -> Option<Change> {
        let t = self.targets.get(index)?;
        t.health
            .report(outcome, now, &self.ejection, &self.out, self.targets.len())
    }

    /// Takes over the health of `old`'s targets that this upstream keeps
    /// (a reload): an ejected target stays out.
    pub fn inherit_health(&self, old: &Upstream) {
        let mut out = 0;
        for t in &self.targets {
            if let Some(o) = old.targets.iter().find(|o| o.authority == t.authority) {
                t.health.inherit(&o.health);
            }
            if !t.health.in_rotation() {
                out += 1;
            }
        }
        // Fewer targets than before: never all of them out.
        if out >= self.targets.len() {
            for t in &self.targets {
                t.health.inherit(&Health::default());
            }
            out = 0;
        }
        self.out.store(out, Ordering::Relaxed);
        if self.active.is_none() {
            // Its checks were removed: their verdicts go with them.
            for t in &self.targets {
                t.health.set_actively_down(false);
            }
        }
        let active_out = self.targets.iter().filter(|t| t.health.actively_down()).count();
        self.active_out.store(active_out, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(targets: &[&str]) -> Upstream {
        let t = targets.iter().map(|t| Target::plain(t.parse().unwrap())).collect();
        let d = Duration::from_secs(1);
        Upstream::new("u".into(), t, (None, Protocol::Http1), d, d, d, 1)
    }

    #[test]
    fn round_robin_visits_every_target_in_turn() {
        let u = upstream(&["a:1", "b:2", "c:3"]);
        let seen: Vec<_> = (0..6).map(|_| u.pick(1, &[]).unwrap().1.as_str().to_string()).collect();
        assert_eq!(seen, ["a:1", "b:2", "c:3", "a:1", "b:2", "c:3"]);
        assert_eq!(upstream(&["x:1"]).pick(1, &[]).unwrap().0, 0);
        assert!(upstream(&[]).pick(1, &[]).is_none());
    }

    #[test]
    fn an_ejected_target_is_skipped_and_a_retry_takes_another() {
        let u = upstream(&["a:1", "b:2", "c:3"]);
        for _ in 0..5 {
            u.report(1, Outcome::Failure, 10);
        }
        let seen: Vec<_> = (0..6).map(|_| u.pick(20, &[]).unwrap().0).collect();
        assert!(!seen.contains(&1), "{seen:?}");
        assert!(u.pick(20, &[0, 2]).is_none());
        assert_eq!(u.pick(20, &[0]).unwrap().0, 2);
        // After the backoff, one trial.
        let after = 10 + u.ejection.first.as_millis() as u64;
        let seen: Vec<_> = (0..6).map(|_| u.pick(after, &[]).unwrap().0).collect();
        assert_eq!(seen.iter().filter(|&&i| i == 1).count(), 1, "{seen:?}");
        // A reload keeps it out.
        let again = upstream(&["a:1", "b:2", "c:3"]);
        u.report(1, Outcome::Failure, after);
        again.inherit_health(&u);
        let seen: Vec<_> = (0..6).map(|_| again.pick(after + 1, &[]).unwrap().0).collect();
        assert!(!seen.contains(&1), "{seen:?}");
    }

    #[test]
    fn least_request_prefers_the_target_with_fewer_in_flight() {
        let mut u = upstream(&["a:1", "b:2"]);
        u.balance = Balance::LeastRequest;
        let u = Arc::new(u);
        let mut held = Vec::new();
        for _ in 0..5 {
            let mut p = u.enter(None).unwrap();
            p.at(0);
            held.push(p);
        }
        assert_eq!(u.targets[0].load(), 5);
        // Of two drawn among two, the idle one always wins.
        for _ in 0..20 {
            assert_eq!(u.pick(1, &[]).unwrap().0, 1);
        }
        assert_eq!(u.pick(1, &[1]).unwrap().0, 0, "a retry takes the other");
        drop(held);
        assert_eq!(u.targets[0].load(), 0);
        let mut p = u.enter(None).unwrap();
        p.at(1);
        p.at(0);
        assert_eq!((u.targets[0].load(), u.targets[1].load()), (1, 0));
    }

    #[test]
    fn a_tls_target_is_sent_its_own_name() {
        let t = Target::tls("api.example.com:443".parse().unwrap(), None).unwrap();
        assert_eq!(t.host.unwrap(), "api.example.com");
        assert_eq!(
            format!("{:?}", t.tls_name.unwrap()),
            format!("{:?}", ServerName::try_from("api.example.com").unwrap())
        );
        let t = Target::tls("10.0.0.5:8443".parse().unwrap(), Some("api.internal")).unwrap();
        assert_eq!(t.host.unwrap(), "api.internal:8443");
        let t = Target::tls("127.0.0.1:9443".parse().unwrap(), None).unwrap();
        assert_eq!(t.host.unwrap(), "127.0.0.1:9443");
        let t = Target::tls("[::1]:9443".parse().unwrap(), None).unwrap();
        assert_eq!(t.host.unwrap(), "[::1]:9443");
        assert!(Target::tls("a:1".parse().unwrap(), Some("not a name!")).is_none());
    }

    #[test]
    fn in_flight_places_are_bounded_and_given_back() {
        let u = Arc::new(upstream(&["a:1"]).with_limits(Limits {
            max_in_flight: 2,
            ..Limits::default()
        }));
        let a = u.enter(None).unwrap();
        let b = u.enter(None).unwrap();
        assert!(u.enter(None).is_none());
        assert_eq!(u.in_flight(), 2);
        drop(a);
        let _c = u.enter(None).unwrap();
        drop(b);
        assert_eq!(u.in_flight(), 1);
    }

    #[test]
    fn a_client_holds_its_share_of_the_places_at_most() {
        let u = Arc::new(upstream(&["a:1"]).with_limits(Limits {
            max_in_flight: 4,
            max_in_flight_per_client: 2,
            ..Limits::default()
        }));
        let one: IpAddr = "192.0.2.1".parse().unwrap();
        let a = u.enter(Some(one)).unwrap();
        let _b = u.enter(Some(one)).unwrap();
        assert!(u.enter(Some(one)).is_none(), "its share");
        assert_eq!(u.in_flight(), 2, "a refusal holds nothing");
        let _c = u.enter(Some("192.0.2.2".parse().unwrap())).unwrap();
        drop(a);
        let _d = u.enter(Some(one)).unwrap();
        assert_eq!(Limits::default_share(1_024), 128);
        assert_eq!(Limits::default_share(9), 2);
        assert_eq!(Limits::default_share(1), 1);
    }
}
