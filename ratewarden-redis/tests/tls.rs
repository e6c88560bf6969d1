//! TLS (`rediss://`, feature `tls`) against a Redis server that listens on
//! TLS only, with a CA and a server certificate generated for the test.
#![cfg(feature = "tls")]

use ratewarden_conformance::call;
use std::time::Duration;

use ratewarden_core::{ConfigError, ErrorKind, ManualClock, Policy, Timestamp};
use ratewarden_redis::RedisStore;
use ratewarden_test_support::redis as fixture;
use ratewarden_test_support::tls::Ca;
use testcontainers::core::IntoContainerPort;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

const T0: u64 = ManualClock::DEFAULT_START.as_micros();
/// Hangs are caught by this, far above any timeout under test.
const HANG_GUARD: Duration = Duration::from_secs(20);

/// A Redis server with no plaintext port: whatever answers it spoke TLS.
async fn start_tls_redis(ca: &Ca) -> (ContainerAsync<GenericImage>, String) {
    let (cert, key) = ca.server("ratewarden test redis");
    let request = fixture::with_tls_files(
        fixture::image().with_exposed_port(6379.tcp()),
        &ca.pem(),
        &cert,
        &key,
    )
    .with_cmd(fixture::tls_args(6379));
    let container = fixture::start_request(request, "TLS Redis").await;
    let port = container
        .get_host_port_ipv4(6379.tcp())
        .await
        .expect("a published TLS port");
    (container, format!("rediss://127.0.0.1:{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decides_over_tls_trusting_the_given_ca() {
    let ca = Ca::new("ratewarden test CA");
    let (_container, url) = start_tls_redis(&ca).await;
    let store = RedisStore::builder(&url)
        .tls_root_ca(ca.pem())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let p = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    let mut admitted = Vec::new();
    for _ in 0..3 {
        let d = tokio::time::timeout(HANG_GUARD, call::decide(&store, b"k", &p, 1, now))
            .await
            .expect("no hang")
            .unwrap();
        admitted.push(d.allowed);
    }
    assert_eq!(admitted, [true, true, false]);
    // A refund is a script call over the same connection.
    let d = call::decide(&store, b"k2", &p, 1, now).await.unwrap();
    call::refund(&store, b"k2", &p, 1, now, &d).await.unwrap();
    assert_eq!(
        call::decide(&store, b"k2", &p, 1, now)
            .await
            .unwrap()
            .remaining,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_client_does_not_trust_is_a_clear_error() {
    let ca = Ca::new("ratewarden test CA");
    let (_container, url) = start_tls_redis(&ca).await;
    let p = Policy::gcra(10, Duration::from_secs(1)).unwrap();
    let other = Ca::new("some other CA");
    for store in [
        RedisStore::builder(&url).tls_root_ca(other.pem()),
        // The system's roots do not hold the test's CA either.
        RedisStore::builder(&url),
    ] {
        let store = store.timeout(Duration::from_secs(5)).build().unwrap();
        let err = tokio::time::timeout(
            HANG_GUARD,
            call::decide(&store, b"k", &p, 1, Timestamp::from_micros(T0)),
        )
        .await
        .expect("an untrusted server must fail, not hang")
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        let message = err.to_string().to_lowercase();
        assert!(message.contains("certificate"), "{err}");
        assert!(
            message.contains("unknownissuer") || message.contains("unknown issuer"),
            "{err}"
        );
    }
}

#[test]
fn tls_options_are_checked_at_construction() {
    let ca = Ca::new("ratewarden test CA");
    let refused = |b: ratewarden_redis::RedisStoreBuilder, what: &str| {
        let err = b.build().unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::InvalidUrl { .. } | ConfigError::Invalid(_)
            ),
            "{err}"
        );
        assert!(err.to_string().contains(what), "{err}");
    };
    refused(
        RedisStore::builder("rediss://127.0.0.1:6379").tls_root_ca("not PEM at all"),
        "no PEM CERTIFICATE",
    );
    refused(
        RedisStore::builder("rediss://127.0.0.1:6379")
            .tls_root_ca("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n"),
        "tls_root_ca",
    );
    refused(
        RedisStore::builder("redis://127.0.0.1:6379").tls_root_ca(ca.pem()),
        "rediss://",
    );
    refused(
        RedisStore::builder("redis+cluster://a:1,b:2").tls_root_ca(ca.pem()),
        "rediss+cluster://",
    );
    refused(
        RedisStore::builder("rediss+cluster://a:1,b:2").tls_root_ca("not PEM at all"),
        "no PEM CERTIFICATE",
    );
    assert!(
        RedisStore::builder("rediss+cluster://a:1,b:2")
            .tls_root_ca(ca.pem())
            .build()
            .is_ok()
    );
    refused(
        RedisStore::builder_with_client(redis::Client::open("redis://127.0.0.1").unwrap())
            .tls_root_ca(ca.pem()),
        "its own TLS settings",
    );
    refused(
        RedisStore::builder("rediss://127.0.0.1:6379/#insecure"),
        "certificate verification",
    );
    assert!(
        RedisStore::builder("rediss://127.0.0.1:6379")
            .tls_root_ca(ca.pem())
            .build()
            .is_ok()
    );
    assert!(RedisStore::from_url("rediss://u:p@127.0.0.1:6379/1").is_ok());
}

/// A three-master cluster that speaks TLS only (`--port 0`, `tls-cluster
/// yes`): every decision, on whichever node holds its key's slot, went
/// over TLS trusting the test's CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decides_on_a_tls_cluster_trusting_the_given_ca() {
    let ca = Ca::new("ratewarden test CA");
    let (_nodes, url) = fixture::start_tls_cluster(&ca).await;
    let store = RedisStore::builder(&url)
        .tls_root_ca(ca.pem())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let p = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    // Keys spread over the three masters' slots: each is limited on its own.
    for key in 0..30u32 {
        let key = format!("client-{key}");
        let mut admitted = Vec::new();
        for _ in 0..3 {
            let d =
                tokio::time::timeout(HANG_GUARD, call::decide(&store, key.as_bytes(), &p, 1, now))
                    .await
                    .expect("no hang")
                    .unwrap();
            admitted.push(d.allowed);
        }
        assert_eq!(admitted, [true, true, false], "{key}");
    }
    // A CA that did not sign the nodes' certificates: refused, not trusted.
    let other = Ca::new("some other CA");
    let untrusting = RedisStore::builder(&url)
        .tls_root_ca(other.pem())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let err = tokio::time::timeout(HANG_GUARD, call::decide(&untrusting, b"k", &p, 1, now))
        .await
        .expect("an untrusted cluster must fail, not hang")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

/// The application's own cluster client, configured for TLS, carries the
/// store's decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_an_existing_tls_cluster_client_decides() {
    let ca = Ca::new("ratewarden test CA");
    let (_nodes, url) = fixture::start_tls_cluster(&ca).await;
    let nodes: Vec<String> = url
        .trim_start_matches("rediss+cluster://")
        .split(',')
        .map(|n| format!("rediss://{n}"))
        .collect();
    let client = redis::cluster::ClusterClientBuilder::new(nodes)
        .certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.pem().into_bytes()),
        })
        .build()
        .unwrap();
    let store = RedisStore::builder_with_cluster_client(client)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let p = Policy::gcra(1, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    assert!(
        call::decide(&store, b"k", &p, 1, now)
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !call::decide(&store, b"k", &p, 1, now)
            .await
            .unwrap()
            .allowed
    );
}
