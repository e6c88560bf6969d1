//! What the network sees: every decision, refund and abuse event of a store
//! built from a URL is exactly one request and one answer, counted by a
//! loopback proxy between the store and the server
//! ([`ratewarden_test_support::WireCounter`]), which sees protocol-level
//! messages that the server's statement statistics cannot (a connection
//! pool's ping is not a statement). sqlx's `PgPool` sends two exchanges for
//! the same statement, which is why the store holds connections of its own;
//! a store on an application's pool is shown paying that price.
//!
//! Setup is excluded from the counts: opening connections, migrations and
//! preparing statements all happen in a warm-up before the measured calls,
//! on a single connection so that the count is exact.

use ratewarden_conformance::call;
use std::time::Duration;

use ratewarden_core::url::Url;
use ratewarden_core::{AbuseEvent, AbuseSink, ErrorKind, Policy, Timestamp};
use ratewarden_postgres::PostgresStore;
use ratewarden_test_support::WireCounter;
use ratewarden_test_support::policy;
use ratewarden_test_support::postgres as fixture;
use ratewarden_test_support::stores::{first_admission, warm_up};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

const S: u64 = 1_000_000;
const T0: Timestamp = Timestamp::from_micros(1_767_225_600 * S);

fn at(offset_us: u64) -> Timestamp {
    Timestamp::from_micros(T0.as_micros() + offset_us)
}

/// A counting proxy to the test server, and the server's URL rewritten to
/// go through it.
async fn proxied() -> (WireCounter, Url) {
    let mut url = Url::parse(&fixture::server_url()).expect("the server URL parses");
    let host = url.host_str().expect("a host").to_string();
    let port = url.port().unwrap_or(5432);
    let target = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("the server's host resolves")
        .next()
        .expect("an address");
    let counter = WireCounter::start(target).await.expect("proxy starts");
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(counter.addr().port())).unwrap();
    (counter, url)
}

/// A store of one connection at `url`, in a fresh schema.
async fn one_connection_store(url: &Url, prefix: &str) -> PostgresStore {
    PostgresStore::builder(url.as_str())
        .schema(fixture::unique_schema(prefix))
        .pool_size(1)
        .record_refusals(true)
        .sweep_interval(None)
        // Its listener's heartbeats would be exchanges too: these tests
        // count the store's statements (`tests/notices.rs` has the
        // notices).
        .notices(false)
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("store builds")
}

/// A store of one connection behind a fresh proxy, in a fresh schema.
async fn store_behind_proxy(prefix: &str) -> (WireCounter, PostgresStore) {
    let (counter, url) = proxied().await;
    (counter, one_connection_store(&url, prefix).await)
}

fn policies() -> Vec<Policy> {
    policy::of_every_algorithm(3, Duration::from_secs(60))
}

/// The statement a store runs for a GCRA decision, as an application would
/// run it on its own pool.
fn decide_gcra_sql(schema: &str) -> String {
    format!(
        "SELECT allowed, remaining, reset_after_us, retry_after_us \
         FROM \"{schema}\".decide_gcra($1, $2, $3, $4, $5, $6, $7)"
    )
}

async fn decide_gcra_on(pool: &PgPool, schema: &str, i: u64) {
    let _: (bool, i64, i64, i64) = sqlx::query_as(&decide_gcra_sql(schema))
        .bind(format!("pool key {}", i % 5).into_bytes())
        .bind(3i64)
        .bind(60_000_000i64)
        .bind(1i64)
        .bind(at(i).as_micros() as i64)
        .bind(60_000_000i64)
        .bind(None::<i64>)
        .fetch_one(pool)
        .await
        .expect("the statement runs");
}

/// The exchanges so far, once a pool of one connection has its connection
/// back and idle: returned, and pinged. Waiting by watching the pool, not
/// by acquiring the connection, whose return would be pinged again.
async fn settled(pool: &PgPool, counter: &WireCounter) -> u64 {
    for _ in 0..10_000 {
        if pool.num_idle() == 1 {
            return counter.exchanges();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the pool's connection never came back");
}

/// N decisions, admitted and refused alike (refusals recorded as abuse
/// events in the same statement), are N exchanges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_one_exchange_on_the_wire() {
    let (counter, store) = store_behind_proxy("wire_decide").await;
    let policies = policies();
    warm_up(&store, &policies, T0).await;
    let connections = counter.connections();
    let before = counter.exchanges();
    let n = 40u64;
    let mut refusals = 0;
    for i in 0..n {
        let p = &policies[(i % 4) as usize];
        if !call::decide(&store, b"key", p, 1, at(i))
            .await
            .unwrap()
            .allowed
        {
            refusals += 1;
        }
    }
    assert_eq!(
        counter.exchanges() - before,
        n,
        "exchanges for {n} decisions"
    );
    assert!(refusals > 0, "the run includes refusals");
    assert_eq!(counter.connections(), connections, "no connection opened");
}

/// N refunds, whether they give units back or find nothing, are N
/// exchanges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refund_is_one_exchange_on_the_wire() {
    let (counter, store) = store_behind_proxy("wire_refund").await;
    let policies = policies();
    let mut admitted = Vec::new();
    for p in &policies {
        let d = call::decide(&store, b"warm", p, 1, T0).await.unwrap();
        call::refund(&store, b"warm", p, 1, T0, &d).await.unwrap();
        for i in 0..3u64 {
            let key = format!("client-{i}");
            let d = call::decide(&store, key.as_bytes(), p, 1, at(i))
                .await
                .unwrap();
            assert!(d.allowed);
            admitted.push((*p, key, at(i), d));
        }
    }
    let before = counter.exchanges();
    let mut n = 0;
    for (p, key, now, d) in &admitted {
        call::refund(&store, key.as_bytes(), p, 1, *now, d)
            .await
            .unwrap();
        n += 1;
    }
    for (p, _, now, d) in &admitted[..4] {
        call::refund(&store, b"never seen", p, 1, *now, d)
            .await
            .unwrap();
        n += 1;
    }
    assert_eq!(counter.exchanges() - before, n, "exchanges for {n} refunds");
    // The refunds did give the units back.
    for (p, key, now, d) in &admitted {
        let again = call::decide(&store, key.as_bytes(), p, 1, *now)
            .await
            .unwrap();
        assert_eq!(again, *d, "{p}: {key} after its refund");
    }
}

/// An abuse event written through the store as an `AbuseSink` is one
/// exchange too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_abuse_event_is_one_exchange_on_the_wire() {
    let (counter, store) = store_behind_proxy("wire_event").await;
    let event =
        |i: u64| AbuseEvent::new("login", b"offender", at(i), "memory").with_refusals(i + 1, at(0));
    store.record(event(0)).await.unwrap();
    let before = counter.exchanges();
    for i in 1..=10 {
        store.record(event(i)).await.unwrap();
    }
    assert_eq!(counter.exchanges() - before, 10);
    assert_eq!(store.abuse_events(b"offender").await.unwrap().len(), 11);
}

/// Why the store holds its own connections: through sqlx's `PgPool` (here
/// without a test before acquire) the same statement is two exchanges, the
/// statement and the ping the pool sends when the connection comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlx_pool_costs_two_exchanges_per_statement() {
    let (counter, url) = proxied().await;
    let store = one_connection_store(&url, "wire_pgpool").await;
    let options: PgConnectOptions = url.as_str().parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_lazy_with(options);
    decide_gcra_on(&pool, store.schema(), 0).await;
    let before = settled(&pool, &counter).await;
    let n = 20;
    for i in 1..=n {
        decide_gcra_on(&pool, store.schema(), i).await;
    }
    let pooled = settled(&pool, &counter).await - before;
    assert_eq!(pooled, 2 * n, "a PgPool: statement and ping");

    // The store, on the same proxy: one each.
    let policy = Policy::gcra(3, Duration::from_secs(60)).unwrap();
    call::decide(&store, b"warm", &policy, 1, T0).await.unwrap();
    let before = counter.exchanges();
    for i in 1..=n {
        call::decide(&store, b"store key", &policy, 1, at(i))
            .await
            .unwrap();
    }
    assert_eq!(
        counter.exchanges() - before,
        n,
        "the store's own connection"
    );
}

/// A store on an application's pool works, and pays the pool's ping: two
/// exchanges per decision, as its documentation says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_on_an_existing_pool_decides_at_two_exchanges_each() {
    let (counter, url) = proxied().await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_lazy(url.as_str())
        .unwrap();
    let store = PostgresStore::builder_with_pool(pool.clone())
        .notices(false)
        .schema(fixture::unique_schema("wire_existing"))
        .sweep_interval(None)
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("a store on an existing pool builds");
    assert!(std::ptr::eq(
        store.pool().connect_options().as_ref(),
        pool.connect_options().as_ref()
    ));
    let policy = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    assert!(
        call::decide(&store, b"warm", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );
    let before = settled(&pool, &counter).await;
    let n = 10;
    let mut admitted = 0;
    for i in 0..n {
        if call::decide(&store, b"key", &policy, 1, at(i))
            .await
            .unwrap()
            .allowed
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3, "the limit holds on an existing pool");
    assert_eq!(settled(&pool, &counter).await - before, 2 * n);
    // Refunds and sweeps run on it too.
    let d = call::decide(&store, b"other", &policy, 1, T0)
        .await
        .unwrap();
    call::refund(&store, b"other", &policy, 1, T0, &d)
        .await
        .unwrap();
    assert_eq!(
        call::decide(&store, b"other", &policy, 1, T0)
            .await
            .unwrap(),
        d
    );
    store.sweep(at(3600 * S), 100).await.unwrap();
}

/// Settings a store cannot apply to a pool it did not open are refused
/// when it is built, not ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_pool_refuses_settings_of_the_stores_own_connections() {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy(&fixture::server_url())
        .unwrap();
    let base = || {
        PostgresStore::builder_with_pool(pool.clone())
            .sweep_interval(None)
            .notices(false)
    };
    for (builder, name) in [
        (base().pool_size(4), "pool_size"),
        (
            base().statement_timeout(Duration::from_secs(1)),
            "statement_timeout",
        ),
        (base().synchronous_commit(false), "synchronous_commit"),
    ] {
        let err = builder.build().await.unwrap_err();
        assert!(
            matches!(err, ratewarden_postgres::BuildError::Config(_)),
            "{err:?}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
    pool.close().await;
    let err = base().build().await.unwrap_err();
    assert!(err.to_string().contains("closed"), "{err}");
}

/// A refund in server-clock mode is refused before anything is sent: no
/// exchange, no connection opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_refused_in_server_clock_mode_sends_nothing() {
    let (counter, url) = proxied().await;
    let store = PostgresStore::builder(url.as_str())
        .notices(false)
        .schema(fixture::unique_schema("wire_server_clock"))
        .server_clock(true)
        .sweep_interval(None)
        .build()
        .await
        .unwrap();
    let connections = counter.connections();
    let before = counter.exchanges();
    let policy = Policy::gcra(5, Duration::from_secs(60)).unwrap();
    let admitted = first_admission(&policy, "postgres");
    let err = call::refund(&store, b"k", &policy, 1, T0, &admitted)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert_eq!(counter.exchanges(), before, "nothing sent");
    assert_eq!(counter.connections(), connections, "nothing opened");
}

/// A connection killed by the server is an error once, then closed and
/// replaced; one abandoned in the middle of a statement (the store's
/// timeout) is never reused, since its answer may still be on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_and_abandoned_connections_are_replaced() {
    let (counter, mut url) = proxied().await;
    let name = fixture::unique_schema("wire_broken");
    url.query_pairs_mut().append_pair("application_name", &name);
    let store = PostgresStore::builder(url.as_str())
        .notices(false)
        .schema(&name)
        .pool_size(1)
        // Healthy answers are asserted: only the decision stuck behind the
        // lock below may reach this.
        .timeout(Duration::from_secs(5))
        .statement_timeout(Duration::from_secs(30))
        .sweep_interval(None)
        .build()
        .await
        .unwrap();
    let policy = Policy::gcra(1_000, Duration::from_secs(60)).unwrap();
    assert!(
        call::decide(&store, b"k", &policy, 1, T0)
            .await
            .unwrap()
            .allowed
    );
    let mut admin = PgConnection::connect(&fixture::server_url()).await.unwrap();

    // Killed by the server.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = $1) t",
    )
    .bind(&name)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    // The build's migration connection may not have left the view yet.
    assert!(killed >= 1, "the store's connection is found by its name");
    let opened = counter.connections();
    let err = call::decide(&store, b"k", &policy, 1, at(1))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        call::decide(&store, b"k", &policy, 1, at(2))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(counter.connections(), opened + 1, "replaced once");

    // Abandoned: the decision waits on a lock past the store's timeout.
    let mut blocker = admin.begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE \"{name}\".gcra IN EXCLUSIVE MODE"))
        .execute(&mut *blocker)
        .await
        .unwrap();
    let err = call::decide(&store, b"k", &policy, 1, at(3))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    blocker.rollback().await.unwrap();
    let opened = counter.connections();
    assert!(
        call::decide(&store, b"k", &policy, 1, at(4))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(
        counter.connections(),
        opened + 1,
        "the abandoned connection was not reused"
    );
    // And the new one is the store's only connection again.
    let before = counter.exchanges();
    assert!(
        call::decide(&store, b"k", &policy, 1, at(5))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(counter.exchanges() - before, 1);
}
