//! What the gateway knows about a client connection, shared by every
//! request on it.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;

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
