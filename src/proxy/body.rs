//! A response's body ([`Body`]: a streamed upstream body or bytes we
//! made, perhaps watched to its end or rewritten on its way). A request's
//! is [`RequestBody`](super::request_body::RequestBody).

use std::pin::Pin;

use std::task::{Context, Poll};

use crate::proxy::idle::BodyError;
use crate::proxy::pool::UpstreamBody;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};

/// One body type for every response, without boxing: upstream bodies stream
/// through, gateway-made bodies are a single chunk.
#[derive(Debug)]
pub enum Body {
    Full(Option<Bytes>),
    Streamed(UpstreamBody),
    /// A body watched to its end ([`Watch`]): what a concurrency limit's
    /// slots are held by, and what a cost is read from.
    Watched(Box<Watched>),
    /// A body whose bytes are rewritten on their way ([`Rewrite`]).
    Rewritten(Box<Rewritten>),
}

/// What rewrites a response body's bytes on their way to the client.
pub trait Rewrite: Send + Sync {
    /// A data frame's bytes: what to hand on now (empty: nothing yet).
    fn data(&mut self, chunk: Bytes) -> Bytes;
    /// The body ended: what is left to hand on.
    fn end(&mut self) -> Bytes;
}

/// [`Body::Rewritten`]'s parts.
pub struct Rewritten {
    body: Body,
    rewrite: Box<dyn Rewrite>,
    /// Trailers that came while rewritten bytes were still to hand on.
    trailers: Option<Frame<Bytes>>,
    done: bool,
}

impl std::fmt::Debug for Rewritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewritten")
            .field("body", &self.body)
            .field("done", &self.done)
            .finish()
    }
}

impl Rewritten {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(t) = self.trailers.take() {
            self.done = true;
            return Poll::Ready(Some(Ok(t)));
        }
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = self.rewrite.data(data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(trailers) => {
                        let rest = self.rewrite.end();
                        if rest.is_empty() {
                            self.done = true;
                            return Poll::Ready(Some(Ok(trailers)));
                        }
                        self.trailers = Some(trailers);
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                },
                Poll::Ready(None) => {
                    self.done = true;
                    let rest = self.rewrite.end();
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                other => return other,
            }
        }
    }
}

/// What watches a response body go by: each frame, then how it ended, once.
pub trait Watch: Send + Sync {
    /// A frame on its way to the client.
    fn frame(&mut self, _frame: &Frame<Bytes>) {}
    /// The body ended: its last frame was handed on (`Ended::Complete`), it
    /// failed, or it was dropped before its end (the client went away).
    fn end(&mut self, how: Ended);
    /// After [`Watch::end`]: what the response was charged, per limit,
    /// where the watch settled it.
    fn charged(&self) -> &[(std::sync::Arc<crate::limit::LimitRuntime>, u64)] {
        &[]
    }
}

/// How a watched body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Complete,
    Failed,
    Dropped,
}

/// [`Body::Watched`]'s parts.
pub struct Watched {
    body: Body,
    /// Taken at the end: told once.
    watch: Option<Box<dyn Watch>>,
}

impl Watched {
    fn end(&mut self, how: Ended) {
        if let Some(mut w) = self.watch.take() {
            w.end(how);
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // A body whose end was never polled (hyper stops at is_end_stream)
        // ended whole; any other was cut short.
        let how = if self.body.is_end_stream() {
            Ended::Complete
        } else {
            Ended::Dropped
        };
        self.end(how);
    }
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("body", &self.body)
            .field("watching", &self.watch.is_some())
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
    /// `body`, its bytes rewritten by `rewrite` on their way.
    pub fn rewritten(body: Body, rewrite: Box<dyn Rewrite>) -> Body {
        Body::Rewritten(Box::new(Rewritten {
            body,
            rewrite,
            trailers: None,
            done: false,
        }))
    }

    /// This body watched by the watch `make` returns, which is handed the
    /// body's own watch (if any) to tell in turn: in its place when the
    /// body is watched already (inside a rewrite too, where the bytes are
    /// seen before they are rewritten), else around the body.
    pub fn attach(self, make: impl FnOnce(Option<Box<dyn Watch>>) -> Box<dyn Watch>) -> Body {
        match self {
            Body::Watched(mut w) => {
                let inner = w.watch.take();
                w.watch = Some(make(inner));
                Body::Watched(w)
            }
            Body::Rewritten(mut r) if matches!(r.body, Body::Watched(_)) => {
                let body = std::mem::replace(&mut r.body, Body::empty());
                r.body = body.attach(make);
                Body::Rewritten(r)
            }
            body => Body::watched(body, make(None)),
        }
    }

    /// `body`, watched by `watch` to its end.
    pub fn watched(body: Body, watch: Box<dyn Watch>) -> Body {
        Body::Watched(Box::new(Watched {
            body,
            watch: Some(watch),
        }))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Streamed(incoming) => Pin::new(incoming).poll_frame(cx),
            Body::Watched(w) => {
                let frame = Pin::new(&mut w.body).poll_frame(cx);
                match &frame {
                    Poll::Ready(Some(Ok(f))) => {
                        if let Some(watch) = &mut w.watch {
                            watch.frame(f);
                        }
                        if w.body.is_end_stream() {
                            w.end(Ended::Complete);
                        }
                    }
                    Poll::Ready(None) => w.end(Ended::Complete),
                    Poll::Ready(Some(Err(_))) => w.end(Ended::Failed),
                    Poll::Pending => {}
                }
                frame
            }
            Body::Rewritten(r) => r.poll(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(bytes) => bytes.is_none(),
            Body::Streamed(incoming) => incoming.is_end_stream(),
            Body::Watched(w) => w.body.is_end_stream(),
            // Bytes may be held back until the end: ended once told so.
            Body::Rewritten(r) => r.done && r.trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Streamed(incoming) => incoming.size_hint(),
            Body::Watched(w) => w.body.size_hint(),
            Body::Rewritten(_) => SizeHint::default(),
        }
    }
}
