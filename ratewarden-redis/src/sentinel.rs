//! A master found through Redis Sentinel, and found again after a failover.
//!
//! The redis crate's `SentinelClient` answers "which server is the master
//! now" (asking the sentinels, then checking with `ROLE` that the server
//! named agrees); it keeps no connection to the master. This module keeps
//! one multiplexed connection to the master it last found and forgets it
//! when a call on it fails or does not answer in time, so that the next
//! call asks the sentinels again. That is the whole failover story: after
//! the sentinels promote a replica, the first call that fails on the old
//! master makes the next one connect to the new master, and the calls in
//! between end in errors within the store's timeout, which a
//! [`Limiter`](ratewarden_core::Limiter) decides under its failure policy.
//!
//! Every error forgets the connection, not only those that look like a
//! failover (`READONLY` from a demoted master, a refused or dropped
//! connection, a timeout): the store's scripts raise no errors of their own
//! on arguments it has checked, so any error says something is wrong with
//! the server or the path to it, and a wrongly forgotten connection costs
//! one lookup, while a wrongly kept one would keep writing to a replica.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, RedisResult};

/// The master of one Sentinel-monitored group, as last found.
pub(crate) struct Master {
    /// Asked one caller at a time: concurrent calls that find no
    /// connection wait for the one lookup in flight instead of each asking
    /// the sentinels.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the master last found, with the generation that
    /// found it.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generations: AtomicU64,
    config: AsyncConnectionConfig,
}

impl Master {
    /// `timeout` bounds connecting to the master and each of its answers.
    pub(crate) fn new(sentinel: SentinelClient, timeout: Duration) -> Self {
        Master {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            generations: AtomicU64::new(0),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout)),
        }
    }

    /// The connection to the master, found through the sentinels if none
    /// is held; with its generation, for [`forget`](Self::forget).
    pub(crate) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(held) = self.held() {
            return Ok(held);
        }
        let mut sentinel = self.sentinel.lock().await;
        // Found while this call waited for the lock.
        if let Some(held) = self.held() {
            return Ok(held);
        }
        let client = sentinel.async_get_client().await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self.lock() = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// A client for the master the sentinels name now, for a connection
    /// of its own (the notice subscription).
    pub(crate) async fn client(&self) -> RedisResult<redis::Client> {
        self.sentinel.lock().await.async_get_client().await
    }

    /// Drops the connection of `generation`, if it is still the one held,
    /// so that the next call asks the sentinels where the master is. A
    /// newer connection, found by a concurrent call, is kept.
    pub(crate) fn forget(&self, generation: u64) {
        let mut current = self.lock();
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    fn held(&self) -> Option<(u64, MultiplexedConnection)> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, MultiplexedConnection)>> {
        // The guarded value is replaced whole, so a panic elsewhere cannot
        // leave it half written.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Forgets a connection unless the call on it answered: dropped when the
/// call errs, or when the store's timeout drops the call's future before
/// it answers.
pub(crate) struct Unanswered<'a> {
    master: &'a Master,
    generation: u64,
    answered: bool,
}

impl<'a> Unanswered<'a> {
    pub(crate) fn new(master: &'a Master, generation: u64) -> Self {
        Unanswered {
            master,
            generation,
            answered: false,
        }
    }

    /// The call answered without an error: keep the connection.
    pub(crate) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.master.forget(self.generation);
        }
    }
}
