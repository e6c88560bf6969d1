//! Which storage keys' local copies a give-back or a reset has made stale.
//!
//! A rule's refusal cache holds copies of what a shared store answered. A
//! refund, a released permit, a response-decided give-back or a reset
//! changes the store's count for a storage key (`{rule}:{client key}`),
//! and every copy of that key in this process (in any limiter: every plan
//! of [`Plans`](crate::Plans) shares its rules' names) must stop answering
//! at once, or the next request is refused for units the store has back.
//! A give-back to one rule leaves the other rules' copies standing: their
//! counts did not move.
//!
//! Removing the key from the caches is not enough on its own: a refusal
//! the store made *before* the give-back can still be in flight and land
//! in a cache after it. So every copy is stamped with a [`Ticket`], taken
//! before its store call, and counts only while no invalidation of its key
//! has happened since. [`invalidate`] bumps the key's epoch; a copy whose
//! ticket is older is dropped where it is found.
//!
//! Epochs are kept per stripe of keys (a hash of the storage key picks the
//! stripe), not per key, so that the table is fixed in size whatever the
//! keys: a stripe shared by two keys costs one of them an extra store call
//! after the other's give-back, never a wrong answer. The table is one per
//! process, so that two limiters counting the same key (two plans, or an
//! application's limiter and an admin tool's) are both told; it is
//! allocated by the first rule with a refusal cache that asks its store.
//!
//! Written here rather than taken from a crate: it is the project's own
//! rule (which copies a give-back invalidates, and the race it closes),
//! in about forty lines of atomics.

use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many stripes of epochs the process keeps: 128 KiB. With a thousand
/// give-backs a second spread over it, a given stripe is bumped about once
/// every 16 s, so an offender's cached refusal rarely costs an extra call.
const STRIPES: usize = 16_384;

struct Table {
    hasher: std::collections::hash_map::RandomState,
    epochs: Box<[AtomicU64]>,
}

static TABLE: OnceLock<Table> = OnceLock::new();

fn table() -> &'static Table {
    TABLE.get_or_init(|| Table {
        hasher: std::collections::hash_map::RandomState::new(),
        epochs: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
    })
}

fn stripe(table: &Table, key: &[u8]) -> usize {
    // The low bits of a keyed SipHash: spread, and not steerable by a
    // client choosing keys that share a victim's stripe.
    (table.hasher.hash_one(key) as usize) % STRIPES
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
        stripe: 0,
        epoch: u64::MAX,
    };

    /// A ticket for the storage key `key`, taken now.
    pub(crate) fn take(key: &[u8]) -> Ticket {
        let table = table();
        let stripe = stripe(table, key);
        Ticket {
            stripe: stripe as u32,
            // Acquire: a give-back whose store call finished before this
            // ticket's is seen, so a store call made after it is fresh.
            epoch: table.epochs[stripe].load(Ordering::Acquire),
        }
    }

    /// Whether no invalidation of the ticket's key has happened since it
    /// was taken.
    pub(crate) fn current(self) -> bool {
        table().epochs[self.stripe as usize].load(Ordering::Acquire) == self.epoch
    }
}

/// Makes every copy of `key`'s state taken before now stale, in every
/// limiter of the process. Called after the store has the change (so a
/// copy taken later sees it), and also before where the change is not
/// awaited (so the next request does not wait for it to land).
pub(crate) fn invalidate(key: &[u8]) {
    // Until a limiter with a refusal cache has taken a ticket, no copy
    // exists to invalidate: an in-process store's give-back costs one load.
    if let Some(table) = TABLE.get() {
        table.epochs[stripe(table, key)].fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_current_until_its_key_is_invalidated() {
        let t = Ticket::take(b"invalidation-test:alice");
        assert!(t.current());
        invalidate(b"invalidation-test:alice");
        assert!(!t.current(), "a give-back after the ticket makes it stale");
        let later = Ticket::take(b"invalidation-test:alice");
        assert!(
            later.current(),
            "a ticket taken after the give-back is fresh"
        );
    }
}
