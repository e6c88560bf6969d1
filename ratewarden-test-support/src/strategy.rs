//! Random scripts for the model tests: small policies of every algorithm
//! and clock moves that go forwards, jump and go back; and their replay as
//! a proptest case.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use ratewarden_conformance::model::{Step, replay, replay_tiers};
use ratewarden_conformance::ratewarden_core::{Algorithm, ManualClock, Policy, Store};

/// A policy of `algorithm` with a small limit and a window of 1–20 ms,
/// often not a multiple of the limit (GCRA's interval then rounds down).
pub fn policy(algorithm: Algorithm) -> impl Strategy<Value = Policy> {
    (1u32..=6, 1_000u64..=20_000).prop_map(move |(limit, window_us)| {
        Policy::new(algorithm, limit, Duration::from_micros(window_us))
            .expect("small policies are valid")
    })
}

/// One policy of each algorithm, in the order of [`Algorithm::ALL`].
pub fn policies() -> impl Strategy<Value = [Policy; 4]> {
    (
        policy(Algorithm::SlidingLog),
        policy(Algorithm::FixedWindow),
        policy(Algorithm::SlidingWindow),
        policy(Algorithm::Gcra),
    )
        .prop_map(|(a, b, c, d)| [a, b, c, d])
}

/// Clock moves in microseconds: mostly none or small, sometimes whole
/// windows, sometimes backwards.
pub fn advance() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        4 => 0i64..=3_000,
        2 => 0i64..=45_000,
        1 => -25_000i64..=0,
    ]
}

/// Scripts of `1..len` steps on `keys` keys, any of four policies, costs
/// `0..6` (brought into range by the replay) and [`advance`] moves.
pub fn steps(keys: u8, len: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0..keys, 0usize..4, 0u32..6, advance()).prop_map(|(key, policy, cost, advance_us)| Step {
            key,
            policy,
            cost,
            advance_us,
        }),
        1..len,
    )
}

/// Replays `steps` on `store` and on the model, from the model's start, as
/// one proptest case: a disagreement fails the case with the model's
/// account of it.
pub fn replay_case(
    rt: &tokio::runtime::Runtime,
    store: &dyn Store,
    policies: &[Policy],
    steps: &[Step],
    key: impl Fn(u8) -> Vec<u8>,
) -> Result<(), TestCaseError> {
    rt.block_on(replay(
        store,
        policies,
        steps,
        key,
        ManualClock::DEFAULT_START,
    ))
    .map(drop)
    .map_err(|failure| TestCaseError::fail(failure.0))
}

/// Replays `steps` through a `Limiter` of `tiers`, one on each of `stores`,
/// and through the composition model, as one proptest case.
pub fn replay_tiers_case(
    stores: &[Arc<dyn Store>],
    tiers: &[(Policy, u32)],
    steps: &[(u8, u64)],
) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(replay_tiers(stores, tiers, steps))
        .map(drop)
        .map_err(|failure| TestCaseError::fail(failure.0))
}
