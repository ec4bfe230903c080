//! An upstream: the targets a route forwards to, their timeouts, and the
//! round-robin choice between them. Pure data; the sockets live in `proxy`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::Authority;

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    /// `host:port` of each target, all plain `http`.
    pub targets: Vec<Authority>,
    pub connect_timeout: Duration,
    /// Time allowed from sending the request until the response head arrives.
    pub request_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// A body that moves no byte this long ends the exchange.
    pub idle_timeout: Duration,
    /// Requests forwarded at once, from admission to the response body's end.
    pub max_in_flight: usize,
    in_flight: AtomicUsize,
    next: AtomicUsize,
    id: u64,
}

/// What an upstream bounds besides its connections: `idle_timeout_ms` and
/// `max_in_flight`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub idle_timeout: Duration,
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle_timeout: Duration::from_secs(60),
            max_in_flight: 1_024,
        }
    }
}

/// One request's place among an upstream's `max_in_flight`, given back on
/// drop.
#[derive(Debug)]
pub struct InFlight(std::sync::Arc<Upstream>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl InFlight {
    pub fn upstream(&self) -> &Upstream {
        &self.0
    }
}

impl Upstream {
    pub fn new(
        name: String,
        targets: Vec<Authority>,
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
                    targets.iter().map(Authority::as_str).collect::<Vec<_>>(),
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
            connect_timeout,
            request_timeout,
            pool_idle_timeout,
            pool_max_idle_per_host,
            idle_timeout: Limits::default().idle_timeout,
            max_in_flight: Limits::default().max_in_flight,
            in_flight: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            id,
        }
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.idle_timeout = limits.idle_timeout;
        self.max_in_flight = limits.max_in_flight;
        self
    }

    /// A place among the requests in flight, or `None` when all
    /// `max_in_flight` are taken.
    pub fn enter(self: &std::sync::Arc<Self>) -> Option<InFlight> {
        let was = self.in_flight.fetch_add(1, Ordering::Relaxed);
        if was >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(InFlight(self.clone()))
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next target in round-robin order. `targets` is never empty (the
    /// config refuses an upstream without targets); `None` is only a guard.
    pub fn pick(&self) -> Option<(usize, &Authority)> {
        let i = match self.targets.len() {
            0 => return None,
            1 => 0,
            n => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        self.targets.get(i).map(|t| (i, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(targets: &[&str]) -> Upstream {
        let t = targets.iter().map(|t| t.parse().unwrap()).collect();
        let d = Duration::from_secs(1);
        Upstream::new("u".into(), t, d, d, d, 1)
    }

    #[test]
    fn round_robin_visits_every_target_in_turn() {
        let u = upstream(&["a:1", "b:2", "c:3"]);
        let seen: Vec<_> = (0..6).map(|_| u.pick().unwrap().1.as_str().to_string()).collect();
        assert_eq!(seen, ["a:1", "b:2", "c:3", "a:1", "b:2", "c:3"]);
        assert_eq!(upstream(&["x:1"]).pick().unwrap(), (0, &"x:1".parse().unwrap()));
        assert!(upstream(&[]).pick().is_none());
    }

    #[test]
    fn in_flight_places_are_bounded_and_given_back() {
        let u = std::sync::Arc::new(upstream(&["a:1"]).with_limits(Limits {
            max_in_flight: 2,
            ..Limits::default()
        }));
        let a = u.enter().unwrap();
        let b = u.enter().unwrap();
        assert!(u.enter().is_none());
        assert_eq!(u.in_flight(), 2);
        drop(a);
        let _c = u.enter().unwrap();
        drop(b);
        assert_eq!(u.in_flight(), 1);
    }
}
