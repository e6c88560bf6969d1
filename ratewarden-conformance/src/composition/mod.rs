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
//! use ratewarden_conformance::{broken::ReferenceStore, ratewarden_core::Store};
//!
//! async fn shared() -> Arc<dyn Store> { Arc::new(ReferenceStore::new(10_000)) }
//! ratewarden_conformance::composition_tests!(shared);
//! # fn main() {}
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use ratewarden_core::lease::{LeaseConfig, LeasedStore};
use ratewarden_core::{
    AbuseSink, Admission, BreakerConfig, Clock, ConfigError, Decision, FailurePolicy, Limiter,
    ManualClock, Policy, Rule, Store, StoreError,
};

use crate::{ScenarioResult, StoreFactory};

pub mod broken;
mod scenarios;
mod support;

pub use support::{Events, Health, Late, Switch};

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
    /// The rule is in shadow mode ([`Rule::with_shadow`]).
    pub shadow: bool,
}

impl fmt::Debug for TierSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierSpec")
            .field("name", &self.name)
            .field("store", &self.store.name())
            .field("policy", &self.policy)
            .field("fallback", &self.fallback.as_ref().map(|s| s.name()))
            .field("escalation", &self.escalation.is_some())
            .field("shadow", &self.shadow)
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
            shadow: false,
        }
    }

    /// The [`Rule`] this tier describes, on `self.store` as it is (a
    /// composer wraps it first for a [`lease`](Self::lease)).
    pub fn rule(&self) -> Result<Rule, ConfigError> {
        let mut rule = Rule::new(self.name, self.store.clone(), self.policy)?
            .with_timeout(self.timeout)?
            .on_failure(self.on_failure)
            .with_shadow(self.shadow);
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
    /// Decides one request for `key` that may be given back
    /// ([`give_back`](Self::give_back)), as a route that counts only some
    /// outcomes or an outbound permit does. `None` from a composition that
    /// cannot give a request back, which the give-back scenarios fail.
    async fn check_admission(&self, _key: &[u8]) -> Option<Admission> {
        None
    }
    /// Gives back a request [`check_admission`](Self::check_admission)
    /// admitted.
    async fn give_back(&self, admission: Admission) {
        admission.refund().await;
    }
    /// The decision a request for `key` would get, recording nothing.
    /// `None` from a composition that cannot peek.
    async fn peek(&self, _key: &[u8]) -> Option<Decision> {
        None
    }
    /// Forgets `key` in every tier. `None` from a composition that cannot
    /// reset, which the reset scenarios fail.
    async fn reset(&self, _key: &[u8]) -> Option<Result<(), StoreError>> {
        None
    }
    /// Charges `key` `cost` units in every tier, admitted or not. `None`
    /// from a composition that cannot, which the penalty scenario fails.
    async fn penalize(&self, _key: &[u8], _cost: u32) -> Option<Result<(), StoreError>> {
        None
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

    async fn check_admission(&self, key: &[u8]) -> Option<Admission> {
        Limiter::check_admission(self, key, 1).await.ok()
    }

    async fn peek(&self, key: &[u8]) -> Option<Decision> {
        Some(Limiter::peek(self, key).await)
    }

    async fn reset(&self, key: &[u8]) -> Option<Result<(), StoreError>> {
        Some(Limiter::reset(self, key).await)
    }

    async fn penalize(&self, key: &[u8], cost: u32) -> Option<Result<(), StoreError>> {
        Some(Limiter::penalize(self, key, cost).await)
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

    async fn check_admission(&self, key: &[u8]) -> Option<Admission> {
        self.limiter.check_admission(key, 1).await.ok()
    }

    async fn peek(&self, key: &[u8]) -> Option<Decision> {
        Some(self.limiter.peek(key).await)
    }

    async fn reset(&self, key: &[u8]) -> Option<Result<(), StoreError>> {
        Some(self.limiter.reset(key).await)
    }

    async fn penalize(&self, key: &[u8], cost: u32) -> Option<Result<(), StoreError>> {
        Some(self.limiter.penalize(key, cost).await)
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

// The one declaration of the composition scenarios: their names, order,
// docs and what each attacks. It generates the public functions,
// `COMPOSITION_SCENARIOS` and `composition_tests!`, so a scenario is added
// in one place; `$d` carries a `$` into the exported macro it defines,
// which macro_rules cannot write directly.
macro_rules! composition_list {
    (($d:tt) $($(#[$doc:meta])* $name:ident => $attacks:literal,)*) => {
        $(
            $(#[$doc])*
            pub async fn $name(shared: &dyn StoreFactory, composer: &dyn Composer) -> ScenarioResult {
                let setup = scenarios::Setup::new(shared, composer);
                crate::support::guarded(scenarios::$name(&setup)).await
            }
        )*

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
        /// real [`Limiter`](ratewarden_core::Limiter).
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
    /// Tiers "day" (12 per day, local) then "minute" (10 per minute,
    /// shared): 110 requests at t0 admit 10, every refusal from "minute"
    /// with retry 60 s; at t0+61 s exactly 2 more are admitted before "day"
    /// refuses with retry 86,339 s. Catches refusals by a later tier left
    /// counted in an earlier one.
    later_tier_refusal_not_charged => "a request refused by a later tier still counted by an earlier one",
    /// Two instances, each a local tier (10/min) in front of one shared tier
    /// (5/min): 5 served on A at t0, 20 refused at t0+1 s with retry 59 s;
    /// at t0+60 s both A and B serve the client. Catches local tiers that
    /// keep the shared tier's refusals and refuse a client that obeyed
    /// `Retry-After`.
    shared_retry_after_honoured => "a shared tier's Retry-After refused again by a local tier that counted the refusals",
    /// One rule (5/min) on the shared store with a local fallback: 5 served
    /// by the shared store; once it fails, the fallback serves 5 and refuses
    /// the 6th. Catches a fallback consulted beside its store.
    fallback_never_double_counts => "a fallback consulted beside the store it stands in for, counting an honest client twice",
    /// A local tier (60/min) escalating one in 10 admitted requests: a client
    /// at 1/s and one bursting 60 a minute are each sampled exactly 60 times
    /// in 600 admitted requests, one in every run of 10, and a second
    /// composition samples other positions. Catches sampling by a key's
    /// count, which a client's pace switches off or on.
    escalation_rate_independent_of_pace => "escalation sampling that a client's pace turns off, or on for every request",
    /// 20 keys × 3 windows × 95 refusals: 60 sink writes, then 20 at the
    /// flush, standing for all 5,700 refusals. Catches one write per
    /// refusal.
    abuse_writes_bounded => "one abuse write per refusal: a flood of refusals as a flood of writes",
    /// A hanging store (20 ms timeout, breaker 1 failure / 30 s, fail open)
    /// is called once for 100 requests and once more after the cool-down; a
    /// hanging abuse sink is called once for 50 refusals, all written when it
    /// is back. Catches a breaker that never opens.
    dead_store_costs_one_timeout => "a dead store or abuse sink costing a timeout per request instead of per cool-down",
    /// After a cool-down (breaker 1 failure / 10 s), a probe cancelled by
    /// its caller lets the next request probe at once; a probe answered
    /// `InvalidRequest` leaves the breaker able to probe again; a probe that
    /// fails opens it for a full 10 s, in which 50 requests make no store
    /// call, and the probe after it closes it. Catches a breaker that
    /// re-opens for a full cool-down on a cancelled or invalid probe, and
    /// one that stays half-open after a failed probe, letting every request
    /// probe a dead store.
    breaker_recovery => "a breaker kept open by a cancelled or invalid probe, or left half-open by a failed one so every request probes a dead store",
    /// A local tier (100/min) in front of a shared tier (5/min) with a
    /// refusal cache: 100 requests refused at t0+1 s cost one shared-store
    /// call and one local refund; at t0+30 s the refusal still stands
    /// (retry 30 s) without a call; at t0+60 s the store is asked and admits.
    /// Catches a composition that asks the store on every refused request.
    refused_offender_costs_no_round_trip => "a refused client hammering costing a shared-store round trip per request",
    /// For each local layer in front of a shared tier (5 per 15 min) — a
    /// refusal cache; a local tier before it; a lease; a fallback counting
    /// during an outage; an escalation store sampling every admission —
    /// five requests held, a sixth refused and a seventh refused from local
    /// state without a store call; the five given back. A peek must then
    /// admit and exactly 5 of 8 requests be admitted. Catches local state
    /// not told of a give-back (a response-decided one, a released permit)
    /// and a give-back that misses a store that counted the request.
    give_back_reaches_local_state => "a refusal held locally after a give-back, refusing units the store has back",
    /// The same layers, the limit spent and refused from local state, then
    /// the key reset: a peek admits and exactly 5 of 8 are admitted; during
    /// the outage the reset reports the failing store's error and still
    /// resets the fallback. Then with the rule's breaker open and the store
    /// back, a reset reaches the store, and after the cool-down 5 of 8 are
    /// admitted. Catches local state not told of a reset, a reset that
    /// misses a store that counted the key, and one skipped while the
    /// breaker is open.
    reset_reaches_local_state => "a refusal held locally after a reset, refusing a key the store has forgotten",
    /// The same layers but the fallback: 2 requests admitted, then the key
    /// charged a penalty of 3, which spends the shared tier's 5: the next 3
    /// requests must all be refused. Catches local state that goes on
    /// admitting a penalized key, as a lease spending units in hand would.
    penalty_reaches_local_state => "a penalized key admitted from local state, as units in hand",
    /// One unit per 10 s, held by A; B refused by the store with its reply
    /// held up; A given back; B's reply arrives. The next request must be
    /// admitted. Catches a cache that forgets the key on a give-back but
    /// keeps a refusal decided before it and delivered after.
    refusal_racing_a_give_back_not_cached => "a refusal decided before a give-back and cached after it",
    /// Four instances leasing from one fixed window of 20 per 10 s in
    /// batches of at most 4: 12 requests in the first window are admitted;
    /// of 60 in the second, at most 20 and at least 8 (20 less what four
    /// instances can strand) are. Catches leased units the shared store
    /// never counted.
    leased_fleet_never_over_admits => "leased units not counted by the shared store, so a fleet admits more than the limit",
    /// For each algorithm a lease is sound for: four instances leasing in
    /// batches of at most 4 from one window of 20 per 10 s, each through a
    /// ledger of what the shared store counted. Window 1's 8 requests must
    /// leave units in hand (12 counted, 4 in hand with the shipped lease),
    /// or the scenario fails as proving nothing; a flood in window 2 until
    /// every instance is refused must admit exactly the units the store
    /// counted in window 2 (20 for a fixed window, 20 − 12 = 8 for a
    /// sliding one), and each instance's first request there must ask the
    /// store. Catches a lease spent a window late: 24 admitted of 20.
    leased_units_never_outlive_their_window => "leased units spent after the window that counted them, admitted in a window that never counted them",
    /// Two instances on one fixed window of 10: A serves 4 and releases its
    /// leases; B is then admitted exactly the 6 units A did not spend.
    /// Catches units an instance that stops leaves stranded.
    leased_units_returned => "units leased by an instance that stops left stranded instead of handed back",
    /// One instance, fail closed: after the shared store fails, at most the
    /// 3 units in hand are spent, then every request is refused by the
    /// failure policy. Catches a lease that admits on its own when the
    /// shared store is dead.
    leased_dead_store_follows_failure_policy => "a lease that admits on its own once the shared store is dead and its batch is spent",
    /// Tiers on the shared store: "trial" (3/min) in shadow mode, then
    /// "gate" (10/min). 8 requests at t0: all admitted, the last 5 marked
    /// as shadow refusals. Switched on, "trial" refuses at t0+1 s
    /// with retry 59 s and admits 3 at t0+60 s. Catches a shadow rule that
    /// refuses, and one that counts nothing, so that switching it on starts
    /// from zero.
    shadow_rule_counts_and_never_refuses => "a rule in shadow mode that refuses clients, or that counts nothing and starts from zero when switched on",
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
