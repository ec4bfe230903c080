//! An upstream: the targets a route forwards to, how they are spoken to
//! (plain or TLS, HTTP/1.1 or h2), their timeouts, and the round-robin
//! choice between them. Pure data; the sockets live in `proxy`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
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
}

impl Target {
    /// A plain `http://` target.
    pub fn plain(authority: Authority) -> Target {
        Target {
            authority,
            tls_name: None,
            host: None,
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
        let name_in_host = if name.contains(':') { format!("[{name}]") } else { name.to_string() };
        let host_value = match authority.port_u16() {
            Some(443) | None => name_in_host,
            Some(p) => format!("{name_in_host}:{p}"),
        };
        Some(Target {
            host: HeaderValue::from_str(&host_value).ok(),
            authority,
            tls_name: Some(tls_name),
        })
    }

    pub fn as_str(&self) -> &str {
        self.authority.as_str()
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
pub struct InFlight(Arc<Upstream>);

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
    pub fn enter(self: &Arc<Self>) -> Option<InFlight> {
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
    pub fn pick(&self) -> Option<(usize, &Target)> {
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
        let t = targets.iter().map(|t| Target::plain(t.parse().unwrap())).collect();
        let d = Duration::from_secs(1);
        Upstream::new("u".into(), t, (None, Protocol::Http1), d, d, d, 1)
    }

    #[test]
    fn round_robin_visits_every_target_in_turn() {
        let u = upstream(&["a:1", "b:2", "c:3"]);
        let seen: Vec<_> = (0..6).map(|_| u.pick().unwrap().1.as_str().to_string()).collect();
        assert_eq!(seen, ["a:1", "b:2", "c:3", "a:1", "b:2", "c:3"]);
        assert_eq!(upstream(&["x:1"]).pick().unwrap().0, 0);
        assert!(upstream(&[]).pick().is_none());
    }

    #[test]
    fn a_tls_target_is_sent_its_own_name() {
        let t = Target::tls("api.example.com:443".parse().unwrap(), None).unwrap();
        assert_eq!(t.host.unwrap(), "api.example.com");
        assert_eq!(format!("{:?}", t.tls_name.unwrap()), format!("{:?}", ServerName::try_from("api.example.com").unwrap()));
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
