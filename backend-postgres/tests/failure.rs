//! A dead or frozen database is a `StoreError` within the timeout, never a
//! hang or a panic, and the store recovers when the database does. Runs on a
//! container of its own, since it freezes it.

use std::time::Duration;

use limiter_core::{ErrorKind, ManualClock, Policy, Store, Timestamp};
use limiter_postgres::PostgresStore;
use limiter_test_support::postgres as fixture;

const T0: Timestamp = ManualClock::DEFAULT_START;
/// Far above every timeout below: only a hang reaches it.
const HANG_GUARD: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_is_an_error_within_the_timeout_then_recovers() {
    let (container, url) = fixture::start_private().await;
    let store = PostgresStore::builder(&url)
        .schema("failure")
        .pool_size(4)
        .timeout(Duration::from_millis(300))
        .sweep_interval(None)
        .build()
        .await
        .unwrap();
    let policy = Policy::gcra(1_000, Duration::from_secs(1)).unwrap();
    assert!(store.decide(b"k", &policy, 1, T0).await.unwrap().allowed);

    container.pause().await.expect("pause the container");
    // More calls than pooled connections: in-flight statements are
    // abandoned, later ones wait for a connection; every one is an error.
    for i in 0..8u64 {
        let now = Timestamp::from_micros(T0.as_micros() + i);
        let result = tokio::time::timeout(HANG_GUARD, store.decide(b"k", &policy, 1, now))
            .await
            .expect("a decision must not hang on a frozen database");
        let err = result.expect_err("a frozen database cannot decide");
        assert!(
            matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
            "{err}"
        );
        assert!(err.is_transient(), "{err}");
    }
    let sweep = tokio::time::timeout(HANG_GUARD, store.sweep(T0, 10))
        .await
        .expect("a sweep must not hang either");
    assert!(sweep.is_err());

    container.unpause().await.expect("unpause the container");
    let mut recovered = false;
    for _ in 0..200 {
        let result = tokio::time::timeout(HANG_GUARD, store.decide(b"k", &policy, 1, T0))
            .await
            .expect("no hang after recovery");
        if result.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered, "the store answers again once the database does");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_an_error_not_a_hang() {
    let (container, url) = fixture::start_private().await;
    let store = PostgresStore::builder(&url)
        .schema("stopped")
        .timeout(Duration::from_millis(300))
        .sweep_interval(None)
        .build()
        .await
        .unwrap();
    let policy = Policy::fixed_window(10, Duration::from_secs(1)).unwrap();
    assert!(store.decide(b"k", &policy, 1, T0).await.unwrap().allowed);
    container.stop().await.expect("stop the container");
    for _ in 0..3 {
        let result = tokio::time::timeout(HANG_GUARD, store.decide(b"k", &policy, 1, T0))
            .await
            .expect("a decision must not hang on a stopped database");
        let err = result.expect_err("a stopped database cannot decide");
        assert!(
            matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
            "{err}"
        );
    }
}
