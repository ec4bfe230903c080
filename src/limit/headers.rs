//! Rendering `RateLimit-*` and `Retry-After` headers.
//!
//! `RateLimit-Policy` and `RateLimit` follow the IETF httpapi draft (one
//! structured-field item per limit: `"name";q=100;w=60` and
//! `"name";r=42;t=17`); the `RateLimit-Limit`/`-Remaining`/`-Reset` trio
//! many clients read describes the most restrictive limit (on a 429, the
//! one that refused). All values are whole seconds.

use http::{HeaderMap, HeaderName, HeaderValue};

pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
pub static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
pub static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
pub static RATELIMIT_WARNING: HeaderName = HeaderName::from_static("ratelimit-warning");

/// Which headers responses carry (`[gateway] rate_limit_headers`).
pub use crate::config::HeaderStyle as Style;

/// One limit's state as the client should see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status<'a> {
    pub name: &'a str,
    pub quota: u64,
    pub window_secs: u64,
    pub remaining: u64,
    pub reset_secs: u64,
}

/// Whole seconds, rounded up, from milliseconds.
pub fn secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Adds the headers of `statuses` to `headers`. `focus` names the status
/// the trio describes; by default the one with the least remaining.
pub fn render(headers: &mut HeaderMap, style: Style, statuses: &[Status<'_>], focus: Option<usize>) {
    if statuses.is_empty() || style == Style::None {
        return;
    }
    if matches!(style, Style::All | Style::Ietf) {
        // Written byte by byte (no `fmt`): every admitted response carries them.
        let mut policy = Vec::with_capacity(32 * statuses.len());
        let mut state = Vec::with_capacity(32 * statuses.len());
        for (i, s) in statuses.iter().enumerate() {
            if i > 0 {
                policy.extend_from_slice(b", ");
                state.extend_from_slice(b", ");
            }
            item(&mut policy, s.name, b";q=", s.quota, b";w=", s.window_secs);
            item(&mut state, s.name, b";r=", s.remaining, b";t=", s.reset_secs);
        }
        insert(headers, &RATELIMIT_POLICY, policy);
        insert(headers, &RATELIMIT, state);
    }
    if matches!(style, Style::All | Style::Legacy) {
        let i = focus.unwrap_or_else(|| {
            statuses
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| (s.remaining, std::cmp::Reverse(s.reset_secs)))
                .map_or(0, |(i, _)| i)
        });
        if let Some(s) = statuses.get(i) {
            headers.insert(RATELIMIT_LIMIT.clone(), HeaderValue::from(s.quota));
            headers.insert(RATELIMIT_REMAINING.clone(), HeaderValue::from(s.remaining));
            headers.insert(RATELIMIT_RESET.clone(), HeaderValue::from(s.reset_secs));
        }
    }
}

/// `"name";a=1;b=2`
fn item(out: &mut Vec<u8>, name: &str, a: &[u8], x: u64, b: &[u8], y: u64) {
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.push(b'"');
    out.extend_from_slice(a);
    push_decimal(out, x);
    out.extend_from_slice(b);
    push_decimal(out, y);
}

fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A value that is not a valid header value (a limit name with control
/// characters) leaves the field out, as before.
fn insert(headers: &mut HeaderMap, name: &HeaderName, value: Vec<u8>) {
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(name.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(name: &str, quota: u64, remaining: u64, reset: u64) -> Status<'_> {
        Status {
            name,
            quota,
            window_secs: 60,
            remaining,
            reset_secs: reset,
        }
    }

    #[test]
    fn ietf_fields_list_every_limit_and_the_trio_the_tightest() {
        let mut h = HeaderMap::new();
        render(&mut h, Style::All, &[st("a", 100, 40, 20), st("b", 10, 3, 50)], None);
        assert_eq!(h["ratelimit-policy"], r#""a";q=100;w=60, "b";q=10;w=60"#);
        assert_eq!(h["ratelimit"], r#""a";r=40;t=20, "b";r=3;t=50"#);
        assert_eq!(
            (&h["ratelimit-limit"], &h["ratelimit-remaining"], &h["ratelimit-reset"]),
            (
                &"10".parse::<HeaderValue>().unwrap(),
                &"3".parse::<HeaderValue>().unwrap(),
                &"50".parse::<HeaderValue>().unwrap()
            )
        );
    }

    #[test]
    fn focus_and_styles() {
        let statuses = [st("a", 100, 0, 7), st("b", 10, 0, 50)];
        let mut h = HeaderMap::new();
        render(&mut h, Style::Legacy, &statuses, Some(0));
        assert_eq!(h["ratelimit-limit"], "100");
        assert!(h.get("ratelimit").is_none());
        let mut h = HeaderMap::new();
        render(&mut h, Style::Ietf, &statuses, None);
        assert!(h.get("ratelimit-limit").is_none());
        assert!(h.get("ratelimit").is_some());
        let mut h = HeaderMap::new();
        render(&mut h, Style::None, &statuses, None);
        assert!(h.is_empty());
    }

    #[test]
    fn numbers_are_written_in_full() {
        let mut h = HeaderMap::new();
        let big = st("x", u64::MAX, 0, 1_000_000_007);
        render(&mut h, Style::Ietf, &[big, st("y", 9, 10, 100)], None);
        assert_eq!(
            h["ratelimit-policy"],
            r#""x";q=18446744073709551615;w=60, "y";q=9;w=60"#
        );
        assert_eq!(h["ratelimit"], r#""x";r=0;t=1000000007, "y";r=10;t=100"#);
        // A name no header may carry leaves the fields out.
        let mut h = HeaderMap::new();
        render(&mut h, Style::Ietf, &[st("bad\nname", 1, 1, 1)], None);
        assert!(h.get("ratelimit").is_none());
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!((secs(0), secs(1), secs(1000), secs(1001)), (0, 1, 1, 2));
    }
}
