//! The process around the service: its store, its two listeners, reloads
//! and shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use ratewarden::config::{DEFAULT_STORE, Limits};
use ratewarden::layer::HeaderMode;
use ratewarden::lease::{LeaseConfig, LeasedStore};
use ratewarden::{Clock, FailurePolicy, Store, SystemClock};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, watch};
use tonic::transport::server::TcpIncoming;

use crate::config::{Domains, LoadError, RuleOptions};
use crate::service::RateLimitServer;

/// The gRPC address when none is given: envoyproxy/ratelimit's port.
pub const DEFAULT_GRPC: &str = "127.0.0.1:8081";
/// The HTTP address (`/healthcheck`, `/metrics`) when none is given.
pub const DEFAULT_HTTP: &str = "127.0.0.1:8080";

/// How a server is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// The descriptors: a YAML file, or a directory of them.
    pub config: PathBuf,
    /// Where gRPC is served.
    pub grpc: SocketAddr,
    /// Where `/healthcheck` and `/metrics` are served.
    pub http: SocketAddr,
    /// The store, by URL ([`ratewarden::store::from_url`]); `None`: the
    /// limits file's store named `default`, or else `memory://`.
    pub store: Option<String>,
    /// A limits file in the library's format ([`ratewarden::config`]):
    /// its stores, and limits (tiers, leases, fallbacks) that descriptors
    /// name with `rate_limit: { limit: NAME }`. Reloaded with the
    /// descriptors, keeping its stores' counts and leases.
    pub limits: Option<PathBuf>,
    /// Buy units from the store in leases of this many (a shared store).
    pub lease: Option<u32>,
    /// What a descriptor answers when the store does not.
    pub on_failure: FailurePolicy,
    /// How long a descriptor waits for the store.
    pub timeout: Duration,
    /// The rate-limit headers each response asks Envoy to add.
    pub headers: HeaderMode,
    /// How often the file's modification time is checked, to reload it
    /// when it changes; `None` reloads on `SIGHUP` only.
    pub watch: Option<Duration>,
}

impl Options {
    /// The defaults, for the configuration at `config`: memory store,
    /// [`DEFAULT_GRPC`], [`DEFAULT_HTTP`], failing open after 250 ms, the
    /// two draft headers, the file checked every second.
    pub fn new(config: impl Into<PathBuf>) -> Self {
        Options {
            config: config.into(),
            grpc: DEFAULT_GRPC.parse().expect("a valid address"),
            http: DEFAULT_HTTP.parse().expect("a valid address"),
            store: None,
            limits: None,
            lease: None,
            on_failure: FailurePolicy::Open,
            timeout: ratewarden::DEFAULT_TIMEOUT,
            headers: HeaderMode::default(),
            watch: Some(Duration::from_secs(1)),
        }
    }
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store URL or lease size was refused.
    #[error("store: {0}")]
    Store(#[from] ratewarden::ConfigError),
    /// The limits file did not load.
    #[error("limits: {0}")]
    Limits(ratewarden::ConfigError),
    /// The descriptors did not load.
    #[error("{0}")]
    Config(#[from] LoadError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// A server stopped on an error.
    #[error("{0}")]
    Serve(String),
}

/// A server whose store is open, configuration loaded and sockets bound;
/// [`serve`](Self::serve) runs it.
#[derive(Debug)]
pub struct Server {
    options: Options,
    service: RateLimitServer,
    reloader: Arc<Reloader>,
    leased: Option<Arc<LeasedStore>>,
    grpc: TcpListener,
    http: TcpListener,
    metrics: PrometheusHandle,
}

/// Reloads the configuration files onto the same stores.
#[derive(Debug)]
struct Reloader {
    path: PathBuf,
    limits_path: Option<PathBuf>,
    rules: RuleOptions,
    service: RateLimitServer,
    /// One reload at a time, the limits in force and the files'
    /// modification times when last loaded.
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    modified: Option<SystemTime>,
    limits: Option<Limits>,
}

impl Reloader {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.path.as_path()).chain(self.limits_path.as_deref())
    }

    async fn reload(&self) -> Result<usize, LoadError> {
        let mut state = self.state.lock().await;
        let modified = latest(self.paths());
        let result = self.load(&state).await;
        state.modified = modified;
        let outcome = if result.is_ok() { "loaded" } else { "refused" };
        metrics::counter!("ratewarden_server_config_loads_total", "result" => outcome).increment(1);
        match result {
            Ok((domains, limits)) => {
                let rules = domains.rules();
                self.service.replace(domains);
                state.limits = limits;
                tracing::info!(rules, "configuration reloaded");
                Ok(rules)
            }
            Err(e) => {
                tracing::error!("configuration not reloaded, the one in force stays: {e}");
                Err(e)
            }
        }
    }

    async fn load(&self, state: &Loaded) -> Result<(Domains, Option<Limits>), LoadError> {
        let limits = match &state.limits {
            Some(limits) => Some(limits.reload().await.map_err(|e| {
                LoadError::new(
                    &self
                        .limits_path
                        .as_deref()
                        .unwrap_or(Path::new(""))
                        .display()
                        .to_string(),
                    e,
                )
            })?),
            None => None,
        };
        let rules = RuleOptions {
            limits: limits.clone(),
            ..self.rules.clone()
        };
        let path = self.path.clone();
        // Reading a file and building limiters blocks: off the runtime's
        // workers, which are answering requests.
        let domains = tokio::task::spawn_blocking(move || Domains::load(&path, &rules))
            .await
            .unwrap_or_else(|e| {
                Err(LoadError::new(
                    &self.path.display().to_string(),
                    format!("the load panicked: {e}"),
                ))
            })?;
        Ok((domains, limits))
    }

    /// Reloads when a file's modification time is not the one loaded.
    async fn reload_if_changed(&self) {
        let changed = self.state.lock().await.modified != latest(self.paths());
        if changed {
            let _ = self.reload().await;
        }
    }

    /// Hands back the units of the limits file's leases.
    async fn release_leases(&self) -> u64 {
        match &self.state.lock().await.limits {
            Some(limits) => limits.release_leases().await,
            None => 0,
        }
    }
}

/// The latest modification time of `paths`.
fn latest<'a>(paths: impl Iterator<Item = &'a Path>) -> Option<SystemTime> {
    paths.filter_map(modified).max()
}

fn modified(path: &std::path::Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    // A directory: the latest of its files, so that editing one reloads.
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
        .chain(meta.modified().ok())
        .max()
}

static METRICS: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// How often the recorder folds recorded histogram samples into buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process's Prometheus recorder, installed by the first server, with
/// a thread of its own that keeps it.
///
/// Why the thread: every awaited store call records its latency in a
/// histogram, and the recorder holds each sample until upkeep folds it
/// into the buckets. Run only when `/metrics` was scraped, a server
/// nobody scraped grew by every call it made to Redis (its resident
/// memory from 23 to 36 MB over 800,000 calls under the Envoy bench).
/// A thread, not a task: the recorder is the process's, and outlives any
/// one runtime.
fn recorder() -> Result<PrometheusHandle, StartError> {
    METRICS
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| format!("cannot install the Prometheus recorder: {e}"))?;
            let kept = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_EVERY);
                        kept.run_upkeep();
                    }
                })
                .map_err(|e| format!("cannot start the metrics upkeep thread: {e}"))?;
            Ok(handle)
        })
        .clone()
        .map_err(StartError::Serve)
}

impl Server {
    /// Opens the store, loads the configuration and binds both listeners
    /// (port 0 picks a free one: see [`grpc_addr`](Self::grpc_addr)).
    pub async fn bind(options: Options) -> Result<Server, StartError> {
        // First: the descriptors' counters register with it as they are built.
        let metrics = recorder()?;
        let limits = match &options.limits {
            Some(path) => Some(
                Limits::builder()
                    .allow_empty(true)
                    .load(path)
                    .await
                    .map_err(StartError::Limits)?,
            ),
            None => None,
        };
        let default = limits.as_ref().and_then(|l| l.store(DEFAULT_STORE));
        let store = match (&options.store, default) {
            (Some(_), Some(_)) => {
                return Err(StartError::Limits(ratewarden::ConfigError::Invalid(
                    "the store is given twice: by --store and as `default` under the limits \
                     file's [stores]; keep one"
                        .into(),
                )));
            }
            (Some(url), None) => ratewarden::store::from_url(url).await?,
            (None, Some(store)) => store,
            (None, None) => ratewarden::store::from_url("memory://").await?,
        };
        let (store, leased): (Arc<dyn Store>, _) = match options.lease {
            Some(units) => {
                let leased = Arc::new(LeasedStore::new(store, LeaseConfig::new(units)?));
                (leased.clone(), Some(leased))
            }
            None => (store, None),
        };
        let rules = RuleOptions {
            store,
            on_failure: options.on_failure,
            timeout: options.timeout,
            headers: options.headers,
            limits: limits.clone(),
        };
        let paths = std::iter::once(options.config.as_path()).chain(options.limits.as_deref());
        let modified = latest(paths);
        let domains = {
            let (path, rules) = (options.config.clone(), rules.clone());
            tokio::task::spawn_blocking(move || Domains::load(&path, &rules))
                .await
                .map_err(|e| StartError::Serve(e.to_string()))??
        };
        let service = RateLimitServer::new(domains);
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| StartError::Listen { addr, error })
        };
        let grpc = bind(options.grpc).await?;
        let http = bind(options.http).await?;
        let reloader = Arc::new(Reloader {
            path: options.config.clone(),
            limits_path: options.limits.clone(),
            rules: RuleOptions {
                limits: None,
                ..rules
            },
            service: service.clone(),
            state: Mutex::new(Loaded { modified, limits }),
        });
        Ok(Server {
            options,
            service,
            reloader,
            leased,
            grpc,
            http,
            metrics,
        })
    }

    /// The address gRPC is served on.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr().expect("a bound listener")
    }

    /// The address `/healthcheck` and `/metrics` are served on.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().expect("a bound listener")
    }

    /// The service, to reload or inspect while it serves.
    pub fn service(&self) -> &RateLimitServer {
        &self.service
    }

    /// A handle that reloads the configuration file, as `SIGHUP` does.
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle(self.reloader.clone())
    }

    /// Serves until `shutdown` completes, reloading on `SIGHUP` and (with
    /// [`Options::watch`]) when the file changes. At shutdown the health
    /// checks turn to not serving, requests in flight are answered, and
    /// leased units are handed back to the store.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), StartError> {
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<RateLimitServiceServer<RateLimitServer>>()
            .await;
        let serving = Arc::new(AtomicBool::new(true));
        let (stop, stopped) = watch::channel(false);

        let mut tasks = Vec::new();
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut hup = signal(SignalKind::hangup())
                .map_err(|e| StartError::Serve(format!("cannot listen for SIGHUP: {e}")))?;
            let reloader = self.reloader.clone();
            tasks.push(tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    let _ = reloader.reload().await;
                }
            }));
        }
        if let Some(every) = self.options.watch {
            let reloader = self.reloader.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    reloader.reload_if_changed().await;
                }
            }));
        }

        let http = Router::new()
            .route("/healthcheck", get(healthcheck))
            .route("/metrics", get(render_metrics))
            .with_state(HttpState {
                serving: serving.clone(),
                metrics: self.metrics.clone(),
            });
        let mut http_stop = stopped.clone();
        let http_task = tokio::spawn(async move {
            axum::serve(self.http, http)
                .with_graceful_shutdown(async move {
                    let _ = http_stop.wait_for(|stop| *stop).await;
                })
                .await
        });

        let mut grpc_stop = stopped;
        let grpc = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(RateLimitServiceServer::new(self.service.clone()))
            // Nagle's algorithm off, as tonic's own `serve` sets it: an
            // answer is a few dozen bytes, which should not wait for an ACK.
            .serve_with_incoming_shutdown(incoming(self.grpc), async move {
                let _ = grpc_stop.wait_for(|stop| *stop).await;
            });
        let grpc_task = tokio::spawn(grpc);

        shutdown.await;
        tracing::info!("shutting down: answering requests in flight");
        serving.store(false, Ordering::Relaxed);
        health
            .set_not_serving::<RateLimitServiceServer<RateLimitServer>>()
            .await;
        // The server as a whole ("") too: a check names no service.
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _ = stop.send(true);
        for task in &tasks {
            task.abort();
        }
        let grpc = grpc_task.await;
        let http = http_task.await;
        let mut released = self.reloader.release_leases().await;
        if let Some(leased) = &self.leased {
            released += leased.release(SystemClock.now()).await;
        }
        if released > 0 {
            tracing::info!(units = released, "leased units handed back to the stores");
        }
        match grpc {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(StartError::Serve(format!("gRPC: {e}"))),
            Err(e) => return Err(StartError::Serve(format!("gRPC: {e}"))),
        }
        match http {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StartError::Serve(format!("HTTP: {e}"))),
            Err(e) => Err(StartError::Serve(format!("HTTP: {e}"))),
        }
    }
}

fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Reloads a running server's configuration file.
#[derive(Debug, Clone)]
pub struct ReloadHandle(Arc<Reloader>);

impl ReloadHandle {
    /// Reads the file again and answers from it; a file that does not load
    /// changes nothing. Returns the number of limited descriptors.
    pub async fn reload(&self) -> Result<usize, LoadError> {
        self.0.reload().await
    }
}

#[derive(Clone)]
struct HttpState {
    serving: Arc<AtomicBool>,
    metrics: PrometheusHandle,
}

async fn healthcheck(State(state): State<HttpState>) -> (StatusCode, &'static str) {
    if state.serving.load(Ordering::Relaxed) {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    }
}

async fn render_metrics(
    State(state): State<HttpState>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
