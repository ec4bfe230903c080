//! Real clients: HTTP/1.1 keep-alive, h2c, HTTP/2 over TLS with ALPN.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

pub type Sender1 = http1::SendRequest<Full<Bytes>>;
pub type Sender2 = http2::SendRequest<Full<Bytes>>;

/// One HTTP/1.1 connection that can carry many requests.
pub async fn http1(addr: SocketAddr) -> Sender1 {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// One HTTP/1.1 connection from a chosen source address (any of
/// 127.0.0.0/8), so one test can be many clients.
pub async fn http1_from(source: &str, addr: SocketAddr) -> Sender1 {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// HTTP/2 over plain TCP, by prior knowledge.
pub async fn h2c(addr: SocketAddr) -> Sender2 {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

pub fn tls_config(cert_pem: &str, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    cfg
}

pub type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection to `addr` for the name `localhost`.
pub async fn tls(addr: SocketAddr, cert_pem: &str, alpn: &[&[u8]]) -> TlsStream {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(cert_pem, alpn)));
    let stream = TcpStream::connect(addr).await.unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), stream)
        .await
        .unwrap()
}

/// HTTP/2 over TLS, negotiated by ALPN. Returns the sender and the ALPN agreed.
pub async fn h2_tls(addr: SocketAddr, cert_pem: &str) -> (Sender2, Option<Vec<u8>>) {
    let stream = tls(addr, cert_pem, &[b"h2", b"http/1.1"]).await;
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    (sender, alpn)
}

pub fn get(uri: &str) -> Request<Full<Bytes>> {
    Request::get(uri)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// Reads a whole response body as text.
pub async fn text<B>(resp: Response<B>) -> (http::StatusCode, http::HeaderMap, String)
where
    B: hyper::body::Body,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// Sends on an HTTP/1.1 connection once it is ready for the next request.
pub async fn send(c: &mut Sender1, req: Request<Full<Bytes>>) -> Response<hyper::body::Incoming> {
    c.ready().await.unwrap();
    c.send_request(req).await.unwrap()
}

/// A client config trusting `ca`, presenting `cert` if any.
pub fn mtls_config(ca: &super::TestCa, cert: Option<&super::TestCert>, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match cert {
        Some(c) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(c.cert_pem.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(cfg)
}
