//! A request's `x-request-id` under `[gateway] request_id`: the one the
//! upstream is sent, and the one the client gets back.
//!
//! - `generate`: a sane client id is kept, else one is made; the upstream
//!   is sent it, and every response carries it (in place of the
//!   upstream's own).
//! - `forward`: the same on the way up; a response that carries an id of
//!   its own (the upstream's) keeps it, and one without gets the request's.
//! - `off`: the gateway makes none and sets none: the header goes up and
//!   comes back as the client and the upstream wrote it, and the
//!   gateway's own answers (429, 401, 404, 5xx) carry none.

use http::{HeaderMap, HeaderValue};

use crate::config::RequestIds;
use crate::limit::headers::changing;
use crate::proxy::X_REQUEST_ID;

/// A request's id, and what to do with it. The default is no id: what
/// is left where one was taken (`std::mem::take`) for its response.
#[derive(Debug, Default)]
pub(crate) struct RequestId {
    /// The client's sane id, else (unless `off`) one made here.
    value: Option<HeaderValue>,
    /// The request already carries `value` as its one `x-request-id` (or,
    /// under `off`, is left as it came): nothing to set on the way up.
    sent: bool,
    mode: RequestIds,
}

/// What the log says of a request without an id (`off`, none sent).
static NONE: HeaderValue = HeaderValue::from_static("-");

impl RequestId {
    /// The id of a request with `headers`.
    pub(crate) fn of(headers: &HeaderMap, mode: RequestIds) -> RequestId {
        let mut sent = headers.get_all(&X_REQUEST_ID).iter();
        let kept = sent.next().filter(|v| sane(v)).cloned();
        if mode == RequestIds::Off {
            return RequestId {
                value: kept,
                sent: true,
                mode,
            };
        }
        match kept {
            Some(v) => RequestId {
                value: Some(v),
                // Several are made one (the first) on the way up.
                sent: sent.next().is_none(),
                mode,
            },
            None => RequestId {
                value: Some(made_id()),
                sent: false,
                mode,
            },
        }
    }

    /// What to set as the upstream request's `x-request-id`, if anything.
    pub(crate) fn upstream(&self) -> Option<&HeaderValue> {
        if self.sent {
            None
        } else {
            self.value.as_ref()
        }
    }

    /// The id as log lines show it: `-` for none.
    pub(crate) fn shown(&self) -> &HeaderValue {
        self.value.as_ref().unwrap_or(&NONE)
    }

    /// How many fields [`RequestId::stamp`] may add.
    pub(crate) fn fields(&self) -> usize {
        usize::from(self.mode != RequestIds::Off)
    }

    /// Gives a response to the client its `x-request-id`, as the mode says.
    /// The value is one no other response repeats: marked so HTTP/2 keeps
    /// it out of the connection's HPACK table
    /// ([`crate::limit::headers::changing`]).
    pub(crate) fn stamp(self, headers: &mut HeaderMap) {
        let Some(value) = self.value.map(changing) else { return };
        match self.mode {
            RequestIds::Generate => {
                headers.insert(X_REQUEST_ID.clone(), value);
            }
            RequestIds::Forward => {
                if let http::header::Entry::Vacant(v) = headers.entry(&X_REQUEST_ID) {
                    v.insert(value);
                }
            }
            RequestIds::Off => {}
        }
    }
}

/// 1 to 128 visible ASCII characters: what a log line and a header carry
/// as they are.
pub(super) fn sane(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

/// Keeps a client's `x-request-id` when it is sane, else makes a new one
/// (`[gateway] request_id = "generate"`; the request path asks
/// [`RequestId::of`], which knows every mode).
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    match headers.get(&X_REQUEST_ID) {
        Some(v) if sane(v) => v.clone(),
        _ => made_id(),
    }
}

/// A new id: 32 hex digits of a random 128-bit number.
fn made_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = [0u8; 32];
    // Two 64-bit halves, a byte (two digits) a step: a 128-bit shift a
    // digit took ~200 instructions a request.
    for digits in id.chunks_exact_mut(16) {
        let n = fastrand::u64(..);
        for (i, pair) in digits.chunks_exact_mut(2).enumerate() {
            let byte = (n >> (8 * i)) as u8;
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0xf)];
        }
    }
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_when_sane_and_made_otherwise() {
        let mut h = HeaderMap::new();
        let made = request_id(&h);
        assert_eq!(made.len(), 32);
        assert!(
            made.as_bytes().iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "{made:?}"
        );
        // Both halves random: a digit place fixed across ids would show.
        let ids: Vec<HeaderValue> = (0..64).map(|_| request_id(&h)).collect();
        for place in 0..32 {
            assert!(
                ids.iter().any(|id| id.as_bytes()[place] != ids[0].as_bytes()[place]),
                "place {place}"
            );
        }
        assert_ne!(made, request_id(&h));
        h.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h), "abc-123");
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        assert_eq!(request_id(&h).len(), 32);
    }

    fn with(ids: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for id in ids {
            h.append(X_REQUEST_ID.clone(), HeaderValue::from_static(id));
        }
        h
    }

    fn response(upstream: Option<&'static str>, id: RequestId) -> Option<String> {
        let mut h = HeaderMap::new();
        if let Some(u) = upstream {
            h.insert(X_REQUEST_ID.clone(), HeaderValue::from_static(u));
        }
        id.stamp(&mut h);
        let all: Vec<_> = h.get_all(&X_REQUEST_ID).iter().collect();
        assert!(all.len() <= 1, "{all:?}");
        all.first().map(|v| v.to_str().unwrap().to_string())
    }

    #[test]
    fn generate_keeps_a_sane_id_and_sets_it_both_ways() {
        let id = RequestId::of(&with(&["abc-1"]), RequestIds::Generate);
        // Already on the request: not set again.
        assert_eq!(id.upstream(), None);
        assert_eq!(id.shown(), "abc-1");
        assert_eq!(response(Some("up-9"), id).as_deref(), Some("abc-1"));
        for insane in [&["has space"][..], &[""], &["tab\there"]] {
            let id = RequestId::of(&with(insane), RequestIds::Generate);
            let made = id.upstream().unwrap().clone();
            assert_eq!(made.len(), 32);
            assert_eq!(response(None, id).as_deref(), made.to_str().ok());
        }
        let long: &'static str = Box::leak("x".repeat(129).into_boxed_str());
        assert_eq!(
            RequestId::of(&with(&[long]), RequestIds::Generate)
                .upstream()
                .map(HeaderValue::len),
            Some(32)
        );
        // Two: the first, set as the only one.
        let id = RequestId::of(&with(&["a", "b"]), RequestIds::Generate);
        assert_eq!(id.upstream().map(|v| v.as_bytes()), Some(&b"a"[..]));
        let id = RequestId::of(&HeaderMap::new(), RequestIds::Generate);
        assert_eq!(id.upstream().map(HeaderValue::len), Some(32));
        // No other response repeats it: kept out of HTTP/2's HPACK table.
        let mut h = HeaderMap::new();
        id.stamp(&mut h);
        assert!(h[&X_REQUEST_ID].is_sensitive());
    }

    #[test]
    fn forward_keeps_the_upstreams_and_adds_only_when_absent() {
        let id = RequestId::of(&with(&["abc-1"]), RequestIds::Forward);
        assert_eq!(id.upstream(), None);
        assert_eq!(response(Some("up-9"), id).as_deref(), Some("up-9"));
        let id = RequestId::of(&with(&["abc-1"]), RequestIds::Forward);
        assert_eq!(response(None, id).as_deref(), Some("abc-1"));
        let id = RequestId::of(&HeaderMap::new(), RequestIds::Forward);
        let made = id.upstream().unwrap().to_str().unwrap().to_string();
        assert_eq!(made.len(), 32);
        assert_eq!(response(None, id), Some(made));
    }

    #[test]
    fn off_makes_none_and_sets_none() {
        let id = RequestId::of(&HeaderMap::new(), RequestIds::Off);
        assert_eq!(
            (id.upstream(), id.shown().as_bytes(), id.fields()),
            (None, &b"-"[..], 0)
        );
        assert_eq!(response(None, id), None);
        let id = RequestId::of(&with(&["abc-1"]), RequestIds::Off);
        assert_eq!((id.upstream(), id.shown().to_str().ok()), (None, Some("abc-1")));
        assert_eq!(response(Some("up-9"), id).as_deref(), Some("up-9"));
        let id = RequestId::of(&with(&["has space"]), RequestIds::Off);
        assert_eq!(id.upstream(), None);
        assert_eq!(response(None, id), None);
    }
}
