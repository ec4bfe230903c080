//! Which rule of a domain applies to a descriptor: envoyproxy/ratelimit's
//! lookup, pure.
//!
//! Level by level, each entry tries the exact `key`/`value`, then the
//! wildcard values of its key in config order (`*` matches any run of
//! characters, anywhere), then the bare `key`. A limit applies only when it
//! sits at the node the descriptor's last entry reached: a descriptor
//! deeper or shallower than the rule gets no limit. A level with no match
//! ends the walk.

use std::fmt::Write as _;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::config::rls::{Level, Node, RlsLimit};

/// The rule a descriptor matched.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched<'a> {
    pub limit: &'a Arc<RlsLimit>,
    /// The wildcard that matched the last entry, when its limit is shared
    /// by every value it matches (`share_threshold`).
    pub shared_pattern: Option<&'a str>,
}

/// The limit `entries` match in `domain`, if any.
pub fn find<'a>(domain: &'a Level, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
    let mut level = domain;
    let mut found = None;
    for (i, &(key, value)) in entries.iter().enumerate() {
        let (node, pattern) = match step(level, key, value) {
            Some(n) => n,
            None => break,
        };
        if i + 1 == entries.len() {
            found = node.limit.as_ref().map(|limit| Matched {
                limit,
                shared_pattern: pattern.filter(|_| limit.share_threshold),
            });
        }
        if node.children.is_empty() {
            break;
        }
        level = &node.children;
    }
    found
}

/// One entry's node at `level`, and the wildcard it matched by.
fn step<'a>(level: &'a Level, key: &str, value: &str) -> Option<(&'a Node, Option<&'a str>)> {
    if let Some(n) = level.exact.get(key).and_then(|values| values.get(value)) {
        return Some((n, None));
    }
    if let Some((_, pattern, n)) = level
        .wildcards
        .iter()
        .find(|(k, pattern, _)| k == key && glob(pattern, value))
    {
        return Some((n, Some(pattern.as_str())));
    }
    level.any.get(key).map(|n| (n, None))
}

/// Whether `value` matches `pattern`, where `*` stands for any run of
/// characters (none included) and everything else for itself.
pub fn glob(pattern: &str, value: &str) -> bool {
    let (p, v) = (pattern.as_bytes(), value.as_bytes());
    let (mut pi, mut vi) = (0, 0);
    // The last star seen, and where in `value` it was tried.
    let mut star: Option<(usize, usize)> = None;
    while vi < v.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, vi));
            pi += 1;
        } else if pi < p.len() && p[pi] == v[vi] {
            pi += 1;
            vi += 1;
        } else if let Some((sp, sv)) = star {
            // Let the star take one more character and try again.
            pi = sp + 1;
            vi = sv + 1;
            star = Some((sp, sv + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// The store key of a descriptor in `domain`: `rl:{rls:<domain>:<key>=<value>:...}`,
/// each part percent-encoded where it holds a separator, and hashed when
/// long, so no two descriptors share a key and any descriptor fits one
/// Redis Cluster slot. A shared wildcard stands for the last value.
pub fn store_key(domain: &str, entries: &[(&str, &str)], shared_pattern: Option<&str>) -> String {
    let mut k = String::with_capacity(32 + domain.len() + entries.len() * 24);
    k.push_str("rl:{rls:");
    push_part(&mut k, domain);
    for (i, &(key, value)) in entries.iter().enumerate() {
        k.push(':');
        push_part(&mut k, key);
        k.push('=');
        match shared_pattern {
            Some(p) if i + 1 == entries.len() => {
                k.push('*');
                push_part(&mut k, p);
            }
            _ => push_part(&mut k, value),
        }
    }
    k.push('}');
    k
}

/// Longest part kept readable; longer ones go in as a digest.
const MAX_PART: usize = 96;

fn push_part(out: &mut String, part: &str) {
    if part.len() > MAX_PART {
        out.push('#');
        for b in &Sha256::digest(part.as_bytes())[..12] {
            let _ = write!(out, "{b:02x}");
        }
        return;
    }
    for c in part.chars() {
        match c {
            ':' | '=' | '{' | '}' | '%' | '*' | '#' => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "%{b:02X}");
                }
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rls::{parse_into, RlsRules};

    fn rules(yaml: &str) -> RlsRules {
        let mut r = RlsRules::default();
        parse_into(&mut r, "t.yaml", yaml).unwrap();
        r
    }

    fn name(r: &RlsRules, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
        find(&r.domains[domain], entries).map(|m| m.limit.name.clone())
    }

    const YAML: &str = "
domain: edge
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5, name: key1_value1_subkey1}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20, name: key2_any}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30, name: key2_value2}
  - key: key2
    value: value3
    descriptors:
      - key: subkey3
        rate_limit: {unit: hour, requests_per_unit: 40, name: key2_value3_subkey3}
  - key: path
    value: /api/*/users
    rate_limit: {unit: second, requests_per_unit: 1, name: users_glob}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 2, name: api_glob}
  - key: path
    value: /api/v1
    rate_limit: {unit: second, requests_per_unit: 3, name: api_v1}
  - key: remote_address
    rate_limit: {unlimited: true, name: unlimited}
";

    #[test]
    fn exact_then_wildcard_then_bare_key() {
        let r = rules(YAML);
        assert_eq!(name(&r, "edge", &[("key2", "value2")]).as_deref(), Some("key2_value2"));
        assert_eq!(name(&r, "edge", &[("key2", "other")]).as_deref(), Some("key2_any"));
        // Exact beats a wildcard that also matches.
        assert_eq!(name(&r, "edge", &[("path", "/api/v1")]).as_deref(), Some("api_v1"));
        // Wildcards in config order: the first that matches wins.
        assert_eq!(
            name(&r, "edge", &[("path", "/api/v2/users")]).as_deref(),
            Some("users_glob")
        );
        assert_eq!(
            name(&r, "edge", &[("path", "/api/v2/orders")]).as_deref(),
            Some("api_glob")
        );
        assert_eq!(name(&r, "edge", &[("path", "/other")]), None);
        assert_eq!(name(&r, "edge", &[("nokey", "x")]), None);
    }

    #[test]
    fn a_limit_applies_only_at_the_depth_of_the_last_entry() {
        let r = rules(YAML);
        assert_eq!(
            name(&r, "edge", &[("key1", "value1"), ("subkey1", "x")]).as_deref(),
            Some("key1_value1_subkey1")
        );
        // Shallower: key1/value1 has no limit of its own.
        assert_eq!(name(&r, "edge", &[("key1", "value1")]), None);
        // Deeper than the rule: no limit.
        assert_eq!(name(&r, "edge", &[("key2", "value2"), ("extra", "x")]), None);
        assert_eq!(
            name(&r, "edge", &[("key1", "value1"), ("subkey1", "x"), ("more", "y")]),
            None
        );
        // A first entry that matches no rule ends the walk.
        assert_eq!(name(&r, "edge", &[("key1", "nope"), ("subkey1", "x")]), None);
        // key2=value3 has children: the bare key2 rule is not reached by
        // falling back when the exact node exists but is deeper.
        assert_eq!(name(&r, "edge", &[("key2", "value3")]), None);
        assert_eq!(
            name(&r, "edge", &[("key2", "value3"), ("subkey3", "a")]).as_deref(),
            Some("key2_value3_subkey3")
        );
    }

    #[test]
    fn the_glob_matches_stars_anywhere() {
        for (p, v, m) in [
            ("*", "", true),
            ("*", "anything", true),
            ("a*", "a", true),
            ("a*", "abc", true),
            ("a*", "ba", false),
            ("*c", "abc", true),
            ("a*c", "abbbc", true),
            ("a*c", "abcd", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXcYb", false),
            ("/api/*/users", "/api/v1/users", true),
            ("/api/*/users", "/api/v1/users/1", false),
            ("abc", "abc", true),
            ("abc", "abd", false),
            ("**", "x", true),
        ] {
            assert_eq!(glob(p, v), m, "{p} vs {v}");
        }
    }

    #[test]
    fn a_shared_wildcard_counts_every_value_in_one_bucket() {
        let r = rules(YAML);
        let m = find(&r.domains["edge"], &[("path", "/api/v2/orders")]).unwrap();
        assert_eq!(m.shared_pattern, Some("/api/*"));
        let a = store_key("edge", &[("path", "/api/v2/orders")], m.shared_pattern);
        let b = store_key("edge", &[("path", "/api/v3/x")], m.shared_pattern);
        assert_eq!(a, b);
        // Not shared: each value its own bucket.
        let m = find(&r.domains["edge"], &[("path", "/api/v2/users")]).unwrap();
        assert_eq!(m.shared_pattern, None);
    }

    #[test]
    fn store_keys_never_collide_and_stay_in_one_slot() {
        let a = store_key("d", &[("a:b", "c")], None);
        let b = store_key("d", &[("a", "b:c")], None);
        assert_ne!(a, b);
        assert_ne!(
            store_key("d", &[("k", "v}x")], None),
            store_key("d", &[("k", "v")], None)
        );
        let long = "x".repeat(500);
        let k = store_key("d", &[("k", &long)], None);
        assert!(k.len() < 64, "{k}");
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        assert_eq!(
            store_key("edge", &[("k", "v"), ("s", "t")], None),
            "rl:{rls:edge:k=v:s=t}"
        );
    }
}
