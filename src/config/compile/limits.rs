//! `[[limits]]`: algorithm, rate, burst, key parts, modes, plans, shards.

use std::ops::Range;
use std::time::Duration;

use http::HeaderName;
use toml::Spanned;

use super::{choice, in_range, Check};
use crate::config::{raw, Algorithm, Draft, KeyPart, LimitHeaders, Mode, ShardBy};
use crate::limit::policy::{Field, MAX_SHARDS};
use crate::quota::Rate;

/// Every `[[limits]]` entry as a [`Draft`], each checked: what the file
/// cannot say (an unknown word, a rate that does not parse, a bad date, a
/// duplicate name) here, one helper per field, and the rules every limit
/// obeys by [`Draft::problems`], located at the key they are about
/// ([`report`]). The drafts become limits once the whole file is valid.
/// The request fields the gateway reads a request by: the credentials
/// (`Authorization`, `X-Api-Key`), every `header:NAME` key part and every
/// `header:NAME` cost reserve. A client's `Connection` may not name them
/// to strip them before the upstream, which would then see a request
/// other than the one that was keyed and priced.
pub(super) fn read_headers(drafts: &[Draft]) -> std::sync::Arc<[HeaderName]> {
    let mut out = vec![http::header::AUTHORIZATION, HeaderName::from_static("x-api-key")];
    for d in drafts {
        for part in &d.by {
            if let KeyPart::Header(h) = part {
                out.push(h.clone());
            }
        }
        if let Some(crate::limit::cost::Reserve::Header(h)) = d.cost.as_ref().map(|c| &c.reserve) {
            out.push(h.clone());
        }
    }
    out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    out.dedup();
    out.into()
}

pub(super) fn limits(
    c: &mut Check,
    list: Vec<Spanned<raw::Limit>>,
    rate_claims: &[String],
    jwt_configured: bool,
) -> Vec<Draft> {
    let mut out: Vec<Draft> = Vec::new();
    for (n, l) in list.into_iter().enumerate() {
        let l = l.into_inner();
        let key = format!("limits[{n}]");
        let name = l.name.get_ref().clone();
        if out.iter().any(|o| o.name == name) {
            c.at(
                l.name.span(),
                format!("{key}.name"),
                format!("duplicate limit name {name:?}"),
            );
        }
        let algorithm = algorithm(c, &l, &key);
        let rate = rate_or_max(c, &l, &key, algorithm, n).unwrap_or(Rate {
            count: 1,
            period: Duration::from_secs(1),
        });
        let (by, bad_part) = key_parts(c, &l, &key);
        let shards = in_range(c, &l.shards, &format!("{key}.shards"), 1, MAX_SHARDS, 1);
        let draft = Draft {
            algorithm,
            rate,
            burst: burst(c, &l, &key, algorithm, rate),
            by,
            mode: mode(c, &l, &key),
            canary_percent: in_range(c, &l.canary_percent, &format!("{key}.canary_percent"), 0, 100, 5),
            enforce_after: enforce_after(c, &l, &key),
            plans: plans(c, &l, &key),
            tiers: tiers(c, &l, &key),
            fallback_rate: l
                .fallback_rate
                .as_ref()
                .and_then(|r| parsed_rate(c, r, &format!("{key}.fallback_rate"))),
            shards,
            shard_by: shard_by(c, &l, &key, shards),
            queue_ms: in_range(c, &l.queue_ms, &format!("{key}.queue_ms"), 0, 600_000, 0),
            queue_max: in_range(
                c,
                &l.queue_max,
                &format!("{key}.queue_max"),
                1,
                100_000,
                crate::limit::policy::DEFAULT_QUEUE_MAX,
            ),
            rate_from: rate_from(c, &l, &key, algorithm, rate_claims, jwt_configured),
            cost: cost(c, &l, &key, algorithm),
            headers: choice(
                c,
                l.headers.as_ref(),
                &format!("{key}.headers"),
                LimitHeaders::SPELLINGS,
                LimitHeaders::All,
            ),
            // `[region]` sets this region's slice once both are compiled.
            ..Draft::new(&name, rate)
        };
        if algorithm == Algorithm::Concurrency {
            concurrency_only(c, &l, &key);
        }
        report(c, &l, &key, &draft, bad_part);
        out.push(draft);
    }
    out
}

fn algorithm(c: &mut Check, l: &raw::Limit, key: &str) -> Algorithm {
    choice(
        c,
        l.algorithm.as_ref(),
        &format!("{key}.algorithm"),
        Algorithm::SPELLINGS,
        Algorithm::TokenBucket,
    )
}

/// The rate, or for a concurrency limit its `max` in flight (as `max`
/// per second: what its headers' `q` and `w` say). Each takes its own key
/// and refuses the other's.
fn rate_or_max(c: &mut Check, l: &raw::Limit, key: &str, algorithm: Algorithm, n: usize) -> Option<Rate> {
    let name_span = l.name.span();
    if algorithm != Algorithm::Concurrency {
        if let Some(m) = &l.max {
            c.at(
                m.span(),
                format!("{key}.max"),
                "max applies to algorithm = \"concurrency\" only; other limits take a rate",
            );
        }
        let Some(r) = &l.rate else {
            c.at(
                name_span,
                format!("limits[{n}].rate"),
                "missing rate, such as \"100/min\" (or algorithm = \"concurrency\" with max)",
            );
            return None;
        };
        return parsed_rate(c, r, &format!("{key}.rate"));
    }
    if let Some(r) = &l.rate {
        c.at(
            r.span(),
            format!("{key}.rate"),
            "a concurrency limit counts requests in flight: give max = N, not a rate",
        );
    }
    let Some(m) = &l.max else {
        c.at(
            name_span,
            format!("{key}.max"),
            "missing max: the most requests in flight at once, such as max = 8",
        );
        return None;
    };
    match u64::try_from(*m.get_ref()) {
        Ok(count @ 1..=1_000_000) => Some(Rate {
            count,
            period: Duration::from_secs(1),
        }),
        _ => {
            c.at(
                m.span(),
                format!("{key}.max"),
                format!("{} is out of range: use 1 to 1000000", m.get_ref()),
            );
            None
        }
    }
}

/// The claim names of every `rate_from = "claim:NAME"`, sorted and
/// deduplicated: the JWT verifier reads these, and each limit's
/// `rate_from` is an index into them.
pub(super) fn rate_claims(list: &[Spanned<raw::Limit>]) -> Vec<String> {
    let mut names: Vec<String> = list
        .iter()
        .filter_map(|l| l.get_ref().rate_from.as_ref())
        .filter_map(|r| r.get_ref().strip_prefix("claim:"))
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `rate_from = "claim:NAME"` with its `max_rate`, each needing the other,
/// and a verified JWT to read the claim from.
fn rate_from(
    c: &mut Check,
    l: &raw::Limit,
    key: &str,
    algorithm: Algorithm,
    rate_claims: &[String],
    jwt_configured: bool,
) -> Option<crate::limit::policy::RateFrom> {
    let Some(from) = &l.rate_from else {
        if let Some(m) = &l.max_rate {
            c.at(
                m.span(),
                format!("{key}.max_rate"),
                "max_rate applies with rate_from only",
            );
        }
        return None;
    };
    let at = format!("{key}.rate_from");
    let Some(claim) = from
        .get_ref()
        .strip_prefix("claim:")
        .map(str::trim)
        .filter(|n| !n.is_empty())
    else {
        c.at(
            from.span(),
            at,
            format!(
                "{:?}: want \"claim:NAME\", the name of a verified JWT claim holding a rate such as \"100/min\"",
                from.get_ref()
            ),
        );
        return None;
    };
    if algorithm == Algorithm::Concurrency {
        c.at(from.span(), at, "a concurrency limit has no rate to take from a claim");
        return None;
    }
    if !jwt_configured {
        c.at(
            from.span(),
            at,
            "rate_from reads a verified JWT's claim: configure [identity.jwt]",
        );
        return None;
    }
    let Some(max) = &l.max_rate else {
        c.at(
            from.span(),
            format!("{key}.max_rate"),
            "rate_from needs max_rate, the most a token's claim may give, such as \"1000/min\"",
        );
        return None;
    };
    let max = parsed_rate(c, max, &format!("{key}.max_rate"))?;
    if !crate::limit::policy::fits(max.count, &max) {
        c.at(
            l.max_rate.as_ref().map_or(0..0, Spanned::span),
            format!("{key}.max_rate"),
            "count × period must stay below 2^53 token-milliseconds",
        );
        return None;
    }
    Some(crate::limit::policy::RateFrom {
        claim: claim.to_string(),
        index: rate_claims.iter().position(|n| n == claim)?,
        max,
    })
}

/// What a concurrency limit cannot take: rates of any kind, and sub-buckets
/// (a slot is one request in flight, not a share of a rate).
fn concurrency_only(c: &mut Check, l: &raw::Limit, key: &str) {
    let why = "does not apply to a concurrency limit";
    if let Some((plan, r)) = l.plans.iter().next() {
        c.at(r.span(), format!("{key}.plans.{plan}"), format!("plans {why}"));
    }
    if let Some(r) = &l.fallback_rate {
        c.at(
            r.span(),
            format!("{key}.fallback_rate"),
            format!("fallback_rate {why}: while the store is away each instance allows max divided by the live fleet"),
        );
    }
    if let Some(r) = &l.shards {
        c.at(r.span(), format!("{key}.shards"), format!("shards {why}"));
    }
}

/// `cost = { reserve, settle }`: each rule parsed, at its own key. A
/// concurrency limit counts requests, not tokens, so it takes none.
fn cost(c: &mut Check, l: &raw::Limit, key: &str, algorithm: Algorithm) -> Option<crate::limit::cost::Cost> {
    use crate::limit::cost::{Cost, OnUnsettled, Reserve, Settle};
    let raw = l.cost.as_ref()?;
    if algorithm == Algorithm::Concurrency {
        c.at(
            raw.span(),
            format!("{key}.cost"),
            "cost does not apply to a concurrency limit: it counts requests in flight, not tokens",
        );
        return None;
    }
    let r = raw.get_ref();
    let api = r.api.as_ref().map(|a| {
        super::choice(
            c,
            Some(a),
            &format!("{key}.cost.api"),
            crate::limit::cost::Api::SPELLINGS,
            crate::limit::cost::Api::OpenAi,
        )
    });
    let reserve = match &r.reserve {
        None => Ok(api.map_or(Reserve::Fixed(1), Reserve::Api)),
        Some(v) => match v.get_ref() {
            raw::NumberOrText::Number(n) => Reserve::fixed(*n),
            raw::NumberOrText::Text(t) => Reserve::parse(t),
        }
        .map_err(|e| (v.span(), format!("{key}.cost.reserve"), e)),
    };
    let settle = match &r.settle {
        None => Ok(api.map(|a| Settle::Api(crate::limit::cost::ApiSettle::new(a)))),
        Some(s) => Settle::parse(s.get_ref())
            .map(Some)
            .map_err(|e| (s.span(), format!("{key}.cost.settle"), e)),
    };
    let errors = super::choice(
        c,
        r.errors.as_ref(),
        &format!("{key}.cost.errors"),
        crate::limit::cost::OnError::SPELLINGS,
        crate::limit::cost::OnError::Free,
    );
    let reserve_default = match &r.reserve_default {
        None => api.map_or(1, |a| a.reserve_default()),
        Some(n) => match u64::try_from(*n.get_ref()) {
            Ok(v @ 1..) => v,
            _ => {
                c.at(
                    n.span(),
                    format!("{key}.cost.reserve_default"),
                    format!("reserve_default {} is out of range: use 1 or more", n.get_ref()),
                );
                1
            }
        },
    };
    let unsettled = match &r.unsettled {
        None if api.is_some() => OnUnsettled::Estimate,
        None => OnUnsettled::Reserve,
        Some(v) => match v.get_ref() {
            raw::NumberOrText::Text(t) if t == "estimate" => OnUnsettled::Estimate,
            raw::NumberOrText::Text(t) if t == "reserve" => OnUnsettled::Reserve,
            raw::NumberOrText::Number(n) if *n >= 0 => OnUnsettled::Fixed(*n as u64),
            _ => {
                c.at(
                    v.span(),
                    format!("{key}.cost.unsettled"),
                    "expected \"estimate\", \"reserve\" or a number of tokens",
                );
                OnUnsettled::Reserve
            }
        },
    };
    match (reserve, settle) {
        (Ok(reserve), Ok(settle)) => Some(Cost {
            reserve,
            settle,
            errors,
            api,
            reserve_default,
            unsettled,
        }),
        (reserve, settle) => {
            for (span, at, e) in [reserve.err(), settle.err()].into_iter().flatten() {
                c.at(span, at, e.to_string());
            }
            None
        }
    }
}

/// The bucket's capacity: the rate's count unless a token bucket says.
fn burst(c: &mut Check, l: &raw::Limit, key: &str, algorithm: Algorithm, rate: Rate) -> u64 {
    match &l.burst {
        None => rate.count,
        Some(b) if algorithm != Algorithm::TokenBucket => {
            c.at(
                b.span(),
                format!("{key}.burst"),
                format!(
                    "burst applies to token_bucket only; a {} allows {}",
                    algorithm.as_str().replace('_', " "),
                    if algorithm == Algorithm::Concurrency {
                        "max in flight"
                    } else {
                        "the rate's count"
                    }
                ),
            );
            rate.count
        }
        // Read as i64 so that `-5` is refused in words, as written.
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
    }
}

/// The key parts, and whether one of them did not parse (then named here,
/// and not again as an empty list).
fn key_parts(c: &mut Check, l: &raw::Limit, key: &str) -> (Vec<KeyPart>, bool) {
    let Some(parts) = &l.by else {
        return (vec![KeyPart::Identity], false);
    };
    let mut by = Vec::new();
    for p in parts.get_ref() {
        match key_part(p) {
            Ok(part) => by.push(part),
            Err(why) => c.at(parts.span(), format!("{key}.by"), why),
        }
    }
    let bad = parts.get_ref().len() != by.len();
    (by, bad)
}

fn mode(c: &mut Check, l: &raw::Limit, key: &str) -> Mode {
    choice(
        c,
        l.mode.as_ref(),
        &format!("{key}.mode"),
        Mode::SPELLINGS,
        Mode::Enforce,
    )
}

fn enforce_after(c: &mut Check, l: &raw::Limit, key: &str) -> Option<String> {
    let d = l.enforce_after.as_ref()?;
    if !is_date(d.get_ref()) {
        c.at(
            d.span(),
            format!("{key}.enforce_after"),
            format!("{:?} is not a date such as \"2027-01-31\"", d.get_ref()),
        );
    }
    Some(d.get_ref().clone())
}

fn plans(c: &mut Check, l: &raw::Limit, key: &str) -> Vec<(String, Rate)> {
    l.plans
        .iter()
        .filter_map(|(plan, r)| Some((plan.clone(), parsed_rate(c, r, &format!("{key}.plans.{plan}"))?)))
        .collect()
}

fn tiers(c: &mut Check, l: &raw::Limit, key: &str) -> Option<Vec<crate::identity::Tier>> {
    let t = l.tiers.as_ref()?;
    let mut tiers = Vec::new();
    for name in t.get_ref() {
        match crate::identity::Tier::parse(name) {
            Some(tier) => tiers.push(tier),
            None => c.at(
                t.span(),
                format!("{key}.tiers"),
                format!("unknown tier {name:?}: use user, key, cert, fingerprint or subnet"),
            ),
        }
    }
    Some(tiers)
}

fn shard_by(c: &mut Check, l: &raw::Limit, key: &str, shards: u32) -> ShardBy {
    let shard_by = choice(
        c,
        l.shard_by.as_ref(),
        &format!("{key}.shard_by"),
        ShardBy::SPELLINGS,
        ShardBy::Ip,
    );
    if let (Some(sb), 1) = (&l.shard_by, shards) {
        c.at(sb.span(), format!("{key}.shard_by"), "applies only with shards > 1");
    }
    shard_by
}

/// Each rule the draft breaks ([`Draft::problems`]), at the key it is about.
fn report(c: &mut Check, l: &raw::Limit, key: &str, draft: &Draft, bad_part: bool) {
    for problem in draft.problems() {
        let (span, at) = match problem.field() {
            Field::Name => (l.name.span(), format!("{key}.name")),
            Field::Rate => match (&l.rate, &l.max) {
                (Some(r), _) => (r.span(), format!("{key}.rate")),
                (None, Some(m)) => (m.span(), format!("{key}.max")),
                (None, None) => continue, // named as missing
            },
            Field::Burst => (l.burst.as_ref().map_or(0..0, Spanned::span), format!("{key}.burst")),
            // An unparsable part is already named.
            Field::By if bad_part => continue,
            Field::By => (l.by.as_ref().map_or(0..0, Spanned::span), format!("{key}.by")),
            Field::CanaryPercent => continue, // in_range keeps it in bounds
            Field::Plan(plan) => (
                l.plans.get(&plan).map_or(0..0, Spanned::span),
                format!("{key}.plans.{plan}"),
            ),
            Field::FallbackRate => (
                l.fallback_rate.as_ref().map_or(0..0, Spanned::span),
                format!("{key}.fallback_rate"),
            ),
            Field::Shards => (l.shards.as_ref().map_or(0..0, Spanned::span), format!("{key}.shards")),
        };
        c.at(span, at, problem.to_string());
    }
}

/// A rate as written (`"100/min"`), or a problem at `key`.
fn parsed_rate(c: &mut Check, r: &Spanned<String>, key: &str) -> Option<Rate> {
    match r.get_ref().parse::<Rate>() {
        Ok(rate) => Some(rate),
        Err(e) => {
            c.at(r.span(), key, format!("{:?}: {e}", r.get_ref()));
            None
        }
    }
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

    /// Each broken rule of a limit is one problem, at its key: never again
    /// under another key when the drafts become limits.
    #[test]
    fn every_problem_of_a_limit_is_listed_once_at_its_key() {
        use crate::config::{parse, ConfigError};
        let problems = |limit: &str| -> Vec<(usize, String)> {
            let text = format!("[listeners]\nhttp = \"127.0.0.1:0\"\n[[limits]]\n{limit}");
            match parse(std::path::Path::new("gw.toml"), &text) {
                Ok(_) => vec![],
                Err(ConfigError::Invalid(p)) => p.into_iter().map(|p| (p.line.unwrap_or(0), p.key)).collect(),
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(
            problems("name = \"bad name\"\nrate = \"1000000000/day\"\n"),
            [(4, "limits[0].name".to_string()), (5, "limits[0].rate".to_string())]
        );
        assert_eq!(
            problems("name = \"l\"\nrate = \"10/s\"\nby = [\"cookie\"]\n"),
            [(6, "limits[0].by".to_string())]
        );
        assert_eq!(
            problems("name = \"l\"\nrate = \"10/s\"\nby = []\n"),
            [(6, "limits[0].by".to_string())]
        );
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
