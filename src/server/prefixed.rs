//! A stream that first serves bytes already read from it, then reads on.
//!
//! The https listener reads the ClientHello itself (to fingerprint it) and
//! hands rustls this stream, so rustls sees every byte the client sent.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, ReadBuf};

#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Prefixed { prefix, inner }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

crate::server::delegate_async_write!(Prefixed);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_the_prefix_then_the_stream_and_writes_through() {
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b" world").await.unwrap();
        let mut p = Prefixed::new(Bytes::from_static(b"hello"), a);
        let mut small = [0u8; 3];
        p.read_exact(&mut small).await.unwrap();
        assert_eq!(&small, b"hel");
        let mut rest = [0u8; 8];
        p.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"lo world");
        p.write_all(b"back").await.unwrap();
        let mut got = [0u8; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"back");
    }
}
