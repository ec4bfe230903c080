//! Reading a request body whole to price it (a `json:` cost reserve):
//! bounded in size (`413`), in time (`408`: the route's request timeout,
//! and `[gateway] min_body_rate` over each 5 s), in silence (`400` after
//! the idle timeout), and in memory: its bytes are copied as they come
//! into a buffer, whose capacity is counted against the [`Budget`] (`503`
//! past it). A body sent in 1-byte frames holds its bytes, not a buffer
//! handle per frame.
//!
//! [`Budget`]: super::budget::Budget

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::budget::{Caps, Share};
use super::respond::RequestError;
use crate::config::MIN_BODY_RATE_WINDOW;
use crate::proxy::request_body::RequestBody;

/// The smallest piece of buffer a body that sent a byte holds.
const FIRST_PIECE: usize = 512;

/// A body's bytes as they come: copied into pieces, each as large as all
/// before it (the capacity doubles, and nothing is copied again or freed
/// while the body comes: a reallocating buffer leaves the allocator the
/// blocks it outgrew, as much again in resident memory), made one at its
/// end. Its capacity is what its [`Share`] holds.
#[derive(Debug, Default)]
struct Pieces {
    pieces: Vec<Vec<u8>>,
    len: usize,
    capacity: usize,
}

impl Pieces {
    /// Appends `data`, growing within `ceiling` bytes and the share.
    fn push(&mut self, mut data: &[u8], ceiling: usize, share: &mut Share, caps: Caps) -> Result<(), RequestError> {
        while !data.is_empty() {
            let room = self.pieces.last().map_or(0, |p| p.capacity() - p.len());
            if room == 0 {
                let size = self
                    .capacity
                    .max(FIRST_PIECE)
                    .min(ceiling.saturating_sub(self.capacity))
                    .max(data.len().min(FIRST_PIECE));
                if !share.grow_to(self.capacity + size, caps) {
                    return Err(RequestError::BodiesBusy);
                }
                self.pieces.push(Vec::with_capacity(size));
                self.capacity += size;
                continue;
            }
            let (now, rest) = data.split_at(room.min(data.len()));
            if let Some(p) = self.pieces.last_mut() {
                p.extend_from_slice(now);
            }
            self.len += now.len();
            data = rest;
        }
        Ok(())
    }

    /// The bytes as one, the share holding what they hold.
    fn into_bytes(mut self, share: &mut Share) -> Bytes {
        if self.pieces.len() <= 1 {
            return self.pieces.pop().map(Bytes::from).unwrap_or_default();
        }
        let mut whole = Vec::with_capacity(self.len);
        for p in self.pieces.drain(..) {
            whole.extend_from_slice(&p);
        }
        share.shrink_to(whole.capacity());
        Bytes::from(whole)
    }
}

/// What bounds one body's read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// Most bytes (`[gateway] max_cost_body_bytes`).
    pub max: usize,
    /// Longest wait for the next byte.
    pub idle: Duration,
    /// Longest read.
    pub total: Duration,
    /// `[gateway] min_body_rate` (bytes/s; 0: none).
    pub min_rate: u64,
    /// The memory all bodies, and a client's, may hold.
    pub caps: Caps,
}

/// The minimum rate's window: the bytes that came since it began.
#[derive(Debug)]
struct RateWindow {
    ends: Instant,
    bytes: u64,
    /// Bytes still to come when it began, when the length is declared.
    remaining: Option<u64>,
}

impl RateWindow {
    fn new(now: Instant, declared: Option<u64>) -> RateWindow {
        RateWindow {
            ends: now + MIN_BODY_RATE_WINDOW,
            bytes: 0,
            remaining: declared,
        }
    }

    /// At the window's end, with the body not ended: whether it came at
    /// `rate` (or all of it that was left, when less); then the next.
    fn fast_enough(&mut self, now: Instant, rate: u64) -> bool {
        let need = rate.saturating_mul(MIN_BODY_RATE_WINDOW.as_secs());
        let need = self.remaining.map_or(need, |r| r.min(need));
        let ok = self.bytes >= need;
        self.remaining = self.remaining.map(|r| r.saturating_sub(self.bytes));
        self.bytes = 0;
        self.ends = now + MIN_BODY_RATE_WINDOW;
        ok
    }
}

/// Reads a request body a `json:` reserve prices, within `bounds`, its
/// buffer's capacity held in `share`: nothing is forwarded on an error.
pub(super) async fn read(
    headers: &HeaderMap,
    mut body: RequestBody,
    bounds: Bounds,
    share: &mut Share,
) -> Result<Bytes, RequestError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > bounds.max as u64) {
        return Err(RequestError::BodyTooLarge(bounds.max));
    }
    // Grown as bytes come, never to more than is declared: a body that
    // declares a megabyte and sends nothing holds nothing.
    let ceiling = declared.map_or(bounds.max, |n| n as usize);
    let started = Instant::now();
    let deadline = started + bounds.total;
    let mut window = RateWindow::new(started, declared);
    let mut last = started;
    let mut buf = Pieces::default();
    // One timer, re-armed when it fires, not per frame.
    let wake = |last: Instant, window: &RateWindow| {
        let mut at = deadline.min(last + bounds.idle);
        if bounds.min_rate > 0 {
            at = at.min(window.ends);
        }
        at
    };
    let timer = tokio::time::sleep_until(wake(last, &window));
    tokio::pin!(timer);
    loop {
        tokio::select! {
            biased;
            frame = body.frame() => match frame {
                None => break,
                Some(Err(e)) => return Err(RequestError::BodyUnread(e.to_string())),
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    last = Instant::now();
                    if buf.len + data.len() > bounds.max {
                        return Err(RequestError::BodyTooLarge(bounds.max));
                    }
                    buf.push(&data, ceiling, share, bounds.caps)?;
                    window.bytes += data.len() as u64;
                }
            },
            () = &mut timer => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(RequestError::BodySlow(bounds.total.as_millis() as u64));
                }
                if now >= last + bounds.idle {
                    return Err(RequestError::BodyUnread(format!(
                        "the body moved no byte for {} ms",
                        bounds.idle.as_millis()
                    )));
                }
                if bounds.min_rate > 0 && now >= window.ends && !window.fast_enough(now, bounds.min_rate) {
                    return Err(RequestError::BodyTooSlow(bounds.min_rate));
                }
                timer.as_mut().reset(wake(last, &window));
            }
        }
    }
    Ok(buf.into_bytes(share))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_double_within_the_ceiling_and_come_out_whole() {
        let budget = super::super::budget::Budget::new();
        let caps = Caps::for_bodies_of(4_096);
        let mut share = budget.share("192.0.2.1".parse().unwrap(), 32, 64);
        let mut p = Pieces::default();
        let body: Vec<u8> = (0..3_000u32).map(|i| (i % 251) as u8).collect();
        for b in &body {
            p.push(std::slice::from_ref(b), 3_000, &mut share, caps).unwrap();
        }
        // 512 + 512 + 1024, then the 952 left to the ceiling.
        assert_eq!(p.capacity, 3_000);
        assert_eq!(p.pieces.len(), 4);
        let whole = p.into_bytes(&mut share);
        assert_eq!(&whole[..], &body[..]);
        // A body without a length grows to the most a body may hold.
        let mut p = Pieces::default();
        let mut share2 = budget.share("192.0.2.2".parse().unwrap(), 32, 64);
        p.push(&[7u8; 600], 4_096, &mut share2, caps).unwrap();
        assert_eq!(p.capacity, 1_024);
        drop((share, share2));
        // Past a client's share (16 × 4096 here): 503.
        let mut share = budget.share("192.0.2.3".parse().unwrap(), 32, 64);
        let mut p = Pieces::default();
        let e = p.push(&[0u8; 70_000], 1 << 20, &mut share, caps).unwrap_err();
        assert!(matches!(e, RequestError::BodiesBusy), "{e:?}");
    }

    #[test]
    fn a_window_asks_its_rate_or_all_that_is_left() {
        let t0 = Instant::now();
        let mut w = RateWindow::new(t0, Some(10_000));
        w.bytes = 2_499;
        assert!(!w.fast_enough(t0, 500), "2499 bytes in 5 s is under 500/s");
        let mut w = RateWindow::new(t0, Some(10_000));
        w.bytes = 2_500;
        assert!(w.fast_enough(t0, 500));
        assert_eq!(w.remaining, Some(7_500));
        assert_eq!(w.bytes, 0, "the next window counts anew");
        // 100 bytes left: the next 5 s must bring them.
        let mut w = RateWindow::new(t0, Some(100));
        w.bytes = 99;
        assert!(!w.fast_enough(t0, 500));
        // No declared length: the rate itself.
        let mut w = RateWindow::new(t0, None);
        w.bytes = 2_500;
        assert!(w.fast_enough(t0, 500));
    }
}
