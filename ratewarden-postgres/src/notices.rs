//! Resets heard from the rest of a fleet, through Postgres
//! `LISTEN`/`NOTIFY`.
//!
//! Every [`reset`](ratewarden_core::Store::reset) deletes the key's row and
//! calls `pg_notify` on the schema's channel (`{schema}.notices`) in the
//! same statement, so the notice is sent exactly when the delete commits.
//! Each store listens on that channel on a connection of its own and tells
//! the refusal caches in front of it ([`Invalidations`]) of every key it
//! hears. A notice names its key in hex; a key too long for a notice
//! (over [`NAMED`] bytes: notices carry at most 8,000) is sent as `*`,
//! which drops every cached refusal.
//!
//! Notices sent while a listener is away are lost to it, so the store
//! vouches for the copies in front of it only while it listens: the
//! listener sends itself an empty notice every
//! [heartbeat](crate::PostgresStoreBuilder::notice_heartbeat) and counts
//! the subscription lost when nothing (its own heartbeat included) was
//! heard for a heartbeat and the store's timeout, or its connection closed.
//! From then until it listens again, every cached refusal is dropped and
//! none is kept.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ratewarden_core::Invalidations;
use sqlx::postgres::{PgListener, PgPool};
use tokio::time::Instant;

use crate::Shared;

/// The longest key a notice names; a longer one is sent as `*`.
pub(crate) const NAMED: usize = 3_999;

const MIN_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// What a store's listener needs besides the store itself.
pub(crate) struct Listener {
    pub(crate) notices: Arc<Invalidations>,
    /// Its own connection (a pool of one, for `PgListener`).
    pub(crate) pool: PgPool,
    pub(crate) channel: String,
    pub(crate) heartbeat: Duration,
    pub(crate) timeout: Duration,
    pub(crate) subscriptions: Arc<tokio::sync::watch::Sender<u64>>,
    /// How many times it has tried to listen, successfully or not: the
    /// store's build waits for the first.
    pub(crate) attempts: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Listener {
    /// Listens, hears, and listens again after every failure, until the
    /// store is dropped.
    pub(crate) async fn run(self, store: Weak<Shared>) {
        let mut retry = MIN_RETRY;
        loop {
            let listening = tokio::time::timeout(self.timeout, self.listen()).await;
            match listening {
                Ok(Ok(listener)) => {
                    self.notices.restored();
                    self.subscriptions.send_modify(|n| *n += 1);
                    self.attempts.send_modify(|n| *n += 1);
                    retry = MIN_RETRY;
                    let why = self.hear(listener, &store).await;
                    self.notices.lost();
                    if store.strong_count() == 0 {
                        return;
                    }
                    tracing::warn!(channel = %self.channel, why,
                        "postgres notice subscription lost; refusal caches drop what they hold until it is back");
                }
                Ok(Err(e)) => {
                    self.notices.lost();
                    self.attempts.send_modify(|n| *n += 1);
                    tracing::debug!(error = %e, "postgres LISTEN failed");
                }
                Err(_) => {
                    self.notices.lost();
                    self.attempts.send_modify(|n| *n += 1);
                    tracing::debug!("postgres LISTEN timed out");
                }
            }
            if store.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }

    async fn listen(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        // A lost connection ends the subscription here, to be counted as a
        // loss, rather than being reconnected inside `try_recv`.
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        listener.listen(&self.channel).await?;
        Ok(listener)
    }

    /// Tells the caches of every key heard until the subscription fails;
    /// why it ended.
    async fn hear(&self, mut listener: PgListener, store: &Weak<Shared>) -> &'static str {
        // `try_recv` is not cancel-safe (a notice half read would be lost
        // with its connection), so it runs on a task of its own and hands
        // each payload over a channel, which a select can wait on safely.
        let (heard, mut payloads) = tokio::sync::mpsc::channel::<String>(1_024);
        let reader = tokio::spawn(async move {
            while let Ok(Some(notice)) = listener.try_recv().await {
                if heard.send(notice.payload().to_owned()).await.is_err() {
                    return;
                }
            }
        });
        let mut heartbeat = tokio::time::interval(self.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        let why = loop {
            tokio::select! {
                payload = payloads.recv() => match payload {
                    Some(payload) => {
                        last = Instant::now();
                        self.heard(&payload);
                    }
                    None => break "the connection closed",
                },
                _ = heartbeat.tick() => {
                    if last.elapsed() > self.heartbeat + self.timeout {
                        break "its heartbeat went unheard";
                    }
                    let Some(shared) = store.upgrade() else { break "the store was dropped" };
                    // Sent on the store's maintenance pool, not awaited here:
                    // what matters is whether it is heard.
                    let pool = shared.pool.clone();
                    let channel = self.channel.clone();
                    let timeout = self.timeout;
                    tokio::spawn(async move {
                        let beat = sqlx::query("SELECT pg_notify($1, '')").bind(channel);
                        let _ = tokio::time::timeout(timeout, beat.execute(&pool)).await;
                    });
                }
            }
        };
        reader.abort();
        why
    }

    fn heard(&self, payload: &str) {
        match payload {
            // A heartbeat.
            "" => {}
            "*" => self.notices.invalidate_all(),
            hex => match unhex(hex) {
                Some(key) => self.notices.reset(&key),
                // Not a notice this store sends: whatever it meant, drop
                // everything rather than miss a reset.
                None => self.notices.invalidate_all(),
            },
        }
    }
}

/// Decodes lowercase or uppercase hex, as `encode(…, 'hex')` writes it.
/// Written here: eight lines, where a crate would be a dependency for one
/// call.
fn unhex(hex: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// The channel a schema's resets are announced on: `{schema}.notices`,
/// cut to the 63 bytes a Postgres identifier holds (two schemas whose names
/// agree that far share a channel, which costs their caches an extra store
/// call, never a missed reset).
pub(crate) fn channel(schema: &str) -> String {
    let mut channel = format!("{schema}.notices");
    let mut end = channel.len().min(63);
    while !channel.is_char_boundary(end) {
        end -= 1;
    }
    channel.truncate(end);
    channel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_decodes_what_postgres_encodes_and_refuses_the_rest() {
        assert_eq!(unhex("6c6f67696e3a616c696365").unwrap(), b"login:alice");
        assert_eq!(unhex("00FF").unwrap(), [0, 255]);
        assert_eq!(unhex("").unwrap(), b"");
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn a_channel_fits_an_identifier() {
        assert_eq!(channel("ratewarden"), "ratewarden.notices");
        assert_eq!(channel(&"s".repeat(70)).len(), 63);
    }
}
