use super::*;

fn parse(text: &str) -> Result<RlsRules, Vec<Problem>> {
    let mut rules = RlsRules::default();
    parse_into(&mut rules, "ratelimit.yaml", text).map(|()| rules)
}

#[test]
fn reads_envoyproxy_ratelimit_yaml() {
    let rules = parse(
        "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n  - key: database\n    value: default\n    rate_limit:\n      unit: Second\n      requests_per_unit: 500\n      algorithm: token_bucket\n  - key: remote_address\n    rate_limit:\n      unlimited: true\n  - key: path\n    value: /foo/*\n    shadow_mode: true\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n      name: foo\n      replaces:\n        - name: bar\n",
    )
    .unwrap();
    let d = &rules.domains["mongo_cps"];
    let users = d.exact["database"]["users"].limit.clone().unwrap();
    assert_eq!((users.requests_per_unit, users.unit), (500, Unit::Second));
    assert_eq!(users.algorithm, Algorithm::FixedWindow);
    assert_eq!(users.full_key, "mongo_cps.database_users");
    let default = d.exact["database"]["default"].limit.clone().unwrap();
    assert_eq!(default.algorithm, Algorithm::TokenBucket);
    assert!(d.any["remote_address"].limit.as_ref().unwrap().unlimited);
    let (k, v, n) = &d.wildcards[0];
    assert_eq!((k.as_str(), v.as_str()), ("path", "/foo/*"));
    let foo = n.limit.clone().unwrap();
    assert!(foo.shadow_mode);
    assert_eq!(foo.replaces, vec!["bar".to_string()]);
    assert_eq!(rules.limit_count(), 4);
}

#[test]
fn every_unit_in_any_case() {
    for (u, secs) in [
        ("second", 1),
        ("MINUTE", 60),
        ("Hour", 3_600),
        ("day", 86_400),
        ("week", 604_800),
        ("month", 2_592_000),
        ("year", 31_536_000),
    ] {
        let rules = parse(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: {u}\n      requests_per_unit: 1\n"
        ))
        .unwrap();
        let l = rules.domains["d"].any["k"].limit.clone().unwrap();
        assert_eq!(l.unit.seconds(), secs);
        assert_eq!(l.spec().period_ms(), secs * 1_000);
    }
}

fn problems(text: &str) -> Vec<String> {
    parse(text).unwrap_err().iter().map(ToString::to_string).collect()
}

#[test]
fn refuses_what_envoyproxy_ratelimit_refuses_with_file_and_line() {
    let p = problems("domain: d\ndescriptors:\n  - key: k\n    colour: red\n");
    assert!(
        p[0].starts_with("ratelimit.yaml:4: descriptors[0].colour: unknown field `colour`"),
        "{p:?}"
    );
    assert!(p[0].contains("unknown field"), "{p:?}");
    let p = problems(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    );
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with("ratelimit.yaml:5: descriptors[0].rate_limit.unit: invalid rate limit unit \"fortnight\""),
        "{p:?}"
    );
    let p =
        problems("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      unlimited: true\n");
    assert!(
        p[0].contains("should not specify rate limit unit when unlimited"),
        "{p:?}"
    );
    let p = problems("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n");
    assert!(p[0].contains("duplicate descriptor composite key \"d.k_v\""), "{p:?}");
    let p = problems("descriptors:\n  - key: k\n");
    assert!(p[0].contains("empty domain"), "{p:?}");
    let p = problems("domain: d\ndescriptors:\n  - value: v\n");
    assert!(p[0].contains("descriptor has empty key"), "{p:?}");
    let p = problems("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: a\n      replaces:\n        - name: a\n");
    assert!(
        p[0].contains("replaces should not contain name of same descriptor"),
        "{p:?}"
    );
    let p = problems("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky\n");
    assert!(
        p[0].starts_with("ratelimit.yaml:7: descriptors[0].rate_limit.algorithm"),
        "{p:?}"
    );
    let p = problems(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n",
    );
    assert!(p[0].starts_with("ratelimit.yaml:6"), "{p:?}");
    let p = problems("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: year\n      requests_per_unit: 1000000\n      algorithm: token_bucket\n");
    assert!(
        p[0].starts_with("ratelimit.yaml:6: descriptors[0].rate_limit.requests_per_unit"),
        "{p:?}"
    );
    assert!(parse(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: year\n      requests_per_unit: 1000000\n"
    )
    .is_ok());
    let p = problems("domain: [\n");
    assert!(p[0].starts_with("ratelimit.yaml:"), "{p:?}");
}

#[test]
fn accepts_what_envoyproxy_ratelimit_accepts() {
    // Keys of its flat list in other places, explicit nulls.
    let rules = parse(
        "domain: d\ndescriptors:\n  - key: k\n    value:\n    name: ignored\n    descriptors:\n    rate_limit:\n      unit: second\n      requests_per_unit: 3\n      shadow_mode: true\n      replaces:\n",
    )
    .unwrap();
    let l = rules.domains["d"].any["k"].limit.clone().unwrap();
    assert_eq!((l.requests_per_unit, l.shadow_mode), (3, false));
}

#[test]
fn a_domain_is_defined_once() {
    let mut rules = RlsRules::default();
    parse_into(&mut rules, "a.yaml", "domain: d\n").unwrap();
    let p = parse_into(&mut rules, "b.yaml", "domain: d\n").unwrap_err();
    assert_eq!(p[0].to_string(), "b.yaml:1: domain: duplicate domain \"d\"");
}

#[test]
fn every_problem_has_its_own_line_and_a_typo_its_nearest_name() {
    let p = problems(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n  - key: b\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 3\n  - key: c\n    rate_limit:\n      unit: hour\n      requests_per_unit: 3\n      algorithm: leaky\n",
    );
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(
        p[0].starts_with("ratelimit.yaml:9: descriptors[1].rate_limit.unit"),
        "{p:?}"
    );
    assert!(
        p[1].starts_with("ratelimit.yaml:15: descriptors[2].rate_limit.algorithm"),
        "{p:?}"
    );
    // Unknown keys: every one, each at its line, compared with the names
    // that mean something where it is.
    let p = problems(
        "domain: d\ndescriptors:\n  - key: c\n    rate_limt:\n      unit: hour\n  - key: d\n    rate_limit:\n      unit: hour\n      requests_per_unti: 3\n      colour: red\n",
    );
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(
        p[0].starts_with(
            "ratelimit.yaml:4: descriptors[0].rate_limt: unknown field `rate_limt`, did you mean `rate_limit`?"
        ),
        "{p:?}"
    );
    assert!(
        p[1].starts_with("ratelimit.yaml:9: descriptors[1].rate_limit.requests_per_unti: unknown field `requests_per_unti`, did you mean `requests_per_unit`? (known here: requests_per_unit, unit, unlimited, name, replaces, algorithm)"),
        "{p:?}"
    );
    assert!(
        p[2].starts_with("ratelimit.yaml:10: descriptors[1].rate_limit.colour"),
        "{p:?}"
    );
    assert!(!p[2].contains("did you mean"), "{p:?}");
}

#[test]
fn the_longest_unit_is_found_over_every_domain_read() {
    let mut rules = RlsRules::default();
    parse_into(&mut rules, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: u\n    rate_limit: {unlimited: true}\n").unwrap();
    assert_eq!(rules.longest_unit, Some(Unit::Minute));
    parse_into(&mut rules, "b.yaml", "domain: b\ndescriptors:\n  - key: k\n    descriptors:\n      - key: n\n        rate_limit: {unit: day, requests_per_unit: 1}\n").unwrap();
    assert_eq!(rules.longest_unit, Some(Unit::Day), "a nested rule of another domain");
}
