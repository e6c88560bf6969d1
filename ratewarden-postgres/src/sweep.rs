//! Expiry: bounded `DELETE`s through the `expires_at` indexes, the
//! maintenance loop that repeats them, and the background sweeper.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::{ConfigError, StoreError, Timestamp};

use crate::{NAME, PostgresStore, Shared, to_i64};

/// Every table with an `expires_at` column.
const SWEPT_TABLES: [&str; 6] = [
    "sliding_log",
    "fixed_window",
    "sliding_window",
    "gcra",
    "bans",
    "abuse_events",
];

/// The sweep statement of each table in schema `s` (a quoted identifier),
/// with `$1` the time in µs (`NULL` for the server's clock) and `$2` the
/// batch size.
pub(crate) fn sweep_statements(s: &str) -> Vec<(&'static str, String)> {
    // ctid = ANY(ARRAY(...)) is a TID scan of at most $2 rows found via
    // the expires_at index (the bound is an init-plan so that a volatile
    // server clock still yields an index condition). A row updated
    // meanwhile has a new ctid, which the re-check of READ COMMITTED no
    // longer matches, so it is left for the next sweep rather than deleted
    // while live.
    SWEPT_TABLES
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
        .collect()
}

/// What one [`PostgresStore::sweep`] or [`PostgresStore::maintenance`] pass
/// removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Rows deleted in total.
    pub deleted: u64,
    /// State rows deleted (ban rows among them).
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

impl Shared {
    /// One bounded `DELETE` per table. Sweeps run on the maintenance pool,
    /// so a long one never holds a connection a decision is waiting for.
    pub(crate) async fn sweep(
        &self,
        now: Option<i64>,
        batch: u32,
    ) -> Result<SweepReport, StoreError> {
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

    pub(crate) async fn maintenance(&self) -> Result<SweepReport, StoreError> {
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

/// The background sweeper: `maintenance` every `every`, until aborted when
/// the store is dropped.
pub(crate) async fn sweep_forever(shared: Arc<Shared>, every: Duration) {
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

impl PostgresStore {
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
}
