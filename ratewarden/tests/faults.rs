//! The composition against a real Redis and a real PostgreSQL that are
//! stopped, restarted and paused, by one set of scenarios run against each
//! server: decisions keep coming within the rule's timeout, answered by the
//! fallback or the failure policy; an open breaker answers without calling
//! the store; the shared store is used again after a restart; an honest
//! client is never refused because a fallback happened in its window; and a
//! request refused by a local tier sends nothing to the server.
//!
//! Time in the limiter is a `ManualClock`; wall time is only a hang guard
//! and is printed, never asserted.
//!
//! About 710 lines: the fault scenarios, written once, and the two servers
//! they run against.
#![cfg(all(feature = "memory", any(feature = "redis", feature = "postgres")))]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden::memory::MemoryStore;
use ratewarden::{
    BreakerConfig, BreakerState, Decision, FailurePolicy, Limiter, ManualClock, Policy, Rule, Store,
};
use ratewarden_test_support::containers::Container;
use ratewarden_test_support::stores::Recording;

/// Every store call is bounded by this: long enough that a healthy answer
/// on a loaded machine is never taken for a failure, so that only the
/// paused server's calls reach it.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Far above [`TIMEOUT`]: only a decision that ignores its timeout reaches
/// it. A guard against hangs, not a measurement.
const HANG_GUARD: Duration = Duration::from_secs(30);
/// The stores' own timeout, above [`HANG_GUARD`]: a rule that waited for
/// the store instead of its own timeout would reach the guard.
const STORE_TIMEOUT: Duration = Duration::from_secs(60);
/// Consecutive failures that open a breaker.
const FAILURES: u32 = 2;
/// How long a breaker stays open, on the manual clock.
const COOL_DOWN: Duration = Duration::from_secs(5);

/// The three answers to a failing shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A memory store answers the same policy (fail closed behind it, so
    /// that a missing fallback would show as refusals).
    Fallback,
    /// No fallback; admit.
    Open,
    /// No fallback; refuse.
    Closed,
}

const MODES: [Mode; 3] = [Mode::Fallback, Mode::Open, Mode::Closed];

/// One limiter under test: its rule's store (counted) and its fallback.
struct Case {
    mode: Mode,
    limiter: Limiter,
    shared: Arc<Recording<Arc<dyn Store>>>,
    fallback: Option<Arc<MemoryStore>>,
}

impl Case {
    /// A limiter with one rule named after `mode`, on `store`, with the
    /// short timeout and breaker of these tests.
    fn new(mode: Mode, store: Arc<dyn Store>, policy: Policy, clock: &ManualClock) -> Case {
        let shared = Arc::new(Recording::new(store));
        let name = match mode {
            Mode::Fallback => "fallback",
            Mode::Open => "open",
            Mode::Closed => "closed",
        };
        let mut rule = Rule::new(name, shared.clone(), policy)
            .unwrap()
            .with_timeout(TIMEOUT)
            .unwrap()
            .with_breaker(BreakerConfig::new(FAILURES, COOL_DOWN).unwrap());
        let mut fallback = None;
        rule = match mode {
            Mode::Fallback => {
                let memory = Arc::new(MemoryStore::new(1_000));
                fallback = Some(memory.clone());
                rule.with_fallback(memory)
                    .unwrap()
                    .on_failure(FailurePolicy::Closed)
            }
            Mode::Open => rule.on_failure(FailurePolicy::Open),
            Mode::Closed => rule.on_failure(FailurePolicy::Closed),
        };
        Case {
            mode,
            limiter: Limiter::builder()
                .clock(clock.clone())
                .rule(rule)
                .build()
                .unwrap(),
            shared,
            fallback,
        }
    }

    fn stats(&self) -> ratewarden::RuleStats {
        self.limiter.stats().remove(0)
    }

    /// One decision under the hang guard, with its wall time (printed by
    /// the tests, never asserted).
    async fn check(&self, key: &[u8]) -> (Decision, Duration) {
        guarded(self.limiter.check(key)).await
    }

    /// Asserts the decision is what this mode answers while the shared
    /// store cannot.
    fn assert_degraded_answer(&self, d: &Decision) {
        match self.mode {
            Mode::Fallback => {
                assert!(d.allowed, "{:?}: the fallback admits: {d:?}", self.mode);
                assert!(d.source.fallback, "{:?}: {d:?}", self.mode);
                assert!(!d.source.degraded, "{:?}: {d:?}", self.mode);
                assert_eq!(d.source.store, "memory", "{:?}: {d:?}", self.mode);
            }
            Mode::Open => {
                assert!(d.allowed, "fail open admits: {d:?}");
                assert!(d.source.degraded && !d.source.fallback, "{d:?}");
            }
            Mode::Closed => {
                assert!(!d.allowed, "fail closed refuses: {d:?}");
                assert!(d.source.degraded && !d.source.fallback, "{d:?}");
                assert_eq!(d.retry_after, Duration::from_secs(1), "{d:?}");
            }
        }
    }

    /// Asserts the decision came from the shared store `name`.
    fn assert_shared_answer(&self, d: &Decision, name: &str) {
        assert_eq!(d.source.store, name, "{:?}: {d:?}", self.mode);
        assert!(
            !d.source.fallback && !d.source.degraded,
            "{:?}: {d:?}",
            self.mode
        );
        assert!(d.allowed, "{:?}: {d:?}", self.mode);
    }

    /// After the server is back: moves the clock past the cool-down and
    /// decides for keys of its own until the store answers [`HEALTHY`]
    /// decisions in a row (the client may need a few attempts to reconnect,
    /// and a pool may hold several connections broken by the outage, each
    /// failing once). Returns the attempts.
    async fn recover(&self, clock: &ManualClock, name: &str) -> u32 {
        for attempt in 1..=100 {
            clock.advance(COOL_DOWN);
            let key = format!("recovery-probe-{attempt}");
            let mut healthy = 0;
            while healthy < HEALTHY {
                let (d, _) = self.check(key.as_bytes()).await;
                if d.source.store != name || d.source.fallback || d.source.degraded {
                    break;
                }
                healthy += 1;
            }
            if healthy == HEALTHY {
                assert_eq!(self.stats().breaker, BreakerState::Closed);
                return attempt;
            }
            // Waiting for the server and the client's reconnection, not for
            // the limiter's time, which the manual clock drives.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{:?}: the shared store never answered again after the restart: {:?}",
            self.mode,
            self.stats()
        );
    }
}

/// Consecutive answers from the shared store that count as recovered.
const HEALTHY: u32 = 8;

/// Runs `f` under [`HANG_GUARD`], returning its output and wall time.
async fn guarded<F: Future>(f: F) -> (F::Output, Duration) {
    let start = Instant::now();
    let out = tokio::time::timeout(HANG_GUARD, f)
        .await
        .expect("a decision waited far beyond its store timeout");
    (out, start.elapsed())
}

/// A one-line summary of wall times, for the test's output.
fn summary(label: &str, times: &[Duration]) -> String {
    let ms: Vec<String> = times
        .iter()
        .map(|t| format!("{:.1}", t.as_secs_f64() * 1000.0))
        .collect();
    format!("{label}: wall ms per decision [{}]", ms.join(", "))
}

/// A server the scenarios stop, pause and restart, and what they expect of
/// it where servers differ.
trait Server {
    /// The store's name in decisions.
    const NAME: &'static str;
    /// The limit of the memory tier in front of it in
    /// [`local_refusal_sends_nothing`].
    const BURST: u32;

    /// A server of the calling test's own.
    async fn start() -> (Container, String);
    /// A server of its own on a fixed host port, so that its address
    /// survives a stop and a start.
    async fn start_on_fixed_port() -> (Container, String);
    /// Stops the server as a crash would.
    async fn stop(container: &Container);
    /// Polls until the server answers again after a start.
    async fn wait_until_up(url: &str);
    /// A store on `url` in a namespace of its own, whose own timeout is
    /// above the rule's, so that the rule's is the one under test.
    async fn store(url: &str, what: &str) -> Arc<dyn Store>;
    /// Checks how many of the honest client's 3 requests before `fault` the
    /// server still counted when it answered again.
    fn check_counted_before(fault: Fault, counted: u32);

    /// What counts the commands a store sends to a server of the test's
    /// own, and keeps that server running.
    type Counter;
    /// A store on a server (or database) where the counter sees only its
    /// commands.
    async fn counted_store() -> (Arc<dyn Store>, Self::Counter);
    /// Commands counted so far.
    async fn commands(counter: &mut Self::Counter) -> u64;
}

/// How the server fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Stopped, then started again.
    Stop,
    /// Paused, then unpaused: connections stay open and hear nothing.
    Pause,
}

fn cases(store: Arc<dyn Store>, clock: &ManualClock) -> Vec<Case> {
    MODES
        .iter()
        .map(|&m| {
            Case::new(
                m,
                store.clone(),
                Policy::sliding_log(100, Duration::from_secs(3600)).unwrap(),
                clock,
            )
        })
        .collect()
}

/// While the server is down: the first `FAILURES` calls fail, the breaker
/// opens, and every later call is answered without reaching the store.
async fn while_down(case: &Case, label: &str) {
    let calls_before = case.shared.calls();
    let errors_before = case.stats().store_errors;
    let mut times = Vec::new();
    for _ in 0..6 {
        let (d, t) = case.check(b"client").await;
        times.push(t);
        case.assert_degraded_answer(&d);
    }
    println!("{}", summary(&format!("{label} {:?}", case.mode), &times));
    let s = case.stats();
    assert_eq!(s.breaker, BreakerState::Open, "{s:?}");
    assert_eq!(s.store_errors - errors_before, u64::from(FAILURES), "{s:?}");
    assert_eq!(
        case.shared.calls() - calls_before,
        u64::from(FAILURES),
        "only the calls before the breaker opened reach the store"
    );
    assert_eq!(s.short_circuited, 6 - u64::from(FAILURES), "{s:?}");
    match case.mode {
        Mode::Fallback => assert_eq!(s.fallbacks, 6, "{s:?}"),
        Mode::Open | Mode::Closed => assert_eq!(s.degraded, 6, "{s:?}"),
    }
    // Still open: more decisions, no more calls and no more errors.
    for _ in 0..10 {
        let (d, _) = case.check(b"client").await;
        case.assert_degraded_answer(&d);
    }
    assert_eq!(
        case.shared.calls() - calls_before,
        u64::from(FAILURES),
        "an open breaker never calls the store"
    );
    assert_eq!(
        case.stats().store_errors - errors_before,
        u64::from(FAILURES)
    );
    assert_eq!(case.stats().short_circuited, 16 - u64::from(FAILURES));
}

async fn served_again<S: Server>(case: &Case, clock: &ManualClock) -> u32 {
    let attempts = case.recover(clock, S::NAME).await;
    println!(
        "{:?}: shared store answered again after {attempts} probe(s)",
        case.mode
    );
    let short = case.stats().short_circuited;
    for _ in 0..3 {
        let (d, _) = case.check(b"client").await;
        case.assert_shared_answer(&d, S::NAME);
    }
    let s = case.stats();
    assert_eq!(s.breaker, BreakerState::Closed, "{s:?}");
    assert_eq!(s.short_circuited, short, "{s:?}");
    attempts
}

async fn stopped_server_is_answered_then_used_again<S: Server>() {
    let (container, url) = S::start_on_fixed_port().await;
    let clock = ManualClock::new();
    let cases = cases(S::store(&url, "faults").await, &clock);
    for case in &cases {
        for _ in 0..3 {
            let (d, _) = case.check(b"client").await;
            case.assert_shared_answer(&d, S::NAME);
        }
    }

    S::stop(&container).await;
    for case in &cases {
        while_down(case, "stopped").await;
    }
    // A probe after the cool-down while the server is still down fails and
    // opens the breaker for another cool-down.
    clock.advance(COOL_DOWN);
    for case in &cases {
        let calls = case.shared.calls();
        let (d, _) = case.check(b"client").await;
        case.assert_degraded_answer(&d);
        assert_eq!(case.shared.calls(), calls + 1, "one probe");
        assert_eq!(case.stats().breaker, BreakerState::Open);
        let (d, _) = case.check(b"client").await;
        case.assert_degraded_answer(&d);
        assert_eq!(case.shared.calls(), calls + 1, "no second probe");
    }

    container.start().await.expect("docker start");
    S::wait_until_up(&url).await;
    for case in &cases {
        let attempts = served_again::<S>(case, &clock).await;
        // Opened by the outage and again by the failed probe while it
        // lasted (and possibly by probes that found the client reconnecting).
        assert!(case.stats().breaker_opened >= 2, "{:?}", case.stats());
        println!("{:?}: {attempts} recovery attempt(s)", case.mode);
    }
}

async fn paused_server_costs_one_timeout_per_failure_then_none<S: Server>() {
    let (container, url) = S::start().await;
    let clock = ManualClock::new();
    let cases = cases(S::store(&url, "faults").await, &clock);
    for case in &cases {
        let (d, _) = case.check(b"client").await;
        case.assert_shared_answer(&d, S::NAME);
    }

    container.pause().await.expect("docker pause");
    // Each of the first FAILURES decisions waits for the timeout (the hang
    // guard in `check` proves none waits for the paused server), then the
    // breaker answers without calling the store. The cases are independent
    // limiters: they wait for their timeouts at the same time.
    let [fallback, open, closed] = &cases[..] else {
        panic!("one case per mode");
    };
    tokio::join!(
        while_down(fallback, "paused"),
        while_down(open, "paused"),
        while_down(closed, "paused"),
    );

    container.unpause().await.expect("docker unpause");
    for case in &cases {
        served_again::<S>(case, &clock).await;
    }
}

/// An honest client sends exactly `limit` requests in one window while the
/// server fails for part of it: every one is admitted, and each is counted
/// by exactly one store (the `remaining` each store reports proves which).
async fn honest_client<S: Server>(fault: Fault) {
    const LIMIT: u32 = 10;
    let (container, url) = match fault {
        Fault::Stop => S::start_on_fixed_port().await,
        Fault::Pause => S::start().await,
    };
    let clock = ManualClock::new();
    // One hour, so that the cool-downs of the recovery stay inside it.
    let policy = Policy::sliding_log(LIMIT, Duration::from_secs(3600)).unwrap();
    let case = Case::new(
        Mode::Fallback,
        S::store(&url, "honest").await,
        policy,
        &clock,
    );
    let memory = case.fallback.clone().unwrap();
    let mut admitted = 0;

    for i in 0..3 {
        let (d, _) = case.check(b"honest").await;
        case.assert_shared_answer(&d, S::NAME);
        assert_eq!(d.remaining, LIMIT - 1 - i, "{d:?}");
        admitted += 1;
        clock.advance(Duration::from_secs(1));
    }
    assert!(
        memory.is_empty(),
        "the fallback is not consulted while the server answers"
    );

    match fault {
        Fault::Stop => S::stop(&container).await,
        Fault::Pause => container.pause().await.expect("docker pause"),
    }
    for i in 0..3 {
        let (d, _) = case.check(b"honest").await;
        case.assert_degraded_answer(&d);
        assert_eq!(
            d.remaining,
            LIMIT - 1 - i,
            "the fallback counts only the requests it answered: {d:?}"
        );
        admitted += 1;
        clock.advance(Duration::from_secs(1));
    }

    match fault {
        Fault::Stop => {
            container.start().await.expect("docker start");
            S::wait_until_up(&url).await;
        }
        Fault::Pause => container.unpause().await.expect("docker unpause"),
    }
    // Another client's request is the probe that closes the breaker.
    case.recover(&clock, S::NAME).await;
    let mut first = None;
    for i in 0..4u32 {
        let (d, _) = case.check(b"honest").await;
        case.assert_shared_answer(&d, S::NAME);
        admitted += 1;
        let counted_before = *first.get_or_insert(LIMIT - 1 - d.remaining);
        assert_eq!(d.remaining, LIMIT - 1 - counted_before - i, "{d:?}");
    }
    let counted_before = first.unwrap();
    println!(
        "{fault:?}: {} had counted {counted_before} of the honest client's requests when it \
         answered again (3 before the fault; a pause may add the timed-out calls it executed \
         late)",
        S::NAME
    );
    S::check_counted_before(fault, counted_before);
    assert_eq!(admitted, LIMIT);
    assert_eq!(case.stats().refused, 0, "{:?}", case.stats());
}

/// A memory tier in front of the server: what it admits costs one command
/// each on the server, what it refuses costs none.
async fn local_refusal_sends_nothing<S: Server>() {
    let (durable, mut counter) = S::counted_store().await;
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(1_000));
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(
            Rule::new(
                "burst",
                memory,
                Policy::sliding_log(S::BURST, Duration::from_secs(300)).unwrap(),
            )
            .unwrap(),
        )
        .rule(
            Rule::new(
                "hourly",
                durable,
                Policy::sliding_log(40, Duration::from_secs(3600)).unwrap(),
            )
            .unwrap()
            .with_timeout(TIMEOUT)
            .unwrap(),
        )
        .build()
        .unwrap();
    // Loads the script or prepares the statement, so the count below is of
    // decisions only.
    assert!(limiter.check(b"warm-up").await.allowed);

    let start = S::commands(&mut counter).await;
    for _ in 0..S::BURST {
        let (d, _) = guarded(limiter.check(b"client")).await;
        assert!(d.allowed, "{d:?}");
    }
    let after_admitted = S::commands(&mut counter).await;
    assert_eq!(
        after_admitted - start,
        u64::from(S::BURST),
        "each admitted request is one command on the shared tier"
    );
    for _ in 0..50 {
        let (d, _) = guarded(limiter.check(b"client")).await;
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.source.rule, Some("burst"));
        assert_eq!(d.source.store, "memory");
    }
    assert_eq!(
        S::commands(&mut counter).await,
        after_admitted,
        "50 requests refused by the memory tier sent no command"
    );
    let stats = limiter.stats();
    let admitted = u64::from(S::BURST) + 1;
    assert_eq!(
        (stats[0].allowed, stats[0].refused),
        (admitted, 50),
        "{stats:?}"
    );
    assert_eq!(
        (stats[1].allowed, stats[1].refused),
        (admitted, 0),
        "{stats:?}"
    );
}

/// The scenarios above, one test each, against server `$server`.
macro_rules! fault_tests {
    ($module:ident, $server:ty) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stopped_server_is_answered_by_fallback_or_failure_policy_then_used_again() {
                stopped_server_is_answered_then_used_again::<$server>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn paused_server_costs_one_timeout_per_failure_then_none() {
                super::paused_server_costs_one_timeout_per_failure_then_none::<$server>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn honest_client_is_never_refused_when_the_server_stops_mid_window() {
                honest_client::<$server>(Fault::Stop).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn honest_client_is_never_refused_when_the_server_pauses_mid_window() {
                honest_client::<$server>(Fault::Pause).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_request_refused_by_the_local_tier_sends_nothing_to_the_server() {
                local_refusal_sends_nothing::<$server>().await;
            }
        }
    };
}

#[cfg(feature = "redis")]
struct Redis;

#[cfg(feature = "redis")]
impl Server for Redis {
    const NAME: &'static str = "redis";
    const BURST: u32 = 3;

    async fn start() -> (Container, String) {
        ratewarden_test_support::redis::start_redis().await
    }

    async fn start_on_fixed_port() -> (Container, String) {
        ratewarden_test_support::redis::start_redis_on_fixed_port().await
    }

    async fn stop(container: &Container) {
        container.stop().await.expect("docker stop");
    }

    async fn wait_until_up(url: &str) {
        ratewarden_test_support::redis::wait_until_up(url).await;
    }

    async fn store(url: &str, what: &str) -> Arc<dyn Store> {
        Arc::new(
            ratewarden::redis::RedisStore::builder(url)
                .key_prefix(ratewarden_test_support::redis::unique_prefix(what))
                .timeout(STORE_TIMEOUT)
                .build()
                .unwrap(),
        )
    }

    fn check_counted_before(fault: Fault, counted: u32) {
        match fault {
            // A restart forgets everything, unless the server saved its
            // data set on the way down.
            Fault::Stop => assert!(
                counted == 3 || counted == 0,
                "Redis counted requests it never answered: {counted}"
            ),
            // A pause loses nothing: the 3 answered before it, and at most
            // the 2 timed-out calls it ran late.
            Fault::Pause => assert!((3..=5).contains(&counted), "{counted}"),
        }
    }

    /// A server of the test's own (nothing else runs commands on it) and a
    /// connection reading its `INFO commandstats`.
    type Counter = (Container, redis::aio::MultiplexedConnection);

    async fn counted_store() -> (Arc<dyn Store>, Self::Counter) {
        let (container, url) = Self::start().await;
        let conn = ratewarden_test_support::redis::admin(&url).await;
        (Self::store(&url, "tiers").await, (container, conn))
    }

    /// `cmdstat_evalsha` calls.
    async fn commands((_, conn): &mut Self::Counter) -> u64 {
        let stats = ratewarden_test_support::redis::command_calls(conn).await;
        stats.get("evalsha").copied().unwrap_or(0)
    }
}

#[cfg(feature = "redis")]
fault_tests!(on_redis, Redis);

#[cfg(feature = "postgres")]
struct Postgres;

#[cfg(feature = "postgres")]
impl Server for Postgres {
    const NAME: &'static str = "postgres";
    const BURST: u32 = 12;

    async fn start() -> (Container, String) {
        ratewarden_test_support::postgres::start_private().await
    }

    async fn start_on_fixed_port() -> (Container, String) {
        ratewarden_test_support::postgres::start_on_fixed_port().await
    }

    async fn stop(container: &Container) {
        ratewarden_test_support::postgres::stop(container).await;
    }

    async fn wait_until_up(url: &str) {
        ratewarden_test_support::postgres::wait_ready(url).await;
    }

    async fn store(url: &str, what: &str) -> Arc<dyn Store> {
        Arc::new(
            ratewarden::postgres::PostgresStore::builder(url)
                .schema(ratewarden_test_support::postgres::unique_schema(what))
                // Every statement in the test's database is counted: none
                // from a notice listener's heartbeats.
                .notices(false)
                .pool_size(4)
                .timeout(STORE_TIMEOUT)
                .sweep_interval(None)
                .build()
                .await
                .expect("store builds"),
        )
    }

    fn check_counted_before(fault: Fault, counted: u32) {
        match fault {
            Fault::Stop => assert_eq!(
                counted, 3,
                "the rows survive the restart; nothing else counted"
            ),
            Fault::Pause => assert!((3..=5).contains(&counted), "{counted}"),
        }
    }

    /// The shared server's URL and a database of the test's own in it:
    /// every statement counted in that database is the store's.
    type Counter = (String, String);

    async fn counted_store() -> (Arc<dyn Store>, Self::Counter) {
        use sqlx::Connection;
        let server = ratewarden_test_support::postgres::server_url();
        let mut admin = sqlx::PgConnection::connect(&server).await.unwrap();
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut admin)
            .await
            .expect("pg_stat_statements must be in shared_preload_libraries");
        let db = ratewarden_test_support::postgres::unique_schema("tiers");
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut admin)
            .await
            .unwrap();
        let (base, _) = server.rsplit_once('/').expect("url with a database");
        let store = Self::store(&format!("{base}/{db}"), "tiers").await;
        (store, (server, db))
    }

    /// Statements run in the test's database, from pg_stat_statements
    /// (track = top: client statements, not those the decide functions run
    /// inside).
    async fn commands((server, db): &mut Self::Counter) -> u64 {
        use sqlx::Connection;
        let mut admin = sqlx::PgConnection::connect(server).await.unwrap();
        let calls: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)",
        )
        .bind(&*db)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        calls as u64
    }
}

#[cfg(feature = "postgres")]
fault_tests!(on_postgres, Postgres);
