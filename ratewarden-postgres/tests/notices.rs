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
use ratewarden_test_support::postgres as fixture;

const INSTANCES: usize = 4;
const LIMIT: u32 = 5;

/// Far longer than a notice takes on any machine: reached, the test fails
/// as a notice that never came.
const NEVER: Duration = Duration::from_secs(10);

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
    /// Spends the key's limit and has every instance refuse it from its
    /// refusal cache.
    async fn lock_out(&self, key: &[u8]) {
        assert_eq!(self.admitted(key, 4 * INSTANCES).await, LIMIT);
        for (i, limiter) in self.limiters.iter().enumerate() {
            let cached = limiter.stats()[0].refusals_cached;
            assert!(!limiter.check(key).await.allowed);
            assert_eq!(
                limiter.stats()[0].refusals_cached,
                cached + 1,
                "instance {i} must refuse from its refusal cache, or the test proves nothing"
            );
        }
    }

    /// How long after `since` each instance other than `from` stopped
    /// refusing `key` (a peek answers from the refusal cache while it holds
    /// a refusal, and spends nothing).
    async fn heard(&self, key: &[u8], from: usize, since: Instant) -> Vec<Duration> {
        let mut delays = Vec::new();
        for (i, limiter) in self.limiters.iter().enumerate() {
            if i == from {
                continue;
            }
            loop {
                if limiter.peek(key).await.allowed {
                    delays.push(since.elapsed());
                    break;
                }
                assert!(
                    since.elapsed() < NEVER,
                    "instance {i} still refuses the key {NEVER:?} after a reset on instance {from}"
                );
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        delays
    }

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

    /// How many of `n` requests, round robin, the fleet admits.
    async fn admitted(&self, key: &[u8], n: usize) -> u32 {
        let mut admitted = 0;
        for limiter in self.limiters.iter().cycle().take(n) {
            admitted += u32::from(limiter.check(key).await.allowed);
        }
        admitted
    }
}

fn report(what: &str, mut delays: Vec<Duration>) {
    delays.sort();
    let at = |p: f64| delays[((delays.len() - 1) as f64 * p).round() as usize];
    println!(
        "{what}: {} notices, p50 {:?}, p99 {:?}, max {:?}",
        delays.len(),
        at(0.50),
        at(0.99),
        delays[delays.len() - 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_instance_reaches_every_instance() {
    let clock = ManualClock::new();
    let fleet = fleet(&fixture::unique_schema("notices"), &clock).await;
    fleet.subscribed(1).await;
    let mut delays = Vec::new();
    for round in 0..25 {
        let key = format!("customer-{round}");
        fleet.lock_out(key.as_bytes()).await;
        let from = round % INSTANCES;
        let since = Instant::now();
        fleet.limiters[from].reset(key.as_bytes()).await.unwrap();
        delays.extend(fleet.heard(key.as_bytes(), from, since).await);
        assert_eq!(
            fleet.admitted(key.as_bytes(), 4 * INSTANCES).await,
            LIMIT,
            "round {round}: after the reset the fleet admits exactly the limit"
        );
    }
    report("reset reached another instance", delays);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_leaves_no_stale_refusal_and_comes_back() {
    let clock = ManualClock::new();
    let schema = fixture::unique_schema("cut");
    let fleet = fleet(&schema, &clock).await;
    fleet.subscribed(1).await;
    fleet.lock_out(b"alice").await;

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
    report(
        "reset with every listener terminated",
        fleet.heard(b"alice", 0, since).await,
    );
    assert_eq!(fleet.admitted(b"alice", 4 * INSTANCES).await, LIMIT);

    // The listeners come back by themselves, and with them the caches and
    // the notices.
    fleet.subscribed(2).await;
    fleet.lock_out(b"bob").await;
    let since = Instant::now();
    fleet.limiters[1].reset(b"bob").await.unwrap();
    report(
        "reset after the listeners came back",
        fleet.heard(b"bob", 1, since).await,
    );
    assert_eq!(fleet.admitted(b"bob", 4 * INSTANCES).await, LIMIT);
}
