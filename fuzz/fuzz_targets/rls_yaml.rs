//! The RLS rules YAML (`config::rls::parse_into`) on arbitrary text, and
//! the descriptor lookup over the rules it yields (`rls::matcher`).
//!
//! Properties: nothing panics (the line index that locates each problem
//! reads every input, parsed or not); rules that parse hold exactly one domain,
//! and the same file read again is refused as a duplicate domain; walking
//! the rules with descriptors made from their own keys, values and
//! wildcards (`*` dropped, which the wildcard must match) never panics, and
//! the store key of a match names the `rls` limit, as the region link
//! requires (`region::wire::key_limit`).
#![no_main]

use leasegate::config::rls::{parse_into, Level, RlsRules};
use leasegate::region::wire::key_limit;
use leasegate::rls::matcher::{find, glob, store_key};
use libfuzzer_sys::fuzz_target;

/// One descriptor entry that reaches a node of `level` (smallest key first,
/// for a walk that does not depend on hash order), and that node's children.
fn step(level: &Level) -> Option<((String, String), &Level)> {
    if let Some(key) = level.exact.keys().min() {
        let values = &level.exact[key];
        let value = values.keys().min()?;
        return Some(((key.clone(), value.clone()), &values[value].children));
    }
    if let Some((key, pattern, node)) = level.wildcards.first() {
        let value = pattern.replace('*', "");
        assert!(glob(pattern, &value), "{pattern:?} does not match {value:?}");
        assert!(glob(pattern, pattern), "{pattern:?} does not match itself");
        return Some(((key.clone(), value), &node.children));
    }
    let key = level.any.keys().min()?;
    Some(((key.clone(), "v".to_string()), &level.any[key].children))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut rules = RlsRules::default();
    if parse_into(&mut rules, "fuzz.yaml", text).is_err() {
        return;
    }
    assert_eq!(rules.domains.len(), 1);
    let _ = rules.limit_count();
    assert!(
        parse_into(&mut rules, "again.yaml", text).is_err(),
        "the same domain accepted twice"
    );
    let (domain, top) = rules.domains.iter().next().expect("one domain");
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut level = top;
    // Bounded: YAML nesting is, but a cap keeps one input cheap.
    while entries.len() < 64 {
        let Some((entry, children)) = step(level) else {
            break;
        };
        entries.push(entry);
        let refs: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if let Some(m) = find(top, &refs) {
            let _ = m.limit.spec();
            let key = store_key(domain, &refs, m.shared_pattern);
            if key.len() <= 1024 {
                assert_eq!(key_limit(&key), Some("rls"), "store key {key:?}");
            }
        }
        level = children;
    }
});
