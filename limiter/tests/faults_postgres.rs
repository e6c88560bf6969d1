//! The composition against a real PostgreSQL that is stopped, restarted and
//! paused: decisions keep coming within the rule's timeout, answered by the
//! fallback or the failure policy; an open breaker answers without calling
//! the store; the shared store is used again after a restart; an honest
//! client is never refused because a fallback happened in its window; and a
//! request refused by a local tier sends no statement to Postgres.
//!
//! Time in the limiter is a `ManualClock`; wall time is only a hang guard
//! and is printed, never asserted.
#![cfg(all(feature = "postgres", feature = "memory"))]

#[path = "../../backend-postgres/tests/common/mod.rs"]
mod pg_common;
mod support_faults;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use limiter::memory::MemoryStore;
use limiter::postgres::PostgresStore;
use limiter::{BreakerState, Limiter, ManualClock, Policy, Rule, Store};
use sqlx::{Connection, PgConnection};
use support_faults::{COOL_DOWN, Case, FAILURES, MODES, Mode, guarded, summary};
use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

const NAME: &str = "postgres";

/// A private server on a fixed host port, so its address survives a stop
/// and a start.
async fn start_on_fixed_port() -> (ContainerAsync<GenericImage>, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let container = pg_common::container_request()
        .with_mapped_port(port, 5432.tcp())
        .start()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot start a PostgreSQL container ({e}); build the local test image with \
                 `scripts/build-test-images.sh` or set LIMITER_POSTGRES_IMAGE"
            )
        });
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    wait_until_up(&url).await;
    (container, url)
}

/// Polls until the server runs a query (after a start or a restart).
async fn wait_until_up(url: &str) {
    for _ in 0..200 {
        let attempt = tokio::time::timeout(Duration::from_secs(1), async {
            let mut c = PgConnection::connect(url).await?;
            sqlx::query("SELECT 1").execute(&mut c).await?;
            c.close().await
        })
        .await;
        if matches!(attempt, Ok(Ok(()))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("PostgreSQL at {url} did not accept queries within 40 s");
}

/// Stops the server; PostgreSQL treats SIGTERM as a smart shutdown that
/// waits for the pool's idle sessions, so it is killed after a second, as
/// a crash would.
async fn stop(container: &ContainerAsync<GenericImage>) {
    container
        .stop_with_timeout(Some(1))
        .await
        .expect("docker stop");
}

async fn store(url: &str, what: &str) -> Arc<dyn Store> {
    // The store's own timeout is above the rule's, so the rule's is the one
    // under test.
    Arc::new(
        PostgresStore::builder(url)
            .schema(pg_common::unique_schema(what))
            .pool_size(4)
            .timeout(Duration::from_secs(2))
            .sweep_interval(None)
            .build()
            .await
            .expect("store builds"),
    )
}

async fn cases(url: &str, clock: &ManualClock) -> Vec<Case> {
    let store = store(url, "faults").await;
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
    assert_eq!(case.shared.calls() - calls_before, u64::from(FAILURES));
    assert_eq!(s.short_circuited, 6 - u64::from(FAILURES), "{s:?}");
    match case.mode {
        Mode::Fallback => assert_eq!(s.fallbacks, 6, "{s:?}"),
        Mode::Open | Mode::Closed => assert_eq!(s.degraded, 6, "{s:?}"),
    }
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

async fn served_by_postgres_again(case: &Case, clock: &ManualClock) -> u32 {
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
async fn stopped_postgres_is_answered_by_fallback_or_failure_policy_then_used_again() {
    let (container, url) = start_on_fixed_port().await;
    let clock = ManualClock::new();
    let cases = cases(&url, &clock).await;
    for case in &cases {
        for _ in 0..3 {
            let (d, _) = case.check(b"client").await;
            case.assert_shared_answer(&d, NAME);
        }
    }

    stop(&container).await;
    for case in &cases {
        while_down(case, "stopped").await;
    }
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
        let attempts = served_by_postgres_again(case, &clock).await;
        // Opened by the outage and again by the failed probe while it
        // lasted (and possibly by probes that found the client reconnecting).
        assert!(case.stats().breaker_opened >= 2, "{:?}", case.stats());
        println!("{:?}: {attempts} recovery attempt(s)", case.mode);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_postgres_costs_one_timeout_per_failure_then_none() {
    let (container, url) = pg_common::start_private().await;
    let clock = ManualClock::new();
    let cases = cases(&url, &clock).await;
    for case in &cases {
        let (d, _) = case.check(b"client").await;
        case.assert_shared_answer(&d, NAME);
    }

    container.pause().await.expect("docker pause");
    for case in &cases {
        while_down(case, "paused").await;
    }

    container.unpause().await.expect("docker unpause");
    for case in &cases {
        served_by_postgres_again(case, &clock).await;
    }
}

/// An honest client sends exactly `limit` requests in one window while the
/// database fails for part of it: every one is admitted, and each is
/// counted by exactly one store (the `remaining` each reports proves which).
async fn honest_client(fault: &str) {
    const LIMIT: u32 = 10;
    let (container, url) = if fault == "stop" {
        start_on_fixed_port().await
    } else {
        pg_common::start_private().await
    };
    let clock = ManualClock::new();
    let policy = Policy::sliding_log(LIMIT, Duration::from_secs(3600)).unwrap();
    let case = Case::new(Mode::Fallback, store(&url, "honest").await, policy, &clock);
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
        "the fallback is not consulted while Postgres answers"
    );

    if fault == "stop" {
        stop(&container).await;
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
        "{fault}: Postgres had counted {counted_before} of the honest client's requests when it \
         answered again (3 before the fault; a pause may add timed-out statements it ran late)"
    );
    if fault == "stop" {
        assert_eq!(
            counted_before, 3,
            "the rows survive the restart; nothing else counted"
        );
    } else {
        assert!((3..=5).contains(&counted_before), "{counted_before}");
    }
    assert_eq!(admitted, LIMIT);
    assert_eq!(case.stats().refused, 0, "{:?}", case.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_client_is_never_refused_when_postgres_stops_mid_window() {
    honest_client("stop").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_client_is_never_refused_when_postgres_pauses_mid_window() {
    honest_client("pause").await;
}

/// Statements run in database `db`, from pg_stat_statements (track = top:
/// client statements, not those the decide functions run inside).
async fn statements(admin_url: &str, db: &str) -> i64 {
    let mut admin = PgConnection::connect(admin_url).await.unwrap();
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)",
    )
    .bind(db)
    .fetch_one(&mut admin)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_the_local_tier_sends_no_statement_to_postgres() {
    let server = pg_common::server_url();
    let mut admin = PgConnection::connect(&server).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut admin)
        .await
        .expect("pg_stat_statements must be in shared_preload_libraries");
    // A database of this test's own: every statement counted in it is ours.
    let db = pg_common::unique_schema("tiers");
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let (base, _) = server.rsplit_once('/').expect("url with a database");
    let durable = store(&format!("{base}/{db}"), "tiers").await;
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(1_000));
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(
            Rule::new(
                "burst",
                memory,
                Policy::sliding_log(12, Duration::from_secs(300)).unwrap(),
            )
            .unwrap(),
        )
        .rule(
            Rule::new(
                "hourly",
                durable,
                Policy::sliding_log(40, Duration::from_secs(3600)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    // Opens the pool's connection and prepares the statement.
    assert!(limiter.check(b"warm-up").await.allowed);

    let start = statements(&server, &db).await;
    for _ in 0..12 {
        let (d, _) = guarded(limiter.check(b"client")).await;
        assert!(d.allowed, "{d:?}");
    }
    let after_admitted = statements(&server, &db).await;
    assert_eq!(
        after_admitted - start,
        12,
        "each admitted request is one statement on the durable tier"
    );
    for _ in 0..50 {
        let (d, _) = guarded(limiter.check(b"client")).await;
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.source.rule, Some("burst"));
    }
    assert_eq!(
        statements(&server, &db).await,
        after_admitted,
        "50 requests refused by the memory tier sent no statement"
    );
    let stats = limiter.stats();
    assert_eq!((stats[1].allowed, stats[1].refused), (13, 0), "{stats:?}");
}
