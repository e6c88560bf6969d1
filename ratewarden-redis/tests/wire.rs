//! "Exactly one round trip per decision", counted on the wire: the store
//! talks to Redis through a loopback proxy (`ratewarden_test_support::WireCounter`)
//! that counts request/answer exchanges, whatever the server's own
//! statistics say. `tests/redis.rs` checks the same claim with `MONITOR`
//! and `INFO commandstats`.

use ratewarden_conformance::call;
use std::time::Duration;

use ratewarden_core::{ManualClock, Policy, Timestamp};
use ratewarden_redis::{DEFAULT_CONNECTIONS, RedisStore};
use ratewarden_test_support::policy;
use ratewarden_test_support::redis as fixture;
use ratewarden_test_support::stores::{Admission, refund_all_and_ghosts};

const T0: u64 = ManualClock::DEFAULT_START.as_micros();

fn policies() -> Vec<Policy> {
    policy::of_every_algorithm(5, Duration::from_secs(60))
}

async fn store_via(url: &str, what: &str) -> RedisStore {
    builder_via(url, what).build().unwrap()
}

fn builder_via(url: &str, what: &str) -> ratewarden_redis::RedisStoreBuilder {
    RedisStore::builder(url)
        .key_prefix(fixture::unique_prefix(what))
        // Its notice subscription's heartbeats would be exchanges too:
        // these tests count decisions (`tests/notices.rs` has the notices).
        .notices(false)
        // Semantics, not latency: a loaded machine must not fail the test.
        .timeout(Duration::from_secs(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_decisions_are_n_exchanges_and_n_refunds_are_n_exchanges() {
    let (wire, url) = fixture::shared_through_counter().await;
    let store = store_via(&url, "wire").await;

    // Warm-up, not counted: the connection's handshake, and each script's
    // first use (EVALSHA answered NOSCRIPT, SCRIPT LOAD, EVALSHA again).
    for p in policies() {
        let now = Timestamp::from_micros(T0);
        let d = call::decide(&store, b"warm-up", &p, 1, now).await.unwrap();
        call::refund(&store, b"warm-up", &p, 1, now, &d)
            .await
            .unwrap();
    }

    let before = wire.exchanges();
    let mut admitted: Vec<Admission> = Vec::new();
    let (mut decisions, mut refused) = (0u64, 0u64);
    for p in policies() {
        for i in 0..12u64 {
            let key = format!("client-{}", i % 2);
            let now = T0 + i * 1000;
            let d = call::decide(&store, key.as_bytes(), &p, 1, Timestamp::from_micros(now))
                .await
                .unwrap();
            decisions += 1;
            if d.allowed {
                admitted.push((p, key, now, d));
            } else {
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "the run should include refusals");
    assert_eq!(
        wire.exchanges() - before,
        decisions,
        "{decisions} decisions (admitted and refused)"
    );

    let before = wire.exchanges();
    // A refund that finds nothing to give back is one exchange too.
    let refunds = refund_all_and_ghosts(&store, &admitted, &policies()).await;
    assert_eq!(wire.exchanges() - before, refunds, "{refunds} refunds");
    assert_eq!(
        wire.connections(),
        DEFAULT_CONNECTIONS as u64,
        "the default multiplexed connections, and no other"
    );
}

/// The store takes its connections in turn: with three, every one carries
/// a third of the calls, and each call is still one exchange; with one,
/// one connection carries them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_spread_over_the_connections_in_turn() {
    let p = Policy::fixed_window(1_000, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    for n in [1usize, 3] {
        let (wire, url) = fixture::shared_through_counter().await;
        let store = builder_via(&url, "spread").connections(n).build().unwrap();
        store.connect().await.unwrap();
        assert_eq!(wire.connections(), n as u64, "connect opens every one");
        // The script's first use may take more than one exchange.
        call::decide(&store, b"warm-up", &p, 1, now).await.unwrap();
        let before = wire.exchanges_by_connection();
        let calls = 30 * n as u64;
        for _ in 0..calls {
            call::decide(&store, b"k", &p, 1, now).await.unwrap();
        }
        let after = wire.exchanges_by_connection();
        let carried: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(carried, vec![calls / n as u64; n], "{n} connections");
    }
}

/// The proxy itself can see more than one exchange per call: a store that
/// sent two commands per decision (here, a decision preceded by a `PING`
/// from a client of the same connection) is counted as two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_sees_a_second_round_trip() {
    let (wire, url) = fixture::shared_through_counter().await;
    let client = redis::Client::open(url).unwrap();
    let manager = redis::aio::ConnectionManager::new(client).await.unwrap();
    let store = RedisStore::builder_with_connection_manager(manager.clone())
        .key_prefix(fixture::unique_prefix("wire-teeth"))
        // Semantics, not latency, as above: not the quarter-second default.
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let p = Policy::gcra(100, Duration::from_secs(1)).unwrap();
    let now = Timestamp::from_micros(T0);
    call::decide(&store, b"warm-up", &p, 1, now).await.unwrap();

    let before = wire.exchanges();
    for _ in 0..5 {
        let mut m = manager.clone();
        let _: String = redis::cmd("PING").query_async(&mut m).await.unwrap();
        call::decide(&store, b"k", &p, 1, now).await.unwrap();
    }
    assert_eq!(wire.exchanges() - before, 10);
}
