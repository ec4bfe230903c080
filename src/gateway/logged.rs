//! A request's access-log line, from its start to its body's end.
//!
//! [`Pending`] is made when a request arrives and lives in its future: if
//! hyper drops that future (the client went away before the response
//! head), its drop logs the request as `499` and counts it. Otherwise the
//! response head makes it a [`Logged`]: a gateway-made body is logged at
//! once; any other is watched to its end (bytes handed on, cut short or
//! not) and logged then, after the cost it settled.
//!
//! One allocation per logged request (the [`Logged`] box, made when the
//! request arrives and moved into the body's watch), plus the body's
//! watch box when the body had none.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, Uri};
use http_body::Frame;
use smallvec::SmallVec;

use super::Gateway;
use crate::connection::ConnInfo;
use crate::identity::{Identity, Tier};
use crate::limit::cost::Reserves;
use crate::limit::LimitRuntime;
use crate::proxy::body::{Body, Ended, Watch};
use crate::proxy::X_REQUEST_ID;
use crate::route::Action;
use crate::runtime::Snapshot;
use crate::telemetry::access_log::{self, Fields, Format, Line};

/// What the log line says of the request's client, filled in as it is
/// served (only when the access log is on).
#[derive(Debug, Default, Clone)]
pub(super) struct Client {
    /// The address the identity used.
    pub ip: Option<IpAddr>,
    pub tenant: Option<Arc<str>>,
    /// The identity's value (`key:<id>`, `user:<sub>`): moved here once
    /// the request no longer needs it; its id part is logged.
    pub value: Option<String>,
    pub tier: Option<Tier>,
    pub bytes_in: BytesIn,
    /// The target that answered or failed last, and the time to its head.
    pub reached: crate::proxy::Reached,
    /// What the request was charged, per limit.
    pub costs: Reserves,
}

/// The request body's length: its `Content-Length`, or counted as it goes.
#[derive(Debug, Default, Clone)]
pub(super) enum BytesIn {
    #[default]
    None,
    Known(u64),
    Counted(Arc<AtomicU64>),
}

impl BytesIn {
    fn get(&self) -> u64 {
        match self {
            BytesIn::None => 0,
            BytesIn::Known(n) => *n,
            BytesIn::Counted(n) => n.load(Ordering::Acquire),
        }
    }
}

impl Client {
    /// Takes what the log needs of `identity` (the request is done with it).
    pub fn identified(&mut self, identity: Identity) {
        self.tier = Some(identity.tier);
        self.ip = Some(identity.client_ip);
        self.tenant = identity.tenant;
        self.value = Some(identity.value);
    }

    /// An API key's id or a JWT's `sub`; never a secret (a key's id is its
    /// name in the config, not the key).
    fn key_id(&self) -> &str {
        match (self.tier, self.value.as_deref()) {
            (Some(Tier::Key | Tier::User), Some(v)) => v.split_once(':').map_or(v, |(_, id)| id),
            _ => "-",
        }
    }
}

/// What the log line needs of the request itself, taken as it arrives.
pub(super) struct Logged {
    format: Format,
    fields: Fields,
    method: Method,
    uri: Uri,
    /// The client's own `x-request-id`, for a line logged before the
    /// response (its id) exists.
    client_id: Option<HeaderValue>,
    // The rest, from the response head on.
    snapshot: Option<Arc<Snapshot>>,
    route: Option<usize>,
    record: Record,
    status: u16,
    request_id: Option<HeaderValue>,
    micros: u64,
    bytes_out: u64,
    /// The body's own watch (slots, costs), told first.
    inner: Option<Box<dyn Watch>>,
}

impl Logged {
    pub fn new<B>(format: Format, fields: Fields, req: &Request<B>) -> Box<Logged> {
        Box::new(Logged {
            format,
            fields,
            method: req.method().clone(),
            uri: req.uri().clone(),
            client_id: req.headers().get(&X_REQUEST_ID).cloned(),
            snapshot: None,
            route: None,
            record: Record::default(),
            status: 0,
            request_id: None,
            micros: 0,
            bytes_out: 0,
            inner: None,
        })
    }

    /// Writes the line; `charged` overrides the record's costs per limit.
    fn write(&self, aborted: bool, charged: &[(Arc<LimitRuntime>, u64)]) {
        let Some(snapshot) = self.snapshot.as_deref() else {
            return;
        };
        let config = &snapshot.config;
        let matched = self.route.and_then(|i| config.routes.get(i));
        let upstream = matched.and_then(|r| match &r.action {
            Action::Forward(u) => Some(u),
            Action::Respond(_) | Action::Usage(_) => None,
        });
        let record = &self.record;
        let unknown;
        let client = match record.client.as_deref() {
            Some(client) => client,
            None => {
                unknown = Client::default();
                &unknown
            }
        };
        let mut key = [0u8; 16];
        let key = match record.limit.as_deref() {
            Some((_, hash)) => hex16(*hash, &mut key),
            None => "-",
        };
        let mut cost: SmallVec<[(&str, u64); 2]> = SmallVec::new();
        for (limit, reserved) in &client.costs {
            let n = charged
                .iter()
                .find(|(l, _)| Arc::ptr_eq(l, limit))
                .map_or(*reserved, |(_, n)| *n);
            cost.push((limit.config.name.as_str(), n));
        }
        let line = Line {
            request_id: self
                .request_id
                .as_ref()
                .or(self.client_id.as_ref())
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
            route: matched.map_or("-", |r| r.name.as_str()),
            method: self.method.as_str(),
            path: self.uri.path(),
            status: self.status,
            identity: record.identity.unwrap_or("-"),
            outcome: if record.outcome.is_empty() { "-" } else { record.outcome },
            limit: record.limit.as_deref().map_or("-", |(l, _)| l.config.name.as_str()),
            key,
            upstream: upstream.map_or("-", |u| u.name.as_str()),
            micros: self.micros,
            client: client.ip,
            tenant: client.tenant.as_deref().unwrap_or("-"),
            key_id: client.key_id(),
            bytes_in: client.bytes_in.get(),
            bytes_out: self.bytes_out,
            upstream_target: match (upstream, client.reached.target) {
                (Some(u), Some(i)) => u.targets.get(i).map_or("-", |t| t.as_str()),
                _ => "-",
            },
            upstream_micros: client.reached.micros,
            cost: &cost,
            aborted,
            fields: self.fields,
        };
        match self.format {
            Format::Json => access_log::record_json(&line),
            Format::Text => access_log::record_text(&line),
        }
    }
}

/// The first 16 hex digits of `hash`, as `leasegate explain --json` prints
/// a `key_hash`.
fn hex16(hash: u64, buf: &mut [u8; 16]) -> &str {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in buf.iter_mut().enumerate() {
        *b = HEX[((hash >> (60 - 4 * i)) & 0xf) as usize];
    }
    std::str::from_utf8(buf).unwrap_or("-")
}

impl Watch for Logged {
    fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(d) = frame.data_ref() {
            self.bytes_out += d.len() as u64;
        }
        if let Some(inner) = &mut self.inner {
            inner.frame(frame);
        }
    }

    fn end(&mut self, how: Ended) {
        let aborted = how != Ended::Complete;
        match self.inner.take() {
            Some(mut inner) => {
                inner.end(how);
                self.write(aborted, inner.charged());
            }
            None => self.write(aborted, &[]),
        }
    }
}

/// A request being served: logged as `499` and counted if dropped before
/// [`Pending::done`].
pub(super) struct Pending<'a> {
    pub gateway: &'a Gateway,
    pub snapshot: &'a Arc<Snapshot>,
    pub conn: &'a ConnInfo,
    pub started: Instant,
    pub route: Option<usize>,
    pub logged: Option<Box<Logged>>,
    pub open: bool,
    /// The request came over HTTP/2 (its response's fields are
    /// compressed: [`super::hpack`]).
    pub h2: bool,
}

impl Pending<'_> {
    /// The response head is ready: counts the request, and logs it now (a
    /// body made here) or at its body's end.
    ///
    /// In place: a response passed through by value was copied in and out
    /// of it, logged or not.
    pub fn done(mut self, record: Record, resp: &mut Response<Body>) {
        self.open = false;
        if self.h2 {
            super::hpack::seed(self.conn, resp.headers_mut());
        }
        let status = resp.status().as_u16();
        let elapsed = self.started.elapsed();
        if let Some(mut logged) = self.logged.take() {
            logged.snapshot = Some(self.snapshot.clone());
            logged.route = self.route;
            logged.status = status;
            logged.micros = elapsed.as_micros() as u64;
            logged.request_id = resp.headers().get(&X_REQUEST_ID).cloned();
            logged.record = record;
            let client = logged.record.client_mut();
            if client.ip.is_none() {
                client.ip = Some(self.conn.peer.ip());
            }
            match resp.body() {
                Body::Full(bytes) => {
                    logged.bytes_out = bytes.as_ref().map_or(0, |b| b.len() as u64);
                    logged.write(false, &[]);
                }
                _ => {
                    let body = std::mem::replace(resp.body_mut(), Body::empty());
                    *resp.body_mut() = body.attach(|inner| {
                        logged.inner = inner;
                        logged
                    });
                }
            }
        }
        self.count(status, elapsed);
    }

    fn count(&self, status: u16, elapsed: std::time::Duration) {
        self.route
            .and_then(|i| self.snapshot.routes.get(i))
            .unwrap_or(&self.snapshot.unrouted)
            .record(&self.gateway.runtime.metrics, status, elapsed);
    }
}

/// nginx's status for a request whose client closed the connection
/// before the response.
pub const CLIENT_CLOSED: u16 = 499;

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let elapsed = self.started.elapsed();
        if let Some(mut logged) = self.logged.take() {
            logged.snapshot = Some(self.snapshot.clone());
            logged.route = self.route;
            logged.status = CLIENT_CLOSED;
            logged.micros = elapsed.as_micros() as u64;
            logged.record.client_mut().ip = Some(self.conn.peer.ip());
            logged.write(true, &[]);
        }
        self.count(CLIENT_CLOSED, elapsed);
    }
}

/// What the access log says about a request, filled in as it is served.
#[derive(Debug, Default, Clone)]
pub(super) struct Record {
    pub(super) identity: Option<&'static str>,
    pub(super) outcome: &'static str,
    /// The limit that refused, or was over in shadow or soft mode, and
    /// its key's hash. Boxed: only a logged line of such a request has
    /// one, and a record is moved with every request.
    pub(super) limit: Option<Box<(Arc<LimitRuntime>, u64)>>,
    /// The client, the bytes, the upstream and the costs: there when the
    /// access log is on, and filled in as the request goes. Boxed: a
    /// record travels with every request, by value through its waits,
    /// and without the log these 160 bytes were copied for nothing.
    pub(super) client: Option<Box<Client>>,
}

impl Record {
    /// A record of a request the log writes (`logging`) or not.
    pub(super) fn new(logging: bool) -> Record {
        Record {
            client: logging.then(Box::default),
            ..Record::default()
        }
    }

    /// The client part, made if the record had none (a request that
    /// ended before it was identified, logged all the same).
    fn client_mut(&mut self) -> &mut Client {
        self.client.get_or_insert_with(Box::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record is moved with every request: without the log it carries
    /// no client part, and is 48 bytes (208 with the part inline).
    #[test]
    fn a_record_holds_its_client_only_with_the_log_on() {
        assert!(std::mem::size_of::<Record>() <= 48, "{}", std::mem::size_of::<Record>());
        assert!(Record::new(false).client.is_none());
        assert!(Record::new(true).client.is_some());
    }
}
