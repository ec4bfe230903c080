//! The vocabulary of quotas, on the ground floor of the crate.
//!
//! This room holds pure values and math only: no clock reads, no I/O. The
//! config layer parses rates into [`Rate`]; the limiter and the stores (later)
//! share the same types so that both run the same arithmetic.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// "N requests per period", as written in `gateway.toml` (`"100/min"`, `"10/30s"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    /// How many requests the period allows; never zero.
    pub count: u64,
    /// The period; never zero.
    pub period: Duration,
}

/// Why a rate string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("expected \"N/period\" such as \"100/min\", \"10/30s\", \"5/h\" or \"1000/day\"")]
    Shape,
    #[error("the count {0:?} is not a whole number")]
    Count(String),
    #[error("the count must be at least 1")]
    ZeroCount,
    #[error("unknown period {0:?}: use s, min, h, day, or a duration such as 30s, 5m, 500ms")]
    Period(String),
    #[error("the period must be longer than zero")]
    ZeroPeriod,
}

impl Rate {
    /// Requests per second, for summaries and sizing.
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.period.as_secs_f64()
    }
}

impl FromStr for Rate {
    type Err = RateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (count, period) = s.split_once('/').ok_or(RateError::Shape)?;
        let count = count.trim();
        let count: u64 = count
            .replace('_', "")
            .parse()
            .map_err(|_| RateError::Count(count.to_string()))?;
        if count == 0 {
            return Err(RateError::ZeroCount);
        }
        let period = parse_period(period.trim())?;
        if period.is_zero() {
            return Err(RateError::ZeroPeriod);
        }
        Ok(Rate { count, period })
    }
}

/// A period is a unit (`s`, `min`, ...) with an optional leading multiplier (`30s`, `5m`).
fn parse_period(s: &str) -> Result<Duration, RateError> {
    let bad = || RateError::Period(s.to_string());
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let multiplier: u64 = if number.is_empty() {
        1
    } else {
        number.parse().map_err(|_| bad())?
    };
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "s" | "sec" | "second" | "seconds" => 1_000,
        "m" | "min" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        _ => return Err(bad()),
    };
    multiplier
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(bad)
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.period.as_millis();
        let (n, unit) = if ms % 86_400_000 == 0 {
            (ms / 86_400_000, "day")
        } else if ms % 3_600_000 == 0 {
            (ms / 3_600_000, "h")
        } else if ms % 60_000 == 0 {
            (ms / 60_000, "min")
        } else if ms % 1_000 == 0 {
            (ms / 1_000, "s")
        } else {
            (ms, "ms")
        };
        if n == 1 {
            write!(f, "{}/{unit}", self.count)
        } else {
            write!(f, "{}/{n}{unit}", self.count)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Result<Rate, RateError> {
        s.parse()
    }

    #[test]
    fn parses_named_units() {
        assert_eq!(
            rate("100/min").unwrap(),
            Rate {
                count: 100,
                period: Duration::from_secs(60)
            }
        );
        assert_eq!(rate("5/h").unwrap().period, Duration::from_secs(3600));
        assert_eq!(
            rate("1000/day").unwrap().period,
            Duration::from_secs(86_400)
        );
        assert_eq!(rate("7/s").unwrap().period, Duration::from_secs(1));
        assert_eq!(rate(" 7 / second ").unwrap().count, 7);
    }

    #[test]
    fn parses_durations_with_multipliers() {
        assert_eq!(
            rate("10/30s").unwrap(),
            Rate {
                count: 10,
                period: Duration::from_secs(30)
            }
        );
        assert_eq!(rate("3/5m").unwrap().period, Duration::from_secs(300));
        assert_eq!(rate("1/500ms").unwrap().period, Duration::from_millis(500));
        assert_eq!(rate("1_000/2h").unwrap().count, 1000);
    }

    #[test]
    fn refuses_bad_rates_with_a_reason() {
        assert_eq!(rate("100"), Err(RateError::Shape));
        assert_eq!(rate("0/min"), Err(RateError::ZeroCount));
        assert_eq!(rate("x/min"), Err(RateError::Count("x".into())));
        assert_eq!(rate("-1/min"), Err(RateError::Count("-1".into())));
        assert_eq!(
            rate("5/fortnight"),
            Err(RateError::Period("fortnight".into()))
        );
        assert_eq!(rate("5/0s"), Err(RateError::ZeroPeriod));
        assert_eq!(rate("5/"), Err(RateError::Period("".into())));
        assert!(matches!(
            rate("5/99999999999999999999s"),
            Err(RateError::Period(_))
        ));
    }

    #[test]
    fn displays_in_the_shortest_unit() {
        for s in ["100/min", "10/30s", "5/h", "1000/day", "1/500ms", "3/2day"] {
            assert_eq!(rate(s).unwrap().to_string(), s);
        }
        assert!((rate("120/min").unwrap().per_second() - 2.0).abs() < 1e-9);
    }
}
