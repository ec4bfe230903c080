use super::*;
use http::HeaderName;
use http::HeaderValue;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn resolver() -> Resolver {
    Resolver {
        trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
        ipv4_prefix: 24,
        ipv6_prefix: 64,
        api_keys: vec![ApiKey {
            sha256: Sha256::digest(b"secret-1").into(),
            id: None,
            tenant: Some("acme".into()),
            plan: Some("enterprise".into()),
        }]
        .into(),
        reject_invalid: false,
        max_token_bytes: 0,
        order: Vec::new(),
        jwt: Some(Arc::new(jwt::Verifier::new(jwt::Settings {
            algorithms: vec![jsonwebtoken::Algorithm::HS256],
            keys: vec![jwt::Keys::Secret(b"s3cret".to_vec())],
            issuer: None,
            audience: None,
            tenant_claim: Some("tenant".into()),
            plan_claim: None,
            rate_claims: vec![],
            leeway_secs: 0,
        }))),
    }
}

fn bearer(claims: serde_json::Value) -> HeaderMap {
    let key = jsonwebtoken::EncodingKey::from_secret(b"s3cret");
    let t = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
    headers(&[("authorization", &format!("Bearer {t}")), ("x-api-key", "secret-1")])
}

#[test]
fn a_verified_jwt_wins_and_a_bad_one_falls_through_or_is_refused() {
    let exp = (crate::clock::unix_ms() / 1000) + 600;
    let r = resolver();
    let id = r
        .resolve(
            &bearer(serde_json::json!({"sub": "alice", "exp": exp, "tenant": "t1"})),
            conn("198.51.100.1"),
            0,
        )
        .unwrap();
    assert_eq!(
        (id.tier, id.value.as_str(), id.tenant.as_deref()),
        (Tier::User, "user:alice", Some("t1"))
    );
    // Expired: the API key sent alongside is the next tier.
    let expired = bearer(serde_json::json!({"sub": "alice", "exp": exp - 7_200}));
    assert_eq!(r.resolve(&expired, conn("198.51.100.1"), 0).unwrap().value, "key:acme");
    let strict = Resolver {
        reject_invalid: true,
        ..resolver()
    };
    assert!(matches!(
        strict.resolve(&expired, conn("198.51.100.1"), 0),
        Err(Rejection::InvalidToken(_))
    ));
}

fn conn(peer: &str) -> Connection<'static> {
    Connection {
        peer: peer.parse().unwrap(),
        ja4: None,
        client_cert: None,
    }
}

#[test]
fn subnet_values_are_what_display_writes() {
    for net in [
        "0.0.0.0/0",
        "10.0.0.0/8",
        "198.51.100.0/24",
        "255.255.255.255/32",
        "1.20.100.0/22",
        "2001:db8::/64",
    ] {
        let net: IpNet = net.parse().unwrap();
        assert_eq!(subnet_value(&net), format!("subnet:{net}"));
    }
    for a in 0..=255u8 {
        let net = IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(a, 255 - a, a / 3, 0), 24).unwrap());
        assert_eq!(subnet_value(&net), format!("subnet:{net}"));
    }
}

#[test]
fn subnets_aggregate_to_the_configured_prefix() {
    let r = resolver();
    let id = r.resolve(&HeaderMap::new(), conn("198.51.100.77"), 0).unwrap();
    assert_eq!((id.tier, id.value.as_str()), (Tier::Subnet, "subnet:198.51.100.0/24"));
    let id = r.resolve(&HeaderMap::new(), conn("::ffff:198.51.100.77"), 0).unwrap();
    assert_eq!(id.value, "subnet:198.51.100.0/24");
    let id = r.resolve(&HeaderMap::new(), conn("2001:db8:1:2:3:4:5:6"), 0).unwrap();
    assert_eq!(id.value, "subnet:2001:db8:1:2::/64");
}

#[test]
fn forwarded_for_is_believed_only_from_trusted_proxies() {
    let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
    let h = headers(&[("x-forwarded-for", "203.0.113.9, 10.1.1.1")]);
    assert_eq!(
        client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
        "203.0.113.9"
    );
    // An untrusted peer's header is ignored: the client cannot pick.
    assert_eq!(
        client_ip("198.51.100.1".parse().unwrap(), &h, &trusted).to_string(),
        "198.51.100.1"
    );
    // The right-most untrusted hop wins over anything a client prepended.
    let h = headers(&[
        ("x-forwarded-for", "1.1.1.1, 203.0.113.9"),
        ("x-forwarded-for", "10.9.9.9"),
    ]);
    assert_eq!(
        client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
        "203.0.113.9"
    );
    // Garbage stops the walk at the last trusted address.
    let h = headers(&[("x-forwarded-for", "not-an-ip, 10.3.3.3")]);
    assert_eq!(
        client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
        "10.3.3.3"
    );
    let h = headers(&[("x-forwarded-for", "[2001:db8::7]:443, 192.0.2.1:5555")]);
    assert_eq!(
        client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
        "192.0.2.1"
    );
    assert_eq!(
        client_ip("10.2.2.2".parse().unwrap(), &HeaderMap::new(), &trusted).to_string(),
        "10.2.2.2"
    );
    // A non-ASCII byte in a client's own part does not hide the hops a
    // proxy appended to the same line.
    let mut h = HeaderMap::new();
    h.insert(
        "x-forwarded-for",
        http::HeaderValue::from_bytes(b"\xff\xfe, 203.0.113.9, 10.1.1.1").unwrap(),
    );
    assert_eq!(
        client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
        "203.0.113.9"
    );
}

#[test]
fn many_api_keys_are_each_found_and_a_stranger_is_not() {
    let keys: Vec<ApiKey> = (0..5_000)
        .map(|i| ApiKey {
            sha256: Sha256::digest(format!("key-{i}").as_bytes()).into(),
            id: Some(format!("k{i}").into()),
            tenant: None,
            plan: None,
        })
        .collect();
    let r = Resolver {
        api_keys: keys.into(),
        ..resolver()
    };
    assert_eq!(r.api_keys.len(), 5_000);
    for i in [0, 1, 2_500, 4_999] {
        let presented = format!("key-{i}");
        assert_eq!(
            r.find_key(presented.as_bytes()).and_then(|k| k.id.as_deref()),
            Some(format!("k{i}").as_str())
        );
    }
    assert!(r.find_key(b"key-5000").is_none());
}

#[test]
fn api_keys_from_either_header_and_only_if_known() {
    let r = resolver();
    for h in [
        headers(&[("x-api-key", "secret-1")]),
        headers(&[("authorization", "Bearer secret-1")]),
    ] {
        let id = r.resolve(&h, conn("198.51.100.1"), 0).unwrap();
        assert_eq!((id.tier, id.value.as_str()), (Tier::Key, "key:acme"));
        assert_eq!(id.plan.as_deref(), Some("enterprise"));
        assert_eq!(id.tenant.as_deref(), Some("acme"));
    }
    let unknown = headers(&[("x-api-key", "guess")]);
    assert_eq!(r.resolve(&unknown, conn("198.51.100.1"), 0).unwrap().tier, Tier::Subnet);
    let strict = Resolver {
        reject_invalid: true,
        ..resolver()
    };
    assert_eq!(
        strict.resolve(&unknown, conn("198.51.100.1"), 0),
        Err(Rejection::UnknownApiKey)
    );
    // A JWT-shaped bearer is not an API key: verified as a JWT if JWTs
    // are configured (and refused if invalid), else ignored.
    let jwt = headers(&[("authorization", "Bearer aaa.bbb.ccc")]);
    assert!(matches!(
        strict.resolve(&jwt, conn("198.51.100.1"), 0),
        Err(Rejection::InvalidToken(_))
    ));
    let no_jwt = Resolver {
        jwt: None,
        ..strict.clone()
    };
    assert_eq!(
        no_jwt.resolve(&jwt, conn("198.51.100.1"), 0).unwrap().tier,
        Tier::Subnet
    );
}

/// The fingerprint is a key of limits and a field of the access log: the
/// same client must keep the same value across versions.
#[test]
fn a_fingerprint_is_the_same_as_it_was() {
    let r = resolver();
    let conn = |peer: &str| Connection {
        peer: peer.parse().unwrap(),
        ja4: Some("t13d1516h2_8daaf6152771_d8a2da3f94cd"),
        client_cert: None,
    };
    let h = headers(&[("host", "x"), ("user-agent", "a"), ("accept", "*/*")]);
    assert_eq!(
        r.resolve(&h, conn("198.51.100.1"), 0).unwrap().value,
        "fingerprint:d623ae10ec83b52c"
    );
    assert_eq!(
        r.resolve(&h, conn("2001:db8::1"), 0).unwrap().value,
        "fingerprint:5f24cb580d6891cc"
    );
}

#[test]
fn fingerprints_split_a_nat_by_header_order_and_never_merge_networks() {
    let r = resolver();
    let tls = |peer: &str| Connection {
        peer: peer.parse().unwrap(),
        ja4: Some("t13d1516h2_8daaf6152771_d8a2da3f94cd"),
        client_cert: None,
    };
    let a = headers(&[("host", "x"), ("user-agent", "a"), ("accept", "*/*")]);
    let b = headers(&[("host", "x"), ("accept", "*/*"), ("user-agent", "a")]);
    let id_a = r.resolve(&a, tls("198.51.100.1"), 0).unwrap();
    assert_eq!(id_a.tier, Tier::Fingerprint);
    assert!(id_a.value.starts_with("fingerprint:") && id_a.value.len() == "fingerprint:".len() + 16);
    assert_eq!(
        id_a.value,
        r.resolve(&a, tls("198.51.100.200"), 0).unwrap().value,
        "same client software, same NAT"
    );
    assert_ne!(
        id_a.value,
        r.resolve(&b, tls("198.51.100.1"), 0).unwrap().value,
        "other header order"
    );
    assert_ne!(
        id_a.value,
        r.resolve(&a, tls("203.0.113.1"), 0).unwrap().value,
        "other network"
    );
}

#[test]
fn an_oversized_credential_is_refused_before_any_check() {
    let r = resolver();
    let long = "a".repeat(DEFAULT_MAX_TOKEN_BYTES + 1);
    let c = conn("192.0.2.1");
    for h in [
        headers(&[("authorization", &format!("Bearer {long}"))]),
        headers(&[("x-api-key", &long)]),
    ] {
        assert_eq!(
            r.resolve(&h, c, 0).unwrap_err(),
            Rejection::TooLong {
                max: DEFAULT_MAX_TOKEN_BYTES
            }
        );
    }
    let fits = "a".repeat(DEFAULT_MAX_TOKEN_BYTES - 7);
    assert!(r
        .resolve(&headers(&[("authorization", &format!("Bearer {fits}"))]), c, 0)
        .is_ok());
}

#[test]
fn tiers_round_trip() {
    for t in [Tier::User, Tier::Key, Tier::Fingerprint, Tier::Subnet] {
        assert_eq!(Tier::parse(t.name()), Some(t));
    }
    assert_eq!(Tier::parse("ip"), None);
}

#[test]
fn a_verified_client_certificate_is_a_tier_where_the_order_puts_it() {
    let r = Resolver {
        order: vec![Tier::User, Tier::Key, Tier::Cert, Tier::Fingerprint, Tier::Subnet],
        ..resolver()
    };
    let conn = |cert: Option<&'static str>| Connection {
        peer: "198.51.100.1".parse().unwrap(),
        ja4: Some("t13d1516h2_8daaf6152771_d8a2da3f94cd"),
        client_cert: cert,
    };
    let plain = headers(&[("host", "x")]);
    let id = r.resolve(&plain, conn(Some("envoy-1.edge")), 0).unwrap();
    assert_eq!((id.tier, id.value.as_str()), (Tier::Cert, "cert:envoy-1.edge"));
    // Above it, an API key still wins; below it, no certificate falls on
    // to the fingerprint.
    let keyed = headers(&[("host", "x"), ("x-api-key", "secret-1")]);
    assert_eq!(
        r.resolve(&keyed, conn(Some("envoy-1.edge")), 0).unwrap().tier,
        Tier::Key
    );
    let id = r.resolve(&plain, conn(None), 0).unwrap();
    assert_eq!(id.tier, Tier::Fingerprint);
    let why: Vec<Tier> = r
        .passed_over(&plain, conn(None), 0, id.tier)
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(why, [Tier::User, Tier::Key, Tier::Cert]);
    // Without `order`, a certificate changes nothing.
    let default = resolver();
    assert_eq!(
        default.resolve(&plain, conn(Some("envoy-1.edge")), 0).unwrap().tier,
        Tier::Fingerprint
    );
    // An order may drop tiers: here only certificates and subnets count.
    let strict = Resolver {
        order: vec![Tier::Cert, Tier::Subnet],
        ..resolver()
    };
    assert_eq!(strict.resolve(&keyed, conn(None), 0).unwrap().tier, Tier::Subnet);
}

/// The fingerprint's buffer hands over what it gathered whenever it is
/// full: however the pieces fall (many headers, one name longer than the
/// buffer), the digest is the one of all the bytes at once.
#[test]
fn gathered_bytes_hash_as_they_would_at_once() {
    use std::fmt::Write as _;
    for sizes in [
        &[][..],
        &[0, 1, 511],
        &[512],
        &[511, 2],
        &[300, 300, 300],
        &[513, 1, 2000, 7],
        &[20; 100],
    ] {
        let mut gathered = super::Gathered::default();
        let mut all = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let piece: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
            gathered.put(&piece);
            all.extend_from_slice(&piece);
        }
        let _ = write!(gathered, "10.0.{}.0/24", sizes.len());
        all.extend_from_slice(format!("10.0.{}.0/24", sizes.len()).as_bytes());
        let want: [u8; 32] = Sha256::digest(&all).into();
        assert_eq!(gathered.digest(), want, "{sizes:?}");
    }
}

/// The waterfall skips reading the key headers when no key is configured
/// and none would be refused: the answer is the one reading them gives.
/// Under `reject_invalid`, a key is still read, and refused, with no keys
/// configured at all.
#[test]
fn without_keys_a_presented_key_falls_through_unless_refused() {
    let keyless = Resolver {
        api_keys: Vec::<ApiKey>::new().into(),
        jwt: None,
        ..resolver()
    };
    let presented = headers(&[("x-api-key", "secret-1")]);
    let id = keyless.resolve(&presented, conn("198.51.100.1"), 0).unwrap();
    assert_eq!((id.tier, id.value.as_str()), (Tier::Subnet, "subnet:198.51.100.0/24"));
    let strict = Resolver {
        reject_invalid: true,
        ..keyless
    };
    assert_eq!(
        strict.resolve(&presented, conn("198.51.100.1"), 0),
        Err(Rejection::UnknownApiKey)
    );
    assert_eq!(
        strict.resolve(&headers(&[]), conn("198.51.100.1"), 0).unwrap().tier,
        Tier::Subnet
    );
}
