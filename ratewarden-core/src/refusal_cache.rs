//! A rule's refusal cache: after a store refuses a key, the same key is
//! refused locally until the retry time the store gave, without asking the
//! store again.
//!
//! An offender hammering a shared store at thousands of requests a second
//! would otherwise cost a round trip per request, every answer "refused
//! until T": the load the limiter exists to keep off the store. The cached
//! refusal records nothing anywhere, as a refusal must not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use hashlink::LruCache;

use crate::decision::Decision;
use crate::invalidation::{Invalidations, Ticket};
use crate::time::{Timestamp, duration_to_micros as micros};
use std::sync::Arc;

/// How many keys a rule's refusal cache holds by default; past it the key
/// refused least recently is forgotten (and asks the store again).
pub const REFUSAL_CACHE_KEYS: usize = 10_000;

#[derive(Debug, Clone)]
struct Held {
    /// When the refusal was made (µs): a clock that goes back before it
    /// makes the entry meaningless.
    at: u64,
    /// Until when the same request is refused (µs).
    until: u64,
    /// When the key was to be clear (µs), for `reset_after`.
    reset_at: u64,
    /// Taken before the store call that refused: a give-back or reset of
    /// the key since then makes the refusal stale.
    ticket: Ticket,
    /// The units the refused request asked for. A request of fewer may fit
    /// what is left (a refusal of 5 with 3 left), so only a request of at
    /// least as many is refused again: whatever keeps `units` out until
    /// `until` keeps every larger request out as long.
    units: u32,
    decision: Decision,
}

pub(crate) struct RefusalCache {
    held: Mutex<LruCache<Vec<u8>, Held>>,
    /// The store's notices of stale keys, which every held refusal's
    /// ticket is checked against.
    notices: Arc<Invalidations>,
    /// Set once anything was put: until a store has refused, a lookup is
    /// one atomic load instead of a lock and a hash.
    used: AtomicBool,
}

impl std::fmt::Debug for RefusalCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefusalCache")
            .field("keys", &self.lock().len())
            .finish()
    }
}

impl RefusalCache {
    pub(crate) fn new(capacity: usize, notices: Arc<Invalidations>) -> Self {
        RefusalCache {
            held: Mutex::new(LruCache::new(capacity)),
            notices,
            used: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<Vec<u8>, Held>> {
        // Plain data, valid after any panic.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached refusal of `key` for a request of `units` at `now`, with
    /// its times brought to `now`, if the store's refusal still stands and
    /// was of no more units.
    pub(crate) fn get(&self, key: &[u8], now: Timestamp, units: u32) -> Option<Decision> {
        if !self.used.load(Ordering::Relaxed) {
            return None;
        }
        let t = now.as_micros();
        let mut held = self.lock();
        let h = held.get(key)?;
        if t < h.at || t >= h.until || !self.notices.current(h.ticket) {
            held.remove(key);
            return None;
        }
        // Kept for the requests it does answer.
        if units < h.units {
            return None;
        }
        let mut d = h.decision.clone();
        d.retry_after = Duration::from_micros(h.until - t);
        d.reset_after = Duration::from_micros(h.reset_at.saturating_sub(t));
        d.source.cached = true;
        Some(d)
    }

    /// A ticket for a refusal of `storage_key` decided from now on.
    pub(crate) fn ticket(&self, storage_key: &[u8]) -> Ticket {
        self.notices.ticket(storage_key)
    }

    /// Forgets `key`'s refusal, if one is held.
    pub(crate) fn remove(&self, key: &[u8]) {
        if self.used.load(Ordering::Relaxed) {
            self.lock().remove(key);
        }
    }

    /// Remembers a refusal the store made for `key` at `now` of a request of
    /// `units`, in a call made after `ticket` was taken; nothing if the key
    /// was given back or reset since (the refusal may predate that).
    pub(crate) fn put(
        &self,
        key: &[u8],
        now: Timestamp,
        units: u32,
        decision: &Decision,
        ticket: Ticket,
    ) {
        if decision.allowed || decision.retry_after.is_zero() || !self.notices.current(ticket) {
            return;
        }
        let t = now.as_micros();
        let held = Held {
            at: t,
            until: t.saturating_add(micros(decision.retry_after)),
            reset_at: t.saturating_add(micros(decision.reset_after)),
            ticket,
            units,
            decision: decision.clone(),
        };
        self.lock().insert(key.to_vec(), held);
        self.used.store(true, Ordering::Relaxed);
    }
}
