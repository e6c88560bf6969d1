//! Demo server: six rate-limited endpoints on the ratewarden crate.
//!
//! `cargo run -p ratewarden-demo -- --help` lists the flags.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;

use ratewarden::SystemClock;
use ratewarden::config::Reloader;
use ratewarden_demo::prometheus::Metrics;
use ratewarden_demo::server::ServerLimits;
use ratewarden_demo::{Config, FileLimits, Settings, app, check_names, cli, load_limits};

/// `println!` that ignores a closed standard output: the server goes on
/// serving when its banner is piped into `head` or its terminal is gone,
/// where `println!` would panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratewarden-demo: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_matches(&cli().get_matches())?;
    log_to_stderr()?;
    // Before any limiter exists, so that every series is recorded.
    let mut metrics = Metrics::install()?;
    let (stores, memory) = config.open_stores().await?;
    for (role, store) in memory {
        metrics.watch_memory(role, store);
    }
    let identity = config.identity(stores.primary.capabilities().shared)?;
    let clock: Arc<dyn ratewarden::Clock> = Arc::new(SystemClock);
    let file = match &config.config_file {
        Some(path) => Some(load_limits(path, &stores, clock.clone()).await?),
        None => None,
    };
    let settings = Settings {
        limits: config.limits,
        stores,
        identity,
        clock,
        on_failure: config.on_failure,
        admin_token: config.admin_token.clone(),
        api_keys: config.api_keys.clone(),
        file,
        shadow: config.shadow.clone(),
    };
    let metrics_router = metrics.router();
    let build = {
        let settings = settings.clone();
        move |file: Option<FileLimits>| {
            let settings = Settings {
                file,
                ..settings.clone()
            };
            app(&settings).map(|router| router.merge(metrics_router.clone()))
        }
    };
    // With a limits file, the app is rebuilt from it on SIGHUP, on the same
    // stores, so that what they counted stays counted.
    let router = match (&config.config_file, &settings.file) {
        (Some(path), Some(file)) => {
            let path = path.clone();
            let (reloader, service) = Reloader::new(file.clone(), move |limits: &FileLimits| {
                check_names(limits, &path)?;
                build(Some(limits.clone()))
            })?;
            reload_on_hangup(reloader, config.config_file.clone().unwrap_or_default())?;
            axum::Router::new().fallback_service(service)
        }
        _ => build(None)?,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;

    say!("ratewarden-demo listening on http://{addr}");
    let store = ratewarden::store::redact(&config.store);
    if settings.stores.local_tier.is_some() {
        say!("  store: memory:// in front of {store}");
    } else {
        say!("  store: {store}");
    }
    if let Some(units) = config.lease {
        say!(
            "  leases: batches of up to {units} units, for routes on a fixed or sliding window without a ban"
        );
    }
    say!("  client address: {}", config.address_source);
    if let Some(file) = &config.config_file {
        say!(
            "  limits: {} (flags override; kill -HUP {} reloads it)",
            file.display(),
            std::process::id()
        );
    }
    let endpoints = settings.limits.endpoints()?;
    for e in &endpoints {
        let from_file = settings
            .file
            .as_ref()
            .filter(|_| !settings.limits.flagged.route(e.name))
            .and_then(|file| file.limiter(e.name));
        let policies = match from_file {
            Some(limiter) => limiter
                .rules()
                .iter()
                .map(|r| r.policy().to_string())
                .collect::<Vec<_>>()
                .join(", then "),
            None => e.policy.to_string(),
        };
        say!("  {:<5}{:<15}{}", e.method, e.path, policies);
    }
    say!(
        "  POST /api/login      {} (failures only: -d password=demo succeeds, and is not counted)",
        ratewarden_demo::login_policy(&settings.stores)?
    );
    say!(
        "  GET  /api/reports    {} a minute; {} with an X-Api-Key given by --api-key KEY=pro ({} keys given)",
        ratewarden_demo::plans::REPORT_PLANS[0]
            .1
            .trim_end_matches("/min"),
        ratewarden_demo::plans::REPORT_PLANS[1]
            .1
            .trim_end_matches("/min"),
        config.api_keys.len()
    );
    say!(
        "  POST /api/checkout   {} payments per hour; -d card=declined is answered 402 and costs {} more",
        ratewarden_demo::CHECKOUTS,
        ratewarden_demo::DECLINE_PENALTY
    );
    if !config.shadow.is_empty() {
        say!(
            "  in shadow mode (counted, never refused; X-RateLimit-Shadow: refused where they \
             would refuse): {}",
            config.shadow.join(", ")
        );
    }
    say!("  GET  /api/quota      your quota on ?route=NAME (search), spending nothing");
    if settings.admin_token.is_some() {
        say!("  POST /admin/reset    ?client=ADDR[&route=NAME], Authorization: Bearer <token>");
    }
    if config.secret.is_none() {
        say!(
            "  secret: none given (--secret / RATEWARDEN_SECRET), so a random one was drawn for \
             this process; client keys change on restart"
        );
    }
    let base = format!("http://{}", reachable(addr));
    say!("Try:");
    say!(
        "  for i in $(seq 1 {}); do curl -s -o /dev/null -w '%{{http_code}}\\n' '{base}/api/search?q=rust'; done",
        endpoints[2].policy.limit().saturating_add(5)
    );
    say!("  curl -i '{base}/api/search?q=rust'");
    say!("  curl -i '{base}/api/quota'");
    say!("  curl '{base}/metrics'");
    say!("Ctrl-C stops the server.");

    ratewarden_demo::server::serve(listener, router, ServerLimits::default(), async {
        shutdown_signal().await;
        say!("shutting down");
    })
    .await?;
    // Units bought and not spent would be lost to the fleet until their
    // window ends.
    if let Some(leased) = &settings.stores.leased {
        // Bounded: against a dead store each refund would wait for its
        // timeout. What is not handed back stays stranded until its window
        // ends, the strict side.
        let release = leased.release(settings.clock.now());
        match tokio::time::timeout(std::time::Duration::from_secs(5), release).await {
            Ok(units) => say!("handed {units} leased units back to the shared store"),
            Err(_) => say!("gave up handing leased units back after 5 s"),
        }
    }
    Ok(())
}

/// Ctrl-C, or SIGTERM (as sent by `docker stop` and service managers).
/// A signal whose handler cannot be installed is waited on forever, so the
/// server then runs until killed rather than stopping at once.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Reloads the limits file on every SIGHUP, saying how it went: what an
/// operator watching the server's output needs to see.
#[cfg(unix)]
fn reload_on_hangup(
    reloader: std::sync::Arc<Reloader<axum::Router>>,
    path: std::path::PathBuf,
) -> std::io::Result<()> {
    reloader.reload_on_sighup_with(move |outcome| match outcome {
        Ok(()) => say!("limits reloaded from {}", path.display()),
        Err(e) => eprintln!("limits not reloaded, the old ones stay: {e}"),
    })?;
    Ok(())
}

#[cfg(not(unix))]
fn reload_on_hangup(
    _: std::sync::Arc<Reloader<axum::Router>>,
    _: std::path::PathBuf,
) -> std::io::Result<()> {
    Ok(())
}

/// Prints what the library and the demo log (admin resets, breaker
/// transitions, store errors, a request without a client address) on
/// stderr, at the levels `RUST_LOG` names (`info` unless set; for example
/// `RUST_LOG=ratewarden_core=debug` adds each decision's span to the store
/// errors logged within it). Stdout keeps the demo's own lines.
fn log_to_stderr() -> Result<(), String> {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => text
            .parse::<Targets>()
            .map_err(|e| format!("RUST_LOG={text:?}: {e}"))?,
        _ => Targets::new().with_default(tracing::Level::INFO),
    };
    let output = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    tracing_subscriber::registry()
        .with(output)
        .with(filter)
        .try_init()
        .map_err(|e| format!("cannot install the log: {e}"))
}

/// An address a local curl can reach: loopback instead of "any".
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}
