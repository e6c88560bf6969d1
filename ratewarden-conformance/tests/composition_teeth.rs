//! The composition suite's teeth: every composition scenario catches a
//! deliberately broken composition, for the right reason, and every broken
//! composition is caught by some scenario.

mod common;

use std::sync::Arc;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::broken::{BrokenComposer, CompositionDefect};
use ratewarden_conformance::composition::{COMPOSITION_SCENARIOS, Composer};
use ratewarden_conformance::ratewarden_core::Store;
use ratewarden_conformance::{ScenarioResult, StoreFactory};

fn shared() -> impl StoreFactory {
    || async { Arc::new(ReferenceStore::new(10_000)) as Arc<dyn Store> }
}

async fn run(scenario: &str, composer: &dyn Composer) -> ScenarioResult {
    let s = COMPOSITION_SCENARIOS
        .iter()
        .find(|s| s.name == scenario)
        .unwrap_or_else(|| panic!("no composition scenario {scenario}"));
    // A broken composition may hang where the honest one times out: fail
    // the test instead of hanging the suite.
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        s.run(&shared(), composer),
    )
    .await
    .unwrap_or_else(|_| panic!("{scenario} hung"))
}

/// Fails unless `scenario` fails against `defect`, with a message
/// containing every one of `because`.
async fn catches(scenario: &str, defect: CompositionDefect, because: &[&str]) {
    let result = run(scenario, &BrokenComposer(defect)).await;
    common::assert_caught(scenario, "a composition", &defect, result, because);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_are_what_keeps_later_refusals_uncounted() {
    catches(
        "later_tier_refusal_not_charged",
        CompositionDefect::NoRefunds,
        &["request #13 at t0", "refused by rule \"day\""],
    )
    .await;
    catches(
        "shared_retry_after_honoured",
        CompositionDefect::NoRefunds,
        &["refused request 6 at t0+1 s", "refused by rule \"local\""],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_scenario_catches_a_fallback_consulted_beside_its_store() {
    catches(
        "fallback_never_double_counts",
        CompositionDefect::BothConsulted,
        &[
            "shared store failing",
            "refused by rule \"search\"",
            "degraded",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_scenario_catches_sampling_by_count() {
    catches(
        "escalation_rate_independent_of_pace",
        CompositionDefect::PacedSampling,
        &["paced client", "exactly 60 times"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_scenario_catches_a_write_per_refusal() {
    catches(
        "abuse_writes_bounded",
        CompositionDefect::AbuseEveryRefusal,
        &["must have been written 20 times", "got 1,900"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_store_scenario_catches_a_breaker_that_never_opens() {
    catches(
        "dead_store_costs_one_timeout",
        CompositionDefect::NoBreaker,
        &["called 100"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_scenario_catches_a_cancelled_probe_that_reopens() {
    catches(
        "breaker_recovery",
        CompositionDefect::CancelledProbeReopens,
        &["after a cancelled probe", "degraded"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusal_cache_scenario_catches_a_round_trip_per_refusal() {
    catches(
        "refused_offender_costs_no_round_trip",
        CompositionDefect::NoRefusalCache,
        &["cost 100 shared-store calls", "100 refunds"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_scenarios_catch_uncounted_outliving_unreleased_and_self_granted_units() {
    catches(
        "leased_fleet_never_over_admits",
        CompositionDefect::LeaseUncounted,
        &["window 2", "against a limit of 20"],
    )
    .await;
    catches(
        "leased_fleet_never_over_admits",
        CompositionDefect::LeaseOutlivesWindow,
        &["window 2", "against a limit of 20"],
    )
    .await;
    catches(
        "leased_units_returned",
        CompositionDefect::LeaseNotReleased,
        &["handed none back"],
    )
    .await;
    catches(
        "leased_dead_store_follows_failure_policy",
        CompositionDefect::LeaseOpenWhenDead,
        &["must be refused by the failure policy"],
    )
    .await;
}

/// The whole matrix, printed for a reader (`--nocapture`), checked in the
/// other direction: every defect is caught by some scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_composition_defect_is_caught_by_some_scenario() {
    for defect in CompositionDefect::ALL {
        let mut caught = Vec::new();
        for scenario in COMPOSITION_SCENARIOS {
            if run(scenario.name, &BrokenComposer(defect)).await.is_err() {
                caught.push(scenario.name);
            }
        }
        println!("{defect:?}: caught by {}", caught.join(", "));
        assert!(!caught.is_empty(), "no scenario catches {defect:?}");
    }
}
