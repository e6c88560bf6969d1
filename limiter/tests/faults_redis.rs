//! The composition against a real Redis that is stopped, restarted and
//! paused: decisions keep coming within the rule's timeout, answered by the
//! fallback or the failure policy; an open breaker answers without calling
//! the store; the shared store is used again after a restart; an honest
//! client is never refused because a fallback happened in its window; and a
//! request refused by a local tier sends no command to Redis.
//!
//! Time in the limiter is a `ManualClock`; wall time is only a hang guard
//! and is printed, never asserted.
#![cfg(all(feature = "redis", feature = "memory"))]

#[path = "../../backend-redis/tests/common/mod.rs"]
mod redis_common;
mod support_faults;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use limiter::memory::MemoryStore;
use limiter::redis::RedisStore;
use limiter::{BreakerState, Limiter, ManualClock, Policy, Rule, Store};
use redis::aio::MultiplexedConnection;
use support_faults::{COOL_DOWN, Case, FAILURES, MODES, Mode, guarded, summary};

const NAME: &str = "redis";

fn store(url: &str, what: &str) -> Arc<dyn Store> {
    // The store's own timeout is above the rule's, so the rule's is the one
    // under test.
    Arc::new(
        RedisStore::builder(url)
            .key_prefix(redis_common::unique_prefix(what))
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap(),
    )
}

async fn admin(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// Polls until the server answers PING again after a start.
async fn wait_until_up(url: &str) {
    for _ in 0..200 {
        if let Ok(Ok(mut c)) = tokio::time::timeout(
            Duration::from_secs(1),
            redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection(),
        )
        .await
        {
            let pong: Result<String, _> = redis::cmd("PING").query_async(&mut c).await;
            if pong.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("Redis at {url} did not come back within 20 s");
}

fn cases(url: &str, clock: &ManualClock) -> Vec<Case> {
    let store = store(url, "faults");
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

async fn served_by_redis_again(case: &Case, clock: &ManualClock) -> u32 {
    let attempts = case.recover(clock, NAME).await;
    println!(
        "{:?}: shared store answered again after {attempts} probe(s)",
        case.mode
    );
    let short = case.stats().short_circuited;
    for _ in 0..3 {
        let (d, _) = case.check(b"client").await;
        case.assert_shared_answer(&d, NAME);
    }
    let s = case.stats();
    assert_eq!(s.breaker, BreakerState::Closed, "{s:?}");
    assert_eq!(s.short_circuited, short, "{s:?}");
    attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_redis_is_answered_by_fallback_or_failure_policy_then_used_again() {
    // A fixed host port, so the address survives the stop and the start.
    let (container, url) = redis_common::start_redis_on_fixed_port().await;
    let clock = ManualClock::new();
    let cases = cases(&url, &clock);
    for case in &cases {
        for _ in 0..3 {
            let (d, _) = case.check(b"client").await;
            case.assert_shared_answer(&d, NAME);
        }
    }

    container.stop().await.expect("docker stop");
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
    wait_until_up(&url).await;
    for case in &cases {
        let attempts = served_by_redis_again(case, &clock).await;
        // Opened by the outage and again by the failed probe while it
        // lasted (and possibly by probes that found the client reconnecting).
        assert!(case.stats().breaker_opened >= 2, "{:?}", case.stats());
        println!("{:?}: {attempts} recovery attempt(s)", case.mode);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_costs_one_timeout_per_failure_then_none() {
    let (container, url) = redis_common::start_redis().await;
    let clock = ManualClock::new();
    let cases = cases(&url, &clock);
    for case in &cases {
        let (d, _) = case.check(b"client").await;
        case.assert_shared_answer(&d, NAME);
    }

    container.pause().await.expect("docker pause");
    for case in &cases {
        // Each of the first FAILURES decisions waits for the timeout (the
        // hang guard in `check` proves none waits for the paused server),
        // then the breaker answers without calling the store.
        while_down(case, "paused").await;
    }

    container.unpause().await.expect("docker unpause");
    for case in &cases {
        served_by_redis_again(case, &clock).await;
    }
}

/// An honest client sends exactly `limit` requests in one window while the
/// server fails for part of it: every one is admitted, and each is counted
/// by exactly one store (the `remaining` each store reports proves which).
async fn honest_client(fault: &str) {
    const LIMIT: u32 = 10;
    let (container, url) = if fault == "stop" {
        redis_common::start_redis_on_fixed_port().await
    } else {
        redis_common::start_redis().await
    };
    let clock = ManualClock::new();
    // One hour, so that the cool-downs of the recovery stay inside it.
    let policy = Policy::sliding_log(LIMIT, Duration::from_secs(3600)).unwrap();
    let case = Case::new(Mode::Fallback, store(&url, "honest"), policy, &clock);
    let memory = case.fallback.clone().unwrap();
    let mut admitted = 0;

    for i in 0..3 {
        let (d, _) = case.check(b"honest").await;
        case.assert_shared_answer(&d, NAME);
        assert_eq!(d.remaining, LIMIT - 1 - i, "{d:?}");
        admitted += 1;
        clock.advance(Duration::from_secs(1));
    }
    assert!(
        memory.is_empty(),
        "the fallback is not consulted while Redis answers"
    );

    if fault == "stop" {
        container.stop().await.expect("docker stop");
    } else {
        container.pause().await.expect("docker pause");
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

    if fault == "stop" {
        container.start().await.expect("docker start");
        wait_until_up(&url).await;
    } else {
        container.unpause().await.expect("docker unpause");
    }
    // Another client's request is the probe that closes the breaker.
    case.recover(&clock, NAME).await;
    let mut first = None;
    for i in 0..4u32 {
        let (d, _) = case.check(b"honest").await;
        case.assert_shared_answer(&d, NAME);
        admitted += 1;
        let counted_before = *first.get_or_insert(LIMIT - 1 - d.remaining);
        assert_eq!(d.remaining, LIMIT - 1 - counted_before - i, "{d:?}");
    }
    let counted_before = first.unwrap();
    println!(
        "{fault}: Redis had counted {counted_before} of the honest client's requests when it \
         answered again (3 before the fault; a restart without persistence would show 0; \
         a pause may add the timed-out calls it executed late)"
    );
    assert!(
        counted_before == 3 || counted_before == 0 || (fault == "pause" && counted_before <= 5),
        "Redis counted requests it never answered: {counted_before}"
    );
    assert_eq!(admitted, LIMIT);
    assert_eq!(case.stats().refused, 0, "{:?}", case.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_client_is_never_refused_when_redis_stops_mid_window() {
    honest_client("stop").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_client_is_never_refused_when_redis_pauses_mid_window() {
    honest_client("pause").await;
}

/// `cmdstat_evalsha` calls, from `INFO commandstats`.
async fn evalsha_calls(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let stats: BTreeMap<&str, u64> = info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name, calls.parse().ok()?))
        })
        .collect();
    stats.get("evalsha").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_the_local_tier_sends_no_command_to_redis() {
    // A server of its own: nothing else runs commands on it.
    let (_container, url) = redis_common::start_redis().await;
    let mut conn = admin(&url).await;
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(1_000));
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(
            Rule::new(
                "burst",
                memory,
                Policy::sliding_log(3, Duration::from_secs(300)).unwrap(),
            )
            .unwrap(),
        )
        .rule(
            Rule::new(
                "hourly",
                store(&url, "tiers"),
                Policy::sliding_log(40, Duration::from_secs(3600)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    // Loads the script, so the count below is of decisions only.
    assert!(limiter.check(b"warm-up").await.allowed);

    let start = evalsha_calls(&mut conn).await;
    for _ in 0..3 {
        let (d, _) = guarded(limiter.check(b"client")).await;
        assert!(d.allowed, "{d:?}");
    }
    let after_admitted = evalsha_calls(&mut conn).await;
    assert_eq!(
        after_admitted - start,
        3,
        "each admitted request is one EVALSHA on the shared tier"
    );
    for _ in 0..50 {
        let (d, _) = guarded(limiter.check(b"client")).await;
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.source.rule, Some("burst"));
        assert_eq!(d.source.store, "memory");
    }
    assert_eq!(
        evalsha_calls(&mut conn).await,
        after_admitted,
        "50 requests refused by the memory tier sent no EVALSHA"
    );
    let stats = limiter.stats();
    assert_eq!((stats[0].allowed, stats[0].refused), (4, 50), "{stats:?}");
    assert_eq!((stats[1].allowed, stats[1].refused), (4, 0), "{stats:?}");
}
