//! A rule's counters, and the snapshot [`Limiter::stats`](crate::Limiter::stats)(super::Limiter::stats)
//! returns.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::counter::{bump, load};
use crate::failure::BreakerState;

/// Counters of one rule, updated with relaxed atomics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) allowed: Striped,
    pub(crate) refused: Striped,
    pub(crate) store_errors: AtomicU64,
    pub(crate) short_circuited: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
    pub(crate) degraded: AtomicU64,
    pub(crate) breaker_opened: AtomicU64,
    pub(crate) escalations: AtomicU64,
    pub(crate) abuse_events: AtomicU64,
    pub(crate) abuse_dropped: AtomicU64,
    pub(crate) refunds: AtomicU64,
    pub(crate) refund_failures: AtomicU64,
    pub(crate) refusals_cached: AtomicU64,
    pub(crate) shadow_refusals: AtomicU64,
}

/// Threads that get a stripe of their own in every [`Striped`] counter: the
/// first this many threads of the process to decide.
const OWNED: usize = 16;

/// Stripes the threads after those share.
const SHARED: usize = 8;

/// A counter that every decision of a rule increments, split over stripes
/// on cache lines of their own. Reading sums the stripes.
///
/// Each of the first [`OWNED`] threads that decide has a stripe no other
/// thread writes, and adds to it with a plain load and store: a locked
/// `fetch_add` was the costliest instruction of a decision answered in
/// place in the profile, since it waits for every earlier store to drain.
/// Later threads share
/// [`SHARED`] atomic stripes, so they still rarely write one line at once.
#[derive(Debug, Default)]
pub(crate) struct Striped {
    owned: [Stripe; OWNED],
    shared: [Stripe; SHARED],
}

/// 128 bytes: two 64-byte lines, since adjacent-line prefetching pairs them.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// This thread's place among the stripes: `Ok(i)` owns stripe `i`, `Err(i)`
/// shares stripe `i`. Numbers are never given twice in a process, so an
/// owned stripe has one writer for as long as the process lives.
fn stripe() -> Result<usize, usize> {
    // Initialized as a constant and numbered on first use: a lazily
    // initialized thread-local checks its state on every access, a
    // visible share of a one-rule limiter's decision in a profile of the
    // composition bench.
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    let mut n = STRIPE.get();
    if n == usize::MAX {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        n = NEXT.fetch_add(1, Ordering::Relaxed).min(usize::MAX - 1);
        STRIPE.set(n);
    }
    if n < OWNED { Ok(n) } else { Err(n % SHARED) }
}

impl Striped {
    pub(crate) fn bump(&self) {
        match stripe() {
            Ok(i) => {
                let own = &self.owned[i].0;
                // The only writer of this stripe, so no update can be lost
                // between the load and the store; readers see either value.
                own.store(
                    own.load(Ordering::Relaxed).wrapping_add(1),
                    Ordering::Relaxed,
                );
            }
            Err(i) => bump(&self.shared[i].0),
        }
    }

    pub(crate) fn load(&self) -> u64 {
        self.owned
            .iter()
            .chain(&self.shared)
            .map(|s| load(&s.0))
            .fold(0, u64::wrapping_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More threads than own a stripe, all counting at once, lose no count.
    #[test]
    fn striped_counts_from_many_threads_add_up() {
        let counter = Striped::default();
        let threads = OWNED + SHARED + 3;
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    for _ in 0..10_000 {
                        counter.bump();
                    }
                });
            }
        });
        assert_eq!(counter.load(), threads as u64 * 10_000);
    }
}

/// A snapshot of one rule's counters, from [`Limiter::stats`](crate::Limiter::stats).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleStats {
    /// The rule's name.
    pub rule: Arc<str>,
    /// Requests this rule admitted.
    pub allowed: u64,
    /// Requests this rule refused (by its store, its escalation or its
    /// failure policy).
    pub refused: u64,
    /// Store calls that failed or timed out (the authoritative store, the
    /// fallback, the escalation store and the abuse sink).
    pub store_errors: u64,
    /// Calls skipped because the authoritative store's breaker was open.
    pub short_circuited: u64,
    /// Decisions answered by the fallback store.
    pub fallbacks: u64,
    /// Decisions made by the failure policy because no store answered.
    pub degraded: u64,
    /// Times the authoritative store's breaker opened.
    pub breaker_opened: u64,
    /// Sampled requests sent to the escalation store.
    pub escalations: u64,
    /// Abuse events written to the sink (each may stand for many refusals).
    pub abuse_events: u64,
    /// Refusals whose held-back count was forgotten because the sink was
    /// failing while the tracker was full.
    pub abuse_dropped: u64,
    /// Admissions of this rule undone because another rule refused the
    /// request.
    pub refunds: u64,
    /// Refunds that failed (the store errored, timed out, does not implement
    /// refunds, or its breaker was open): the admission stays counted, which
    /// is stricter, never more permissive.
    pub refund_failures: u64,
    /// Refusals answered from the rule's refusal cache, without a store
    /// call.
    pub refusals_cached: u64,
    /// Refusals of the rule in shadow mode, which refused nothing
    /// ([`Rule::with_shadow`](crate::Rule::with_shadow)); not counted in
    /// `refused`.
    pub shadow_refusals: u64,
    /// The authoritative store's breaker now.
    pub breaker: BreakerState,
}
