//! Rendering `RateLimit-*` and `Retry-After` headers.
//!
//! `RateLimit-Policy` and `RateLimit` follow the IETF httpapi draft (one
//! structured-field item per limit: `"name";q=100;w=60` and
//! `"name";r=42;t=17`); the `RateLimit-Limit`/`-Remaining`/`-Reset` trio
//! many clients read describes the most restrictive limit (on a 429, the
//! one that refused). All values are whole seconds.
//!
//! The values that change from one response to the next (`RateLimit`'s
//! counts left, `RateLimit-Remaining`) are marked sensitive, so HTTP/2
//! sends them as never-indexed literals (RFC 7541 §6.2.3). Indexed, each
//! one would be a new entry in the connection's HPACK table that no later
//! response matches: the table fills with dead counts, each lookup walks
//! them, and the fields that do repeat (`RateLimit-Policy`,
//! `RateLimit-Limit`, the upstream's) are evicted with them. HTTP/1.1
//! ignores the mark. (`gateway::hpack` lets one HTTP/2 response in many
//! index them, so that their names are in the table.)

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
    /// The limit's [`Policy`] item, when it is this status's
    /// (`"name";q=quota;w=window_secs`): copied, not written again.
    pub policy: Option<&'a HeaderValue>,
    /// `quota` as a value, made at load with the policy item (the
    /// `RateLimit-Limit` of most responses): copied, not written again.
    pub limit: Option<&'a HeaderValue>,
}

/// A limit's `RateLimit-Policy` item for the quota most of its keys have
/// (every key of an unsharded limit without plans or `rate_from`), made
/// once when the limit is loaded: it does not change from request to
/// request, so a response takes it as it is.
#[derive(Debug, Clone)]
pub struct Policy {
    quota: u64,
    window_secs: u64,
    value: Option<HeaderValue>,
    /// `quota`'s digits, for `RateLimit-Limit`.
    quota_value: HeaderValue,
}

impl Policy {
    pub fn new(name: &str, quota: u64, window_secs: u64) -> Policy {
        let mut text = Vec::with_capacity(name.len() + 8 + width(quota) + width(window_secs));
        item(&mut text, name, b";q=", quota, b";w=", window_secs);
        let quota_value = match small_number(quota) {
            Some(digits) => HeaderValue::from_static(digits),
            None => interned(itoa::Buffer::new().format(quota).as_bytes().to_vec()).unwrap_or_else(|| number(quota)),
        };
        Policy {
            quota,
            window_secs,
            value: interned(text),
            quota_value,
        }
    }

    /// `quota` as a value, if it is this limit's quota.
    pub fn limit(&self, quota: u64) -> Option<&HeaderValue> {
        (quota == self.quota).then_some(&self.quota_value)
    }

    /// The item, if it is the one of a key with `quota` per `window_secs`.
    pub fn item(&self, quota: u64, window_secs: u64) -> Option<&HeaderValue> {
        if quota == self.quota && window_secs == self.window_secs {
            self.value.as_ref()
        } else {
            None
        }
    }
}

/// `text` as a header value whose clones and drops touch no reference
/// count (workers would share its cache line on every response): its
/// bytes are leaked, once per distinct text, so reloading the same limits
/// adds nothing. `None` for a text no header may carry.
fn interned(text: Vec<u8>) -> Option<HeaderValue> {
    static SEEN: std::sync::Mutex<Vec<&'static [u8]>> = std::sync::Mutex::new(Vec::new());
    HeaderValue::from_bytes(&text).ok()?;
    let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let bytes = match seen.iter().find(|s| **s == text.as_slice()) {
        Some(s) => *s,
        None => {
            let leaked: &'static [u8] = Box::leak(text.into_boxed_slice());
            seen.push(leaked);
            leaked
        }
    };
    HeaderValue::from_maybe_shared(bytes::Bytes::from_static(bytes)).ok()
}

/// How many fields [`render`] adds for `statuses` limits in `style`.
pub fn fields(style: Style, statuses: usize) -> usize {
    if statuses == 0 {
        return 0;
    }
    match style {
        Style::All => 5,
        Style::Ietf => 2,
        Style::Legacy => 3,
        Style::None => 0,
    }
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
        match statuses {
            // One limit of a prepared quota (most responses): its item
            // is the whole value.
            [Status { policy: Some(v), .. }] => {
                headers.insert(RATELIMIT_POLICY.clone(), (*v).clone());
            }
            _ => {
                let mut policy = Vec::with_capacity(items_len(statuses, POLICY));
                for (i, s) in statuses.iter().enumerate() {
                    if i > 0 {
                        policy.extend_from_slice(b", ");
                    }
                    match s.policy {
                        Some(v) => policy.extend_from_slice(v.as_bytes()),
                        None => item(&mut policy, s.name, b";q=", s.quota, b";w=", s.window_secs),
                    }
                }
                insert(headers, &RATELIMIT_POLICY, policy, false);
            }
        }
        let mut state = Vec::with_capacity(items_len(statuses, STATE));
        for (i, s) in statuses.iter().enumerate() {
            if i > 0 {
                state.extend_from_slice(b", ");
            }
            item(&mut state, s.name, b";r=", s.remaining, b";t=", s.reset_secs);
        }
        insert(headers, &RATELIMIT, state, true);
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
            let limit = s.limit.cloned().unwrap_or_else(|| number(s.quota));
            headers.insert(RATELIMIT_LIMIT.clone(), limit);
            headers.insert(RATELIMIT_REMAINING.clone(), changing(number(s.remaining)));
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

/// The length of a status's `RateLimit-Policy` item, and of its
/// `RateLimit` one.
const POLICY: fn(&Status<'_>) -> usize = |s| match s.policy {
    Some(v) => v.len(),
    None => s.name.len() + 8 + width(s.quota) + width(s.window_secs),
};
const STATE: fn(&Status<'_>) -> usize = |s| s.name.len() + 8 + width(s.remaining) + width(s.reset_secs);

/// The length of the items of `statuses` as `len` measures each, joined
/// by ", ".
fn items_len(statuses: &[Status<'_>], len: fn(&Status<'_>) -> usize) -> usize {
    statuses.iter().map(len).sum::<usize>() + 2 * statuses.len().saturating_sub(1)
}

/// How many decimal digits `n` has.
fn width(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// A value that is not a valid header value (a limit name with control
/// characters) leaves the field out, as before. A buffer filled to its
/// capacity becomes the value's bytes as they are.
fn insert(headers: &mut HeaderMap, name: &HeaderName, value: Vec<u8>, changes: bool) {
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(name.clone(), if changes { changing(v) } else { v });
    }
}

/// `value`, marked as one that no later response repeats: HTTP/2 sends it
/// without putting it in the connection's HPACK table (see the module's
/// documentation).
pub fn changing(mut value: HeaderValue) -> HeaderValue {
    value.set_sensitive(true);
    value
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
            policy: None,
            limit: None,
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
    fn a_prepared_policy_is_the_item_it_would_have_written() {
        let p = Policy::new("per_client", 100, 60);
        let prepared = p.item(100, 60).unwrap();
        assert_eq!(prepared, r#""per_client";q=100;w=60"#);
        // Another quota (a plan's, a shard's): written as before.
        assert!(p.item(50, 60).is_none() && p.item(100, 1).is_none());
        let limit = p.limit(100);
        assert_eq!(limit.unwrap(), "100");
        let with = |s: Status<'static>| Status {
            policy: Some(prepared),
            limit,
            ..s
        };
        let plain = [st("per_client", 100, 40, 20), st("b", 10, 3, 50)];
        for statuses in [
            vec![with(plain[0].clone())],
            vec![with(plain[0].clone()), plain[1].clone()],
            vec![plain[1].clone(), with(plain[0].clone())],
        ] {
            let unprepared: Vec<_> = statuses
                .iter()
                .map(|s| Status {
                    policy: None,
                    limit: None,
                    ..s.clone()
                })
                .collect();
            for style in [Style::All, Style::Ietf, Style::Legacy] {
                let (mut a, mut b) = (HeaderMap::new(), HeaderMap::new());
                render(&mut a, style, &statuses, None);
                render(&mut b, style, &unprepared, None);
                assert_eq!(a, b, "{statuses:?}");
                if style != Style::Legacy {
                    assert_eq!(items_len(&statuses, POLICY), a["ratelimit-policy"].len());
                }
            }
        }
    }

    #[test]
    fn the_trio_takes_the_prepared_limit_not_a_new_one() {
        // A quota past the static table: made per response, it would be
        // new bytes each time.
        let p = Policy::new("big", 100_000, 60);
        let prepared = p.limit(100_000).unwrap();
        let status = Status {
            policy: p.item(100_000, 60),
            limit: Some(prepared),
            ..st("big", 100_000, 99_999, 60)
        };
        for style in [Style::All, Style::Legacy] {
            let mut h = HeaderMap::new();
            render(&mut h, style, std::slice::from_ref(&status), None);
            assert_eq!(h["ratelimit-limit"], "100000");
            assert_eq!(h["ratelimit-limit"].as_bytes().as_ptr(), prepared.as_bytes().as_ptr());
        }
    }

    #[test]
    fn only_the_values_that_change_are_kept_out_of_hpack_tables() {
        let p = Policy::new("one", 100, 60);
        for (prepared, status) in [
            (false, st("one", 100, 42, 7)),
            (
                true,
                Status {
                    policy: p.item(100, 60),
                    limit: p.limit(100),
                    ..st("one", 100, 42, 7)
                },
            ),
        ] {
            for many in [false, true] {
                let statuses = if many {
                    vec![status.clone(), st("two", 5, 1, 9)]
                } else {
                    vec![status.clone()]
                };
                let mut h = HeaderMap::new();
                render(&mut h, Style::All, &statuses, None);
                let sensitive: Vec<&str> = FIELDS.iter().filter(|f| h[**f].is_sensitive()).copied().collect();
                assert_eq!(
                    sensitive,
                    ["ratelimit", "ratelimit-remaining"],
                    "prepared {prepared}, several {many}: {h:?}"
                );
            }
        }
    }

    const FIELDS: [&str; 5] = [
        "ratelimit-policy",
        "ratelimit",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
    ];

    #[test]
    fn a_prepared_policy_is_shared_not_counted() {
        let (a, b) = (Policy::new("shared", 7, 1), Policy::new("shared", 7, 1));
        let (a, b) = (a.item(7, 1).unwrap(), b.item(7, 1).unwrap());
        // One leaked text for both loads of the limit, whatever the reloads.
        assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr());
        // A clone points at the same bytes: no copy, no count.
        assert_eq!(a.clone().as_bytes().as_ptr(), a.as_bytes().as_ptr());
        assert!(Policy::new("bad\nname", 1, 1).item(1, 1).is_none());
        // The quota's value too, however large (a number above the static
        // table's is interned, not allocated per response), and only for it.
        for quota in [0, 7, 9_999, 10_000, 100_000_000, u64::MAX] {
            let (a, b) = (Policy::new("q", quota, 1), Policy::new("q", quota, 1));
            let (a, b) = (a.limit(quota).unwrap(), b.limit(quota).unwrap());
            assert_eq!(a, quota.to_string().as_str());
            assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr(), "{quota}");
            assert!(Policy::new("q", quota, 1).limit(quota ^ 1).is_none());
        }
    }

    #[test]
    fn fields_counts_what_render_adds() {
        for style in [Style::All, Style::Ietf, Style::Legacy, Style::None] {
            for statuses in [&[][..], &[st("a", 1, 1, 1)], &[st("a", 1, 1, 1), st("b", 2, 2, 2)]] {
                let mut h = HeaderMap::new();
                render(&mut h, style, statuses, None);
                assert_eq!(fields(style, statuses.len()), h.len(), "{style:?} {statuses:?}");
            }
        }
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!((secs(0), secs(1), secs(1000), secs(1001)), (0, 1, 1, 2));
    }
}
