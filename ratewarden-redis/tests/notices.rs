//! A reset reaches every instance of a fleet: four stores on one Redis
//! server (four instances of an application, each with its own store,
//! connection and refusal cache), one key refused on all of them from
//! their caches, then reset through one. Every instance must stop refusing
//! and the fleet admit exactly the limit, also after the notice
//! subscriptions were cut. Prints how long the notice took to reach each
//! instance (wall clock, for the record: nothing here asserts a speed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden_core::{Clock, Limiter, ManualClock, Policy, Rule, Store};
use ratewarden_redis::RedisStore;
use ratewarden_test_support::fleet::{self, NEVER};
use ratewarden_test_support::redis as fixture;

const INSTANCES: usize = 4;
const LIMIT: u32 = 5;

struct Fleet {
    stores: Vec<RedisStore>,
    limiters: Vec<Limiter>,
}

fn fleet(url: &str, prefix: &str, clock: &ManualClock) -> Fleet {
    let mut stores = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::builder(url)
            .key_prefix(prefix)
            .timeout(Duration::from_secs(5))
            .notice_heartbeat(Duration::from_millis(100))
            .build()
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
    /// Every instance subscribed at least `times` times.
    async fn subscribed(&self, times: u64) {
        let started = Instant::now();
        for store in &self.stores {
            while store.subscriptions() < times {
                assert!(started.elapsed() < NEVER, "a store never subscribed again");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(store.invalidations().unwrap().is_vouched());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_instance_reaches_every_instance() {
    let url = fixture::shared_url();
    let clock = ManualClock::new();
    let fleet = fleet(url, &fixture::unique_prefix("notices"), &clock);
    // Opens every store's connection, and so its subscription.
    for store in &fleet.stores {
        store.connect().await.unwrap();
    }
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
async fn a_cut_subscription_leaves_no_stale_refusal_and_comes_back() {
    // A server of its own: the subscriptions it cuts are this test's.
    let (_container, url) = fixture::start_redis().await;
    let mut admin = fixture::admin(&url).await;
    let clock = ManualClock::new();
    let fleet = fleet(&url, "cut:", &clock);
    for store in &fleet.stores {
        store.connect().await.unwrap();
    }
    fleet.subscribed(1).await;
    fleet::lock_out(&fleet.limiters, b"alice", LIMIT).await;

    // Every subscription dropped, and kept from coming back (a password
    // the stores do not have: connections already open are not asked for
    // it), then the key reset: the notice is published while nobody
    // listens, and nobody will hear it.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("kept-out")
        .query_async(&mut admin)
        .await
        .unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, INSTANCES as i64, "one subscription per instance");
    let since = Instant::now();
    fleet.limiters[0].reset(b"alice").await.unwrap();
    fleet::report(
        "reset with every subscription cut",
        fleet::heard(&fleet.limiters, b"alice", 0, since).await,
    );
    assert_eq!(
        fleet::admitted(&fleet.limiters, b"alice", 4 * INSTANCES).await,
        LIMIT
    );

    assert!(
        fleet.stores.iter().all(|s| s.subscriptions() == 1),
        "no subscription came back while the password kept them out"
    );

    // Let them in again: the subscriptions come back by themselves, and
    // with them the caches and the notices.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("")
        .query_async(&mut admin)
        .await
        .unwrap();
    fleet.subscribed(2).await;
    fleet::lock_out(&fleet.limiters, b"bob", LIMIT).await;
    let since = Instant::now();
    fleet.limiters[1].reset(b"bob").await.unwrap();
    fleet::report(
        "reset after the subscriptions came back",
        fleet::heard(&fleet.limiters, b"bob", 1, since).await,
    );
    assert_eq!(
        fleet::admitted(&fleet.limiters, b"bob", 4 * INSTANCES).await,
        LIMIT
    );
}

/// Four instances leasing batches of up to 4 units from one fixed window
/// of 20: units bought before a reset on one instance must not be spent on
/// the others after it, where the shared store has forgotten them, or the
/// fleet admits more than the limit after the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_drops_the_units_other_instances_leased_before_it() {
    use ratewarden_core::lease::{LeaseConfig, LeasedStore};
    const LEASED_LIMIT: u32 = 20;
    let url = fixture::shared_url();
    let clock = ManualClock::new();
    let prefix = fixture::unique_prefix("leased");
    let policy = Policy::fixed_window(LEASED_LIMIT, Duration::from_secs(900)).unwrap();
    let mut leases = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::builder(url)
            .key_prefix(prefix.clone())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        store.connect().await.unwrap();
        let leased = Arc::new(LeasedStore::new(
            Arc::new(store),
            LeaseConfig::new(4).unwrap(),
        ));
        let shared: Arc<dyn Store> = leased.clone();
        limiters.push(
            Limiter::builder()
                .clock(clock.clone())
                .rule(Rule::new("login", shared, policy).unwrap())
                .build()
                .unwrap(),
        );
        leases.push(leased);
    }
    // Each instance buys batches of 1 and 2 for its first two requests:
    // one unit left in hand on each.
    for limiter in &limiters {
        for _ in 0..2 {
            assert!(limiter.check(b"partner").await.allowed);
        }
    }
    let in_hand = |i: usize| leases[i].units_in_hand(b"login:partner", &policy, clock.now());
    let before: Vec<u32> = (0..INSTANCES).map(in_hand).collect();
    assert!(
        before[1..].iter().all(|&u| u > 0),
        "every instance must hold leased units, or the test proves nothing: {before:?}"
    );
    limiters[0].reset(b"partner").await.unwrap();
    let since = Instant::now();
    for i in 1..INSTANCES {
        while in_hand(i) > 0 {
            assert!(
                since.elapsed() < NEVER,
                "instance {i} still holds units leased before the reset"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    let mut admitted = 0;
    for limiter in limiters.iter().cycle().take(10 * LEASED_LIMIT as usize) {
        admitted += u32::from(limiter.check(b"partner").await.allowed);
    }
    println!(
        "after the reset the fleet admitted {admitted} of {LEASED_LIMIT} (units in hand before it: {before:?})"
    );
    assert!(
        admitted <= LEASED_LIMIT,
        "after the reset the fleet admitted {admitted}, over the limit of {LEASED_LIMIT}: units leased before it were spent"
    );
}
