//! The Envoy rate limit service's rules: envoyproxy/ratelimit's YAML, read
//! the way it reads it, into a tree of descriptors per domain.
//!
//! One file, or a directory whose `*.yaml`/`*.yml` files each hold one
//! domain. Every map rejects keys it does not know, as envoyproxy/ratelimit
//! does; a unit is any RLS unit name in any case; an `unlimited` limit may
//! not name a unit. Errors name the file, the line and the key. Loaded with
//! `gateway.toml` (check, start, reload), so a bad YAML never replaces a
//! good config.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::Problem;
use crate::quota::{Algorithm, Rate, Spec};

/// An RLS unit, with envoyproxy/ratelimit's lengths: a month is 30 days
/// and a year 365, windows aligned to the epoch. Ordered by length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The RLS enum name.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }
}

/// One `rate_limit`, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsLimit {
    /// `domain.key_value.key...`: envoyproxy/ratelimit's full key, for
    /// logs and the key of a shared (`share_threshold`) bucket.
    pub full_key: String,
    pub name: String,
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub unlimited: bool,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    /// Values matched by this wildcard share one bucket.
    pub share_threshold: bool,
    pub algorithm: Algorithm,
}

impl RlsLimit {
    /// The quota a store counts: `requests_per_unit` per unit. A token
    /// bucket holds one unit's worth as its burst.
    pub fn spec(&self) -> Spec {
        limit_spec(self.algorithm, self.requests_per_unit, self.unit)
    }
}

/// The quota of `requests` per `unit` under `algorithm`.
pub fn limit_spec(algorithm: Algorithm, requests: u32, unit: Unit) -> Spec {
    let rate = Rate {
        count: u64::from(requests).max(1),
        period: Duration::from_secs(unit.seconds()),
    };
    // envoyproxy/ratelimit's windows: a week from a Thursday, a month of
    // 30 days, never the calendar's.
    Spec::new(algorithm, rate, rate.count).epoch_windows()
}

/// One level of a domain's tree.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Level {
    /// key → value → node: a descriptor entry is looked up by its `&str`s,
    /// without building a key.
    pub exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, pattern)` in config order: values with `*` anywhere.
    pub wildcards: Vec<(String, String, Node)>,
    /// A key with no value: any value.
    pub any: HashMap<String, Node>,
}

impl Level {
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty() && self.any.is_empty()
    }
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Node {
    pub limit: Option<Arc<RlsLimit>>,
    pub children: Level,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct RlsRules {
    pub domains: HashMap<String, Level>,
    /// The files read, for `leasegate check` and the reload watcher.
    pub files: Vec<PathBuf>,
    /// SHA-256 over the files' names and bytes as read: a reload compares
    /// it with the files on disk.
    pub digest: [u8; 32],
    /// Each domain's file, as the hex SHA-256 of its bytes (what
    /// `sha256sum` prints): `/config` and the reload log show them, so a
    /// fleet's rollout of a YAML edit can be confirmed per domain.
    pub domain_sha256: std::collections::BTreeMap<String, String>,
    /// The longest unit of any rule, over all domains, found as each
    /// domain is read: a descriptor's own `limit` (RateLimitOverride) is
    /// capped at it, so a caller cannot make store keys outlive every
    /// rule's window.
    pub longest_unit: Option<Unit>,
}

impl RlsRules {
    /// Rules with a limit, over all domains.
    pub fn limit_count(&self) -> usize {
        fn count(level: &Level) -> usize {
            let node = |n: &Node| usize::from(n.limit.is_some()) + count(&n.children);
            level.exact.values().flat_map(HashMap::values).map(node).sum::<usize>()
                + level.wildcards.iter().map(|(_, _, n)| node(n)).sum::<usize>()
                + level.any.values().map(node).sum::<usize>()
        }
        self.domains.values().map(count).sum()
    }
}

/// The longest unit of any rule of `level` and below.
fn longest_unit(level: &Level) -> Option<Unit> {
    let node = |n: &Node| {
        let own = n.limit.as_ref().filter(|l| !l.unlimited).map(|l| l.unit);
        own.max(longest_unit(&n.children))
    };
    let exact = level.exact.values().flat_map(HashMap::values).filter_map(node).max();
    let wild = level.wildcards.iter().filter_map(|(_, _, n)| node(n)).max();
    let any = level.any.values().filter_map(node).max();
    exact.max(wild).max(any)
}

mod files;
mod lines;

pub use files::{digest_of, fingerprint_of, load};

// ---- the YAML, as envoyproxy/ratelimit reads it ----

// envoyproxy/ratelimit checks every map's keys against one flat list,
// then decodes leniently: a key of the list is accepted in any map, and
// meaningful only where it belongs. So one struct holds the whole list and
// reads every map of the file (the file, a descriptor, a `rate_limit`, a
// `replaces` entry): `deny_unknown_fields` then refuses exactly what
// envoyproxy/ratelimit refuses, with the line. An explicit null reads as
// the default, as in Go.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMap {
    #[serde(default, deserialize_with = "nullable")]
    domain: String,
    #[serde(default, deserialize_with = "nullable")]
    key: String,
    #[serde(default, deserialize_with = "nullable")]
    value: String,
    #[serde(default, deserialize_with = "nullable")]
    rate_limit: Option<Box<RawMap>>,
    #[serde(default, deserialize_with = "nullable")]
    descriptors: Vec<RawMap>,
    #[serde(default, deserialize_with = "nullable")]
    shadow_mode: bool,
    #[serde(default, deserialize_with = "nullable")]
    quota_mode: bool,
    #[serde(default, deserialize_with = "nullable")]
    share_threshold: bool,
    #[serde(default, deserialize_with = "nullable")]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "nullable")]
    unit: String,
    #[serde(default, deserialize_with = "nullable")]
    unlimited: bool,
    #[serde(default, deserialize_with = "nullable")]
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    replaces: Vec<RawMap>,
    /// leasegate's extension: `fixed_window` (the default),
    /// `token_bucket` or `sliding_window`.
    #[serde(default, deserialize_with = "nullable")]
    algorithm: Option<String>,
    /// Stats options of envoyproxy/ratelimit: accepted, no effect here.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: Option<IgnoredAny>,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: Option<IgnoredAny>,
    #[serde(default, rename = "metadata")]
    _metadata: Option<IgnoredAny>,
}

/// A value that may be an explicit null: read as the default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The keys of the file's top map.
const TOP: &[&str] = &["domain", "descriptors"];
/// The keys of a descriptor.
const DESCRIPTOR: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "share_threshold",
    "detailed_metric",
    "value_to_metric",
];
/// The keys of a `rate_limit`.
const RATE_LIMIT: &[&str] = &[
    "requests_per_unit",
    "unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
];

/// Whether envoyproxy/ratelimit accepts `name` in a map: it checks every
/// map's keys against one flat list (the three above and `metadata`).
fn known(name: &str) -> bool {
    name == "metadata" || [TOP, DESCRIPTOR, RATE_LIMIT].iter().any(|k| k.contains(&name))
}

/// The keys that mean something in the map at `path` (a key's path less
/// its last name): what an unknown key there is compared with.
fn known_at(parent: &str) -> &'static [&'static str] {
    let last = parent.rsplit('.').next().unwrap_or(parent);
    if parent.is_empty() {
        TOP
    } else if last == "rate_limit" {
        RATE_LIMIT
    } else if last.starts_with("replaces[") {
        &["name"]
    } else {
        DESCRIPTOR
    }
}

/// Every key of the file that is not [`known`], each at its own line, with
/// the names that mean something where it is and the nearest of them.
fn unknown_keys(file: &str, lines: &lines::Lines) -> Vec<Problem> {
    lines
        .keys()
        .filter_map(|(path, line)| {
            let (parent, name) = path.rsplit_once('.').unwrap_or(("", path));
            // What `metadata` holds is anyone's: read as nothing.
            let in_metadata = parent.split('.').any(|seg| seg == "metadata");
            if known(name) || in_metadata {
                return None;
            }
            let here = known_at(parent);
            let near = crate::config::error::did_you_mean(name, here)
                .map(|n| format!(", did you mean `{n}`?"))
                .unwrap_or_default();
            Some(Problem {
                file: file.to_string(),
                line: Some(line),
                key: path.to_string(),
                reason: format!("unknown field `{name}`{near} (known here: {})", here.join(", ")),
            })
        })
        .collect()
}

/// Parses one file's text into `rules` (one domain).
pub fn parse_into(rules: &mut RlsRules, file: &str, text: &str) -> Result<(), Vec<Problem>> {
    let lines = lines::Lines::of(text);
    let raw: RawMap = serde_yaml_ng::from_str(text).map_err(|e| {
        let (key, reason) = yaml_problem(&e.to_string());
        // serde stops at the first problem: every unknown key is listed
        // from the file's own structure, and a problem of another kind
        // (a type, the syntax) is added as serde put it.
        let mut problems = unknown_keys(file, &lines);
        if problems.is_empty() || !reason.starts_with("unknown field") {
            problems.push(Problem {
                file: file.to_string(),
                line: e.location().map(|l| l.line()),
                key,
                reason,
            });
            problems.sort_by_key(|p| p.line);
        }
        problems
    })?;
    let mut c = Compiler {
        file,
        text,
        lines,
        problems: Vec::new(),
    };
    if raw.domain.is_empty() {
        c.problem("domain", None, "config file cannot have empty domain".into());
    }
    if rules.domains.contains_key(&raw.domain) {
        c.problem(
            "domain",
            Some(&format!("domain: {}", raw.domain)),
            format!("duplicate domain {:?}", raw.domain),
        );
    }
    let level = c.level(&format!("{}.", raw.domain), raw.descriptors, "descriptors");
    if c.problems.is_empty() {
        rules.longest_unit = rules.longest_unit.max(longest_unit(&level));
        rules.domains.insert(raw.domain, level);
        Ok(())
    } else {
        Err(c.problems)
    }
}

/// The key and the reason in a YAML error, which reads
/// `descriptors[1]: unknown field `colour`, expected ... at line 8 column 5`:
/// the path (when there is one) and the field named make the key; the
/// position is given as the line already.
fn yaml_problem(message: &str) -> (String, String) {
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    let (path, reason) = match message.split_once(": ") {
        Some((path, reason)) if !path.is_empty() && !path.contains(' ') => (Some(path), reason),
        _ => (None, message),
    };
    let field = reason
        .split('`')
        .nth(1)
        .filter(|_| reason.starts_with("unknown field") || reason.starts_with("missing field"));
    let key = match (path, field) {
        (Some(p), Some(f)) => format!("{p}.{f}"),
        (Some(p), None) => p.to_string(),
        (None, Some(f)) => f.to_string(),
        (None, None) => "(document)".to_string(),
    };
    (key, reason.to_string())
}

struct Compiler<'a> {
    file: &'a str,
    text: &'a str,
    /// Where each key is (the YAML parser keeps no positions once a value
    /// is read).
    lines: lines::Lines,
    problems: Vec<Problem>,
}

impl Compiler<'_> {
    /// A problem at `key`'s own line; else at the first line containing
    /// `needle`.
    fn problem(&mut self, key: &str, needle: Option<&str>, reason: String) {
        let line = self
            .lines
            .line_of(key)
            .or_else(|| needle.and_then(|n| self.text.lines().position(|l| l.contains(n)).map(|i| i + 1)));
        self.problems.push(Problem {
            file: self.file.to_string(),
            line,
            key: key.to_string(),
            reason,
        });
    }

    fn level(&mut self, parent: &str, descriptors: Vec<RawMap>, path: &str) -> Level {
        let mut level = Level::default();
        for (i, d) in descriptors.into_iter().enumerate() {
            let at = format!("{path}[{i}]");
            if d.key.is_empty() {
                self.problem(&format!("{at}.key"), None, "descriptor has empty key".into());
                continue;
            }
            let composite = if d.value.is_empty() {
                d.key.clone()
            } else {
                format!("{}_{}", d.key, d.value)
            };
            let full_key = format!("{parent}{composite}");
            let duplicate = if d.value.is_empty() {
                level.any.contains_key(&d.key)
            } else if d.value.contains('*') {
                level.wildcards.iter().any(|(k, v, _)| *k == d.key && *v == d.value)
            } else {
                level
                    .exact
                    .get(&d.key)
                    .is_some_and(|values| values.contains_key(&d.value))
            };
            if duplicate {
                self.problem(
                    &format!("{at}.key"),
                    Some(&format!("key: {}", d.key)),
                    format!("duplicate descriptor composite key {full_key:?}"),
                );
                continue;
            }
            let limit = d.rate_limit.and_then(|r| {
                self.limit(
                    &format!("{at}.rate_limit"),
                    *r,
                    RuleFlags {
                        full_key: full_key.clone(),
                        shadow_mode: d.shadow_mode,
                        quota_mode: d.quota_mode,
                        share_threshold: d.share_threshold && d.value.contains('*'),
                    },
                )
            });
            let children = self.level(&format!("{full_key}."), d.descriptors, &format!("{at}.descriptors"));
            let node = Node { limit, children };
            if d.value.is_empty() {
                level.any.insert(d.key, node);
            } else if d.value.contains('*') {
                level.wildcards.push((d.key, d.value, node));
            } else {
                level.exact.entry(d.key).or_default().insert(d.value, node);
            }
        }
        level
    }

    fn limit(&mut self, at: &str, r: RawMap, flags: RuleFlags) -> Option<Arc<RlsLimit>> {
        let unit = Unit::parse(&r.unit);
        let mut ok = true;
        if r.unlimited && unit.is_some() {
            self.problem(
                &format!("{at}.unit"),
                Some(&format!("unit: {}", r.unit)),
                "should not specify rate limit unit when unlimited".into(),
            );
            ok = false;
        } else if !r.unlimited && unit.is_none() {
            self.problem(
                &format!("{at}.unit"),
                (!r.unit.is_empty()).then(|| format!("unit: {}", r.unit)).as_deref(),
                format!(
                    "invalid rate limit unit {:?}: use SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
                    r.unit
                ),
            );
            ok = false;
        }
        for rep in &r.replaces {
            if rep.name.is_empty() {
                self.problem(
                    &format!("{at}.replaces"),
                    None,
                    "should not have an empty replaces entry".into(),
                );
                ok = false;
            } else if rep.name == r.name {
                self.problem(
                    &format!("{at}.replaces"),
                    Some(&format!("name: {}", rep.name)),
                    "replaces should not contain name of same descriptor".into(),
                );
                ok = false;
            }
        }
        let algorithm = match r.algorithm.as_deref().map(|a| (a, Algorithm::from_spelling(a))) {
            None => Algorithm::FixedWindow,
            Some((_, Some(a))) if a != Algorithm::Concurrency => a,
            Some((other, _)) => {
                self.problem(
                    &format!("{at}.algorithm"),
                    Some(&format!("algorithm: {other}")),
                    format!("unknown algorithm {other:?}: use fixed_window, token_bucket or sliding_window"),
                );
                ok = false;
                Algorithm::FixedWindow
            }
        };
        // The scripts keep token-bucket and sliding-window state as
        // `count × period_ms` in doubles, exact only below 2^53.
        let period_ms = unit.map_or(1_000, |u| u.seconds() * 1_000);
        if algorithm != Algorithm::FixedWindow
            && !crate::limit::policy::fits_ms(u64::from(r.requests_per_unit), period_ms)
        {
            self.problem(
                &format!("{at}.requests_per_unit"),
                Some(&format!("requests_per_unit: {}", r.requests_per_unit)),
                format!(
                    "{} per {} is too large for {}: requests_per_unit × the unit in ms must stay below 2^53 (use fixed_window or a shorter unit)",
                    r.requests_per_unit,
                    r.unit,
                    algorithm.as_str()
                ),
            );
            ok = false;
        }
        ok.then(|| {
            Arc::new(RlsLimit {
                full_key: flags.full_key,
                name: r.name,
                requests_per_unit: r.requests_per_unit,
                unit: unit.unwrap_or(Unit::Second),
                unlimited: r.unlimited,
                replaces: r.replaces.into_iter().map(|x| x.name).collect(),
                shadow_mode: flags.shadow_mode,
                quota_mode: flags.quota_mode,
                share_threshold: flags.share_threshold,
                algorithm,
            })
        })
    }
}

struct RuleFlags {
    full_key: String,
    shadow_mode: bool,
    quota_mode: bool,
    share_threshold: bool,
}

#[cfg(test)]
mod tests;
