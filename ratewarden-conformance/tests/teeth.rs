//! The suite's teeth: every scenario catches at least one deliberately
//! broken store, for the right reason, and the honest reference store
//! passes every scenario.

mod common;

use std::sync::Arc;

use ratewarden_conformance::broken::{BrokenStore, Defect, ReferenceStore};
use ratewarden_conformance::ratewarden_core::Store;
use ratewarden_conformance::{SCENARIOS, ScenarioResult, StoreFactory, run_all};

const CAPACITY: usize = 1_000;

fn broken(defect: Defect) -> impl StoreFactory {
    move || async move { Arc::new(BrokenStore::new(defect, CAPACITY)) as Arc<dyn Store> }
}

async fn run(scenario: &str, factory: &dyn StoreFactory) -> ScenarioResult {
    let s = SCENARIOS
        .iter()
        .find(|s| s.name == scenario)
        .unwrap_or_else(|| panic!("no scenario {scenario}"));
    s.run(factory).await
}

/// Fails unless `scenario` fails against a store with `defect`, with a
/// message containing every one of `because`.
async fn catches(scenario: &str, defect: Defect, because: &[&str]) {
    let result = run(scenario, &broken(defect)).await;
    common::assert_caught(scenario, "a store", &defect, result, because);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_store_passes_every_scenario() {
    let factory: Arc<dyn StoreFactory> =
        Arc::new(|| async { Arc::new(ReferenceStore::new(CAPACITY)) as Arc<dyn Store> });
    let results = run_all(factory).await;
    assert_eq!(results.len(), SCENARIOS.len());
    for (scenario, result) in results {
        match result {
            Ok(evidence) => println!("{}: {evidence}", scenario.name),
            Err(failure) => panic!("{}: {failure}", scenario.name),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_semantics_catches_off_by_one_and_moved_windows() {
    catches(
        "policy_semantics",
        Defect::OffByOne,
        &["must be refused", "answered admitted"],
    )
    .await;
    catches(
        "policy_semantics",
        Defect::ExpiryRenewedOnEveryHit,
        &["fixed_window", "reset_after"],
    )
    .await;
    catches("policy_semantics", Defect::RefusalsRecorded, &["must be"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_accounting_catches_off_by_one_and_recorded_refusals() {
    catches(
        "cost_accounting",
        Defect::OffByOne,
        &["cost 3", "must be refused", "answered admitted"],
    )
    .await;
    catches(
        "cost_accounting",
        Defect::RefusalsRecorded,
        &["cost 3", "remaining 2"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_independence_catches_shared_buckets() {
    catches(
        "key_independence",
        Defect::SharedBuckets,
        &["user-", "a key no other request has touched"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_hammering_catches_recorded_refusals_and_renewed_expiry() {
    catches(
        "refused_hammering",
        Defect::RefusalsRecorded,
        &["pushed access later"],
    )
    .await;
    catches(
        "refused_hammering",
        Defect::ExpiryRenewedOnEveryHit,
        &["fixed_window", "pushed access later"],
    )
    .await;
    // Honest when awaited, counting refusals when answered inline: caught
    // because the scenario sends every other request inline.
    catches(
        "refused_hammering",
        Defect::InlineRecordsRefusals,
        &["pushed access later"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_key_flood_catches_eviction_that_forgives() {
    catches(
        "distinct_key_flood",
        Defect::InsertionOrderEviction,
        &["offender", "was admitted", "the flood evicted"],
    )
    .await;
    catches(
        "distinct_key_flood",
        Defect::EvictionSkipsRefusals,
        &["offender", "was admitted", "the flood evicted"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_renewal_catches_renewed_expiry_and_recorded_refusals() {
    catches(
        "window_renewal",
        Defect::ExpiryRenewedOnEveryHit,
        &[
            "fixed_window",
            "must end at t0+10 s",
            "answered admitted, remaining 2, reset_after 9 s",
        ],
    )
    .await;
    catches("window_renewal", Defect::RefusalsRecorded, &["sliding_log"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_exactness_catches_read_then_write() {
    catches("concurrent_exactness", Defect::NonAtomic, &["lost updates"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_catches_normalised_and_bucketed_keys() {
    catches(
        "hostile_keys",
        Defect::TruncatedKeys,
        &["10 KB key differing in its last byte"],
    )
    .await;
    catches(
        "hostile_keys",
        Defect::LossyUtf8Keys,
        &["other invalid UTF-8"],
    )
    .await;
    catches(
        "hostile_keys",
        Defect::SharedBuckets,
        &["a key no other request has touched"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_regression_catches_resets_and_panics() {
    catches(
        "clock_regression",
        Defect::ResetOnClockRegression,
        &["bought a fresh quota"],
    )
    .await;
    catches(
        "clock_regression",
        Defect::PanicOnClockRegression,
        &["panicked", "time went backwards"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_catches_unlisted_algorithms_being_accepted() {
    catches(
        "bad_configuration",
        Defect::AcceptsUnsupportedAlgorithms,
        &["check_policy accepted", "claims fewer algorithms"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_exactness_catches_ignored_and_blind_refunds() {
    catches(
        "refund_exactness",
        Defect::RefundIgnored,
        &["sliding_log", "must be admitted", "answered refused"],
    )
    .await;
    catches(
        "refund_exactness",
        Defect::RefundBlind,
        &["sliding_log", "retry_after 10 s", "retry_after 6 s"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_length_bound_catches_a_bound_declared_but_not_enforced() {
    catches(
        "key_length_bound",
        Defect::UnboundedKeys,
        &[
            "one over the declared bound",
            "must be an InvalidRequest error",
        ],
    )
    .await;
}

/// The whole matrix, printed for a reader (`--nocapture`), and checked in
/// the other direction: every defect is caught by some scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_defect_is_caught_by_some_scenario() {
    for defect in Defect::ALL {
        let factory: Arc<dyn StoreFactory> = Arc::new(broken(defect));
        let caught: Vec<&str> = run_all(factory)
            .await
            .into_iter()
            .filter(|(_, r)| r.is_err())
            .map(|(s, _)| s.name)
            .collect();
        println!("{defect:?}: caught by {}", caught.join(", "));
        assert!(!caught.is_empty(), "no scenario catches {defect:?}");
    }
}

/// What a bounded backend's own tests add to `distinct_key_flood`: the key
/// count, which `Store` does not expose, never exceeds the capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_keeps_a_bounded_store_within_its_capacity() {
    let made: Arc<std::sync::Mutex<Vec<Arc<ReferenceStore>>>> = Arc::default();
    let handles = Arc::clone(&made);
    let factory = move || {
        let handles = Arc::clone(&handles);
        async move {
            let store = Arc::new(ReferenceStore::new(CAPACITY));
            handles.lock().unwrap().push(Arc::clone(&store));
            store as Arc<dyn Store>
        }
    };
    let evidence = ratewarden_conformance::distinct_key_flood(&factory)
        .await
        .unwrap();
    assert!(evidence.0.contains("3,000 fresh keys"), "{evidence}");
    let stores = made.lock().unwrap();
    assert_eq!(stores.len(), 4, "one fresh store per algorithm");
    for store in stores.iter() {
        assert_eq!(store.high_water(), CAPACITY, "filled, never exceeded");
    }
}

/// A store that claims no algorithm cannot pass by skipping everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_no_algorithms_fails_every_scenario() {
    let factory: Arc<dyn StoreFactory> = Arc::new(|| async {
        Arc::new(ReferenceStore::with_algorithms(&[], CAPACITY)) as Arc<dyn Store>
    });
    for (scenario, result) in run_all(factory).await {
        let failure = result.expect_err(scenario.name);
        assert!(
            failure.0.contains("lists no algorithms"),
            "{}: {failure}",
            scenario.name
        );
    }
}
