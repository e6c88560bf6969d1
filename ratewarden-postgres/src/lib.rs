//! A PostgreSQL store for the limiter workspace: one statement per decision.
//!
//! [`PostgresStore`] keeps rate-limit state in tables of its own schema and
//! applies every [`Policy`] with **one SQL statement per decision**: a call
//! of a PL/pgSQL function (`decide_gcra`, `decide_fixed_window`, …) that
//! locks the key's row, transcribes [`ratewarden_core::algorithm`] in `bigint`
//! arithmetic, and records only admitted requests (a refusal writes no state,
//! except that the sliding log drops entries that have already expired, as
//! the core algorithm does). Concurrent
//! decisions on one key queue on that row lock, so they are exact: no lost
//! update, no over-admission, and no read-then-write from the client.
//!
//! * **Keys**: any byte string of up to
//!   [`DEFAULT_MAX_KEY_LEN`](ratewarden_core::DEFAULT_MAX_KEY_LEN) bytes; rows
//!   hold its SHA-256, so any key fits an index entry.
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
//!   is also an [`AbuseSink`] for a [`Limiter`](ratewarden_core::Limiter),
//!   whose events carry how many refusals they stand for.
//! * **Refunds** ([`Store::refund`]) are one statement too: a call of
//!   `refund_gcra`, `refund_fixed_window`, … that locks the key's row and
//!   gives back exactly the units the admission wrote, or nothing when the
//!   row no longer holds them. A refund never creates a row and never moves
//!   `expires_at`. A store in
//!   [server-clock mode](PostgresStoreBuilder::server_clock) refuses refunds
//!   with [`ErrorKind::Unsupported`]: the admission's time, which locates
//!   its units, was the server's and is not known to the caller.
//! * **One round trip**: the store holds connections of its own, so a
//!   decision or a refund is exactly one request and one answer on the wire
//!   (sqlx's `PgPool` adds a ping to every statement; see
//!   [`PostgresStore::builder_with_pool`] for an application's pool, and
//!   the `connections` module's source for the measurements). A
//!   connection whose statement did not finish cleanly is closed, never
//!   reused, and the next call opens a fresh one.
//! * **Bans** ([`Policy::with_ban`]): `decide_banned` wraps the
//!   algorithm's function in the same statement. It takes the key's state
//!   row lock, reads its row in `bans` (one per key and algorithm, created
//!   by a refusal), and while banned answers the ban's refusal and writes
//!   nothing; a refusal otherwise updates that row. A policy without a ban
//!   runs the algorithm's own function, as before.
//! * **Failure**: every call is bounded by a timeout (server-side
//!   `statement_timeout`, a bound on waiting for a connection, and a
//!   client-side timer). A dead or slow database is a [`StoreError`] within
//!   it, never a hang.
//! * **Notices**<a id="notices"></a>: a reset deletes the key's row and
//!   calls `pg_notify` on `{schema}.notices` in the same statement, and
//!   every store (unless built with
//!   [`notices(false)`](PostgresStoreBuilder::notices)) listens on that
//!   channel on a connection of its own and tells the refusal caches in
//!   front of it ([`Store::invalidations`]): an unban on one instance
//!   reaches every instance of the fleet when the delete commits, with
//!   nothing polled and nothing paid by decisions. While the listener is
//!   not listening (its connection closed, or its own heartbeat notice
//!   unheard for [`notice_heartbeat`](PostgresStoreBuilder::notice_heartbeat)
//!   and the store's timeout), those caches hold nothing.
//! * **TLS**: with the `tls` feature, `sslmode=require`, `verify-ca` and
//!   `verify-full` URLs connect over TLS (rustls with the *ring* provider;
//!   `sslrootcert` names the CA, otherwise the bundled webpki roots are
//!   trusted). Without it such URLs are refused when the store is built.
//! * **URLs**: the schemes of [`URL_SCHEMES`], parsed by
//!   [`ratewarden_core::url`]; errors and `Debug` output show them only through
//!   [`ratewarden_core::url::redact`].
//!
//! ```no_run
//! use ratewarden_core::{Policy, Request, Store, Timestamp};
//! use ratewarden_postgres::PostgresStore;
//! use std::time::Duration;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::builder("postgres://postgres@127.0.0.1:5432/postgres")
//!     .schema("ratewarden")
//!     .pool_size(16)
//!     .timeout(Duration::from_millis(250))
//!     .build()
//!     .await?;
//! let policy = Policy::gcra(10, Duration::from_secs(60))?;
//! let now = Timestamp::now_system();
//! let decision = store.decide(Request::new(&store, b"client:42", &policy, 1, now)?).await?;
//! assert!(decision.allowed);
//! # Ok(()) }
//! ```

mod builder;
mod connections;
mod error;
mod limits;
mod notices;
mod schema;
mod sweep;
mod url;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratewarden_core::{
    AbuseEvent, AbuseSink, Algorithm, Ban, Capabilities, Clock, Decision, ErrorKind, Key, Policy,
    Refund, Request, Store, StoreError, Timestamp,
};
use sqlx::postgres::PgPool;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};

pub use builder::PostgresStoreBuilder;
pub use error::BuildError;
pub use limits::{LIMITS_TABLE_EXAMPLE, PostgresLimitSource};
pub use schema::SCHEMA_VERSION;
pub use sweep::SweepReport;
pub use url::URL_SCHEMES;

use connections::{Checkout, Connections};
use error::{store_error, timed_out};

/// The name this store reports in decisions and errors.
pub const NAME: &str = "postgres";

/// The schema used when none is configured.
pub const DEFAULT_SCHEMA: &str = "ratewarden";

/// The default transport bound on one call: waiting for a connection (or
/// opening one), the statement and its answer together
/// ([`PostgresStoreBuilder::timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// The default interval of the background sweeper.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// How often a store's notice listener checks that it still hears by
/// default ([`PostgresStoreBuilder::notice_heartbeat`]).
pub const DEFAULT_NOTICE_HEARTBEAT: Duration = Duration::from_secs(1);

/// The default number of rows one sweep statement deletes at most.
pub const DEFAULT_SWEEP_BATCH: u32 = 1_000;

/// The default garbage-collection slack: a row is deleted no earlier than
/// this long after its state expired, so clocks skewed by less than this
/// never lose state.
pub const DEFAULT_GC_SLACK: Duration = Duration::from_secs(60);

/// The default retention of abuse events.
pub const DEFAULT_ABUSE_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// The store's configuration and connections, shared with its sweeper
/// task.
struct Shared {
    /// Decisions, refunds and abuse events.
    connections: Connections,
    /// Sweeps, reads of abuse events and [`PostgresStore::pool`].
    pool: PgPool,
    schema: String,
    decide_sql: [String; 4],
    refund_sql: [String; 4],
    peek_sql: [String; 4],
    /// `decide_banned` and `peek_banned`, for a policy with a ban.
    decide_banned_sql: String,
    peek_banned_sql: String,
    reset_sql: [String; 4],
    penalize_sql: [String; 4],
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
    /// Told of the keys other instances reset (see the `notices`
    /// module); `None` when built with `notices(false)`.
    notices: Option<Arc<ratewarden_core::Invalidations>>,
    /// The channel every reset is announced on: `{schema}.notices`.
    notice_channel: String,
    /// How many times the listener has subscribed.
    subscriptions: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Shared {
    fn new(connections: Connections, pool: PgPool, b: &PostgresStoreBuilder) -> Self {
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
        let peek_sql = Algorithm::ALL.map(|a| {
            format!(
                "SELECT allowed, remaining, reset_after_us, retry_after_us \
                 FROM {s}.peek_{a}($1, $2, $3, $4, $5, $6)",
                a = a.as_str()
            )
        });
        let penalize_sql = Algorithm::ALL.map(|a| {
            format!(
                "SELECT {s}.penalize_{a}($1, $2, $3, $4, $5, $6)",
                a = a.as_str()
            )
        });
        // The state tables are named after their algorithms.
        // The deletes (the state and its ban) and the notice in one
        // statement, sent when it commits.
        let reset_sql = Algorithm::ALL.map(|a| {
            format!(
                "WITH gone AS (DELETE FROM {s}.{a} WHERE key_hash = sha256($1)), \
                 lifted AS (DELETE FROM {s}.bans WHERE key_hash = sha256($1) \
                 AND algorithm = '{a}') \
                 SELECT pg_notify($2, CASE WHEN octet_length($1) <= {named} \
                 THEN encode($1, 'hex') ELSE '*' END)",
                a = a.as_str(),
                named = notices::NAMED
            )
        });
        let decide_banned_sql = format!(
            "SELECT allowed, remaining, reset_after_us, retry_after_us, banned \
             FROM {s}.decide_banned($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        );
        let peek_banned_sql = format!(
            "SELECT allowed, remaining, reset_after_us, retry_after_us, banned \
             FROM {s}.peek_banned($1, $2, $3, $4, $5, $6, $7)"
        );
        Shared {
            connections,
            pool,
            schema: b.schema.clone(),
            decide_sql,
            decide_banned_sql,
            peek_banned_sql,
            refund_sql,
            peek_sql,
            reset_sql,
            penalize_sql,
            sweep_sql: sweep::sweep_statements(&s),
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
            // Vouched from the start: the build waits for the listener's
            // first attempt, and a failed one counts as a loss.
            notices: b
                .notices
                .then(|| Arc::new(ratewarden_core::Invalidations::new())),
            notice_channel: notices::channel(&b.schema),
            subscriptions: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// A connection for one statement of `what`, and the store's timeout
    /// started: the statement must be answered by the checkout's deadline.
    async fn checkout(&self, what: &str) -> Result<Checkout<'_>, StoreError> {
        let deadline = Instant::now() + self.timeout;
        self.connections
            .checkout(what, self.timeout, deadline)
            .await
    }

    /// Runs `fut`, on the maintenance pool, under the store's timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(store_error(what, e)),
            Err(_) => Err(timed_out(what, self.timeout)),
        }
    }
}

struct Inner {
    shared: Arc<Shared>,
    sweeper: Option<JoinHandle<()>>,
    /// Hears other instances' resets (see the `notices` module).
    listener: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in [self.sweeper.take(), self.listener.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
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

/// A rate-limit store in PostgreSQL; cheap to clone (clones share its
/// connections).
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
    /// The schema holding the store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.shared.schema
    }

    /// How many times the store has started listening for the resets
    /// other instances announce: 0 until its listener first does, one more
    /// each time it listens again after losing its connection
    /// ([Notices](crate#notices)).
    pub fn subscriptions(&self) -> u64 {
        *self.inner.shared.subscriptions.borrow()
    }

    /// A sqlx pool on the store's database, for inspection and tests: the
    /// pool given to [`builder_with_pool`](PostgresStore::builder_with_pool),
    /// or else the store's maintenance pool (at most one connection, opened
    /// when first used, with the same session settings as the store's own
    /// connections), which sweeps and [`abuse_events`](Self::abuse_events)
    /// use. Decisions, refunds and abuse events recorded as an
    /// [`AbuseSink`] never run on it, unless it is the application's pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.shared.pool
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

/// Which of the two decision statements a call sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// `decide_*`: the decision, recorded.
    Decide,
    /// `peek_*`: the same decision, rolled back.
    Peek,
}

impl PostgresStore {
    /// The one statement of a decision or a peek: the same arguments (a
    /// peek records no abuse event, so it takes no retention) and the same
    /// row back.
    async fn decision(&self, asked: Asked, request: Request<'_>) -> Result<Decision, StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let shared = &self.inner.shared;
        let now = if shared.server_clock {
            None
        } else {
            Some(to_i64(now)?)
        };
        if let Some(ban) = policy.ban() {
            return self.banned(asked, request, ban, now).await;
        }
        let index = algorithm_index(policy.algorithm());
        let (sql, what) = match asked {
            Asked::Decide => (&shared.decide_sql[index], "decision"),
            Asked::Peek => (&shared.peek_sql[index], "peek"),
        };
        // Policy validation keeps limit, window and their products below
        // 2^53, so they fit a bigint.
        let mut query = sqlx::query_as::<_, (bool, i64, i64, i64)>(sql)
            .bind(key)
            .bind(i64::from(policy.limit()))
            .bind(policy.window_micros() as i64)
            .bind(i64::from(cost))
            .bind(now)
            .bind(shared.gc_slack_us);
        if asked == Asked::Decide {
            query = query.bind(shared.record_refusals.then_some(shared.abuse_retention_us));
        }
        let mut checkout = shared.checkout(what).await?;
        let answer = timeout_at(checkout.deadline(), query.fetch_one(checkout.connection())).await;
        let (allowed, remaining, reset_after, retry_after) = checkout.end(what, answer)?;
        Ok(decided(
            (allowed, remaining, reset_after, retry_after, false),
            policy,
        ))
    }
}

/// A decision from a decision function's row: `allowed`, `remaining`,
/// `reset_after_us`, `retry_after_us` and, from `decide_banned` and
/// `peek_banned`, `banned`.
fn decided(
    (allowed, remaining, reset_after, retry_after, banned): (bool, i64, i64, i64, bool),
    policy: &Policy,
) -> Decision {
    let mut decision = Decision::new(
        allowed,
        policy,
        u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
        Duration::from_micros(u64::try_from(reset_after).unwrap_or(0)),
        Duration::from_micros(u64::try_from(retry_after).unwrap_or(0)),
        NAME,
    );
    decision.source.banned = banned;
    decision
}

impl PostgresStore {
    /// [`decision`](Self::decision) under a ban: one statement of
    /// `decide_banned` or `peek_banned` (schema version 5), which wraps the
    /// algorithm's own function.
    async fn banned(
        &self,
        asked: Asked,
        request: Request<'_>,
        ban: &Ban,
        now: Option<i64>,
    ) -> Result<Decision, StoreError> {
        let policy = request.policy();
        let shared = &self.inner.shared;
        let (sql, what) = match asked {
            Asked::Decide => (&shared.decide_banned_sql, "decision"),
            Asked::Peek => (&shared.peek_banned_sql, "peek"),
        };
        let mut query = sqlx::query_as::<_, (bool, i64, i64, i64, bool)>(sql)
            .bind(policy.algorithm().as_str())
            .bind(request.key())
            .bind(i64::from(policy.limit()))
            .bind(policy.window_micros() as i64)
            .bind(i64::from(request.cost()))
            .bind(now)
            .bind(shared.gc_slack_us);
        if asked == Asked::Decide {
            // Ban durations are validated to at most MAX_WINDOW: bigints.
            query = query
                .bind(shared.record_refusals.then_some(shared.abuse_retention_us))
                .bind(i64::from(ban.after()))
                .bind(ban.within_micros() as i64)
                .bind(ban.block_micros() as i64)
                .bind(i64::from(ban.factor()))
                .bind(ban.max_micros() as i64);
        }
        let mut checkout = shared.checkout(what).await?;
        let answer = timeout_at(checkout.deadline(), query.fetch_one(checkout.connection())).await;
        Ok(decided(checkout.end(what, answer)?, policy))
    }
}

#[async_trait]
impl Store for PostgresStore {
    /// Told of every key another instance of the fleet resets, through
    /// `LISTEN`/`NOTIFY` (see [Notices](crate#notices)); `None` for a store
    /// built with [`notices(false)`](PostgresStoreBuilder::notices).
    fn invalidations(&self) -> Option<Arc<ratewarden_core::Invalidations>> {
        self.inner.shared.notices.clone()
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new(&Algorithm::ALL).shared().with_bans();
        capabilities.server_clock = self.inner.shared.server_clock;
        capabilities
    }

    /// [`DEFAULT_MAX_KEY_LEN`](ratewarden_core::DEFAULT_MAX_KEY_LEN): rows
    /// hold `sha256(key)`, so storage does not grow with a key's length, but
    /// every decision sends the whole key to the server.
    fn max_key_len(&self) -> usize {
        ratewarden_core::DEFAULT_MAX_KEY_LEN
    }

    /// One statement, a call of the algorithm's `decide_*` function; see the
    /// [crate documentation](crate).
    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.decision(Asked::Decide, request).await
    }

    /// One statement, a call of the algorithm's `peek_*` function, which
    /// runs its `decide_*` function and rolls it back (schema version 3 and
    /// later).
    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.decision(Asked::Peek, request).await
    }

    /// One statement, a call of the algorithm's `penalize_*` function
    /// (schema version 4), under the key's row lock as a decision is.
    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let shared = &self.inner.shared;
        let now = if shared.server_clock {
            None
        } else {
            Some(to_i64(now)?)
        };
        let index = algorithm_index(policy.algorithm());
        let query = sqlx::query(&shared.penalize_sql[index])
            .bind(key)
            .bind(i64::from(policy.limit()))
            .bind(policy.window_micros() as i64)
            .bind(i64::from(cost))
            .bind(now)
            .bind(shared.gc_slack_us);
        let mut checkout = shared.checkout("penalty").await?;
        let answer = timeout_at(checkout.deadline(), query.execute(checkout.connection())).await;
        checkout.end("penalty", answer)?;
        Ok(())
    }

    /// One statement: a `DELETE` of the key's row in the algorithm's state
    /// table.
    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        let shared = &self.inner.shared;
        let index = algorithm_index(policy.algorithm());
        let query = sqlx::query(&shared.reset_sql[index])
            .bind(key.as_bytes())
            .bind(&shared.notice_channel);
        let mut checkout = shared.checkout("reset").await?;
        let answer = timeout_at(checkout.deadline(), query.execute(checkout.connection())).await;
        checkout.end("reset", answer)?;
        Ok(())
    }

    /// One statement, a call of the algorithm's `refund_*` function; see the
    /// [crate documentation](crate). In server-clock mode, an
    /// [`ErrorKind::Unsupported`] error without contacting the database.
    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        let request = refund.request();
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let admitted = refund.admitted();
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
        let index = algorithm_index(policy.algorithm());
        let query = sqlx::query_scalar::<_, bool>(&shared.refund_sql[index])
            .bind(key)
            .bind(i64::from(policy.limit()))
            .bind(policy.window_micros() as i64)
            .bind(i64::from(cost))
            .bind(anchor);
        let mut checkout = shared.checkout("refund").await?;
        let answer = timeout_at(checkout.deadline(), query.fetch_one(checkout.connection())).await;
        checkout.end("refund", answer)?;
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
        let query = sqlx::query(&shared.record_sql)
            .bind(&event.key)
            .bind(&*event.rule)
            .bind(event.refused_by)
            .bind(to_i64(event.at)?)
            .bind(to_i64(event.since)?)
            .bind(i64::try_from(event.refusals).unwrap_or(i64::MAX))
            .bind(shared.abuse_retention_us);
        let what = "recording an abuse event";
        let mut checkout = shared.checkout(what).await?;
        let answer = timeout_at(checkout.deadline(), query.execute(checkout.connection())).await;
        checkout.end(what, answer)?;
        Ok(())
    }
}

/// Where `algorithm`'s statements stand in the per-algorithm arrays, which
/// follow [`Algorithm::ALL`].
fn algorithm_index(algorithm: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|a| *a == algorithm)
        .unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_future_timestamps_are_refused() {
        assert!(to_i64(Timestamp::from_micros(1 << 62)).is_err());
        assert_eq!(to_i64(Timestamp::from_micros(5)).unwrap(), 5);
    }
}
