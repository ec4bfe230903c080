//! What a client is told of a verdict: the `RateLimit-*` fields of every
//! limit it may see, and a `RateLimit-Warning` per soft-limited one.

use http::{HeaderMap, HeaderValue};
use smallvec::SmallVec;

use super::Snapshot;
use crate::config::Mode;
use crate::limit::headers::{self as rl_headers, Status, RATELIMIT_WARNING};
use crate::limit::stage::{self, Outcome};
use crate::limit::Verdict;

/// `RateLimit-*` headers for every limit the client may see (shadow limits
/// stay invisible), and a `RateLimit-Warning` per soft-limited one.
pub fn add_limit_headers(headers: &mut HeaderMap, snapshot: &Snapshot, verdict: &Verdict) {
    add_warnings(headers, snapshot, verdict);
    let (statuses, focus) = visible_statuses(snapshot, verdict, None);
    rl_headers::render(headers, snapshot.config.gateway.rate_limit_headers, &statuses, focus);
}

/// What the client may see of each limit of the verdict (shadow limits stay
/// invisible), and where the verdict's limit at `focus` is among them.
pub fn visible_statuses<'s>(
    snapshot: &'s Snapshot,
    verdict: &Verdict,
    focus: Option<usize>,
) -> (SmallVec<[Status<'s>; 4]>, Option<usize>) {
    let mut statuses = SmallVec::new();
    let mut focus_at = None;
    for (position, lv) in verdict.limits.iter().enumerate() {
        let Some(limit) = snapshot.limits.get(lv.limit) else {
            continue;
        };
        if limit.config.mode == Mode::Shadow {
            continue;
        }
        if focus == Some(position) {
            focus_at = Some(statuses.len());
        }
        statuses.push(Status {
            name: &limit.config.name,
            quota: lv.quota,
            window_secs: lv.window_secs,
            remaining: lv.remaining,
            reset_secs: rl_headers::secs(lv.reset_ms),
        });
    }
    (statuses, focus_at)
}

/// A `RateLimit-Warning` per soft-limited limit of the verdict.
pub fn add_warnings(headers: &mut HeaderMap, snapshot: &Snapshot, verdict: &Verdict) {
    for lv in verdict.limits.iter().filter(|lv| lv.outcome == Outcome::SoftLimited) {
        let Some(limit) = snapshot.limits.get(lv.limit).filter(|l| l.config.mode != Mode::Shadow) else {
            continue;
        };
        let text = stage::warning(lv.over_percent, limit.config.enforce_after.as_deref());
        if let Ok(v) = HeaderValue::from_str(&text) {
            headers.append(RATELIMIT_WARNING.clone(), v);
        }
    }
}
