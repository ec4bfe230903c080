//! Rollout stages: what a refusal means for the client.
//!
//! Every stage spends tokens exactly as `enforce` would; only the answer
//! differs. `shadow` counts and logs, `soft` warns, `canary` enforces on a
//! stable share of instances and warns on the rest, `enforce` refuses.

use super::policy::Mode;

use super::key::fnv1a;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Admitted,
    /// Refused: the client gets a 429.
    Limited,
    /// Over the quota, admitted silently (counted, logged).
    ShadowLimited,
    /// Over the quota, admitted with a `RateLimit-Warning`.
    SoftLimited,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::SoftLimited => "soft_limited",
        }
    }
}

/// Does this instance enforce a canary limit? A stable hash of the instance
/// id decides, so the same instances enforce after every restart.
pub fn canary_enforces(instance_id: &str, percent: u8) -> bool {
    fnv1a(instance_id.as_bytes()) % 100 < u64::from(percent)
}

/// The outcome of a refusal under `mode`.
pub fn on_refusal(mode: Mode, canary_enforcing: bool) -> Outcome {
    match mode {
        Mode::Enforce => Outcome::Limited,
        Mode::Canary if canary_enforcing => Outcome::Limited,
        Mode::Canary | Mode::Soft => Outcome::SoftLimited,
        Mode::Shadow => Outcome::ShadowLimited,
    }
}

/// `RateLimit-Warning` text: how far over, and when enforcement begins.
pub fn warning(over_percent: u64, enforce_after: Option<&str>) -> String {
    match enforce_after {
        Some(date) => format!("{over_percent}% over quota; enforcement begins {date}"),
        None => format!("{over_percent}% over quota; this limit will be enforced"),
    }
}

/// Requests over a quota, as a whole percentage of it (at least 1).
pub fn over_percent(over: u64, quota: u64) -> u64 {
    (over.saturating_mul(100)).div_ceil(quota.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_has_its_answer() {
        assert_eq!(on_refusal(Mode::Enforce, false), Outcome::Limited);
        assert_eq!(on_refusal(Mode::Canary, true), Outcome::Limited);
        assert_eq!(on_refusal(Mode::Canary, false), Outcome::SoftLimited);
        assert_eq!(on_refusal(Mode::Soft, true), Outcome::SoftLimited);
        assert_eq!(on_refusal(Mode::Shadow, true), Outcome::ShadowLimited);
    }

    #[test]
    fn canary_share_is_stable_and_roughly_right() {
        assert!(!canary_enforces("gw-a", 0));
        assert!(canary_enforces("gw-a", 100));
        assert_eq!(canary_enforces("gw-a", 50), canary_enforces("gw-a", 50));
        let enforcing = (0..10_000).filter(|i| canary_enforces(&format!("gw-{i}"), 5)).count();
        assert!((300..700).contains(&enforcing), "{enforcing}");
    }

    #[test]
    fn warnings_say_how_far_and_when() {
        assert_eq!(
            warning(20, Some("2027-01-31")),
            "20% over quota; enforcement begins 2027-01-31"
        );
        assert!(warning(1, None).starts_with("1% over quota"));
        assert_eq!(over_percent(1, 100), 1);
        assert_eq!(over_percent(3, 5), 60);
        assert_eq!(over_percent(0, 5), 1);
    }
}
