//! Which storage keys' local copies a give-back or a reset has made stale.
//!
//! A rule's refusal cache holds copies of what a shared store answered. A
//! refund, a released permit, a response-decided give-back or a reset
//! changes the store's count for a storage key (`{rule}:{client key}`),
//! and every copy of that key in front of the store must stop answering at
//! once, or the next request is refused for units the store has back. A
//! give-back to one rule leaves the other rules' copies standing: their
//! counts did not move.
//!
//! Removing the key from the caches is not enough on its own: a refusal
//! the store made *before* the give-back can still be in flight and land
//! in a cache after it. So every copy is stamped with a [`Ticket`], taken
//! before its store call, and counts only while no invalidation of its key
//! has happened since. [`Invalidations::invalidate`] bumps the key's
//! epoch; a copy whose ticket is older is dropped where it is found.
//!
//! Each store that hears other instances has a table of its own
//! ([`Store::invalidations`](crate::Store::invalidations)), shared by every
//! rule in front of it; every other store shares one table per process.
//!
//! Epochs are kept per stripe of keys (a hash of the storage key picks the
//! stripe), not per key, so that the table is fixed in size whatever the
//! keys: a stripe shared by two keys costs one of them an extra store call
//! after the other's give-back, never a wrong answer.
//!
//! Written here rather than taken from a crate: it is the project's own
//! rule (which copies a give-back invalidates, and the race it closes), in
//! a few dozen lines of atomics.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tokio::sync::Notify;

/// How many stripes of epochs a table keeps: 128 KiB for each kind. With a thousand
/// give-backs a second spread over it, a given stripe is bumped about once
/// every 16 s, so an offender's cached refusal rarely costs an extra call.
const STRIPES: usize = 16_384;

/// The notices that tell the local copies of a store's keys (the refusal
/// caches of the rules in front of it) that the store's state changed: a
/// key given back or reset through this process, or, for a store that
/// hears other instances ([`Store::invalidations`](crate::Store::invalidations)),
/// a key reset by any instance of the fleet.
///
/// A store that hears other instances owns one, calls
/// [`invalidate`](Self::invalidate) for each key another instance reset,
/// and [`lost`](Self::lost) when it may miss notices (its subscription
/// dropped): from then until [`restored`](Self::restored) no copy is kept
/// or answered, since none can be vouched for.
///
/// ```
/// use ratewarden_core::Invalidations;
///
/// let notices = Invalidations::unvouched(); // not subscribed yet
/// // ... the store's subscription is established:
/// notices.restored();
/// // ... another instance reset `login:alice`, and the store heard it:
/// notices.invalidate(b"login:alice");
/// // ... the subscription dropped: nothing cached is answered until it is back.
/// notices.lost();
/// ```
pub struct Invalidations {
    hasher: std::collections::hash_map::RandomState,
    /// Bumped by every give-back and reset: what a cached refusal checks.
    epochs: Box<[AtomicU64]>,
    /// Bumped by resets only: what leased units check, since a give-back
    /// returns units to the store and takes none from a lease.
    resets: Box<[AtomicU64]>,
    /// Bumped on every [`lost`](Self::lost) and
    /// [`restored`](Self::restored): every copy made before is stale.
    generation: AtomicU64,
    /// Notices are being heard; copies are kept and answered only then.
    vouched: AtomicBool,
    /// Set by the first ticket: until a refusal cache has stamped a copy,
    /// there is none to invalidate, and an in-process store's give-back
    /// costs one load instead of a hash.
    stamped: AtomicBool,
    /// The waiters paused on a refusal ([`Limiter::until_ready`](crate::Limiter::until_ready)),
    /// by stripe, while any is: a pause is a copy of a refusal too, made
    /// stale by a give-back or reset of its key.
    wakers: Mutex<HashMap<usize, Arc<Notify>>>,
    /// How many [`Watch`]es there are: none, and a give-back takes no lock.
    watches: AtomicUsize,
}

impl fmt::Debug for Invalidations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Invalidations")
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .field("vouched", &self.vouched.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for Invalidations {
    fn default() -> Self {
        Invalidations::new()
    }
}

impl Invalidations {
    /// A table that vouches for the copies it stamps from the start: for
    /// state changed only through this process.
    pub fn new() -> Self {
        Invalidations {
            hasher: std::collections::hash_map::RandomState::new(),
            epochs: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            resets: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            generation: AtomicU64::new(0),
            vouched: AtomicBool::new(true),
            stamped: AtomicBool::new(false),
            wakers: Mutex::default(),
            watches: AtomicUsize::new(0),
        }
    }

    /// A table that vouches for nothing until [`restored`](Self::restored):
    /// for a store whose subscription to other instances' notices is not
    /// established yet.
    pub fn unvouched() -> Self {
        let table = Invalidations::new();
        table.vouched.store(false, Ordering::Release);
        table
    }

    /// The table of every store that hears no other instance: changes
    /// made through this process reach every limiter of the process.
    pub(crate) fn process() -> Arc<Invalidations> {
        static TABLE: OnceLock<Arc<Invalidations>> = OnceLock::new();
        TABLE.get_or_init(|| Arc::new(Invalidations::new())).clone()
    }

    fn stripe(&self, key: &[u8]) -> usize {
        // The low bits of a keyed SipHash: spread, and not steerable by a
        // client choosing keys that share a victim's stripe.
        (self.hasher.hash_one(key) as usize) % STRIPES
    }

    /// Makes every copy of the storage key `key` made before now stale.
    /// Called after the store has the change (so a copy made later sees
    /// it), and also before where the change is not awaited (so the next
    /// request does not wait for it to land).
    pub fn invalidate(&self, key: &[u8]) {
        // SeqCst with the store in `ticket`: a ticket whose flag this load
        // misses was taken after it, so after the change reached the store.
        if self.stamped.load(Ordering::SeqCst) {
            self.epochs[self.stripe(key)].fetch_add(1, Ordering::SeqCst);
        }
        // A give-back returns some units: one waiter asks for them, and
        // the next is woken by the next give-back, not all of them at once
        // to a store that has a few units for them.
        self.wake(key, Notify::notify_one);
    }

    /// The storage key `key` was reset: every copy of its state made before
    /// now is stale, cached refusals and leased units alike
    /// ([`LeasedStore`](crate::lease::LeasedStore) drops a batch bought
    /// before the reset). What a store calls for each reset another
    /// instance announces.
    pub fn reset(&self, key: &[u8]) {
        let stripe = self.stripe(key);
        self.resets[stripe].fetch_add(1, Ordering::SeqCst);
        self.epochs[stripe].fetch_add(1, Ordering::SeqCst);
        // The whole limit is back: every waiter asks.
        self.wake(key, Notify::notify_waiters);
    }

    /// Makes every copy made before now stale, whatever its key: for a
    /// notice that cannot name its key (one too long for the channel).
    pub fn invalidate_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if self.watches.load(Ordering::SeqCst) > 0 {
            for notify in self.lock_wakers().values() {
                notify.notify_waiters();
            }
        }
    }

    fn lock_wakers(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Arc<Notify>>> {
        // A map of handles, whole after any panic.
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the waiters paused on `key`'s stripe, if any, with `how`.
    fn wake(&self, key: &[u8], how: fn(&Notify)) {
        // SeqCst with the increment in `watch`: a waiter whose count this
        // load misses registered after the change, and asks the store after
        // it too.
        if self.watches.load(Ordering::SeqCst) > 0
            && let Some(notify) = self.lock_wakers().get(&self.stripe(key))
        {
            how(notify);
        }
    }

    /// Registers a waiter paused on a refusal of the storage key `key`
    /// until the returned [`Watch`] is dropped: a give-back or reset of the
    /// key from then on ends its pause ([`Watch::notify`]).
    pub(crate) fn watch(self: &Arc<Self>, key: &[u8]) -> Watch {
        let stripe = self.stripe(key);
        let notify = Arc::clone(self.lock_wakers().entry(stripe).or_default());
        self.watches.fetch_add(1, Ordering::SeqCst);
        Watch {
            table: Arc::clone(self),
            stripe,
            notify: Some(notify),
        }
    }

    /// Notices may be missed from now on: every copy is stale, and none is
    /// kept or answered until [`restored`](Self::restored).
    pub fn lost(&self) {
        self.vouched.store(false, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Notices are heard again: after a [`lost`](Self::lost), every copy
    /// made before is stale (a notice may have been missed), and copies
    /// made from now on are kept. On a table that was never lost (a store's
    /// first subscription, which its calls wait for) nothing changes.
    pub fn restored(&self) {
        if !self.vouched.load(Ordering::Acquire) {
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.vouched.store(true, Ordering::Release);
        }
    }

    /// Whether notices are being heard now.
    pub fn is_vouched(&self) -> bool {
        self.vouched.load(Ordering::Acquire)
    }

    fn epoch(&self, epochs: &[AtomicU64], stripe: usize) -> u64 {
        // Both only grow, so their sum changes whenever either does.
        epochs[stripe]
            .load(Ordering::Acquire)
            .wrapping_add(self.generation.load(Ordering::Acquire))
    }

    /// A ticket for leased units of the storage key `key`, bought from now
    /// on: stale after a reset of the key, not after a give-back.
    pub(crate) fn lease_ticket(&self, key: &[u8]) -> Ticket {
        let stripe = self.stripe(key);
        Ticket {
            stripe: stripe as u32,
            epoch: self.epoch(&self.resets, stripe),
        }
    }

    /// Whether no reset of the lease ticket's key has happened since it
    /// was taken, and notices are heard.
    pub(crate) fn lease_current(&self, ticket: Ticket) -> bool {
        ticket != Ticket::NONE
            && self.is_vouched()
            && self.epoch(&self.resets, ticket.stripe as usize) == ticket.epoch
    }

    /// A ticket for the storage key `key`, taken now.
    pub(crate) fn ticket(&self, key: &[u8]) -> Ticket {
        if !self.stamped.load(Ordering::Relaxed) {
            self.stamped.store(true, Ordering::SeqCst);
        }
        let stripe = self.stripe(key);
        Ticket {
            stripe: stripe as u32,
            epoch: self.epoch(&self.epochs, stripe),
        }
    }

    /// Whether no invalidation of the ticket's key has happened since it
    /// was taken, and notices are heard.
    pub(crate) fn current(&self, ticket: Ticket) -> bool {
        ticket != Ticket::NONE
            && self.is_vouched()
            && self.epoch(&self.epochs, ticket.stripe as usize) == ticket.epoch
    }
}

/// A waiter's registration for the give-backs and resets of one key
/// ([`Invalidations::watch`]).
pub(crate) struct Watch {
    table: Arc<Invalidations>,
    stripe: usize,
    /// Taken when the watch drops, under the table's lock, so that every
    /// count of the handle changes under it.
    notify: Option<Arc<Notify>>,
}

impl Watch {
    /// What a give-back or reset of the key notifies: enable the
    /// [`Notified`](tokio::sync::futures::Notified) before asking the
    /// store, so that one made between the answer and the pause is not
    /// missed.
    pub(crate) fn notify(&self) -> &Notify {
        self.notify
            .as_deref()
            .expect("a watch holds its handle until dropped")
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.table.watches.fetch_sub(1, Ordering::SeqCst);
        let mut wakers = self.table.lock_wakers();
        drop(self.notify.take());
        // Only the map's handle is left: this was the stripe's last waiter.
        if wakers
            .get(&self.stripe)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            wakers.remove(&self.stripe);
        }
    }
}

/// When a copy of a store's answer for a key was asked for: before the
/// store call whose answer it will hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    stripe: u32,
    epoch: u64,
}

impl Ticket {
    /// A ticket that is never current: for a decision that no refusal
    /// cache will hold, so that it costs no hash.
    pub(crate) const NONE: Ticket = Ticket {
        stripe: u32::MAX,
        epoch: u64::MAX,
    };
}

/// [`Ticket::NONE`]: what holds no copy yet is current for nothing.
impl Default for Ticket {
    fn default() -> Self {
        Ticket::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripes_waker_lives_while_a_waiter_watches_it() {
        let table = Arc::new(Invalidations::new());
        let (a, b) = (table.watch(b"api:k"), table.watch(b"api:k"));
        assert!(std::ptr::eq(a.notify(), b.notify()), "one handle a stripe");
        drop(a);
        assert_eq!(table.lock_wakers().len(), 1, "b still waits");
        drop(b);
        assert!(
            table.lock_wakers().is_empty(),
            "nothing kept once no one waits"
        );
        assert_eq!(table.watches.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_ticket_is_current_until_its_key_is_invalidated() {
        let table = Invalidations::new();
        let t = table.ticket(b"login:alice");
        assert!(table.current(t));
        table.invalidate(b"login:alice");
        assert!(
            !table.current(t),
            "a give-back after the ticket makes it stale"
        );
        let later = table.ticket(b"login:alice");
        assert!(
            table.current(later),
            "a ticket taken after the give-back is fresh"
        );
        assert!(!table.current(Ticket::NONE));
    }

    #[test]
    fn a_give_back_leaves_leased_units_and_a_reset_does_not() {
        let table = Invalidations::new();
        let lease = table.lease_ticket(b"login:alice");
        table.invalidate(b"login:alice");
        assert!(
            table.lease_current(lease),
            "a give-back takes no leased unit"
        );
        table.reset(b"login:alice");
        assert!(
            !table.lease_current(lease),
            "units bought before a reset are stale"
        );
        let refusal = table.ticket(b"login:bob");
        table.reset(b"login:bob");
        assert!(
            !table.current(refusal),
            "a reset makes a cached refusal stale too"
        );
    }

    #[test]
    fn nothing_is_current_while_notices_may_be_missed() {
        let table = Invalidations::unvouched();
        assert!(!table.current(table.ticket(b"k")), "not subscribed yet");
        table.restored();
        let t = table.ticket(b"k");
        assert!(table.current(t));
        table.lost();
        assert!(!table.current(t));
        assert!(!table.current(table.ticket(b"k")), "taken while lost");
        table.restored();
        assert!(!table.current(t), "a copy from before the loss stays stale");
    }
}
