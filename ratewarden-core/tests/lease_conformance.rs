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

use std::sync::Arc;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::{SCENARIOS, StoreFactory};
use ratewarden_core::Store;
use ratewarden_core::lease::{LeaseConfig, LeasedStore};

/// The scenarios a lease answers otherwise, by design; see the module docs.
const NOT_FOR_A_LEASE: [&str; 2] = ["refund_exactness", "policy_change"];

fn leased() -> impl StoreFactory {
    || async {
        let shared = Arc::new(ReferenceStore::new(10_000));
        Arc::new(LeasedStore::new(
            shared,
            LeaseConfig::new(4).expect("four units"),
        )) as Arc<dyn Store>
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_store_passes_every_scenario_but_exact_refunds() {
    let factory = leased();
    let mut passed = 0;
    for scenario in SCENARIOS
        .iter()
        .filter(|s| !NOT_FOR_A_LEASE.contains(&s.name))
    {
        match scenario.run(&factory).await {
            Ok(evidence) => println!("{}: {evidence}", scenario.name),
            Err(failure) => panic!("{}: {failure}", scenario.name),
        }
        passed += 1;
    }
    assert_eq!(
        passed,
        SCENARIOS.len() - NOT_FOR_A_LEASE.len(),
        "{NOT_FOR_A_LEASE:?} are scenarios"
    );
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
    let leased = leased();
    let leased = leased.fresh().await;
    for policy in [Policy::fixed_window, Policy::sliding_window] {
        let (pro, free) = (policy(10, window).unwrap(), policy(4, window).unwrap());
        let (mut by_alone, mut by_lease) = ([0u32; 8], [0u32; 8]);
        for i in 0..200u64 {
            let p = if i % 5 < 3 { &pro } else { &free };
            let at = 1_767_225_600_000_000 + i * 350_000;
            let now = Timestamp::from_micros(at);
            let w = ((i * 350_000) / 10_000_000) as usize;
            by_alone[w] += u32::from(alone.decide(b"k", p, 1, now).await.unwrap().allowed);
            by_lease[w] += u32::from(leased.decide(b"k", p, 1, now).await.unwrap().allowed);
        }
        for w in 0..8 {
            assert!(
                by_lease[w] <= by_alone[w],
                "window {w}: {by_lease:?} > {by_alone:?}"
            );
        }
    }
}
