//! A request on its way through the gateway: matched to a route, its
//! client identified ([`Routed`]), and what serving it gives back
//! ([`Served`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};

use super::logged::Record;
use super::request_id::RequestId;
use crate::connection::ConnInfo;
use crate::identity::Identity;
use crate::limit::cost::Reserves;
use crate::proxy::body::Body;
use crate::proxy::request_body::RequestBody;
use crate::route::Route;
use crate::runtime::Snapshot;

/// Per priced limit (by index), the prompt estimate an unsettled cost's
/// estimate starts from; `None` for a request a preset does not price (a
/// path that generates nothing: it costs as a plain request).
pub(super) type Estimates = smallvec::SmallVec<[(std::sync::Arc<crate::limit::LimitRuntime>, Option<u64>); 2]>;

/// A request matched to a route, its client identified: what the rest of
/// its serving needs.
pub(super) struct Routed<'a> {
    pub(super) snapshot: &'a Snapshot,
    pub(super) req: Request<RequestBody>,
    pub(super) conn: &'a ConnInfo,
    pub(super) route: &'a Route,
    pub(super) identity: Identity,
    /// The route's limits that apply to the identity's tier, in order:
    /// what the request is decided on.
    pub(super) limits: crate::runtime::Applying<'a>,
    pub(super) request_id: RequestId,
    pub(super) record: Record,
    /// What the request reserves under limits with a `cost`.
    pub(super) costs: Reserves,
    /// ... and the prompt estimates their unsettled costs start from.
    pub(super) estimates: Estimates,
    /// The upstream was asked for a stream's usage the client did not ask
    /// for: the chunk that brings it is removed from the response.
    pub(super) hide_usage: bool,
    /// The request body's bytes as they go upstream, for a limit that
    /// settles by them.
    pub(super) request_bytes: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl<'a> Routed<'a> {
    /// All of it, taken for good (into a wait's box): what stays is a
    /// request, an identity and the rest emptied, which allocates nothing.
    /// Handed down by reference until then: a `Routed` is most of a
    /// kilobyte, and passed by value each call copied it.
    pub(super) fn take(&mut self) -> Routed<'a> {
        Routed {
            snapshot: self.snapshot,
            req: self.take_request(),
            conn: self.conn,
            route: self.route,
            identity: self.identity.take(),
            limits: std::mem::take(&mut self.limits),
            request_id: std::mem::take(&mut self.request_id),
            record: std::mem::take(&mut self.record),
            costs: std::mem::take(&mut self.costs),
            estimates: std::mem::take(&mut self.estimates),
            hide_usage: self.hide_usage,
            request_bytes: self.request_bytes.take(),
        }
    }

    /// The request, taken for good (into a wait's box, or apart to read
    /// its body): an empty one is left in its place, which allocates
    /// nothing.
    pub(super) fn take_request(&mut self) -> Request<RequestBody> {
        std::mem::replace(&mut self.req, Request::new(RequestBody::Read(None, None)))
    }
}

/// A response now, or the wait for it; with what the access log records.
/// `handle` takes it apart before it waits, so it is never part of hyper's
/// per-request future (only of the rare boxed wait on the store): boxing
/// `Now` would cost every immediate answer (a 429) an allocation for
/// nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Served<'a> {
    Now(Response<Body>, Record),
    Later(Pin<Box<dyn Future<Output = (Response<Body>, Record)> + Send + 'a>>),
}
