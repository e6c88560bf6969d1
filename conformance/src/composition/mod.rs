//! Adversarial scenarios for compositions: a [`Limiter`] of tiers, fallback,
//! breaker, failure policy and escalation, with any store as the shared tier.
//!
//! Every invariant a store keeps must hold for a whole limiter. The store
//! scenarios cannot see the ways a composition breaks one: a request refused
//! by a later tier but still counted by an earlier one, a fallback consulted
//! beside the store it stands in for, escalation sampling that depends on a
//! client's pace, one abuse write per refusal, a dead store costing a
//! timeout per request, a breaker that a disconnecting client keeps open,
//! leased units spent outside the window that counted them.
//! These scenarios attack those, with local tiers on the honest
//! [`ReferenceStore`](crate::broken::ReferenceStore), the shared tier from a
//! [`StoreFactory`] (memory, Redis, Postgres or yours), and time on a
//! [`ManualClock`]. Expected numbers are derived by hand in each scenario.
//!
//! A scenario describes its composition as [`TierSpec`]s and asks a
//! [`Composer`] to build it. [`LimiterComposer`] builds a real [`Limiter`];
//! the composers in [`broken`] each build one deliberately wrong
//! composition, and this crate's tests check that each scenario catches one.
//!
//! ```
//! use std::sync::Arc;
//! use limiter_conformance::{broken::ReferenceStore, limiter_core::Store};
//!
//! async fn shared() -> Arc<dyn Store> { Arc::new(ReferenceStore::new(10_000)) }
//! limiter_conformance::composition_tests!(shared);
//! # fn main() {}
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use limiter_core::lease::{LeaseConfig, LeasedStore};
use limiter_core::{
    AbuseSink, BreakerConfig, Clock, ConfigError, Decision, FailurePolicy, Limiter, ManualClock,
    Policy, Rule, Store,
};

use crate::{ScenarioResult, StoreFactory};

/// The [`Store`] methods of a wrapper that says what the store it wraps,
/// `self.$inner`, says: its name, capabilities and policy check. A wrapper
/// stands for its store in a composition and differs only in what it
/// decides. `max_key_len` stays at the trait's default: the wrapped store
/// enforces its own bound when it decides.
macro_rules! forward_identity {
    ($inner:tt) => {
        fn name(&self) -> &'static str {
            self.$inner.name()
        }

        fn capabilities(&self) -> limiter_core::Capabilities {
            self.$inner.capabilities()
        }

        fn check_policy(
            &self,
            policy: &limiter_core::Policy,
        ) -> Result<(), limiter_core::ConfigError> {
            self.$inner.check_policy(policy)
        }
    };
}

pub mod broken;
mod scenarios;
mod support;

pub use scenarios::{
    abuse_writes_bounded, breaker_recovery, dead_store_costs_one_timeout,
    escalation_rate_independent_of_pace, fallback_never_double_counts,
    later_tier_refusal_not_charged, leased_dead_store_follows_failure_policy,
    leased_fleet_never_over_admits, leased_units_returned, refused_offender_costs_no_round_trip,
    shared_retry_after_honoured,
};
pub use support::{Health, Switch};

/// One tier of a composition under test: what a [`Rule`] is built from.
#[derive(Clone)]
pub struct TierSpec {
    /// The rule's name.
    pub name: &'static str,
    /// The authoritative store.
    pub store: Arc<dyn Store>,
    /// The policy.
    pub policy: Policy,
    /// The timeout on every store call.
    pub timeout: Duration,
    /// The circuit breaker of the tier's stores.
    pub breaker: BreakerConfig,
    /// What to answer when no store answers.
    pub on_failure: FailurePolicy,
    /// A store answering when the authoritative one fails.
    pub fallback: Option<Arc<dyn Store>>,
    /// A durable store consulted on a sample of admitted requests.
    pub escalation: Option<EscalationSpec>,
    /// A refusal cache of this many keys; `None` keeps the rule's default.
    pub refusal_cache: Option<usize>,
    /// The store is shared by a fleet and leased in batches of at most this
    /// many units ([`LeasedStore`]).
    pub lease: Option<u32>,
}

impl fmt::Debug for TierSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierSpec")
            .field("name", &self.name)
            .field("store", &self.store.name())
            .field("policy", &self.policy)
            .field("fallback", &self.fallback.as_ref().map(|s| s.name()))
            .field("escalation", &self.escalation.is_some())
            .finish_non_exhaustive()
    }
}

impl TierSpec {
    /// A tier with a 10 s timeout (the scenarios check decisions, not
    /// latency, and a shared store on a loaded machine may be slow), the
    /// default breaker, failing open, with no fallback and no escalation.
    pub fn new(name: &'static str, store: Arc<dyn Store>, policy: Policy) -> Self {
        TierSpec {
            name,
            store,
            policy,
            timeout: Duration::from_secs(10),
            breaker: BreakerConfig::default(),
            on_failure: FailurePolicy::Open,
            fallback: None,
            escalation: None,
            refusal_cache: None,
            lease: None,
        }
    }

    /// The [`Rule`] this tier describes, on `self.store` as it is (a
    /// composer wraps it first for a [`lease`](Self::lease)).
    pub fn rule(&self) -> Result<Rule, ConfigError> {
        let mut rule = Rule::new(self.name, self.store.clone(), self.policy)?
            .with_timeout(self.timeout)?
            .on_failure(self.on_failure);
        if let Some(fallback) = &self.fallback {
            rule = rule.with_fallback(fallback.clone())?;
        }
        if let Some(e) = &self.escalation {
            rule = rule.with_escalation(e.store.clone(), e.policy, e.every, e.sink.clone())?;
        }
        if let Some(keys) = self.refusal_cache {
            rule = rule.with_refusal_cache(keys)?;
        }
        Ok(rule.with_breaker(self.breaker))
    }
}

/// The escalation of a [`TierSpec`].
#[derive(Clone)]
pub struct EscalationSpec {
    /// The durable store.
    pub store: Arc<dyn Store>,
    /// Its stricter policy.
    pub policy: Policy,
    /// One admitted request in `every` is sampled.
    pub every: u32,
    /// Where refusals are recorded.
    pub sink: Option<Arc<dyn AbuseSink>>,
}

/// A composition under test: what the scenarios call per request.
#[async_trait]
pub trait Composition: Send + Sync {
    /// Decides one request for `key`.
    async fn check(&self, key: &[u8]) -> Decision;
    /// Writes every abuse event held back; returns how many were written.
    async fn flush_abuse_events(&self) -> u64;
    /// Hands every unspent leased unit back to the shared store, as an
    /// instance does at shutdown; returns how many. A composition without
    /// leases has none.
    async fn release_leases(&self) -> u64 {
        0
    }
}

#[async_trait]
impl Composition for Limiter {
    async fn check(&self, key: &[u8]) -> Decision {
        Limiter::check(self, key).await
    }

    async fn flush_abuse_events(&self) -> u64 {
        Limiter::flush_abuse_events(self).await
    }
}

/// Builds a composition from tiers, applied in order, on a clock.
pub trait Composer: Send + Sync {
    /// The composition of `tiers` reading `clock`.
    fn compose(
        &self,
        tiers: Vec<TierSpec>,
        clock: ManualClock,
    ) -> Result<Box<dyn Composition>, ConfigError>;
}

/// The composition the crate ships: a [`Limiter`] of one [`Rule`] per tier.
#[derive(Debug, Clone, Copy, Default)]
pub struct LimiterComposer;

impl Composer for LimiterComposer {
    fn compose(
        &self,
        mut tiers: Vec<TierSpec>,
        clock: ManualClock,
    ) -> Result<Box<dyn Composition>, ConfigError> {
        let mut leases = Vec::new();
        for tier in &mut tiers {
            if let Some(units) = tier.lease {
                let leased = Arc::new(LeasedStore::new(
                    tier.store.clone(),
                    LeaseConfig::new(units)?,
                ));
                tier.store = leased.clone();
                leases.push(leased);
            }
        }
        let mut builder = Limiter::builder().clock(clock.clone());
        for tier in &tiers {
            builder = builder.rule(tier.rule()?);
        }
        let limiter = builder.build()?;
        if leases.is_empty() {
            return Ok(Box::new(limiter));
        }
        Ok(Box::new(Leasing {
            limiter,
            leases,
            clock,
        }))
    }
}

/// A [`Limiter`] whose tiers lease from their shared stores.
struct Leasing {
    limiter: Limiter,
    leases: Vec<Arc<LeasedStore>>,
    clock: ManualClock,
}

#[async_trait]
impl Composition for Leasing {
    async fn check(&self, key: &[u8]) -> Decision {
        self.limiter.check(key).await
    }

    async fn flush_abuse_events(&self) -> u64 {
        self.limiter.flush_abuse_events().await
    }

    async fn release_leases(&self) -> u64 {
        let mut released = 0;
        for lease in &self.leases {
            released += lease.release(self.clock.now()).await;
        }
        released
    }
}

type Runner = for<'a> fn(&'a dyn StoreFactory, &'a dyn Composer) -> BoxFuture<'a, ScenarioResult>;

/// One composition scenario: its name and what it attacks.
pub struct CompositionScenario {
    /// The scenario's name, e.g. `"later_tier_refusal_not_charged"`.
    pub name: &'static str,
    /// One line saying what the scenario attacks.
    pub attacks: &'static str,
    runner: Runner,
}

impl CompositionScenario {
    /// Runs the scenario with shared stores from `shared`, composed by
    /// `composer`. Never panics. Must be called inside a multi-thread tokio
    /// runtime with the time driver enabled.
    pub async fn run(&self, shared: &dyn StoreFactory, composer: &dyn Composer) -> ScenarioResult {
        (self.runner)(shared, composer).await
    }
}

impl fmt::Debug for CompositionScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompositionScenario")
            .field("name", &self.name)
            .field("attacks", &self.attacks)
            .finish_non_exhaustive()
    }
}

// The list is written once; `$d` carries a `$` into the exported macro
// this one defines, since macro_rules cannot write one directly.
macro_rules! composition_list {
    (($d:tt) $($name:ident => $attacks:literal,)*) => {
        /// Every composition scenario, in a stable order.
        pub static COMPOSITION_SCENARIOS: &[CompositionScenario] = &[
            $(CompositionScenario {
                name: stringify!($name),
                attacks: $attacks,
                runner: |f, c| Box::pin($name(f, c)),
            },)*
        ];

        /// Generates one test per composition scenario, named after it, with
        /// shared stores from a factory (as for
        /// [`conformance_tests!`](crate::conformance_tests)) composed by a
        /// real [`Limiter`](limiter_core::Limiter).
        #[macro_export]
        macro_rules! composition_tests {
            ($d factory:expr $d(,)?) => {
                $d crate::__composition_tests_for! { $d factory; $($name)* }
            };
        }
    };
}

composition_list! {
    ($)
    later_tier_refusal_not_charged => "a request refused by a later tier still counted by an earlier one",
    shared_retry_after_honoured => "a shared tier's Retry-After refused again by a local tier that counted the refusals",
    fallback_never_double_counts => "a fallback consulted beside the store it stands in for, counting an honest client twice",
    escalation_rate_independent_of_pace => "escalation sampling that a client's pace turns off, or on for every request",
    abuse_writes_bounded => "one abuse write per refusal: a flood of refusals as a flood of writes",
    dead_store_costs_one_timeout => "a dead store or abuse sink costing a timeout per request instead of per cool-down",
    breaker_recovery => "a breaker kept open by a cancelled probe, or half-open for ever by an invalid one",
    refused_offender_costs_no_round_trip => "a refused client hammering costing a shared-store round trip per request",
    leased_fleet_never_over_admits => "leased units not counted by the shared store, or spent after the window that counted them",
    leased_units_returned => "units leased by an instance that stops left stranded instead of handed back",
    leased_dead_store_follows_failure_policy => "a lease that admits on its own once the shared store is dead and its batch is spent",
}

#[doc(hidden)]
#[macro_export]
macro_rules! __composition_tests_for {
    ($factory:expr; $($name:ident)*) => {
        $(
            #[test]
            fn $name() {
                $crate::__private::run_composition_test(stringify!($name), $factory);
            }
        )*
    };
}
