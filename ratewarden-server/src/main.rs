//! `ratewarden-server`: Envoy's rate-limit service on ratewarden's stores.
//!
//! ```text
//! ratewarden-server --config examples/envoy.yaml
//! ratewarden-server --config /etc/ratelimit/ --store redis://10.0.0.5:6379 --lease 16
//! ```
//!
//! Every flag can also be set by its environment variable (`--help`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ratewarden::FailurePolicy;
use ratewarden::layer::HeaderMode;
use ratewarden_server::{Options, Server};

/// Envoy's rate-limit service (`envoy.service.ratelimit.v3`) on
/// ratewarden's stores.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The descriptors: a YAML file in envoyproxy/ratelimit's format, or a
    /// directory of them (one domain each). Reloaded on SIGHUP and when it
    /// changes.
    #[arg(long, env = "RATEWARDEN_CONFIG")]
    config: PathBuf,
    /// Where gRPC (`ShouldRateLimit`, health checking) is served.
    #[arg(long, env = "RATEWARDEN_LISTEN", default_value = ratewarden_server::DEFAULT_GRPC)]
    listen: SocketAddr,
    /// Where `/healthcheck` and Prometheus `/metrics` are served.
    #[arg(long, env = "RATEWARDEN_HTTP", default_value = ratewarden_server::DEFAULT_HTTP)]
    http: SocketAddr,
    /// The store, by URL: memory:// (the default), redis://,
    /// redis+cluster://, redis+sentinel://, postgres://.
    #[arg(long, env = "RATEWARDEN_STORE")]
    store: Option<String>,
    /// A limits file in the library's TOML format: its stores (`default`
    /// is the descriptors' store), and limits with tiers, leases and
    /// fallbacks that descriptors name with `rate_limit: { limit: NAME }`.
    #[arg(long, env = "RATEWARDEN_LIMITS")]
    limits: Option<PathBuf>,
    /// Buy units from a shared store in leases of this many: fewer round
    /// trips, never over the limit.
    #[arg(long, env = "RATEWARDEN_LEASE")]
    lease: Option<u32>,
    /// What a descriptor answers when the store does not: `open` (OK) or
    /// `closed` (OVER_LIMIT).
    #[arg(long, env = "RATEWARDEN_ON_FAILURE", default_value = "open", value_parser = on_failure)]
    on_failure: FailurePolicy,
    /// How long a descriptor waits for the store, in milliseconds.
    #[arg(long, env = "RATEWARDEN_TIMEOUT_MS", default_value_t = 250)]
    timeout_ms: u64,
    /// The rate-limit headers of each response: `draft` (RateLimit-Policy
    /// and RateLimit), `x` (X-RateLimit-*), `both` or `none`.
    #[arg(long, env = "RATEWARDEN_HEADERS", default_value = "draft", value_parser = headers)]
    headers: HeaderMode,
    /// How often the configuration's modification time is checked, in
    /// milliseconds; 0 reloads on SIGHUP only.
    #[arg(long, env = "RATEWARDEN_WATCH_MS", default_value_t = 1000)]
    watch_ms: u64,
}

fn on_failure(text: &str) -> Result<FailurePolicy, String> {
    match text {
        "open" => Ok(FailurePolicy::Open),
        "closed" => Ok(FailurePolicy::Closed),
        _ => Err("expected `open` or `closed`".into()),
    }
}

fn headers(text: &str) -> Result<HeaderMode, String> {
    match text {
        "draft" => Ok(HeaderMode::Draft11),
        "x" => Ok(HeaderMode::XRateLimit),
        "both" => Ok(HeaderMode::Both),
        "none" => Ok(HeaderMode::None),
        _ => Err("expected `draft`, `x`, `both` or `none`".into()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = log() {
        eprintln!("ratewarden-server: {e}");
        return ExitCode::FAILURE;
    }
    let options = Options {
        config: args.config,
        grpc: args.listen,
        http: args.http,
        store: args.store,
        limits: args.limits,
        lease: args.lease,
        on_failure: args.on_failure,
        timeout: Duration::from_millis(args.timeout_ms),
        headers: args.headers,
        watch: (args.watch_ms > 0).then(|| Duration::from_millis(args.watch_ms)),
    };
    let server = match Server::bind(options).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("ratewarden-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        grpc = %server.grpc_addr(),
        http = %server.http_addr(),
        rules = server.service().domains().rules(),
        "serving ShouldRateLimit"
    );
    match server.serve(terminated()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratewarden-server: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C, or SIGTERM as a container runtime sends it.
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn log() -> Result<(), String> {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => text
            .parse::<Targets>()
            .map_err(|e| format!("RUST_LOG={text:?}: {e}"))?,
        _ => Targets::new().with_default(tracing::Level::INFO),
    };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false),
        )
        .with(filter)
        .try_init()
        .map_err(|e| format!("cannot install the log: {e}"))
}
