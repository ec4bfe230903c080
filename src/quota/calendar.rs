//! Windows that follow the UTC calendar: a fixed window of a week starts on
//! Monday 00:00 UTC and one of a month on the 1st at 00:00 UTC, whatever
//! the epoch's weekday or the month's length. Pure: time comes in as Unix
//! milliseconds. `lua/fixed_window.lua` and `lua/release.lua` compute the
//! same windows on Redis's clock.

/// A week, in milliseconds.
pub const WEEK_MS: u64 = 7 * DAY_MS;
/// A month as a period (the rate math's, `N/month`): 30 days. A calendar
/// month's window is its own length.
pub const MONTH_MS: u64 = 30 * DAY_MS;
const DAY_MS: u64 = 86_400_000;

use crate::clock::{civil_from_days, days_from_civil};

/// How a fixed window's windows are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Calendar {
    /// Multiples of the period since the Unix epoch.
    #[default]
    Epoch,
    /// Monday 00:00 UTC to the next.
    Week,
    /// The 1st 00:00 UTC to the next.
    Month,
}

impl Calendar {
    /// The calendar of a fixed window of `period_ms`: a week and a month
    /// (30 days) follow the calendar; every other period the epoch.
    pub fn of_period(period_ms: u64) -> Calendar {
        match period_ms {
            WEEK_MS => Calendar::Week,
            MONTH_MS => Calendar::Month,
            _ => Calendar::Epoch,
        }
    }

    /// The Lua scripts' code for it.
    pub fn code(self) -> u64 {
        match self {
            Calendar::Epoch => 0,
            Calendar::Week => 1,
            Calendar::Month => 2,
        }
    }

    /// How many windows turned from the one starting at `from_ms` to the
    /// one starting at `to_ms` (both window starts, `from_ms <= to_ms`).
    pub fn turns(self, from_ms: u64, to_ms: u64, period_ms: u64) -> u64 {
        let span = to_ms.saturating_sub(from_ms);
        match self {
            Calendar::Epoch => span / period_ms.max(1),
            Calendar::Week => span / WEEK_MS,
            Calendar::Month => {
                let (y1, m1, _) = civil_from_days(from_ms / DAY_MS);
                let (y2, m2, _) = civil_from_days(to_ms / DAY_MS);
                (y2 * 12 + m2).saturating_sub(y1 * 12 + m1)
            }
        }
    }

    /// The window `now_ms` falls in, `[start, end)` in Unix milliseconds.
    pub fn window(self, now_ms: u64, period_ms: u64) -> (u64, u64) {
        match self {
            Calendar::Epoch => {
                let p = period_ms.max(1);
                let start = now_ms - now_ms % p;
                (start, start.saturating_add(p))
            }
            Calendar::Week => {
                let day = now_ms / DAY_MS;
                // 1970-01-01 was a Thursday: 3 days after a Monday.
                let monday = day - (day + 3) % 7;
                (monday * DAY_MS, (monday + 7) * DAY_MS)
            }
            Calendar::Month => {
                let (y, m, _) = civil_from_days(now_ms / DAY_MS);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(y, m, 1) * DAY_MS, days_from_civil(ny, nm, 1) * DAY_MS)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first() {
        // 2026-12-02T04:30:00Z is a Wednesday.
        let now = 1_796_185_800_000;
        let (start, end) = Calendar::Week.window(now, WEEK_MS);
        assert_eq!(civil_from_days(start / DAY_MS), (2026, 11, 30), "Monday");
        assert_eq!(end - start, WEEK_MS);
        let (start, end) = Calendar::Month.window(now, MONTH_MS);
        assert_eq!(civil_from_days(start / DAY_MS), (2026, 12, 1));
        assert_eq!(civil_from_days(end / DAY_MS), (2027, 1, 1));
        assert_eq!((end - start) / DAY_MS, 31);
        // February of a leap year, and of a century that is not one.
        let feb = |y| {
            let (s, e) = Calendar::Month.window(days_from_civil(y, 2, 10) * DAY_MS, MONTH_MS);
            (e - s) / DAY_MS
        };
        assert_eq!((feb(2028), feb(2027), feb(2100), feb(2000)), (29, 28, 28, 29));
        // Windows turned: months by the calendar, whatever their lengths.
        let (dec, _) = Calendar::Month.window(now, MONTH_MS);
        let (mar, _) = Calendar::Month.window(days_from_civil(2027, 3, 5) * DAY_MS, MONTH_MS);
        assert_eq!(Calendar::Month.turns(dec, mar, MONTH_MS), 3);
        assert_eq!(Calendar::Week.turns(start, start + 2 * WEEK_MS, WEEK_MS), 2);
        assert_eq!(Calendar::Epoch.turns(120_000, 300_000, 60_000), 3);
        // The epoch's own period, unchanged.
        assert_eq!(Calendar::Epoch.window(130_000, 60_000), (120_000, 180_000));
        assert_eq!(Calendar::of_period(WEEK_MS), Calendar::Week);
        assert_eq!(Calendar::of_period(MONTH_MS), Calendar::Month);
        assert_eq!(Calendar::of_period(DAY_MS), Calendar::Epoch);
    }

    proptest! {
        #[test]
        fn civil_dates_round_trip_and_windows_hold_now(days in 0u64..200_000, ms in 0u64..DAY_MS) {
            let (y, m, d) = civil_from_days(days);
            prop_assert!((1..=12).contains(&m) && (1..=31).contains(&d));
            prop_assert_eq!(days_from_civil(y, m, d), days);
            let now = days * DAY_MS + ms;
            for cal in [Calendar::Week, Calendar::Month] {
                let (start, end) = cal.window(now, MONTH_MS);
                prop_assert!(start <= now && now < end);
                // The next window starts where this one ends.
                prop_assert_eq!(cal.window(end, MONTH_MS).0, end);
            }
            let (start, _) = Calendar::Week.window(now, WEEK_MS);
            prop_assert_eq!((start / DAY_MS + 3) % 7, 0, "a Monday");
            let (start, _) = Calendar::Month.window(now, MONTH_MS);
            prop_assert_eq!(civil_from_days(start / DAY_MS).2, 1, "the 1st");
        }
    }
}
