//! TLS for the planes that talk to machines: `[rls]` (Envoys) and the
//! `[region]` link (the other regions' gateways).
//!
//! `tls_cert` and `tls_key` are what this gateway presents; `client_ca`
//! is the private CA its peers' certificates must be signed by. With
//! `client_ca`, a peer without such a certificate is refused during the
//! handshake, before a byte of gRPC or HTTP is read. The region link uses
//! the same CA the other way too: the gateway presents its certificate
//! when it calls the primary, and trusts the primary's only if `client_ca`
//! signed it.

use std::path::PathBuf;
use std::sync::Arc;

/// One plane's TLS, compiled once at load (and again at every reload, so
/// certificates replaced on disk apply to the next handshake).
#[derive(Clone)]
pub struct PeerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `None`: the plane is encrypted but any peer may connect.
    pub client_ca: Option<PathBuf>,
    /// `allow_subjects`, lowercased: the names a peer's certificate must
    /// carry one of (its subject's common name or a subjectAltName DNS
    /// name). Empty: any certificate `client_ca` signed.
    pub allow_subjects: Vec<String>,
    /// The server side: presents `cert`, asks for and verifies the peer's
    /// certificate against `client_ca`.
    pub server: Arc<rustls::ServerConfig>,
    /// The client side (the region link's calls to the primary): presents
    /// `cert`, trusts `client_ca` alone. `None` without `client_ca`.
    pub client: Option<Arc<rustls::ClientConfig>>,
}

impl PeerTls {
    /// Every file it was read from, for the reload's digest.
    pub fn files(&self) -> impl Iterator<Item = &std::path::Path> {
        [
            Some(self.cert.as_path()),
            Some(self.key.as_path()),
            self.client_ca.as_deref(),
        ]
        .into_iter()
        .flatten()
    }

    /// Whether a verified peer known by `names` (its certificate's common
    /// name and DNS names) may use the plane: exact, ignoring ASCII case.
    pub fn allows(&self, names: &[String]) -> bool {
        self.allow_subjects.is_empty()
            || names
                .iter()
                .any(|n| self.allow_subjects.iter().any(|a| a.eq_ignore_ascii_case(n)))
    }

    /// Whether peers must present a certificate.
    pub fn verifies_peers(&self) -> bool {
        self.client_ca.is_some()
    }
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_ca", &self.client_ca)
            .field("allow_subjects", &self.allow_subjects)
            .finish_non_exhaustive()
    }
}
