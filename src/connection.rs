//! What the gateway knows about a client connection, shared by every
//! request on it.

use std::net::SocketAddr;

use bytes::Bytes;

#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The TCP peer (not X-Forwarded-For).
    pub peer: SocketAddr,
    /// Set on connections accepted by the https listener.
    pub tls: Option<TlsInfo>,
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
