//! Deliberately broken compositions: each [`BrokenComposer`] builds the
//! composition a scenario describes with one [`CompositionDefect`] that
//! real limiters have shipped, and this crate's tests check that the
//! scenario named beside each defect catches it.
//!
//! Defects inside the stores (a refund ignored) are made by wrapping the
//! stores; defects inside the composition (how it samples, writes abuse
//! events or runs its breaker) by a small composition written here around a
//! real [`Limiter`] from which that feature was taken out.
//!
//! One file of about 850 lines: each broken composition is small, and a
//! reader checking what a scenario catches wants them side by side.

use crate::call;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ratewarden_core::{
    AbuseEvent, AbuseSink, Algorithm, BreakerConfig, Clock, ConfigError, Decision, ErrorKind,
    FailurePolicy, Key, Limiter, ManualClock, Policy, Refund, Request, Store, StoreError,
};

use super::{Composer, Composition, EscalationSpec, LimiterComposer, TierSpec};

/// One defect of a composition, and the scenario meant to catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompositionDefect {
    /// Stores never undo an admission, so a request refused by a later tier
    /// stays counted by earlier ones (`later_tier_refusal_not_charged`,
    /// `shared_retry_after_honoured`).
    NoRefunds,
    /// The fallback is a second tier consulted on every request, as an
    /// application calling the local limiter after the shared one would
    /// (`fallback_never_double_counts`).
    BothConsulted,
    /// Escalates when a key's count in the local window crosses a multiple
    /// of `every` (`escalation_rate_independent_of_pace`).
    PacedSampling,
    /// Writes one abuse event per refusal (`abuse_writes_bounded`).
    AbuseEveryRefusal,
    /// A breaker that never opens (`dead_store_costs_one_timeout`).
    NoBreaker,
    /// A cancelled probe re-opens the breaker for a full cool-down
    /// (`breaker_recovery`).
    CancelledProbeReopens,
    /// A failed probe leaves the breaker half-open, with the deadline that
    /// let it through, so the next request probes the dead store again
    /// instead of the breaker re-opening for a full cool-down: a timeout per
    /// request (`breaker_recovery`).
    FailedProbeStaysHalfOpen,
    /// The stores report an `InvalidRequest` answer as the store failing,
    /// so a probe answered with one re-opens the breaker for a full
    /// cool-down although it said nothing of the store's health
    /// (`breaker_recovery`).
    InvalidProbeFails,
    /// Asks the store on every refused request
    /// (`refused_offender_costs_no_round_trip`).
    NoRefusalCache,
    /// Leases a batch but has the shared store count one unit of it
    /// (`leased_fleet_never_over_admits`).
    LeaseUncounted,
    /// Keeps a batch spendable for one window after the window that counted
    /// it ended (`leased_units_never_outlive_their_window`).
    LeaseOutlivesWindow,
    /// Never hands unspent units back (`leased_units_returned`).
    LeaseNotReleased,
    /// Grants itself a batch when the shared store fails
    /// (`leased_dead_store_follows_failure_policy`).
    LeaseOpenWhenDead,
    /// A refusal cache in front of the limiter that a give-back does not
    /// reach (`give_back_reaches_local_state`).
    GiveBackNotTold,
    /// A refusal cache in front of the limiter that a reset does not reach
    /// (`reset_reaches_local_state`).
    ResetNotTold,
    /// A refusal cache that forgets the key on a give-back, but keeps a
    /// refusal whenever it arrives, even one decided before the give-back
    /// (`refusal_racing_a_give_back_not_cached`).
    RefusalCachedAfterGiveBack,
    /// A give-back or a reset that undoes only what the authoritative store
    /// counted, never what the fallback counted during an outage
    /// (`give_back_reaches_local_state`, `reset_reaches_local_state`).
    FallbackForgotten,
    /// A give-back or a reset that never reaches the escalation store,
    /// which counted every sampled admission
    /// (`give_back_reaches_local_state`, `reset_reaches_local_state`).
    EscalationForgotten,
    /// A reset skipped, reporting success, while a rule's breaker is open
    /// (`reset_reaches_local_state`).
    ResetSkippedWhileOpen,
    /// A penalty charged to the shared stores behind the leases, which go on
    /// spending the units in hand (`penalty_reaches_local_state`).
    PenaltyMissesLease,
    /// A rule in shadow mode enforced all the same
    /// (`shadow_rule_counts_and_never_refuses`).
    ShadowEnforced,
    /// A rule in shadow mode left out of the limiter: nothing says what it
    /// would have refused (`shadow_rule_counts_and_never_refuses`).
    ShadowUncounted,
    /// A rule in shadow mode counted under a name of its own, apart from
    /// the enforcing rule's state, so that switched on it starts from zero
    /// (`shadow_rule_counts_and_never_refuses`).
    ShadowApart,
}

impl CompositionDefect {
    /// Every defect.
    pub const ALL: [CompositionDefect; 23] = [
        CompositionDefect::NoRefunds,
        CompositionDefect::BothConsulted,
        CompositionDefect::PacedSampling,
        CompositionDefect::AbuseEveryRefusal,
        CompositionDefect::NoBreaker,
        CompositionDefect::CancelledProbeReopens,
        CompositionDefect::FailedProbeStaysHalfOpen,
        CompositionDefect::InvalidProbeFails,
        CompositionDefect::NoRefusalCache,
        CompositionDefect::LeaseUncounted,
        CompositionDefect::LeaseOutlivesWindow,
        CompositionDefect::LeaseNotReleased,
        CompositionDefect::LeaseOpenWhenDead,
        CompositionDefect::GiveBackNotTold,
        CompositionDefect::ResetNotTold,
        CompositionDefect::RefusalCachedAfterGiveBack,
        CompositionDefect::FallbackForgotten,
        CompositionDefect::EscalationForgotten,
        CompositionDefect::ResetSkippedWhileOpen,
        CompositionDefect::PenaltyMissesLease,
        CompositionDefect::ShadowEnforced,
        CompositionDefect::ShadowUncounted,
        CompositionDefect::ShadowApart,
    ];
}

/// Builds compositions with one [`CompositionDefect`].
#[derive(Debug, Clone, Copy)]
pub struct BrokenComposer(pub CompositionDefect);

impl Composer for BrokenComposer {
    fn compose(
        &self,
        mut tiers: Vec<TierSpec>,
        clock: ManualClock,
    ) -> Result<Box<dyn Composition>, ConfigError> {
        match self.0 {
            CompositionDefect::NoRefunds => {
                for t in &mut tiers {
                    t.store = Keeps::refunds(t.store.clone());
                    t.fallback = t.fallback.take().map(Keeps::refunds);
                    if let Some(e) = &mut t.escalation {
                        e.store = Keeps::refunds(e.store.clone());
                    }
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::FallbackForgotten => {
                for t in &mut tiers {
                    t.fallback = t.fallback.take().map(Keeps::everything);
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::EscalationForgotten => {
                for t in &mut tiers {
                    if let Some(e) = &mut t.escalation {
                        e.store = Keeps::everything(e.store.clone());
                    }
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::PenaltyMissesLease => {
                let shared = tiers
                    .iter()
                    .map(|t| (t.name, t.store.clone(), t.policy))
                    .collect();
                Ok(Box::new(PenaltyBehindLeases {
                    inner: LimiterComposer.compose(tiers, clock.clone())?,
                    shared,
                    clock,
                }))
            }
            CompositionDefect::ResetSkippedWhileOpen => {
                Ok(Box::new(SkipsResetWhileOpen(limiter(&tiers, &clock)?)))
            }
            CompositionDefect::BothConsulted => {
                let mut out = Vec::new();
                for mut t in tiers {
                    let fallback = t.fallback.take();
                    let policy = t.policy;
                    out.push(t);
                    if let Some(store) = fallback {
                        out.push(TierSpec::new("fallback", store, policy));
                    }
                }
                LimiterComposer.compose(out, clock)
            }
            CompositionDefect::GiveBackNotTold
            | CompositionDefect::ResetNotTold
            | CompositionDefect::RefusalCachedAfterGiveBack => {
                let mut builder = Limiter::builder().clock(clock.clone());
                for t in &tiers {
                    builder = builder.rule(t.rule()?.without_refusal_cache());
                }
                Ok(Box::new(StaleRefusals {
                    inner: builder.build()?,
                    defect: self.0,
                    held: Mutex::default(),
                    clock,
                }))
            }
            CompositionDefect::ShadowEnforced => {
                for t in &mut tiers {
                    t.shadow = false;
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::ShadowUncounted => {
                tiers.retain(|t| !t.shadow);
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::ShadowApart => {
                for t in tiers.iter_mut().filter(|t| t.shadow) {
                    // A few names in a test process: leaked for the
                    // `&'static str` a tier is named by.
                    t.name = Box::leak(format!("{}-shadow", t.name).into_boxed_str());
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::NoRefusalCache => {
                let mut builder = Limiter::builder().clock(clock);
                for t in &tiers {
                    builder = builder.rule(t.rule()?.without_refusal_cache());
                }
                Ok(Box::new(builder.build()?))
            }
            CompositionDefect::NoBreaker => {
                for t in &mut tiers {
                    t.breaker = never_opens()?;
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::PacedSampling => {
                let escalation = take_escalation(&mut tiers);
                Ok(Box::new(Paced {
                    inner: limiter(&tiers, &clock)?,
                    escalation,
                    clock,
                }))
            }
            CompositionDefect::AbuseEveryRefusal => {
                let mut sinks = Vec::new();
                for t in &mut tiers {
                    if let Some(e) = &mut t.escalation {
                        sinks.push((t.name, e.sink.take()));
                    }
                }
                let timeout = tiers.first().map_or(Duration::from_secs(1), |t| t.timeout);
                Ok(Box::new(EveryRefusal {
                    inner: limiter(&tiers, &clock)?,
                    sinks,
                    timeout,
                    clock,
                }))
            }
            CompositionDefect::LeaseNotReleased => {
                Ok(Box::new(Unreleased(LimiterComposer.compose(tiers, clock)?)))
            }
            CompositionDefect::LeaseUncounted
            | CompositionDefect::LeaseOutlivesWindow
            | CompositionDefect::LeaseOpenWhenDead => {
                for t in &mut tiers {
                    if let Some(units) = t.lease.take() {
                        t.store = Arc::new(BrokenLease {
                            shared: t.store.clone(),
                            units,
                            defect: self.0,
                            batches: Mutex::default(),
                        });
                    }
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::InvalidProbeFails => {
                for t in &mut tiers {
                    t.store = InvalidAsFailure::wrap(t.store.clone());
                    t.fallback = t.fallback.take().map(InvalidAsFailure::wrap);
                }
                LimiterComposer.compose(tiers, clock)
            }
            CompositionDefect::CancelledProbeReopens
            | CompositionDefect::FailedProbeStaysHalfOpen => {
                let first = tiers
                    .first()
                    .ok_or_else(|| ConfigError::Invalid("no tiers".into()))?;
                let config = first.breaker;
                let (name, on_failure, policy) = (first.name, first.on_failure, first.policy);
                let store = first.store.name();
                for t in &mut tiers {
                    t.breaker = never_opens()?;
                }
                Ok(Box::new(Reopening {
                    defect: self.0,
                    inner: limiter(&tiers, &clock)?,
                    config,
                    state: Arc::new(Mutex::new(BreakerState::default())),
                    name,
                    store,
                    on_failure,
                    policy,
                    clock,
                }))
            }
        }
    }
}

/// A refusal cache kept in front of a limiter, as an application might
/// write one, each defect a notice it misses.
struct StaleRefusals {
    inner: Limiter,
    defect: CompositionDefect,
    /// Refused keys, with the refusal and until when it stands (µs).
    held: Mutex<HashMap<Vec<u8>, (Decision, u64)>>,
    clock: ManualClock,
}

impl StaleRefusals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, (Decision, u64)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn standing(&self, key: &[u8]) -> Option<Decision> {
        let now = self.clock.now().as_micros();
        let held = self.lock();
        let (d, until) = held.get(key)?;
        (now < *until).then(|| d.clone())
    }

    fn keep(&self, key: &[u8], d: &Decision) {
        if !d.allowed {
            let until = self.clock.now().as_micros() + d.retry_after.as_micros() as u64;
            self.lock().insert(key.to_vec(), (d.clone(), until));
        }
    }
}

#[async_trait]
impl Composition for StaleRefusals {
    async fn check(&self, key: &[u8]) -> Decision {
        if let Some(d) = self.standing(key) {
            return d;
        }
        let d = self.inner.check(key).await;
        self.keep(key, &d);
        d
    }

    async fn flush_abuse_events(&self) -> u64 {
        self.inner.flush_abuse_events().await
    }

    async fn check_admission(&self, key: &[u8]) -> Option<ratewarden_core::Admission> {
        self.inner.check_admission(key, 1).await.ok()
    }

    async fn give_back(&self, admission: ratewarden_core::Admission) {
        admission.refund().await;
        // Forgets every refusal it holds, which covers the key given back:
        // all the scenarios need of an honest notice.
        if self.defect != CompositionDefect::GiveBackNotTold {
            self.lock().clear();
        }
    }

    async fn peek(&self, key: &[u8]) -> Option<Decision> {
        Some(match self.standing(key) {
            Some(d) => d,
            None => self.inner.peek(key).await,
        })
    }

    async fn reset(&self, key: &[u8]) -> Option<Result<(), StoreError>> {
        let result = self.inner.reset(key).await;
        if self.defect != CompositionDefect::ResetNotTold {
            self.lock().remove(key);
        }
        Some(result)
    }
}

/// A composition whose leases are never handed back.
struct Unreleased(Box<dyn Composition>);

#[async_trait]
impl Composition for Unreleased {
    async fn check(&self, key: &[u8]) -> Decision {
        self.0.check(key).await
    }

    async fn flush_abuse_events(&self) -> u64 {
        self.0.flush_abuse_events().await
    }
}

/// A lease as first written: batches of a fixed size, with one defect.
#[derive(Debug)]
struct BrokenLease {
    shared: Arc<dyn Store>,
    units: u32,
    defect: CompositionDefect,
    /// Per key: units in hand, and the end of the window that counted them.
    batches: Mutex<std::collections::HashMap<Vec<u8>, (u32, u64)>>,
}

impl BrokenLease {
    fn grant(&self, key: &[u8], cost: u32, until: u64) {
        let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        batches.insert(key.to_vec(), (self.units - cost, until));
    }
}

#[async_trait]
impl Store for BrokenLease {
    ratewarden_core::forward_store_identity!(shared);

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let t = now.as_micros();
        {
            let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((units, until)) = batches.get_mut(key) {
                let late = match self.defect {
                    CompositionDefect::LeaseOutlivesWindow => policy.window_micros(),
                    _ => 0,
                };
                let live = t < until.saturating_add(late);
                if live && *units >= cost {
                    *units -= cost;
                    return Ok(Decision::new(
                        true,
                        policy,
                        *units,
                        Duration::from_micros(until.saturating_sub(t)),
                        Duration::ZERO,
                        self.shared.name(),
                    ));
                }
            }
        }
        let ask = match self.defect {
            CompositionDefect::LeaseUncounted => cost,
            _ => self.units,
        };
        let grant = match call::decide(&self.shared, key, policy, ask, now).await {
            Ok(d) => d,
            Err(_) if self.defect == CompositionDefect::LeaseOpenWhenDead => {
                self.grant(key, cost, t + policy.window_micros());
                return Ok(Decision::new(
                    true,
                    policy,
                    self.units - cost,
                    policy.window(),
                    Duration::ZERO,
                    self.shared.name(),
                ));
            }
            Err(e) => return Err(e),
        };
        if grant.allowed {
            self.grant(key, cost, window_end(policy, t, &grant));
            return Ok(grant);
        }
        if ask == cost {
            return Ok(grant);
        }
        self.shared.decide(request).await
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.shared.refund(refund).await
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.shared.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.shared.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.shared.penalize(request).await
    }
}

/// The end of the window that counted a grant at `t`: a sliding window's
/// `reset_after` reaches past the window that holds the units, to when they
/// stop weighing on the next one.
fn window_end(policy: &Policy, t: u64, grant: &Decision) -> u64 {
    let w = policy.window_micros();
    match policy.algorithm() {
        Algorithm::SlidingWindow => t - t % w + w,
        _ => t + grant.reset_after.as_micros() as u64,
    }
}

/// A store whose `InvalidRequest` errors come out as the store failing, as
/// an adapter that flattens every error into "unavailable" reports them.
#[derive(Debug)]
struct InvalidAsFailure(Arc<dyn Store>);

impl InvalidAsFailure {
    fn wrap(store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(InvalidAsFailure(store))
    }

    fn flatten(e: StoreError) -> StoreError {
        if e.kind() != ErrorKind::InvalidRequest {
            return e;
        }
        StoreError::new(ErrorKind::Unavailable, e.store(), e.to_string())
    }
}

#[async_trait]
impl Store for InvalidAsFailure {
    ratewarden_core::forward_store_identity!(0);

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.0.decide(request).await.map_err(Self::flatten)
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.0.refund(refund).await.map_err(Self::flatten)
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

fn never_opens() -> Result<BreakerConfig, ConfigError> {
    BreakerConfig::new(u32::MAX, Duration::from_secs(1))
}

fn limiter(tiers: &[TierSpec], clock: &ManualClock) -> Result<Limiter, ConfigError> {
    let mut builder = Limiter::builder().clock(clock.clone());
    for t in tiers {
        builder = builder.rule(t.rule()?);
    }
    builder.build()
}

fn take_escalation(tiers: &mut [TierSpec]) -> Option<(&'static str, EscalationSpec)> {
    tiers
        .iter_mut()
        .find_map(|t| t.escalation.take().map(|e| (t.name, e)))
}

fn storage_key(rule: &str, key: &[u8]) -> Vec<u8> {
    let mut k = rule.as_bytes().to_vec();
    k.push(b':');
    k.extend_from_slice(key);
    k
}

/// A store whose refunds succeed and change nothing, and, if `resets` is
/// false, whose resets too: as if the composition never sent them there.
#[derive(Debug)]
struct Keeps {
    inner: Arc<dyn Store>,
    resets: bool,
}

impl Keeps {
    /// Ignores refunds.
    fn refunds(store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(Keeps {
            inner: store,
            resets: true,
        })
    }

    /// Ignores refunds and resets: every count it made stays.
    fn everything(store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(Keeps {
            inner: store,
            resets: false,
        })
    }
}

#[async_trait]
impl Store for Keeps {
    ratewarden_core::forward_store_identity!(inner);

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.decide(request).await
    }

    async fn refund(&self, _: Refund<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        if !self.resets {
            return Ok(());
        }
        self.inner.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.inner.penalize(request).await
    }
}

/// A limiter whose reset, while a rule's breaker is open, does nothing and
/// reports success: the store "is down", so why call it.
struct SkipsResetWhileOpen(Limiter);

#[async_trait]
impl Composition for SkipsResetWhileOpen {
    async fn check(&self, key: &[u8]) -> Decision {
        self.0.check(key).await
    }

    async fn flush_abuse_events(&self) -> u64 {
        self.0.flush_abuse_events().await
    }

    async fn check_admission(&self, key: &[u8]) -> Option<ratewarden_core::Admission> {
        self.0.check_admission(key, 1).await.ok()
    }

    async fn peek(&self, key: &[u8]) -> Option<Decision> {
        Some(self.0.peek(key).await)
    }

    async fn reset(&self, key: &[u8]) -> Option<Result<(), StoreError>> {
        let open = self
            .0
            .stats()
            .iter()
            .any(|s| s.breaker == ratewarden_core::BreakerState::Open);
        if open {
            return Some(Ok(()));
        }
        Some(self.0.reset(key).await)
    }
}

/// A composition whose penalties go straight to each tier's shared store,
/// as an application holding that store might send them, past the leases.
struct PenaltyBehindLeases {
    inner: Box<dyn Composition>,
    shared: Vec<(&'static str, Arc<dyn Store>, Policy)>,
    clock: ManualClock,
}

#[async_trait]
impl Composition for PenaltyBehindLeases {
    async fn check(&self, key: &[u8]) -> Decision {
        self.inner.check(key).await
    }

    async fn flush_abuse_events(&self) -> u64 {
        self.inner.flush_abuse_events().await
    }

    async fn penalize(&self, key: &[u8], cost: u32) -> Option<Result<(), StoreError>> {
        let now = self.clock.now();
        for (rule, store, policy) in &self.shared {
            let key = storage_key(rule, key);
            if let Err(e) = call::penalize(store.as_ref(), &key, policy, cost, now).await {
                return Some(Err(e));
            }
        }
        Some(Ok(()))
    }
}

/// Escalation sampled by the key's count, as the first version did.
struct Paced {
    inner: Limiter,
    escalation: Option<(&'static str, EscalationSpec)>,
    clock: ManualClock,
}

#[async_trait]
impl Composition for Paced {
    async fn check(&self, key: &[u8]) -> Decision {
        let mut d = self.inner.check(key).await;
        let Some((rule, e)) = &self.escalation else {
            return d;
        };
        if !d.allowed || d.source.rule != Some(*rule) {
            return d;
        }
        let after = u64::from(d.limit - d.remaining);
        let every = u64::from(e.every);
        if after / every == (after - 1) / every {
            return d;
        }
        let now = self.clock.now();
        let durable_key = storage_key(rule, key);
        let asked = call::decide(&e.store, &durable_key, &e.policy, 1, now);
        match tokio::time::timeout(Duration::from_secs(10), asked).await {
            Ok(Ok(mut durable)) if !durable.allowed => {
                durable.source.escalated = true;
                durable
            }
            _ => {
                d.source.escalated = true;
                d
            }
        }
    }

    async fn flush_abuse_events(&self) -> u64 {
        self.inner.flush_abuse_events().await
    }
}

/// Every refusal written to the sink at once.
struct EveryRefusal {
    inner: Limiter,
    sinks: Vec<(&'static str, Option<Arc<dyn AbuseSink>>)>,
    timeout: Duration,
    clock: ManualClock,
}

#[async_trait]
impl Composition for EveryRefusal {
    async fn check(&self, key: &[u8]) -> Decision {
        let d = self.inner.check(key).await;
        if d.allowed {
            return d;
        }
        let sink = self
            .sinks
            .iter()
            .find(|(rule, _)| d.source.rule == Some(*rule))
            .and_then(|(_, sink)| sink.clone());
        if let (Some(sink), Some(rule)) = (sink, d.source.rule) {
            let now = self.clock.now();
            let event = AbuseEvent::new(rule, key, now, d.source.store);
            let _ = tokio::time::timeout(self.timeout, sink.record(event)).await;
        }
        d
    }

    async fn flush_abuse_events(&self) -> u64 {
        0
    }
}

#[derive(Debug, Default)]
struct BreakerState {
    failures: u32,
    open_until: Option<u64>,
    probing: bool,
}

/// A breaker around the first tier with one defect in how a probe ends:
/// one whose caller goes away re-opens it for a full cool-down
/// ([`CompositionDefect::CancelledProbeReopens`]), or one that fails leaves
/// the expired deadline standing, so the next call probes again
/// ([`CompositionDefect::FailedProbeStaysHalfOpen`]).
struct Reopening {
    defect: CompositionDefect,
    inner: Limiter,
    config: BreakerConfig,
    state: Arc<Mutex<BreakerState>>,
    name: &'static str,
    store: &'static str,
    on_failure: FailurePolicy,
    policy: Policy,
    clock: ManualClock,
}

/// Ends a probe whose caller went away: gives the slot back, and with
/// `reopen_until` re-opens the breaker until then.
struct ReopenOnDrop {
    state: Arc<Mutex<BreakerState>>,
    reopen_until: Option<u64>,
    armed: bool,
}

impl Drop for ReopenOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.probing = false;
            if let Some(until) = self.reopen_until {
                s.open_until = Some(until);
            }
        }
    }
}

impl Reopening {
    fn mono(&self) -> u64 {
        self.clock.monotonic().as_micros() as u64
    }

    fn cool_down(&self) -> u64 {
        self.config.cool_down().as_micros() as u64
    }

    fn skipped(&self) -> Decision {
        let mut d = Decision::degraded(self.on_failure, &self.policy, self.store);
        d.source.rule = Some(self.name);
        d
    }
}

#[async_trait]
impl Composition for Reopening {
    async fn check(&self, key: &[u8]) -> Decision {
        let mono = self.mono();
        let probe = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match s.open_until {
                Some(until) if mono < until || s.probing => return self.skipped(),
                Some(_) => {
                    s.probing = true;
                    true
                }
                None => false,
            }
        };
        let reopens = self.defect == CompositionDefect::CancelledProbeReopens;
        let mut guard = ReopenOnDrop {
            state: self.state.clone(),
            reopen_until: reopens.then(|| mono + self.cool_down()),
            armed: probe,
        };
        let d = self.inner.check(key).await;
        guard.armed = false;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.probing = false;
        if d.source.degraded {
            s.failures += 1;
            let stays_half_open =
                probe && self.defect == CompositionDefect::FailedProbeStaysHalfOpen;
            if !stays_half_open && (probe || s.failures >= self.config.failures()) {
                s.open_until = Some(mono + self.cool_down());
            }
        } else {
            *s = BreakerState::default();
        }
        d
    }

    async fn flush_abuse_events(&self) -> u64 {
        self.inner.flush_abuse_events().await
    }
}
