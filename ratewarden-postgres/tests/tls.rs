//! TLS (feature `tls`) against a PostgreSQL server that accepts TLS
//! connections only (`hostssl` rules alone), with a CA and a server
//! certificate generated for the test: `sslmode=require` connects and
//! decides, `verify-full` trusts the CA named by `sslrootcert`, and a wrong
//! CA is an error when the store is built.
#![cfg(feature = "tls")]

use ratewarden_conformance::call;
use std::time::Duration;

use ratewarden_core::{ManualClock, Policy, Timestamp};
use ratewarden_postgres::{BuildError, PostgresStore};
use ratewarden_test_support::postgres as fixture;
use ratewarden_test_support::tls::Ca;
use testcontainers::core::IntoContainerPort;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

const T0: Timestamp = ManualClock::DEFAULT_START;

/// Only TLS connections are let in, so whatever connects spoke TLS.
const HBA: &str = "local all all trust\n\
                   hostssl all all 0.0.0.0/0 trust\n\
                   hostssl all all ::/0 trust\n";

/// A server with TLS on, a certificate from `ca`, and only `hostssl`
/// rules, and its URL (no `sslmode` yet).
async fn start_tls_postgres(ca: &Ca) -> (ContainerAsync<GenericImage>, String) {
    let (cert, key) = ca.server("ratewarden test postgres");
    let (_, _, local) = fixture::image();
    // Files copied into a container belong to root, and PostgreSQL reads
    // its key as its own user and insists that nobody else can: the key is
    // installed for the postgres user, mode 0600, before the server starts.
    let server = "-c ssl=on -c ssl_cert_file=/tls/server.crt \
                  -c ssl_key_file=/tmp/server.key -c hba_file=/tls/pg_hba.conf";
    let start = if local {
        // The local image appends arguments starting with '-' to its
        // server command line.
        format!("exec /usr/local/bin/docker-entrypoint.sh {server}")
    } else {
        format!(
            "exec docker-entrypoint.sh postgres {server} \
             -c shared_preload_libraries=pg_stat_statements"
        )
    };
    let script = format!(
        "install -o postgres -g postgres -m 0600 /tls/server.key /tmp/server.key && {start}"
    );
    let request = fixture::generic_image()
        .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
        .with_copy_to("/tls/server.crt", cert.into_bytes())
        .with_copy_to("/tls/server.key", key.into_bytes())
        .with_copy_to("/tls/pg_hba.conf", HBA.as_bytes().to_vec())
        .with_cmd(["sh", "-c", &script]);
    let container = fixture::start_request(request).await;
    let port = container
        .get_host_port_ipv4(5432.tcp())
        .await
        .expect("published port");
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    fixture::wait_ready(&format!("{url}?sslmode=require")).await;
    (container, url)
}

fn builder(url: &str) -> ratewarden_postgres::PostgresStoreBuilder {
    PostgresStore::builder(url)
        .schema("tls")
        .sweep_interval(None)
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
}

/// Whether the store's session is encrypted, by the server's own account.
async fn on_tls(store: &PostgresStore) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_connects_over_tls_and_decides() {
    let ca = Ca::new("ratewarden test CA");
    let (_container, url) = start_tls_postgres(&ca).await;
    let store = builder(&format!("{url}?sslmode=require"))
        .build()
        .await
        .expect("sslmode=require connects");
    let policy = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            call::decide(&store, b"k", &policy, 1, T0)
                .await
                .unwrap()
                .allowed,
        );
    }
    assert_eq!(answers, [true, true, false]);
    assert!(on_tls(&store).await, "the session is encrypted");

    // The server takes nothing else: without TLS, no store.
    let err = builder(&format!("{url}?sslmode=disable"))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_generated_ca_connects() {
    let ca = Ca::new("ratewarden test CA");
    let (_container, url) = start_tls_postgres(&ca).await;
    let root = ca.pem_file("ca.pem");
    let store = builder(&format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        root.path()
    ))
    .build()
    .await
    .expect("verify-full trusts the CA it is given");
    let policy = Policy::gcra(1, Duration::from_secs(60)).unwrap();
    assert!(
        call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );
    assert!(on_tls(&store).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_against_a_wrong_ca_is_a_build_error() {
    let ca = Ca::new("ratewarden test CA");
    let (_container, url) = start_tls_postgres(&ca).await;
    let wrong = Ca::new("someone else's CA").pem_file("wrong-ca.pem");
    for mode in ["verify-full", "verify-ca"] {
        let result = builder(&format!(
            "{url}?sslmode={mode}&sslrootcert={}",
            wrong.path()
        ))
        .build()
        .await;
        let err = result.expect_err("a server certificate from another CA is not trusted");
        assert!(
            matches!(err, BuildError::Store(_)),
            "{mode}: a connection error, not {err:?}"
        );
        assert!(err.to_string().contains("certificate"), "{mode}: {err}");
    }
    // The right CA on the same server connects, so the failure was the CA.
    let right = ca.pem_file("right-ca.pem");
    builder(&format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        right.path()
    ))
    .build()
    .await
    .expect("the server's own CA is trusted");
}
