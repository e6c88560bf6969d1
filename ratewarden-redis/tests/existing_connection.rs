//! Stores built from the application's own `redis::Client` or
//! `ConnectionManager` rather than from a URL.

use ratewarden_conformance::call;
use std::time::Duration;

use ratewarden_core::{Algorithm, ManualClock, Policy, Timestamp};
use ratewarden_redis::RedisStore;
use ratewarden_test_support::redis as fixture;
use redis::aio::ConnectionManager;

const T0: u64 = ManualClock::DEFAULT_START.as_micros();
const GENEROUS: Duration = Duration::from_secs(10);

async fn exists(url: &str, key: &[u8]) -> bool {
    let mut conn = fixture::admin(url).await;
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    n == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_an_existing_client_decides_under_its_own_options() {
    let url = fixture::shared_url();
    let client = redis::Client::open(url).unwrap();
    let store = RedisStore::builder_with_client(client)
        .key_prefix(fixture::unique_prefix("with-client"))
        .timeout(GENEROUS)
        .build()
        .unwrap();
    let p = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    let allowed: Vec<bool> = [
        call::decide(&store, b"k", &p, 1, now)
            .await
            .unwrap()
            .allowed,
        call::decide(&store, b"k", &p, 1, now)
            .await
            .unwrap()
            .allowed,
        call::decide(&store, b"k", &p, 1, now)
            .await
            .unwrap()
            .allowed,
    ]
    .into();
    assert_eq!(allowed, [true, true, false]);
    // The builder's prefix, not the default, names the state.
    assert!(exists(url, &store.redis_key(b"k", Algorithm::FixedWindow)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_an_existing_manager_uses_that_connection_only() {
    // The application's manager reaches the server through a counting
    // proxy: the store's calls show there, and on no other connection.
    let (wire, url) = fixture::shared_through_counter().await;
    let client = redis::Client::open(url).unwrap();
    let manager = ConnectionManager::new(client).await.unwrap();
    let store = RedisStore::builder_with_connection_manager(manager.clone())
        .key_prefix(fixture::unique_prefix("with-manager"))
        .timeout(GENEROUS)
        .build()
        .unwrap();
    store.connect().await.unwrap();
    let p = Policy::sliding_log(3, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    call::decide(&store, b"warm-up", &p, 1, now).await.unwrap();

    let before = wire.exchanges();
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let d = call::decide(&store, b"k", &p, 1, now).await.unwrap();
        remaining.push((d.allowed, d.remaining));
    }
    assert_eq!(remaining, [(true, 2), (true, 1), (true, 0), (false, 0)]);
    assert_eq!(wire.exchanges() - before, 4, "one exchange per decision");
    assert_eq!(wire.connections(), 1, "the store opened no connection");

    // The application keeps using its manager beside the store.
    let mut m = manager.clone();
    let pong: String = redis::cmd("PING").query_async(&mut m).await.unwrap();
    assert_eq!(pong, "PONG");
    assert!(
        exists(
            fixture::shared_url(),
            &store.redis_key(b"k", Algorithm::SlidingLog)
        )
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_only_options_are_refused_for_an_existing_manager() {
    let (_wire, url) = fixture::shared_through_counter().await;
    let client = redis::Client::open(url).unwrap();
    let manager = ConnectionManager::new(client).await.unwrap();
    let b = || RedisStore::builder_with_connection_manager(manager.clone());
    assert!(b().timeout(Duration::ZERO).build().is_err());
    assert!(b().key_prefix("a}").build().is_err());
    // The application's manager is one connection: the store cannot open
    // more of it.
    assert!(b().connections(2).build().is_err());
    assert!(b().connections(1).build().is_ok());
    let debug = format!("{:?}", b().build().unwrap());
    assert!(debug.contains("ConnectionManager"), "{debug}");
}
