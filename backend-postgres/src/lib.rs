//! A PostgreSQL store for the limiter workspace: one statement per decision.
//!
//! [`PostgresStore`] keeps rate-limit state in tables of its own schema and
//! applies every [`Policy`] with **one SQL statement per decision**: a call
//! of a PL/pgSQL function (`decide_gcra`, `decide_fixed_window`, …) that
//! locks the key's row, transcribes [`limiter_core::algorithm`] in `bigint`
//! arithmetic, and records only admitted requests (a refusal writes no state,
//! except that the sliding log drops entries that have already expired, as
//! the core algorithm does). Concurrent
//! decisions on one key queue on that row lock, so they are exact: no lost
//! update, no over-admission, and no read-then-write from the client.
//!
//! * **Schema**: created (or checked) when the store is built, by embedded
//!   migrations run inside the configured schema, whose `_sqlx_migrations`
//!   table lives there too. A schema written by a newer version is refused
//!   with [`BuildError::SchemaTooNew`].
//! * **Time**: `now` comes from the caller's clock, as the
//!   [`Store`] contract says. With
//!   [`server_clock(true)`](PostgresStoreBuilder::server_clock) the database's
//!   `clock_timestamp()` decides instead, so hosts with skewed clocks agree.
//! * **Expiry**: each row carries `expires_at` (garbage collection only, with
//!   slack). [`PostgresStore::sweep`] deletes expired rows in one bounded
//!   batch per table; [`PostgresStore::maintenance`] repeats that until
//!   nothing is left. A background sweeper owned by the store runs
//!   `maintenance` every minute by default and stops when the store is
//!   dropped. The request path never scans a table.
//! * **Abuse events**: refusals can be recorded, in the same statement, in
//!   an `abuse_events` table with a retention period, at most one row per
//!   key and window ([`PostgresStoreBuilder::record_refusals`]); the store
//!   is also an [`AbuseSink`] for a [`Limiter`](limiter_core::Limiter),
//!   whose events carry how many refusals they stand for.
//! * **Refunds** ([`Store::refund`]) are one statement too: a call of
//!   `refund_gcra`, `refund_fixed_window`, … that locks the key's row and
//!   gives back exactly the units the admission wrote, or nothing when the
//!   row no longer holds them. A refund never creates a row and never moves
//!   `expires_at`. A store in
//!   [server-clock mode](PostgresStoreBuilder::server_clock) refuses refunds
//!   with [`ErrorKind::Unsupported`]: the admission's time, which locates
//!   its units, was the server's and is not known to the caller.
//! * **Failure**: every call is bounded by a timeout (server-side
//!   `statement_timeout`, pool acquire timeout and a client-side timer). A
//!   dead or slow database is a [`StoreError`] within it, never a hang.
//!
//! ```no_run
//! use limiter_core::{ManualClock, Policy, Store, Timestamp};
//! use limiter_postgres::PostgresStore;
//! use std::time::Duration;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::builder("postgres://postgres@127.0.0.1:5432/postgres")
//!     .schema("limiter")
//!     .pool_size(16)
//!     .timeout(Duration::from_millis(250))
//!     .build()
//!     .await?;
//! let policy = Policy::gcra(10, Duration::from_secs(60))?;
//! let now = Timestamp::now_system();
//! let decision = store.decide(b"client:42", &policy, 1, now).await?;
//! assert!(decision.allowed);
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use limiter_core::{
    AbuseEvent, AbuseSink, Algorithm, Capabilities, Clock, ConfigError, Decision, ErrorKind,
    Policy, Source, Store, StoreError, SystemClock, Timestamp,
};
use sqlx::ConnectOptions;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::task::JoinHandle;

/// The name this store reports in decisions and errors.
pub const NAME: &str = "postgres";

/// The schema used when none is configured.
pub const DEFAULT_SCHEMA: &str = "limiter";

/// The default bound on one decision: pool acquire, statement and client
/// timer together.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// The default interval of the background sweeper.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// The default number of rows one sweep statement deletes at most.
pub const DEFAULT_SWEEP_BATCH: u32 = 1_000;

/// The default garbage-collection slack: a row is deleted no earlier than
/// this long after its state expired, so clocks skewed by less than this
/// never lose state.
pub const DEFAULT_GC_SLACK: Duration = Duration::from_secs(60);

/// The default retention of abuse events.
pub const DEFAULT_ABUSE_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// The schema version this build creates and understands: the number of the
/// last embedded migration.
pub const SCHEMA_VERSION: i64 = 2;

/// The embedded migrations, in order. Applied ones are never edited (their
/// checksums are checked against deployed schemas); changes are new files.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "state tables",
        include_str!("../migrations/0001_state_tables.sql"),
    ),
    (
        2,
        "refunds and bounded abuse events",
        include_str!("../migrations/0002_refunds_and_bounded_abuse_events.sql"),
    ),
];

/// The tables that hold per-key state, swept by expiry and switched between
/// logged and unlogged.
const STATE_TABLES: [&str; 4] = ["sliding_log", "fixed_window", "sliding_window", "gcra"];

/// Every table with an `expires_at` column.
const SWEPT_TABLES: [&str; 5] = [
    "sliding_log",
    "fixed_window",
    "sliding_window",
    "gcra",
    "abuse_events",
];

/// Building a [`PostgresStore`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The configuration is invalid (malformed URL, bad schema name, zero
    /// pool size, …).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be reached or failed while the schema was
    /// created or checked.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The schema was migrated by a newer version of this crate.
    #[error(
        "schema {schema:?} is at version {found}, but this build of limiter-postgres \
         understands versions up to {supported}: upgrade limiter-postgres or use another schema"
    )]
    SchemaTooNew {
        /// The schema.
        schema: String,
        /// The version found in its `_sqlx_migrations` table.
        found: i64,
        /// [`SCHEMA_VERSION`].
        supported: i64,
    },
    /// The schema is older than this build and migrations are disabled.
    #[error(
        "schema {schema:?} is at version {found}, but this build of limiter-postgres needs \
         version {required} and migrations are disabled"
    )]
    SchemaOutdated {
        /// The schema.
        schema: String,
        /// The version found (0 when the schema holds no limiter tables).
        found: i64,
        /// [`SCHEMA_VERSION`].
        required: i64,
    },
    /// The schema's recorded migrations do not match this build's (a
    /// migration was changed after it was applied, or one failed halfway).
    #[error("schema {schema:?} does not match this build of limiter-postgres: {reason}")]
    SchemaMismatch {
        /// The schema.
        schema: String,
        /// What does not match.
        reason: String,
    },
}

impl From<BuildError> for StoreError {
    fn from(e: BuildError) -> Self {
        match e {
            BuildError::Store(e) => e,
            BuildError::Config(c) => {
                StoreError::new(ErrorKind::InvalidRequest, NAME, c.to_string()).with_source(c)
            }
            other => StoreError::new(ErrorKind::Internal, NAME, other.to_string()),
        }
    }
}

/// Configuration of a [`PostgresStore`]; see [`PostgresStore::builder`].
#[derive(Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    schema: String,
    pool_size: u32,
    timeout: Duration,
    statement_timeout: Option<Duration>,
    connect_timeout: Duration,
    unlogged: bool,
    synchronous_commit: Option<bool>,
    server_clock: bool,
    gc_slack: Duration,
    record_refusals: bool,
    abuse_retention: Duration,
    migrate: bool,
    sweep_interval: Option<Duration>,
    sweep_batch: u32,
    sweep_clock: Arc<dyn Clock>,
}

impl fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("url", &redact(&self.url))
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("unlogged", &self.unlogged)
            .field("synchronous_commit", &self.synchronous_commit)
            .field("server_clock", &self.server_clock)
            .field("gc_slack", &self.gc_slack)
            .field("record_refusals", &self.record_refusals)
            .field("abuse_retention", &self.abuse_retention)
            .field("migrate", &self.migrate)
            .field("sweep_interval", &self.sweep_interval)
            .field("sweep_batch", &self.sweep_batch)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    /// The schema holding the store's tables and functions (default
    /// [`DEFAULT_SCHEMA`]). A plain identifier: ASCII letters, digits and
    /// underscores, not starting with a digit or `pg_`, at most 63 bytes.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The most connections the store opens (default 16).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The bound on one decision or sweep, from asking the pool for a
    /// connection to reading the answer (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The server-side `statement_timeout` of the store's connections
    /// (default: the same as [`timeout`](Self::timeout)). The server then
    /// cancels a statement the client has given up on, so an abandoned
    /// decision does not keep holding its row lock.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = Some(timeout);
        self
    }

    /// The bound on connecting and migrating when the store is built
    /// (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Makes the state tables `UNLOGGED` (default `false`; applied when the
    /// store is built, switching existing tables either way). Unlogged tables
    /// skip the write-ahead log, so each decision costs less I/O, but their
    /// contents are **emptied after a crash** of the server (not after a
    /// clean restart) and are not replicated: every client regains a full
    /// quota. Abuse events stay logged.
    pub fn unlogged(mut self, unlogged: bool) -> Self {
        self.unlogged = unlogged;
        self
    }

    /// Sets `synchronous_commit` on the store's own connections (default:
    /// the server's setting, untouched). With `false` a decision returns
    /// before its commit record is flushed to disk: a server crash may lose
    /// the last few hundred milliseconds of counts (at most three times
    /// `wal_writer_delay`), never corrupt them, and other sessions are
    /// unaffected. `true` forces `on` where the server default is weaker.
    pub fn synchronous_commit(mut self, on: bool) -> Self {
        self.synchronous_commit = Some(on);
        self
    }

    /// Decides with the database server's clock (`clock_timestamp()`)
    /// instead of the `now` passed to [`Store::decide`] (default `false`).
    /// Hosts with skewed clocks then agree; the store declares it in
    /// [`Capabilities::server_clock`] and cannot be driven by a manual clock.
    /// The background sweeper then uses the server's clock too.
    ///
    /// [`Store::refund`] is not available in this mode: it locates the
    /// admission's units by the time it was decided at, which is the
    /// server's and unknown to the caller. It answers
    /// [`ErrorKind::Unsupported`] without a statement, and a
    /// [`Limiter`](limiter_core::Limiter) then keeps the admission (stricter,
    /// never more permissive).
    pub fn server_clock(mut self, on: bool) -> Self {
        self.server_clock = on;
        self
    }

    /// How long after its state expired a row may be deleted, at the least
    /// (default [`DEFAULT_GC_SLACK`], at least 1 ms). Covers clock skew
    /// between the hosts that decide and the one that sweeps; also the
    /// granularity of `expires_at`, so most updates leave it unchanged.
    pub fn gc_slack(mut self, slack: Duration) -> Self {
        self.gc_slack = slack;
        self
    }

    /// Records refusals in the `abuse_events` table, in the decision's own
    /// statement (default `false`), **at most one row per key and window**:
    /// a refusal inserts a row only if the key has none for the same
    /// algorithm, limit and window from the last window, which is an index
    /// lookup and no write. A flood of refusals therefore costs one write
    /// per window, not one per refusal, and a row means "refused at least
    /// once in the window from its `at`" (its
    /// [`refusals`](RecordedRefusal::refusals) is 1).
    ///
    /// Counted events come from a [`Limiter`](limiter_core::Limiter)
    /// instead: give the store as the abuse sink of
    /// [`Rule::with_escalation`](limiter_core::Rule::with_escalation), and
    /// each [`AbuseEvent`] is a row with the number of refusals it stands
    /// for and the first one's time.
    pub fn record_refusals(mut self, on: bool) -> Self {
        self.record_refusals = on;
        self
    }

    /// How long abuse events are kept before the sweeper deletes them
    /// (default [`DEFAULT_ABUSE_RETENTION`]).
    pub fn abuse_retention(mut self, retention: Duration) -> Self {
        self.abuse_retention = retention;
        self
    }

    /// Whether building the store may create and migrate its schema (default
    /// `true`). With `false` it only checks that the schema is at
    /// [`SCHEMA_VERSION`], for deployments where migrations run separately.
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// The interval of the background sweeper, or `None` for no sweeper
    /// (default [`DEFAULT_SWEEP_INTERVAL`]). Without one, call
    /// [`PostgresStore::maintenance`] or [`PostgresStore::sweep`] yourself.
    pub fn sweep_interval(mut self, interval: Option<Duration>) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// The most rows one sweep statement deletes (default
    /// [`DEFAULT_SWEEP_BATCH`]).
    pub fn sweep_batch(mut self, batch: u32) -> Self {
        self.sweep_batch = batch;
        self
    }

    /// The clock the background sweeper and [`PostgresStore::maintenance`]
    /// read (default the system clock). Give it the limiter's clock when
    /// that is not the system clock, so that rows are not swept by a time
    /// the decisions never saw.
    pub fn sweep_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.sweep_clock = clock;
        self
    }

    fn validate(&self) -> Result<PgConnectOptions, ConfigError> {
        let options = parse_url(&self.url)?;
        validate_schema(&self.schema)?;
        if self.pool_size == 0 {
            return Err(ConfigError::Invalid(
                "postgres pool size must be at least 1".into(),
            ));
        }
        for (name, d) in [
            ("timeout", self.timeout),
            (
                "statement timeout",
                self.statement_timeout.unwrap_or(self.timeout),
            ),
            ("connect timeout", self.connect_timeout),
        ] {
            if d < Duration::from_millis(1) {
                return Err(ConfigError::Invalid(format!(
                    "postgres {name} must be at least 1 ms, got {d:?}"
                )));
            }
        }
        if self.gc_slack < Duration::from_millis(1) || micros(self.gc_slack) >= 1 << 50 {
            return Err(ConfigError::Invalid(format!(
                "postgres GC slack must be between 1 ms and 35 years, got {:?}",
                self.gc_slack
            )));
        }
        if micros(self.abuse_retention) >= 1 << 50 {
            return Err(ConfigError::Invalid(format!(
                "abuse retention must be under 35 years, got {:?}",
                self.abuse_retention
            )));
        }
        if self.sweep_batch == 0 || self.sweep_batch > 1_000_000 {
            return Err(ConfigError::Invalid(format!(
                "sweep batch must be between 1 and 1000000, got {}",
                self.sweep_batch
            )));
        }
        if self
            .sweep_interval
            .is_some_and(|i| i < Duration::from_millis(1))
        {
            return Err(ConfigError::Invalid(
                "sweep interval must be at least 1 ms".into(),
            ));
        }
        Ok(options)
    }

    /// Connects, creates or checks the schema, and returns the store.
    ///
    /// Fails with [`BuildError::Config`] for a malformed URL or setting,
    /// [`BuildError::Store`] when the database cannot be reached within the
    /// connect timeout, and a schema error when the schema belongs to
    /// another version.
    pub async fn build(self) -> Result<PostgresStore, BuildError> {
        let base = self
            .validate()?
            .application_name("limiter-postgres")
            .log_statements(tracing::log::LevelFilter::Off);
        let statement_timeout = self.statement_timeout.unwrap_or(self.timeout);
        let mut settings = vec![(
            "statement_timeout",
            format!("{}ms", statement_timeout.as_millis().max(1)),
        )];
        if let Some(on) = self.synchronous_commit {
            let value = if on { "on" } else { "off" };
            settings.push(("synchronous_commit", value.to_string()));
        }
        let pool_options = base.clone().options(settings);

        match tokio::time::timeout(self.connect_timeout, prepare_schema(&base, &self)).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(StoreError::new(
                    ErrorKind::Timeout,
                    NAME,
                    format!(
                        "connecting and checking schema {:?} took longer than {:?}",
                        self.schema, self.connect_timeout
                    ),
                )
                .into());
            }
        }

        let pool = PgPoolOptions::new()
            .max_connections(self.pool_size)
            .min_connections(0)
            .acquire_timeout(self.timeout)
            // A ping before every acquire would double the round trips of a
            // decision; a broken connection shows up as an error instead.
            .test_before_acquire(false)
            .connect_lazy_with(pool_options);

        let shared = Arc::new(Shared::new(pool, &self));
        let sweeper = match self.sweep_interval {
            None => None,
            Some(every) => {
                let handle = tokio::runtime::Handle::try_current().map_err(|_| {
                    ConfigError::Invalid(
                        "the postgres background sweeper needs a Tokio runtime; \
                         disable it with sweep_interval(None)"
                            .into(),
                    )
                })?;
                Some(handle.spawn(sweep_forever(Arc::clone(&shared), every)))
            }
        };
        Ok(PostgresStore {
            inner: Arc::new(Inner { shared, sweeper }),
        })
    }
}

/// The store's configuration and pool, shared with its sweeper task.
struct Shared {
    pool: PgPool,
    schema: String,
    decide_sql: [String; 4],
    refund_sql: [String; 4],
    sweep_sql: Vec<(&'static str, String)>,
    record_sql: String,
    events_sql: String,
    timeout: Duration,
    server_clock: bool,
    gc_slack_us: i64,
    record_refusals: bool,
    abuse_retention_us: i64,
    sweep_batch: u32,
    sweep_clock: Arc<dyn Clock>,
}

impl Shared {
    fn new(pool: PgPool, b: &PostgresStoreBuilder) -> Self {
        let s = quote_ident(&b.schema);
        let decide_sql = Algorithm::ALL.map(|a| {
            format!(
                "SELECT allowed, remaining, reset_after_us, retry_after_us \
                 FROM {s}.decide_{a}($1, $2, $3, $4, $5, $6, $7)",
                a = a.as_str()
            )
        });
        let refund_sql = Algorithm::ALL
            .map(|a| format!("SELECT {s}.refund_{a}($1, $2, $3, $4, $5)", a = a.as_str()));
        // ctid = ANY(ARRAY(...)) is a TID scan of at most $2 rows found via
        // the expires_at index (the bound is an init-plan so that a volatile
        // server clock still yields an index condition). A row updated meanwhile has a new ctid, which
        // the re-check of READ COMMITTED no longer matches, so it is left for
        // the next sweep rather than deleted while live.
        let sweep_sql = SWEPT_TABLES
            .iter()
            .map(|t| {
                (
                    *t,
                    format!(
                        "DELETE FROM {s}.{t} WHERE ctid = ANY(ARRAY(\
                           SELECT ctid FROM {s}.{t} \
                           WHERE expires_at < (SELECT coalesce($1, {s}.decision_now(NULL))) \
                           LIMIT $2))"
                    ),
                )
            })
            .collect();
        Shared {
            pool,
            schema: b.schema.clone(),
            decide_sql,
            refund_sql,
            sweep_sql,
            record_sql: format!(
                "INSERT INTO {s}.abuse_events \
                 (key_hash, rule, refused_by, at_us, since_us, refusals, expires_at) \
                 VALUES (sha256($1), $2, $3, $4, $5, $6, $4 + $7)"
            ),
            events_sql: format!(
                "SELECT rule, refused_by, algorithm, at_us, since_us, refusals \
                 FROM {s}.abuse_events WHERE key_hash = sha256($1) ORDER BY at_us, id"
            ),
            timeout: b.timeout,
            server_clock: b.server_clock,
            gc_slack_us: micros(b.gc_slack) as i64,
            record_refusals: b.record_refusals,
            abuse_retention_us: micros(b.abuse_retention) as i64,
            sweep_batch: b.sweep_batch,
            sweep_clock: Arc::clone(&b.sweep_clock),
        }
    }

    /// Runs `fut` under the store's timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(store_error(what, e)),
            Err(_) => Err(StoreError::new(
                ErrorKind::Timeout,
                NAME,
                format!("{what}: no answer within {:?}", self.timeout),
            )),
        }
    }

    async fn sweep(&self, now: Option<i64>, batch: u32) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        for (table, sql) in &self.sweep_sql {
            let done = self
                .bounded(
                    "sweep",
                    sqlx::query(sql)
                        .bind(now)
                        .bind(i64::from(batch))
                        .execute(&self.pool),
                )
                .await?
                .rows_affected();
            report.deleted += done;
            if *table == "abuse_events" {
                report.abuse_events += done;
            } else {
                report.state_rows += done;
            }
            report.statements += 1;
            report.largest_batch = report.largest_batch.max(done);
        }
        Ok(report)
    }

    async fn maintenance(&self) -> Result<SweepReport, StoreError> {
        let now = if self.server_clock {
            None
        } else {
            Some(to_i64(self.sweep_clock.now())?)
        };
        let mut total = SweepReport::default();
        // A bounded number of rounds, so one pass never runs unbounded; the
        // next pass continues where this one stopped.
        for _ in 0..1_000 {
            let round = self.sweep(now, self.sweep_batch).await?;
            total.add(&round);
            if round.largest_batch < u64::from(self.sweep_batch) {
                break;
            }
        }
        Ok(total)
    }
}

async fn sweep_forever(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the store was just built, so skip it.
    tick.tick().await;
    loop {
        tick.tick().await;
        match shared.maintenance().await {
            Ok(report) if report.deleted > 0 => tracing::debug!(
                schema = %shared.schema,
                deleted = report.deleted,
                "postgres sweeper removed expired rows"
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!(
                schema = %shared.schema,
                %error,
                "postgres sweeper failed; retrying at the next interval"
            ),
        }
    }
}

struct Inner {
    shared: Arc<Shared>,
    sweeper: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.sweeper.take() {
            task.abort();
        }
    }
}

/// What one [`PostgresStore::sweep`] or [`PostgresStore::maintenance`] pass
/// removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Rows deleted in total.
    pub deleted: u64,
    /// State rows deleted.
    pub state_rows: u64,
    /// Abuse events deleted.
    pub abuse_events: u64,
    /// DELETE statements run (one per table per batch).
    pub statements: u64,
    /// The most rows any one statement deleted: never above the batch size.
    pub largest_batch: u64,
}

impl SweepReport {
    fn add(&mut self, other: &SweepReport) {
        self.deleted += other.deleted;
        self.state_rows += other.state_rows;
        self.abuse_events += other.abuse_events;
        self.statements += other.statements;
        self.largest_batch = self.largest_batch.max(other.largest_batch);
    }
}

/// An `abuse_events` row: rule, refused_by, algorithm, at_us, since_us,
/// refusals.
type EventRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    Option<i64>,
    i64,
);

/// One recorded refusal, as read back by [`PostgresStore::abuse_events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRefusal {
    /// The rule, when the refusal came through an [`AbuseSink`].
    pub rule: Option<String>,
    /// The store that refused, when the refusal came through an
    /// [`AbuseSink`].
    pub refused_by: Option<String>,
    /// The algorithm, when the refusal was recorded by the decision itself.
    pub algorithm: Option<String>,
    /// The latest refusal the row stands for; for a row recorded by the
    /// decision itself, the first refusal of its window.
    pub at: Timestamp,
    /// The earliest refusal the row stands for ([`AbuseEvent::since`]);
    /// `at` for rows recorded by the decision itself and rows written
    /// before schema version 2.
    pub since: Timestamp,
    /// How many refusals the row stands for ([`AbuseEvent::refusals`]); 1
    /// for a row recorded by the decision itself, which means "at least
    /// one in this window".
    pub refusals: u64,
}

/// A rate-limit store in PostgreSQL; cheap to clone (clones share one pool).
///
/// See the [crate documentation](crate) for what it guarantees and
/// [`PostgresStore::builder`] for its options.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.shared.schema)
            .field("server_clock", &self.inner.shared.server_clock)
            .field("sweeper", &self.inner.sweeper.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A builder for a store at `url` (`postgres://…` or `postgresql://…`),
    /// with every option at its default. Nothing is checked or connected
    /// until [`build`](PostgresStoreBuilder::build).
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.into(),
            schema: DEFAULT_SCHEMA.to_string(),
            pool_size: 16,
            timeout: DEFAULT_TIMEOUT,
            statement_timeout: None,
            connect_timeout: Duration::from_secs(10),
            unlogged: false,
            synchronous_commit: None,
            server_clock: false,
            gc_slack: DEFAULT_GC_SLACK,
            record_refusals: false,
            abuse_retention: DEFAULT_ABUSE_RETENTION,
            migrate: true,
            sweep_interval: Some(DEFAULT_SWEEP_INTERVAL),
            sweep_batch: DEFAULT_SWEEP_BATCH,
            sweep_clock: Arc::new(SystemClock),
        }
    }

    /// A store at `url` with every option at its default: schema
    /// [`DEFAULT_SCHEMA`], 16 connections, [`DEFAULT_TIMEOUT`], client
    /// clock, and a background sweeper on the system clock.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), limiter_postgres::BuildError> {
    /// let store = limiter_postgres::PostgresStore::from_url("postgres://postgres@localhost/app").await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_url(url: &str) -> Result<PostgresStore, BuildError> {
        Self::builder(url).build().await
    }

    /// The schema holding the store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.shared.schema
    }

    /// The store's connection pool, for inspection and tests.
    pub fn pool(&self) -> &PgPool {
        &self.inner.shared.pool
    }

    /// Deletes expired rows whose `expires_at` is before `now`, at most
    /// `batch` per table: one bounded `DELETE` per table, each a TID scan of
    /// rows found through the `expires_at` index. In server-clock mode `now`
    /// is ignored and the server's clock is used.
    pub async fn sweep(&self, now: Timestamp, batch: u32) -> Result<SweepReport, StoreError> {
        if batch == 0 {
            return Err(StoreError::invalid_request(
                NAME,
                ConfigError::Invalid("sweep batch must be at least 1".into()),
            ));
        }
        let shared = &self.inner.shared;
        let now = if shared.server_clock {
            None
        } else {
            Some(to_i64(now)?)
        };
        shared.sweep(now, batch).await
    }

    /// The `DELETE` statements a sweep runs, one per table, with `$1` the
    /// time in µs (`NULL` for the server's clock) and `$2` the batch size:
    /// for inspection, for example with `EXPLAIN`.
    pub fn sweep_statements(&self) -> impl Iterator<Item = &str> {
        self.inner
            .shared
            .sweep_sql
            .iter()
            .map(|(_, sql)| sql.as_str())
    }

    /// Deletes every expired row as of the sweep clock (or the server's
    /// clock in server-clock mode), in batches of the configured size, until
    /// a batch comes back short (at most 1000 rounds per call). This is what
    /// the background sweeper runs.
    pub async fn maintenance(&self) -> Result<SweepReport, StoreError> {
        self.inner.shared.maintenance().await
    }

    /// The refusals recorded for `key`, oldest first.
    pub async fn abuse_events(&self, key: &[u8]) -> Result<Vec<RecordedRefusal>, StoreError> {
        let shared = &self.inner.shared;
        let rows = shared
            .bounded(
                "reading abuse events",
                sqlx::query_as::<_, EventRow>(&shared.events_sql)
                    .bind(key)
                    .fetch_all(&shared.pool),
            )
            .await?;
        let time = |us: i64| Timestamp::from_micros(u64::try_from(us).unwrap_or(0));
        Ok(rows
            .into_iter()
            .map(
                |(rule, refused_by, algorithm, at, since, refusals)| RecordedRefusal {
                    rule,
                    refused_by,
                    algorithm,
                    at: time(at),
                    since: time(since.unwrap_or(at)),
                    refusals: u64::try_from(refusals).unwrap_or(0),
                },
            )
            .collect())
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            algorithms: &Algorithm::ALL,
            key_capacity: None,
            shared: true,
            server_clock: self.inner.shared.server_clock,
        }
    }

    async fn decide(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        policy
            .check_cost(cost)
            .map_err(|e| StoreError::invalid_request(NAME, e))?;
        let shared = &self.inner.shared;
        let now = if shared.server_clock {
            None
        } else {
            Some(to_i64(now)?)
        };
        let index = Algorithm::ALL
            .iter()
            .position(|a| *a == policy.algorithm())
            .unwrap_or(0);
        let retention = shared.record_refusals.then_some(shared.abuse_retention_us);
        // Policy validation keeps limit, window and their products below
        // 2^53, so they fit a bigint.
        let (allowed, remaining, reset_after, retry_after) = shared
            .bounded(
                "decision",
                sqlx::query_as::<_, (bool, i64, i64, i64)>(&shared.decide_sql[index])
                    .bind(key)
                    .bind(i64::from(policy.limit()))
                    .bind(policy.window_micros() as i64)
                    .bind(i64::from(cost))
                    .bind(now)
                    .bind(shared.gc_slack_us)
                    .bind(retention)
                    .fetch_one(&shared.pool),
            )
            .await?;
        Ok(Decision {
            allowed,
            limit: policy.limit(),
            remaining: u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
            reset_after: Duration::from_micros(u64::try_from(reset_after).unwrap_or(0)),
            retry_after: Duration::from_micros(u64::try_from(retry_after).unwrap_or(0)),
            source: Source::store(NAME),
        })
    }

    /// One statement, a call of the algorithm's `refund_*` function; see the
    /// [crate documentation](crate). In server-clock mode, an
    /// [`ErrorKind::Unsupported`] error without contacting the database.
    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
        admitted: &Decision,
    ) -> Result<(), StoreError> {
        limiter_core::check_refund(NAME, policy, cost, admitted)?;
        let shared = &self.inner.shared;
        if shared.server_clock {
            return Err(StoreError::new(
                ErrorKind::Unsupported,
                NAME,
                "refund needs the time the admission was decided at; a store deciding with \
                 the database server's clock cannot locate it",
            ));
        }
        let now = to_i64(now)?;
        let reset_after = i64::try_from(admitted.reset_after.as_micros()).unwrap_or(i64::MAX);
        // Every stored time is below 2^62 (to_i64); an anchor past it
        // matches nothing, and the functions' arithmetic must not overflow.
        let Some(anchor) = now.checked_add(reset_after).filter(|a| *a < 1 << 62) else {
            return Ok(());
        };
        let index = Algorithm::ALL
            .iter()
            .position(|a| *a == policy.algorithm())
            .unwrap_or(0);
        shared
            .bounded(
                "refund",
                sqlx::query_scalar::<_, bool>(&shared.refund_sql[index])
                    .bind(key)
                    .bind(i64::from(policy.limit()))
                    .bind(policy.window_micros() as i64)
                    .bind(i64::from(cost))
                    .bind(anchor)
                    .fetch_one(&shared.pool),
            )
            .await?;
        Ok(())
    }
}

#[async_trait]
impl AbuseSink for PostgresStore {
    /// Inserts the event into `abuse_events` with the hashed key, the number
    /// of refusals it stands for and the first one's time, kept for the
    /// configured retention after the latest.
    async fn record(&self, event: AbuseEvent) -> Result<(), StoreError> {
        let shared = &self.inner.shared;
        shared
            .bounded(
                "recording an abuse event",
                sqlx::query(&shared.record_sql)
                    .bind(&event.key)
                    .bind(&*event.rule)
                    .bind(event.refused_by)
                    .bind(to_i64(event.at)?)
                    .bind(to_i64(event.since)?)
                    .bind(i64::try_from(event.refusals).unwrap_or(i64::MAX))
                    .bind(shared.abuse_retention_us)
                    .execute(&shared.pool),
            )
            .await?;
        Ok(())
    }
}

/// The embedded migrations as a source for sqlx's migrator.
#[derive(Debug)]
struct Embedded;

impl<'s> MigrationSource<'s> for Embedded {
    fn resolve(
        self,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<Vec<Migration>, Box<dyn std::error::Error + Send + Sync>>>
                + Send
                + 's,
        >,
    > {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|(version, description, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*description),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// Creates or checks the schema through a one-connection pool whose
/// `search_path` is the schema, so that the migrations and sqlx's
/// `_sqlx_migrations` table land there.
///
/// Boxed as `Send` here, with concrete lifetimes: left to inference inside
/// callers' futures, sqlx's migrator trips rustc's higher-ranked `Send`
/// check.
fn prepare_schema<'a>(
    options: &'a PgConnectOptions,
    b: &'a PostgresStoreBuilder,
) -> Pin<Box<dyn Future<Output = Result<(), BuildError>> + Send + 'a>> {
    Box::pin(async move {
        let options = options
            .clone()
            .options([("search_path", quote_ident(&b.schema))]);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|e| BuildError::Store(store_error("connecting", e)))?;
        let result = prepare_schema_on(&pool, b).await;
        pool.close().await;
        result
    })
}

fn sql(what: &'static str) -> impl FnOnce(sqlx::Error) -> BuildError {
    move |e| BuildError::Store(store_error(what, e))
}

async fn prepare_schema_on(pool: &PgPool, b: &PostgresStoreBuilder) -> Result<(), BuildError> {
    let schema = &b.schema;
    let s = quote_ident(schema);
    let found: bool = sqlx::query_scalar(
        "SELECT to_regclass(format('%I._sqlx_migrations', $1::text)) IS NOT NULL",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .map_err(sql("checking the schema"))?;
    let found = if found {
        sqlx::query_scalar::<_, Option<i64>>(&format!(
            "SELECT max(version) FROM {s}._sqlx_migrations"
        ))
        .fetch_one(pool)
        .await
        .map_err(sql("reading the schema version"))?
        .unwrap_or(0)
    } else {
        0
    };
    if found > SCHEMA_VERSION {
        return Err(BuildError::SchemaTooNew {
            schema: schema.clone(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if !b.migrate && found < SCHEMA_VERSION {
        return Err(BuildError::SchemaOutdated {
            schema: schema.clone(),
            found,
            required: SCHEMA_VERSION,
        });
    }
    let migrator = Migrator::new(Embedded)
        .await
        .map_err(|e| BuildError::SchemaMismatch {
            schema: schema.clone(),
            reason: e.to_string(),
        })?;
    if b.migrate {
        match sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
            .execute(pool)
            .await
        {
            Ok(_) => {}
            // Another store created it at the same moment: IF NOT EXISTS is
            // not safe against itself.
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P06") | Some("23505")) => {}
            Err(e) => return Err(sql("creating the schema")(e)),
        }
        migrator.run(pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => sql("migrating the schema")(e),
            other => BuildError::SchemaMismatch {
                schema: schema.clone(),
                reason: other.to_string(),
            },
        })?;
    } else {
        // Checks the applied migrations' checksums without changing anything.
        let applied: Vec<(i64, Vec<u8>, bool)> = sqlx::query_as(&format!(
            "SELECT version, checksum, success FROM {s}._sqlx_migrations"
        ))
        .fetch_all(pool)
        .await
        .map_err(sql("reading applied migrations"))?;
        for (version, checksum, success) in applied {
            let ours = migrator.iter().find(|m| m.version == version);
            if !success || ours.is_none_or(|m| *m.checksum != *checksum) {
                return Err(BuildError::SchemaMismatch {
                    schema: schema.clone(),
                    reason: format!("migration {version} differs from this build's"),
                });
            }
        }
    }

    for table in STATE_TABLES {
        let persistence: String = sqlx::query_scalar(
            "SELECT relpersistence::text FROM pg_class \
             WHERE oid = to_regclass(format('%I.%I', $1::text, $2::text))",
        )
        .bind(schema)
        .bind(table)
        .fetch_one(pool)
        .await
        .map_err(sql("reading table persistence"))?;
        let unlogged = persistence == "u";
        if unlogged != b.unlogged {
            let mode = if b.unlogged { "UNLOGGED" } else { "LOGGED" };
            sqlx::query(&format!("ALTER TABLE {s}.{table} SET {mode}"))
                .execute(pool)
                .await
                .map_err(sql("switching table persistence"))?;
        }
    }
    Ok(())
}

/// Parses a `postgres://` or `postgresql://` URL.
fn parse_url(url: &str) -> Result<PgConnectOptions, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: redact(url),
        reason,
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(
            "expected postgres://user@host:port/database".into(),
        ));
    };
    if scheme != "postgres" && scheme != "postgresql" {
        return Err(invalid(format!(
            "scheme must be postgres or postgresql, got {scheme:?}"
        )));
    }
    if rest.is_empty() {
        return Err(invalid("no host".into()));
    }
    PgConnectOptions::from_str(url).map_err(|e| invalid(e.to_string()))
}

/// The URL with any password replaced, for error messages and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

fn validate_schema(schema: &str) -> Result<(), ConfigError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !schema.as_bytes()[0].is_ascii_digit()
        && !schema.to_ascii_lowercase().starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "postgres schema {schema:?} must be 1 to 63 ASCII letters, digits or underscores, \
             not starting with a digit or pg_"
        )))
    }
}

/// A schema name as a quoted identifier; names are validated to plain
/// identifiers, quoting keeps their case.
fn quote_ident(schema: &str) -> String {
    format!("\"{schema}\"")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A timestamp as a bigint; far-future times (past year 146 000) are refused
/// rather than overflowing in SQL arithmetic.
fn to_i64(t: Timestamp) -> Result<i64, StoreError> {
    let us = t.as_micros();
    if us >= 1 << 62 {
        return Err(StoreError::new(
            ErrorKind::InvalidRequest,
            NAME,
            format!("timestamp {us} µs is out of range"),
        ));
    }
    Ok(us as i64)
}

/// Classifies an sqlx error: transient failures (timeouts, lost or refused
/// connections) apart from protocol and internal ones.
fn store_error(what: &str, e: sqlx::Error) -> StoreError {
    let kind = match &e {
        sqlx::Error::PoolTimedOut => ErrorKind::Timeout,
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        sqlx::Error::Protocol(_)
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::RowNotFound => ErrorKind::Protocol,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // query_canceled: statement_timeout fired.
            Some("57014") => ErrorKind::Timeout,
            // Connection exceptions, shutdown, too many connections,
            // serialization failures and deadlocks: worth retrying.
            Some(code)
                if code.starts_with("08")
                    || code.starts_with("57P")
                    || code.starts_with("53")
                    || code == "40001"
                    || code == "40P01" =>
            {
                ErrorKind::Unavailable
            }
            _ => ErrorKind::Internal,
        },
        _ => ErrorKind::Internal,
    };
    StoreError::new(kind, NAME, format!("{what}: {e}")).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_redacted() {
        assert!(parse_url("postgres://postgres@localhost:5432/postgres").is_ok());
        assert!(parse_url("postgresql://u:p@localhost/db").is_ok());
        for bad in [
            "",
            "localhost:5432",
            "redis://localhost",
            "postgres://",
            "http://x",
        ] {
            let err = parse_url(bad).unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidUrl { .. }),
                "{bad}: {err}"
            );
        }
        let err = parse_url("mysql://user:secret@host/db").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        assert_eq!(
            redact("postgres://u:pw@h:1/d?x=y"),
            "postgres://u:***@h:1/d?x=y"
        );
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(validate_schema("limiter").is_ok());
        assert!(validate_schema("Limiter_2").is_ok());
        for bad in ["", "1abc", "pg_x", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert!(validate_schema(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn far_future_timestamps_are_refused() {
        assert!(to_i64(Timestamp::from_micros(1 << 62)).is_err());
        assert_eq!(to_i64(Timestamp::from_micros(5)).unwrap(), 5);
    }
}
