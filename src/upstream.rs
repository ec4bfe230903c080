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
    next: AtomicUsize,
    id: u64,
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
            next: AtomicUsize::new(0),
            id,
        }
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
}
