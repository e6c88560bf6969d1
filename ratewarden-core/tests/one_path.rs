//! What one request costs the limiter on a store that must be awaited (a
//! network store): its store asked inline once, and one boxed future of the
//! limiter's own, counted by this test binary's allocator.

use ratewarden_conformance::call;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Switch;
use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store, Timestamp};

// dhat's counting allocator: this file's own, as a test binary of its own.
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// The allocations `f` makes (the runtime is single-threaded).
fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = dhat::HeapStats::get().total_blocks;
    let out = f();
    (out, dhat::HeapStats::get().total_blocks - before)
}

fn policy() -> Policy {
    Policy::gcra(1_000_000, Duration::from_secs(1)).unwrap()
}

/// A store that never answers inline and answers at once when awaited (the
/// reference store behind a switch that is on): what one call of it
/// allocates is measured alone as the baseline, so that what is left is the
/// limiter's.
fn awaited() -> Arc<dyn Store> {
    Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(10)))
}

fn limiter(store: Arc<dyn Store>) -> Limiter {
    let rule = Rule::new("r", store, policy())
        .unwrap()
        .without_refusal_cache();
    Limiter::builder()
        .clock(ManualClock::new())
        .rule(rule)
        .build()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// The allocations of one awaited store call by itself, the same call the
/// limiter makes (its storage key, `r:client`), once warmed up.
fn store_call(rt: &tokio::runtime::Runtime, store: &dyn Store) -> u64 {
    let now = Timestamp::from_micros(0);
    for _ in 0..3 {
        rt.block_on(call::decide(store, b"r:client", &policy(), 1, now))
            .unwrap();
    }
    let (_, n) = allocations(|| rt.block_on(call::decide(store, b"r:client", &policy(), 1, now)));
    n
}

fn check_on_an_awaited_store_boxes_one_future_of_its_own() {
    let rt = runtime();
    let store = awaited();
    let baseline = store_call(&rt, store.as_ref());
    let limiter = limiter(store);
    for _ in 0..3 {
        assert!(rt.block_on(limiter.check(b"client")).allowed);
    }
    let (decision, n) = allocations(|| rt.block_on(limiter.check(b"client")));
    assert!(
        decision.allowed && !decision.source.degraded,
        "{decision:?}"
    );
    assert_eq!(
        n - baseline,
        1,
        "check made {n} allocations where the store call alone makes {baseline}"
    );
}

fn a_pending_check_is_one_allocation() {
    let rt = runtime();
    let store = awaited();
    let baseline = store_call(&rt, store.as_ref());
    let limiter = limiter(store);
    let decide = || match limiter.try_check(b"client") {
        Ok(_) => panic!("the store must be awaited"),
        // Pinned here: the runtime boxes a future as large as this one
        // (the layer's, in which it is awaited, is boxed already).
        Err(pending) => rt.block_on(std::pin::pin!(pending.decide())),
    };
    for _ in 0..3 {
        assert!(decide().allowed);
    }
    let (decision, n) = allocations(decide);
    assert!(
        decision.allowed && !decision.source.degraded,
        "{decision:?}"
    );
    // The one allocation is the `PendingCheck` itself, the client key held
    // in it; the caller (the HTTP layer) boxes the future it awaits it in,
    // and nothing inside that future is boxed again.
    assert_eq!(
        n - baseline,
        1,
        "try_check and decide made {n} allocations where the store call alone makes {baseline}"
    );
}

fn an_inline_store_costs_the_limiter_no_allocation() {
    let rt = runtime();
    let limiter = limiter(Arc::new(ReferenceStore::new(10)));
    for _ in 0..3 {
        assert!(limiter.try_check(b"client").unwrap().allowed);
    }
    let now = Timestamp::from_micros(0);
    let store = ReferenceStore::new(10);
    let _ = call::decide_inline(&store, b"r:client", &policy(), 1, now);
    let (_, baseline) = allocations(|| call::decide_inline(&store, b"r:client", &policy(), 1, now));
    let (decision, n) = allocations(|| limiter.try_check(b"client"));
    assert!(decision.unwrap().allowed);
    assert_eq!(
        n, baseline,
        "try_check made {n} allocations, the store {baseline}"
    );
    let (decision, n) = allocations(|| rt.block_on(limiter.check(b"client")));
    assert!(decision.allowed);
    assert_eq!(
        n, baseline,
        "check made {n} allocations, the store {baseline}"
    );
}

/// One test: dhat's counts are the process's, and a second profiler in the
/// same process (`cargo test` runs tests on threads) would be refused.
#[test]
fn what_one_request_allocates() {
    let _profiler = dhat::Profiler::builder().testing().build();
    check_on_an_awaited_store_boxes_one_future_of_its_own();
    a_pending_check_is_one_allocation();
    an_inline_store_costs_the_limiter_no_allocation();
}
