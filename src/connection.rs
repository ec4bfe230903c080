//! What the gateway knows about a client connection, shared by every
//! request on it.

use std::any::Any;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::HeaderValue;
use ipnet::IpNet;

use crate::sync::Recover;

/// Holds a client connection's place (its share of `max_connections`, the
/// worker's drain count) while anything serving it lives, including an
/// upgraded tunnel that outlives the HTTP exchange. Opaque on purpose.
pub type Guard = Arc<dyn Any + Send + Sync>;

#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The TCP peer (not X-Forwarded-For).
    pub peer: SocketAddr,
    /// Set on connections accepted by the https listener.
    pub tls: Option<TlsInfo>,
    /// Dropped when the last user of the connection is done.
    pub guard: Option<Guard>,
    /// The peer's address as a header value (IPv4-mapped addresses as
    /// IPv4), made once per connection for `x-forwarded-for`.
    pub peer_ip: HeaderValue,
    /// `[gateway] idle_timeout_ms`: also bounds a tunnel that moves no byte.
    pub idle_timeout: std::time::Duration,
    /// HTTP/2 responses given so far (`gateway::hpack`).
    pub h2_responses: ResponseCount,
}

/// A count of a connection's responses that no one needs exact: read and
/// written without a locked instruction, so two streams finishing at once
/// may count one.
#[derive(Debug, Default)]
pub struct ResponseCount(AtomicU32);

impl ResponseCount {
    /// The count before this response.
    pub fn next(&self) -> u32 {
        let n = self.0.load(Ordering::Relaxed);
        self.0.store(n.wrapping_add(1), Ordering::Relaxed);
        n
    }
}

impl Clone for ResponseCount {
    fn clone(&self) -> ResponseCount {
        ResponseCount(AtomicU32::new(self.0.load(Ordering::Relaxed)))
    }
}

#[derive(Debug, Clone)]
pub struct TlsInfo {
    /// The raw TLS records that carried the ClientHello, as the client sent them.
    pub client_hello: Bytes,
    /// The ALPN protocol agreed, if any.
    pub alpn: Option<Vec<u8>>,
    /// JA4 of the ClientHello, ready to pass upstream as `x-leasegate-ja4`
    /// (`None` if the hello could not be parsed; rustls accepted it anyway).
    pub ja4: Option<HeaderValue>,
    /// The `cert` identity of the client certificate `[tls] client_ca`
    /// verified, when the client sent one.
    pub client_cert: Option<Arc<str>>,
}

impl ConnInfo {
    pub fn new(peer: SocketAddr, tls: Option<TlsInfo>, guard: Option<Guard>) -> ConnInfo {
        let ip = peer.ip().to_canonical().to_string();
        let peer_ip = HeaderValue::from_str(&ip).unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        ConnInfo {
            peer,
            tls,
            guard,
            peer_ip,
            idle_timeout: std::time::Duration::from_secs(60),
            h2_responses: ResponseCount::default(),
        }
    }

    pub fn with_idle_timeout(mut self, idle: std::time::Duration) -> ConnInfo {
        self.idle_timeout = idle;
        self
    }

    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// Places per client address: open connections (`server::door`), request
/// bodies read whole to price them (`gateway::cost`). An address counts
/// with the others of its network: an IPv4 address at `ipv4_prefix`, an
/// IPv6 one at `ipv6_prefix` (by default itself, and its /64).
#[derive(Debug)]
pub struct PerIp {
    max: usize,
    exempt: Vec<IpNet>,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One place in its address's count, given back on drop.
#[derive(Debug)]
pub struct Place {
    table: Arc<PerIp>,
    key: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().recover();
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

impl PerIp {
    /// IPv4 clients by address, IPv6 clients by their /64.
    pub fn new(max: usize, exempt: Vec<IpNet>) -> Arc<PerIp> {
        PerIp::grouped(max, exempt, 32, 64)
    }

    /// Clients grouped by their network at these prefix lengths (clamped to
    /// 32 and 128).
    pub fn grouped(max: usize, exempt: Vec<IpNet>, ipv4_prefix: u8, ipv6_prefix: u8) -> Arc<PerIp> {
        Arc::new(PerIp {
            max,
            exempt,
            ipv4_prefix: ipv4_prefix.min(32),
            ipv6_prefix: ipv6_prefix.min(128),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for a connection from `peer`: `Ok(None)` for an exempt
    /// address, `Err(())` when the address has `max` open already.
    #[allow(clippy::result_unit_err)]
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Option<Place>, ()> {
        let peer = peer.to_canonical();
        if self.exempt.iter().any(|n| n.contains(&peer)) {
            return Ok(None);
        }
        let key = self.key(peer);
        let mut open = self.open.lock().recover();
        let n = open.entry(key).or_insert(0);
        if *n >= self.max {
            return Err(());
        }
        *n += 1;
        Ok(Some(Place {
            table: self.clone(),
            key,
        }))
    }

    /// Addresses (networks) with a connection open now.
    pub fn addresses(&self) -> usize {
        self.open.lock().recover().len()
    }

    /// The network `ip` (canonical) counts in: its first address.
    fn key(&self, ip: IpAddr) -> IpAddr {
        let prefix = if ip.is_ipv4() {
            self.ipv4_prefix
        } else {
            self.ipv6_prefix
        };
        IpNet::new(ip, prefix).map_or(ip, |n| n.network())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_gets_its_share_and_gives_it_back() {
        let t = PerIp::new(2, vec!["10.0.0.0/8".parse().unwrap()]);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let p1 = t.admit(a).unwrap();
        let p2 = t.admit(a).unwrap();
        assert!(t.admit(a).is_err());
        assert!(
            t.admit("192.0.2.2".parse().unwrap()).unwrap().is_some(),
            "another address"
        );
        assert!(
            t.admit("::ffff:192.0.2.1".parse().unwrap()).is_err(),
            "the same address, mapped"
        );
        drop(p1);
        assert!(t.admit(a).unwrap().is_some());
        drop(p2);
        // Trusted proxies are exempt.
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        for _ in 0..10 {
            assert!(t.admit(proxy).unwrap().is_none());
        }
    }

    #[test]
    fn an_ipv6_client_counts_per_64() {
        let t = PerIp::new(1, vec![]);
        let _p = t.admit("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert!(t.admit("2001:db8:1:2:ffff::9".parse().unwrap()).is_err());
        assert!(t.admit("2001:db8:1:3::1".parse().unwrap()).unwrap().is_some());
    }

    #[test]
    fn an_ipv6_client_counts_per_network_at_the_prefix_given() {
        // 40 /64s of one /48 were 40 shares at /64; at /48 they are one.
        let t = PerIp::grouped(2, vec![], 32, 48);
        let _a = t.admit("2001:db8:1:2::1".parse().unwrap()).unwrap();
        let _b = t.admit("2001:db8:1:3::1".parse().unwrap()).unwrap();
        assert!(t.admit("2001:db8:1:ffff::9".parse().unwrap()).is_err());
        assert!(
            t.admit("2001:db8:2::1".parse().unwrap()).unwrap().is_some(),
            "another /48"
        );
        // IPv4 as given: by address here, by /24 at 24.
        let _c = t.admit("192.0.2.1".parse().unwrap()).unwrap();
        let _d = t.admit("192.0.2.1".parse().unwrap()).unwrap();
        assert!(t.admit("192.0.2.2".parse().unwrap()).unwrap().is_some());
        let by24 = PerIp::grouped(1, vec![], 24, 64);
        let _e = by24.admit("192.0.2.1".parse().unwrap()).unwrap();
        assert!(by24.admit("192.0.2.200".parse().unwrap()).is_err());
        assert!(
            by24.admit("::ffff:192.0.2.7".parse().unwrap()).is_err(),
            "mapped is IPv4"
        );
        // Out-of-range prefixes are clamped, not refused.
        let wide = PerIp::grouped(1, vec![], 99, 200);
        let _f = wide.admit("2001:db8::1".parse().unwrap()).unwrap();
        assert!(wide.admit("2001:db8::2".parse().unwrap()).unwrap().is_some());
    }

    #[test]
    fn forgotten_when_the_last_connection_closes() {
        let t = PerIp::new(3, vec![]);
        let p = t.admit("192.0.2.9".parse().unwrap()).unwrap();
        assert_eq!(t.addresses(), 1);
        drop(p);
        assert_eq!(t.addresses(), 0);
    }
}
