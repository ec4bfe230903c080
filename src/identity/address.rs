//! The client's address: the TCP peer, or the right-most untrusted hop of
//! `X-Forwarded-For` when the peer is a trusted proxy, so a client can
//! never pick its own bucket by sending the header itself. Pure.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client's address: the peer, or, when the peer is a trusted proxy,
/// the right-most `X-Forwarded-For` hop that is not itself trusted. A hop
/// that is not an address stops the walk at the last trusted one.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if trusted.is_empty() || !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    // Bytes, not text: a line that holds a non-ASCII byte somewhere (a
    // client's own part, before the hops a proxy appended) is still read
    // hop by hop from the right; that byte only makes its own hop invalid.
    let values: smallvec::SmallVec<[&[u8]; 2]> =
        headers.get_all(&X_FORWARDED_FOR).iter().map(|v| v.as_bytes()).collect();
    for hop in values.iter().rev().flat_map(|v| v.rsplit(|&b| b == b',')) {
        let hop = std::str::from_utf8(hop).unwrap_or("");
        match parse_hop(hop) {
            Some(ip) if is_trusted(&ip) => client = ip,
            Some(ip) => return ip,
            None => return client,
        }
    }
    client
}

/// `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sa) = hop.parse::<std::net::SocketAddr>() {
        return Some(sa.ip().to_canonical());
    }
    hop.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .and_then(|h| h.parse::<IpAddr>().ok())
}
