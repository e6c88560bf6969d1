//! The statistics counters of rules and leased stores: relaxed atomics,
//! since nothing decided depends on what they read.

use std::sync::atomic::{AtomicU64, Ordering};

/// Adds one to `counter`.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What `counter` holds now, for a snapshot of the statistics.
pub(crate) fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
