//! Composition: a limiter made of ordered rules, each a store with its own
//! policy, timeout and failure policy.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::policy::Policy;
use crate::store::Store;
use crate::time::{Clock, SystemClock};

/// What a rule answers when its store fails or exceeds its timeout.
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
            .finish()
    }
}

impl Rule {
    /// A rule named `name` applying `policy` in `store`, with cost 1, the
    /// [`DEFAULT_TIMEOUT`] and [`FailurePolicy::Open`].
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
        store.check_policy(&policy)?;
        Ok(Rule {
            name,
            store,
            policy,
            cost: 1,
            timeout: DEFAULT_TIMEOUT,
            on_failure: FailurePolicy::default(),
        })
    }

    /// Charges `cost` units per request instead of 1. Refuses a cost the
    /// policy could never admit.
    pub fn with_cost(mut self, cost: u32) -> Result<Self, ConfigError> {
        self.policy.check_cost(cost)?;
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

    /// What to answer when the store fails.
    pub fn on_failure(mut self, on_failure: FailurePolicy) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The rule's store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
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

    async fn call(&self, key: &[u8], clock: &dyn Clock) -> Result<Decision, StoreError> {
        let now = clock.now();
        let storage_key = self.storage_key(key);
        let call = self
            .store
            .decide(&storage_key, &self.policy, self.cost, now);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::timeout(self.store.name(), self.timeout)),
        }
    }

    fn degraded(&self, error: &StoreError) -> Decision {
        tracing::warn!(
            rule = %self.name,
            store = self.store.name(),
            error = %error,
            on_failure = ?self.on_failure,
            "store failed; failure policy decides"
        );
        let allowed = self.on_failure == FailurePolicy::Open;
        let mut source = crate::decision::Source::store(self.store.name());
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

    /// Applies this rule alone to `key`, following its failure policy.
    pub async fn check(&self, key: &[u8], clock: &dyn Clock) -> Decision {
        let mut decision = match self.call(key, clock).await {
            Ok(d) => d,
            Err(e) => self.degraded(&e),
        };
        decision.source.rule = Some(self.name.clone());
        decision
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

    /// Decides one request for `key`. Never fails: a store error becomes a
    /// decision under the failing rule's [`FailurePolicy`].
    ///
    /// Returns the first refusal, or when every rule admits, the admitting
    /// decision with the fewest units remaining (the one a client should
    /// see in rate-limit headers).
    pub async fn check(&self, key: &[u8]) -> Decision {
        let mut tightest: Option<Decision> = None;
        for rule in self.rules.iter() {
            let decision = rule.check(key, self.clock.as_ref()).await;
            if !decision.allowed {
                return decision;
            }
            if tightest
                .as_ref()
                .is_none_or(|t| decision.remaining < t.remaining)
            {
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
