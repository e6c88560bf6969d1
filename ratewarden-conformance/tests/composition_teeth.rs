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

// The one declaration of what each composition scenario must catch: per
// scenario, the defects it fails and what its failure must say. It
// generates `TEETH`, which the coverage test holds against
// `COMPOSITION_SCENARIOS`, and one test per scenario, named after it, that
// runs its rows.
macro_rules! teeth {
    ($($scenario:ident: [$($defect:ident => [$($because:literal),* $(,)?]),* $(,)?],)*) => {
        /// (composition scenario, a defect it catches, what its failure says).
        const TEETH: &[(&str, CompositionDefect, &[&str])] = &[
            $($((stringify!($scenario), CompositionDefect::$defect, &[$($because),*]),)*)*
        ];

        /// One test per composition scenario: it fails every defect of its
        /// rows, with a message saying why.
        mod catches {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::rows_of(stringify!($scenario)).await;
                }
            )*
        }
    };
}

teeth! {
    later_tier_refusal_not_charged: [
        NoRefunds => ["request #13 at t0", "refused by rule \"day\""],
    ],
    shared_retry_after_honoured: [
        NoRefunds => ["refused request 6 at t0+1 s", "refused by rule \"local\""],
    ],
    fallback_never_double_counts: [
        BothConsulted => ["shared store failing", "refused by rule \"search\"", "degraded"],
    ],
    escalation_rate_independent_of_pace: [
        PacedSampling => ["paced client", "exactly 60 times"],
    ],
    abuse_writes_bounded: [
        AbuseEveryRefusal => ["must have been written 20 times", "got 1,900"],
    ],
    dead_store_costs_one_timeout: [
        NoBreaker => ["called 100"],
    ],
    breaker_recovery: [
        CancelledProbeReopens => ["after a cancelled probe", "degraded"],
        InvalidProbeFails => ["after a probe answered InvalidRequest", "degraded"],
        FailedProbeStaysHalfOpen => [
            "request 1, 199 ms after a failed probe",
            "1 store calls since the probe",
        ],
    ],
    refused_offender_costs_no_round_trip: [
        NoRefusalCache => ["cost 100 shared-store calls", "100 refunds"],
    ],
    give_back_reaches_local_state: [
        GiveBackNotTold => ["after five give-backs", "a peek must admit"],
        FallbackForgotten => ["with a fallback counting during an outage", "after five give-backs"],
        EscalationForgotten => ["with an escalation store", "after five give-backs"],
    ],
    reset_reaches_local_state: [
        ResetNotTold => ["after a reset", "a peek must admit"],
        FallbackForgotten => ["with a fallback counting during an outage", "after a reset"],
        EscalationForgotten => ["with an escalation store", "after a reset"],
        ResetSkippedWhileOpen => ["with an open breaker", "success without a call to the store"],
    ],
    penalty_reaches_local_state: [
        PenaltyMissesLease => ["with a lease", "after the penalty must be refused"],
    ],
    refusal_racing_a_give_back_not_cached: [
        RefusalCachedAfterGiveBack => ["after A's give-back", "stale"],
    ],
    leased_fleet_never_over_admits: [
        LeaseUncounted => ["window 2", "against a limit of 20"],
    ],
    leased_units_never_outlive_their_window: [
        LeaseOutlivesWindow => [
            "fixed_window, window 2",
            "the fleet spent 28 units but the shared store counted 20",
            "spent after the window that counted them",
        ],
    ],
    leased_units_returned: [
        LeaseNotReleased => ["handed none back"],
    ],
    leased_dead_store_follows_failure_policy: [
        LeaseOpenWhenDead => ["must be refused by the failure policy"],
    ],
    shadow_rule_counts_and_never_refuses: [
        ShadowEnforced => ["request 4 at t0", "must be admitted", "refused by rule \"trial\""],
        ShadowUncounted => ["request 4 at t0", "marked as a shadow refusal", "admitted by rule \"gate\""],
        ShadowApart => ["after the switch", "must refuse with retry_after 59 s", "admitted"],
    ],
}

/// Fails unless `scenario` fails each defect of its rows in [`TEETH`],
/// with a message containing every one of the row's words.
async fn rows_of(scenario: &str) {
    for (_, defect, because) in TEETH.iter().filter(|(name, ..)| *name == scenario) {
        let result = run(scenario, &BrokenComposer(*defect)).await;
        common::assert_caught(scenario, "a composition", defect, result, because);
    }
}

/// Every composition scenario has teeth: a row in [`TEETH`], so a scenario
/// added without a broken composition it catches fails here, by name.
#[test]
fn every_composition_scenario_has_teeth() {
    let toothless: Vec<&str> = COMPOSITION_SCENARIOS
        .iter()
        .map(|s| s.name)
        .filter(|name| !TEETH.iter().any(|(scenario, ..)| scenario == name))
        .collect();
    assert!(
        toothless.is_empty(),
        "composition scenario(s) with no row in TEETH (a CompositionDefect each must catch): {}",
        toothless.join(", ")
    );
    for (scenario, defect, _) in TEETH {
        assert!(
            COMPOSITION_SCENARIOS.iter().any(|s| s.name == *scenario),
            "TEETH names {scenario} (for {defect:?}), which is no composition scenario"
        );
    }
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
