//! Adversarial conformance scenarios that any limiter [`Store`] must pass.
//!
//! Each scenario attacks one way a rate limiter fails under deliberate abuse
//! (refusals that extend a ban, floods that evict an offender, windows that
//! never close, lost updates, keys treated as code), against a fresh store
//! from a [`StoreFactory`], with time driven by a
//! [`ManualClock`](limiter_core::ManualClock): deterministic, independent,
//! and fast even for one-hour windows. The expected numbers in every
//! scenario are derived by hand from the semantics in
//! [`limiter_core::algorithm`], never computed by calling it, so a bug shared
//! by a backend and the core cannot hide.
//!
//! # Running the suite against a backend
//!
//! In a backend crate's `tests/conformance.rs`, two lines (plus imports):
//!
//! ```
//! use std::sync::Arc;
//! use limiter_conformance::limiter_core::Store;
//! # use limiter_conformance::broken::ReferenceStore as MyStore;
//!
//! async fn store() -> Arc<dyn Store> { Arc::new(MyStore::new(10_000)) }
//! limiter_conformance::conformance_tests!(store);
//! # fn main() {}
//! ```
//!
//! The macro generates one test per scenario, named after it, each on its own
//! multi-thread runtime with two workers (what
//! `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` would
//! build); the backend crate needs no tokio dependency of its own for it. A
//! failing scenario panics with its [`Failure`] message, a passing one prints
//! its [`Evidence`] (visible with `--nocapture`).
//!
//! The factory must hand out *isolated* stores (a new instance, a unique key
//! prefix, its own schema) and, for a store that can use its server's clock,
//! the client-clock mode: the scenarios pass `now` to every call.
//!
//! The scenarios are also plain async functions, and [`run_all`] runs them in
//! order, for a scorecard:
//!
//! ```
//! use std::sync::Arc;
//! use limiter_conformance::{broken::ReferenceStore, limiter_core::Store, run_all, StoreFactory};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let factory: Arc<dyn StoreFactory> =
//!     Arc::new(|| async { Arc::new(ReferenceStore::new(1_000)) as Arc<dyn Store> });
//! for (scenario, result) in run_all(factory).await {
//!     assert!(result.is_ok(), "{}: {:?}", scenario.name, result);
//! }
//! # }
//! ```
//!
//! # The scenarios
//!
//! In the stable order of [`SCENARIOS`]; each names an item of the
//! [`Store`] contract:
//!
//! | scenario | attacks |
//! |---|---|
//! | [`policy_semantics`] | boundaries, `remaining`, `reset_after`, `retry_after` off by one unit or one µs |
//! | [`cost_accounting`] | a weighted request partly admitted, refused costs consumed, an invalid cost panicking |
//! | [`key_independence`] | one key's traffic leaking into another key's quota |
//! | [`refused_hammering`] | refused requests recorded (access later) or forgotten (access earlier) |
//! | [`distinct_key_flood`] | an offender evicted, and so forgiven, by a flood of fresh keys |
//! | [`window_renewal`] | a window's expiry pushed forward by the hits it counts |
//! | [`concurrent_exactness`] | lost updates and over-admission under concurrent callers |
//! | [`hostile_keys`] | keys treated as code or text: empty, 10 KB, quotes, SQL, Lua, NUL, invalid UTF-8 |
//! | [`clock_regression`] | a clock that goes backwards panicking, erroring or resetting a quota |
//! | [`bad_configuration`] | unsupported or extreme policies accepted, invalid costs panicking |
//! | [`key_length_bound`] | no bound on key length: memory per key chosen by whoever supplies the keys |
//! | [`refund_exactness`] | refunds ignored (honest clients stay locked out) or applied blindly (free units) |
//!
//! Scenarios skip the algorithms a store does not list in
//! [`Capabilities::algorithms`](limiter_core::Capabilities::algorithms) and
//! say so in their evidence.
//!
//! # The suite's own teeth
//!
//! [`broken`] holds an honest reference store, which passes every scenario,
//! and one deliberately broken variant per defect; this crate's tests check
//! that every scenario catches at least one of them, for the right reason.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;

pub use limiter_core;
use limiter_core::Store;

pub mod broken;
pub mod composition;
pub mod model;
mod scenarios;
mod support;

pub use scenarios::{
    bad_configuration, clock_regression, concurrent_exactness, cost_accounting, distinct_key_flood,
    hostile_keys, key_independence, key_length_bound, policy_semantics, refund_exactness,
    refused_hammering, window_renewal,
};

/// Makes the stores the scenarios attack.
///
/// Any `Fn() -> impl Future<Output = Arc<dyn Store>>` (an `async fn`, or a
/// closure returning an `async` block) is a factory.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// A fresh store, isolated from every other store this factory made
    /// (a new instance, a unique key prefix, its own schema).
    async fn fresh(&self) -> Arc<dyn Store>;
}

#[async_trait]
impl<F, Fut> StoreFactory for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Arc<dyn Store>> + Send,
{
    async fn fresh(&self) -> Arc<dyn Store> {
        self().await
    }
}

/// What a passing scenario observed, with numbers: for example
/// `"offender refused 25/25 times during a flood of 3,000 fresh keys"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence(pub String);

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a scenario failed: the algorithm, the request and what the store
/// answered instead of what it must answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// The outcome of one scenario.
pub type ScenarioResult = Result<Evidence, Failure>;

type Runner = for<'a> fn(&'a dyn StoreFactory) -> BoxFuture<'a, ScenarioResult>;

/// One conformance scenario: its name (also the name of the generated test
/// and of an item of the [`Store`] contract) and what it attacks.
pub struct Scenario {
    /// The scenario's name, e.g. `"distinct_key_flood"`.
    pub name: &'static str,
    /// One line saying what the scenario attacks.
    pub attacks: &'static str,
    runner: Runner,
}

impl Scenario {
    /// Runs the scenario against stores from `factory`. Never panics: a
    /// store that panics fails the scenario with the panic's message.
    ///
    /// Must be called inside a tokio runtime (the concurrency scenario spawns
    /// tasks); outside one that scenario fails with a message saying so.
    pub async fn run(&self, factory: &dyn StoreFactory) -> ScenarioResult {
        (self.runner)(factory).await
    }
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .field("attacks", &self.attacks)
            .finish_non_exhaustive()
    }
}

macro_rules! scenario_list {
    ($($name:ident => $attacks:literal,)*) => {
        /// Every scenario, in a stable order.
        pub static SCENARIOS: &[Scenario] = &[
            $(Scenario {
                name: stringify!($name),
                attacks: $attacks,
                runner: |f| Box::pin($name(f)),
            },)*
        ];
    };
}

scenario_list! {
    policy_semantics => "boundaries, remaining, reset_after and retry_after off by one unit or one microsecond",
    cost_accounting => "weighted requests partly admitted, refused costs consumed, invalid costs panicking",
    key_independence => "one key's traffic leaking into another key's quota",
    refused_hammering => "refused requests recorded (access later) or forgotten (access earlier)",
    distinct_key_flood => "an offender evicted, and so forgiven, by a flood of fresh keys",
    window_renewal => "a window's expiry pushed forward by the hits it counts",
    concurrent_exactness => "lost updates and over-admission under concurrent callers on one key",
    hostile_keys => "keys treated as code or text: empty, 10 KB, quotes, SQL, Lua, NUL, invalid UTF-8",
    clock_regression => "a clock going backwards panicking, erroring or resetting a quota",
    bad_configuration => "unsupported or extreme policies accepted, invalid costs panicking",
    key_length_bound => "no bound on key length: memory per key chosen by whoever supplies the keys",
    refund_exactness => "refunds ignored (honest clients stay locked out) or applied blindly (free units)",
}

/// Runs every scenario in [`SCENARIOS`] order, one after the other, each
/// against its own fresh stores. Must be called inside a tokio runtime.
pub async fn run_all(factory: Arc<dyn StoreFactory>) -> Vec<(&'static Scenario, ScenarioResult)> {
    let mut results = Vec::with_capacity(SCENARIOS.len());
    for scenario in SCENARIOS {
        results.push((scenario, scenario.run(&*factory).await));
    }
    results
}

/// Generates one test per scenario, named after it, from a store factory
/// (an `async fn() -> Arc<dyn Store>`, a closure returning an `async` block,
/// or any [`StoreFactory`] value).
///
/// ```
/// use std::sync::Arc;
/// use limiter_conformance::limiter_core::Store;
/// # use limiter_conformance::broken::ReferenceStore;
///
/// // A fresh, isolated store per call.
/// async fn store() -> Arc<dyn Store> { Arc::new(ReferenceStore::new(10_000)) }
/// limiter_conformance::conformance_tests!(store);
///
/// // A closure works too, for example to configure the store.
/// mod small {
///     # use super::*;
///     limiter_conformance::conformance_tests!(|| async {
///         Arc::new(ReferenceStore::new(64)) as Arc<dyn Store>
///     });
/// }
/// # fn main() {}
/// ```
///
/// Each test runs on a fresh multi-thread tokio runtime with two workers,
/// panics with the [`Failure`] message if the scenario fails, and prints the
/// [`Evidence`] if it passes.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr $(,)?) => {
        $crate::__conformance_tests_for! {
            $factory;
            policy_semantics
            cost_accounting
            key_independence
            refused_hammering
            distinct_key_flood
            window_renewal
            concurrent_exactness
            hostile_keys
            clock_regression
            bad_configuration
            key_length_bound
            refund_exactness
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests_for {
    ($factory:expr; $($name:ident)*) => {
        $(
            #[test]
            fn $name() {
                $crate::__private::run_test(stringify!($name), $factory);
            }
        )*
    };
}

/// Used by [`conformance_tests!`]; not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use tokio;

    use crate::composition::{COMPOSITION_SCENARIOS, LimiterComposer};
    use crate::{SCENARIOS, StoreFactory};

    /// The scenarios [`conformance_tests!`](crate::conformance_tests)
    /// generates, kept equal to [`SCENARIOS`] by a test.
    pub const MACRO_SCENARIOS: &[&str] = &[
        "policy_semantics",
        "cost_accounting",
        "key_independence",
        "refused_hammering",
        "distinct_key_flood",
        "window_renewal",
        "concurrent_exactness",
        "hostile_keys",
        "clock_regression",
        "bad_configuration",
        "key_length_bound",
        "refund_exactness",
    ];

    /// Runs one scenario as a test: what
    /// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` builds,
    /// without the caller depending on tokio.
    pub fn run_test<F: StoreFactory>(name: &str, factory: F) {
        let Some(scenario) = SCENARIOS.iter().find(|s| s.name == name) else {
            panic!("limiter-conformance has no scenario named {name:?}");
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot build a tokio runtime for {name}: {e}"));
        match runtime.block_on(scenario.run(&factory)) {
            Ok(evidence) => println!("{name}: pass: {evidence}"),
            Err(failure) => panic!("{name} failed: {failure}"),
        }
    }

    /// Runs one composition scenario as a test, with a real `Limiter`.
    pub fn run_composition_test<F: StoreFactory>(name: &str, factory: F) {
        let Some(scenario) = COMPOSITION_SCENARIOS.iter().find(|s| s.name == name) else {
            panic!("limiter-conformance has no composition scenario named {name:?}");
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot build a tokio runtime for {name}: {e}"));
        match runtime.block_on(scenario.run(&factory, &LimiterComposer)) {
            Ok(evidence) => println!("{name}: pass: {evidence}"),
            Err(failure) => panic!("{name} failed: {failure}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macro_generates_every_scenario_in_order() {
        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        assert_eq!(names, __private::MACRO_SCENARIOS);
    }

    #[test]
    fn every_scenario_says_what_it_attacks_in_one_line() {
        for s in SCENARIOS {
            assert!(
                !s.attacks.is_empty() && !s.attacks.contains('\n'),
                "{}",
                s.name
            );
        }
    }
}
