//! A real upstream that speaks TLS (a certificate of a test CA, a client
//! certificate required if asked) or plain h2c, HTTP/1.1 or h2 as the
//! client chooses. Every request is answered with what it arrived as.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{TestCa, TestCert};

pub struct TlsUpstream {
    pub addr: SocketAddr,
    /// `https` or `http` (h2c).
    scheme: &'static str,
    pub connections: Arc<AtomicUsize>,
    /// The leaf certificate (DER) every connection presented, if it did.
    pub client_certs: Arc<Mutex<Vec<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsUpstream {
    pub fn target(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The DER of a PEM certificate, to compare with what the upstream saw.
pub fn der(cert: &TestCert) -> Vec<u8> {
    CertificateDer::from_pem_slice(cert.cert_pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Serves TLS with `cert` (ALPN `h2`, `http/1.1`); with `client_ca`, a
/// client without a certificate it signed is refused in the handshake.
pub async fn start(cert: &TestCert, client_ca: Option<&TestCa>) -> TlsUpstream {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
                .unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    serve(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
}

/// Serves h2c (and HTTP/1.1) in the clear.
pub async fn start_h2c() -> TlsUpstream {
    serve(None).await
}

async fn serve(acceptor: Option<tokio_rustls::TlsAcceptor>) -> TlsUpstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let client_certs = Arc::new(Mutex::new(Vec::new()));
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    let (count, certs) = (connections.clone(), client_certs.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let certs = certs.clone();
            tokio::spawn(async move {
                let auto = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match acceptor {
                    Some(acceptor) => {
                        let Ok(tls) = acceptor.accept(tcp).await else { return };
                        let (_, session) = tls.get_ref();
                        let alpn = session.alpn_protocol().map(|a| String::from_utf8_lossy(a).into_owned());
                        if let Some(leaf) = session.peer_certificates().and_then(|c| c.first()) {
                            certs.lock().unwrap().push(leaf.to_vec());
                        }
                        let service = service_fn(move |req| answer(req, alpn.clone()));
                        let _ = auto.serve_connection(TokioIo::new(tls), service).await;
                    }
                    None => {
                        let service = service_fn(move |req| answer(req, None));
                        let _ = auto.serve_connection(TokioIo::new(tcp), service).await;
                    }
                }
            });
        }
    });
    TlsUpstream {
        addr,
        scheme,
        connections,
        client_certs,
        task,
    }
}

/// `{version, host, authority, path, alpn}` of the request as it arrived.
async fn answer(
    req: Request<Incoming>,
    alpn: Option<String>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let body = serde_json::json!({
        "version": format!("{:?}", req.version()),
        "host": req.headers().get("host").and_then(|h| h.to_str().ok()),
        "authority": req.uri().authority().map(|a| a.as_str()),
        "path": req.uri().path_and_query().map(|p| p.as_str()),
        "alpn": alpn,
        "request_id": req.headers().get("x-request-id").and_then(|h| h.to_str().ok()),
    });
    Ok(Response::new(Full::new(Bytes::from(body.to_string()))))
}
