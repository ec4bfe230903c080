//! A request's body on its way upstream ([`RequestBody`]: the client's,
//! streamed, or read already). Below the pool, which sends it, and the
//! response's [`Body`](super::body::Body), which holds the pool's
//! connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;

/// A request body on its way upstream: the client's as it streams in
/// (counted, for a limit that settles by `request_bytes`), or one read
/// already (a `json:` cost reserve read it first), sent as it was, with
/// the share of memory it holds among the bodies read at once,
/// gateway-wide and its client's (given back when the bytes are handed on).
#[derive(Debug)]
pub enum RequestBody {
    Streamed(Incoming),
    Counted(Incoming, Arc<AtomicU64>),
    Read(Option<Bytes>, Option<ReadPlaces>),
}

/// What a read body holds until it is handed on: its bytes' share of the
/// memory bodies read to price them may hold, in all and its client's.
/// Opaque here (the gateway keeps the count).
pub type ReadPlaces = Box<dyn std::any::Any + Send + Sync>;

impl RequestBody {
    /// The client's body, counted into `bytes` as it goes when given.
    pub fn streamed(body: Incoming, bytes: Option<Arc<AtomicU64>>) -> RequestBody {
        match bytes {
            Some(n) => RequestBody::Counted(body, n),
            None => RequestBody::Streamed(body),
        }
    }

    /// Its bytes, if it can be sent again: one read already, or none at
    /// all (a streamed body is gone once sent).
    pub fn replayable(&self) -> Option<Bytes> {
        use http_body::Body as _;
        match self {
            RequestBody::Read(bytes, _) => Some(bytes.clone().unwrap_or_default()),
            RequestBody::Streamed(b) | RequestBody::Counted(b, _) => b.is_end_stream().then(Bytes::new),
        }
    }

    /// A body read already, holding `place` until it is handed on.
    pub fn read(bytes: Bytes, place: Option<ReadPlaces>) -> RequestBody {
        RequestBody::Read((!bytes.is_empty()).then_some(bytes), place)
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RequestBody::Streamed(b) => Pin::new(b).poll_frame(cx),
            RequestBody::Counted(b, n) => {
                let frame = Pin::new(b).poll_frame(cx);
                if let Poll::Ready(Some(Ok(f))) = &frame {
                    if let Some(d) = f.data_ref() {
                        n.fetch_add(d.len() as u64, Ordering::AcqRel);
                    }
                }
                frame
            }
            RequestBody::Read(bytes, place) => {
                *place = None;
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Streamed(b) | RequestBody::Counted(b, _) => b.is_end_stream(),
            RequestBody::Read(bytes, _) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Streamed(b) | RequestBody::Counted(b, _) => b.size_hint(),
            RequestBody::Read(bytes, _) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
