//! Adversarial conformance scenarios that any limiter [`Store`] must pass.
//!
//! Each scenario attacks one way a rate limiter fails under deliberate abuse
//! (refusals that extend a ban, floods that evict an offender, windows that
//! never close, lost updates, keys treated as code), against a fresh store
//! from a [`StoreFactory`], with time driven by a
//! [`ManualClock`](ratewarden_core::ManualClock): deterministic, independent,
//! and fast even for one-hour windows. The expected numbers in every
//! scenario are derived by hand from the semantics in
//! [`ratewarden_core::algorithm`], never computed by calling it, so a bug shared
//! by a backend and the core cannot hide.
//!
//! # Running the suite against a backend
//!
//! In a backend crate's `tests/conformance.rs`, two lines (plus imports):
//!
//! ```
//! use std::sync::Arc;
//! use ratewarden_conformance::ratewarden_core::Store;
//! # use ratewarden_conformance::broken::ReferenceStore as MyStore;
//!
//! async fn store() -> Arc<dyn Store> { Arc::new(MyStore::new(10_000)) }
//! ratewarden_conformance::conformance_tests!(store);
//! # fn main() {}
//! ```
//!
//! The macro generates one test per scenario, named after it, and in a
//! module `composition` one per [composition scenario](composition) with the
//! store as the shared tier of a [`Limiter`](ratewarden_core::Limiter). Each
//! runs on its own multi-thread runtime with two workers (what
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
//! use ratewarden_conformance::{broken::ReferenceStore, ratewarden_core::Store, run_all, StoreFactory};
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
//! The public `async fn`s of this crate, in the order of [`SCENARIOS`] (which
//! also says in one line what each attacks); each names an item of the
//! [`Store`] contract, and a test keeps the two lists equal.
//!
//! Scenarios skip the algorithms a store does not list in
//! [`Capabilities::algorithms`](ratewarden_core::Capabilities::algorithms) and
//! say so in their evidence.
//!
//! A [`Limiter`](ratewarden_core::Limiter) asks a store's inline entry points
//! ([`Store::decide_inline`], [`Store::refund_inline`]) first, so the
//! scenarios attack both ways in: every other request and refund goes inline,
//! and each refund of an empty key asks both. A store that answers nothing inline
//! (`None`, "await me") is asked the awaited way only, which fails nothing;
//! an answer it does give inline must pass the same checks.
//!
//! # The suite's own teeth
//!
//! [`broken`] holds an honest reference store, which passes every scenario,
//! and one deliberately broken variant per defect. This crate's tests check
//! both directions from one table of (scenario, defect, what the failure must
//! say): every scenario catches at least one broken store, for the reason its
//! row states (a scenario without a row fails them), and every defect is
//! caught by some scenario and has a row saying why.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;

pub use ratewarden_core;
use ratewarden_core::Store;

pub mod broken;
pub mod call;
pub mod composition;
pub mod model;
mod scenarios;
mod support;

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

// The one declaration of the store scenarios: their names, order,
// modules, docs and what each attacks. It generates the public functions,
// `SCENARIOS` and `conformance_tests!`, so a scenario is added in one
// place; `$d` carries a `$` into the exported macro it defines, which
// macro_rules cannot write directly.
macro_rules! scenarios {
    (($d:tt) $($(#[$doc:meta])* $name:ident in $module:ident => $attacks:literal,)*) => {
        $(
            $(#[$doc])*
            pub async fn $name(factory: &dyn StoreFactory) -> ScenarioResult {
                support::guarded(scenarios::$module::$name(factory)).await
            }
        )*

        /// Every scenario, in a stable order: the order of the [`Store`]
        /// contract's items.
        pub static SCENARIOS: &[Scenario] = &[
            $(Scenario {
                name: stringify!($name),
                attacks: $attacks,
                runner: |f| Box::pin($name(f)),
            },)*
        ];

        /// Generates one test per scenario, named after it, from a store
        /// factory (an `async fn() -> Arc<dyn Store>`, a closure returning an
        /// `async` block, or any [`StoreFactory`] value), and in a module
        /// `composition` one test per
        /// [composition scenario](crate::composition::COMPOSITION_SCENARIOS)
        /// with the store as the shared tier of a real limiter: the whole
        /// suite, in two lines.
        ///
        /// ```
        /// use std::sync::Arc;
        /// use ratewarden_conformance::ratewarden_core::Store;
        /// # use ratewarden_conformance::broken::ReferenceStore;
        ///
        /// // A fresh, isolated store per call.
        /// async fn store() -> Arc<dyn Store> { Arc::new(ReferenceStore::new(10_000)) }
        /// ratewarden_conformance::conformance_tests!(store);
        ///
        /// // A closure works too, for example to configure the store.
        /// mod small {
        ///     # use super::*;
        ///     ratewarden_conformance::conformance_tests!(|| async {
        ///         Arc::new(ReferenceStore::new(64)) as Arc<dyn Store>
        ///     });
        /// }
        /// # fn main() {}
        /// ```
        ///
        /// Each test runs on a fresh multi-thread tokio runtime with two
        /// workers, panics with the [`Failure`] message if the scenario
        /// fails, and prints the [`Evidence`] if it passes.
        #[macro_export]
        macro_rules! conformance_tests {
            ($d factory:expr $d(,)?) => {
                $d crate::__conformance_tests_for! { $d factory; $($name)* }

                /// The composition scenarios with this store as the shared
                /// tier.
                mod composition {
                    #[allow(unused_imports)]
                    use super::*;

                    $d crate::composition_tests!($d factory);
                }
            };
        }
    };
}

scenarios! {
    ($)
    /// Every supported algorithm matches the semantics of
    /// [`ratewarden_core::algorithm`] at its boundaries: the limit is reached
    /// exactly, and `remaining`, `reset_after` and `retry_after` are exact to
    /// the microsecond. A request retried exactly `retry_after` after a
    /// refusal is admitted; one microsecond earlier it is refused.
    policy_semantics in semantics => "boundaries, remaining, reset_after and retry_after off by one unit or one microsecond",
    /// A request of cost `c` consumes `c` units and is admitted only if all
    /// of them fit; a refused request consumes nothing; asked through
    /// `decide` and `decide_inline` alike.
    cost_accounting in semantics => "costly requests partly admitted, refused costs consumed",
    /// One key exhausted leaves 64 other keys with their full quota, and
    /// their traffic leaves its refusal unchanged, for every algorithm.
    key_independence in keys => "one key's traffic leaking into another key's quota",
    /// A client hammering every 3 ms after its first refusal is refused until
    /// exactly the reported `retry_after` and admitted then; for the sliding
    /// log and the fixed window that is exactly one window after the last
    /// admitted request. Catches refusals that are recorded (access comes
    /// later) and state that is forgotten (access comes earlier).
    refused_hammering in time => "refused requests recorded (access later) or forgotten (access earlier)",
    /// An offender at its limit (one-hour window) stays refused while an
    /// attacker floods three times the store's key capacity in fresh keys
    /// (2,000 keys for an unbounded store), the offender retrying every
    /// capacity/8 keys: a bounded store must evict least-recently-touched
    /// keys, and a refusal touches its key. Whether a bounded store holds at
    /// most its capacity is for the backend's own tests: the key count is
    /// not visible through [`Store`].
    distinct_key_flood in flood => "an offender evicted, and so forgiven, by a flood of fresh keys",
    /// Fixed window: hits every second never move the window's end
    /// (`now + reset_after` is constant), and the count resets exactly at the
    /// end. Sliding log: under steady hits, `reset_after` and `retry_after`
    /// follow the admitted entries only.
    window_renewal in time => "a window's expiry pushed forward by the hits it counts",
    /// Crowds of requests on one key at one instant, callers starting
    /// together and every other request inline, are admitted exactly
    /// `limit` times, with the admitted requests' `remaining` values each of
    /// `limit`−1..=0 once. An in-process store gets four crowds of 1,024
    /// requests per algorithm (limit 1,000) from 8 threads of their own that
    /// pause now and then, so that each wakes in the middle of another's
    /// decision: a read-then-write with no gap held open between the two is
    /// caught there, on a loaded machine too. A
    /// [`shared`](ratewarden_core::Capabilities::shared) store, whose every
    /// request is a round trip in flight with the others, gets one crowd of
    /// 256 (limit 50) from 64 spawned tasks.
    concurrent_exactness in concurrency => "lost updates and over-admission under concurrent callers on one key",
    /// Hostile byte strings (empty, 10 KB, newlines, quotes, SQL, Lua,
    /// `{hash}` tags, NUL bytes, invalid UTF-8, non-ASCII, prefixes of one
    /// another, 10 KB keys differing in their last byte) are all valid and
    /// all distinct keys.
    hostile_keys in keys => "keys treated as code or text: empty, 10 KB, quotes, SQL, Lua, NUL, invalid UTF-8",
    /// `now` going backwards by seconds, by more than a window, and to the
    /// epoch, never errors or panics, never admits more than a forward clock
    /// would over the same span, and the key recovers two windows later.
    clock_regression in time => "a clock going backwards panicking, erroring or resetting a quota",
    /// Algorithms the store does not list are refused by `check_policy` with
    /// `UnsupportedAlgorithm`; supported ones are accepted; the largest
    /// policies are either refused by `check_policy` or work.
    bad_configuration in configuration => "unsupported or extreme policies accepted",
    /// The store declares a key-length bound of at most 1 MiB
    /// (`Store::max_key_len`); a key of exactly that length is valid and
    /// admitted, distinct from another of that length differing in its
    /// last byte, and reset. (A longer key never reaches a store:
    /// `Key::new` refuses it.)
    key_length_bound in keys => "no bound on key length: memory per key chosen by whoever supplies the keys",
    /// Per algorithm, a table of admissions and refunds: a refund restores
    /// exactly the units its admission took (the same request fits again,
    /// with the same numbers), removes the entries of its own time and no
    /// other (sliding log), and changes nothing once the units it took are no
    /// longer held — a closed fixed window, a sliding window two windows
    /// on, a GCRA bucket restarted by a later request; every other refund
    /// goes to `refund_inline`. Refunding a key that holds nothing is a
    /// no-op that creates nothing, for `refund` and `refund_inline` alike.
    refund_exactness in refund => "refunds ignored (honest clients stay locked out) or applied blindly (free units)",
    /// Per algorithm, a table of instants and costs: before each request,
    /// every cost is peeked three times, and the peek of the request's own
    /// cost answers exactly what the request then gets; the peeked key
    /// decides exactly as a twin that is never peeked (a fresh key peeked
    /// seconds before its first request, a refused key hammered with peeks,
    /// a window's end).
    peek_never_records in operations => "a quota check that spends the quota, opens a window or moves an expiry",
    /// Per algorithm, a key exhausted in one window and again in the next
    /// is reset, then admits exactly its limit (20) to 64 concurrent
    /// requests, remaining 19..=0 once each; reset at the instant of its
    /// last request it decides as a key never seen; another key decides as
    /// in a store where nothing was reset; a key never seen resets without
    /// error; the same bytes under another algorithm stay exhausted.
    reset_is_exact in operations => "a reset that forgets part of a key's state, or other keys' state",
    /// Per algorithm, one key moved back and forth between two policies of
    /// the same window and different limits (10 and 4, a paid plan and a
    /// free one), inside windows: every decision is the reference
    /// algorithm's on the key's whole usage, so what was counted under one
    /// limit carries over to the other and no plan change buys a fresh
    /// quota.
    policy_change in operations => "a plan change that forgets the usage already counted",
    /// Per algorithm, a table of penalties and requests across two windows
    /// (limit 10): a key that spent 8 is charged 5, then 7 while over its
    /// limit, and a new key is charged before its first request; every
    /// decision is the reference's with [`algorithm::penalize`](ratewarden_core::algorithm::penalize)
    /// applied to the same state, so a penalty records its units whether or
    /// not they fit, within its bounds.
    penalty_is_counted in operations => "a late charge recorded only when it fits, so an over-limit key is never charged",
    /// Per algorithm, a key hammering every 700 ms under a policy with a
    /// [`Ban`](ratewarden_core::Ban) (the third refusal in a minute bans for
    /// 20 s, doubling up to 80 s): every decision and every fourth
    /// request's peek is the reference's ([`ratewarden_core::ban`] over
    /// [`algorithm::apply`](ratewarden_core::algorithm::apply)), flagged
    /// [`banned`](ratewarden_core::Source::banned) exactly when it is a
    /// ban's refusal; a reset lifts a ban, and offences are forgiven after
    /// a quiet spell. A store that declares no
    /// [`bans`](ratewarden_core::Capabilities::bans) must refuse a banning
    /// policy in `check_policy`.
    bans_are_exact in operations => "a ban that extends itself on every refused request, never ends, or is silently ignored",
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
    use crate::{SCENARIOS, ScenarioResult, StoreFactory};

    /// Runs one scenario as a test.
    pub fn run_test<F: StoreFactory>(name: &str, factory: F) {
        let Some(scenario) = SCENARIOS.iter().find(|s| s.name == name) else {
            panic!("ratewarden-conformance has no scenario named {name:?}");
        };
        run_as_test(name, scenario.run(&factory));
    }

    /// Runs one composition scenario as a test, with a real `Limiter`.
    pub fn run_composition_test<F: StoreFactory>(name: &str, factory: F) {
        let Some(scenario) = COMPOSITION_SCENARIOS.iter().find(|s| s.name == name) else {
            panic!("ratewarden-conformance has no composition scenario named {name:?}");
        };
        run_as_test(name, scenario.run(&factory, &LimiterComposer));
    }

    /// What `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`
    /// builds, without the caller depending on tokio: `run` on a fresh
    /// runtime, panicking with the failure or printing the evidence.
    fn run_as_test(name: &str, run: impl Future<Output = ScenarioResult>) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot build a tokio runtime for {name}: {e}"));
        match runtime.block_on(run) {
            Ok(evidence) => println!("{name}: pass: {evidence}"),
            Err(failure) => panic!("{name} failed: {failure}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
