//! Composition: a limiter made of ordered rules, each a store with its own
//! policy, timeout, circuit breaker, fallback and failure policy.
//!
//! The articles behind this crate all end at the same shape: a fast local
//! check in front of a shared or durable one, where the shared store must
//! never become the outage. The pieces:
//!
//! * **Tiers** — a [`Limiter`] applies its [`Rule`]s in order; the first
//!   refusal wins and later rules are not consulted, so a request refused by
//!   a local tier costs no network call.
//! * **Fallback** — [`Rule::with_fallback`]: the rule's store is
//!   authoritative; when it fails, times out or its breaker is open, the same
//!   policy is answered by the fallback store. The fallback is consulted only
//!   then, so exactly one store counts each request.
//! * **Failure policy** — [`FailurePolicy`] when no store answers; every call
//!   bounded by a timeout; a [`BreakerConfig`] per store so a dead store
//!   costs one timeout, not one per request.
//! * **Escalation** — [`Rule::with_escalation`]: the local store is
//!   authoritative, a durable store is consulted on a sample of admitted
//!   requests with a stricter policy, and refusals are recorded as
//!   [`AbuseEvent`]s.
//!
//! # Over-admission bounds
//!
//! For a fleet of `N` instances sharing one server, in one window of a
//! policy with limit `L`:
//!
//! | composition | admitted at most |
//! |---|---|
//! | shared store only (fail closed) | `L` |
//! | shared store, fallback to local | `L`, plus `L` per instance for each window in which the shared store failed (each local store counts alone) |
//! | local store only | `N·L` |
//! | escalation, sample every `k`, durable limit `D` (counted in samples) | `N·L − max(0, N·⌊L/k⌋ − D)` (cost 1) |
//!
//! Escalation records a flood more than it caps it: a durable refusal
//! refuses only the sampled request (whose local unit is already spent), and
//! the next `k − 1` requests are answered locally again, so past the
//! durable limit a fleet still admits all but one request in `k` up to each
//! instance's local limit. The `limiter` crate's `fleet_bound` test measures
//! every row of this table with `N = 4` instances sharing real Redis and
//! Postgres servers; the `limiter` crate's documentation shows the three
//! articles' setups as runnable examples.
//!
//! A call that times out may already have been applied by the store, so a
//! request whose authoritative call timed out and was then answered by the
//! fallback can be counted by both; this is the only double count, and it
//! requires a store slower than its timeout.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::breaker::{Breaker, BreakerConfig, BreakerState, Permit, Transition};
use crate::decision::{Decision, Source};
use crate::error::{ConfigError, ErrorKind, StoreError};
use crate::policy::Policy;
use crate::store::Store;
use crate::time::{Clock, SystemClock, Timestamp};

/// What a rule answers when no store answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Admit the request: availability over enforcement. Right for abuse
    /// control in front of a page that must keep working.
    #[default]
    Open,
    /// Refuse the request: enforcement over availability. Right where
    /// over-admission costs money.
    Closed,
}

/// The default timeout on every store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// Refusals worth keeping: who was refused, by which rule, how often and
/// when.
///
/// One event stands for every refusal of one key since the previous event
/// of that key, so that a flood of refusals is one write per key per window,
/// not one per request, and no refusal goes uncounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbuseEvent {
    /// The rule that refused.
    pub rule: Arc<str>,
    /// The client key as the limiter received it (a pseudonym such as an
    /// HMAC of the address, never a raw address when keys come from
    /// client identity).
    pub key: Vec<u8>,
    /// The latest refusal this event stands for.
    pub at: Timestamp,
    /// The earliest refusal this event stands for.
    pub since: Timestamp,
    /// How many refusals this event stands for (at least 1).
    pub refusals: u64,
    /// The store whose decision refused the latest of them.
    pub refused_by: &'static str,
}

/// Somewhere to record refusals (for example a Postgres table with
/// retention).
#[async_trait]
pub trait AbuseSink: Send + Sync + fmt::Debug + 'static {
    /// Records one refusal.
    async fn record(&self, event: AbuseEvent) -> Result<(), StoreError>;
}

/// A durable store consulted by an escalating rule; see
/// [`Rule::with_escalation`].
#[derive(Clone)]
struct Escalation {
    store: Arc<dyn Store>,
    policy: Policy,
    every: u32,
    sink: Option<Arc<dyn AbuseSink>>,
    breaker: Arc<Breaker>,
}

/// Counters of one rule, updated with relaxed atomics on every decision.
#[derive(Debug, Default)]
struct Counters {
    allowed: AtomicU64,
    refused: AtomicU64,
    store_errors: AtomicU64,
    short_circuited: AtomicU64,
    fallbacks: AtomicU64,
    degraded: AtomicU64,
    breaker_opened: AtomicU64,
    escalations: AtomicU64,
    abuse_events: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A snapshot of one rule's counters, from [`Limiter::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleStats {
    /// The rule's name.
    pub rule: Arc<str>,
    /// Requests this rule admitted.
    pub allowed: u64,
    /// Requests this rule refused (by its store, its escalation or its
    /// failure policy).
    pub refused: u64,
    /// Store calls that failed or timed out (the authoritative store, the
    /// fallback and the escalation store).
    pub store_errors: u64,
    /// Calls skipped because the authoritative store's breaker was open.
    pub short_circuited: u64,
    /// Decisions answered by the fallback store.
    pub fallbacks: u64,
    /// Decisions made by the failure policy because no store answered.
    pub degraded: u64,
    /// Times the authoritative store's breaker opened.
    pub breaker_opened: u64,
    /// Sampled requests sent to the escalation store.
    pub escalations: u64,
    /// Abuse events recorded.
    pub abuse_events: u64,
    /// The authoritative store's breaker now.
    pub breaker: BreakerState,
}

/// One tier of a [`Limiter`]: a store, the policy it applies, and what to do
/// when it fails.
#[derive(Clone)]
pub struct Rule {
    name: Arc<str>,
    store: Arc<dyn Store>,
    policy: Policy,
    cost: u32,
    timeout: Duration,
    on_failure: FailurePolicy,
    fallback: Option<Arc<dyn Store>>,
    breaker: Arc<Breaker>,
    escalation: Option<Escalation>,
    counters: Arc<Counters>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("store", &self.store.name())
            .field("policy", &self.policy)
            .field("cost", &self.cost)
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .field("fallback", &self.fallback.as_ref().map(|s| s.name()))
            .field(
                "escalation",
                &self
                    .escalation
                    .as_ref()
                    .map(|e| (e.store.name(), e.policy, e.every)),
            )
            .finish()
    }
}

/// How one guarded call ended.
enum Called {
    Answered(Decision),
    Failed(StoreError),
}

impl Rule {
    /// A rule named `name` applying `policy` in `store`, with cost 1, the
    /// [`DEFAULT_TIMEOUT`], the default [`BreakerConfig`], no fallback and
    /// [`FailurePolicy::Open`].
    ///
    /// Refuses an empty name and a policy the store cannot apply.
    pub fn new(
        name: impl Into<Arc<str>>,
        store: Arc<dyn Store>,
        policy: Policy,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        if name.is_empty() {
            return Err(ConfigError::Invalid("rule name must not be empty".into()));
        }
        if name.as_bytes().contains(&0) {
            return Err(ConfigError::Invalid(
                "rule name must not contain a NUL byte".into(),
            ));
        }
        store.check_policy(&policy)?;
        Ok(Rule {
            name,
            store,
            policy,
            cost: 1,
            timeout: DEFAULT_TIMEOUT,
            on_failure: FailurePolicy::default(),
            fallback: None,
            breaker: Arc::new(Breaker::new(BreakerConfig::default())),
            escalation: None,
            counters: Arc::default(),
        })
    }

    /// Charges `cost` units per request instead of 1. Refuses a cost the
    /// policy (or the escalation policy) could never admit.
    pub fn with_cost(mut self, cost: u32) -> Result<Self, ConfigError> {
        self.policy.check_cost(cost)?;
        if let Some(e) = &self.escalation {
            e.policy.check_cost(cost)?;
        }
        self.cost = cost;
        Ok(self)
    }

    /// Bounds every store call; a call that takes longer is a failure.
    /// Refuses a zero timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() {
            return Err(ConfigError::Invalid("timeout must be positive".into()));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// Replaces the default circuit breaker of the rule's stores.
    pub fn with_breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Arc::new(Breaker::new(config));
        if let Some(e) = &mut self.escalation {
            e.breaker = Arc::new(Breaker::new(config));
        }
        self
    }

    /// What to answer when no store answers.
    pub fn on_failure(mut self, on_failure: FailurePolicy) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Answers the same policy from `fallback` (typically an in-process
    /// store) whenever the rule's store fails, times out or has its breaker
    /// open. The two are never both consulted for one request: the fallback
    /// counts as a side effect, so asking both would double-count an honest
    /// client. Refuses a fallback that cannot apply the policy.
    pub fn with_fallback(mut self, fallback: Arc<dyn Store>) -> Result<Self, ConfigError> {
        fallback.check_policy(&self.policy)?;
        self.fallback = Some(fallback);
        Ok(self)
    }

    /// Makes the rule's store the authoritative local check and consults
    /// `durable` with the stricter `policy` on roughly every `every`-th
    /// admitted request of a key (whenever the count of units admitted in
    /// the local window crosses a multiple of `every`). A refusal by the
    /// durable store refuses the request. Every refusal, local or durable,
    /// is sent to `sink` when one is given. Durable failures never refuse a
    /// request: the local store stays authoritative.
    ///
    /// Refused requests are not sent to the durable store's counter, since
    /// a refusal must never be counted; they are recorded as abuse events.
    pub fn with_escalation(
        mut self,
        durable: Arc<dyn Store>,
        policy: Policy,
        every: u32,
        sink: Option<Arc<dyn AbuseSink>>,
    ) -> Result<Self, ConfigError> {
        if every == 0 {
            return Err(ConfigError::Invalid(
                "escalation sample interval must be at least 1".into(),
            ));
        }
        durable.check_policy(&policy)?;
        policy.check_cost(self.cost)?;
        self.escalation = Some(Escalation {
            store: durable,
            policy,
            every,
            sink,
            breaker: Arc::new(Breaker::new(BreakerConfig::default())),
        });
        Ok(self)
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The rule's authoritative store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// A snapshot of the rule's counters.
    pub fn stats(&self) -> RuleStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RuleStats {
            rule: self.name.clone(),
            allowed: load(&c.allowed),
            refused: load(&c.refused),
            store_errors: load(&c.store_errors),
            short_circuited: load(&c.short_circuited),
            fallbacks: load(&c.fallbacks),
            degraded: load(&c.degraded),
            breaker_opened: load(&c.breaker_opened),
            escalations: load(&c.escalations),
            abuse_events: load(&c.abuse_events),
            breaker: self.breaker.state(),
        }
    }

    /// The key this rule stores for a client key: the rule's name, a NUL
    /// byte, then the client key, so two rules never share state.
    fn storage_key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.name.len() + 1 + key.len());
        k.extend_from_slice(self.name.as_bytes());
        k.push(0);
        k.extend_from_slice(key);
        k
    }

    /// One store call under a timeout, without a breaker.
    async fn timed(
        &self,
        store: &dyn Store,
        key: &[u8],
        policy: &Policy,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let call = store.decide(key, policy, self.cost, now);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::timeout(store.name(), self.timeout)),
        }
    }

    /// One store call under a timeout and a breaker.
    async fn guarded(
        &self,
        store: &dyn Store,
        breaker: &Breaker,
        key: &[u8],
        policy: &Policy,
        now: Timestamp,
    ) -> Called {
        let permit = breaker.permit(now);
        if permit == Permit::Skip {
            return Called::Failed(StoreError::new(
                ErrorKind::CircuitOpen,
                store.name(),
                "breaker open after repeated failures",
            ));
        }
        // If this future is dropped mid-probe, the guard re-opens the
        // breaker; otherwise it would stay half-open and skip for ever.
        let guard = ProbeGuard {
            breaker,
            now,
            armed: permit == Permit::Probe,
        };
        let result = self.timed(store, key, policy, now).await;
        let transition = match &result {
            Ok(_) => breaker.success(),
            // The caller's mistake says nothing about the store's health.
            Err(e) if e.kind() == ErrorKind::InvalidRequest => Transition::None,
            Err(_) => breaker.failure(now),
        };
        guard.disarm();
        match transition {
            Transition::Opened => {
                if std::ptr::eq(breaker, &*self.breaker) {
                    bump(&self.counters.breaker_opened);
                }
                tracing::warn!(rule = %self.name, store = store.name(), "circuit breaker opened");
                #[cfg(feature = "metrics")]
                metrics::counter!("limiter_breaker_transitions_total",
                    "rule" => self.name.to_string(), "store" => store.name(), "to" => "open")
                .increment(1);
            }
            Transition::Closed => {
                tracing::info!(rule = %self.name, store = store.name(), "circuit breaker closed");
                #[cfg(feature = "metrics")]
                metrics::counter!("limiter_breaker_transitions_total",
                    "rule" => self.name.to_string(), "store" => store.name(), "to" => "closed")
                .increment(1);
            }
            Transition::None => {}
        }
        match result {
            Ok(d) => Called::Answered(d),
            Err(e) => {
                bump(&self.counters.store_errors);
                tracing::warn!(rule = %self.name, store = store.name(), error = %e, "store call failed");
                #[cfg(feature = "metrics")]
                metrics::counter!("limiter_store_errors_total",
                    "rule" => self.name.to_string(), "store" => store.name(),
                    "kind" => e.kind().to_string())
                .increment(1);
                Called::Failed(e)
            }
        }
    }

    fn degraded(&self, error: &StoreError) -> Decision {
        bump(&self.counters.degraded);
        tracing::debug!(
            rule = %self.name,
            store = error.store(),
            on_failure = ?self.on_failure,
            "no store answered; failure policy decides"
        );
        let allowed = self.on_failure == FailurePolicy::Open;
        let mut source = Source::store(error.store());
        source.degraded = true;
        Decision {
            allowed,
            limit: self.policy.limit(),
            remaining: 0,
            reset_after: Duration::ZERO,
            // A failed store says nothing about when it will be back; one
            // second keeps well-behaved clients from retrying in a tight loop.
            retry_after: if allowed {
                Duration::ZERO
            } else {
                Duration::from_secs(1)
            },
            source,
        }
    }

    /// The authoritative store, else the fallback, else the failure policy.
    async fn decide_local(&self, key: &[u8], now: Timestamp) -> Decision {
        let error = match self
            .guarded(self.store.as_ref(), &self.breaker, key, &self.policy, now)
            .await
        {
            Called::Answered(d) => return d,
            Called::Failed(e) => e,
        };
        if error.kind() == ErrorKind::CircuitOpen {
            bump(&self.counters.short_circuited);
        }
        if error.kind() == ErrorKind::InvalidRequest {
            return self.degraded(&error);
        }
        let Some(fallback) = &self.fallback else {
            return self.degraded(&error);
        };
        match self.timed(fallback.as_ref(), key, &self.policy, now).await {
            Ok(mut d) => {
                bump(&self.counters.fallbacks);
                d.source.fallback = true;
                #[cfg(feature = "metrics")]
                metrics::counter!("limiter_fallbacks_total", "rule" => self.name.to_string())
                    .increment(1);
                d
            }
            Err(e) => {
                bump(&self.counters.store_errors);
                tracing::warn!(rule = %self.name, store = fallback.name(), error = %e, "fallback store failed");
                self.degraded(&e)
            }
        }
    }

    async fn record_abuse(
        &self,
        escalation: &Escalation,
        key: &[u8],
        d: &Decision,
        now: Timestamp,
    ) {
        let Some(sink) = &escalation.sink else { return };
        let event = AbuseEvent {
            rule: self.name.clone(),
            key: key.to_vec(),
            at: now,
            since: now,
            refusals: 1,
            refused_by: d.source.store,
        };
        match tokio::time::timeout(self.timeout, sink.record(event)).await {
            Ok(Ok(())) => bump(&self.counters.abuse_events),
            Ok(Err(e)) => {
                bump(&self.counters.store_errors);
                tracing::warn!(rule = %self.name, error = %e, "recording an abuse event failed");
            }
            Err(_) => {
                bump(&self.counters.store_errors);
                tracing::warn!(rule = %self.name, "recording an abuse event timed out");
            }
        }
    }

    async fn escalate(
        &self,
        escalation: &Escalation,
        client_key: &[u8],
        key: &[u8],
        local: Decision,
        now: Timestamp,
    ) -> Decision {
        if !local.allowed {
            self.record_abuse(escalation, client_key, &local, now).await;
            return local;
        }
        let after = u64::from(local.limit.saturating_sub(local.remaining));
        let before = after.saturating_sub(u64::from(self.cost));
        let every = u64::from(escalation.every);
        if after / every == before / every {
            return local;
        }
        bump(&self.counters.escalations);
        match self
            .guarded(
                escalation.store.as_ref(),
                &escalation.breaker,
                key,
                &escalation.policy,
                now,
            )
            .await
        {
            Called::Answered(mut durable) if !durable.allowed => {
                durable.source.escalated = true;
                self.record_abuse(escalation, client_key, &durable, now)
                    .await;
                durable
            }
            Called::Answered(_) => {
                let mut local = local;
                local.source.escalated = true;
                local
            }
            Called::Failed(_) => local,
        }
    }

    /// Applies this rule alone to `key` at the clock's current time,
    /// following its fallback, escalation and failure policy.
    pub async fn check(&self, key: &[u8], clock: &dyn Clock) -> Decision {
        let now = clock.now();
        let storage_key = self.storage_key(key);
        let mut decision = self.decide_local(&storage_key, now).await;
        if let Some(escalation) = &self.escalation {
            decision = self
                .escalate(escalation, key, &storage_key, decision, now)
                .await;
        }
        decision.source.rule = Some(self.name.clone());
        if decision.allowed {
            bump(&self.counters.allowed);
        } else {
            bump(&self.counters.refused);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("limiter_decisions_total",
            "rule" => self.name.to_string(),
            "outcome" => if decision.allowed { "allowed" } else { "refused" },
            "store" => decision.source.store)
        .increment(1);
        decision
    }
}

struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    now: Timestamp,
    armed: bool,
}

impl ProbeGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.abandon_probe(self.now);
        }
    }
}

/// An ordered list of [`Rule`]s sharing one clock. Each request goes through
/// the rules in order; the first refusal wins and later rules are not
/// consulted, so a request refused by a local tier costs no network call.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use limiter_core::{Limiter, ManualClock, Policy, Rule};
/// # use limiter_core::{Capabilities, Decision, Store, StoreError, Timestamp, Algorithm};
/// # #[derive(Debug)] struct Allow;
/// # #[async_trait::async_trait] impl Store for Allow {
/// #   fn name(&self) -> &'static str { "allow" }
/// #   fn capabilities(&self) -> Capabilities { Capabilities { algorithms: &Algorithm::ALL,
/// #     key_capacity: None, shared: false, server_clock: false } }
/// #   async fn decide(&self, _: &[u8], p: &Policy, _: u32, _: Timestamp) -> Result<Decision, StoreError> {
/// #     let mut s = None; let v = limiter_core::algorithm::apply(&mut s, p, 1, 0);
/// #     Ok(Decision::from_verdict(v, p, "allow")) } }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store: Arc<dyn limiter_core::Store> = Arc::new(Allow);
/// let limiter = Limiter::builder()
///     .clock(ManualClock::new())
///     .rule(Rule::new("search", store, Policy::sliding_log(60, Duration::from_secs(60))?)?)
///     .build()?;
/// let decision = limiter.check(b"client:1").await;
/// assert!(decision.allowed);
/// # Ok::<(), limiter_core::ConfigError>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    rules: Arc<[Rule]>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.rules)
            .field("clock", &self.clock)
            .finish()
    }
}

impl Limiter {
    /// A builder with the system clock and no rules.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder {
            rules: Vec::new(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The rules, in the order they are applied.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The clock every decision reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A snapshot of every rule's counters, in rule order.
    pub fn stats(&self) -> Vec<RuleStats> {
        self.rules.iter().map(Rule::stats).collect()
    }

    /// Decides one request for `key`. Never fails: a store error becomes a
    /// decision under the failing rule's fallback or [`FailurePolicy`].
    ///
    /// Returns the first refusal, or when every rule admits, the admitting
    /// decision with the fewest units remaining (the one a client should
    /// see in rate-limit headers). A rule admitted by its failure policy
    /// knows nothing of the client's quota, so it is shown only when no
    /// store answered at all.
    pub async fn check(&self, key: &[u8]) -> Decision {
        let mut tightest: Option<Decision> = None;
        for rule in self.rules.iter() {
            let decision = rule.check(key, self.clock.as_ref()).await;
            if !decision.allowed {
                return decision;
            }
            let tighter = match &tightest {
                None => true,
                Some(t) => match (t.source.degraded, decision.source.degraded) {
                    (true, false) => true,
                    (false, true) => false,
                    _ => decision.remaining < t.remaining,
                },
            };
            if tighter {
                tightest = Some(decision);
            }
        }
        // The builder refuses a limiter without rules.
        tightest.expect("a limiter has at least one rule")
    }
}

/// Builds a [`Limiter`].
#[derive(Debug)]
pub struct LimiterBuilder {
    rules: Vec<Rule>,
    clock: Arc<dyn Clock>,
}

impl LimiterBuilder {
    /// Appends a rule; rules apply in the order they are added.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Uses `clock` instead of the system clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Uses a shared clock.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Builds the limiter. Refuses an empty rule list and duplicate rule
    /// names (they would share state).
    pub fn build(self) -> Result<Limiter, ConfigError> {
        if self.rules.is_empty() {
            return Err(ConfigError::Invalid(
                "a limiter needs at least one rule".into(),
            ));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if self.rules[..i].iter().any(|r| r.name == rule.name) {
                return Err(ConfigError::Invalid(format!(
                    "two rules are named {:?}",
                    rule.name
                )));
            }
        }
        Ok(Limiter {
            rules: self.rules.into(),
            clock: self.clock,
        })
    }
}
