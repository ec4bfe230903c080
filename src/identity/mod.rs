//! Who a request is, for keying limits.
//!
//! For now the subnet tier only: the client's address aggregated to
//! `ipv4_prefix` / `ipv6_prefix` bits (IPv4-mapped IPv6 counts as IPv4), so
//! one client cannot dodge a limit by rotating addresses within its network.
//! Pure: no I/O.

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

/// The client's network at the configured prefix lengths.
pub fn subnet(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> IpNet {
    let ip = ip.to_canonical();
    let prefix = if ip.is_ipv4() {
        ipv4_prefix.min(32)
    } else {
        ipv6_prefix.min(128)
    };
    IpNet::new(ip, prefix).map_or_else(|_| IpNet::from(ip), |n| n.trunc())
}

/// Writes `subnet:<cidr>` into `out` (cleared first).
pub fn subnet_identity(out: &mut String, ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) {
    out.clear();
    let _ = write!(out, "subnet:{}", subnet(ip, ipv4_prefix, ipv6_prefix));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_to_the_configured_prefix() {
        let mut s = String::new();
        subnet_identity(&mut s, "198.51.100.77".parse().unwrap(), 24, 64);
        assert_eq!(s, "subnet:198.51.100.0/24");
        subnet_identity(&mut s, "::ffff:198.51.100.77".parse().unwrap(), 24, 64);
        assert_eq!(s, "subnet:198.51.100.0/24");
        subnet_identity(&mut s, "2001:db8:1:2:3:4:5:6".parse().unwrap(), 24, 64);
        assert_eq!(s, "subnet:2001:db8:1:2::/64");
        subnet_identity(&mut s, "10.1.2.3".parse().unwrap(), 32, 64);
        assert_eq!(s, "subnet:10.1.2.3/32");
    }
}
