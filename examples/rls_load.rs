//! A load client for the Envoy rate limit service: `ShouldRateLimit` calls
//! over gRPC, as Envoy's ratelimit filter makes them, on one HTTP/2
//! connection per worker task. Prints decisions per second and latency
//! percentiles as one line of `key=value` pairs for bench/rls.sh.
//!
//!   cargo run --release --example rls_load -- ADDR SECONDS CONCURRENCY KEYS
//!
//! Each call asks one descriptor (`tenant`, one of KEYS values, chosen
//! round-robin) in domain `bench`.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, secs, concurrency, keys] = args.as_slice() else {
        return Err("usage: rls_load ADDR SECONDS CONCURRENCY KEYS".into());
    };
    let secs: u64 = secs.parse()?;
    let concurrency: usize = concurrency.parse()?;
    let keys: usize = keys.parse()?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}")).await?;
        tasks.push(tokio::spawn(async move {
            let mut latencies_us: Vec<u32> = Vec::with_capacity(1 << 16);
            let (mut over, mut errors) = (0u64, 0u64);
            let mut i = worker;
            while Instant::now() < deadline {
                let request = RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "tenant".into(),
                            value: format!("t{}", i % keys.max(1)),
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 0,
                };
                i += concurrency;
                let started = Instant::now();
                match client.should_rate_limit(request).await {
                    Ok(r) => {
                        latencies_us.push(started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                        if r.into_inner().overall_code == Code::OverLimit as i32 {
                            over += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            (latencies_us, over, errors)
        }));
    }
    let started = Instant::now();
    let (mut all, mut over, mut errors) = (Vec::new(), 0u64, 0u64);
    for t in tasks {
        let (l, o, e) = t.await?;
        all.extend(l);
        over += o;
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    all.sort_unstable();
    let pct = |p: f64| -> f64 {
        if all.is_empty() {
            return 0.0;
        }
        let i = ((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1;
        f64::from(all[i]) / 1_000.0
    };
    println!(
        "decisions={} per_sec={:.0} over_limit={} errors={} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3}",
        all.len(),
        all.len() as f64 / elapsed,
        over,
        errors,
        pct(0.50),
        pct(0.99),
        pct(0.999),
    );
    Ok(())
}
