//! `[[limits]]`: algorithm, rate, burst, key parts, modes, plans, shards.

use std::ops::Range;
use std::time::Duration;

use http::HeaderName;
use toml::Spanned;

use super::{in_range, Check};
use crate::config::{raw, Algorithm, KeyPart, Limit, Mode, ShardBy};
use crate::quota::Rate;

pub(super) fn limits(c: &mut Check, list: Vec<Spanned<raw::Limit>>) -> Vec<Limit> {
    let mut out: Vec<Limit> = Vec::new();
    for (n, l) in list.into_iter().enumerate() {
        let l = l.into_inner();
        let key = format!("limits[{n}]");
        let name = l.name.get_ref().clone();
        // Names appear in store keys, metric labels and structured headers.
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
            c.at(
                l.name.span(),
                format!("{key}.name"),
                format!("{name:?}: use letters, digits, '_', '-' and '.' only"),
            );
        }
        if out.iter().any(|o| o.name == name) {
            c.at(
                l.name.span(),
                format!("{key}.name"),
                format!("duplicate limit name {name:?}"),
            );
        }
        let algorithm = match l.algorithm.as_ref().map(|a| a.get_ref().as_str()) {
            None | Some("token_bucket") => Algorithm::TokenBucket,
            Some("sliding_window") => Algorithm::SlidingWindow,
            Some(other) => {
                let span = l.algorithm.as_ref().map_or(0..0, Spanned::span);
                c.at(
                    span,
                    format!("{key}.algorithm"),
                    format!("unknown algorithm {other:?}: use \"token_bucket\" or \"sliding_window\""),
                );
                Algorithm::TokenBucket
            }
        };
        let rate = match l.rate.get_ref().parse::<Rate>() {
            Ok(r) => r,
            Err(e) => {
                c.at(
                    l.rate.span(),
                    format!("{key}.rate"),
                    format!("{:?}: {e}", l.rate.get_ref()),
                );
                Rate {
                    count: 1,
                    period: Duration::from_secs(1),
                }
            }
        };
        let burst = match &l.burst {
            None => rate.count,
            Some(b) if algorithm == Algorithm::SlidingWindow => {
                c.at(
                    b.span(),
                    format!("{key}.burst"),
                    "burst applies to token_bucket only; a sliding window allows the rate's count",
                );
                rate.count
            }
            Some(b) => match u64::try_from(*b.get_ref()) {
                Ok(n) if n >= 1 => n,
                _ => {
                    c.at(
                        b.span(),
                        format!("{key}.burst"),
                        format!("{} is out of range: use 1 or more", b.get_ref()),
                    );
                    rate.count
                }
            },
        };
        // Bucket levels are kept in units of capacity × period; they must
        // stay exact in a double for the Redis scripts.
        let too_big =
            |cap: u64, r: &Rate| u128::from(cap) * r.period.as_millis().max(1) >= u128::from(crate::quota::MAX_UNITS);
        if too_big(burst, &rate) {
            c.at(
                l.rate.span(),
                format!("{key}.rate"),
                "burst × period is too large (keep it below 2^53 token-milliseconds)",
            );
        }
        let mut by = Vec::new();
        let parts = l.by.as_ref().map(|b| (b.get_ref().clone(), b.span()));
        match parts {
            None => by.push(KeyPart::Identity),
            Some((parts, span)) => {
                if parts.is_empty() {
                    c.at(span.clone(), format!("{key}.by"), "list at least one key part");
                }
                for p in parts {
                    match key_part(&p) {
                        Ok(part) => by.push(part),
                        Err(why) => c.at(span.clone(), format!("{key}.by"), why),
                    }
                }
            }
        }
        let mode = match l.mode.as_ref().map(|m| m.get_ref().as_str()) {
            None | Some("enforce") => Mode::Enforce,
            Some("shadow") => Mode::Shadow,
            Some("soft") => Mode::Soft,
            Some("canary") => Mode::Canary,
            Some(other) => {
                let span = l.mode.as_ref().map_or(0..0, Spanned::span);
                c.at(
                    span,
                    format!("{key}.mode"),
                    format!("unknown mode {other:?}: use shadow, soft, canary or enforce"),
                );
                Mode::Enforce
            }
        };
        let canary_percent = in_range(c, &l.canary_percent, &format!("{key}.canary_percent"), 0, 100, 5);
        if let Some(d) = &l.enforce_after {
            if !is_date(d.get_ref()) {
                c.at(
                    d.span(),
                    format!("{key}.enforce_after"),
                    format!("{:?} is not a date such as \"2027-01-31\"", d.get_ref()),
                );
            }
        }
        let mut plans = Vec::new();
        for (plan, r) in &l.plans {
            match r.get_ref().parse::<Rate>() {
                Ok(rate) if too_big(rate.count, &rate) => c.at(
                    r.span(),
                    format!("{key}.plans.{plan}"),
                    "count × period is too large (keep it below 2^53 token-milliseconds)",
                ),
                Ok(rate) => plans.push((plan.clone(), rate)),
                Err(e) => c.at(
                    r.span(),
                    format!("{key}.plans.{plan}"),
                    format!("{:?}: {e}", r.get_ref()),
                ),
            }
        }
        let tiers = l.tiers.as_ref().map(|t| {
            let mut tiers = Vec::new();
            for name in t.get_ref() {
                match crate::identity::Tier::parse(name) {
                    Some(tier) => tiers.push(tier),
                    None => c.at(
                        t.span(),
                        format!("{key}.tiers"),
                        format!("unknown tier {name:?}: use user, key, fingerprint or subnet"),
                    ),
                }
            }
            tiers
        });
        let fallback_rate = l
            .fallback_rate
            .as_ref()
            .and_then(|r| match r.get_ref().parse::<Rate>() {
                Ok(rate) if too_big(rate.count, &rate) => {
                    c.at(
                        r.span(),
                        format!("{key}.fallback_rate"),
                        "count × period is too large (keep it below 2^53 token-milliseconds)",
                    );
                    None
                }
                Ok(rate) => Some(rate),
                Err(e) => {
                    c.at(
                        r.span(),
                        format!("{key}.fallback_rate"),
                        format!("{:?}: {e}", r.get_ref()),
                    );
                    None
                }
            });
        let shards = in_range(c, &l.shards, &format!("{key}.shards"), 1, 1_000, 1);
        // Every sub-bucket needs at least one token of every quota.
        let smallest = plans
            .iter()
            .map(|(_, r)| r.count)
            .chain([rate.count, burst])
            .min()
            .unwrap_or(1);
        if u64::from(shards) > smallest {
            let span = l.shards.as_ref().map_or(0..0, Spanned::span);
            c.at(
                span,
                format!("{key}.shards"),
                format!("{shards} sub-buckets for a quota of {smallest}: each needs at least one token"),
            );
        }
        let shard_by = match l.shard_by.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
            None | Some(("ip", _)) => ShardBy::Ip,
            Some(("identity", _)) => ShardBy::Identity,
            Some((other, span)) => {
                c.at(
                    span,
                    format!("{key}.shard_by"),
                    format!("unknown shard_by {other:?}: use \"ip\" or \"identity\""),
                );
                ShardBy::Ip
            }
        };
        if shards == 1 {
            if let Some(sb) = &l.shard_by {
                c.at(sb.span(), format!("{key}.shard_by"), "applies only with shards > 1");
            }
        }
        out.push(Limit {
            fallback_rate,
            shards,
            shard_by,
            tiers,
            name,
            algorithm,
            rate,
            burst,
            by,
            mode,
            canary_percent,
            enforce_after: l.enforce_after.map(Spanned::into_inner),
            plans,
            // `[region]` sets this region's slice once both are compiled.
            share: crate::quota::Share::WHOLE,
        });
    }
    out
}

/// `subnet/V6` (IPv4 stays /24) or `subnet/V4/V6`.
fn subnet_part(p: &str) -> Result<KeyPart, String> {
    let bad = || format!("{p:?}: want subnet/V6 (1-128) or subnet/V4/V6 (V4 1-32), such as subnet/48 or subnet/16/48");
    let prefix = |s: &str, max: u8| s.parse::<u8>().ok().filter(|n| (1..=max).contains(n));
    let rest = p.strip_prefix("subnet/").ok_or_else(bad)?;
    match rest.split_once('/') {
        None => Ok(KeyPart::Subnet {
            v4: 24,
            v6: prefix(rest, 128).ok_or_else(bad)?,
        }),
        Some((v4, v6)) => Ok(KeyPart::Subnet {
            v4: prefix(v4, 32).ok_or_else(bad)?,
            v6: prefix(v6, 128).ok_or_else(bad)?,
        }),
    }
}

fn key_part(p: &str) -> Result<KeyPart, String> {
    Ok(match p {
        "identity" => KeyPart::Identity,
        "tenant" => KeyPart::Tenant,
        "route" => KeyPart::Route,
        "ip" => KeyPart::Ip,
        "subnet" => KeyPart::Subnet { v4: 24, v6: 64 },
        _ if p.starts_with("subnet/") => subnet_part(p)?,
        _ => match p.strip_prefix("header:") {
            Some(h) => KeyPart::Header(
                HeaderName::from_bytes(h.trim().as_bytes())
                    .map_err(|_| format!("{p:?}: {h:?} is not a header name"))?,
            ),
            None => {
                return Err(format!(
                    "unknown key part {p:?}: use identity, tenant, route, ip, subnet, subnet/V6, subnet/V4/V6 or header:NAME"
                ))
            }
        },
    })
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: Range<usize>| b.get(r.clone()).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' || !digits(0..4) || !digits(5..7) || !digits(8..10) {
        return false;
    }
    let year: u32 = s[0..4].parse().unwrap_or(0);
    let month: u32 = s[5..7].parse().unwrap_or(0);
    let day: u32 = s[8..10].parse().unwrap_or(0);
    let leap = year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400));
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_know_their_calendar() {
        for ok in ["2027-01-31", "2028-02-29", "2000-02-29", "2026-12-01"] {
            assert!(is_date(ok), "{ok}");
        }
        for bad in [
            "2027-02-29",
            "1900-02-29",
            "2027-04-31",
            "2027-13-01",
            "2027-00-10",
            "2027-1-01",
            "27-01-01x",
            "2027/01/01",
        ] {
            assert!(!is_date(bad), "{bad}");
        }
    }

    #[test]
    fn key_parts_parse() {
        assert_eq!(key_part("identity"), Ok(KeyPart::Identity));
        assert_eq!(key_part("subnet"), Ok(KeyPart::Subnet { v4: 24, v6: 64 }));
        assert_eq!(key_part("subnet/48"), Ok(KeyPart::Subnet { v4: 24, v6: 48 }));
        assert_eq!(key_part("subnet/16/56"), Ok(KeyPart::Subnet { v4: 16, v6: 56 }));
        for bad in [
            "subnet/",
            "subnet/0",
            "subnet/129",
            "subnet/33/64",
            "subnet/x",
            "subnet/24/",
        ] {
            assert!(key_part(bad).unwrap_err().contains("subnet/V6"), "{bad}");
        }
        assert_eq!(
            key_part("header:X-Tenant"),
            Ok(KeyPart::Header(HeaderName::from_static("x-tenant")))
        );
        assert!(key_part("header:bad header").is_err());
        assert!(key_part("cookie").is_err());
    }
}
