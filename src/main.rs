//! The `leasegate` command line. Nothing but argument parsing and exit codes.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use leasegate::config::AccessLog;

const RUN_HELP: &str = "\
Reload:
  The config file is watched and a valid edit applies without a restart;
  SIGHUP re-reads it at once (kill -HUP PID). A file that fails validation is
  never applied: the config in force keeps serving and the error is logged
  (metric leasegate_config_reloads_total{result=\"error\"}). Listeners, TLS,
  workers and [store] need a restart.

Logs:
  Diagnostics go to stderr, filtered by LEASEGATE_LOG (default \"info\"; e.g.
  LEASEGATE_LOG=debug, or LEASEGATE_LOG=info,leasegate=debug). The access log,
  one line per request, goes to stdout ([gateway] access_log = json | text | off).

Signals:
  SIGTERM or SIGINT: stop accepting, drain in-flight requests for up to
  [gateway] grace_period_ms, give leased tokens back to the store, exit.

Exit codes:
  0  stopped by SIGTERM/SIGINT after draining
  1  could not start: invalid config, a listener that cannot bind, TLS
     files that cannot be read (the reason is on stderr); or bad arguments

Admin listener: / (status page) /healthz /readyz /metrics /config /limits/state. Runbook: docs/operations.md.";

/// mimalloc: measurably cheaper than glibc malloc for the many small,
/// short-lived allocations of request handling (see docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "leasegate",
    version,
    about = "Edge API gateway with distributed, leased rate limiting"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve until SIGINT/SIGTERM, then drain in-flight requests and exit.
    #[command(after_help = RUN_HELP)]
    Run {
        /// The config file. Relative paths inside it resolve against its
        /// directory. Validate it first with `leasegate check`.
        #[arg(long, default_value = "gateway.toml")]
        config: PathBuf,
    },
    /// Validate a config file and print a summary; exit 1 if it is invalid.
    Check {
        #[arg(long, default_value = "gateway.toml")]
        config: PathBuf,
        /// Also connect to the store and print its round trip (five PINGs)
        /// beside [store] timeout_ms; exit 1 if it does not answer.
        #[arg(long)]
        ping_store: bool,
    },
    /// Show what the gateway would do with one request: the route it
    /// matches, the identity it resolves (and why higher tiers did not
    /// apply), and every limit that applies with its rate, capacity and store
    /// key. Runs the gateway's own matching, identity and key code on the
    /// config; talks to no store. Exit 0 when explained (also when no route
    /// matches), 1 on bad arguments or an invalid config.
    #[command(
        after_help = "Examples:\n  leasegate explain --config gateway.toml GET /v1/orders\n  leasegate explain --admin http://127.0.0.1:9901 --header 'X-API-Key: test-key-1' GET /v1/orders\n  leasegate explain --header 'X-API-Key: test-key-1' --ip 198.51.100.7 --json POST /v1/orders\n  leasegate explain --header 'Authorization: Bearer eyJ...' --header 'Host: api.example.com' GET /v1/me\n  leasegate explain --identity key:beta GET /v1/orders"
    )]
    Explain {
        #[arg(long, default_value = "gateway.toml")]
        config: PathBuf,
        /// A request header, 'Name: value' (repeatable), e.g. 'X-API-Key: K',
        /// 'Authorization: Bearer JWT', 'Host: H', 'X-Forwarded-For: A'.
        #[arg(long = "header", short = 'H', value_name = "'NAME: VALUE'")]
        headers: Vec<String>,
        /// The client's address, as the TCP peer the gateway sees
        /// (default 127.0.0.1).
        #[arg(long, value_name = "ADDR")]
        ip: Option<String>,
        /// The subject (common name) of a client certificate the https
        /// listener verified against [tls] client_ca: the `cert` tier, where
        /// [identity] order names it.
        #[arg(long, value_name = "SUBJECT")]
        client_cert: Option<String>,
        /// Explain as this caller, without its credentials: key:ID (the
        /// API key with that id, or tenant when it has no id: its tenant
        /// and plan), tenant:NAME (the tenant's first API key) or user:SUB
        /// (a JWT's subject). In place of the identity the headers give.
        #[arg(long, value_name = "key:ID|user:SUB|tenant:NAME")]
        identity: Option<String>,
        /// One JSON object: route, identity, limits[] (name, mode, algorithm,
        /// rate, capacity, key) and details.
        #[arg(long)]
        json: bool,
        /// A running gateway's admin listener, e.g. http://127.0.0.1:9901:
        /// also show the live state of the printed keys there (tokens at
        /// hand, blocked for, the store's last answer), from its
        /// GET /limits/state. Unreachable, or an answer other than the
        /// expected JSON: exit 1.
        #[arg(long, value_name = "URL")]
        admin: Option<String>,
        /// The request method, e.g. GET.
        method: String,
        /// The request path (with query, if any), e.g. /v1/orders.
        path: String,
    },
    /// Run a virtual fleet of real limiters on your config, faster than real
    /// time: over-admission against the bound, store calls, lease sizes,
    /// what a dead instance strands, a store outage's fallback. The limit
    /// is built as `run` builds it; the store is the memory store (the
    /// same math as the Lua scripts) behind a round-trip model. Same
    /// arguments and seed: same output. Exit 1 on bad arguments.
    #[command(
        after_help = "Examples:\n  leasegate simulate --config gateway.toml --limit per_key --instances 50 --seconds 60\n  leasegate simulate --config gateway.toml --limit per_key --instances 500 --offered 80000 --json\n  leasegate simulate --config gateway.toml --limit per_key --kill 3@20 --store-down 30-40 --store-rtt-ms 1\n  leasegate simulate --config gateway.toml --limit per_key --instances 10,50,100,200,500 --plot sweep.png"
    )]
    Simulate {
        #[arg(long, default_value = "gateway.toml")]
        config: PathBuf,
        /// The limit to simulate (a rate limit: token bucket, sliding or
        /// fixed window; concurrency limits are refused).
        #[arg(long)]
        limit: String,
        /// Instances in the fleet; a list (10,50,100) runs one simulation
        /// per size and prints a row for each.
        #[arg(long, default_value = "10", value_name = "N[,N...]")]
        instances: String,
        /// Virtual seconds to run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Requests per second offered to the whole fleet (default: twice
        /// the limit's rate).
        #[arg(long)]
        offered: Option<f64>,
        /// Distinct clients (default: --keys); each is one of the keys.
        #[arg(long)]
        clients: Option<u64>,
        /// Distinct keys (identities) the traffic spreads over.
        #[arg(long, default_value_t = 1)]
        keys: u64,
        /// Zipf exponent of the clients' shares (0: uniform).
        #[arg(long, default_value_t = 1.0)]
        zipf: f64,
        /// How requests reach instances: even (uniform) or skewed
        /// (instance i gets weight 1/(i+1)).
        #[arg(long, default_value = "even", value_parser = ["even", "skewed"])]
        spread: String,
        /// Each store call's round trip, ms; calls past [store] timeout_ms
        /// fail as they would.
        #[arg(long, default_value_t = 0.5)]
        store_rtt_ms: f64,
        /// K instances die at virtual second T (K@T): their leases strand.
        #[arg(long, value_name = "K@T")]
        kill: Option<String>,
        /// The store answers nothing from second T1 to T2 (T1-T2): the
        /// fallback and breaker as configured.
        #[arg(long, value_name = "T1-T2")]
        store_down: Option<String>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// One JSON object instead of the table (an array for a list of
        /// --instances).
        #[arg(long)]
        json: bool,
        /// Draw a PNG: the per-second series of a run, or for a list of
        /// --instances the over-admission beside N × B and the store calls
        /// beside N.
        #[arg(long, value_name = "FILE.png")]
        plot: Option<PathBuf>,
    },
    /// Print the JA4/JA3 fingerprints of a TLS ClientHello as JSON.
    Fingerprint {
        /// The ClientHello in hex: a whole record (16 03 ..) or a bare
        /// handshake message (01 ..). Spaces and colons are ignored.
        #[arg(long)]
        hex: String,
    },
}

fn main() -> ExitCode {
    // Usage errors exit 1 like every other bad input; --help and --version 0.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Explain {
            config,
            headers,
            ip,
            client_cert,
            identity,
            json,
            admin,
            method,
            path,
        } => explain(
            &config,
            (&headers, ip.as_deref(), client_cert, identity.as_deref()),
            json,
            admin.as_deref(),
            &method,
            &path,
        ),
        Command::Check { config, ping_store } => match leasegate::config::load(&config) {
            Ok(c) => {
                print!("{}", c.summary());
                if !ping_store {
                    return ExitCode::SUCCESS;
                }
                match leasegate::server::ping_store::ping_store(&c) {
                    Ok(Some(pinged)) => {
                        print!("{}", pinged.report(&c.store_shown()));
                        ExitCode::SUCCESS
                    }
                    Ok(None) => {
                        println!("store ping: the memory store is in the process: no round trip");
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("leasegate check --ping-store: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Err(e) => {
                eprintln!("{e}");
                eprintln!("{}: invalid, nothing applied", config.display());
                ExitCode::FAILURE
            }
        },
        Command::Simulate {
            config,
            limit,
            instances,
            seconds,
            offered,
            clients,
            keys,
            zipf,
            spread,
            store_rtt_ms,
            kill,
            store_down,
            seed,
            json,
            plot,
        } => {
            let loaded = match leasegate::config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    eprintln!("leasegate simulate: {}: invalid config", config.display());
                    return ExitCode::FAILURE;
                }
            };
            let runs = (|| {
                let sizes = leasegate::simulate::parse_instances(&instances)?;
                let (_, l) = leasegate::simulate::find_limit(&loaded, &limit)?;
                let spec = l.spec().slice(l.share());
                let rate = spec.count as f64 * 1000.0 / spec.period_ms().max(1) as f64;
                let base = leasegate::simulate::Options {
                    instances: 0,
                    seconds,
                    offered: offered.unwrap_or(2.0 * rate),
                    clients: clients.unwrap_or(keys),
                    keys,
                    zipf,
                    spread: if spread == "skewed" {
                        leasegate::simulate::Spread::Skewed
                    } else {
                        leasegate::simulate::Spread::Even
                    },
                    store_rtt_ms,
                    kill: kill.as_deref().map(leasegate::simulate::parse_kill).transpose()?,
                    store_down: store_down.as_deref().map(leasegate::simulate::parse_down).transpose()?,
                    seed,
                };
                // Every size is checked before the first runs.
                let all: Vec<_> = sizes
                    .iter()
                    .map(|&n| leasegate::simulate::Options {
                        instances: n,
                        ..base.clone()
                    })
                    .collect();
                for o in &all {
                    o.check()?;
                }
                all.iter()
                    .map(|o| leasegate::simulate::run(&loaded, &limit, o))
                    .collect::<Result<Vec<_>, _>>()
            })();
            let sweep = instances.contains(',');
            match runs {
                Ok(reports) => {
                    use std::io::Write;
                    if let Some(path) = &plot {
                        let png = match (sweep, reports.first()) {
                            (false, Some(r)) => leasegate::simulate::plot::series(r),
                            _ => leasegate::simulate::plot::sweep(&reports),
                        };
                        if let Err(e) = std::fs::write(path, png) {
                            eprintln!("leasegate simulate: --plot {}: {e}", path.display());
                            return ExitCode::FAILURE;
                        }
                    }
                    let text = match (json, sweep) {
                        (true, false) => reports.iter().map(|r| format!("{}\n", r.to_json())).collect(),
                        (true, true) => format!("{}\n", serde_json::to_string_pretty(&reports).unwrap_or_default()),
                        (false, false) => reports.iter().map(|r| r.to_text()).collect(),
                        (false, true) => leasegate::simulate::Report::sweep_text(&reports),
                    };
                    // A reader gone (`| head`) is no failure of the run.
                    let _ = std::io::stdout().lock().write_all(text.as_bytes());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("leasegate simulate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Fingerprint { hex } => {
            let fingerprinted = leasegate::fingerprint::decode_hex(&hex)
                .and_then(|bytes| leasegate::fingerprint::fingerprint(&bytes).map_err(|e| e.to_string()));
            match fingerprinted {
                Ok(f) => {
                    println!("{}", f.to_json());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("leasegate fingerprint: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run { config } => {
            let loaded = match leasegate::config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            // Held until exit: dropping it flushes the access log.
            let _access = init_logging(loaded.gateway.access_log);
            match leasegate::server::run(loaded) {
                Ok(()) => ExitCode::SUCCESS,
                // Once, on stderr whatever LEASEGATE_LOG filters out.
                Err(e) => {
                    eprintln!("leasegate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `explain`'s request: its headers, `--ip`, `--client-cert` and
/// `--identity`.
type Seen<'a> = (&'a [String], Option<&'a str>, Option<String>, Option<&'a str>);

fn explain(
    config: &std::path::Path,
    (headers, ip, client_cert, identity): Seen<'_>,
    json: bool,
    admin: Option<&str>,
    method: &str,
    path: &str,
) -> ExitCode {
    let probe = match leasegate::explain::Probe::parse(method, path, headers, ip) {
        Ok(p) => leasegate::explain::Probe { client_cert, ..p },
        Err(e) => {
            eprintln!("leasegate explain: {e}");
            return ExitCode::FAILURE;
        }
    };
    let admin = match admin.map(leasegate::explain::admin::AdminUrl::parse).transpose() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("leasegate explain: {e}");
            return ExitCode::FAILURE;
        }
    };
    let loaded = match leasegate::config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("leasegate explain: {}: invalid config", config.display());
            return ExitCode::FAILURE;
        }
    };
    let named = match identity.map(|spec| leasegate::explain::identity::named(&loaded.identity, spec)) {
        None => None,
        Some(Ok(named)) => Some(named),
        Some(Err(e)) => {
            eprintln!("leasegate explain: {e}");
            return ExitCode::FAILURE;
        }
    };
    let probe = leasegate::explain::Probe { named, ..probe };
    let now_secs = leasegate::runtime::identity_clock(&loaded.identity, probe.request.headers());
    let mut explained = leasegate::explain::explain(&loaded, &probe, now_secs);
    if let Some(admin) = &admin {
        let keys = explained.keys();
        // No limit applies: nothing to ask.
        let states = if keys.is_empty() {
            Ok(Vec::new())
        } else {
            // The gateway's own admin token, if its config has one.
            let token = loaded
                .listeners
                .admin_token
                .as_ref()
                .and_then(|t| std::fs::read_to_string(&t.file).ok())
                .map(|t| t.trim().to_string());
            // The caller, as overrides name it: its identity, its tenant.
            let whos: Vec<String> = explained
                .identity
                .iter()
                .flat_map(|id| {
                    std::iter::once(id.value.clone()).chain(id.tenant.as_ref().map(|t| format!("tenant:{t}")))
                })
                .collect();
            let whos: Vec<&str> = whos.iter().map(String::as_str).collect();
            leasegate::explain::admin::fetch_state(
                admin,
                &keys,
                &whos,
                token.as_deref(),
                std::time::Duration::from_secs(5),
            )
        };
        match states {
            Ok(states) => explained.attach_live(&admin.state_url(), states),
            Err(e) => {
                eprintln!("leasegate explain: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if json {
        println!("{}", explained.to_json());
    } else {
        print!("{}", explained.to_text());
    }
    ExitCode::SUCCESS
}

/// Diagnostics go to stderr (text, `LEASEGATE_LOG` filter); the access
/// log, one line per request, goes to stdout through a background writer so
/// a slow reader never blocks a request; the writer batches (below).
/// Where the access log's background writer writes: stdout's descriptor
/// behind a 64 KiB buffer, not `Stdout`, which writes each line with a
/// syscall of its own. The writer thread drains every line queued, then
/// flushes, so under load one `write` carries many lines (nginx's
/// `access_log ... buffer=`), and when idle each line still goes out at
/// once.
fn access_log_writer() -> Box<dyn std::io::Write + Send> {
    use std::os::fd::AsFd;
    match std::io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => Box::new(std::fs::File::from(fd)),
        Err(_) => Box::new(std::io::stdout()),
    }
}

fn init_logging(access: AccessLog) -> Option<leasegate::telemetry::access_log::Guard> {
    use leasegate::telemetry::access_log::{self, BatchWriter, Format};
    use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, Targets};
    use tracing_subscriber::prelude::*;

    let filter = EnvFilter::try_from_env("LEASEGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // One filter per layer, decided per callsite: a callsite neither layer
    // wants (h2's trace spans, on every HTTP/2 frame) is never asked
    // again. Two filters stacked on one layer (a closure among them) made
    // every such span a live one in the registry, a slab entry created,
    // entered and closed per call: a quarter of an RLS call's CPU.
    let not_access = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("access", LevelFilter::OFF);
    let diagnostics = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter.and(not_access));
    let registry = tracing_subscriber::registry().with(diagnostics);
    match access {
        AccessLog::Off => {
            registry.init();
            None
        }
        // Written by hand into the batches (access_log/), not by tracing.
        AccessLog::Json => {
            registry.init();
            access_log::start(Format::Json, access_log_writer())
        }
        AccessLog::Text => {
            let layer = tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_target(false)
                .with_writer(BatchWriter)
                .with_filter(Targets::new().with_target("access", LevelFilter::INFO));
            registry.with(layer).init();
            access_log::start(Format::Text, access_log_writer())
        }
    }
}
