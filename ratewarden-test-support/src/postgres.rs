//! The PostgreSQL servers the integration tests run against.
//!
//! One shared container per test binary (per test process under nextest),
//! started on first use on a thread of its own, so that tests on different
//! runtimes share its address, never a connection. Every test isolates
//! itself in a schema of its own and never wipes the server.
//!
//! * `RATEWARDEN_POSTGRES_URL` — use this existing server instead of a container.
//! * `RATEWARDEN_POSTGRES_IMAGE` — another image (`name:tag`), for example
//!   `postgres:17`. Unless it is set, the locally built
//!   `ratewarden-test-postgres:15` runs where this machine has it
//!   (`scripts/build-test-images.sh` builds it from Debian's packages when no
//!   registry is reachable), else the official `postgres:15`.
//!
//! Every container is removed when its test process is gone
//! ([`reap_on_exit`]).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratewarden_postgres::{PostgresStore, PostgresStoreBuilder};
use sqlx::{Connection, PgConnection};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};

use crate::containers::Server;
pub use crate::containers::{free_port, reap_on_exit, start_shared};

/// The locally built test image, used where this machine has it.
pub const DEFAULT_IMAGE: &str = "ratewarden-test-postgres:15";
/// The official image, used where the local one was not built.
pub const OFFICIAL_IMAGE: &str = "postgres:15";

const SERVER: Server = Server {
    what: "PostgreSQL",
    image_var: "RATEWARDEN_POSTGRES_IMAGE",
    url_var: "RATEWARDEN_POSTGRES_URL",
    local: DEFAULT_IMAGE,
    official: OFFICIAL_IMAGE,
};

static URL: OnceLock<String> = OnceLock::new();

/// The image to run, as (name, tag, is the local test image):
/// `RATEWARDEN_POSTGRES_IMAGE`, else [`DEFAULT_IMAGE`] if built here, else
/// [`OFFICIAL_IMAGE`].
pub fn image() -> (String, String, bool) {
    static IMAGE: OnceLock<(String, String)> = OnceLock::new();
    let (name, tag) = IMAGE.get_or_init(|| SERVER.image()).clone();
    let local = format!("{name}:{tag}") == DEFAULT_IMAGE;
    (name, tag, local)
}

/// The image, waiting for the server to accept connections.
pub fn generic_image() -> GenericImage {
    let (name, tag, _) = image();
    GenericImage::new(name, tag)
        .with_exposed_port(5432.tcp())
        .with_wait_for(WaitFor::message_on_stderr(
            "database system is ready to accept connections",
        ))
}

/// A request for a PostgreSQL container with pg_stat_statements loaded.
pub fn container_request() -> ContainerRequest<GenericImage> {
    let (_, _, local) = image();
    let image = generic_image();
    if local {
        // The local image appends arguments starting with '-' to its
        // server command line and already preloads pg_stat_statements.
        image.into()
    } else {
        image
            .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
            .with_cmd([
                "postgres",
                "-c",
                "shared_preload_libraries=pg_stat_statements",
                "-c",
                "max_connections=200",
            ])
    }
}

/// Starts `request`, registering the container for removal at exit; fails
/// the test with one line saying what to do if it cannot start.
pub async fn start_request(
    request: ContainerRequest<GenericImage>,
) -> ContainerAsync<GenericImage> {
    let (name, tag, _) = image();
    SERVER.start(request, &(name, tag), "PostgreSQL").await
}

/// Starts a container for the calling test alone (dropped with it).
pub async fn start_private() -> (ContainerAsync<GenericImage>, String) {
    let container = start_request(container_request()).await;
    let port = container
        .get_host_port_ipv4(5432.tcp())
        .await
        .expect("published port");
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    wait_ready(&url).await;
    (container, url)
}

/// A private server on a fixed host port, so its address survives a stop
/// and a start.
pub async fn start_on_fixed_port() -> (ContainerAsync<GenericImage>, String) {
    let port = free_port(false);
    let container = start_request(container_request().with_mapped_port(port, 5432.tcp())).await;
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    wait_ready(&url).await;
    (container, url)
}

/// Stops the server. PostgreSQL treats SIGTERM as a smart shutdown that
/// waits for a pool's idle sessions, so it is killed after a second, as a
/// crash would.
pub async fn stop(container: &ContainerAsync<GenericImage>) {
    container
        .stop_with_timeout(Some(1))
        .await
        .expect("docker stop");
}

/// Waits until the server runs a query: after a start (the official image
/// restarts once after initialising) or a restart. Each attempt is bounded,
/// so a server that accepts a connection and never answers is retried.
pub async fn wait_ready(url: &str) {
    for _ in 0..160 {
        let attempt = tokio::time::timeout(Duration::from_secs(1), async {
            let mut c = PgConnection::connect(url).await?;
            sqlx::query("SELECT 1").execute(&mut c).await?;
            c.close().await
        })
        .await;
        if matches!(attempt, Ok(Ok(()))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("PostgreSQL at {url} did not accept queries within 40 s");
}

/// The URL of the server shared by this test binary.
pub fn server_url() -> String {
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("RATEWARDEN_POSTGRES_URL") {
            return url;
        }
        start_shared("the shared PostgreSQL container", start_private)
    })
    .clone()
}

/// A schema name unique to this process and call.
pub fn unique_schema(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A builder on the shared server in a fresh schema, without a background
/// sweeper (tests drive time with a manual clock).
pub fn builder(prefix: &str) -> PostgresStoreBuilder {
    PostgresStore::builder(server_url())
        .schema(unique_schema(prefix))
        .sweep_interval(None)
        .timeout(Duration::from_secs(10))
}

/// A fresh store in its own schema.
pub async fn fresh_store(prefix: &str) -> PostgresStore {
    builder(prefix).build().await.expect("store builds")
}
