//! Composition: a limiter made of ordered rules, each a store with its own
//! policy, timeout, circuit breaker, fallback and failure policy.
//!
//! A rate limiter in production is usually a fast local check in front of a
//! shared or durable one, and the shared store must never become the outage.
//! Every invariant a single store keeps holds for a whole [`Limiter`]:
//!
//! * **Tiers** — a [`Limiter`] applies its [`Rule`]s in order; the first
//!   refusal wins and later rules are not consulted, so a request refused by
//!   a local tier costs no network call. **A request refused by any rule is
//!   recorded by no rule**: the admissions earlier rules made for it are
//!   undone with [`Store::refund`] (on the refusal path only; the admit path
//!   makes no extra call), so a client that waits the `Retry-After` it was
//!   given is not refused by the units its refused requests left behind.
//! * **Fallback** — [`Rule::with_fallback`]: the rule's store is
//!   authoritative; when it fails, times out or its breaker is open, the same
//!   policy is answered by the fallback store. The fallback is consulted only
//!   then, so exactly one store counts each request.
//! * **Failure policy** — [`FailurePolicy`] when no store answers; every call
//!   bounded by the rule's timeout; a [`BreakerConfig`] per store so a dead
//!   store costs one timeout per cool-down, not one per request. Cool-downs
//!   run on the clock's monotonic reading. A store that answers inline
//!   ([`Store::decide_inline`], the memory store) cannot hang, so its calls
//!   get neither timeout nor breaker: a local tier costs its own decision
//!   and little else.
//! * **Escalation** — [`Rule::with_escalation`]: the local store is
//!   authoritative and a durable store is consulted with a stricter policy
//!   on exactly one admitted request in every `every`, at a position drawn
//!   at random in each run of `every`, whatever the clients' pace. A durable
//!   refusal refuses that request and refunds its local unit. Refusals go to
//!   an [`AbuseSink`] as [`AbuseEvent`]s: at most one write per key per
//!   window of the rule's policy, each carrying the number of refusals it
//!   stands for, behind its own breaker and the rule's timeout.
//! * **Refusal cache** — [`Rule::with_refusal_cache`], on by default for a
//!   shared store: after the store refuses a key, the key is refused locally
//!   until the retry time it gave, before any tier is asked, so a hammering
//!   offender costs no round trip and no local admit-and-refund.
//!
//! # Over-admission bounds
//!
//! For a fleet of `N` instances sharing one server, in one window of a
//! policy with limit `L` (cost 1):
//!
//! | composition | admitted at most |
//! |---|---|
//! | shared store only (fail closed) | `L` |
//! | memory tier (limit `M`) in front of the shared store | `min(N·M, L)` |
//! | shared store, fallback to local | `L`, plus `L` per instance for each window in which the shared store failed (each local store counts alone; a key the shared store refused before the outage stays refused by the refusal cache until its retry time) |
//! | local store only | `N·L` |
//! | escalation, durable limit `D` | `N·L`: escalation samples and records abuse, it does not cap a fleet; the durable store admits at most `D` of the sampled requests, and each one it refuses is refused and its local unit refunded |
//!
//! The `ratewarden` crate's `fleet_bound` test measures every row with `N = 4`
//! instances sharing real Redis and Postgres servers, and
//! `ratewarden-conformance`'s composition scenarios attack each guarantee above.
//!
//! A call that times out may already have been applied by the store, so a
//! request whose authoritative call timed out and was then answered by the
//! fallback can be counted by both, and a timed-out admission cannot be
//! refunded; both need a store slower than its timeout, and both err on the
//! strict side. A refund that fails leaves the earlier rule's count as it
//! was: stricter, never more permissive ([`RuleStats::refund_failures`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::decision::{Decision, Source};
use crate::error::ConfigError;
use crate::time::{Clock, SystemClock};

pub(crate) mod rule;
mod stats;

use rule::{Applied, Charge, StorageKey, micros};
pub use rule::{MAX_RULE_NAME, Rule};
pub use stats::RuleStats;

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

/// The default bound on every call a rule makes ([`Rule::with_timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// An ordered list of [`Rule`]s sharing one clock. Each request goes through
/// the rules in order; the first refusal wins, later rules are not
/// consulted, and what earlier rules admitted for the refused request is
/// refunded, so that a refused request is recorded by no rule.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ratewarden_core::{Limiter, ManualClock, Policy, Rule};
/// # use ratewarden_core::{Capabilities, Decision, Store, StoreError, Timestamp, Algorithm};
/// # #[derive(Debug)] struct Allow;
/// # #[async_trait::async_trait] impl Store for Allow {
/// #   fn name(&self) -> &'static str { "allow" }
/// #   fn capabilities(&self) -> Capabilities { Capabilities { algorithms: &Algorithm::ALL,
/// #     key_capacity: None, shared: false, server_clock: false } }
/// #   async fn decide(&self, _: &[u8], p: &Policy, _: u32, _: Timestamp) -> Result<Decision, StoreError> {
/// #     let mut s = None; let v = ratewarden_core::algorithm::apply(&mut s, p, 1, 0);
/// #     Ok(Decision::from_verdict(v, p, "allow")) } }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store: Arc<dyn ratewarden_core::Store> = Arc::new(Allow);
/// let limiter = Limiter::builder()
///     .clock(ManualClock::new())
///     .rule(Rule::new("search", store, Policy::sliding_log(60, Duration::from_secs(60))?)?)
///     .build()?;
/// let decision = limiter.check(b"client:1").await;
/// assert!(decision.allowed);
/// # Ok::<(), ratewarden_core::ConfigError>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    rules: Arc<[Rule]>,
    clock: Arc<dyn Clock>,
    /// Some rule has a refusal cache, so each request first asks the caches.
    caches: bool,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.rules)
            .field("clock", &self.clock)
            .finish()
    }
}

/// An admitting rule's charges, kept until the request's fate is known.
/// The storage key is built again on the refusal path rather than carried
/// along the admit path.
struct Pending<'a> {
    rule: &'a Rule,
    charges: SmallVec<[Charge; 2]>,
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

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| &*r.name == name)
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
    /// Returns the first refusal, after refunding what earlier rules
    /// admitted for the request; or when every rule admits, the admitting
    /// decision with the fewest units remaining (the one a client should
    /// see in rate-limit headers). A rule admitted by its failure policy
    /// knows nothing of the client's quota, so it is shown only when no
    /// store answered at all.
    pub async fn check(&self, key: &[u8]) -> Decision {
        match self.check_inline(key) {
            Some(decision) => decision,
            // Whatever made it fail (a store that must be awaited, or an
            // error), the rule's full path asks the store again.
            None => self.decide(key, 1, self.inline_rule().is_some()).await,
        }
    }

    /// The one rule of a limiter that [`check_inline`](Self::check_inline)
    /// can answer, if it is one.
    fn inline_rule(&self) -> Option<&Rule> {
        // One rule: a later rule that needed awaiting could not be told
        // apart from this one until this one had counted the request.
        match &*self.rules {
            [rule] if !self.caches && rule.escalation.is_none() => Some(rule),
            _ => None,
        }
    }

    /// [`check`](Self::check) answered at once, without a future, where no
    /// waiting could be needed: a limiter of one rule, with no escalation
    /// and no refusal cache, whose store answers
    /// [`Store::decide_inline`](crate::Store::decide_inline) (a memory
    /// store). `None` otherwise, with nothing decided or counted: then
    /// `check` decides.
    ///
    /// The same decision `check` gives, and the same counters and metrics;
    /// it exists so that a caller on a hot path (an HTTP layer) can skip
    /// building a future for a decision that needs none. A store error is
    /// left to `check`, which applies the rule's fallback or failure policy.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Limiter, ManualClock, Policy, Rule};
    /// # use ratewarden_core::{Capabilities, Decision, Store, StoreError, Timestamp, Algorithm};
    /// # #[derive(Debug)] struct Local;
    /// # #[async_trait::async_trait] impl Store for Local {
    /// #   fn name(&self) -> &'static str { "local" }
    /// #   fn capabilities(&self) -> Capabilities { Capabilities { algorithms: &Algorithm::ALL,
    /// #     key_capacity: None, shared: false, server_clock: false } }
    /// #   async fn decide(&self, k: &[u8], p: &Policy, c: u32, n: Timestamp) -> Result<Decision, StoreError> {
    /// #     self.decide_inline(k, p, c, n).unwrap() }
    /// #   fn decide_inline(&self, _: &[u8], p: &Policy, c: u32, _: Timestamp) -> Option<Result<Decision, StoreError>> {
    /// #     let mut s = None; let v = ratewarden_core::algorithm::apply(&mut s, p, c, 0);
    /// #     Some(Ok(Decision::from_verdict(v, p, "local"))) } }
    /// // A store that answers inline, such as ratewarden_memory::MemoryStore.
    /// let store: Arc<dyn ratewarden_core::Store> = Arc::new(Local);
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(Rule::new("search", store, Policy::gcra(60, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let decision = limiter.check_inline(b"client:1").expect("a local store answers at once");
    /// assert!(decision.allowed);
    /// assert_eq!(limiter.stats()[0].allowed, 1);
    /// # Ok::<(), ratewarden_core::ConfigError>(())
    /// ```
    pub fn check_inline(&self, key: &[u8]) -> Option<Decision> {
        let rule = self.inline_rule()?;
        let now = self.clock.now();
        let mut buf = StorageKey::new();
        let storage_key = rule.fill_storage_key(&mut buf, key);
        let answer = rule
            .store
            .decide_inline(storage_key, &rule.policy, rule.cost, now);
        let Some(Ok(stored)) = &answer else {
            return None;
        };
        let mut decision = copied(stored);
        rule.finish(&mut decision);
        Some(decision)
    }

    /// [`check`](Self::check) for a request that weighs `weight` units: each
    /// rule charges `weight` times its own cost ([`Rule::with_cost`]), and
    /// refunds as much if a later rule refuses.
    ///
    /// Refuses with [`ConfigError::InvalidCost`], before any store is asked
    /// and charging nothing, a weight that some rule could never admit: zero,
    /// or a charge above the rule's limit (or its escalation policy's).
    /// Such a request is not refused *for now*: no wait would ever admit it,
    /// so it gets no decision and no retry time.
    pub async fn check_cost(&self, key: &[u8], weight: u32) -> Result<Decision, ConfigError> {
        for rule in self.rules.iter() {
            let charge = rule
                .cost
                .checked_mul(weight)
                .ok_or(ConfigError::InvalidCost {
                    cost: weight,
                    limit: rule.policy.limit(),
                })?;
            rule.policy.check_cost(charge)?;
            if let Some(e) = &rule.escalation {
                e.policy.check_cost(charge)?;
            }
        }
        Ok(self.decide(key, weight, false).await)
    }

    /// `weight` was checked against every rule: their charges cannot
    /// overflow. `asked_inline`: [`check_inline`](Self::check_inline) has
    /// just asked the one rule's store, which did not answer inline.
    async fn decide(&self, key: &[u8], weight: u32, asked_inline: bool) -> Decision {
        let now = self.clock.now();
        // A standing refusal from any rule's cache answers before any store
        // is asked, so a hammering offender costs no round trip and no
        // local tier's admit-then-refund either.
        if self.caches {
            for rule in self.rules.iter() {
                if let Some(d) = rule.cached_refusal(key, now, self.clock.as_ref()).await {
                    return d;
                }
            }
        }
        let clock = self.clock.as_ref();
        let mut buf = StorageKey::new();
        let last = self.rules.len() - 1;
        let mut pending: SmallVec<[Pending<'_>; 3]> = SmallVec::new();
        let mut tightest: Option<Decision> = None;
        for (i, rule) in self.rules.iter().enumerate() {
            let storage_key = rule.fill_storage_key(&mut buf, key);
            let cost = rule.cost * weight;
            // A rule answered inline (a local tier, or a dead store's open
            // breaker) is decided without building its future, whose size
            // alone made moving it cost more than the store's own decision.
            let inline =
                rule.apply_inline(key, storage_key, cost, now, clock, i < last, asked_inline);
            let applied = match inline {
                Some(applied) => applied,
                // Boxed: a rule that must be awaited is a round trip away,
                // beside which one allocation is nothing, and its state
                // would otherwise be part of every `check`'s future (two
                // admitting memory tiers took 13-15 % longer with it
                // unboxed). A rule whose store is down and whose breaker is
                // open is answered inline above, unless its fallback must be
                // awaited.
                None => Box::pin(rule.apply(key, storage_key, cost, now, clock, i < last)).await,
            };
            let Applied {
                mut decision,
                charges,
            } = applied;
            rule.finish(&mut decision);
            // One rule, the common case: nothing to refund, no tightest to
            // pick.
            if last == 0 {
                return decision;
            }
            if !decision.allowed {
                for p in pending.iter().rev() {
                    let storage_key = p.rule.fill_storage_key(&mut buf, key);
                    let cost = p.rule.cost * weight;
                    p.rule.refund(storage_key, &p.charges, cost, now).await;
                }
                return decision;
            }
            if i < last && !charges.is_empty() {
                pending.push(Pending { rule, charges });
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

    /// Writes every abuse event held back in memory (refusals counted since
    /// each key's last event), so that none is lost: call it at shutdown,
    /// and periodically if keys may stay quiet for long. Returns how many
    /// events were written.
    pub async fn flush_abuse_events(&self) -> u64 {
        let mono = micros(self.clock.monotonic());
        let mut written = 0;
        for rule in self.rules.iter() {
            if let Some(recorder) = rule.escalation.as_ref().and_then(|e| e.abuse.as_ref()) {
                let writes = recorder.flush(mono, rule.timeout).await;
                written += writes.written;
                rule.count_writes(writes);
            }
        }
        written
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
        let caches = self.rules.iter().any(|r| r.refusals.is_some());
        Ok(Limiter {
            rules: self.rules.into(),
            clock: self.clock,
            caches,
        })
    }
}

/// `decision`, copied field by field from where the store's call has just
/// written it. Moved as a whole, it was copied in 16- and 4-byte pieces that
/// each spanned several of the narrower stores that wrote it, which the CPU
/// cannot forward to a load: two stalls that took a third of
/// `check_inline`'s own samples (`perf annotate`). Copied this way, the
/// durations and the flags are read as they were written; the compiler
/// still reads `limit` and `remaining` in one load, the one stall left.
#[inline(always)]
fn copied(decision: &Decision) -> Decision {
    let source = &decision.source;
    Decision {
        allowed: decision.allowed,
        limit: decision.limit,
        remaining: decision.remaining,
        reset_after: Duration::new(
            decision.reset_after.as_secs(),
            decision.reset_after.subsec_nanos(),
        ),
        retry_after: Duration::new(
            decision.retry_after.as_secs(),
            decision.retry_after.subsec_nanos(),
        ),
        source: Source {
            store: source.store,
            rule: source.rule,
            fallback: source.fallback,
            degraded: source.degraded,
            escalated: source.escalated,
            cached: source.cached,
        },
    }
}
