//! The suite's teeth, checked both ways: every scenario catches at least
//! one deliberately broken store, for the reason [`TEETH`] states, and every
//! broken store is caught by some scenario; the honest reference store
//! passes every scenario.

mod common;

use std::sync::Arc;

use ratewarden_conformance::broken::{BrokenStore, Defect, ReferenceStore};
use ratewarden_conformance::ratewarden_core::{
    Capabilities, Decision, Key, Policy, Refund, Request, Store, StoreError,
};
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

/// One row of the teeth table: `scenario` must fail against a store with
/// `defect`, with a message containing every one of `because`.
struct Tooth {
    scenario: &'static str,
    defect: Defect,
    because: &'static [&'static str],
}

/// Declares the teeth table, one block per scenario of rows
/// `Defect => [what the failure must say, ...]`, as [`TEETH`], and one test
/// per scenario, `catches::<scenario>`, that runs its rows.
macro_rules! teeth {
    ($($scenario:ident { $($defect:ident => [$($because:literal),+ $(,)?],)+ })+) => {
        /// Every scenario's broken stores and the reasons it must give.
        const TEETH: &[Tooth] = &[
            $($(Tooth {
                scenario: stringify!($scenario),
                defect: Defect::$defect,
                because: &[$($because),+],
            },)+)+
        ];

        /// One test per scenario of the table.
        mod catches {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::bites(stringify!($scenario)).await;
                }
            )+
        }
    };
}

/// Fails unless `scenario` catches every defect of its rows, each for the
/// stated reason.
async fn bites(scenario: &str) {
    for tooth in TEETH.iter().filter(|t| t.scenario == scenario) {
        let result = run(scenario, &broken(tooth.defect)).await;
        common::assert_caught(scenario, "a store", &tooth.defect, result, tooth.because);
    }
}

teeth! {
    policy_semantics {
        OffByOne => ["must be refused", "answered admitted"],
        ExpiryRenewedOnEveryHit => ["fixed_window", "reset_after"],
        RefusalsRecorded => ["must be"],
    }
    cost_accounting {
        OffByOne => ["cost 3", "must be refused", "answered admitted"],
        RefusalsRecorded => ["cost 3", "remaining 2"],
    }
    key_independence {
        SharedBuckets => ["user-", "a key no other request has touched"],
    }
    refused_hammering {
        RefusalsRecorded => ["pushed access later"],
        ExpiryRenewedOnEveryHit => ["fixed_window", "pushed access later"],
        // Honest when awaited, counting refusals when answered inline:
        // caught because the scenario sends every other request inline.
        InlineRecordsRefusals => ["pushed access later"],
    }
    distinct_key_flood {
        InsertionOrderEviction => ["offender", "was admitted", "the flood evicted"],
        EvictionSkipsRefusals => ["offender", "was admitted", "the flood evicted"],
    }
    window_renewal {
        ExpiryRenewedOnEveryHit => [
            "fixed_window",
            "must end at t0+10 s",
            "answered admitted, remaining 2, reset_after 9 s",
        ],
        RefusalsRecorded => ["sliding_log"],
    }
    concurrent_exactness {
        NonAtomic => ["lost updates"],
        // No gap held open: lost only when another thread decides in it.
        LockReleasedBeforeWrite => ["lost updates"],
    }
    hostile_keys {
        TruncatedKeys => ["10 KB key differing in its last byte"],
        LossyUtf8Keys => ["other invalid UTF-8"],
        SharedBuckets => ["a key no other request has touched"],
    }
    clock_regression {
        ResetOnClockRegression => ["bought a fresh quota"],
        PanicOnClockRegression => ["panicked", "time went backwards"],
    }
    bad_configuration {
        AcceptsUnsupportedAlgorithms => ["check_policy accepted", "claims fewer algorithms"],
        // Only the largest policies have windows over 30 days.
        LongWindowsForgotten => [
            "check_policy accepted",
            "a request after the whole limit was taken was admitted",
        ],
    }
    key_length_bound {
        HugeKeyBound => ["declares a key-length bound of 2,097,152 bytes", "at most 1,048,576"],
        TruncatedKeys => ["differing in their last byte", "must be distinct"],
        ResetIgnored => ["after a reset", "must admit its whole limit again"],
    }
    refund_exactness {
        RefundIgnored => ["sliding_log", "must be admitted", "answered refused"],
        RefundBlind => ["sliding_log", "retry_after 10 s", "retry_after 6 s"],
        GhostRefundCredits => [
            "after a refund (refund) on an empty key",
            "must be admitted with nothing left",
        ],
        // Honest when awaited: caught because the tables send every other
        // refund inline, and the next hit names the refund before it.
        InlineRefundIgnored => ["sliding_log", "after refund_inline of step", "must be"],
    }
    peek_never_records {
        PeekRecords => ["sliding_log", "the peeks changed the key's state"],
        // Only a fixed window keeps the state a refunded admission leaves.
        PeekOpensWindow => ["fixed_window", "the peeks changed the key's state"],
    }
    reset_is_exact {
        ResetIgnored => ["sliding_log", "after a reset, 0 of 64", "exactly its full limit"],
        ResetKeepsPrevious => ["sliding_window", "after a reset", "exactly its full limit"],
    }
    policy_change {
        StatePerPolicy => ["sliding_log", "on the free plan", "must carry over"],
    }
    penalty_is_counted {
        PenaltyOnlyWhenItFits => ["sliding_log", "with the penalties counted", "whether or not they fit"],
    }
    bans_are_exact {
        BanExtendedByRefusals => ["sliding_log", "retry_after 19.3s (banned), but", "retry_after 18.6s (banned)", "never extends itself"],
        BanIgnored => ["sliding_log", "request 4", "retry_after 7.2s, but", "retry_after 20s (banned)", "third refusal in a minute bans"],
        BanSurvivesReset => ["sliding_log", "request 150", "(banned), but", "admitted"],
        BanAcceptedUndeclared => ["declares no bans", "accepted", "would be ignored"],
    }
}

/// The table's first direction: a scenario with no broken store it is
/// shown to catch could be checking nothing at all.
#[test]
fn every_scenario_has_a_broken_store_it_catches() {
    let missing: Vec<String> = SCENARIOS
        .iter()
        .map(|s| s.name)
        .filter(|name| !TEETH.iter().any(|t| t.scenario == *name))
        .map(|name| {
            format!(
                "scenario `{name}` is shown to catch no broken store: add a broken store for it \
                 (a Defect in ratewarden-conformance/src/broken.rs that `{name}` fails) and a \
                 `{name}` block in the teeth! table of tests/teeth.rs with what its failure \
                 must say"
            )
        })
        .collect();
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    for tooth in TEETH {
        assert!(
            SCENARIOS.iter().any(|s| s.name == tooth.scenario),
            "the teeth table names `{}`, which is not in SCENARIOS",
            tooth.scenario
        );
    }
}

/// The table's other direction: every defect is caught somewhere for a
/// stated reason, not merely by some scenario failing against it.
#[test]
fn every_defect_has_a_row_saying_why_it_is_caught() {
    for defect in Defect::ALL {
        assert!(
            TEETH.iter().any(|t| t.defect == defect),
            "{defect:?} has no row in the teeth! table of tests/teeth.rs: add one under the \
             scenario its docs say catches it"
        );
    }
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

/// A store behind only its awaited entry points: the inline ones keep their
/// defaults, which answer nothing.
#[derive(Debug)]
struct AwaitedOnly<S>(S);

#[async_trait::async_trait]
impl<S: Store> Store for AwaitedOnly<S> {
    fn name(&self) -> &'static str {
        "awaited-only"
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn max_key_len(&self) -> usize {
        self.0.max_key_len()
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.0.decide(request).await
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.0.refund(refund).await
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.0.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.0.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.0.penalize(request).await
    }
}

/// A store that answers nothing inline (one that must always be awaited,
/// as a networked store is) passes every scenario, and the evidence of those
/// that check both paths says the inline one went unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_answering_nothing_inline_passes_every_scenario() {
    let factory: Arc<dyn StoreFactory> = Arc::new(|| async {
        Arc::new(AwaitedOnly(ReferenceStore::new(CAPACITY))) as Arc<dyn Store>
    });
    for (scenario, result) in run_all(factory).await {
        let evidence = result.unwrap_or_else(|f| panic!("{}: {f}", scenario.name));
        println!("{}: {evidence}", scenario.name);
        let both_ways = ["cost_accounting", "key_length_bound", "refund_exactness"];
        if both_ways.contains(&scenario.name) {
            assert!(
                evidence.0.contains("(the store answers nothing inline)"),
                "{}: {evidence}",
                scenario.name
            );
        }
    }
}

/// A read-then-write whose `decide` has no await between its read and its
/// write, and that answers nothing inline, as a store written with only
/// `async fn decide` would: caught all the same, because the scenario's
/// callers are threads that await `decide` on themselves, not only inline
/// calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_then_write_answering_nothing_inline_is_caught() {
    let defect = Defect::LockReleasedBeforeWrite;
    let factory = move || async move {
        Arc::new(AwaitedOnly(BrokenStore::new(defect, CAPACITY))) as Arc<dyn Store>
    };
    let result = run("concurrent_exactness", &factory).await;
    common::assert_caught(
        "concurrent_exactness",
        "a store answering nothing inline",
        &defect,
        result,
        &["lost updates"],
    );
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

/// A key capacity too large to flood is a failure that says so, never an
/// overflow or a flood of hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_too_large_to_flood_fails_with_a_message() {
    for capacity in [1_000_001, usize::MAX] {
        let factory =
            move || async move { Arc::new(ReferenceStore::new(capacity)) as Arc<dyn Store> };
        let failure = run("distinct_key_flood", &factory)
            .await
            .expect_err("a capacity the scenario cannot flood");
        assert!(
            failure.0.contains("declares a key capacity of"),
            "{capacity}: {failure}"
        );
    }
}
