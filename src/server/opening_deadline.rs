//! A deadline on the opening bytes of a connection.
//!
//! hyper's header-read timer covers an HTTP/1.1 request head, and HTTP/2
//! pings cover a live HTTP/2 connection, but neither covers the bytes before:
//! the protocol sniffer on the plain listener and the HTTP/2 preface wait
//! without a deadline. This wrapper fails the read if the first
//! [`PREFACE_LEN`] bytes have not arrived in time, then costs one branch per
//! read.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::Sleep;

/// The HTTP/2 connection preface; any HTTP/1.1 request line is as long.
pub const PREFACE_LEN: usize = 24;

#[derive(Debug)]
pub struct Opening<S> {
    inner: S,
    deadline: Option<Pin<Box<Sleep>>>,
    left: usize,
}

impl<S> Opening<S> {
    pub fn new(inner: S, within: Duration) -> Self {
        Opening {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
            left: PREFACE_LEN,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Opening<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(deadline) = this.deadline.as_mut() else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no request within the deadline",
            )));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.left = this.left.saturating_sub(buf.filled().len() - before);
            if this.left == 0 {
                this.deadline = None;
            }
        }
        polled
    }
}

crate::server::delegate_async_write!(Opening);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_and_a_prompt_one_never_does() {
        let (_quiet, server) = tokio::io::duplex(64);
        let mut o = Opening::new(server, Duration::from_secs(5));
        let mut buf = [0u8; 8];
        let err = o.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        let (mut client, server) = tokio::io::duplex(64);
        let mut o = Opening::new(server, Duration::from_secs(5));
        client.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        let mut preface = [0u8; PREFACE_LEN];
        o.read_exact(&mut preface).await.unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        client.write_all(b"later").await.unwrap();
        let mut later = [0u8; 5];
        o.read_exact(&mut later).await.unwrap();
        assert_eq!(&later, b"later");
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_preface_does_not_stop_the_clock() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut o = Opening::new(server, Duration::from_secs(5));
        client.write_all(b"P").await.unwrap();
        let mut buf = [0u8; 24];
        assert_eq!(o.read(&mut buf).await.unwrap(), 1);
        assert_eq!(o.read(&mut buf).await.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }
}
