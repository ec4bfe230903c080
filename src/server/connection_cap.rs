//! No single client holds the door: at most `max_connections_per_ip` open
//! connections per client address, checked at accept. An IPv6 client
//! counts with its network at `[identity] ipv6_prefix` (default /64, the
//! smallest network a subscriber is given; one is often given a /48 or a
//! /56, whose /64s would each get a share): the network the identity sees
//! as one client is one client here. An IPv4 client counts by its address,
//! not at `ipv4_prefix`: a /24 is often many unrelated clients (a carrier's
//! NAT, an office), the door refuses without a word, and an attacker pays
//! for each IPv4 address it holds.
//! An idle connection is closed after `idle_timeout_ms`, and so is an
//! HTTP/1.1 one whose client stopped taking its response for that long
//! (an HTTP/2 stream has its own clock: `super::streams`).
//!
//! `trusted_proxies` are exempt from the per-address cap: every client
//! behind them shares their address.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use super::streams::StreamWatch;
use crate::clock;
use crate::config::Config;
use crate::connection::PerIp;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// The door's places per client for `config`: `max_connections_per_ip`,
/// `trusted_proxies` exempt, IPv6 clients by their network at
/// `[identity] ipv6_prefix`, IPv4 clients by address (see above for why).
pub fn per_ip(config: &Config) -> Arc<PerIp> {
    PerIp::grouped(
        config.gateway.max_connections_per_ip,
        config.identity.trusted_proxies.clone(),
        32,
        config.identity.ipv6_prefix,
    )
}

/// What one connection is doing, for its idle timeout: requests in flight
/// (an HTTP/1.1 exchange, an HTTP/2 stream) and when the last one ended.
///
/// And whether the client still takes what it is sent: a response body that
/// handed hyper a frame waits for hyper to come back for the next one,
/// which hyper does once it could write the last (HTTP/1.1: the socket
/// took it; HTTP/2: the stream's window allows it). A client that stops
/// reading stops that; `taken_ms` then gets old while bodies wait.
#[derive(Debug)]
pub struct Activity {
    in_flight: AtomicUsize,
    idle_since_ms: AtomicU64,
    /// Response bodies that handed over a frame and were not asked again.
    waiting_on_client: AtomicUsize,
    /// When hyper last asked any response body for a frame.
    taken_ms: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        let now = clock::coarse_now_ms();
        Activity {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(now),
            waiting_on_client: AtomicUsize::new(0),
            taken_ms: AtomicU64::new(now),
        }
    }
}

impl Activity {
    /// A request begins; it ends when the returned guard drops (with its
    /// response body).
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// How long the connection has been idle at `now_ms`, or `None` while a
    /// request is in flight.
    pub fn idle_for(&self, now_ms: u64) -> Option<u64> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(now_ms.saturating_sub(self.idle_since_ms.load(Ordering::Relaxed)))
    }

    /// How long a response has waited for the client to take it, at
    /// `now_ms`; `None` when no response waits on the client.
    pub fn stalled_for(&self, now_ms: u64) -> Option<u64> {
        if self.waiting_on_client.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(now_ms.saturating_sub(self.taken_ms.load(Ordering::Relaxed)))
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.idle_since_ms.store(clock::coarse_now_ms(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// A response body that keeps its request counted as in flight until it
/// has been sent (or dropped), and tells when it waits for the client to
/// take a frame: its HTTP/2 stream's own [`StreamWatch`] (its last frame
/// too: hyper holds it until the stream's window lets it go), or, on
/// HTTP/1.1, its connection's [`Activity`].
#[derive(Debug)]
pub struct Tracked<B> {
    inner: B,
    busy: Busy,
    /// Handed a frame over and not asked for the next one yet.
    handed: bool,
    /// The HTTP/2 stream's stall clock.
    watch: Option<Arc<StreamWatch>>,
}

impl<B> Tracked<B> {
    pub fn new(inner: B, busy: Busy, watch: Option<Arc<StreamWatch>>) -> Tracked<B> {
        Tracked {
            inner,
            busy,
            handed: false,
            watch,
        }
    }
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        if let Some(w) = &self.watch {
            w.taken();
        } else if self.handed {
            self.busy.0.waiting_on_client.fetch_sub(1, Ordering::Release);
        }
    }
}

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let activity = &this.busy.0;
        if this.handed {
            this.handed = false;
            match &this.watch {
                Some(w) => w.taken(),
                None => {
                    activity.waiting_on_client.fetch_sub(1, Ordering::Release);
                }
            }
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            activity.taken_ms.store(clock::coarse_now_ms(), Ordering::Relaxed);
            match &this.watch {
                // Hyper holds the frame until the stream's window takes
                // it, the last one too.
                Some(w) => {
                    this.handed = true;
                    w.handed();
                }
                None if !this.inner.is_end_stream() => {
                    this.handed = true;
                    activity.waiting_on_client.fetch_add(1, Ordering::Release);
                }
                None => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_door_groups_ipv6_clients_as_the_identity_does() {
        let text = "[listeners]\nhttp = \"127.0.0.1:0\"\n[gateway]\nmax_connections_per_ip = 1\n\
                    [identity]\nipv4_prefix = 16\nipv6_prefix = 48\n";
        let config = crate::config::parse(std::path::Path::new("g.toml"), text).unwrap();
        let door = per_ip(&config);
        let _held = door.admit("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert!(
            door.admit("2001:db8:1:3::1".parse().unwrap()).is_err(),
            "another /64 of the same /48"
        );
        assert!(door.admit("2001:db8:2::1".parse().unwrap()).unwrap().is_some());
        // IPv4 by address, whatever ipv4_prefix says.
        let _v4 = door.admit("192.0.2.1".parse().unwrap()).unwrap();
        assert!(door.admit("192.0.3.1".parse().unwrap()).unwrap().is_some());
        assert!(door.admit("192.0.2.1".parse().unwrap()).is_err());
    }

    #[test]
    fn a_connection_is_idle_only_with_nothing_in_flight() {
        let a = Arc::new(Activity::default());
        let now = clock::coarse_now_ms();
        assert!(a.idle_for(now).is_some());
        let busy = a.begin();
        let busy2 = a.begin();
        assert_eq!(a.idle_for(now + 10_000), None);
        drop(busy);
        assert_eq!(a.idle_for(now + 10_000), None);
        drop(busy2);
        assert!(a
            .idle_for(clock::coarse_now_ms() + 10_000)
            .is_some_and(|ms| ms >= 10_000));
    }

    /// A body of `n` one-byte frames, each ready at once.
    struct Frames(usize);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::convert::Infallible>>> {
            let this = self.get_mut();
            if this.0 == 0 {
                return Poll::Ready(None);
            }
            this.0 -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
        }
        fn is_end_stream(&self) -> bool {
            self.0 == 0
        }
    }

    #[test]
    fn a_body_waits_on_the_client_between_a_frame_and_the_next_ask() {
        use http_body::Body as _;
        let a = Arc::new(Activity::default());
        let mut body = Tracked::new(Frames(2), a.begin(), None);
        let later = clock::coarse_now_ms() + 5_000;
        assert_eq!(a.stalled_for(later), None, "nothing handed over yet");
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_ready());
        // Handed a frame, not asked again: the client has not taken it.
        assert!(a.stalled_for(later).is_some_and(|ms| ms >= 4_000));
        // The last frame: nothing more to wait for.
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_ready());
        assert_eq!(a.stalled_for(later), None);
        let mut dropped = Tracked::new(Frames(5), a.begin(), None);
        assert!(Pin::new(&mut dropped).poll_frame(&mut cx).is_ready());
        assert!(a.stalled_for(later).is_some());
        drop(dropped);
        assert_eq!(a.stalled_for(later), None, "a dropped body waits for nothing");
        assert!(body.is_end_stream());
    }
}
