//! Resets heard from the rest of a fleet, through Redis pub/sub.
//!
//! Every [`reset`](ratewarden_core::Store::reset) publishes the key it
//! reset on the store's channel (`{prefix}notices`) in the same round trip
//! as its `DEL`. Each store subscribes to that channel on a connection of
//! its own, opened with its first call, and tells the refusal caches in
//! front of it ([`Invalidations`]) of every key it hears: an unban reaches
//! every instance in the time a message takes to cross the server.
//!
//! Pub/sub delivers at most once, and nothing that was published while a
//! subscriber was away. So the store vouches for the copies in front of it
//! only while it is subscribed: from the moment the subscription is found
//! broken or cannot be made (the connection closed, or a `PING` on it
//! unanswered within the store's timeout, sent every
//! [heartbeat](crate::RedisStoreBuilder::notice_heartbeat)) until it is
//! back, every cached refusal is dropped and none is kept. A store's first
//! call waits for its first attempt to subscribe, so nothing is decided
//! before resets can be heard. Each instance
//! then asks the server on every request, which is exact, at the cost of
//! the round trips the refusal cache saves.
//!
//! A Redis Cluster propagates a classic `PUBLISH` to every node, so a store
//! subscribes on any node it can reach. Behind Sentinel it subscribes on
//! the master it finds, and again on the new one after a failover (the old
//! master's connection drops, or stops answering its heartbeat).

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use ratewarden_core::Invalidations;
use redis::aio::{PubSubSink, PubSubStream};

use crate::{Inner, Target};

/// The pause before subscribing again after a failure, doubled up to
/// [`MAX_RETRY`] while failures go on.
const MIN_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// What a store's listener needs besides the store itself.
pub(crate) struct Listener {
    pub(crate) notices: Arc<Invalidations>,
    pub(crate) channel: Vec<u8>,
    pub(crate) heartbeat: Duration,
    pub(crate) timeout: Duration,
    pub(crate) subscriptions: Arc<tokio::sync::watch::Sender<u64>>,
    pub(crate) attempts: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Listener {
    /// Subscribes, hears, and subscribes again after every failure, until
    /// the store is dropped.
    pub(crate) async fn run(self, store: Weak<Inner>) {
        let mut retry = MIN_RETRY;
        let mut node = 0;
        loop {
            let subscribed = {
                let Some(inner) = store.upgrade() else { return };
                tokio::time::timeout(self.timeout, self.subscribe(&inner, node)).await
            };
            // Marked before `hear` runs, with the notices' state set for
            // this attempt's outcome.
            let attempted = || self.attempts.send_modify(|n| *n += 1);
            match subscribed {
                Ok(Ok((sink, stream))) => {
                    self.notices.restored();
                    self.subscriptions.send_modify(|n| *n += 1);
                    attempted();
                    retry = MIN_RETRY;
                    let why = self.hear(sink, stream).await;
                    self.notices.lost();
                    tracing::warn!(channel = %String::from_utf8_lossy(&self.channel), why,
                        "redis notice subscription lost; refusal caches drop what they hold until it is back");
                }
                Ok(Err(e)) => {
                    self.notices.lost();
                    attempted();
                    tracing::debug!(error = %e, "redis notice subscription failed");
                }
                Err(_) => {
                    self.notices.lost();
                    attempted();
                    tracing::debug!("redis notice subscription timed out");
                }
            }
            // Another node of a cluster, if the one tried did not answer.
            node += 1;
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }

    async fn subscribe(
        &self,
        inner: &Inner,
        node: usize,
    ) -> redis::RedisResult<(PubSubSink, PubSubStream)> {
        let client = match &inner.target {
            Target::Sentinel(master) => master.client().await?,
            _ => match inner
                .notice_nodes
                .get(node % inner.notice_nodes.len().max(1))
            {
                Some(client) => client.clone(),
                None => {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "no node to subscribe on",
                    )));
                }
            },
        };
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        Ok(pubsub.split())
    }

    /// Tells the caches of every key heard, until the subscription fails;
    /// why it ended.
    async fn hear(&self, mut sink: PubSubSink, mut stream: PubSubStream) -> &'static str {
        let mut heartbeat = tokio::time::interval(self.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => self.notices.reset(message.get_payload_bytes()),
                    None => return "the connection closed",
                },
                _ = heartbeat.tick() => {
                    let ping = sink.ping::<redis::Value>();
                    match tokio::time::timeout(self.timeout, ping).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(_)) => return "a heartbeat PING failed",
                        Err(_) => return "a heartbeat PING went unanswered",
                    }
                }
            }
        }
    }
}
