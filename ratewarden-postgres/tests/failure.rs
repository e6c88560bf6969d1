//! A dead or frozen database is a `StoreError` within the timeout, never a
//! hang or a panic, and the store recovers when the database does. Runs on a
//! container of its own, since it freezes it.

use ratewarden_conformance::call;
use std::time::Duration;

use ratewarden_core::{ErrorKind, ManualClock, Policy, StoreError, Timestamp};
use ratewarden_postgres::{PostgresStore, PostgresStoreBuilder};
use ratewarden_test_support::postgres as fixture;

const T0: Timestamp = ManualClock::DEFAULT_START;
/// Far above every timeout below: only a hang reaches it.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// The stores' timeout: a healthy answer on a loaded machine is never
/// taken for a failure, and only a hang reaches the [`HANG_GUARD`].
const TIMEOUT: Duration = Duration::from_secs(5);

/// A store on `url`'s private server, in `schema`, giving up on a
/// statement after [`TIMEOUT`].
fn builder(url: &str, schema: &str) -> PostgresStoreBuilder {
    PostgresStore::builder(url)
        .schema(schema)
        .timeout(TIMEOUT)
        .sweep_interval(None)
}

/// A decision the database cannot answer: an error (a timeout, or the
/// database unavailable) well before the hang guard.
async fn cannot_decide(store: &PostgresStore, policy: &Policy, now: Timestamp) -> StoreError {
    let result = tokio::time::timeout(HANG_GUARD, call::decide(store, b"k", policy, 1, now))
        .await
        .expect("a decision must not hang on a database that cannot answer");
    let err = result.expect_err("a database that cannot answer cannot decide");
    assert!(
        matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
        "{err}"
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_is_an_error_within_the_timeout_then_recovers() {
    let (container, url) = fixture::start_private().await;
    let store = builder(&url, "failure").pool_size(4).build().await.unwrap();
    let policy = Policy::gcra(1_000, Duration::from_secs(1)).unwrap();
    assert!(
        call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );

    container.pause().await.expect("pause the container");
    // More calls at once than pooled connections: in-flight statements are
    // abandoned, the others wait for a connection; every one is an error.
    let calls: Vec<_> = (0..8u64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let now = Timestamp::from_micros(T0.as_micros() + i);
                cannot_decide(&store, &policy, now).await
            })
        })
        .collect();
    for call in calls {
        let err = call.await.expect("no panic");
        assert!(err.is_transient(), "{err}");
    }
    // And one more once they have all been abandoned.
    let err = cannot_decide(&store, &policy, Timestamp::from_micros(T0.as_micros() + 8)).await;
    assert!(err.is_transient(), "{err}");
    let sweep = tokio::time::timeout(HANG_GUARD, store.sweep(T0, 10))
        .await
        .expect("a sweep must not hang either");
    assert!(sweep.is_err());

    container.unpause().await.expect("unpause the container");
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        let result = tokio::time::timeout(HANG_GUARD, call::decide(&store, b"k", &policy, 1, T0))
            .await
            .expect("no hang after recovery");
        if result.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store answers again once the database does: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_an_error_not_a_hang() {
    let (container, url) = fixture::start_private().await;
    let store = builder(&url, "stopped").build().await.unwrap();
    let policy = Policy::fixed_window(10, Duration::from_secs(1)).unwrap();
    assert!(
        call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );
    container.stop().await.expect("stop the container");
    for _ in 0..3 {
        cannot_decide(&store, &policy, T0).await;
    }
}
