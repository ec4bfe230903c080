//! What the gateway knows about a client connection, shared by every
//! request on it.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;

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
}

#[derive(Debug, Clone)]
pub struct TlsInfo {
    /// The raw TLS records that carried the ClientHello, as the client sent them.
    pub client_hello: Bytes,
    /// The ALPN protocol agreed, if any.
    pub alpn: Option<Vec<u8>>,
    /// The SNI host name the client asked for, if any.
    pub server_name: Option<String>,
}

impl ConnInfo {
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }
}
