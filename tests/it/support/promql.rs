//! Just enough PromQL and Prometheus text to ask "which metric names does
//! this query read?" and "which does this scrape export?".
use std::collections::BTreeSet;

/// Aggregators, keywords and literals that are not metric names.
const NOT_METRICS: &[&str] = &[
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
    "Inf",
    "NaN",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names a PromQL expression selects. Function names (an
/// identifier followed by `(`), label matchers, label lists, strings,
/// ranges, numbers and Grafana variables (`$route`, `$__rate_interval`)
/// are not metric names.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_list = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            i += 1;
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_list => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                skip_list = false;
            }
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) => {
                // A number or a duration (5m, 1e3, 0x1f).
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                if LABEL_LISTS.contains(&word.as_str()) {
                    skip_list = next == Some(&'(');
                } else if next == Some(&'(') || NOT_METRICS.contains(&word.as_str()) {
                    // a function call or a keyword
                } else {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The names of the samples in a Prometheus/OpenMetrics text scrape
/// (`leasegate_requests_total`, `leasegate_store_call_seconds_bucket`, ...).
pub fn exported_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}
