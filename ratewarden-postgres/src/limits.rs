//! [`PostgresLimitSource`]: customers' limits from a table of the
//! application's database, for [`CustomerLimits`](ratewarden_core::CustomerLimits).

use std::time::Duration;

use async_trait::async_trait;
use ratewarden_core::{CustomerLimit, ErrorKind, LimitSource, StoreError, parse_policies};
use sqlx::postgres::PgPool;

use crate::error::invalid;
use crate::quote_ident;

/// The table [`PostgresLimitSource`] reads: one row per customer with a
/// limit of its own, naming a plan or writing its limits as text.
///
/// ```sql
/// CREATE TABLE customer_limits (
///     customer text PRIMARY KEY,
///     plan     text,   -- a plan of the CustomerLimits ('pro'), or
///     limits   text,   -- limits of its own ('gcra 20/s burst 100; 10000/d')
///     CHECK ((plan IS NULL) <> (limits IS NULL))
/// );
/// ```
pub const LIMITS_TABLE_EXAMPLE: &str = "CREATE TABLE customer_limits (\n    \
    customer text PRIMARY KEY,\n    plan text,\n    limits text,\n    \
    CHECK ((plan IS NULL) <> (limits IS NULL))\n)";

/// Customers' limits from a table shaped as [`LIMITS_TABLE_EXAMPLE`]
/// (any name, in any schema of the pool's database): one indexed `SELECT`
/// per customer per TTL, within a timeout. A customer without a row gets
/// the default plan; a row whose limits do not parse is an error naming
/// the customer (and the default plan applies until it is fixed).
///
/// ```no_run
/// # async fn example(store: std::sync::Arc<dyn ratewarden_core::Store>) -> Result<(), Box<dyn std::error::Error>> {
/// use ratewarden_core::CustomerLimits;
/// use ratewarden_postgres::PostgresLimitSource;
///
/// let pool = sqlx::PgPool::connect("postgres://app@10.0.0.6/app").await?;
/// let limits = CustomerLimits::builder("api", store)
///     .plan("free", "100/h")
///     .plan("pro", "gcra 20/s burst 100")
///     .source(PostgresLimitSource::new(pool, "billing", "customer_limits")?)
///     .build()?;
/// # let _ = limits; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresLimitSource {
    pool: PgPool,
    sql: String,
    timeout: Duration,
}

impl PostgresLimitSource {
    /// Reads `schema.table` through `pool`, within a second. Refuses names
    /// that are not plain identifiers.
    pub fn new(
        pool: PgPool,
        schema: &str,
        table: &str,
    ) -> Result<Self, ratewarden_core::ConfigError> {
        for name in [schema, table] {
            crate::schema::validate_schema(name)
                .map_err(|_| invalid(format!("{name:?} is not a plain identifier")))?;
        }
        Ok(PostgresLimitSource {
            pool,
            sql: format!(
                "SELECT plan, limits FROM {}.{} WHERE customer = $1",
                quote_ident(schema),
                quote_ident(table)
            ),
            timeout: Duration::from_secs(1),
        })
    }

    /// Bounds each read (one second unless set).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

#[async_trait]
impl LimitSource for PostgresLimitSource {
    async fn limit(&self, customer: &str) -> Result<Option<CustomerLimit>, StoreError> {
        let query = sqlx::query_as::<_, (Option<String>, Option<String>)>(&self.sql)
            .bind(customer)
            .fetch_optional(&self.pool);
        let row = match tokio::time::timeout(self.timeout, query).await {
            Ok(Ok(row)) => row,
            Ok(Err(e)) => {
                return Err(StoreError::new(
                    ErrorKind::Unavailable,
                    "postgres",
                    e.to_string(),
                ));
            }
            Err(_) => return Err(StoreError::timeout("postgres", self.timeout)),
        };
        match row {
            None => Ok(None),
            Some((Some(plan), _)) => Ok(Some(CustomerLimit::Plan(plan))),
            Some((None, Some(limits))) => parse_policies(&limits)
                .map(|p| Some(CustomerLimit::Policies(p)))
                .map_err(|e| {
                    StoreError::new(
                        ErrorKind::InvalidRequest,
                        "postgres",
                        format!("the limits of customer {customer:?}: {e}"),
                    )
                }),
            Some((None, None)) => Ok(None),
        }
    }
}
