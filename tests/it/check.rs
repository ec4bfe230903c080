//! Configs good and broken: every error names the file, the line, the key
//! and what is wrong. Most cases parse the text in process with
//! `leasegate::config::parse`, what `leasegate check` runs; a few run the
//! `leasegate check` binary itself, for its exit codes and what it prints.

use std::path::Path;

use crate::support::{self, TempDir};

const BASE: &str = r#"[listeners]
http = "127.0.0.1:0"

[[upstreams]]
name = "backend"
targets = ["http://127.0.0.1:9000"]

[[routes]]
name = "api"
path_prefix = "/"
upstream = "backend"
limits = ["per_client"]

[[limits]]
name = "per_client"
rate = "100/min"
"#;

/// Parses `text` as `gateway.toml` in a directory of its own, as
/// `leasegate check` reads it: the summary `check` prints, or the error
/// text it prints (one problem a line).
fn parse(text: &str) -> Result<String, String> {
    let dir = TempDir::new();
    let path = dir.write("gateway.toml", text);
    leasegate::config::parse(&path, text)
        .map(|c| c.summary())
        .map_err(|e| e.to_string())
}

/// The summary of a valid `text`.
fn accepted(text: &str) -> String {
    parse(text).unwrap_or_else(|e| panic!("expected a valid config:\n{e}"))
}

/// The error text of an invalid `text`.
fn error(text: &str) -> String {
    match parse(text) {
        Ok(summary) => panic!("expected an invalid config:\n{summary}"),
        Err(e) => e,
    }
}

/// Asserts `text` is invalid on `line`, naming `key`, with `reason` in
/// the message.
fn refused(text: &str, line: usize, key: &str, reason: &str) {
    let err = error(text);
    let want = format!("gateway.toml:{line}: {key}: ");
    let hit = err.lines().find(|l| l.contains(&want));
    let hit = hit.unwrap_or_else(|| panic!("no line with {want:?} in:\n{err}"));
    assert!(hit.contains(reason), "{hit:?} should say {reason:?}");
}

/// Runs the `leasegate check` binary on `text` and asserts it exits 1,
/// naming `line` and `key` with `reason`, and saying nothing was applied.
fn check_refuses(text: &str, line: usize, key: &str, reason: &str) {
    let (code, stdout, stderr, _dir) = support::check(text);
    assert_eq!(code, 1, "expected exit 1\nstdout: {stdout}\nstderr: {stderr}");
    let want = format!("gateway.toml:{line}: {key}: ");
    let hit = stderr.lines().find(|l| l.contains(&want));
    let hit = hit.unwrap_or_else(|| panic!("no line with {want:?} in:\n{stderr}"));
    assert!(hit.contains(reason), "{hit:?} should say {reason:?}");
    assert!(stderr.contains("invalid, nothing applied"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn the_base_config_is_valid_and_summarised() {
    let (code, stdout, stderr, _dir) = support::check(BASE);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("OK (sha256 "), "{stdout}");
    assert!(
        stdout.contains("route     api / -> upstream backend, limits per_client"),
        "{stdout}"
    );
    assert!(
        stdout.contains("limit     per_client token_bucket 100/min burst 100"),
        "{stdout}"
    );
}

#[test]
fn the_shipped_configs_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let valid = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        if let Err(e) = leasegate::config::parse(path, &text) {
            panic!("{}: {e}", path.display());
        }
    };
    valid(&root.join("gateway.toml"));
    // The compose file mounts certs/ next to the config, as in the container.
    let dir = TempDir::new();
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    for f in ["dev.crt", "dev.key"] {
        std::fs::copy(root.join("certs").join(f), dir.path().join("certs").join(f)).unwrap();
    }
    // And the admin token compose makes at the first start, in the volume
    // mounted at secrets/ (none is committed).
    assert!(
        !root.join("docker/admin.token").exists(),
        "an admin token is committed in docker/: compose makes one at the first start"
    );
    let compose = std::fs::read_to_string(root.join("docker/docker-compose.yml")).unwrap();
    assert!(
        compose.contains("/dev/urandom") && compose.contains("admin-token:/etc/leasegate/secrets:ro"),
        "{compose}"
    );
    std::fs::create_dir(dir.path().join("secrets")).unwrap();
    dir.write("secrets/admin.token", "0123456789abcdef0123456789abcdef\n");
    let docker = std::fs::read_to_string(root.join("docker/gateway.toml")).unwrap();
    valid(&dir.write("gateway.toml", &docker));
}

#[test]
fn unknown_key() {
    check_refuses(
        &BASE.replace("path_prefix = \"/\"", "path_prefix = \"/\"\npath_prefx = \"/v1\""),
        11,
        "routes[0].path_prefx",
        "unknown key `path_prefx`, did you mean `path_prefix`?",
    );
}

#[test]
fn misspelled_tables_are_named_once_with_the_nearest_name() {
    refused(
        &BASE.replace("[listeners]", "[listener]"),
        1,
        "listener",
        "unknown table `listener`, did you mean `listeners`?",
    );
    let err = error(&BASE.replace("[listeners]", "[listener]"));
    assert!(!err.contains("listener.listener"), "{err}");
    refused(
        &BASE.replace("[[routes]]", "[[route]]"),
        8,
        "route",
        "did you mean `routes`?",
    );
    refused(
        &format!("{BASE}\n[store.breakr]\nfailures = 2\n"),
        18,
        "store.breakr",
        "unknown table `breakr`, did you mean `breaker`?",
    );
    // A name without its unit.
    refused(
        &format!("{BASE}\n[store]\ntimeout = 5\n"),
        19,
        "store.timeout",
        "unknown key `timeout`, did you mean `timeout_ms`?",
    );
    // Far from every known name: no guess, but the names that are known.
    refused(
        &format!("{BASE}\n[store]\nfrobnicate = 1\n"),
        19,
        "store.frobnicate",
        "unknown key `frobnicate` (known here: backend, url,",
    );
}

#[test]
fn an_unknown_key_in_an_inline_table_names_its_path() {
    let text =
        format!("{BASE}\n[[routes]]\nname = \"x\"\npath_prefix = \"/x\"\nresponse = {{ status = 200, bdy = \"x\" }}\n");
    refused(&text, 21, "routes[1].response.bdy", "did you mean `body`?");
}

/// Numbers out of range, negative ones included, name the key with its
/// index and the allowed range, never a Rust type.
#[test]
fn numbers_out_of_range_say_the_range_in_words() {
    let second = format!("{BASE}\n[[limits]]\nname = \"b\"\nrate = \"10/s\"\n");
    for (text, line, key, reason) in [
        (
            format!("{BASE}shards = -5\n"),
            17,
            "limits[0].shards",
            "-5 is out of range: use 1 to 1000",
        ),
        (
            format!("{second}shards = -5\n"),
            21,
            "limits[1].shards",
            "-5 is out of range: use 1 to 1000",
        ),
        (
            format!("{second}burst = -1\n"),
            21,
            "limits[1].burst",
            "-1 is out of range: use 1 or more",
        ),
        (
            format!("{second}burst = 0\n"),
            21,
            "limits[1].burst",
            "0 is out of range: use 1 or more",
        ),
        (
            format!("{second}canary_percent = 300\n"),
            21,
            "limits[1].canary_percent",
            "300 is out of range: use 0 to 100",
        ),
        (
            format!("{BASE}\n[store]\ntimeout_ms = -5\n"),
            19,
            "store.timeout_ms",
            "-5 is out of range: use 1 to 60000",
        ),
        (
            format!("{BASE}\n[identity]\nipv4_prefix = -1\n"),
            19,
            "identity.ipv4_prefix",
            "-1 is out of range: use 0 to 32",
        ),
        (
            format!("{BASE}\n[gateway]\nworkers = -2\n"),
            19,
            "gateway.workers",
            "-2 is out of range: use 1 to 1024",
        ),
        (
            format!("{BASE}\n[gateway]\nmin_body_rate = -1\n"),
            19,
            "gateway.min_body_rate",
            "-1 is out of range: use 0 to 1073741824",
        ),
        (
            BASE.replace(
                "name = \"backend\"",
                "name = \"backend\"\nmax_in_flight = 10\nmax_in_flight_per_client = 11",
            ),
            7,
            "upstreams[0].max_in_flight_per_client",
            "11 is out of range: use 1 to 10",
        ),
        (
            BASE.replace("name = \"backend\"", "name = \"backend\"\nconnect_timeout_ms = -1"),
            6,
            "upstreams[0].connect_timeout_ms",
            "-1 is out of range: use 1 to 3600000",
        ),
        (
            format!("{BASE}\n[[routes]]\nname = \"x\"\npath_prefix = \"/x\"\nresponse = {{ status = -1 }}\n"),
            21,
            "routes[1].response.status",
            "-1 is not a final HTTP status: use 200 to 599",
        ),
    ] {
        refused(&text, line, key, reason);
        let err = error(&text);
        for rust in ["u64", "u32", "u16", "u8", "i64", "usize", "integer `"] {
            assert!(!err.contains(rust), "{rust:?} in {err}");
        }
    }
}

#[test]
fn syntax_error() {
    refused(
        &BASE.replace("name = \"backend\"", "name = \"backend"),
        5,
        "upstreams[0].name",
        "",
    );
}

#[test]
fn wrong_type() {
    refused(
        &format!("{BASE}burst = \"ten\"\n"),
        17,
        "limits[0].burst",
        "expected a whole number, found string \"ten\"",
    );
    refused(
        &format!("{BASE}by = \"ip\"\n"),
        17,
        "limits[0].by",
        "expected a list such as [\"a\", \"b\"], found string \"ip\"",
    );
}

#[test]
fn unknown_upstream() {
    refused(
        &BASE.replace("upstream = \"backend\"", "upstream = \"nope\""),
        11,
        "routes[0].upstream",
        "unknown upstream \"nope\" (known: backend)",
    );
}

#[test]
fn unknown_limit() {
    refused(
        &BASE.replace("limits = [\"per_client\"]", "limits = [\"per_clent\"]"),
        12,
        "routes[0].limits",
        "unknown limit \"per_clent\"",
    );
}

#[test]
fn empty_targets() {
    refused(
        &BASE.replace("targets = [\"http://127.0.0.1:9000\"]", "targets = []"),
        6,
        "upstreams[0].targets",
        "has no targets",
    );
}

#[test]
fn bad_target() {
    refused(
        &BASE.replace("http://127.0.0.1:9000", "http://127.0.0.1:9000/base"),
        6,
        "upstreams[0].targets",
        "no path",
    );
}

#[test]
fn zero_rate() {
    refused(&BASE.replace("100/min", "0/min"), 16, "limits[0].rate", "at least 1");
}

#[test]
fn bad_rate_unit() {
    refused(
        &BASE.replace("100/min", "100/fortnight"),
        16,
        "limits[0].rate",
        "unknown period",
    );
}

#[test]
fn duplicate_route_name() {
    let text = format!("{BASE}\n[[routes]]\nname = \"api\"\npath_prefix = \"/x\"\nresponse = {{ status = 200 }}\n");
    refused(&text, 19, "routes[1].name", "duplicate route name \"api\"");
}

#[test]
fn duplicate_limit_name() {
    refused(
        &format!("{BASE}\n[[limits]]\nname = \"per_client\"\nrate = \"1/s\"\n"),
        19,
        "limits[1].name",
        "duplicate limit name",
    );
}

#[test]
fn invalid_cidr() {
    refused(
        &format!("{BASE}\n[identity]\ntrusted_proxies = [\"10.0.0.0/33\"]\n"),
        19,
        "identity.trusted_proxies[0]",
        "not a CIDR",
    );
}

#[test]
fn invalid_socket_address() {
    refused(
        &BASE.replace("127.0.0.1:0", "localhost:http"),
        2,
        "listeners.http",
        "not a socket address",
    );
}

#[test]
fn https_without_tls() {
    refused(
        &BASE.replace("http = \"127.0.0.1:0\"", "https = \"127.0.0.1:0\""),
        2,
        "listeners.https",
        "needs a [tls] section",
    );
}

#[test]
fn missing_certificate_file() {
    let text = BASE.replace(
        "http = \"127.0.0.1:0\"",
        "https = \"127.0.0.1:0\"\n\n[tls]\ncert = \"nope.crt\"\nkey = \"nope.key\"",
    );
    refused(&text, 5, "tls.cert", "nope.crt");
}

#[test]
fn bad_mode_and_by_part_are_both_reported() {
    let text = format!("{BASE}mode = \"strict\"\nby = [\"identity\", \"cookie\"]\n");
    refused(&text, 17, "limits[0].mode", "unknown mode \"strict\"");
    refused(&text, 18, "limits[0].by", "unknown key part \"cookie\"");
}

#[test]
fn route_needs_exactly_one_action() {
    let text = BASE.replace(
        "upstream = \"backend\"\n",
        "upstream = \"backend\"\nresponse = { status = 200 }\n",
    );
    refused(&text, 8, "routes[0]", "not both");
}

#[test]
fn missing_listeners_section() {
    let err = error("[[routes]]\nname = \"x\"\npath_prefix = \"/\"\nresponse = { status = 200 }\n");
    assert!(err.contains("listeners") && err.contains("missing field"), "{err}");
}

#[test]
fn unreadable_file() {
    let (code, _, stderr) = support::check_path(Path::new("/nonexistent/gateway.toml"));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("/nonexistent/gateway.toml: cannot read the file"),
        "{stderr}"
    );
}

#[test]
fn run_refuses_an_invalid_config_before_listening() {
    let dir = TempDir::new();
    let path = dir.write("gateway.toml", &BASE.replace("100/min", "100"));
    let out = std::process::Command::new(support::binary())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("limits[0].rate"));
}

#[test]
fn shards_must_leave_every_sub_bucket_a_token() {
    refused(
        &format!("{BASE}shards = 200\n"),
        17,
        "limits[0].shards",
        "200 sub-buckets for a quota of 100",
    );
    refused(
        &format!("{BASE}shard_by = \"ip\"\n"),
        17,
        "limits[0].shard_by",
        "applies only with shards > 1",
    );
    refused(
        &format!("{BASE}shards = 4\nshard_by = \"moon\"\n"),
        18,
        "limits[0].shard_by",
        "unknown shard_by \"moon\"",
    );
    let stdout = accepted(&format!(
        "{BASE}shards = 4\nshard_by = \"identity\"\nfallback_rate = \"10/min\"\n"
    ));
    assert!(
        stdout.contains(
            "limit     per_client token_bucket 100/min burst 100 (enforce), 4 shards by identity, fallback 10/min"
        ),
        "{stdout}"
    );
}

#[test]
fn bad_fallback_rate() {
    refused(
        &format!("{BASE}fallback_rate = \"5/fortnight\"\n"),
        17,
        "limits[0].fallback_rate",
        "unknown period",
    );
}

#[test]
fn redis_addresses_the_client_cannot_dial_are_refused() {
    let store = |lines: &str| format!("{BASE}\n[store]\nbackend = \"redis\"\n{lines}\n");
    refused(
        &store("url = \"rediss://:hunter2@redis.example:6380/#insecure\""),
        20,
        "store.url",
        "the certificate is always verified (no #insecure)",
    );
    let err = error(&store("url = \"rediss://:hunter2@redis.example:6380/#insecure\""));
    assert!(!err.contains("hunter2"), "passwords never reach the terminal: {err}");
    refused(
        &store("url = \"rediss://redis.example:6380\"\nca = \"no-such-ca.pem\""),
        21,
        "store.ca",
        "cannot read",
    );
    refused(
        &store("cluster = [\"redis+unix:///tmp/r.sock\"]"),
        20,
        "store.cluster",
        "cluster seeds must be redis://host:port",
    );
    refused(&store("url = \"redis://\""), 20, "store.url", "\"redis://\"");
    refused(
        &format!("{BASE}\n[store.breaker]\nfailures = 0\n"),
        19,
        "store.breaker.failures",
        "",
    );
    accepted(&store(
        "url = \"redis://127.0.0.1:6379/0\"\nfleet_size = 3\ntimeout_ms = 5\n[store.breaker]\nfailures = 5\nopen_ms = 500",
    ));
}

#[test]
fn sentinel_needs_its_master_name_and_excludes_url_and_cluster() {
    let store = |lines: &str| format!("{BASE}\n[store]\nbackend = \"redis\"\n{lines}\n");
    refused(
        &store("sentinel = [\"redis://127.0.0.1:26379\"]"),
        20,
        "store.sentinel_master",
        "sentinel needs sentinel_master",
    );
    refused(
        &store("url = \"redis://127.0.0.1:6379\"\nsentinel = [\"redis://127.0.0.1:26379\"]\nsentinel_master = \"m\""),
        21,
        "store.sentinel",
        "set one of url (one node), cluster (seeds) or sentinel",
    );
    refused(
        &store("sentinel_master = \"m\"\nurl = \"redis://127.0.0.1:6379\""),
        20,
        "store.sentinel_master",
        "is set but sentinel",
    );
    refused(
        &store("sentinel = []\nsentinel_master = \"m\""),
        20,
        "store.sentinel",
        "list at least one sentinel",
    );
    refused(
        &store("sentinel = [\"redis+unix:///tmp/s.sock\"]\nsentinel_master = \"m\""),
        20,
        "store.sentinel[0]",
        "sentinels must be redis://host:port",
    );
    refused(
        &store("sentinel = [\"redis://127.0.0.1:26379/3\"]\nsentinel_master = \"m\""),
        20,
        "store.sentinel[0]",
        "a sentinel has no databases",
    );
    refused(
        &store("sentinel = [\"redis://127.0.0.1:26379\", \"redis://127.0.0.1:26379\"]\nsentinel_master = \"m\""),
        20,
        "store.sentinel[1]",
        "is listed twice",
    );
    let text = store(
        "sentinel = [\"redis://:hunter2@127.0.0.1:26379\", \"rediss://:hunter2@s2:26379/#insecure\"]\nsentinel_master = \"m\"",
    );
    refused(&text, 20, "store.sentinel[1]", "the certificate is always verified");
    let err = error(&text);
    assert!(!err.contains("hunter2"), "passwords never reach the terminal: {err}");
    refused(
        &format!("{BASE}\n[store]\nsentinel_master = \"m\"\n"),
        19,
        "store.sentinel_master",
        "is set but backend is not \"redis\"",
    );
    let stdout = accepted(&store(
        "sentinel = [\"redis://127.0.0.1:26379\", \"redis://127.0.0.1:26380\"]\nsentinel_master = \"mymaster\"",
    ));
    assert!(
        stdout.contains("store     redis sentinel, master \"mymaster\" (2 sentinels)"),
        "{stdout}"
    );
}

#[test]
fn a_generous_fallback_on_a_fail_open_redis_route_is_named() {
    let redis = |limit_lines: &str, fleet: u64| {
        format!("{BASE}{limit_lines}\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nfleet_size = {fleet}\n")
    };
    // 40/min on each of 3 instances: 120/min while Redis is away, over 100/min.
    let (code, stdout, stderr, _dir) = support::check(&redis("fallback_rate = \"40/min\"", 3));
    assert_eq!(code, 0, "a warning, not an error: {stderr}");
    assert!(
        stdout.contains("warning   limit per_client: fallback_rate 40/min on each of 3 instance(s)"),
        "{stdout}"
    );
    assert!(stdout.contains("fail-open route(s): api"), "{stdout}");
    // 30/min on 3: within the quota. The default fallback: never named.
    for lines in ["fallback_rate = \"30/min\"", ""] {
        let (code, stdout, _, _dir) = support::check(&redis(lines, 3));
        assert_eq!(code, 0);
        assert!(!stdout.contains("warning"), "{stdout}");
    }
    // The memory store has no fallback to speak of.
    let (_, stdout, _, _dir) = support::check(&format!("{BASE}fallback_rate = \"500/min\"\n"));
    assert!(!stdout.contains("warning"), "{stdout}");
}

#[test]
fn a_negative_events_interval_names_its_range() {
    refused(
        &format!("{BASE}\n[events]\ndogstatsd = \"127.0.0.1:8125\"\nmin_interval_ms = -5\n"),
        20,
        "events.min_interval_ms",
        "-5 is out of range: use 100 to 86400000",
    );
}

#[test]
fn region_problems_name_their_line_and_key() {
    // BASE is 16 lines; [region] is on line 18, its keys from 19.
    let region = |body: &str| format!("{BASE}\n[region]\n{body}");
    let ok = "name = \"eu-central\"\nshare = 0.3\nlink = \"127.0.0.1:9911\"\nprimary = \"http://127.0.0.1:9921\"\n";
    let stdout = accepted(&region(ok));
    assert!(
        stdout.contains(
            "region    eu-central: share 0.3 of every limit, link 127.0.0.1:9911, primary http://127.0.0.1:9921/"
        ),
        "{stdout}"
    );
    refused(
        &region(&ok.replace("0.3", "0")),
        20,
        "region.share",
        "use a fraction above 0 and at most 1",
    );
    refused(
        &region(&ok.replace("127.0.0.1:9911", "eu.internal")),
        21,
        "region.link",
        "is not an address",
    );
    refused(
        &region(&ok.replace("http://127.0.0.1:9921", "127.0.0.1:9921")),
        22,
        "region.primary",
        "is not a URL",
    );
    refused(
        &region(&format!("{ok}rebalance_at = 1.5\n")),
        23,
        "region.rebalance_at",
        "out of range",
    );
    refused(
        &region(&format!("{ok}rebalance_window_ms = 0\n")),
        23,
        "region.rebalance_window_ms",
        "out of range",
    );
    // Shorter than four link timeouts: no time to retry a lost answer.
    refused(
        &region(&format!("{ok}rebalance_window_ms = 2000\n")),
        23,
        "region.rebalance_window_ms",
        "2000 is out of range: use 10000 to 86400000",
    );
    refused(
        &region(&format!("{ok}weight = 1\n")),
        23,
        "region.weight",
        "unknown key",
    );
}

/// `[leasing] reserve` is a boolean, on unless set to false (a rolling
/// upgrade from a version without reservations turns it off).
#[test]
fn leasing_reserve_is_a_boolean_on_by_default() {
    let dir = TempDir::new();
    let off = format!("{BASE}[leasing]\nreserve = false\n");
    let path = dir.write("gateway.toml", &off);
    let config = leasegate::config::parse(&path, &off).unwrap();
    assert!(!config.limiter_settings().reserve);
    let default = leasegate::config::parse(&path, BASE).unwrap();
    assert!(default.limiter_settings().reserve);
    let err = error(&format!("{BASE}[leasing]\nreserve = \"yes\"\n"));
    assert!(err.contains("leasing.reserve"), "{err}");
}

/// On the memory store a lease looks ahead at least its TTL (a fleet of
/// one: nobody else waits for its tokens); a shared store, and the
/// simulator's fleet on any config, keep `lookahead_ms` as written.
#[test]
fn the_embedded_store_leases_for_the_ttl_and_a_shared_one_as_configured() {
    let dir = TempDir::new();
    let lookahead = |text: &str| {
        let path = dir.write("gateway.toml", text);
        let config = leasegate::config::parse(&path, text).unwrap();
        (
            config.limiter_settings().sizing.lookahead_ms,
            config.shared_limiter_settings().sizing.lookahead_ms,
        )
    };
    assert_eq!(lookahead(BASE), (1_000, 250), "memory, defaults");
    let longer_ttl = format!("{BASE}[leasing]\nttl_ms = 3000\nlookahead_ms = 100\n");
    assert_eq!(lookahead(&longer_ttl), (3_000, 100));
    let longer_lookahead = format!("{BASE}[leasing]\nlookahead_ms = 5000\n");
    assert_eq!(lookahead(&longer_lookahead), (5_000, 5_000));
    let redis = format!("{BASE}\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n");
    assert_eq!(lookahead(&redis), (250, 250), "a shared store: as configured");
}

#[test]
fn keys_of_the_wrong_type_or_name_are_all_listed_at_once() {
    let text = "[gateway]\nworkers = \"two\"\nmax_connections = 100\n\n[listeners]\nhttp = \"127.0.0.1:0\"\nhtps = \"127.0.0.1:1\"\n\n[[limits]]\nname = \"a\"\nrate = \"5/s\"\nburst = \"ten\"\n\n[[limits]]\nname = \"b\"\nrate = \"5/s\"\nmode = 3\n";
    let err = error(text);
    let located: Vec<&str> = err.lines().filter(|l| l.contains("gateway.toml:")).collect();
    assert_eq!(located.len(), 4, "{err}");
    refused(text, 2, "gateway.workers", "expected a whole number");
    refused(text, 7, "listeners.htps", "did you mean `https`?");
    refused(text, 12, "limits[0].burst", "expected a whole number");
    refused(text, 17, "limits[1].mode", "expected a string");
    // A syntax error is the one problem: past it nothing reads reliably.
    let err = error("[gateway]\nworkers = \n[listeners]\nhtps = 1\n");
    assert_eq!(err.lines().filter(|l| l.contains("gateway.toml:")).count(), 1, "{err}");
}

/// The planes' TLS and secrets, each refused with its key and a reason:
/// half a pair, a CA without a certificate, the link's TLS without the CA
/// it verifies both ways by, a primary whose scheme does not match, a
/// short secret, and an `[identity] order` that does not end in subnet.
#[test]
fn the_planes_tls_and_secrets_are_checked() {
    let ca = support::TestCa::new("check CA");
    let cert = ca.issue("gw.test");
    let dir = TempDir::new();
    dir.write("gw.pem", &cert.cert_pem);
    dir.write("gw.key", &cert.key_pem);
    dir.write("ca.pem", &ca.cert_pem);
    dir.write("short.secret", "tooshort");
    dir.write(
        "ratelimit.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    );
    let check = |extra: &str| {
        let text = format!("{BASE}{extra}");
        let path = dir.write("gateway.toml", &text);
        leasegate::config::parse(&path, &text)
            .map(|c| c.summary())
            .map_err(|e| e.to_string())
    };
    let rls = "\n[rls]\nlisten = \"127.0.0.1:0\"\nconfig = \"ratelimit.yaml\"\n";
    let err = check(&format!("{rls}tls_cert = \"gw.pem\"\n")).unwrap_err();
    assert!(err.contains("rls: set tls_cert and tls_key together"), "{err}");
    let err = check(&format!("{rls}client_ca = \"ca.pem\"\n")).unwrap_err();
    assert!(err.contains("rls.client_ca: needs tls_cert and tls_key"), "{err}");
    check(&format!(
        "{rls}tls_cert = \"gw.pem\"\ntls_key = \"gw.key\"\nclient_ca = \"ca.pem\"\nworkers = 2\n"
    ))
    .unwrap();
    let region = "\n[region]\nname = \"eu\"\nshare = 0.5\nlink = \"127.0.0.1:0\"\n";
    let err = check(&format!("{region}tls_cert = \"gw.pem\"\ntls_key = \"gw.key\"\n")).unwrap_err();
    assert!(err.contains("region.client_ca: missing"), "{err}");
    let tls = "tls_cert = \"gw.pem\"\ntls_key = \"gw.key\"\nclient_ca = \"ca.pem\"\n";
    let err = check(&format!("{region}{tls}primary = \"http://127.0.0.1:9\"\n")).unwrap_err();
    assert!(
        err.contains("with tls_cert and tls_key the link speaks https://"),
        "{err}"
    );
    let err = check(&format!("{region}primary = \"https://127.0.0.1:9\"\n")).unwrap_err();
    assert!(
        err.contains("without tls_cert and tls_key the link speaks plain http://"),
        "{err}"
    );
    check(&format!("{region}{tls}primary = \"https://127.0.0.1:9\"\n")).unwrap();
    let err = check(&format!("{region}id_secret_file = \"short.secret\"\n")).unwrap_err();
    assert!(
        err.contains("region.id_secret_file") && err.contains("at least 16 characters"),
        "{err}"
    );
    let err = check("\n[identity]\norder = [\"key\", \"subnet\", \"user\"]\n").unwrap_err();
    assert!(err.contains("end the list with \"subnet\""), "{err}");
    let err = check("\n[identity]\norder = [\"key\", \"key\", \"subnet\"]\n").unwrap_err();
    assert!(err.contains("\"key\" is listed twice"), "{err}");
}

#[test]
fn an_open_plane_is_named_and_strict_refuses_it() {
    let ca = support::TestCa::new("check CA");
    let cert = ca.issue("gw.test");
    let dir = TempDir::new();
    dir.write("gw.pem", &cert.cert_pem);
    dir.write("gw.key", &cert.key_pem);
    dir.write("ca.pem", &ca.cert_pem);
    dir.write("ratelimit.yaml", "domain: d\n");
    let check = |extra: &str| support::check_path(&dir.write("gateway.toml", &format!("{BASE}{extra}")));
    let rls = |listen: &str| format!("\n[rls]\nlisten = \"{listen}\"\nconfig = \"ratelimit.yaml\"\n");

    // Cleartext RLS on every address: a warning, exit 0.
    let (code, stdout, stderr) = check(&rls("0.0.0.0:8081"));
    assert_eq!(code, 0, "a warning, not an error: {stderr}");
    let warnings: Vec<&str> = stdout.lines().filter(|l| l.starts_with("warning")).collect();
    assert_eq!(
        warnings,
        [
            "warning   rls: [rls] listen 0.0.0.0:8081 is beyond loopback, cleartext and unauthenticated: whoever \
          reaches it is served; set tls_cert, tls_key and client_ca, or listen on a loopback address \
          ([gateway] strict = true refuses this)"
        ],
        "{stdout}"
    );
    // Encrypted, but any peer: still open.
    let (_, stdout, _) = check(&format!(
        "{}tls_cert = \"gw.pem\"\ntls_key = \"gw.key\"\n",
        rls("0.0.0.0:8081")
    ));
    assert!(
        stdout.contains(
            "warning   rls: [rls] listen 0.0.0.0:8081 is beyond loopback, unauthenticated (TLS without client_ca)"
        ),
        "{stdout}"
    );
    // Peers verified, or loopback: nothing to say.
    let mtls = "tls_cert = \"gw.pem\"\ntls_key = \"gw.key\"\nclient_ca = \"ca.pem\"\n";
    for extra in [format!("{}{mtls}", rls("0.0.0.0:8081")), rls("127.0.0.1:8081")] {
        let (code, stdout, stderr) = check(&extra);
        assert_eq!(code, 0, "{stderr}");
        assert!(!stdout.contains("warning"), "{extra}: {stdout}");
    }
    // The region link too.
    let region = "\n[region]\nname = \"eu\"\nshare = 0.5\nlink = \"0.0.0.0:9911\"\n";
    let (code, stdout, _) = check(region);
    assert_eq!(code, 0);
    assert!(
        stdout.contains(
            "warning   region link: [region] link 0.0.0.0:9911 is beyond loopback, cleartext and unauthenticated"
        ),
        "{stdout}"
    );
    // strict = true: refused, at the address's line, nothing applied.
    let (code, stdout, stderr) = check(&format!("\n[gateway]\nstrict = true\n{}", rls("0.0.0.0:8081")));
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stderr.contains(
            "gateway.toml:22: rls.listen: 0.0.0.0:8081 is beyond loopback, cleartext and unauthenticated, \
             and [gateway] strict = true refuses an open plane"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("invalid, nothing applied"), "{stderr}");
    let (code, _, stderr) = check(&format!("\n[gateway]\nstrict = true\n{}{mtls}", rls("0.0.0.0:8081")));
    assert_eq!(code, 0, "{stderr}");
}

/// `allow_subjects` names the certificates a plane accepts: without
/// `client_ca` there is no verified certificate to read a name from.
#[test]
fn allow_subjects_needs_a_client_ca() {
    let text = format!(
        "{BASE}\n[region]\nname = \"eu\"\nshare = 0.5\nlink = \"127.0.0.1:9911\"\nallow_subjects = [\"us-east.link\"]\n"
    );
    let line = text.lines().position(|l| l.starts_with("allow_subjects")).unwrap() + 1;
    check_refuses(&text, line, "region.allow_subjects", "needs client_ca");
}
