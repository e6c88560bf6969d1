//! Customers' limits from a table (`PostgresLimitSource`), as an operator
//! edits it with `psql`: a row names a plan or writes limits of its own, an
//! update applies once the TTL ends, a customer without a row and a row
//! that does not parse get the default plan.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_core::{CustomerLimits, LimitSource, ManualClock, Store};
use ratewarden_postgres::{LIMITS_TABLE_EXAMPLE, PostgresLimitSource};
use ratewarden_test_support::postgres as fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_follow_the_table_within_the_ttl() {
    let pool = sqlx::PgPool::connect(&fixture::server_url()).await.unwrap();
    let schema = fixture::unique_schema("limits");
    let run = |sql: String| {
        let pool = pool.clone();
        async move { sqlx::raw_sql(&sql).execute(&pool).await.unwrap() }
    };
    run(format!("CREATE SCHEMA {schema}")).await;
    let create =
        LIMITS_TABLE_EXAMPLE.replace("customer_limits", &format!("{schema}.customer_limits"));
    run(create).await;
    run(format!(
        "INSERT INTO {schema}.customer_limits VALUES \
         ('acme', 'pro', NULL), ('bigco', NULL, 'fixed_window 500/min; 10000/d'), \
         ('broken', NULL, '5/fortnight')"
    ))
    .await;

    let source = PostgresLimitSource::new(pool.clone(), &schema, "customer_limits").unwrap();
    let err = source.limit("broken").await.unwrap_err();
    assert!(err.to_string().contains("\"broken\""), "{err}");
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    let limits = CustomerLimits::builder("api", store)
        .shared_clock(Arc::new(clock.clone()))
        .plan("free", "fixed_window 10/min")
        .plan("pro", "gcra 20/s burst 100")
        .source(source)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let name = |customer: &'static str| {
        let limits = limits.clone();
        async move { limits.resolve(Some(customer)).await.name.to_string() }
    };
    assert_eq!(name("acme").await, "plan:pro");
    assert_eq!(
        name("bigco").await,
        "own:fixed_window 500/min; sliding_log 10000/d"
    );
    assert_eq!(name("nobody").await, "plan:free");
    assert_eq!(name("broken").await, "plan:free");

    run(format!(
        "UPDATE {schema}.customer_limits SET plan = 'free' WHERE customer = 'acme'"
    ))
    .await;
    clock.advance(Duration::from_secs(9));
    assert_eq!(name("acme").await, "plan:pro");
    clock.advance(Duration::from_secs(1));
    assert_eq!(name("acme").await, "plan:free");

    assert!(PostgresLimitSource::new(pool.clone(), "bad name", "t").is_err());
    run(format!("DROP SCHEMA {schema} CASCADE")).await;
}
