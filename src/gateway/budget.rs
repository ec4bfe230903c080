//! The memory request bodies read whole to price them hold, in bytes:
//! gateway-wide and per client (the client's network at `[identity]
//! ipv4_prefix` / `ipv6_prefix`, as the identity sees one client). A body
//! holds what its buffer holds, not a place: a stalled body that sent no
//! byte holds nothing but its connection, so clients trickling empty
//! bodies shut no one out. A body that would grow past either share is
//! answered `503` with `Retry-After: 1`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::sync::Recover;

/// The bytes all priced bodies being read may hold, as a multiple of
/// `[gateway] max_cost_body_bytes`: the memory they hold is bounded
/// whatever the clients send.
pub const BODIES_AT_ONCE: usize = 64;
/// ... and the bytes one client's may hold: a quarter of the whole, so
/// that no client holds all of it.
pub const BODIES_PER_CLIENT: usize = BODIES_AT_ONCE / 4;

/// Bytes held by the bodies being read, in all and per client network.
#[derive(Debug, Default)]
pub struct Budget {
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
}

/// The bytes one body holds, given back on drop.
#[derive(Debug)]
pub struct Share {
    budget: Arc<Budget>,
    key: IpAddr,
    bytes: usize,
}

/// The limits a body's growth is checked against: bytes in all, bytes
/// per client.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub total: usize,
    pub per_client: usize,
}

impl Caps {
    /// The caps for bodies of at most `max_body` bytes each.
    pub fn for_bodies_of(max_body: usize) -> Caps {
        Caps {
            total: max_body.saturating_mul(BODIES_AT_ONCE),
            per_client: max_body.saturating_mul(BODIES_PER_CLIENT),
        }
    }
}

impl Budget {
    pub fn new() -> Arc<Budget> {
        Arc::new(Budget::default())
    }

    /// An empty share for a body from `client`, counted with its network
    /// at these prefix lengths.
    pub fn share(self: &Arc<Self>, client: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> Share {
        Share {
            budget: self.clone(),
            key: crate::identity::subnet(client, ipv4_prefix, ipv6_prefix).network(),
            bytes: 0,
        }
    }

    /// Bytes held now, in all.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.held.lock().recover().total
    }
}

impl Share {
    /// Holds `bytes` in all for this body (more than now), if its client's
    /// share and the whole allow it; else holds what it held.
    pub fn grow_to(&mut self, bytes: usize, caps: Caps) -> bool {
        if bytes <= self.bytes {
            return true;
        }
        let more = bytes - self.bytes;
        let mut held = self.budget.held.lock().recover();
        let mine = held.per_client.get(&self.key).copied().unwrap_or(0);
        if held.total.saturating_add(more) > caps.total || mine.saturating_add(more) > caps.per_client {
            return false;
        }
        held.total += more;
        *held.per_client.entry(self.key).or_insert(0) += more;
        self.bytes = bytes;
        true
    }

    /// Holds `bytes` (fewer than now): what the body holds once made one.
    pub fn shrink_to(&mut self, bytes: usize) {
        if bytes >= self.bytes {
            return;
        }
        let less = self.bytes - bytes;
        let mut held = self.budget.held.lock().recover();
        held.total = held.total.saturating_sub(less);
        if let Some(n) = held.per_client.get_mut(&self.key) {
            *n = n.saturating_sub(less);
        }
        self.bytes = bytes;
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut held = self.budget.held.lock().recover();
        held.total = held.total.saturating_sub(self.bytes);
        if let Some(n) = held.per_client.get_mut(&self.key) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                held.per_client.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_hold_their_bytes_per_client_network_and_in_all() {
        let b = Budget::new();
        let caps = Caps {
            total: 300,
            per_client: 100,
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // An empty body holds nothing: any number of them.
        let empty: Vec<Share> = (0..1000).map(|_| b.share(ip("192.0.2.1"), 24, 64)).collect();
        assert_eq!(b.total(), 0);
        let mut a = b.share(ip("192.0.2.1"), 24, 64);
        assert!(a.grow_to(60, caps));
        let mut same_net = b.share(ip("192.0.2.200"), 24, 64);
        assert!(!same_net.grow_to(41, caps), "the /24's share is 100");
        assert!(same_net.grow_to(40, caps));
        let mut v6 = b.share(ip("2001:db8:1:2::1"), 24, 48);
        assert!(v6.grow_to(100, caps));
        let mut v6b = b.share(ip("2001:db8:1:ffff::1"), 24, 48);
        assert!(!v6b.grow_to(1, caps), "the same /48");
        let mut other = b.share(ip("198.51.100.1"), 24, 64);
        assert!(other.grow_to(100, caps));
        let mut last = b.share(ip("203.0.113.1"), 24, 64);
        assert!(!last.grow_to(1, caps), "300 in all");
        drop(a);
        assert!(last.grow_to(60, caps));
        assert_eq!(b.total(), 300);
        drop((same_net, v6, v6b, other, last, empty));
        assert_eq!(b.total(), 0);
        assert!(b.held.lock().recover().per_client.is_empty());
    }
}
