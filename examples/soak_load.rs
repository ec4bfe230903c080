//! The load and the upstream of bench/soak.sh: mixed traffic with churning
//! identities, for as long as a soak lasts.
//!
//!   soak_load upstream PORT_FILE
//!   soak_load load --http ADDR --https ADDR --ca CERT.pem --secret S --seconds N
//!                  [--conns 32] [--streams 2] [--rate 2000] [--subnets 64] [--window 10]
//!
//! `upstream`: an HTTP/1.1 server on 127.0.0.1, a free port (written to
//! PORT_FILE, and printed), answering every request `200 ok`, until killed.
//!
//! `load`: `--conns` connections, half HTTP/1.1 keep-alive on the plain
//! listener, half HTTP/2 over TLS on the https listener (trusting the PEM
//! certificate `--ca`, for the name `localhost`), each HTTP/2 connection
//! carrying `--streams` requests at once. Every lane (an HTTP/1.1 connection,
//! or one stream of an HTTP/2 connection) sends one request at a time, paced
//! so that all lanes together offer `--rate` requests per second (a lane
//! that falls behind skips its missed slots rather than catching up in a
//! burst; `--rate 0`: as fast as answers come). Each connection is closed
//! after 200 to 2000 requests and opened again from another source address,
//! 127.0.S.H with S one of `--subnets` values: the `subnet` key part and
//! the subnet and fingerprint identities churn with the connections.
//!
//! Requests: 70 % `GET /api/items/N` (a route forwarding to an upstream),
//! 30 % `GET /direct/ping` (a route answered by the gateway). Credentials:
//! - 55 %: an unknown `X-API-Key` (falls through to the fingerprint or
//!   subnet tier): half of them fresh (never seen before), half drawn from
//!   a pool of 500 that is replaced every minute;
//! - 10 %: one of the four keys bench/soak.sh configures (`soak-key-0` to
//!   `soak-key-3`; key 0 is on plan `gold`);
//! - 25 %: an HS256 JWT signed with `--secret`, `sub` `uN` from a growing
//!   set: a new `sub` for one JWT request in four, else one of the last
//!   20 000 made; claim `tid` = `tN % 50` (the tenant);
//! - 10 %: none.
//!
//! Every request carries `x-tenant`: `t-hot` for 5 %, else `tN` with N
//! random below 2000.
//!
//! Every `--window` seconds one JSON line on stdout: elapsed seconds,
//! requests answered and per second, counts by status class (`2xx`, `429`,
//! `503`, `other`) and transport `errors` (of which `timeouts`: no answer
//! within 5 s), p50/p99/max latency over the window (request sent to body
//! read, answered requests only), the same per route (`api`, `direct`) and
//! per protocol (`h1`, `h2`), and connections opened and failed. Then a
//! last line with `"final": true` and the whole run's counts and worst
//! latency. Exits 0 at the end whatever the answers were; only bad
//! arguments make it fail.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A request with no answer by then is counted a timeout and its
/// connection is replaced.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match args.first().map(String::as_str) {
        Some("upstream") if args.len() == 2 => runtime.block_on(upstream(&args[1])),
        Some("load") => {
            let opts = Opts::parse(&args[1..])?;
            runtime.block_on(load(opts))
        }
        _ => Err(
            "usage: soak_load upstream PORT_FILE | soak_load load --http ADDR --https ADDR \
                  --ca CERT.pem --secret S --seconds N [--conns N] [--streams N] [--rate N] \
                  [--subnets N] [--window S]"
                .into(),
        ),
    }
}

// ---------------------------------------------------------------- upstream

async fn upstream(port_file: &str) -> Result<(), Error> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    let tmp = format!("{port_file}.tmp");
    std::fs::write(&tmp, format!("{port}\n"))?;
    std::fs::rename(&tmp, port_file)?;
    println!("upstream listening on 127.0.0.1:{port}");
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
            });
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

// ---------------------------------------------------------------- options

struct Opts {
    http: SocketAddr,
    https: SocketAddr,
    ca: String,
    secret: String,
    seconds: u64,
    conns: usize,
    streams: usize,
    rate: f64,
    subnets: u8,
    window: u64,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, Error> {
        let mut o = Opts {
            http: "127.0.0.1:0".parse()?,
            https: "127.0.0.1:0".parse()?,
            ca: String::new(),
            secret: String::new(),
            seconds: 0,
            conns: 32,
            streams: 2,
            rate: 2000.0,
            subnets: 64,
            window: 10,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--http" => o.http = value.parse()?,
                "--https" => o.https = value.parse()?,
                "--ca" => o.ca = value.clone(),
                "--secret" => o.secret = value.clone(),
                "--seconds" => o.seconds = value.parse()?,
                "--conns" => o.conns = value.parse()?,
                "--streams" => o.streams = value.parse()?,
                "--rate" => o.rate = value.parse()?,
                "--subnets" => o.subnets = value.parse()?,
                "--window" => o.window = value.parse()?,
                _ => return Err(format!("unknown option {flag}").into()),
            }
        }
        if o.ca.is_empty() || o.secret.is_empty() || o.seconds == 0 {
            return Err("--ca, --secret and --seconds are required".into());
        }
        if o.conns < 2 || o.streams == 0 || o.subnets == 0 || o.window == 0 {
            return Err("--conns must be at least 2; --streams, --subnets and --window at least 1".into());
        }
        Ok(o)
    }
}

// ---------------------------------------------------------------- statistics

#[derive(Clone, Copy)]
enum Route {
    Api,
    Direct,
}

#[derive(Clone, Copy)]
enum Proto {
    H1,
    H2,
}

enum Outcome {
    Status(StatusCode),
    Timeout,
    Failed,
}

#[derive(Default, Clone)]
struct Counts {
    ok: u64,
    limited: u64,
    unavailable: u64,
    other: u64,
    errors: u64,
    timeouts: u64,
}

impl Counts {
    fn add(&mut self, o: &Outcome) {
        match o {
            Outcome::Status(s) if s.is_success() => self.ok += 1,
            Outcome::Status(s) if *s == StatusCode::TOO_MANY_REQUESTS => self.limited += 1,
            Outcome::Status(s) if *s == StatusCode::SERVICE_UNAVAILABLE => self.unavailable += 1,
            Outcome::Status(_) => self.other += 1,
            Outcome::Timeout => {
                self.errors += 1;
                self.timeouts += 1
            }
            Outcome::Failed => self.errors += 1,
        }
    }
    fn answered(&self) -> u64 {
        self.ok + self.limited + self.unavailable + self.other
    }
    fn merge(&mut self, o: &Counts) {
        self.ok += o.ok;
        self.limited += o.limited;
        self.unavailable += o.unavailable;
        self.other += o.other;
        self.errors += o.errors;
        self.timeouts += o.timeouts;
    }
    fn json(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("requests".into(), json!(self.answered()));
        m.insert("2xx".into(), json!(self.ok));
        m.insert("429".into(), json!(self.limited));
        m.insert("503".into(), json!(self.unavailable));
        m.insert("other".into(), json!(self.other));
        m.insert("errors".into(), json!(self.errors));
        m.insert("timeouts".into(), json!(self.timeouts));
        m
    }
}

/// Latencies in microseconds, one per answered request.
#[derive(Default)]
struct Samples(Vec<u32>);

impl Samples {
    fn pct(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_unstable();
        let i = ((self.0.len() as f64 * p).ceil() as usize).clamp(1, self.0.len()) - 1;
        f64::from(self.0[i]) / 1000.0
    }
    fn max(&self) -> f64 {
        self.0.iter().max().map_or(0.0, |m| f64::from(*m) / 1000.0)
    }
}

#[derive(Default)]
struct Window {
    all: Counts,
    lat: Samples,
    api: (Counts, Samples),
    direct: (Counts, Samples),
    h1: (Counts, Samples),
    h2: (Counts, Samples),
    connects: u64,
    connect_errors: u64,
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn part(c: &Counts, s: &mut Samples) -> Value {
    let mut m = c.json();
    m.insert("p50_ms".into(), json!(round3(s.pct(0.50))));
    m.insert("p99_ms".into(), json!(round3(s.pct(0.99))));
    m.insert("max_ms".into(), json!(round3(s.max())));
    Value::Object(m)
}

// ---------------------------------------------------------------- load

struct Ctx {
    opts: Opts,
    tls: tokio_rustls::TlsConnector,
    jwt_key: jsonwebtoken::EncodingKey,
    jwt_exp: u64,
    started: Instant,
    deadline: Instant,
    /// Time between two requests of one lane; zero: no pacing.
    interval: Duration,
    fresh_keys: AtomicU64,
    subs: AtomicU64,
    connect_failures: AtomicU64,
    window: Mutex<Window>,
}

impl Ctx {
    fn done(&self) -> bool {
        Instant::now() >= self.deadline
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, proto: Proto, route: Route, outcome: &Outcome, took: Duration) {
        let us = took.as_micros().min(u128::from(u32::MAX)) as u32;
        let answered = matches!(outcome, Outcome::Status(_));
        let mut w = self.window();
        w.all.add(outcome);
        let (rc, rs) = match route {
            Route::Api => &mut w.api,
            Route::Direct => &mut w.direct,
        };
        rc.add(outcome);
        if answered {
            rs.0.push(us);
        }
        let (pc, ps) = match proto {
            Proto::H1 => &mut w.h1,
            Proto::H2 => &mut w.h2,
        };
        pc.add(outcome);
        if answered {
            ps.0.push(us);
            w.lat.0.push(us);
        }
    }

    fn connected(&self, failed: Option<&Error>) {
        let mut w = self.window();
        match failed {
            None => w.connects += 1,
            Some(e) => {
                w.connect_errors += 1;
                // The first few on stderr, then one in a thousand.
                let n = self.connect_failures.fetch_add(1, Ordering::Relaxed);
                if n < 5 || n.is_multiple_of(1000) {
                    eprintln!("connect failed ({} so far): {e}", n + 1);
                }
            }
        }
    }

    /// A source address on loopback: 127.0.S.H, S one of `subnets` values.
    fn source(&self) -> SocketAddr {
        let s = fastrand::u8(0..self.opts.subnets);
        let h = fastrand::u8(1..255);
        SocketAddr::from((Ipv4Addr::new(127, 0, s, h), 0))
    }

    fn request(&self, proto: Proto) -> (Route, Request<Full<Bytes>>) {
        let route = if fastrand::f32() < 0.7 {
            Route::Api
        } else {
            Route::Direct
        };
        let path = match route {
            Route::Api => format!("/api/items/{}", fastrand::u32(0..100_000)),
            Route::Direct => "/direct/ping".to_string(),
        };
        let mut b = match proto {
            // HTTP/2 needs the scheme and authority in the URI.
            Proto::H2 => Request::get(format!("https://localhost:{}{path}", self.opts.https.port())),
            Proto::H1 => Request::get(path).header("host", "localhost"),
        };
        let tenant = if fastrand::f32() < 0.05 {
            "t-hot".to_string()
        } else {
            format!("t{}", fastrand::u32(0..2000))
        };
        b = b.header("x-tenant", tenant);
        let r = fastrand::f32();
        if r < 0.55 {
            let key = if fastrand::bool() {
                format!("fresh-{}", self.fresh_keys.fetch_add(1, Ordering::Relaxed))
            } else {
                let minute = self.started.elapsed().as_secs() / 60;
                format!("rot-{minute}-{}", fastrand::u32(0..500))
            };
            b = b.header("x-api-key", key);
        } else if r < 0.65 {
            b = b.header("x-api-key", format!("soak-key-{}", fastrand::u8(0..4)));
        } else if r < 0.90 {
            let n = if fastrand::u8(0..4) == 0 {
                self.subs.fetch_add(1, Ordering::Relaxed)
            } else {
                let made = self.subs.load(Ordering::Relaxed).max(1);
                fastrand::u64(made.saturating_sub(20_000)..made)
            };
            let claims = json!({"sub": format!("u{n}"), "tid": format!("t{}", n % 50), "exp": self.jwt_exp});
            if let Ok(token) = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &self.jwt_key) {
                b = b.header("authorization", format!("Bearer {token}"));
            }
        }
        let req = b
            .body(Full::new(Bytes::new()))
            .unwrap_or_else(|_| Request::new(Full::new(Bytes::new())));
        (route, req)
    }
}

/// One lane's schedule.
struct Pacer {
    next: tokio::time::Instant,
    interval: Duration,
}

impl Pacer {
    fn new(interval: Duration) -> Pacer {
        // A random phase, so that the lanes do not fire together.
        let phase = interval.mul_f64(fastrand::f64());
        Pacer {
            next: tokio::time::Instant::now() + phase,
            interval,
        }
    }
    async fn wait(&mut self) {
        if self.interval.is_zero() {
            return;
        }
        let now = tokio::time::Instant::now();
        if self.next + self.interval < now {
            self.next = now; // behind: skip the missed slots
        }
        tokio::time::sleep_until(self.next).await;
        self.next += self.interval;
    }
}

async fn dial(ctx: &Ctx, to: SocketAddr) -> Result<TcpStream, Error> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(ctx.source())?;
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, socket.connect(to)).await??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

async fn connect_h1(ctx: &Ctx) -> Result<http1::SendRequest<Full<Bytes>>, Error> {
    let stream = dial(ctx, ctx.opts.http).await?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn connect_h2(ctx: &Ctx) -> Result<http2::SendRequest<Full<Bytes>>, Error> {
    let stream = dial(ctx, ctx.opts.https).await?;
    let name = ServerName::try_from("localhost")?;
    let tls = tokio::time::timeout(REQUEST_TIMEOUT, ctx.tls.connect(name, stream)).await??;
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Sends one request and reads its whole answer.
async fn exchange<F>(send: F) -> Outcome
where
    F: std::future::Future<Output = hyper::Result<Response<hyper::body::Incoming>>>,
{
    let answered = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let resp = send.await?;
        let status = resp.status();
        resp.into_body().collect().await?;
        Ok::<_, hyper::Error>(status)
    })
    .await;
    match answered {
        Ok(Ok(status)) => Outcome::Status(status),
        Ok(Err(_)) => Outcome::Failed,
        Err(_) => Outcome::Timeout,
    }
}

fn lifetime() -> u32 {
    fastrand::u32(200..=2000)
}

async fn h1_lane(ctx: Arc<Ctx>) {
    let mut pacer = Pacer::new(ctx.interval);
    while !ctx.done() {
        let mut sender = match connect_h1(&ctx).await {
            Ok(s) => {
                ctx.connected(None);
                s
            }
            Err(e) => {
                ctx.connected(Some(&e));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for _ in 0..lifetime() {
            pacer.wait().await;
            if ctx.done() {
                return;
            }
            let (route, req) = ctx.request(Proto::H1);
            let started = Instant::now();
            let outcome = match sender.ready().await {
                Ok(()) => exchange(sender.send_request(req)).await,
                Err(_) => Outcome::Failed,
            };
            ctx.record(Proto::H1, route, &outcome, started.elapsed());
            if !matches!(outcome, Outcome::Status(_)) {
                break; // a new connection
            }
        }
    }
}

async fn h2_connection(ctx: Arc<Ctx>) {
    let mut pacers: Vec<Pacer> = (0..ctx.opts.streams).map(|_| Pacer::new(ctx.interval)).collect();
    while !ctx.done() {
        let sender = match connect_h2(&ctx).await {
            Ok(s) => {
                ctx.connected(None);
                s
            }
            Err(e) => {
                ctx.connected(Some(&e));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let per_stream = lifetime() / ctx.opts.streams as u32 + 1;
        let mut lanes = JoinSet::new();
        for mut pacer in pacers.drain(..) {
            let ctx = ctx.clone();
            let mut sender = sender.clone();
            lanes.spawn(async move {
                for _ in 0..per_stream {
                    pacer.wait().await;
                    if ctx.done() {
                        break;
                    }
                    let (route, req) = ctx.request(Proto::H2);
                    let started = Instant::now();
                    let outcome = match sender.ready().await {
                        Ok(()) => exchange(sender.send_request(req)).await,
                        Err(_) => Outcome::Failed,
                    };
                    ctx.record(Proto::H2, route, &outcome, started.elapsed());
                    if !matches!(outcome, Outcome::Status(_)) {
                        break;
                    }
                }
                pacer
            });
        }
        drop(sender);
        while let Some(joined) = lanes.join_next().await {
            match joined {
                Ok(p) => pacers.push(p),
                Err(_) => pacers.push(Pacer::new(ctx.interval)),
            }
        }
    }
}

fn tls_connector(ca_pem: &str) -> Result<tokio_rustls::TlsConnector, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

async fn load(opts: Opts) -> Result<(), Error> {
    let ca = std::fs::read_to_string(&opts.ca).map_err(|e| format!("{}: {e}", opts.ca))?;
    let tls = tls_connector(&ca)?;
    let h1_conns = opts.conns / 2;
    let h2_conns = opts.conns - h1_conns;
    let lanes = h1_conns + h2_conns * opts.streams;
    let interval = if opts.rate > 0.0 {
        Duration::from_secs_f64(lanes as f64 / opts.rate)
    } else {
        Duration::ZERO
    };
    #[allow(clippy::disallowed_methods)] // a load generator, not the gateway
    let now_unix = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let started = Instant::now();
    let ctx = Arc::new(Ctx {
        jwt_key: jsonwebtoken::EncodingKey::from_secret(opts.secret.as_bytes()),
        jwt_exp: now_unix + opts.seconds + 3600,
        deadline: started + Duration::from_secs(opts.seconds),
        started,
        interval,
        tls,
        fresh_keys: AtomicU64::new(0),
        subs: AtomicU64::new(0),
        connect_failures: AtomicU64::new(0),
        window: Mutex::new(Window::default()),
        opts,
    });
    for _ in 0..h1_conns {
        tokio::spawn(h1_lane(ctx.clone()));
    }
    for _ in 0..h2_conns {
        tokio::spawn(h2_connection(ctx.clone()));
    }

    let mut total = Counts::default();
    let mut worst_ms = 0.0f64;
    let mut worst_p99 = 0.0f64;
    let (mut connects, mut connect_errors) = (0u64, 0u64);
    let mut last = started;
    let period = Duration::from_secs(ctx.opts.window);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::from_std(started + period), period);
    loop {
        let at = tokio::time::Instant::from_std(ctx.deadline);
        let end = tokio::select! {
            _ = tick.tick() => false,
            _ = tokio::time::sleep_until(at) => true,
        };
        let now = Instant::now();
        let mut w = std::mem::take(&mut *ctx.window());
        let secs = now.duration_since(last).as_secs_f64();
        last = now;
        if !(end && secs < 1.0) {
            let mut line = w.all.json();
            let p99 = w.lat.pct(0.99);
            let max = w.lat.max();
            line.insert(
                "elapsed_s".into(),
                json!(round3(now.duration_since(started).as_secs_f64())),
            );
            line.insert("rps".into(), json!((w.all.answered() as f64 / secs.max(1e-9)).round()));
            line.insert("p50_ms".into(), json!(round3(w.lat.pct(0.50))));
            line.insert("p99_ms".into(), json!(round3(p99)));
            line.insert("max_ms".into(), json!(round3(max)));
            line.insert("api".into(), part(&w.api.0, &mut w.api.1));
            line.insert("direct".into(), part(&w.direct.0, &mut w.direct.1));
            line.insert("h1".into(), part(&w.h1.0, &mut w.h1.1));
            line.insert("h2".into(), part(&w.h2.0, &mut w.h2.1));
            line.insert("connects".into(), json!(w.connects));
            line.insert("connect_errors".into(), json!(w.connect_errors));
            println!("{}", Value::Object(line));
            worst_ms = worst_ms.max(max);
            worst_p99 = worst_p99.max(p99);
        }
        total.merge(&w.all);
        connects += w.connects;
        connect_errors += w.connect_errors;
        if end {
            break;
        }
    }
    // Requests still in flight at the deadline are not waited for.
    let mut line = total.json();
    line.insert("final".into(), json!(true));
    line.insert("elapsed_s".into(), json!(round3(started.elapsed().as_secs_f64())));
    line.insert("worst_p99_ms".into(), json!(round3(worst_p99)));
    line.insert("max_ms".into(), json!(round3(worst_ms)));
    line.insert("connects".into(), json!(connects));
    line.insert("connect_errors".into(), json!(connect_errors));
    line.insert("fresh_keys".into(), json!(ctx.fresh_keys.load(Ordering::Relaxed)));
    line.insert("jwt_subs".into(), json!(ctx.subs.load(Ordering::Relaxed)));
    println!("{}", Value::Object(line));
    Ok(())
}
