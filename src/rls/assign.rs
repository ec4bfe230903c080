//! RLQS assignments as leases, pure: how fast one Envoy's token bucket may
//! refill, and what it costs the shared quota to let it.
//!
//! An assignment is `token_bucket{max_tokens = k, tokens_per_fill = k,
//! fill_interval = F s}` with a TTL. Envoy starts a new bucket full and adds
//! `k` every `F` until the TTL ends. The server pays the shared store for
//! that as it goes, one report interval ahead: at each report, the full
//! bucket (when it is new) and every fill that lands before the next report.
//! The same strategy sent again extends the bucket Envoy already has and
//! pays only the fills of the extension. The TTL reaches one interval past
//! the paid horizon, so a late report never leaves Envoy without an
//! assignment; that tail is the only part not paid in advance, and it is
//! paid at the next report. Envoy admits more than was paid only when a
//! stream stops reporting (or finds the quota spent) after fills of the
//! tail landed: at most one interval of its rate per bucket.
//!
//! Rates follow demand: `(allowed + denied) / elapsed`, with headroom, within
//! the limit's own rate. Envoy reads whole seconds only, so fills and TTLs
//! are whole seconds ≥ 1: a limit of one per second or more fills every
//! second; a slower one has a single strategy, one token per its spacing.

use crate::quota::Spec;

/// Headroom over the reported demand, so a growing client is not starved
/// until the next report.
pub const HEADROOM: f64 = 1.25;
/// A rate is kept while demand stays within this factor of it either way:
/// a new strategy resets Envoy's bucket, so it is not sent for small moves.
const HYSTERESIS: f64 = 1.25;
/// The longest fill: a slow limit still refills at least this often.
const MAX_FILL_SECS: u64 = 60;

/// A token-bucket strategy: `tokens` per `fill_secs`, holding at most one fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refill {
    pub tokens: u64,
    pub fill_secs: u64,
}

impl Refill {
    pub fn per_second(&self) -> f64 {
        self.tokens as f64 / self.fill_secs as f64
    }
}

/// The limit's own rate, per second.
pub fn limit_rate(spec: &Spec) -> f64 {
    spec.count as f64 * 1_000.0 / spec.period_ms() as f64
}

/// The strategy for a stream whose demand is `demand` requests per second
/// under `spec`, given the one it has (kept while demand stays near it).
///
/// Envoy tells two token-bucket strategies apart by `max_tokens`,
/// `tokens_per_fill` and the nanoseconds of `fill_interval`, not its
/// seconds: a strategy that changed only its fill seconds would be taken
/// for the same one while the server paid for the other. So a limit of at
/// least one per second always fills every second and varies its tokens;
/// a slower limit has one strategy only, one token per its own spacing.
pub fn strategy_for(demand: f64, spec: &Spec, current: Option<Refill>) -> Refill {
    strategy_within(demand, spec, current, f64::INFINITY)
}

/// [`strategy_for`], with the rate held to `share` (the stream's fair
/// share, [`fair_share`]); never below the floor a stream keeps.
pub fn strategy_within(demand: f64, spec: &Spec, current: Option<Refill>, share: f64) -> Refill {
    let limit = limit_rate(spec);
    if limit < 1.0 {
        let spacing = (1.0 / limit.max(1e-9)).ceil();
        return Refill {
            tokens: 1,
            fill_secs: (spacing as u64).clamp(1, MAX_FILL_SECS),
        };
    }
    let floor = (limit / 100.0).max(1.0);
    let want = if demand.is_finite() && demand > 0.0 {
        demand * HEADROOM
    } else {
        0.0
    };
    let ceiling = limit.min(share.max(floor));
    let target = want.clamp(floor, ceiling);
    if let Some(c) = current.filter(|c| c.fill_secs == 1 && c.per_second() <= ceiling) {
        let r = c.per_second();
        let at_ceiling = r >= ceiling.floor() && target >= ceiling.floor();
        if at_ceiling || (target <= r * HYSTERESIS && target >= r / HYSTERESIS) {
            return c;
        }
    }
    Refill {
        tokens: (target.floor() as u64).max(1),
        fill_secs: 1,
    }
}

/// What Envoy holds now, as paid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub refill: Refill,
    /// When its bucket started (full): fills land every `fill_secs` after.
    pub origin_ms: u64,
    /// Fills landing before this instant are paid.
    pub paid_to_ms: u64,
    /// When Envoy drops the assignment.
    pub expires_ms: u64,
}

impl Refill {
    fn fill_ms(&self) -> u64 {
        self.fill_secs * 1_000
    }

    /// Fills of a bucket started at `origin_ms` that land before `x_ms`.
    pub fn fills_before(&self, origin_ms: u64, x_ms: u64) -> u64 {
        if x_ms <= origin_ms {
            0
        } else {
            (x_ms - origin_ms).div_ceil(self.fill_ms()) - 1
        }
    }
}

/// An assignment to send, and what it costs the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    pub held: Held,
    pub cost: u64,
}

impl Offer {
    /// The TTL to send, in whole seconds (≥ 1).
    pub fn ttl_secs(&self, now_ms: u64) -> u64 {
        (self.held.expires_ms.saturating_sub(now_ms) / 1_000).max(1)
    }
}

/// Fills of `h` that landed from its paid horizon up to `now_ms` (and
/// before it expired): Envoy may have spent them, and they are owed.
fn owed(h: Held, now_ms: u64) -> u64 {
    let r = h.refill;
    let until = (now_ms + 1).min(h.expires_ms + 1);
    r.tokens
        * r.fills_before(h.origin_ms, until)
            .saturating_sub(r.fills_before(h.origin_ms, h.paid_to_ms))
}

fn is_renewal(next: Refill, held: Option<Held>, now_ms: u64) -> Option<Held> {
    held.filter(|h| h.refill == next && h.expires_ms > now_ms)
}

/// The assignment for `next` at `now_ms`, when reports come every
/// `interval_ms` (at least a second): paid up to the next report, expiring one interval
/// after it (a TTL of two intervals), so a late report never leaves Envoy
/// without an assignment.
/// The same refill on a live bucket extends it and pays the fills of the
/// extension; anything else is a new bucket, which starts full, and pays
/// too what the bucket it replaces is owed.
pub fn offer(next: Refill, held: Option<Held>, now_ms: u64, interval_ms: u64) -> Offer {
    let interval = interval_ms.max(1_000);
    // The horizon falls half a fill before the next report: fills land in
    // step with the reports (Envoy starts the bucket as the answer comes),
    // so a horizon on the next report itself would put a fill at each end
    // whenever the report runs a millisecond late, and charge two fills to
    // one window of the store.
    let paid_to = (now_ms + interval).saturating_sub(next.fill_ms() / 2).max(now_ms + 1);
    // Whole seconds, as Envoy reads them, rounded up.
    let expires_ms = now_ms + (2 * interval).div_ceil(1_000) * 1_000;
    match is_renewal(next, held, now_ms) {
        Some(h) => {
            let paid_to_ms = paid_to.max(h.paid_to_ms);
            let fills = next
                .fills_before(h.origin_ms, paid_to_ms)
                .saturating_sub(next.fills_before(h.origin_ms, h.paid_to_ms));
            Offer {
                held: Held {
                    paid_to_ms,
                    expires_ms,
                    ..h
                },
                cost: next.tokens * fills,
            }
        }
        None => Offer {
            held: Held {
                refill: next,
                origin_ms: now_ms,
                paid_to_ms: paid_to,
                expires_ms,
            },
            cost: held.map_or(0, |h| owed(h, now_ms)) + next.tokens * (1 + next.fills_before(now_ms, paid_to)),
        },
    }
}

/// What a grant short of `offer.cost` buys, at a report `interval_ms`
/// before the next: [`shortened`], except where that would restart a live
/// bucket at no more than its own rate when the offer was a faster one (a
/// climb). A climb from a live bucket costs what that bucket is owed, a
/// fill that landed as the report came, beside the new bucket's full
/// start, so a stream at half of a limit whose window holds exactly its
/// rate could never afford the whole of it: each report bought a new half
/// again. The live bucket is renewed instead, and paid one fill further,
/// past the next report, when the grant allows: that report then owes
/// nothing, and the climb costs only the new bucket's start.
pub fn within_grant(
    offer: Offer,
    held: Option<Held>,
    now_ms: u64,
    interval_ms: u64,
    granted: u64,
) -> (Option<Offer>, u64) {
    let (short, back) = shortened(offer, held, now_ms, granted);
    let Some(h) = held.filter(|h| h.expires_ms > now_ms) else {
        return (short, back);
    };
    let (next, live) = (offer.held.refill, h.refill);
    let climbs = next.fill_secs == live.fill_secs && next.tokens > live.tokens;
    if !climbs || short.is_some_and(|s| s.held.refill.tokens > live.tokens) {
        return (short, back);
    }
    let kept = self::offer(live, Some(h), now_ms, interval_ms);
    if kept.cost > granted {
        return (short, back);
    }
    let further = (kept.held.paid_to_ms + live.fill_ms()).min(kept.held.expires_ms);
    let ahead = live.tokens
        * live
            .fills_before(h.origin_ms, further)
            .saturating_sub(live.fills_before(h.origin_ms, kept.held.paid_to_ms));
    let kept = if kept.cost + ahead <= granted {
        Offer {
            held: Held {
                paid_to_ms: further,
                ..kept.held
            },
            cost: kept.cost + ahead,
        }
    } else {
        kept
    };
    (Some(kept), granted - kept.cost)
}

/// What a grant short of `offer.cost` still buys: first what is owed, then
/// a new bucket of the same fill interval with as many tokens per fill as
/// the rest pays for, under the same terms as [`offer`]; or, when that is
/// not one token, no assignment (the caller sends DENY_ALL). Returns it and
/// the tokens to give back.
pub fn shortened(offer: Offer, held: Option<Held>, now_ms: u64, granted: u64) -> (Option<Offer>, u64) {
    let o = offer.held;
    let debt = held.map_or(0, |h| owed(h, now_ms));
    let per_token = 1 + o.refill.fills_before(now_ms, o.paid_to_ms);
    let tokens = granted.saturating_sub(debt) / per_token;
    if tokens == 0 {
        return (None, granted - granted.min(debt));
    }
    let cost = debt + tokens * per_token;
    let short = Offer {
        held: Held {
            refill: Refill {
                tokens,
                fill_secs: o.refill.fill_secs,
            },
            origin_ms: now_ms,
            ..o
        },
        cost,
    };
    (Some(short), granted - cost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Algorithm, Rate};
    use proptest::prelude::*;
    use std::time::Duration;

    fn spec(count: u64, period_ms: u64) -> Spec {
        Spec::new(
            Algorithm::FixedWindow,
            Rate {
                count,
                period: Duration::from_millis(period_ms),
            },
            count,
        )
    }

    const fn refill(tokens: u64, fill_secs: u64) -> Refill {
        Refill { tokens, fill_secs }
    }

    #[test]
    fn rates_follow_demand_within_the_limit() {
        let s = spec(100, 1_000);
        assert_eq!(strategy_for(40.0, &s, None), refill(50, 1));
        // Held to a fair share, and a current rate above it is not kept.
        assert_eq!(strategy_within(80.0, &s, None, 50.0), refill(50, 1));
        assert_eq!(strategy_within(80.0, &s, Some(refill(100, 1)), 50.0), refill(50, 1));
        assert_eq!(
            strategy_within(0.0, &s, None, 0.0),
            refill(1, 1),
            "never below the floor"
        );
        assert_eq!(strategy_for(400.0, &s, None), refill(100, 1));
        // Idle: the floor, 1 % of the limit.
        assert_eq!(strategy_for(0.0, &s, None), refill(1, 1));
        // Under one per second: longer fills.
        let slow = spec(60, 3_600_000);
        assert_eq!(strategy_for(0.0, &slow, None), refill(1, 60));
    }

    #[test]
    fn strategies_envoy_would_take_for_the_same_differ_in_nothing_else() {
        // Envoy compares tokens and the fill's nanoseconds, not its
        // seconds: a limit under one per second has one strategy whatever
        // the demand; a faster one always fills every second.
        let slow = spec(10, 60_000);
        let one = strategy_for(0.0, &slow, None);
        assert_eq!(one, refill(1, 6));
        for demand in [0.01, 0.1, 0.5, 3.0, 1_000.0] {
            assert_eq!(strategy_for(demand, &slow, Some(one)), one);
            assert_eq!(strategy_for(demand, &slow, None), one);
        }
        let fast = spec(100, 1_000);
        let mut current = None;
        for demand in [0.0, 0.3, 2.0, 50.0, 300.0, 0.0] {
            let next = strategy_for(demand, &fast, current);
            assert_eq!(next.fill_secs, 1, "{demand}");
            if let Some(c) = current {
                assert!(next == c || next.tokens != c.tokens);
            }
            current = Some(next);
        }
    }

    #[test]
    fn a_rate_is_kept_while_demand_stays_near_it() {
        let s = spec(1_000, 1_000);
        let c = strategy_for(80.0, &s, None);
        assert_eq!(c.tokens, 100);
        assert_eq!(strategy_for(85.0, &s, Some(c)), c);
        assert_eq!(strategy_for(70.0, &s, Some(c)), c);
        assert_ne!(strategy_for(200.0, &s, Some(c)), c);
        assert_ne!(strategy_for(10.0, &s, Some(c)), c);
    }

    #[test]
    fn a_new_bucket_pays_its_start_and_the_fills_before_the_next_report() {
        let r = refill(10, 1);
        // Reports every second: the full bucket only; the first fill lands
        // at the next report, which pays for it. Paid to half a fill
        // before that report; the TTL is two intervals.
        let o = offer(r, None, 5_000, 1_000);
        assert_eq!(o.cost, 10);
        assert_eq!(
            (o.held.paid_to_ms, o.held.expires_ms, o.ttl_secs(5_000)),
            (5_500, 7_000, 2)
        );
        // Every 3 s: the start and the fills at +1 s and +2 s.
        assert_eq!(offer(r, None, 5_000, 3_000).cost, 30);
        // The next report, on time: the fill at +1 s.
        let next = offer(r, Some(o.held), 6_000, 1_000);
        assert_eq!(
            (next.cost, next.held.origin_ms, next.held.paid_to_ms),
            (10, 5_000, 6_500)
        );
        // Late by 900 ms: the fill at +1 s (in the unpaid tail: it may have
        // been spent already) and the one at +2 s, before the new horizon.
        assert_eq!(offer(r, Some(o.held), 6_900, 1_000).cost, 20);
        // The old bucket's fill at 6 s (landing as the report came) is
        // owed, then the new bucket's start.
        assert_eq!(offer(refill(20, 1), Some(o.held), 6_000, 1_000).cost, 10 + 20);
        // Expired at 7 s: its fills at 6 s and 7 s are owed.
        assert_eq!(offer(r, Some(o.held), 7_000, 1_000).cost, 20 + 10);
    }

    #[test]
    fn a_short_grant_buys_a_smaller_bucket_after_what_is_owed() {
        let r = refill(10, 1);
        let o = offer(r, None, 0, 3_000);
        assert_eq!(o.cost, 30);
        // 25 pay for 8 per fill (8 at the start, 8 at +1 s, 8 at +2 s).
        let (short, back) = shortened(o, None, 0, 25);
        let short = short.unwrap();
        assert_eq!((short.held.refill, short.cost, back), (refill(8, 1), 24, 1));
        assert_eq!(
            (short.held.paid_to_ms, short.held.expires_ms),
            (o.held.paid_to_ms, o.held.expires_ms)
        );
        // Not one token per fill: nothing.
        assert_eq!(shortened(o, None, 0, 2), (None, 2));
        // A renewal short of its fills: what is owed first (the fill at
        // 3 s, landing as the report came), then a smaller new bucket.
        let renew = offer(r, Some(o.held), 3_000, 3_000);
        assert_eq!(renew.cost, 30);
        let (short, back) = shortened(renew, Some(o.held), 3_000, 15);
        let short = short.unwrap();
        assert_eq!(
            (short.held.refill, short.held.origin_ms, short.cost, back),
            (refill(1, 1), 3_000, 13, 2)
        );
        // Not even what is owed: that much is paid, and nothing sent.
        assert_eq!(shortened(renew, Some(o.held), 3_000, 7), (None, 0));
        assert_eq!(shortened(renew, Some(o.held), 3_000, 12), (None, 2));
    }

    #[test]
    fn a_climb_short_of_its_cost_keeps_the_bucket_and_pays_it_past_the_next_report() {
        // 50/s of a 100/s limit, reports every second.
        let half = offer(refill(50, 1), None, 0, 1_000);
        // The whole rate at the next report: the fill at 1 s is owed, and
        // the new bucket starts full: 150, in a window of 100.
        let up = offer(refill(100, 1), Some(half.held), 1_010, 1_000);
        assert_eq!(up.cost, 150);
        // A new half bucket would restart Envoy's for nothing: the half is
        // kept, paying the fill at 1 s and the one at 2 s (past 2 010).
        let (kept, back) = within_grant(up, Some(half.held), 1_010, 1_000, 100);
        let kept = kept.unwrap();
        assert_eq!(
            (
                kept.held.refill,
                kept.held.origin_ms,
                kept.held.paid_to_ms,
                kept.cost,
                back
            ),
            (refill(50, 1), 0, 2_510, 100, 0)
        );
        // So the next report owes nothing: the climb costs its start only.
        assert_eq!(offer(refill(100, 1), Some(kept.held), 2_020, 1_000).cost, 100);
        // Less: the kept bucket's own fills; less still, as `shortened`.
        let (kept, back) = within_grant(up, Some(half.held), 1_010, 1_000, 60);
        assert_eq!(
            (kept.map(|k| (k.held.paid_to_ms, k.cost)), back),
            (Some((1_510, 50)), 10)
        );
        assert_eq!(
            within_grant(up, Some(half.held), 1_010, 1_000, 40),
            shortened(up, Some(half.held), 1_010, 40)
        );
        // A climb the grant partly pays (10/s to up to 60/s) and a fall
        // (to 20/s): as `shortened`, a new smaller bucket.
        let low = offer(refill(10, 1), None, 0, 1_000);
        let more = offer(refill(60, 1), Some(low.held), 1_010, 1_000);
        let (short, _) = within_grant(more, Some(low.held), 1_010, 1_000, 40);
        assert_eq!(
            short.map(|s| (s.held.refill, s.held.origin_ms)),
            Some((refill(30, 1), 1_010))
        );
        let down = offer(refill(20, 1), Some(half.held), 1_010, 1_000);
        assert_eq!(
            within_grant(down, Some(half.held), 1_010, 1_000, 30),
            shortened(down, Some(half.held), 1_010, 30)
        );
    }

    proptest! {
        /// Reports on time (never later than the interval the last one
        /// planned for), any demand and any short grants: Envoy's bucket
        /// (full at its start, then one fill every `fill_secs`, until it
        /// expires) admits no token that was not paid, except the fills
        /// that landed as a report came which that report could not pay
        /// because the store had nothing left: never more than one fill of
        /// the bucket, per such report.
        #[test]
        fn on_time_reports_never_let_envoy_admit_unpaid_tokens(
            steps in prop::collection::vec((1u64..4, 0u64..1_000, 0.0f64..500.0, prop::bool::ANY, 0u64..400), 1..60),
        ) {
            let s = spec(200, 1_000);
            let (mut now, mut paid, mut held): (u64, u64, Option<Held>) = (10_000, 0, None);
            let (mut interval, mut admitted, mut unpaid) = (1u64, 0u64, 0u64);
            for (next_interval, early_ms, demand, short, grant_cap) in steps {
                // The next report comes up to `early_ms` before the interval ends.
                let later = now + interval * 1_000 - early_ms.min(interval * 1_000 - 1);
                if let Some(h) = held {
                    let until = later.min(h.expires_ms);
                    let r = h.refill;
                    // Fills landing in (now, until], the expiry included.
                    admitted += r.tokens * r.fills_before(h.origin_ms, until + 1).saturating_sub(r.fills_before(h.origin_ms, now + 1));
                }
                now = later;
                interval = next_interval;
                let debt = held.map_or(0, |h| owed(h, now));
                let next = strategy_for(demand, &s, held.map(|h| h.refill));
                let o = offer(next, held, now, interval * 1_000);
                let granted = if short { o.cost.min(grant_cap) } else { o.cost };
                let sent = if granted >= o.cost {
                    paid += o.cost;
                    Some(o)
                } else {
                    let (sent, back) = within_grant(o, held, now, interval * 1_000, granted);
                    paid += granted - back;
                    if let Some(short) = sent {
                        prop_assert!(short.held.refill.tokens < o.held.refill.tokens);
                    }
                    if sent.is_none() {
                        let missed = debt - granted.min(debt);
                        if let Some(h) = held {
                            prop_assert!(missed <= h.refill.tokens, "{} unpaid", missed);
                        }
                        unpaid += missed;
                    }
                    sent
                };
                let before = held;
                held = sent.map(|o| o.held);
                if let Some(h) = held {
                    if before.is_none_or(|b| b.origin_ms != h.origin_ms) {
                        admitted += h.refill.tokens; // a new bucket starts full
                    }
                }
                prop_assert!(admitted <= paid + unpaid, "admitted {} > paid {} + {}", admitted, paid, unpaid);
            }
        }
    }
}
