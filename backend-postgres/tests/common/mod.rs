//! The PostgreSQL server the integration tests run against.
//!
//! One container per test binary (per test process under nextest), started
//! on first use on a thread of its own, so that tests on different runtimes
//! share its address, never a connection. Every test isolates itself in a
//! schema of its own and never wipes the server.
//!
//! * `LIMITER_POSTGRES_URL` — use this existing server instead of a container.
//! * `LIMITER_POSTGRES_IMAGE` — another image (`name:tag`), for example the
//!   official `postgres:16`; default `limiter-test-postgres:15`, built by
//!   `scripts/build-test-images.sh`.
//!
//! A container lives as long as its test process; it is labelled with the
//! process id, and containers left by processes that have exited are removed
//! when the next test binary starts one.

#![allow(dead_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use limiter_postgres::{PostgresStore, PostgresStoreBuilder};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

pub const DEFAULT_IMAGE: &str = "limiter-test-postgres:15";
/// Labels every container with the pid of the test process that owns it.
pub const LABEL: &str = "limiter.test.postgres-owner-pid";

static URL: OnceLock<String> = OnceLock::new();

/// The image to run, as (name, tag, is the local test image).
pub fn image() -> (String, String, bool) {
    let spec = std::env::var("LIMITER_POSTGRES_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.into());
    let (name, tag) = spec.rsplit_once(':').unwrap_or((&spec, "latest"));
    (name.to_string(), tag.to_string(), spec == DEFAULT_IMAGE)
}

/// A request for a PostgreSQL container with pg_stat_statements loaded.
pub fn container_request() -> testcontainers::ContainerRequest<GenericImage> {
    let (name, tag, local) = image();
    let image = GenericImage::new(name, tag)
        .with_exposed_port(5432.tcp())
        .with_wait_for(WaitFor::message_on_stderr(
            "database system is ready to accept connections",
        ));
    if local {
        // The local image appends arguments starting with '-' to its
        // server command line and already preloads pg_stat_statements.
        image.with_label(LABEL, std::process::id().to_string())
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
            .with_label(LABEL, std::process::id().to_string())
    }
}

/// Starts a container for the calling test alone (dropped with it).
pub async fn start_private() -> (ContainerAsync<GenericImage>, String) {
    let container = container_request()
        .start()
        .await
        .unwrap_or_else(|e| panic!("{}", docker_help(&e)));
    let port = container
        .get_host_port_ipv4(5432.tcp())
        .await
        .expect("published port");
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    wait_ready(&url).await;
    (container, url)
}

/// What to do when a container does not start.
pub fn docker_help(e: &dyn std::fmt::Display) -> String {
    let (name, tag, _) = image();
    format!(
        "could not start PostgreSQL container {name}:{tag}: {e}\n\
         Is Docker running, and does the image exist? Build the local test image with \
         `scripts/build-test-images.sh`, or set LIMITER_POSTGRES_IMAGE to another image, \
         or LIMITER_POSTGRES_URL to an existing server."
    )
}

/// Removes containers left by test processes that have exited.
fn reap_stale_containers() {
    let Ok(out) = std::process::Command::new("docker")
        .args(["ps", "-a", "--filter", &format!("label={LABEL}")])
        .args([
            "--format",
            &format!("{{{{.ID}}}} {{{{.Label \"{LABEL}\"}}}}"),
        ])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((id, pid)) = line.split_once(' ') else {
            continue;
        };
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", id])
                .output();
        }
    }
}

/// Waits until the server accepts a query (the official image restarts once
/// after initialising).
pub async fn wait_ready(url: &str) {
    use sqlx::Connection;
    for _ in 0..120 {
        if let Ok(mut c) = sqlx::PgConnection::connect(url).await
            && sqlx::query("SELECT 1").execute(&mut c).await.is_ok()
        {
            let _ = c.close().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("PostgreSQL at {url} did not accept connections within 30 s");
}

/// The URL of the server shared by this test binary.
pub fn server_url() -> String {
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("LIMITER_POSTGRES_URL") {
            return url;
        }
        reap_stale_containers();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("postgres-container".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let started = container_request().start().await;
                    match started {
                        Ok(container) => {
                            let port = container
                                .get_host_port_ipv4(5432.tcp())
                                .await
                                .expect("published port");
                            let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
                            wait_ready(&url).await;
                            tx.send(Ok(url)).expect("test waiting");
                            // Held until the process exits.
                            std::future::pending::<()>().await;
                            drop(container);
                        }
                        Err(e) => tx.send(Err(docker_help(&e))).expect("test waiting"),
                    }
                });
            })
            .expect("thread");
        match rx.recv().expect("container thread") {
            Ok(url) => url,
            Err(message) => panic!("{message}"),
        }
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
