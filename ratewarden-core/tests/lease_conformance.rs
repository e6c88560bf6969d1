//! A leased store is a store: one instance leasing from an honest shared
//! store answers the conformance scenarios, for the algorithms a lease is
//! sound for, as the shared store alone would, with its own inline paths
//! (a request paid from the batch in hand, a refund given back to it)
//! driven beside the awaited ones.
//!
//! All but two. `refund_exactness` asks that a refunded admission leave the
//! store as if it had never happened; a lease gives the units back to its
//! batch instead, where they stay counted by the shared store and are spent
//! again in the same window without a round trip. That is its design (see
//! `ratewarden_core::lease`), and the fleet bound it keeps is attacked by
//! the composition scenarios, `leased_*`. `policy_change` asks for the
//! reference's exact decisions when a key moves between limits; a batch
//! bought under one policy is not spent under another, so its units stay
//! counted and unspent until the window ends: stricter, never more
//! permissive, which `a_plan_change_is_decided_more_strictly_never_less`
//! checks.
//!
//! That is with exact refusals (`LeaseConfig::exact_refusals`), and by
//! default on a fixed window. By default a lease holds a sliding window's
//! refusal for as long as a batch, not one unit, takes to come free
//! (`ratewarden_core::lease`, over-demand): later than the shared store
//! alone would say, which the scenarios checking exact retry times catch.

use ratewarden_conformance::call;
use std::sync::Arc;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::{SCENARIOS, StoreFactory};
use ratewarden_core::lease::{LEASE_ALGORITHMS, LeaseConfig, LeasedStore};
use ratewarden_core::{Algorithm, Store};

/// The scenarios a lease answers otherwise, by design; see the module docs.
const NOT_FOR_A_LEASE: [&str; 2] = ["refund_exactness", "policy_change"];

fn leased(config: LeaseConfig, algorithms: &'static [Algorithm]) -> impl StoreFactory {
    move || async move {
        let shared = Arc::new(ReferenceStore::with_algorithms(algorithms, 10_000));
        Arc::new(LeasedStore::new(shared, config)) as Arc<dyn Store>
    }
}

fn four_units() -> LeaseConfig {
    LeaseConfig::new(4).expect("four units")
}

async fn passes_all_but(factory: impl StoreFactory, not: &[&str]) {
    let mut passed = 0;
    for scenario in SCENARIOS.iter().filter(|s| !not.contains(&s.name)) {
        match scenario.run(&factory).await {
            Ok(evidence) => println!("{}: {evidence}", scenario.name),
            Err(failure) => panic!("{}: {failure}", scenario.name),
        }
        passed += 1;
    }
    assert_eq!(passed, SCENARIOS.len() - not.len(), "{not:?} are scenarios");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_store_passes_every_scenario_but_exact_refunds() {
    let factory = leased(four_units().exact_refusals(), &LEASE_ALGORITHMS);
    passes_all_but(factory, &NOT_FOR_A_LEASE).await;
}

/// A fixed window's refusal stands until the window ends whatever its
/// cost, so a lease that holds refusals (the default) answers its
/// scenarios exactly as with exact refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holding_fixed_window_refusals_passes_every_scenario_but_exact_refunds() {
    let factory = leased(four_units(), &[Algorithm::FixedWindow]);
    passes_all_but(factory, &NOT_FOR_A_LEASE).await;
}

/// What a lease holding a sliding window's refusals answers more strictly
/// than the shared store alone: a refusal's retry time (the time a batch,
/// not one unit, takes to come free), and, while the key stays asked for
/// past its limit, a request that fits but not with a whole batch.
const STRICTER_WHEN_HOLDING_A_SLIDING_WINDOW: [&str; 6] = [
    "policy_semantics",
    "cost_accounting",
    "key_independence",
    "refused_hammering",
    "peek_never_records",
    "penalty_is_counted",
];

/// On a sliding window, a lease that holds refusals (the default) passes
/// every other scenario, the floods and concurrency among them; each
/// scenario it is excused from fails against it, on a refusal or its retry
/// time, so the exemptions are needed. `tests/lease.rs` bounds the rest: a client that waits the time it
/// was told is admitted, and a fleet never exceeds the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holding_sliding_window_refusals_is_stricter_than_exact_never_looser() {
    let factory = leased(four_units(), &[Algorithm::SlidingWindow]);
    let not = [
        NOT_FOR_A_LEASE.as_slice(),
        STRICTER_WHEN_HOLDING_A_SLIDING_WINDOW.as_slice(),
    ]
    .concat();
    passes_all_but(factory, &not).await;
    let factory = leased(four_units(), &[Algorithm::SlidingWindow]);
    for name in STRICTER_WHEN_HOLDING_A_SLIDING_WINDOW {
        let scenario = SCENARIOS.iter().find(|s| s.name == name).unwrap();
        let failure = scenario.run(&factory).await.expect_err(name).to_string();
        let refused = ["answered refused", "was refused", "retry_after"];
        assert!(
            refused.iter().any(|r| failure.contains(r)),
            "{name}: {failure}"
        );
    }
}

/// A key moved between a limit of 10 and one of 4 in the same window,
/// leased and not: in every window the lease admits no more than the shared
/// store alone does.
#[tokio::test]
async fn a_plan_change_is_decided_more_strictly_never_less() {
    use ratewarden_core::{Policy, Timestamp};
    use std::time::Duration;
    let window = Duration::from_secs(10);
    let alone = ReferenceStore::new(100);
    let leased = leased(four_units().exact_refusals(), &LEASE_ALGORITHMS);
    let leased = leased.fresh().await;
    for policy in [Policy::fixed_window, Policy::sliding_window] {
        let (pro, free) = (policy(10, window).unwrap(), policy(4, window).unwrap());
        let (mut by_alone, mut by_lease) = ([0u32; 8], [0u32; 8]);
        for i in 0..200u64 {
            let p = if i % 5 < 3 { &pro } else { &free };
            let at = 1_767_225_600_000_000 + i * 350_000;
            let now = Timestamp::from_micros(at);
            let w = ((i * 350_000) / 10_000_000) as usize;
            by_alone[w] += u32::from(call::decide(&alone, b"k", p, 1, now).await.unwrap().allowed);
            by_lease[w] += u32::from(
                call::decide(&leased, b"k", p, 1, now)
                    .await
                    .unwrap()
                    .allowed,
            );
        }
        for w in 0..8 {
            assert!(
                by_lease[w] <= by_alone[w],
                "window {w}: {by_lease:?} > {by_alone:?}"
            );
        }
    }
}
