//! A rule's counters, and the snapshot [`Limiter::stats`](crate::Limiter::stats)(super::Limiter::stats)
//! returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::breaker::BreakerState;

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
}

/// Stripes of a [`Striped`] counter.
const STRIPES: usize = 8;

/// A counter that every decision of a rule increments, split over stripes
/// on cache lines of their own: threads deciding for one rule at once each
/// write their own stripe, instead of bouncing one line between their cores
/// on every request. Reading sums the stripes.
#[derive(Debug, Default)]
pub(crate) struct Striped([Stripe; STRIPES]);

/// 128 bytes: two 64-byte lines, since adjacent-line prefetching pairs them.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

impl Striped {
    pub(crate) fn bump(&self) {
        thread_local! {
            static STRIPE: usize = {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) as usize % STRIPES
            };
        }
        let stripe = STRIPE.with(|s| *s);
        self.0[stripe].0.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn load(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
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
    /// The authoritative store's breaker now.
    pub breaker: BreakerState,
}
