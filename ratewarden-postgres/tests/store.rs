//! The PostgreSQL store against a real server: one statement per decision,
//! exactness over a pool, bounded sweeps, schema versions, abuse events,
//! server clock and construction errors.
//!
//! About 960 lines: one test per PostgreSQL behaviour; most share one
//! server, each in a schema of its own.

use ratewarden_conformance::call;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::{
    AbuseEvent, AbuseSink, Algorithm, Ban, ConfigError, ErrorKind, ManualClock, Policy, Store,
    Timestamp,
};
use ratewarden_postgres::{BuildError, PostgresStore, SCHEMA_VERSION};
use ratewarden_test_support::policy;
use ratewarden_test_support::postgres as fixture;
use ratewarden_test_support::stores::{first_admission, warm_up};
use sqlx::{Connection, PgConnection};

const S: u64 = 1_000_000;
const T0: Timestamp = Timestamp::from_micros(1_767_225_600 * S);

fn at(offset_us: u64) -> Timestamp {
    Timestamp::from_micros(T0.as_micros() + offset_us)
}

async fn admin() -> PgConnection {
    PgConnection::connect(&fixture::server_url())
        .await
        .expect("admin connection")
}

async fn count_rows(store: &PostgresStore, table: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{}\".{table}",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .expect("count")
}

/// A store in a database of the calling test's own, recording refusals,
/// and the database's name for [`statement_calls`].
async fn store_in_own_database(prefix: &str) -> (PostgresStore, String) {
    let mut admin = admin().await;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut admin)
        .await
        .expect("pg_stat_statements must be in shared_preload_libraries");
    let track: String = sqlx::query_scalar("SHOW pg_stat_statements.track")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(track, "top");
    let db = fixture::unique_schema(prefix);
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let base = fixture::server_url();
    let (server, _) = base.rsplit_once('/').expect("url with a database");
    let url = format!("{server}/{db}");
    let store = PostgresStore::builder(&url)
        .schema("counted")
        .sweep_interval(None)
        // Semantics, not latency: not the half-second default.
        .timeout(Duration::from_secs(10))
        .record_refusals(true)
        .build()
        .await
        .unwrap();
    (store, db)
}

/// Every statement clients have sent to database `db`, by
/// pg_stat_statements, but the notice listener's heartbeat: the store sends
/// it every second on its own, so a test that runs longer than that on a
/// loaded machine would count it among the decisions.
async fn statement_calls(db: &str) -> i64 {
    let mut admin = admin().await;
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) \
         AND query NOT LIKE 'SELECT pg_notify(%'",
    )
    .bind(db)
    .fetch_one(&mut admin)
    .await
    .unwrap()
}

fn counted_policies() -> Vec<Policy> {
    policy::of_every_algorithm(3, Duration::from_secs(60))
}

/// pg_stat_statements (track = top) counts every statement a client sends,
/// and not those the decide functions run inside. Counting every statement
/// in a database of this test's own proves that N decisions are N
/// statements, whatever they are; a transaction counter would not be exact,
/// since backends flush those stats lazily.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_decision() {
    let (store, db) = store_in_own_database("stmts").await;
    let policies = counted_policies();
    warm_up(&store, &policies, T0).await;
    let before = statement_calls(&db).await;
    let mut refused_by = std::collections::BTreeSet::new();
    let n = 40;
    for i in 0..n {
        let p = &policies[i % 4];
        let d = call::decide(&store, b"counted key", p, 1, at(i as u64))
            .await
            .unwrap();
        if !d.allowed {
            refused_by.insert(p.algorithm());
        }
    }
    let after = statement_calls(&db).await;
    assert!(
        !refused_by.is_empty(),
        "the run must include refusals (abuse events)"
    );
    assert_eq!(after - before, n as i64, "statements for {n} decisions");
    // Recorded in the same statements: one row per key, policy and window.
    assert_eq!(
        store.abuse_events(b"counted key").await.unwrap().len(),
        refused_by.len()
    );
    drop(store);
}

/// A policy with a ban is decided in one statement as well; its ban is a
/// row of `bans` that `psql` shows, and a reset deletes it with the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_is_decided_in_the_decisions_statement_and_a_reset_deletes_its_row() {
    let (store, db) = store_in_own_database("ban_stmts").await;
    let ban = Ban::new(2, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let policies: Vec<Policy> = counted_policies()
        .into_iter()
        .map(|p| p.with_ban(ban))
        .collect();
    warm_up(&store, &policies, T0).await;
    let before = statement_calls(&db).await;
    let n = 40;
    let mut banned = 0;
    for i in 0..n {
        let p = &policies[i % 4];
        let d = call::decide(&store, b"banned key", p, 1, at(i as u64))
            .await
            .unwrap();
        banned += usize::from(d.source.banned);
    }
    assert_eq!(statement_calls(&db).await - before, n as i64);
    // Ten requests per policy of limit 3: three admitted, one refused, the
    // second refusal bans, and the five after it are the ban's.
    assert_eq!(banned, 4 * 6);
    let bans = format!(
        "SELECT count(*) FROM \"{}\".bans WHERE until_us > 0",
        store.schema()
    );
    let rows: i64 = sqlx::query_scalar(&bans)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 4);
    for p in &policies {
        call::reset(&store, b"banned key", p).await.unwrap();
        let d = call::decide(&store, b"banned key", p, 1, at(100))
            .await
            .unwrap();
        assert!(d.allowed, "{p}: {d:?}");
    }
    let rows: i64 = sqlx::query_scalar(&bans)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

/// Every state row and abuse event of `store`'s schema, as text.
async fn all_rows(store: &PostgresStore) -> String {
    let mut rows = String::new();
    for table in [
        "sliding_log",
        "fixed_window",
        "sliding_window",
        "gcra",
        "bans",
        "abuse_events",
    ] {
        let text: Option<String> = sqlx::query_scalar(&format!(
            "SELECT string_agg(row_to_json(t)::text, ',' ORDER BY row_to_json(t)::text) \
             FROM \"{}\".{table} t",
            store.schema()
        ))
        .fetch_one(store.pool())
        .await
        .unwrap();
        rows.push_str(&format!("{table}: {}\n", text.unwrap_or_default()));
    }
    rows
}

/// A peek is one statement and leaves every row as it was (admitted and
/// refused keys, a key never seen, abuse events included), as `psql`
/// shows them; a reset is one statement that deletes the key's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_is_one_statement_that_changes_no_row_and_a_reset_deletes_one() {
    let (store, db) = store_in_own_database("peek_stmts").await;
    let policies = counted_policies();
    for p in &policies {
        for i in 0..4 {
            // Three admissions and a refusal, which records an abuse event.
            call::decide(&store, b"held", p, 1, at(i)).await.unwrap();
        }
    }
    let before = all_rows(&store).await;
    let statements = statement_calls(&db).await;
    let mut n = 0;
    for p in &policies {
        for (key, cost) in [
            (&b"held"[..], 1),
            (b"held", 3),
            (b"fresh", 1),
            (b"fresh", 3),
        ] {
            let peeked = call::peek(&store, key, p, cost, at(10)).await.unwrap();
            assert_eq!(peeked.allowed, key == b"fresh", "{p}: {peeked:?}");
            n += 1;
        }
    }
    assert_eq!(
        statement_calls(&db).await - statements,
        n,
        "statements for {n} peeks"
    );
    assert_eq!(all_rows(&store).await, before, "the peeks changed a row");

    let statements = statement_calls(&db).await;
    for p in &policies {
        call::reset(&store, b"held", p).await.unwrap();
        let d = call::decide(&store, b"held", p, 3, at(11)).await.unwrap();
        assert!(
            d.allowed && d.remaining == 0,
            "{p}: the full limit after a reset: {d:?}"
        );
    }
    assert_eq!(
        statement_calls(&db).await - statements,
        8,
        "a statement per reset and decision"
    );
    drop(store);
}

/// A refund is one statement too, whether it gives units back or finds
/// nothing to give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_refund() {
    let (store, db) = store_in_own_database("refund_stmts").await;
    let policies = counted_policies();
    // Warm up: connections opened and statements prepared.
    for p in &policies {
        let d = call::decide(&store, b"warm", p, 1, T0).await.unwrap();
        call::refund(&store, b"warm", p, 1, T0, &d).await.unwrap();
    }
    let mut admitted = Vec::new();
    for p in &policies {
        for i in 0..3u64 {
            let key = format!("client-{i}");
            let d = call::decide(&store, key.as_bytes(), p, 1, at(i))
                .await
                .unwrap();
            assert!(d.allowed);
            admitted.push((*p, key, at(i), d));
        }
    }
    let before = statement_calls(&db).await;
    let mut n = 0;
    for (p, key, now, d) in &admitted {
        call::refund(&store, key.as_bytes(), p, 1, *now, d)
            .await
            .unwrap();
        n += 1;
    }
    for p in &policies {
        let (_, _, now, d) = &admitted[0];
        call::refund(&store, b"never seen", p, 1, *now, d)
            .await
            .unwrap();
        n += 1;
    }
    let after = statement_calls(&db).await;
    assert_eq!(after - before, n, "statements for {n} refunds");
    // Each refund gave its unit back: the keys are as they were.
    for (p, key, now, d) in &admitted {
        let again = call::decide(&store, key.as_bytes(), p, 1, *now)
            .await
            .unwrap();
        assert_eq!(again, *d, "{p}: {key} after its refund");
    }
    assert_eq!(count_rows(&store, "sliding_log").await, 3, "no row created");
    drop(store);
}

/// 64 tasks over 16 pooled connections, one key, released together: exactly
/// `limit` admitted under every algorithm, including the race to create the
/// key's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_over_a_pool_are_exact() {
    let store = fixture::builder("concurrent")
        .pool_size(16)
        .build()
        .await
        .unwrap();
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, 10, Duration::from_secs(60)).unwrap();
        for round in 0..2u64 {
            let barrier = Arc::new(tokio::sync::Barrier::new(64));
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let store = store.clone();
                    let barrier = Arc::clone(&barrier);
                    tokio::spawn(async move {
                        barrier.wait().await;
                        call::decide(&store, b"hot", &policy, 1, at(round * 3600 * S))
                            .await
                            .unwrap()
                            .allowed
                    })
                })
                .collect();
            let mut admitted = 0;
            for t in tasks {
                admitted += usize::from(t.await.unwrap());
            }
            assert_eq!(admitted, 10, "{algorithm}, round {round}");
        }
    }
}

/// Expired rows go in batches never larger than asked; live rows stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_remove_expired_rows_in_bounded_batches() {
    let clock = ManualClock::starting_at(T0);
    let store = fixture::builder("sweep")
        .gc_slack(Duration::from_millis(1))
        .sweep_batch(40)
        .sweep_clock(Arc::new(clock.clone()))
        .build()
        .await
        .unwrap();
    let short = Policy::fixed_window(5, Duration::from_secs(1)).unwrap();
    let log = Policy::sliding_log(5, Duration::from_secs(1)).unwrap();
    let long = Policy::gcra(5, Duration::from_secs(3600)).unwrap();
    for i in 0..250u32 {
        let key = format!("short-{i}");
        call::decide(&store, key.as_bytes(), &short, 1, T0)
            .await
            .unwrap();
        if i % 5 == 0 {
            call::decide(&store, key.as_bytes(), &log, 1, T0)
                .await
                .unwrap();
        }
    }
    for i in 0..30u32 {
        let key = format!("long-{i}");
        call::decide(&store, key.as_bytes(), &long, 1, T0)
            .await
            .unwrap();
    }
    // Nothing has expired yet.
    let report = store.sweep(at(S / 2), 100).await.unwrap();
    assert_eq!(report.deleted, 0);

    let mut deleted = 0;
    let mut rounds = 0;
    loop {
        let report = store.sweep(at(10 * S), 100).await.unwrap();
        assert!(report.largest_batch <= 100, "{report:?}");
        deleted += report.state_rows;
        rounds += 1;
        if report.deleted == 0 {
            break;
        }
    }
    assert_eq!(deleted, 300);
    assert!(rounds >= 4, "250 rows in batches of 100 take 3 full rounds");
    assert_eq!(count_rows(&store, "fixed_window").await, 0);
    assert_eq!(count_rows(&store, "sliding_log").await, 0);
    assert_eq!(count_rows(&store, "gcra").await, 30);
    // A swept key starts afresh, as its expired state said it would.
    let d = call::decide(&store, b"short-0", &short, 1, at(10 * S))
        .await
        .unwrap();
    assert_eq!(d.remaining, 4);

    // maintenance() reads the sweep clock and loops its configured batches.
    clock.set(at(2 * 3600 * S));
    let report = store.maintenance().await.unwrap();
    assert_eq!(report.state_rows, 31);
    assert!(report.largest_batch <= 40, "{report:?}");
    assert_eq!(count_rows(&store, "gcra").await, 0);
}

/// Rows for a table's sweep plan, `$1` the row number: expiring at `$1`,
/// so that 100 of them expire before 101.
const PLANNED_ROWS: [(&str, &str); 6] = [
    (
        "sliding_log",
        "INSERT INTO {s}.sliding_log SELECT sha256(i::text::bytea), ARRAY[i], i FROM {rows} i",
    ),
    (
        "fixed_window",
        "INSERT INTO {s}.fixed_window SELECT sha256(i::text::bytea), i, 1, i FROM {rows} i",
    ),
    (
        "sliding_window",
        "INSERT INTO {s}.sliding_window SELECT sha256(i::text::bytea), i, 1, 0, i FROM {rows} i",
    ),
    (
        "gcra",
        "INSERT INTO {s}.gcra SELECT sha256(i::text::bytea), i, i FROM {rows} i",
    ),
    (
        "bans",
        "INSERT INTO {s}.bans SELECT sha256(i::text::bytea), 'gcra', i, 1, i, 0, i FROM {rows} i",
    ),
    (
        "abuse_events",
        "INSERT INTO {s}.abuse_events (key_hash, at_us, expires_at) \
         SELECT sha256(i::text::bytea), i, i FROM {rows} i",
    ),
];

/// Every sweep statement, one per table, finds its rows through the
/// table's expires_at index: a TID scan, never a sequential one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_never_scan_the_table() {
    let store = fixture::fresh_store("plan").await;
    let s = format!("\"{}\"", store.schema());
    let mut conn = store.pool().acquire().await.unwrap();
    // Rows and statistics in every table: on an empty one a sequential
    // scan is the planner's right choice.
    for (table, insert) in PLANNED_ROWS {
        let insert = insert
            .replace("{s}", &s)
            .replace("{rows}", "generate_series(1, 20000)");
        sqlx::query(&insert).execute(&mut *conn).await.unwrap();
        sqlx::query(&format!("ANALYZE {s}.{table}"))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    // The generic plan, as a prepared statement gets after a few runs, and
    // with the server's clock.
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let statements: Vec<String> = store.sweep_statements().map(String::from).collect();
    let mut planned = Vec::new();
    for (i, statement) in statements.iter().enumerate() {
        let (table, _) = PLANNED_ROWS
            .iter()
            .find(|(t, _)| statement.contains(&format!(".{t} ")))
            .unwrap_or_else(|| panic!("a sweep of a table without rows: {statement}"));
        planned.push(*table);
        sqlx::query(&format!("PREPARE sweep{i}(bigint, bigint) AS {statement}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        for now in ["100", "NULL"] {
            let plan: Vec<String> =
                sqlx::query_scalar(&format!("EXPLAIN EXECUTE sweep{i}({now}, 10)"))
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap();
            let plan = plan.join("\n");
            assert!(!plan.contains("Seq Scan"), "{statement}\n{plan}");
            assert!(plan.contains("Tid Scan"), "{statement}\n{plan}");
            assert!(
                plan.contains(&format!("{table}_expires_at")),
                "{statement}\n{plan}"
            );
        }
    }
    planned.sort_unstable();
    let mut every: Vec<&str> = PLANNED_ROWS.iter().map(|(t, _)| *t).collect();
    every.sort_unstable();
    assert_eq!(
        planned, every,
        "one sweep statement per table, each planned"
    );
    drop(conn);
    let report = store
        .sweep(Timestamp::from_micros(101), 1000)
        .await
        .unwrap();
    assert_eq!(report.state_rows, 5 * 100, "{report:?}");
    assert_eq!(report.abuse_events, 100, "{report:?}");
}

/// The garbage-collection time of state dead at `at`, as the schema's
/// `gc_at` computes it: the first multiple of `slack` at least `slack`
/// after `at`.
fn gc_at(at: u64, slack: u64) -> i64 {
    ((at + 2 * slack - 1) / slack * slack) as i64
}

/// The sliding window's row expiry is fixed when its window opens, at
/// `gc_at(start + 2w, slack)`: later admissions in the window leave it as
/// it is, and the next window sets its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_expiry_is_set_when_the_window_opens() {
    // A slack that divides neither the window nor the times, so that the
    // rounding shows, and far below the caller's steps of a second.
    let slack = 7_000u64;
    let store = fixture::builder("sw_expiry")
        .gc_slack(Duration::from_micros(slack))
        .build()
        .await
        .unwrap();
    let w = 60 * S;
    let policy = Policy::sliding_window(100, Duration::from_micros(w)).unwrap();
    let row = async || -> (i64, i64) {
        sqlx::query_as(&format!(
            "SELECT start_us, expires_at FROM \"{}\".sliding_window",
            store.schema()
        ))
        .fetch_one(store.pool())
        .await
        .expect("one sliding-window row")
    };
    let start = T0.as_micros() - T0.as_micros() % w;
    let expected = gc_at(start + 2 * w, slack);
    // 120 s + 7 ms, rounded up to a multiple of 7 ms: 120.008 s.
    assert_eq!(expected, (start + 2 * w) as i64 + 8_000, "by hand");
    for i in 0..=40u64 {
        let now = Timestamp::from_micros(start + 10 * S + 500 + i * S);
        assert!(
            call::decide(&store, b"k", &policy, 1, now)
                .await
                .unwrap()
                .allowed
        );
        assert_eq!(
            row().await,
            (start as i64, expected),
            "after admission {i} in the window"
        );
    }
    let next = start + w;
    let expected = gc_at(next + 2 * w, slack);
    for i in 0..=10u64 {
        let now = Timestamp::from_micros(next + 5 * S + 250 + i * S);
        assert!(
            call::decide(&store, b"k", &policy, 1, now)
                .await
                .unwrap()
                .allowed
        );
        assert_eq!(
            row().await,
            (next as i64, expected),
            "after admission {i} in the next window"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_schema_versions_are_refused() {
    let store = fixture::fresh_store("version").await;
    let schema = store.schema().to_string();
    // Built again on the same schema: accepted, even without migrations.
    fixture::builder("unused")
        .schema(&schema)
        .migrate(false)
        .build()
        .await
        .expect("a current schema is accepted");
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\"._sqlx_migrations \
         (version, description, success, checksum, execution_time) \
         VALUES ($1, 'from the future', true, '\\x00', 0)"
    ))
    .bind(SCHEMA_VERSION + 1)
    .execute(store.pool())
    .await
    .unwrap();
    let err = fixture::builder("unused")
        .schema(&schema)
        .build()
        .await
        .unwrap_err();
    match &err {
        BuildError::SchemaTooNew {
            found, supported, ..
        } => {
            assert_eq!(*found, SCHEMA_VERSION + 1);
            assert_eq!(*supported, SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert!(
        err.to_string().contains("upgrade ratewarden-postgres"),
        "{err}"
    );

    // A schema without tables, with migrations disabled.
    let err = fixture::builder("empty")
        .migrate(false)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, BuildError::SchemaOutdated { found: 0, .. }),
        "{err:?}"
    );

    // A migration altered after it was applied.
    let store = fixture::fresh_store("tampered").await;
    sqlx::query(&format!(
        "UPDATE \"{}\"._sqlx_migrations SET checksum = '\\x01'",
        store.schema()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    for migrate in [true, false] {
        let err = fixture::builder("unused")
            .schema(store.schema())
            .migrate(migrate)
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, BuildError::SchemaMismatch { .. }), "{err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_live_in_the_configured_schema() {
    let store = fixture::fresh_store("placed").await;
    let mut admin = admin().await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = $1 ORDER BY 1",
    )
    .bind(store.schema())
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(
        tables,
        [
            "_sqlx_migrations",
            "abuse_events",
            "bans",
            "fixed_window",
            "gcra",
            "sliding_log",
            "sliding_window"
        ]
    );
    let elsewhere: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE tablename IN ('gcra', '_sqlx_migrations') \
         AND schemaname = 'public'",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(elsewhere, 0);
    // A hostile search_path in the caller's session cannot redirect the
    // functions' table names.
    sqlx::query("SET search_path TO public")
        .execute(&mut admin)
        .await
        .unwrap();
    let allowed: bool = sqlx::query_scalar(&format!(
        "SELECT allowed FROM \"{}\".decide_gcra('k', 1, 1000000, 1, 1, 1000, NULL)",
        store.schema()
    ))
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlogged_tables_and_asynchronous_commit_are_applied() {
    let store = fixture::builder("durability")
        .unlogged(true)
        .synchronous_commit(false)
        .build()
        .await
        .unwrap();
    let persistence: Vec<String> = sqlx::query_scalar(
        "SELECT relpersistence::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname IN ('gcra', 'fixed_window', 'sliding_window', 'sliding_log')",
    )
    .bind(store.schema())
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(persistence, ["u", "u", "u", "u"]);
    let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(sync, "off");
    let policy = Policy::gcra(2, Duration::from_secs(1)).unwrap();
    assert!(
        call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );

    // Built again logged: switched back.
    let store = fixture::builder("unused")
        .schema(store.schema())
        .synchronous_commit(true)
        .build()
        .await
        .unwrap();
    let unlogged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relpersistence = 'u'",
    )
    .bind(store.schema())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(unlogged, 0);
    let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(sync, "on");
    // State survived the switch.
    assert_eq!(
        call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .remaining,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_recorded_with_retention() {
    let store = fixture::builder("abuse")
        .record_refusals(true)
        .abuse_retention(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    assert!(
        call::decide(&store, b"offender", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );
    assert!(
        call::decide(&store, b"honest", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );
    for i in 1..=3 {
        assert!(
            !call::decide(&store, b"offender", &policy, 1, at(i))
                .await
                .unwrap()
                .allowed
        );
    }
    // Three refusals in one window: one row, from the first.
    let events = store.abuse_events(b"offender").await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].algorithm.as_deref(), Some("fixed_window"));
    assert_eq!(events[0].at, at(1));
    assert_eq!(events[0].since, at(1));
    assert_eq!(events[0].refusals, 1);
    assert!(store.abuse_events(b"honest").await.unwrap().is_empty());
    // Only the hash of a key is stored.
    let raw: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{}\".abuse_events WHERE position('offender'::bytea IN key_hash) > 0",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(raw, 0);

    // As a limiter's abuse sink.
    store
        .record(AbuseEvent::new("login", b"offender", at(10), "memory").with_refusals(7, at(4)))
        .await
        .unwrap();
    let events = store.abuse_events(b"offender").await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].rule.as_deref(), Some("login"));
    assert_eq!(events[1].refused_by.as_deref(), Some("memory"));
    assert_eq!(events[1].algorithm, None);
    assert_eq!((events[1].since, events[1].at), (at(4), at(10)));
    assert_eq!(events[1].refusals, 7);

    // Kept for the retention, then swept.
    assert_eq!(store.sweep(at(4 * S), 100).await.unwrap().abuse_events, 0);
    let report = store.sweep(at(6 * S), 100).await.unwrap();
    assert_eq!(report.abuse_events, 2);
    assert_eq!(report.state_rows, 0, "the windows are still open");
    assert!(store.abuse_events(b"offender").await.unwrap().is_empty());
}

/// A flood of refusals is one write per key and window, not one per
/// refusal: the decision looks for the window's row and inserts only when
/// there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refusals_records_one_row_per_window() {
    let store = fixture::builder("flood")
        .record_refusals(true)
        .build()
        .await
        .unwrap();
    let w = 10 * S;
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, 2, Duration::from_micros(w)).unwrap();
        let key = format!("flooder:{algorithm}");
        let key = key.as_bytes();
        let mut first = None;
        let mut refusals = 0;
        for i in 0..1_100 {
            let now = at(i * 1_000);
            if !call::decide(&store, key, &policy, 1, now)
                .await
                .unwrap()
                .allowed
            {
                first.get_or_insert(now);
                refusals += 1;
            }
        }
        assert!(refusals >= 1_000, "{algorithm}: {refusals} refusals");
        let first = first.expect("refusals");
        let events = store.abuse_events(key).await.unwrap();
        assert_eq!(events.len(), 1, "{algorithm}: {refusals} refusals");
        assert_eq!(events[0].at, first, "{algorithm}");
        assert_eq!(events[0].refusals, 1, "{algorithm}");

        // A window after the first recorded refusal, refused again: a new
        // row.
        let later = Timestamp::from_micros(first.as_micros() + w);
        let mut refused = None;
        for _ in 0..=policy.limit() {
            if !call::decide(&store, key, &policy, 1, later)
                .await
                .unwrap()
                .allowed
            {
                refused = Some(later);
                break;
            }
        }
        assert!(refused.is_some(), "{algorithm}: refused again");
        let events = store.abuse_events(key).await.unwrap();
        assert_eq!(events.len(), 2, "{algorithm}");
        assert_eq!(events[1].at, later, "{algorithm}");
        // And only one for that window too.
        for i in 1..50 {
            call::decide(
                &store,
                key,
                &policy,
                1,
                Timestamp::from_micros(later.as_micros() + i),
            )
            .await
            .unwrap();
        }
        assert_eq!(store.abuse_events(key).await.unwrap().len(), 2);
    }
}

/// A refund in server-clock mode is refused before any statement: the
/// admission's time, which locates its units, was the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_mode_refuses_refunds() {
    let store = fixture::builder("server_clock_refund")
        .server_clock(true)
        .build()
        .await
        .unwrap();
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, 5, Duration::from_secs(60)).unwrap();
        let admitted = first_admission(&policy, "postgres");
        let err = call::refund(&store, b"k", &policy, 1, T0, &admitted)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{algorithm}: {err}");
        assert!(!err.is_transient(), "{err}");
        assert!(err.to_string().contains("clock"), "{err}");
    }
    // That nothing reaches the wire is shown by
    // wire::a_refund_refused_in_server_clock_mode_sends_nothing.

    // On a real admission the same, and the admission is kept.
    let policy = Policy::fixed_window(3, Duration::from_secs(3600)).unwrap();
    let d = call::decide(&store, b"k", &policy, 1, T0).await.unwrap();
    assert!(d.allowed);
    let err = call::refund(&store, b"k", &policy, 1, T0, &d)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert_eq!(
        call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .remaining,
        1
    );
}

/// Schemas at version 1 are deployed: building a store on one migrates it
/// in place, keeping state and abuse events, and refunds work on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_migrated_in_place() {
    const V1: &str = include_str!("../migrations/0001_state_tables.sql");
    let schema = fixture::unique_schema("v1");
    let mut admin = admin().await;
    // What version 1 of this crate left: its tables and functions, and
    // sqlx's record of the migration.
    sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(&format!("SET search_path TO \"{schema}\""))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::raw_sql(V1).execute(&mut admin).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
         checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (1, 'state tables', true, sha384(convert_to($1, 'UTF8')), 0)",
    )
    .bind(V1)
    .execute(&mut admin)
    .await
    .unwrap();
    let policy = Policy::gcra(2, Duration::from_secs(10)).unwrap();
    for i in 0..3 {
        let _: (bool,) = sqlx::query_as(
            "SELECT allowed FROM decide_gcra('old', 2, 10000000, 1, $1, 1000000, 3600000000)",
        )
        .bind((T0.as_micros() + i) as i64)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    }

    // A build that may not migrate says what is missing.
    let err = fixture::builder("unused")
        .schema(&schema)
        .migrate(false)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            BuildError::SchemaOutdated {
                found: 1,
                required: SCHEMA_VERSION,
                ..
            }
        ),
        "{err:?}"
    );
    let store = fixture::builder("unused")
        .schema(&schema)
        .record_refusals(true)
        .build()
        .await
        .expect("a version 1 schema is migrated");
    let version: i64 = sqlx::query_scalar(&format!(
        "SELECT max(version) FROM \"{schema}\"._sqlx_migrations"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    // The old abuse event reads as one refusal at its own time.
    let events = store.abuse_events(b"old").await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].refusals, 1);
    assert_eq!(events[0].since, events[0].at);
    // The old state is kept, and refunds apply to it.
    let refused = call::decide(&store, b"old", &policy, 1, at(3))
        .await
        .unwrap();
    assert!(!refused.allowed, "the key's state survived the migration");
    let later = at(5 * S);
    let d = call::decide(&store, b"old", &policy, 1, later)
        .await
        .unwrap();
    assert!(d.allowed);
    call::refund(&store, b"old", &policy, 1, later, &d)
        .await
        .unwrap();
    // Version 3's peek answers on the migrated state.
    assert_eq!(
        call::peek(&store, b"old", &policy, 1, later).await.unwrap(),
        d
    );
    assert_eq!(
        call::decide(&store, b"old", &policy, 1, later)
            .await
            .unwrap(),
        d
    );
}

/// In server-clock mode the `now` passed in is ignored; short real windows
/// show the server's clock deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_mode_ignores_the_callers_time() {
    let store = fixture::builder("server_clock")
        .server_clock(true)
        .build()
        .await
        .unwrap();
    assert!(store.capabilities().server_clock);
    // A caller's clock two hours ahead does not reopen an hour's window.
    let hour = Policy::fixed_window(1, Duration::from_secs(3600)).unwrap();
    assert!(
        call::decide(&store, b"h", &hour, 1, Timestamp::EPOCH)
            .await
            .unwrap()
            .allowed
    );
    let far = Timestamp::from_micros(T0.as_micros() + 2 * 3600 * S);
    let d = call::decide(&store, b"h", &hour, 1, far).await.unwrap();
    assert!(!d.allowed);
    assert!(d.retry_after > Duration::from_secs(3000), "{d:?}");

    // Real time does reopen a short window: at most 3 per 300 ms.
    let policy = Policy::fixed_window(3, Duration::from_millis(300)).unwrap();
    let mut refused = None;
    for _ in 0..1_000 {
        let d = call::decide(&store, b"k", &policy, 1, Timestamp::EPOCH)
            .await
            .unwrap();
        if !d.allowed {
            refused = Some(d);
            break;
        }
    }
    let refused = refused.expect("the limit is reached in real time");
    assert!(refused.retry_after <= Duration::from_millis(300));
    // Polled, with a deadline far beyond the window: a loaded machine only
    // makes the wait longer.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !call::decide(&store, b"k", &policy, 1, Timestamp::EPOCH)
        .await
        .unwrap()
        .allowed
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the server's clock reopens the window"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The sweeper uses the server's clock too: nothing is live long after.
    let report = store.maintenance().await.unwrap();
    assert_eq!(report.state_rows, 0, "the window plus slack has not passed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_fails_at_construction() {
    for url in [
        "",
        "localhost:5432",
        "redis://127.0.0.1:6379",
        "postgres://",
        "postgres://u@h:notaport/db",
    ] {
        let err = PostgresStore::from_url(url).await.unwrap_err();
        assert!(
            matches!(err, BuildError::Config(ConfigError::InvalidUrl { .. })),
            "{url}: {err:?}"
        );
    }
    let err = PostgresStore::from_url("postgres://u:hunter2@h:x/db")
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    for builder in [
        fixture::builder("x").pool_size(0),
        fixture::builder("x").schema("bad-name"),
        fixture::builder("x").schema("pg_catalog"),
        fixture::builder("x").timeout(Duration::ZERO),
        fixture::builder("x").sweep_batch(0),
        fixture::builder("x").gc_slack(Duration::ZERO),
    ] {
        let err = builder.build().await.unwrap_err();
        assert!(matches!(err, BuildError::Config(_)), "{err:?}");
    }
    // Unreachable: an error within the connect timeout, not a hang.
    let err = PostgresStore::builder("postgres://postgres@127.0.0.1:1/postgres")
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_are_errors() {
    let store = fixture::fresh_store("invalid").await;
    let policy = Policy::gcra(3, Duration::from_secs(1)).unwrap();
    for cost in [0, 4] {
        let err = call::decide(&store, b"k", &policy, cost, T0)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ratewarden_core::ErrorKind::InvalidRequest);
    }
    let err = call::decide(&store, b"k", &policy, 1, Timestamp::from_micros(u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ratewarden_core::ErrorKind::InvalidRequest);
    assert_eq!(
        store.sweep(T0, 0).await.unwrap_err().kind(),
        ratewarden_core::ErrorKind::InvalidRequest
    );
}

/// Connections to the shared server named `application_name`.
async fn connections_named(application_name: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(application_name)
        .fetch_one(&mut admin().await)
        .await
        .unwrap()
}

/// The background sweeper deletes expired rows on its own, reading the
/// clock it was given, and stops when its store is dropped: every
/// connection of the store closes, so no sweep of it can run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_sweeper_runs_and_stops_with_its_store() {
    let clock = ManualClock::starting_at(T0);
    let name = fixture::unique_schema("sweeper");
    let mut url = ratewarden_core::url::Url::parse(&fixture::server_url()).unwrap();
    url.query_pairs_mut().append_pair("application_name", &name);
    let swept = PostgresStore::builder(url.as_str())
        .schema(&name)
        .timeout(Duration::from_secs(10))
        .gc_slack(Duration::from_millis(1))
        .sweep_clock(Arc::new(clock.clone()))
        .sweep_interval(Some(Duration::from_millis(50)))
        .build()
        .await
        .unwrap();
    // The same schema without a sweeper, to look on after the drop; rows
    // it writes expire as soon as the sweeper's would.
    let observer = fixture::builder("unused")
        .schema(swept.schema())
        .gc_slack(Duration::from_millis(1))
        .build()
        .await
        .unwrap();
    let policy = Policy::fixed_window(5, Duration::from_secs(1)).unwrap();
    for i in 0..20u32 {
        call::decide(&swept, format!("k{i}").as_bytes(), &policy, 1, T0)
            .await
            .unwrap();
    }
    assert_eq!(count_rows(&observer, "fixed_window").await, 20);
    clock.set(at(10 * S));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while count_rows(&observer, "fixed_window").await != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper removes expired rows without being called"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        connections_named(&name).await >= 1,
        "the store is connected"
    );

    // A sweeper still running would hold the store's pools, and so their
    // connections; once the last of them is gone, nothing can sweep.
    drop(swept);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while connections_named(&name).await != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped store's connections are never closed"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for i in 0..20u32 {
        call::decide(
            &observer,
            format!("k{i}").as_bytes(),
            &policy,
            1,
            at(10 * S),
        )
        .await
        .unwrap();
    }
    clock.set(at(100 * S));
    assert_eq!(count_rows(&observer, "fixed_window").await, 20);
    assert_eq!(connections_named(&name).await, 0, "nothing reconnected");
    // Expired as of the sweeper's clock, and still there: a sweep removes
    // them all.
    let report = observer.sweep(at(100 * S), 100).await.unwrap();
    assert_eq!(report.state_rows, 20, "{report:?}");
}

/// A sliding-log refusal records nothing but drops entries that have
/// expired, as the core algorithm does, so a clock that then goes backwards
/// gets the core's answer, not a stricter one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_refusals_forget_expired_entries_like_the_core() {
    let store = fixture::fresh_store("log_prune").await;
    let policy = Policy::sliding_log(2, Duration::from_secs(10)).unwrap();
    let script = [(1, 0), (1, 5 * S), (2, 12 * S), (1, 9 * S)];
    let mut state = None;
    let mut answers = Vec::new();
    for (cost, offset) in script {
        let ours = call::decide(&store, b"k", &policy, cost, at(offset))
            .await
            .unwrap();
        let core =
            ratewarden_core::algorithm::apply(&mut state, &policy, cost, at(offset).as_micros());
        assert_eq!(
            (ours.allowed, ours.remaining),
            (core.allowed, core.remaining),
            "cost {cost} at +{offset} µs"
        );
        answers.push(ours.allowed);
    }
    // Without the pruning, the last request (back at +9 s) would be refused.
    assert_eq!(answers, [true, true, false, true]);
}
