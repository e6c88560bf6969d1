//! The over-admission bounds stated in `ratewarden_core`'s composition docs,
//! measured: a fleet of N limiters in one process, each with its own memory
//! store, sharing one Redis or Postgres server, all driven by one manual
//! clock. One attacker key, requests round-robin across the instances, many
//! more than the limit, all inside one window; the admitted count must be
//! exactly the documented bound for the composition. Leased quotas are
//! measured the same way, under the limit by the server calls they make,
//! and under over-demand by the round trips counted on the wire.
#![cfg(all(feature = "redis", feature = "postgres", feature = "memory"))]

use ratewarden_conformance::call;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ratewarden::memory::MemoryStore;
use ratewarden::redis::RedisStore;
use ratewarden::{
    AbuseEvent, AbuseSink, BreakerConfig, Clock, FailurePolicy, Limiter, ManualClock, Policy, Rule,
    Store, StoreError, Timestamp,
};
use ratewarden_test_support::postgres as pg_fixture;
use ratewarden_test_support::redis as redis_fixture;
use rstest::rstest;

/// Instances in the fleet.
const N: u32 = 4;
/// The policy's limit.
const L: u32 = 10;
/// Requests per instance: far beyond the limit.
const PER_INSTANCE: u32 = 50;
/// Far above every timeout below: only a hang reaches it.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// The shared store's timeout: a healthy answer on a loaded machine is
/// never taken for a failure (which would hand out a local quota).
const TIMEOUT: Duration = Duration::from_secs(10);

fn policy() -> Policy {
    Policy::sliding_log(L, Duration::from_secs(60)).unwrap()
}

fn redis_store(url: &str) -> Arc<dyn Store> {
    Arc::new(
        RedisStore::builder(url)
            .key_prefix(redis_fixture::unique_prefix("fleet"))
            // Counted on the wire: decisions only, not notice heartbeats.
            .notices(false)
            .timeout(TIMEOUT)
            .build()
            .unwrap(),
    )
}

fn local() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new(1_000))
}

/// `N` instances on `clock`, instance `i` limited by the one rule `rule(i)`
/// under the generous [`TIMEOUT`] in place of the default quarter second.
fn fleet(clock: &ManualClock, rule: impl Fn(u32) -> Rule) -> Vec<Limiter> {
    fleet_of(N, clock, rule)
}

/// [`fleet`] of `n` instances.
fn fleet_of(n: u32, clock: &ManualClock, rule: impl Fn(u32) -> Rule) -> Vec<Limiter> {
    (0..n)
        .map(|i| {
            Limiter::builder()
                .clock(clock.clone())
                .rule(rule(i).with_timeout(TIMEOUT).unwrap())
                .build()
                .unwrap()
        })
        .collect()
}

/// Sends `per_instance` requests for one key to each instance, round-robin,
/// without moving the clock; returns how many were admitted.
async fn drive(fleet: &[Limiter], per_instance: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..per_instance {
        for limiter in fleet {
            let d = tokio::time::timeout(HANG_GUARD, limiter.check(b"attacker"))
                .await
                .expect("a decision hung");
            admitted += u32::from(d.allowed);
        }
    }
    admitted
}

fn total(fleet: &[Limiter], f: impl Fn(&ratewarden::RuleStats) -> u64) -> u64 {
    fleet.iter().map(|l| f(&l.stats()[0])).sum()
}

/// The server a fleet shares.
#[derive(Debug, Clone, Copy)]
enum Server {
    /// The shared Redis server, a key prefix of the test's own.
    Redis,
    /// The shared PostgreSQL server, a schema of the test's own.
    Postgres,
}

impl Server {
    async fn store(self) -> Arc<dyn Store> {
        match self {
            Server::Redis => redis_store(redis_fixture::shared_url()),
            Server::Postgres => Arc::new(pg_fixture::fresh_store("fleet").await),
        }
    }
}

/// A fleet whose one rule decides on the shared store alone, failing
/// closed, admits exactly the limit, and never degrades.
#[rstest]
#[case::redis(Server::Redis)]
#[case::postgres(Server::Postgres)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_store_only_admits_the_limit_across_the_fleet(#[case] server: Server) {
    let shared = server.store().await;
    let clock = ManualClock::new();
    let fleet = fleet(&clock, |_| {
        Rule::new("search", shared.clone(), policy())
            .unwrap()
            .on_failure(FailurePolicy::Closed)
    });
    assert_eq!(drive(&fleet, PER_INSTANCE).await, L);
    assert_eq!(total(&fleet, |s| s.degraded), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_store_with_local_fallback_admits_the_limit_while_the_server_is_up() {
    let clock = ManualClock::new();
    let shared = redis_store(redis_fixture::shared_url());
    let fleet = fleet(&clock, |_| {
        Rule::new("search", shared.clone(), policy())
            .unwrap()
            .with_fallback(local())
            .unwrap()
    });
    assert_eq!(drive(&fleet, PER_INSTANCE).await, L);
    assert_eq!(total(&fleet, |s| s.fallbacks), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_store_with_local_fallback_admits_the_limit_per_instance_more_when_it_fails() {
    // A server of this test's own, since it is stopped.
    let (container, url) = redis_fixture::start_redis().await;
    let clock = ManualClock::new();
    let shared = redis_store(&url);
    let rule = |cache: bool| {
        let r = Rule::new("search", shared.clone(), policy())
            .unwrap()
            .with_breaker(BreakerConfig::new(2, Duration::from_secs(5)).unwrap())
            .with_fallback(local())
            .unwrap();
        if cache { r } else { r.without_refusal_cache() }
    };
    // The bound is reached without the refusal cache; with it (the
    // default), refusals the shared store made before the outage stand
    // through it, and an offender already refused gets nothing more.
    let worst = fleet(&clock, |_| rule(false));
    let cached = fleet(&clock, |_| rule(true));
    let before = drive(&worst, PER_INSTANCE / 2).await;
    assert_eq!(before, L);
    assert_eq!(drive(&cached, 1).await, 0, "the shared limit is spent");
    container.stop().await.expect("docker stop");
    // Same window: each local store counts alone from zero.
    let during = drive(&worst, PER_INSTANCE / 2).await;
    assert_eq!(during, N * L);
    assert_eq!(before + during, L + N * L, "the documented bound, exactly");
    assert_eq!(drive(&cached, PER_INSTANCE / 2).await, 0);
    assert_eq!(total(&cached, |s| s.fallbacks), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_store_only_admits_the_limit_per_instance() {
    let clock = ManualClock::new();
    let fleet = fleet(&clock, |_| Rule::new("search", local(), policy()).unwrap());
    assert_eq!(drive(&fleet, PER_INSTANCE).await, N * L);
}

/// Sample interval and durable limit of the escalation tests.
const K: u32 = 5;
const D: u32 = 3;

/// The documented bound for escalation is the local one, `N·L`: every
/// durable refusal refuses its sampled request and refunds its local unit,
/// which a later request of the flood then takes.
async fn escalation(durable: Arc<dyn Store>, sink: Arc<dyn AbuseSink>) -> Vec<Limiter> {
    let clock = ManualClock::new();
    let fleet = fleet(&clock, |_| {
        Rule::new("search", local(), policy())
            .unwrap()
            .with_escalation(
                durable.clone(),
                Policy::sliding_log(D, Duration::from_secs(3600)).unwrap(),
                K,
                Some(sink.clone()),
            )
            .unwrap()
    });
    let admitted = drive(&fleet, PER_INSTANCE).await;
    assert_eq!(admitted, N * L, "the documented bound, exactly");
    let escalations = total(&fleet, |s| s.escalations);
    let refunds = total(&fleet, |s| s.refunds);
    // Each instance locally admits L plus one per refund, and samples one
    // in every K of those: at least ⌊L/K⌋ each, and all but D of the
    // samples are refused by the durable limit and refunded.
    assert!(escalations >= u64::from(N * (L / K)), "{escalations}");
    assert_eq!(refunds, escalations - u64::from(D));
    assert_eq!(total(&fleet, |s| s.refund_failures), 0);
    assert_eq!(
        total(&fleet, |s| s.refused),
        u64::from(N * PER_INSTANCE - admitted)
    );
    fleet
}

/// Every refusal is counted by the sink, in one event per instance per
/// window plus the counts a flush writes: never one write per refusal.
async fn check_abuse_writes(fleet: &[Limiter], written: impl AsyncFn() -> u64) -> u64 {
    let refused = total(fleet, |s| s.refused);
    assert_eq!(
        written().await,
        u64::from(N),
        "one write per instance for one key"
    );
    let mut flushed = 0;
    for limiter in fleet {
        flushed += limiter.flush_abuse_events().await;
    }
    assert_eq!(flushed, u64::from(N), "each instance held back the rest");
    assert_eq!(total(fleet, |s| s.abuse_events), 2 * u64::from(N));
    refused
}

#[derive(Debug, Default)]
struct CountingSink {
    writes: AtomicU64,
    refusals: AtomicU64,
}

#[async_trait]
impl AbuseSink for CountingSink {
    async fn record(&self, event: AbuseEvent) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.refusals.fetch_add(event.refusals, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_to_redis_admits_the_documented_bound() {
    let sink = Arc::new(CountingSink::default());
    let fleet = escalation(redis_store(redis_fixture::shared_url()), sink.clone()).await;
    let refused = check_abuse_writes(&fleet, async || sink.writes.load(Ordering::SeqCst)).await;
    assert_eq!(
        sink.refusals.load(Ordering::SeqCst),
        refused,
        "every refusal counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_to_postgres_admits_the_documented_bound_and_records_abuse() {
    let durable = Arc::new(pg_fixture::fresh_store("fleet_escalation").await);
    let fleet = escalation(durable.clone(), durable.clone()).await;
    let rows = async || durable.abuse_events(b"attacker").await.unwrap();
    check_abuse_writes(&fleet, async || rows().await.len() as u64).await;
    let events = rows().await;
    assert_eq!(events.len() as u64, 2 * u64::from(N), "one row per write");
    assert!(events.iter().all(|e| e.rule.as_deref() == Some("search")));
    assert_eq!(
        events.iter().map(|e| e.refusals).sum::<u64>(),
        total(&fleet, |s| s.refused),
        "every refusal counted in the rows"
    );
}

/// Leased quotas: each instance buys units in batches from the shared
/// server. Far beyond the limit, the fleet admits exactly `L` (every leased
/// unit is counted by the server, and every instance keeps asking until it
/// has spent what it holds); under the limit, it admits every request at
/// about one server call per ten.
#[rstest]
#[case::redis(Server::Redis)]
#[case::postgres(Server::Postgres)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_fleet_admits_the_limit_with_a_call_per_batch(#[case] server: Server) {
    use ratewarden::lease::{LeaseConfig, LeasedStore};
    let shared = server.store().await;
    let clock = ManualClock::new();
    let fleet_of = |limit: u32| -> (Vec<Limiter>, Vec<Arc<LeasedStore>>) {
        let stores: Vec<Arc<LeasedStore>> = (0..N)
            .map(|_| {
                Arc::new(LeasedStore::new(
                    shared.clone(),
                    LeaseConfig::new(32).unwrap(),
                ))
            })
            .collect();
        let policy = Policy::fixed_window(limit, Duration::from_secs(60)).unwrap();
        let fleet = fleet(&clock, |i| {
            Rule::new("leased", stores[i as usize].clone(), policy)
                .unwrap()
                .on_failure(FailurePolicy::Closed)
        });
        (fleet, stores)
    };
    let (fleet, _) = fleet_of(L);
    assert_eq!(drive(&fleet, PER_INSTANCE).await, L);
    assert_eq!(total(&fleet, |s| s.degraded), 0);

    // A quota of 1,000 per minute used at 80 %, a key of its own.
    let (busy, stores) = fleet_of(1_000);
    let mut admitted = 0;
    for _ in 0..200 {
        for limiter in &busy {
            admitted += u32::from(limiter.check(b"tenant").await.allowed);
        }
    }
    assert_eq!(admitted, N * 200);
    let calls: u64 = stores.iter().map(|s| s.stats().round_trips).sum();
    // Per instance: batches of 1, 2, 4, 8, 16, then 32: 11 calls for 200.
    assert_eq!(
        calls,
        u64::from(N) * 11,
        "server calls for {admitted} admissions"
    );
}

/// Leases under over-demand on a real Redis, counted on the wire: fleets
/// of 2, 8 and 32 instances, each a `Limiter` on its own lease of up to 32
/// units, one key of `8 × N × 32` per 10 s (the smallest limit the lease
/// docs state the bound for) asked for two, five and ten times its limit in
/// all (even streams, each instance at its own phase), three windows of the
/// manual clock. The refused part of the traffic must not cost the round
/// trips leases save: at most 0.10 exchanges with Redis per admission,
/// never more than the limit in a window of the store's, and at least the
/// limit less what the batches can strand or leave unclaimed
/// (`(N + 1) × 31`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_under_over_demand_cost_a_tenth_of_a_round_trip_per_admission() {
    use ratewarden::lease::{LeaseConfig, LeasedStore};
    const UNITS: u32 = 32;
    const WINDOWS: u64 = 3;
    let (wire, url) = redis_fixture::shared_through_counter().await;
    let shared = redis_store(&url);
    let window = Duration::from_secs(10);
    let w = window.as_micros() as u64;
    for instances in [2u64, 8, 32] {
        let limit = 8 * instances as u32 * UNITS;
        for (policy, name) in [
            (Policy::fixed_window(limit, window).unwrap(), "fixed"),
            (Policy::sliding_window(limit, window).unwrap(), "sliding"),
        ] {
            // Not counted: the connection and the script's first load.
            let now = ManualClock::DEFAULT_START;
            call::decide(&shared, b"warm-up", &policy, 1, now)
                .await
                .unwrap();
            for factor in [2, 5, 10] {
                let key = format!("tenant-{instances}-{name}-{factor}");
                let clock = ManualClock::new();
                let fleet = fleet_of(instances as u32, &clock, |_| {
                    let leased = LeasedStore::new(shared.clone(), LeaseConfig::new(UNITS).unwrap());
                    Rule::new("leased", Arc::new(leased), policy).unwrap()
                });
                // Window-aligned, and the first request at the start: a window
                // counted here is one of the store's, for either algorithm.
                let t0 = clock.now().as_micros().div_ceil(w) * w;
                let gap = w * instances / (u64::from(limit) * factor);
                let mut events: Vec<(u64, usize)> = Vec::new();
                for i in 0..instances {
                    let mut t = gap * i / instances;
                    while t < WINDOWS * w {
                        events.push((t, i as usize));
                        t += gap;
                    }
                }
                events.sort_unstable();
                let before = wire.exchanges();
                let mut admitted = [0u64; WINDOWS as usize];
                for (t, i) in events {
                    clock.set(Timestamp::from_micros(t0 + t));
                    let d = tokio::time::timeout(HANG_GUARD, fleet[i].check(key.as_bytes()))
                        .await
                        .expect("a decision hung");
                    assert!(!d.source.degraded, "{d:?}");
                    if d.allowed {
                        admitted[(t / w) as usize] += 1;
                    }
                }
                let exchanges = wire.exchanges() - before;
                let total: u64 = admitted.iter().sum();
                let what = format!(
                    "{instances} instances, {name} window at {factor}x: {exchanges} exchanges, \
                 {admitted:?}"
                );
                println!(
                    "{what}: {:.3} per admission",
                    exchanges as f64 / total as f64
                );
                assert!(exchanges * 10 <= total, "{what}: over 0.10 per admission");
                for n in admitted {
                    assert!(n <= u64::from(limit), "{what}: over the limit");
                    assert!(
                        n >= u64::from(limit) - (instances + 1) * u64::from(UNITS - 1),
                        "{what}: too many units lost"
                    );
                }
            }
        }
    }
}
