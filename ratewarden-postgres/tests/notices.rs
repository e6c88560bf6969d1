//! A reset reaches every instance of a fleet: four stores on one Postgres
//! schema (four instances of an application, each with its own store,
//! connections and refusal cache), one key refused on all of them from
//! their caches, then reset through one. Every instance must stop refusing
//! and the fleet admit exactly the limit, also after the listeners'
//! connections were terminated. Prints how long the notice took to reach
//! each instance (wall clock, for the record: nothing here asserts a
//! speed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};
use ratewarden_postgres::PostgresStore;
use ratewarden_test_support::fleet::{self, NEVER};
use ratewarden_test_support::postgres as fixture;

const INSTANCES: usize = 4;
const LIMIT: u32 = 5;

struct Fleet {
    stores: Vec<PostgresStore>,
    limiters: Vec<Limiter>,
}

async fn fleet(schema: &str, clock: &ManualClock) -> Fleet {
    let mut stores = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        let store = PostgresStore::builder(fixture::server_url())
            .schema(schema)
            .sweep_interval(None)
            .timeout(Duration::from_secs(5))
            .notice_heartbeat(Duration::from_millis(100))
            .build()
            .await
            .unwrap();
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        let rule = Rule::new(
            "login",
            shared,
            Policy::fixed_window(LIMIT, Duration::from_secs(900)).unwrap(),
        )
        .unwrap();
        limiters.push(
            Limiter::builder()
                .clock(clock.clone())
                .rule(rule)
                .build()
                .unwrap(),
        );
        stores.push(store);
    }
    Fleet { stores, limiters }
}

impl Fleet {
    /// Every instance listening, for at least the `times`th time.
    async fn subscribed(&self, times: u64) {
        let started = Instant::now();
        for store in &self.stores {
            while store.subscriptions() < times {
                assert!(started.elapsed() < NEVER, "a store never listened again");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(store.invalidations().unwrap().is_vouched());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_instance_reaches_every_instance() {
    let clock = ManualClock::new();
    let fleet = fleet(&fixture::unique_schema("notices"), &clock).await;
    fleet.subscribed(1).await;
    let mut delays = Vec::new();
    for round in 0..25 {
        let key = format!("customer-{round}");
        fleet::lock_out(&fleet.limiters, key.as_bytes(), LIMIT).await;
        let from = round % INSTANCES;
        let since = Instant::now();
        fleet.limiters[from].reset(key.as_bytes()).await.unwrap();
        delays.extend(fleet::heard(&fleet.limiters, key.as_bytes(), from, since).await);
        assert_eq!(
            fleet::admitted(&fleet.limiters, key.as_bytes(), 4 * INSTANCES).await,
            LIMIT,
            "round {round}: after the reset the fleet admits exactly the limit"
        );
    }
    fleet::report("reset reached another instance", delays);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_leaves_no_stale_refusal_and_comes_back() {
    let clock = ManualClock::new();
    let schema = fixture::unique_schema("cut");
    let fleet = fleet(&schema, &clock).await;
    fleet.subscribed(1).await;
    fleet::lock_out(&fleet.limiters, b"alice", LIMIT).await;

    // Every listener's connection terminated, then the key reset at once:
    // the notice is sent while nobody listens.
    let admin = fleet.stores[0].pool();
    let listening = format!("LISTEN \"{schema}.notices\"");
    let terminated: Vec<(bool,)> =
        sqlx::query_as("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1")
            .bind(&listening)
            .fetch_all(admin)
            .await
            .unwrap();
    assert_eq!(terminated.len(), INSTANCES, "one listener per instance");
    let since = Instant::now();
    fleet.limiters[0].reset(b"alice").await.unwrap();
    fleet::report(
        "reset with every listener terminated",
        fleet::heard(&fleet.limiters, b"alice", 0, since).await,
    );
    assert_eq!(
        fleet::admitted(&fleet.limiters, b"alice", 4 * INSTANCES).await,
        LIMIT
    );

    // The listeners come back by themselves, and with them the caches and
    // the notices.
    fleet.subscribed(2).await;
    fleet::lock_out(&fleet.limiters, b"bob", LIMIT).await;
    let since = Instant::now();
    fleet.limiters[1].reset(b"bob").await.unwrap();
    fleet::report(
        "reset after the listeners came back",
        fleet::heard(&fleet.limiters, b"bob", 1, since).await,
    );
    assert_eq!(
        fleet::admitted(&fleet.limiters, b"bob", 4 * INSTANCES).await,
        LIMIT
    );
}
