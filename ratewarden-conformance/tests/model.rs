//! The reference model against `ratewarden_core::algorithm::apply`, the
//! normative transcription every backend follows: many random scripts of
//! requests, keys, costs and clock moves (backwards included), identical
//! decisions required. Cheap, so it runs many cases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use ratewarden_conformance::broken::{BrokenStore, Defect, ReferenceStore};
use ratewarden_conformance::model::{Expected, Model, replay_tiers};
use ratewarden_conformance::ratewarden_core::Store;
use ratewarden_conformance::ratewarden_core::algorithm::{self, KeyState};
use ratewarden_conformance::ratewarden_core::{Algorithm, ManualClock, Policy, Timestamp};
use ratewarden_test_support::strategy::{advance, policies};

fn steps() -> impl Strategy<Value = Vec<(u8, usize, u32, i64)>> {
    prop::collection::vec((0u8..3, 0usize..4, 0u32..6, advance()), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn model_agrees_with_core_algorithm(
        policies in policies(),
        steps in steps(),
    ) {
        let mut model = Model::new();
        let mut states: HashMap<(usize, u8), Option<KeyState>> = HashMap::new();
        let mut now = ManualClock::DEFAULT_START.as_micros();
        for (i, &(key, p, cost, advance)) in steps.iter().enumerate() {
            now = now.saturating_add_signed(advance);
            let policy = &policies[p];
            let cost = 1 + cost % policy.limit();
            let v = algorithm::apply(states.entry((p, key)).or_default(), policy, cost, now);
            let core = Expected {
                allowed: v.allowed,
                remaining: v.remaining,
                reset_after: Duration::from_micros(v.reset_after_us),
                retry_after: Duration::from_micros(v.retry_after_us),
            };
            let modelled = model
                .decide(&[key], policy, cost, Timestamp::from_micros(now))
                .expect("valid cost");
            prop_assert_eq!(core, modelled, "step {} ({}, key {}, cost {}, t={})", i, policy, key, cost, now);
        }
    }
}

/// The model's own hand-checked boundaries, so that the property above
/// compares against something known to be right.
#[test]
fn model_boundaries_by_hand() {
    let t0 = ManualClock::DEFAULT_START;
    let at = |s: u64| t0.saturating_add(Duration::from_secs(s));
    let mut m = Model::new();

    // Sliding log 3 / 10 s: admissions at 0, 1, 2; refused at 5 until 10.
    let p = Policy::sliding_log(3, Duration::from_secs(10)).unwrap();
    for s in 0..3 {
        assert!(m.decide(b"log", &p, 1, at(s)).unwrap().allowed);
    }
    let r = m.decide(b"log", &p, 1, at(5)).unwrap();
    assert!(!r.allowed);
    assert_eq!(r.retry_after, Duration::from_secs(5));
    assert_eq!(r.reset_after, Duration::from_secs(7));
    assert_eq!(r.remaining, 0);

    // Fixed window 2 / 10 s: the end is fixed at the first hit.
    let p = Policy::fixed_window(2, Duration::from_secs(10)).unwrap();
    assert!(m.decide(b"fw", &p, 1, at(0)).unwrap().allowed);
    let a = m.decide(b"fw", &p, 1, at(9)).unwrap();
    assert_eq!(a.reset_after, Duration::from_secs(1));
    let r = m.decide(b"fw", &p, 1, at(9)).unwrap();
    assert_eq!(r.retry_after, Duration::from_secs(1));
    assert!(m.decide(b"fw", &p, 1, at(10)).unwrap().allowed);

    // Sliding window 10 / 10 s: 10 at 0, then at 11 s the previous window
    // weighs 9/10 and one more unit fits.
    let p = Policy::sliding_window(10, Duration::from_secs(10)).unwrap();
    assert!(m.decide(b"sw", &p, 10, at(0)).unwrap().allowed);
    let r = m.decide(b"sw", &p, 1, at(5)).unwrap();
    assert_eq!(r.retry_after, Duration::from_secs(6));
    let a = m.decide(b"sw", &p, 1, at(11)).unwrap();
    assert!(a.allowed);
    assert_eq!(a.remaining, 0);

    // GCRA 4 / 8 s: a burst of 4, then one unit every 2 s.
    let p = Policy::gcra(4, Duration::from_secs(8)).unwrap();
    for left in (0..4).rev() {
        assert_eq!(m.decide(b"g", &p, 1, at(0)).unwrap().remaining, left);
    }
    let r = m.decide(b"g", &p, 1, at(0)).unwrap();
    assert_eq!(r.retry_after, Duration::from_secs(2));
    assert_eq!(r.reset_after, Duration::from_secs(8));

    // Invalid costs are errors, as `Request::new` makes them.
    assert!(m.decide(b"g", &p, 0, at(0)).is_err());
    assert!(m.decide(b"g", &p, 5, at(0)).is_err());
}

/// A clock going back after a sliding log's units expired does not bring
/// them back: the case the model's "horizon" exists for.
#[test]
fn model_sliding_log_forgets_expired_units_after_clock_regression() {
    let t0 = ManualClock::DEFAULT_START;
    let at = |ms: u64| t0.saturating_add(Duration::from_millis(ms));
    let p = Policy::sliding_log(1, Duration::from_millis(10)).unwrap();
    let mut m = Model::new();
    assert!(m.decide(b"k", &p, 1, at(100)).unwrap().allowed);
    assert!(m.decide(b"k", &p, 1, at(200)).unwrap().allowed);
    // Back to 195: the unit at 200 is in the future and still counts.
    assert!(!m.decide(b"k", &p, 1, at(195)).unwrap().allowed);
    let mut state = None;
    for ms in [100, 200, 195] {
        algorithm::apply(&mut state, &p, 1, at(ms).as_micros());
    }
    assert!(matches!(state, Some(KeyState::SlidingLog(ref log)) if log.len() == 1));
}

/// Tiers of 2 or 3 random policies (any algorithm, limit 1–6, window
/// 1–20 ms) and costs, for the composition model.
fn tiers() -> impl Strategy<Value = Vec<(Policy, u32)>> {
    let algorithm = prop_oneof![
        Just(Algorithm::SlidingLog),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::Gcra),
    ];
    let tier = (algorithm, 1u32..=6, 1_000u64..=20_000, 0u32..6).prop_map(
        |(algorithm, limit, window_us, cost)| {
            let p = Policy::new(algorithm, limit, Duration::from_micros(window_us))
                .expect("small policies are valid");
            (p, 1 + cost % limit)
        },
    );
    prop::collection::vec(tier, 2..=3)
}

/// Forward clock moves, mostly small: refunds are exact when each is made
/// before the key's next request and time moves forward.
fn tier_steps() -> impl Strategy<Value = Vec<(u8, u64)>> {
    let advance = prop_oneof![3 => Just(0u64), 4 => 0u64..=3_000, 2 => 0u64..=45_000];
    prop::collection::vec((0u8..3, advance), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// A `Limiter` of two or three tiers on reference stores decides as the
    /// composition model does: the first refusal wins, the earlier tiers'
    /// admissions are undone, the tightest admission is shown.
    #[test]
    fn limiter_of_tiers_agrees_with_the_model(tiers in tiers(), steps in tier_steps()) {
        let stores: Vec<Arc<dyn Store>> = tiers
            .iter()
            .map(|_| Arc::new(ReferenceStore::new(1_000)) as Arc<dyn Store>)
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        if let Err(failure) = rt.block_on(replay_tiers(&stores, &tiers, &steps)) {
            return Err(TestCaseError::fail(failure.0));
        }
    }
}

/// The property above sees refusals by later tiers, whose refunds are the
/// point, and would fail if a store ignored them.
#[test]
fn tiers_replay_exercises_refunds_and_catches_a_store_ignoring_them() {
    let tiers = [
        (Policy::fixed_window(5, Duration::from_secs(1)).unwrap(), 1),
        (
            Policy::sliding_log(2, Duration::from_millis(100)).unwrap(),
            1,
        ),
    ];
    let steps: Vec<(u8, u64)> = (0..40)
        .map(|i| (0, if i % 4 == 0 { 100_000 } else { 0 }))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let honest: Vec<Arc<dyn Store>> = vec![
        Arc::new(ReferenceStore::new(100)),
        Arc::new(ReferenceStore::new(100)),
    ];
    let later = rt.block_on(replay_tiers(&honest, &tiers, &steps)).unwrap();
    assert!(later > 0, "no refusal by the second tier");
    let ignoring: Vec<Arc<dyn Store>> = vec![
        Arc::new(BrokenStore::new(Defect::RefundIgnored, 100)),
        Arc::new(ReferenceStore::new(100)),
    ];
    let failure = rt
        .block_on(replay_tiers(&ignoring, &tiers, &steps))
        .unwrap_err();
    assert!(failure.0.contains("by rule Some(\"t0\")"), "{failure}");
}
