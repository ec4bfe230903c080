//! The fields a proxied request and its response lose or gain on the way
//! through: hop-by-hop fields (those `Connection` names, except the ones
//! the gateway keyed or priced the request by), the gateway's internal
//! fields, and `X-Forwarded-For`.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::{KEEP_ALIVE, PROXY_CONNECTION, X_FORWARDED_FOR, X_FORWARDED_PROTO, X_REQUEST_ID};
use crate::connection::ConnInfo;

/// `Connection: upgrade` plus `Upgrade: websocket`. Only WebSocket is
/// tunnelled: `Upgrade: h2c` (or any other protocol) would hand the
/// upstream a connection the gateway no longer reads, so it is dropped
/// with the other hop-by-hop fields.
pub(super) fn is_upgrade(headers: &HeaderMap) -> bool {
    let websocket = headers.get_all(header::UPGRADE).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("websocket")))
    });
    websocket
        && headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
        })
}

/// Removes the headers that describe one connection (RFC 9110 §7.6.1), and
/// any header the `Connection` header names. An upgrade keeps `Connection:
/// upgrade` and `Upgrade`, which the next hop needs.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    remove_hop_by_hop_keeping(headers, keep_upgrade, &[]);
}

/// [`remove_hop_by_hop`], except that `Connection` cannot name the fields
/// of `kept` (those the gateway read the request by) to strip them.
pub fn remove_hop_by_hop_keeping(headers: &mut HeaderMap, keep_upgrade: bool, kept: &[HeaderName]) {
    // Most messages carry none of these, or only `Connection: keep-alive`:
    // one pass over the names finds which are present, and only those are
    // looked up and removed; no allocation unless `Connection` names a
    // header that is actually present.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    let mut named: Vec<HeaderName> = Vec::new();
    if present & CONNECTION_BIT != 0 {
        for value in headers.get_all(header::CONNECTION) {
            // What most HTTP/1.1 peers send (nginx on every response): a
            // hop-by-hop name itself, so it names nothing more to strip.
            if value.as_bytes().eq_ignore_ascii_case(b"keep-alive") {
                continue;
            }
            let Ok(value) = value.to_str() else { continue };
            for token in value.split(',').map(str::trim) {
                if token.is_empty() || (keep_upgrade && token.eq_ignore_ascii_case("upgrade")) {
                    continue;
                }
                // Hop-by-hop names (`keep-alive`) go below if present.
                if HOP_BY_HOP.iter().any(|h| h.as_str().eq_ignore_ascii_case(token)) {
                    continue;
                }
                // A client may not strip what routing read or what the
                // gateway sets (`Connection: host`).
                if PROTECTED.iter().any(|h| h.as_str().eq_ignore_ascii_case(token))
                    || kept.iter().any(|h| h.as_str().eq_ignore_ascii_case(token))
                    || token.get(..12).is_some_and(|p| p.eq_ignore_ascii_case("x-leasegate-"))
                {
                    continue;
                }
                if headers.contains_key(token) {
                    if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                        named.push(name);
                    }
                }
            }
        }
    }
    for n in named {
        headers.remove(n);
    }
    if keep_upgrade {
        // Connection is rewritten below; Upgrade stays.
        present &= !(CONNECTION_BIT | UPGRADE_BIT);
    }
    for (i, h) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(*h);
        }
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The hop-by-hop fields; [`remove_hop_by_hop`] marks the ones present by
/// their index here.
pub(super) static HOP_BY_HOP: [&HeaderName; 9] = [
    &header::CONNECTION,
    &header::UPGRADE,
    &header::TE,
    &header::TRAILER,
    &header::TRANSFER_ENCODING,
    &header::PROXY_AUTHENTICATE,
    &header::PROXY_AUTHORIZATION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
];
/// `name`'s index in [`HOP_BY_HOP`]: one match on the name's length and
/// bytes, where comparing it with each of the nine names took ~70
/// instructions for every field of every message.
pub(super) fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "connection" => 0,
        "upgrade" => 1,
        "te" => 2,
        "trailer" => 3,
        "transfer-encoding" => 4,
        "proxy-authenticate" => 5,
        "proxy-authorization" => 6,
        "keep-alive" => 7,
        "proxy-connection" => 8,
        _ => return None,
    })
}

/// Fields a `Connection` header may not name away: the host the request
/// was routed by, and what the gateway itself sets for the upstream.
static PROTECTED: [&HeaderName; 5] = [
    &header::HOST,
    &X_FORWARDED_FOR,
    &X_FORWARDED_PROTO,
    &X_REQUEST_ID,
    &header::CONTENT_LENGTH,
];
/// `Connection` and `Upgrade`, by their index in [`HOP_BY_HOP`].
const CONNECTION_BIT: u16 = 1 << 0;
const UPGRADE_BIT: u16 = 1 << 1;

/// `x-leasegate-*` headers are ours to set; a client may not forge them.
pub fn remove_internal(headers: &mut HeaderMap) {
    let internal: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-leasegate-"))
        .cloned()
        .collect();
    for k in internal {
        headers.remove(k);
    }
}

pub(super) fn append_forwarded_for(headers: &mut HeaderMap, conn: &ConnInfo) {
    let peer = &conn.peer_ip;
    // One lookup of the name (hashed once): most requests carry none.
    let mut prior = match headers.entry(&X_FORWARDED_FOR) {
        http::header::Entry::Vacant(v) => {
            v.insert(peer.clone());
            return;
        }
        http::header::Entry::Occupied(o) => o,
    };
    let mut value = Vec::with_capacity(64);
    for v in prior.iter() {
        value.extend_from_slice(v.as_bytes());
        value.extend_from_slice(b", ");
    }
    value.extend_from_slice(peer.as_bytes());
    if let Ok(v) = HeaderValue::from_bytes(&value) {
        prior.insert(v);
    }
}
