//! Abuse events: refusals recorded in a sink, at most one write per key per
//! window, each carrying the number of refusals it stands for.
//!
//! A sink is a durable store (a Postgres table with retention, say). If each
//! refusal were one write, a client hammering at 10,000 requests a second
//! would be 10,000 writes a second: the amplification a limiter exists to
//! prevent. So the first refusal of a key in a window is written at once,
//! later ones in the same window are only counted in memory, and the count
//! rides on the key's next event (or on [`Limiter::flush_abuse_events`]).
//!
//! [`Limiter::flush_abuse_events`]: crate::Limiter::flush_abuse_events

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use hashlink::LruCache;

use crate::error::{ErrorKind, StoreError};
use crate::failure::{Attempt, Breaker, BreakerConfig};
use crate::time::Timestamp;

/// Refusals worth keeping: who was refused, by which rule, how often and
/// when.
///
/// One event stands for every refusal of one key since the previous event
/// of that key, so that a flood of refusals is one write per key per window,
/// not one per request, and no refusal goes uncounted.
///
/// Build one with [`new`](Self::new); fields may be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AbuseEvent {
    /// The rule that refused.
    pub rule: Arc<str>,
    /// The client key as the limiter received it (a pseudonym such as an
    /// HMAC of the address, never a raw address when keys come from
    /// client identity).
    pub key: Vec<u8>,
    /// The latest refusal this event stands for.
    pub at: Timestamp,
    /// The earliest refusal this event stands for.
    pub since: Timestamp,
    /// How many refusals this event stands for (at least 1).
    pub refusals: u64,
    /// The store whose decision refused the latest of them.
    pub refused_by: &'static str,
}

impl AbuseEvent {
    /// One refusal of `key` by `rule` at `at`, by the store `refused_by`.
    pub fn new(
        rule: impl Into<Arc<str>>,
        key: impl Into<Vec<u8>>,
        at: Timestamp,
        refused_by: &'static str,
    ) -> Self {
        AbuseEvent {
            rule: rule.into(),
            key: key.into(),
            at,
            since: at,
            refusals: 1,
            refused_by,
        }
    }

    /// The same event standing for `refusals` refusals, the earliest at
    /// `since`.
    pub fn with_refusals(mut self, refusals: u64, since: Timestamp) -> Self {
        self.refusals = refusals;
        self.since = since;
        self
    }
}

/// Somewhere to record refusals (for example a Postgres table with
/// retention).
#[async_trait]
pub trait AbuseSink: Send + Sync + fmt::Debug + 'static {
    /// Records one event.
    async fn record(&self, event: AbuseEvent) -> Result<(), StoreError>;
}

/// How many keys a rule tracks between abuse events. Past it the key
/// refused least recently is forgotten: its held-back count is written
/// first, so a flood of distinct keys costs at most one extra write per key.
pub const ABUSE_TRACKED_KEYS: usize = 10_000;

/// What happened to the writes one call made, for the rule's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Writes {
    pub(crate) written: u64,
    pub(crate) failed: u64,
    /// Held-back refusals forgotten because the sink failed and the tracker
    /// was full.
    pub(crate) dropped: u64,
}

impl Writes {
    fn add(&mut self, other: Writes) {
        self.written += other.written;
        self.failed += other.failed;
        self.dropped += other.dropped;
    }
}

/// Refusals of one key since its last event.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// Wall time (µs) from which the next refusal is written at once.
    next_write: u64,
    refusals: u64,
    since: Timestamp,
    at: Timestamp,
    refused_by: &'static str,
}

/// One rule's recorder: the sink behind its own breaker, and the counts
/// held back per key.
pub(crate) struct AbuseRecorder {
    rule: Arc<str>,
    sink: Arc<dyn AbuseSink>,
    breaker: Breaker,
    window_us: u64,
    held: Mutex<LruCache<Vec<u8>, Held>>,
}

impl fmt::Debug for AbuseRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbuseRecorder")
            .field("sink", &self.sink)
            .field("window_us", &self.window_us)
            .finish_non_exhaustive()
    }
}

impl AbuseRecorder {
    pub(crate) fn new(
        rule: Arc<str>,
        sink: Arc<dyn AbuseSink>,
        breaker: BreakerConfig,
        window: Duration,
    ) -> Self {
        AbuseRecorder {
            rule,
            sink,
            breaker: Breaker::new(breaker),
            window_us: u64::try_from(window.as_micros()).unwrap_or(u64::MAX),
            held: Mutex::new(LruCache::new(ABUSE_TRACKED_KEYS)),
        }
    }

    /// A recorder for the same sink with nothing held back.
    pub(crate) fn rebuilt(&self) -> Self {
        AbuseRecorder::new(
            self.rule.clone(),
            self.sink.clone(),
            self.breaker.config(),
            Duration::from_micros(self.window_us),
        )
    }

    pub(crate) fn with_breaker(self, breaker: BreakerConfig) -> Self {
        AbuseRecorder {
            breaker: Breaker::new(breaker),
            ..self
        }
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<Vec<u8>, Held>> {
        // Counts only: valid after any panic.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn event(&self, key: Vec<u8>, held: &Held) -> AbuseEvent {
        AbuseEvent {
            rule: self.rule.clone(),
            key,
            at: held.at,
            since: held.since,
            refusals: held.refusals,
            refused_by: held.refused_by,
        }
    }

    /// Counts one refusal of `key`; the writing of an event when it is the
    /// key's first refusal in a window (and of one for a key the tracker
    /// forgets to make room), if one is due.
    pub(crate) fn refused(
        &self,
        key: &[u8],
        now: Timestamp,
        mono: u64,
        refused_by: &'static str,
        timeout: Duration,
    ) -> Option<Pin<Box<dyn Future<Output = Writes> + Send + '_>>> {
        let (due, forgotten) = self.count(key, now, refused_by);
        if due.is_none() && forgotten.is_none() {
            return None;
        }
        // Boxed, and only when there is something to write: most refusals
        // write nothing, and the writes' state (two events and a sink call
        // under a timeout) would otherwise be part of every refusal's
        // future, up to `Limiter::check`'s.
        Some(Box::pin(async move {
            let mut writes = Writes::default();
            for event in due.into_iter().chain(forgotten) {
                writes.add(self.write(event, mono, timeout).await);
            }
            writes
        }))
    }

    /// Counts one refusal of `key`; the events due to be written, if any:
    /// the key's, and one for a key forgotten to make room.
    fn count(
        &self,
        key: &[u8],
        now: Timestamp,
        refused_by: &'static str,
    ) -> (Option<AbuseEvent>, Option<AbuseEvent>) {
        let mut held = self.lock();
        let t = now.as_micros();
        if let Some(h) = held.get_mut(key) {
            if h.refusals == 0 {
                h.since = now;
            }
            h.refusals += 1;
            h.at = now;
            h.refused_by = refused_by;
            if t < h.next_write {
                return (None, None);
            }
            let event = self.event(key.to_vec(), h);
            h.refusals = 0;
            h.next_write = t.saturating_add(self.window_us);
            (Some(event), None)
        } else {
            let fresh = Held {
                next_write: t.saturating_add(self.window_us),
                refusals: 0,
                since: now,
                at: now,
                refused_by,
            };
            let forgotten = if held.len() >= ABUSE_TRACKED_KEYS {
                held.remove_lru()
                    .filter(|(_, h)| h.refusals > 0)
                    .map(|(k, h)| self.event(k, &h))
            } else {
                None
            };
            held.insert(key.to_vec(), fresh);
            let first = Held {
                refusals: 1,
                ..fresh
            };
            (Some(self.event(key.to_vec(), &first)), forgotten)
        }
    }

    /// Writes every held-back count now.
    pub(crate) async fn flush(&self, mono: u64, timeout: Duration) -> Writes {
        let pending: Vec<AbuseEvent> = {
            let mut held = self.lock();
            held.iter_mut()
                .filter(|(_, h)| h.refusals > 0)
                .map(|(k, h)| {
                    let event = self.event(k.clone(), h);
                    h.refusals = 0;
                    event
                })
                .collect()
        };
        let mut writes = Writes::default();
        for event in pending {
            writes.add(self.write(event, mono, timeout).await);
        }
        writes
    }

    /// One sink call behind the breaker and the timeout. An event that
    /// cannot be written is held back again, to ride on the key's next one.
    async fn write(&self, event: AbuseEvent, mono: u64, timeout: Duration) -> Writes {
        let attempt = self.breaker.attempt(|| mono);
        if attempt == Attempt::Skip {
            return self.hold_back(event, Writes::default());
        }
        let guard = crate::failure::ProbeGuard::new(&self.breaker, attempt);
        let result = match tokio::time::timeout(timeout, self.sink.record(event.clone())).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::timeout("abuse sink", timeout)),
        };
        guard.disarm();
        match result {
            Ok(()) => {
                self.breaker.success();
                Writes {
                    written: 1,
                    ..Writes::default()
                }
            }
            Err(e) => {
                if e.kind() == ErrorKind::InvalidRequest {
                    self.breaker.release(attempt);
                } else {
                    self.breaker.failure(mono);
                }
                tracing::warn!(rule = %self.rule, error = %e, "recording an abuse event failed");
                self.hold_back(
                    event,
                    Writes {
                        failed: 1,
                        ..Writes::default()
                    },
                )
            }
        }
    }

    fn hold_back(&self, event: AbuseEvent, mut writes: Writes) -> Writes {
        let mut held = self.lock();
        if let Some(h) = held.get_mut(&event.key) {
            h.since = if h.refusals == 0 {
                event.since
            } else {
                h.since.min(event.since)
            };
            h.refusals += event.refusals;
            return writes;
        }
        if held.len() >= ABUSE_TRACKED_KEYS
            && let Some((_, lost)) = held.remove_lru()
        {
            writes.dropped += lost.refusals;
        }
        held.insert(
            event.key,
            Held {
                next_write: event.at.as_micros(),
                refusals: event.refusals,
                since: event.since,
                at: event.at,
                refused_by: event.refused_by,
            },
        );
        writes
    }
}
