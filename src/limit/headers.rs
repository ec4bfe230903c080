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
pub use super::policy::HeaderStyle as Style;

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
        // Written byte by byte (no `fmt`) into a buffer of the exact size,
        // which becomes the value without a copy: every admitted response
        // carries them.
        let mut policy = Vec::with_capacity(items_len(statuses, POLICY));
        let mut state = Vec::with_capacity(items_len(statuses, STATE));
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
            headers.insert(RATELIMIT_LIMIT.clone(), number(s.quota));
            headers.insert(RATELIMIT_REMAINING.clone(), number(s.remaining));
            headers.insert(RATELIMIT_RESET.clone(), number(s.reset_secs));
        }
    }
}

/// `"name";a=1;b=2`: `name.len() + 8 + width(1) + width(2)` bytes.
fn item(out: &mut Vec<u8>, name: &str, a: &[u8], x: u64, b: &[u8], y: u64) {
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.push(b'"');
    out.extend_from_slice(a);
    out.extend_from_slice(itoa::Buffer::new().format(x).as_bytes());
    out.extend_from_slice(b);
    out.extend_from_slice(itoa::Buffer::new().format(y).as_bytes());
}

/// The numbers of a `RateLimit-Policy` item, and of a `RateLimit` one.
const POLICY: fn(&Status<'_>) -> (u64, u64) = |s| (s.quota, s.window_secs);
const STATE: fn(&Status<'_>) -> (u64, u64) = |s| (s.remaining, s.reset_secs);

/// The length of the items of `statuses` with the numbers `pick` takes,
/// joined by ", ".
fn items_len(statuses: &[Status<'_>], pick: fn(&Status<'_>) -> (u64, u64)) -> usize {
    let items: usize = statuses
        .iter()
        .map(|s| {
            let (x, y) = pick(s);
            s.name.len() + 8 + width(x) + width(y)
        })
        .sum();
    items + 2 * statuses.len().saturating_sub(1)
}

/// How many decimal digits `n` has.
fn width(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// A value that is not a valid header value (a limit name with control
/// characters) leaves the field out, as before. A buffer filled to its
/// capacity becomes the value's bytes as they are.
fn insert(headers: &mut HeaderMap, name: &HeaderName, value: Vec<u8>) {
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(name.clone(), v);
    }
}

/// Numbers below this are header values without an allocation.
const SMALL: u64 = 10_000;

/// `n` as a header value. Quotas, counts left and seconds to a reset are
/// mostly small: below [`SMALL`] the value points into one static string
/// of every such number, so making, cloning and dropping it allocate
/// nothing (`HeaderValue::from(u64)` allocates, sometimes twice).
pub fn number(n: u64) -> HeaderValue {
    match small_number(n) {
        Some(digits) => HeaderValue::from_static(digits),
        None => HeaderValue::from(n),
    }
}

/// The decimal digits of `n < SMALL`, from "0123456789101112…9999": the
/// numbers of each width follow those of the width before.
fn small_number(n: u64) -> Option<&'static str> {
    static DIGITS: std::sync::LazyLock<&'static str> = std::sync::LazyLock::new(|| {
        let mut all = String::with_capacity(38_890);
        for i in 0..SMALL {
            all.push_str(itoa::Buffer::new().format(i));
        }
        Box::leak(all.into_boxed_str())
    });
    let (start, width) = match n {
        0..=9 => (n, 1),
        10..=99 => (10 + (n - 10) * 2, 2),
        100..=999 => (190 + (n - 100) * 3, 3),
        1_000..=9_999 => (2_890 + (n - 1_000) * 4, 4),
        _ => return None,
    };
    DIGITS.get(start as usize..(start + width) as usize)
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
    fn numbers_are_their_decimal_digits_at_every_width() {
        for n in (0..12_000).chain([99_999, 1_000_000, u64::MAX]) {
            assert_eq!(number(n), n.to_string().as_str(), "{n}");
        }
        // Below SMALL, every one static (no allocation to make or clone):
        // an offset past the table would fall back to formatting unseen.
        for n in 0..SMALL {
            assert_eq!(small_number(n), Some(n.to_string().as_str()), "{n}");
        }
        assert_eq!(small_number(SMALL), None);
    }

    #[test]
    fn values_are_written_into_buffers_of_their_exact_size() {
        for n in [0, 9, 10, 99, 100, 12_345, u64::MAX] {
            assert_eq!(width(n), n.to_string().len(), "{n}");
        }
        for statuses in [
            &[st("a", 100, 40, 20)][..],
            &[st("a", 100, 40, 20), st("bee", u64::MAX, 0, 1_000_000_007)],
            &[st("", 0, 0, 0), st("x", 9, 10, 99), st("yz", 10, 9, 100)],
            &[st("café-β", 1_000, 999, 10_000)],
        ] {
            let mut h = HeaderMap::new();
            render(&mut h, Style::Ietf, statuses, None);
            // The buffers' sizes are the values' lengths: no growing, and
            // the buffer becomes the value as it is.
            assert_eq!(items_len(statuses, POLICY), h["ratelimit-policy"].len());
            assert_eq!(items_len(statuses, STATE), h["ratelimit"].len());
        }
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!((secs(0), secs(1), secs(1000), secs(1001)), (0, 1, 1, 2));
    }
}
