//! The TLS side of the https listener: capture the ClientHello bytes, then
//! hand the same bytes to rustls.
//!
//! A client that sends something other than a ClientHello, sends too much,
//! or stalls past the deadline is dropped; it never holds up other clients
//! because each connection runs in its own task.

use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::prefixed::Prefixed;
use crate::config::Tls;
use crate::connection::TlsInfo;
use crate::fingerprint::record::{Extent, Framer, FramingError, MAX_RECORD};

/// Largest ClientHello body we accept.
pub const MAX_CLIENT_HELLO: usize = 16 * 1024;
/// Largest number of bytes read before the hello must be complete: two full
/// records cover any hello within [`MAX_CLIENT_HELLO`].
const MAX_BUFFERED: usize = 2 * (MAX_RECORD + 5);

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("no complete ClientHello within the deadline")]
    Timeout,
    #[error("connection closed before the ClientHello was complete")]
    Closed,
    #[error("not a TLS ClientHello: {0}")]
    Framing(#[from] FramingError),
    #[error("ClientHello larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading the ClientHello: {0}")]
    Read(#[source] io::Error),
    #[error("TLS handshake: {0}")]
    Tls(#[source] io::Error),
}

impl HandshakeError {
    /// A bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            HandshakeError::Timeout => "timeout",
            HandshakeError::Closed | HandshakeError::Read(_) => "closed",
            HandshakeError::Framing(_) | HandshakeError::TooLarge(_) => "not_client_hello",
            HandshakeError::Tls(_) => "handshake",
        }
    }
}

pub type ServerStream = TlsStream<Prefixed<TcpStream>>;

/// Longest TLS handshake of a peer of `[rls]` or the region link.
pub const PEER_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The TLS handshake of a peer of `[rls]` or the region link with
/// `config` (which verifies the peer's certificate when it has a
/// `client_ca`): a peer without a valid certificate never gets a byte of
/// gRPC or HTTP served.
pub async fn accept_peer(
    tcp: TcpStream,
    config: std::sync::Arc<rustls::ServerConfig>,
) -> Result<TlsStream<TcpStream>, HandshakeError> {
    tokio::time::timeout(PEER_HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(tcp))
        .await
        .map_err(|_| HandshakeError::Timeout)?
        .map_err(HandshakeError::Tls)
}

/// Reads the ClientHello, completes the TLS handshake, and reports what the
/// connection told us. The whole exchange must finish within the configured
/// `client_hello_timeout`.
pub async fn accept(
    mut tcp: TcpStream,
    tls: &Tls,
    acceptor: &TlsAcceptor,
) -> Result<(ServerStream, TlsInfo), HandshakeError> {
    let deadline = Instant::now() + tls.client_hello_timeout;
    let (buffered, hello_len) = timeout_at(deadline, read_client_hello(&mut tcp))
        .await
        .map_err(|_| HandshakeError::Timeout)??;
    let client_hello = buffered.slice(..hello_len);
    let stream = timeout_at(deadline, acceptor.accept(Prefixed::new(buffered, tcp)))
        .await
        .map_err(|_| HandshakeError::Timeout)?
        .map_err(HandshakeError::Tls)?;
    let (_, session) = stream.get_ref();
    // Once per connection: every request on it carries the same JA4.
    let ja4 = crate::fingerprint::parse(&client_hello)
        .ok()
        .and_then(|hello| http::HeaderValue::from_str(&crate::fingerprint::ja4::ja4(&hello).ja4).ok());
    // rustls verified it against [tls] client_ca during the handshake.
    let client_cert = session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| crate::identity::client_cert::identity_of(leaf))
        .map(Arc::from);
    let info = TlsInfo {
        client_cert,
        ja4,
        client_hello,
        alpn: session.alpn_protocol().map(<[u8]>::to_vec),
    };
    Ok((stream, info))
}

/// Reads until the ClientHello is complete. Returns every byte read (to be
/// replayed) and how many of them are the ClientHello's records.
pub async fn read_client_hello<R: AsyncRead + Unpin>(io: &mut R) -> Result<(Bytes, usize), HandshakeError> {
    let mut buf = BytesMut::with_capacity(2048);
    // One framer for the whole read: each read's bytes are looked at once.
    let mut framer = Framer::new(MAX_CLIENT_HELLO);
    loop {
        if let Extent::Complete(n) = framer.advance(&buf)? {
            return Ok((buf.freeze(), n));
        }
        if buf.len() >= MAX_BUFFERED {
            return Err(HandshakeError::TooLarge(MAX_BUFFERED));
        }
        buf.reserve(4096);
        let n = io.read_buf(&mut buf).await.map_err(HandshakeError::Read)?;
        if n == 0 {
            return Err(HandshakeError::Closed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn record(hs: &[u8]) -> Vec<u8> {
        let mut r = vec![0x16, 3, 1, (hs.len() >> 8) as u8, hs.len() as u8];
        r.extend(hs);
        r
    }

    #[tokio::test]
    async fn reads_a_hello_sent_byte_by_byte_and_keeps_what_follows() {
        let mut hello = vec![1, 0, 0, 6, 9, 9, 9, 9, 9, 9];
        let mut wire = record(&hello[..3]);
        hello.drain(..3);
        wire.extend(record(&hello));
        let hello_len = wire.len();
        wire.extend(b"after");
        let (mut client, mut server) = tokio::io::duplex(1);
        let sent = wire.clone();
        tokio::spawn(async move {
            for b in sent {
                client.write_all(&[b]).await.unwrap();
            }
            std::future::pending::<()>().await;
        });
        let (bytes, n) = read_client_hello(&mut server).await.unwrap();
        assert_eq!(n, hello_len);
        assert_eq!(&bytes[..n], &wire[..hello_len]);
    }

    #[tokio::test]
    async fn garbage_and_early_close_are_errors() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(matches!(
            read_client_hello(&mut server).await,
            Err(HandshakeError::Framing(FramingError::NotHandshake(b'G')))
        ));
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(&[0x16, 3, 1]).await.unwrap();
        drop(client);
        assert!(matches!(
            read_client_hello(&mut server).await,
            Err(HandshakeError::Closed)
        ));
    }
}
