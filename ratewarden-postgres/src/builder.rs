//! The builder: settings, their validation (every bad setting is refused
//! when the store is built, never at the first request), and building.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::url::redact;
use ratewarden_core::{Clock, ConfigError, ErrorKind, StoreError, SystemClock};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::connections::{Connections, OwnConnections};
use crate::error::{BuildError, invalid};
use crate::schema::{SchemaPlan, prepare_schema, validate_schema};
use crate::sweep::sweep_forever;
use crate::url::parse_url;
use crate::{
    DEFAULT_ABUSE_RETENTION, DEFAULT_GC_SLACK, DEFAULT_NOTICE_HEARTBEAT, DEFAULT_SCHEMA,
    DEFAULT_SWEEP_BATCH, DEFAULT_SWEEP_INTERVAL, DEFAULT_TIMEOUT, Inner, NAME, PostgresStore,
    Shared, micros,
};

/// The number of connections a store opens at most, unless told otherwise.
const DEFAULT_POOL_SIZE: u32 = 16;

/// Where a store's connections come from.
#[derive(Clone)]
enum Source {
    /// A URL: the store opens and holds its own connections.
    Url(String),
    /// An application's pool, used as it is.
    Pool(PgPool),
}

/// Configuration of a [`PostgresStore`]; see [`PostgresStore::builder`]
/// and [`PostgresStore::builder_with_pool`].
#[derive(Clone)]
pub struct PostgresStoreBuilder {
    source: Source,
    pub(crate) schema: String,
    pool_size: Option<u32>,
    pub(crate) timeout: Duration,
    statement_timeout: Option<Duration>,
    connect_timeout: Duration,
    unlogged: bool,
    synchronous_commit: Option<bool>,
    pub(crate) server_clock: bool,
    pub(crate) gc_slack: Duration,
    pub(crate) record_refusals: bool,
    pub(crate) abuse_retention: Duration,
    migrate: bool,
    sweep_interval: Option<Duration>,
    pub(crate) sweep_batch: u32,
    pub(crate) sweep_clock: Arc<dyn Clock>,
    pub(crate) notices: bool,
    notice_heartbeat: Duration,
}

impl fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PostgresStoreBuilder");
        match &self.source {
            Source::Url(url) => d.field("url", &redact(url)),
            Source::Pool(pool) => d.field(
                "pool",
                &format_args!(
                    "an existing PgPool of up to {} connections",
                    pool.options().get_max_connections()
                ),
            ),
        };
        d.field("schema", &self.schema)
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

    /// The most connections the store opens for decisions, refunds and
    /// abuse events (default 16), each opened when first needed and held
    /// open; sweeps and [`PostgresStore::pool`] use one more, opened when
    /// first needed too. Not available with
    /// [`builder_with_pool`](PostgresStore::builder_with_pool), whose pool
    /// has its own size.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = Some(size);
        self
    }

    /// A transport bound on one decision, refund or sweep, from asking for
    /// a connection (and opening it, if needed) to reading the answer
    /// (default [`DEFAULT_TIMEOUT`]). It is also how long a call waits for
    /// a free connection. Under a `Limiter`, the rule's timeout
    /// (`Rule::with_timeout`) bounds what a request waits; this one applies
    /// beneath it, to the store's own connections, and when the store is
    /// called directly.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The server-side `statement_timeout` of the store's connections
    /// (default: the same as [`timeout`](Self::timeout)). The server then
    /// cancels a statement the client has given up on, so an abandoned
    /// decision does not keep holding its row lock. Not available with
    /// [`builder_with_pool`](PostgresStore::builder_with_pool): set it on
    /// that pool's connect options.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = Some(timeout);
        self
    }

    /// The bound on connecting and migrating when the store is built
    /// (default 10 s). Migrations run on a connection of their own, closed
    /// when the build returns.
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
    /// Not available with
    /// [`builder_with_pool`](PostgresStore::builder_with_pool): set it on
    /// that pool's connect options.
    pub fn synchronous_commit(mut self, on: bool) -> Self {
        self.synchronous_commit = Some(on);
        self
    }

    /// Decides with the database server's clock (`clock_timestamp()`)
    /// instead of the `now` passed to [`Store::decide`](ratewarden_core::Store::decide) (default `false`).
    /// Hosts with skewed clocks then agree; the store declares it in
    /// [`Capabilities::server_clock`](ratewarden_core::Capabilities::server_clock) and cannot be driven by a manual clock.
    /// The background sweeper then uses the server's clock too.
    ///
    /// [`Store::refund`](ratewarden_core::Store::refund) is not available in this mode: it locates the
    /// admission's units by the time it was decided at, which is the
    /// server's and unknown to the caller. It answers
    /// [`ErrorKind::Unsupported`](ratewarden_core::ErrorKind::Unsupported) without a statement, and a
    /// [`Limiter`](ratewarden_core::Limiter) then keeps the admission (stricter,
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
    /// [`refusals`](crate::RecordedRefusal::refusals) is 1).
    ///
    /// Counted events come from a [`Limiter`](ratewarden_core::Limiter)
    /// instead: give the store as the abuse sink of
    /// [`Rule::with_escalation`](ratewarden_core::Rule::with_escalation), and
    /// each [`AbuseEvent`](ratewarden_core::AbuseEvent) is a row with the number of refusals it stands
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
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION), for deployments where migrations run separately.
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Whether the store listens for the resets other instances announce
    /// (see [Notices](crate#notices)): on by default, at the cost of one
    /// more connection per store. Off, a reset reaches only the refusal
    /// caches of this process, and other instances' cached refusals stand
    /// until their retry time. Every reset is announced either way.
    pub fn notices(mut self, enabled: bool) -> Self {
        self.notices = enabled;
        self
    }

    /// How often the listener sends itself a notice to check that it still
    /// hears (default [`DEFAULT_NOTICE_HEARTBEAT`]): a listener that hears
    /// nothing for this plus the store's timeout counts its subscription
    /// lost, and the refusal caches drop what they hold. From 10 ms to one
    /// hour.
    pub fn notice_heartbeat(mut self, every: Duration) -> Self {
        self.notice_heartbeat = every;
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

    /// The connect options of the store's own connections, or of the given
    /// pool's; refuses any setting the store cannot honour.
    fn validate(&self) -> Result<PgConnectOptions, ConfigError> {
        let options = match &self.source {
            Source::Url(url) => parse_url(url)?,
            Source::Pool(pool) => {
                for (set, name) in [
                    (self.pool_size.is_some(), "pool_size"),
                    (self.statement_timeout.is_some(), "statement_timeout"),
                    (self.synchronous_commit.is_some(), "synchronous_commit"),
                ] {
                    if set {
                        return Err(invalid(format!(
                            "postgres {name} configures the store's own connections; a store \
                             built on an existing pool uses that pool as it is: set it on the \
                             pool's options instead"
                        )));
                    }
                }
                if pool.is_closed() {
                    return Err(invalid("the postgres pool given to the store is closed"));
                }
                (*pool.connect_options()).clone()
            }
        };
        validate_schema(&self.schema)?;
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&self.notice_heartbeat)
        {
            return Err(invalid(format!(
                "postgres notice_heartbeat must be from 10 ms to one hour, not {:?}",
                self.notice_heartbeat
            )));
        }
        if self.pool_size == Some(0) {
            return Err(invalid("postgres pool size must be at least 1"));
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
                return Err(invalid(format!(
                    "postgres {name} must be at least 1 ms, got {d:?}"
                )));
            }
        }
        if self.gc_slack < Duration::from_millis(1) || micros(self.gc_slack) >= 1 << 50 {
            return Err(invalid(format!(
                "postgres GC slack must be between 1 ms and 35 years, got {:?}",
                self.gc_slack
            )));
        }
        if micros(self.abuse_retention) >= 1 << 50 {
            return Err(invalid(format!(
                "abuse retention must be under 35 years, got {:?}",
                self.abuse_retention
            )));
        }
        if self.sweep_batch == 0 || self.sweep_batch > 1_000_000 {
            return Err(invalid(format!(
                "sweep batch must be between 1 and 1000000, got {}",
                self.sweep_batch
            )));
        }
        if self
            .sweep_interval
            .is_some_and(|i| i < Duration::from_millis(1))
        {
            return Err(invalid("sweep interval must be at least 1 ms"));
        }
        Ok(options)
    }

    /// Connects, creates or checks the schema, and returns the store.
    ///
    /// Fails with [`BuildError::Config`] for a malformed URL or setting
    /// (including a TLS `sslmode` in a build without the `tls` feature),
    /// [`BuildError::Store`] when the database cannot be reached (or its
    /// certificate is not trusted) within the connect timeout, and a schema
    /// error when the schema belongs to another version.
    pub async fn build(self) -> Result<PostgresStore, BuildError> {
        let options = self.validate()?;
        let options = match self.source {
            // An application's pool keeps its own name and logging.
            Source::Pool(_) => options,
            Source::Url(_) => {
                // Named for pg_stat_activity unless the URL names it.
                let named = options.get_application_name().is_some();
                let options = options.log_statements(tracing::log::LevelFilter::Off);
                if named {
                    options
                } else {
                    options.application_name("ratewarden-postgres")
                }
            }
        };
        let plan = SchemaPlan {
            schema: &self.schema,
            migrate: self.migrate,
            unlogged: self.unlogged,
        };
        match tokio::time::timeout(self.connect_timeout, prepare_schema(&options, &plan)).await {
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

        let (connections, pool) = match &self.source {
            Source::Url(_) => {
                let statement_timeout = self.statement_timeout.unwrap_or(self.timeout);
                let mut settings = vec![(
                    "statement_timeout",
                    format!("{}ms", statement_timeout.as_millis().max(1)),
                )];
                if let Some(on) = self.synchronous_commit {
                    let value = if on { "on" } else { "off" };
                    settings.push(("synchronous_commit", value.to_string()));
                }
                let session = options.clone().options(settings);
                let size = self.pool_size.unwrap_or(DEFAULT_POOL_SIZE) as usize;
                let maintenance = PgPoolOptions::new()
                    .max_connections(1)
                    .min_connections(0)
                    .acquire_timeout(self.timeout)
                    // Sweeps are not on the request path; the ping sqlx's
                    // pool sends after each costs nothing that matters.
                    .test_before_acquire(false)
                    .connect_lazy_with(session.clone());
                (
                    Connections::Own(Box::new(OwnConnections::new(session, size))),
                    maintenance,
                )
            }
            Source::Pool(pool) => (Connections::Pool(pool.clone()), pool.clone()),
        };

        let shared = Arc::new(Shared::new(connections, pool, &self));
        let sweeper = match self.sweep_interval {
            None => None,
            Some(every) => {
                let handle = tokio::runtime::Handle::try_current().map_err(|_| {
                    invalid(
                        "the postgres background sweeper needs a Tokio runtime; \
                         disable it with sweep_interval(None)",
                    )
                })?;
                Some(handle.spawn(sweep_forever(Arc::clone(&shared), every)))
            }
        };
        let attempts = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let listener = match &shared.notices {
            Some(notices) => {
                let handle = tokio::runtime::Handle::try_current().map_err(|_| {
                    invalid(
                        "the postgres notice listener needs a Tokio runtime; \
                         disable it with notices(false)",
                    )
                })?;
                // A connection of its own, held while it listens.
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .min_connections(0)
                    .max_lifetime(None)
                    .idle_timeout(None)
                    .test_before_acquire(false)
                    .connect_lazy_with(options.clone());
                let task = crate::notices::Listener {
                    notices: notices.clone(),
                    pool,
                    channel: shared.notice_channel.clone(),
                    heartbeat: self.notice_heartbeat,
                    timeout: self.timeout,
                    subscriptions: shared.subscriptions.clone(),
                    attempts: attempts.clone(),
                };
                let listener = handle.spawn(task.run(Arc::downgrade(&shared)));
                // Nothing is decided (and so cached or leased in front of
                // the store) before resets can be heard: the first attempt
                // to listen is waited for, at most the store's timeout (a
                // failed one has marked the notices lost).
                let mut attempted = attempts.subscribe();
                let _ = tokio::time::timeout(self.timeout, attempted.wait_for(|n| *n > 0)).await;
                Some(listener)
            }
            None => None,
        };
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                shared,
                sweeper,
                listener,
            }),
        })
    }
}

impl PostgresStore {
    /// A builder for a store at `url` (a scheme of [`URL_SCHEMES`](crate::URL_SCHEMES):
    /// `postgres://…` or `postgresql://…`), with every option at its
    /// default. Nothing is checked or connected until
    /// [`build`](PostgresStoreBuilder::build).
    ///
    /// The store opens and holds its own connections, so that every
    /// decision and refund is exactly one request and one answer on the
    /// wire.
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        Self::builder_from(Source::Url(url.into()))
    }

    /// A builder for a store on an application's existing pool, with every
    /// other option at its default.
    ///
    /// Decisions, refunds, sweeps and abuse events all run on `pool`, as it
    /// is configured: its size, acquire timeout and session settings. The
    /// store's [`timeout`](PostgresStoreBuilder::timeout) still bounds
    /// every call; set `statement_timeout` on the pool's connect options so
    /// that the server cancels a statement the store has given up on.
    /// [`pool_size`](PostgresStoreBuilder::pool_size),
    /// [`statement_timeout`](PostgresStoreBuilder::statement_timeout) and
    /// [`synchronous_commit`](PostgresStoreBuilder::synchronous_commit) are
    /// refused at build, since the store cannot apply them to a pool it did
    /// not open. Migrations run on a connection of their own, opened with
    /// the pool's connect options.
    ///
    /// **Two exchanges per decision.** sqlx's pool (0.8) pings every
    /// connection it gets back, whatever `test_before_acquire` says, so each
    /// decision or refund through a `PgPool` is its statement *and* a ping:
    /// twice the round trips of a store built with
    /// [`builder`](PostgresStore::builder), which holds connections of its
    /// own. Prefer that one on a hot path; this one is for sharing an
    /// application's connection budget.
    pub fn builder_with_pool(pool: PgPool) -> PostgresStoreBuilder {
        Self::builder_from(Source::Pool(pool))
    }

    fn builder_from(source: Source) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            source,
            schema: DEFAULT_SCHEMA.to_string(),
            pool_size: None,
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
            notices: true,
            notice_heartbeat: DEFAULT_NOTICE_HEARTBEAT,
        }
    }

    /// A store at `url` with every option at its default: schema
    /// [`DEFAULT_SCHEMA`], 16 connections, [`DEFAULT_TIMEOUT`], client
    /// clock, and a background sweeper on the system clock.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), ratewarden_postgres::BuildError> {
    /// let store = ratewarden_postgres::PostgresStore::from_url("postgres://postgres@localhost/app").await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_url(url: &str) -> Result<PostgresStore, BuildError> {
        Self::builder(url).build().await
    }
}
