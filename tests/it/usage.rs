//! A usage route: the caller's own state under some limits, as JSON, read
//! live from the store and consuming nothing; itself under its own limits.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::support::redis::Redis;
use crate::support::{check, client, Gateway, Toml};

/// `[leasing] max`: the most one instance leases at once.
const MAX_LEASE: u64 = 10;

fn toml(store: &str) -> Toml {
    toml_with(store, "usage_calls", "3/min")
}

/// The usage route's own limit: `own`, at `rate`.
fn toml_with(store: &str, own: &str, rate: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .raw(store)
        .table("leasing", &format!("max = {MAX_LEASE}"))
        .raw("[[identity.api_keys]]\nkey = \"k-acme\"\ntenant = \"acme\"")
        .respond("api", "/api", &["per_key", "monthly"])
        .raw(&format!(
            "[[routes]]\nname = \"usage\"\npath_prefix = \"/v1/usage\"\nusage = [\"per_key\", \"monthly\"]\nlimits = [\"{own}\"]"
        ))
        .limit("per_key", "5/min")
        .limit("monthly", "100/month")
        .with("algorithm = \"fixed_window\"")
        .limit(own, rate)
}

async fn get(gw: &Gateway, path: &str) -> (u16, String) {
    let mut c = client::http1(gw.http()).await;
    let req = Request::builder()
        .uri(path)
        .header("host", "gw")
        .header("x-api-key", "k-acme")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = client::text(client::send(&mut c, req).await).await;
    (status.as_u16(), body)
}

async fn usage_reports_without_consuming(gw: &Gateway) {
    for _ in 0..2 {
        assert_eq!(get(gw, "/api").await.0, 200);
    }
    for _ in 0..2 {
        let (status, body) = get(gw, "/v1/usage").await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["identity"], "key:acme", "{v}");
        let per_key = &v["limits"][0];
        assert_eq!(
            (
                &per_key["name"],
                &per_key["limit"],
                &per_key["remaining"],
                &per_key["window"],
                &per_key["debt"]
            ),
            (&"per_key".into(), &5.into(), &3.into(), &60.into(), &0.into()),
            "{v}"
        );
        let reset = per_key["reset"].as_u64().unwrap();
        assert!((1..=60).contains(&reset), "{v}");
        let monthly = &v["limits"][1];
        assert_eq!(
            (&monthly["limit"], &monthly["remaining"]),
            (&100.into(), &98.into()),
            "{v}"
        );
        assert!(monthly["window"].as_u64().unwrap() >= 28 * 86_400, "{v}");
    }
    // Nothing was consumed: the API still has its 3.
    for _ in 0..3 {
        assert_eq!(get(gw, "/api").await.0, 200);
    }
    assert_eq!(get(gw, "/api").await.0, 429);
    // The usage route is limited by its own limits (3/min: two used).
    assert_eq!(get(gw, "/v1/usage").await.0, 200);
    assert_eq!(get(gw, "/v1/usage").await.0, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_route_reports_remaining_and_reset_without_consuming_on_memory() {
    let gw = Gateway::start(&toml(""));
    usage_reports_without_consuming(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_route_reads_the_store_on_redis() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
    let gw = Gateway::start_connected(&toml(&store));
    usage_reports_without_consuming(&gw).await;
    // Another instance, which holds nothing for acme, reads the store (its
    // usage route under a limit of its own: the first one's is spent).
    let other = Gateway::start_connected(&toml_with(&store, "usage_other", "100/min"));
    let (_, body) = get(&other, "/v1/usage").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["limits"][0]["remaining"], 0, "{v}");
    // 95 are left; the first instance may still hold a lease of them,
    // which the store does not count (the documented low reading).
    let monthly = v["limits"][1]["remaining"].as_u64().unwrap();
    assert!((95 - MAX_LEASE..=95).contains(&monthly), "{v}");
}

#[test]
fn check_names_a_usage_route_without_a_known_limit_or_with_an_upstream() {
    let base = "[listeners]\nhttp = \"127.0.0.1:0\"\n[[limits]]\nname = \"l\"\nrate = \"1/s\"\n[[routes]]\nname = \"u\"\npath_prefix = \"/u\"\n";
    let (code, _, err, _dir) = check(&format!("{base}usage = [\"nope\"]\n"));
    assert_ne!(code, 0);
    assert!(
        err.contains("routes[0].usage") && err.contains("unknown limit \"nope\""),
        "{err}"
    );
    let (code, _, err, _dir) = check(&format!("{base}usage = [\"l\"]\nresponse = {{ status = 200 }}\n"));
    assert_ne!(code, 0);
    assert!(err.contains("set usage, upstream or response, one of them"), "{err}");
    let (code, _, err, _dir) = check(&format!("{base}usage = [\"l\"]\n"));
    assert_ne!(code, 0);
    assert!(err.contains("give it limits of its own"), "{err}");
    let (code, out, err, _dir) = check(&format!("{base}usage = [\"l\"]\nlimits = [\"l\"]\n"));
    assert_eq!(code, 0, "{out}{err}");
}
