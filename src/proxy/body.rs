//! The response body type: a streamed upstream body or bytes we made.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::proxy::idle::BodyError;
use crate::proxy::pool::UpstreamBody;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// One body type for every response, without boxing: upstream bodies stream
/// through, gateway-made bodies are a single chunk.
#[derive(Debug)]
pub enum Body {
    Full(Option<Bytes>),
    Streamed(UpstreamBody),
    /// A body with something to hold until it ends: a concurrency limit's
    /// slots, dropped at its last frame, its first error, or when the body
    /// is (the client went away).
    Holding(Box<Holding>),
}

/// [`Body::Holding`]'s parts.
pub struct Holding {
    pub body: Body,
    pub held: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Holding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holding")
            .field("body", &self.body)
            .field("held", &self.held.is_some())
            .finish()
    }
}

impl Body {
    pub fn empty() -> Self {
        Body::Full(None)
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        if bytes.is_empty() {
            Body::Full(None)
        } else {
            Body::Full(Some(bytes))
        }
    }
}

impl Body {
    /// `body`, holding `held` until it ends.
    pub fn holding(body: Body, held: Box<dyn std::any::Any + Send + Sync>) -> Body {
        Body::Holding(Box::new(Holding { body, held: Some(held) }))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Streamed(incoming) => Pin::new(incoming).poll_frame(cx),
            Body::Holding(h) => {
                let frame = Pin::new(&mut h.body).poll_frame(cx);
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
                    h.held = None;
                }
                frame
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(bytes) => bytes.is_none(),
            Body::Streamed(incoming) => incoming.is_end_stream(),
            Body::Holding(h) => h.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Streamed(incoming) => incoming.size_hint(),
            Body::Holding(h) => h.body.size_hint(),
        }
    }
}
