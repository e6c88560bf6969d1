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
//!   offender costs no round trip and no local admit-and-refund. A
//!   give-back or a reset of the key makes its cached refusals stale in
//!   every limiter in front of the same store, one decided before it and delivered
//!   after it included.
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

// About 1,150 lines, 65 of them these docs: the `Limiter`, its builder and
// the one path a request takes through its rules, with the `Admission` it
// hands back, kept together so that a reader follows a request without
// changing files. A rule's own side is `limiter/rule`, waiting `limiter/wait`.
//
// A request's road, top to bottom in this file: an entry (`check`,
// `try_check`, `check_cost`, `try_check_cost`, `check_admission`) checks
// the cost once (`validate_cost`) and calls `begin`, which takes the road
// fixed at build (`Road`). `begin` itself (one rule) and `tiers` decide
// rules whose stores answer inline and hand anything else, as far as it has gone, to
// the general road as a `Progress`: `advance` takes it as far as it goes
// without waiting, `run_awaited` awaits one rule at a time and calls
// `advance` again. `absorb` takes each rule's decision in; a refusal after
// admissions turns the road to their refunds (`Next::Refund`). A rule's
// own steps (`Rule::local_now`, then `Rule::resume`) are `limiter/rule`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tracing::Instrument;

use crate::decision::{Decision, Source};
use crate::error::{ConfigError, StoreError};
use crate::invalidation::Ticket;
use crate::time::{Clock, SystemClock, Timestamp, duration_to_micros as micros};

pub(crate) mod rule;
mod stats;
mod trace;
mod wait;

use crate::failure::FailurePolicy;
use rule::{Applied, Charge, Holder, Local, StorageKey, Tried};
pub use rule::{MAX_RULE_NAME, Rule};
pub use stats::RuleStats;
pub use wait::{MIN_RETRY, Permit, WaitError};

use trace::Traced;

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
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// // Any store: ratewarden_memory::MemoryStore, a Redis or Postgres store.
/// let store: Arc<dyn ratewarden_core::Store> = Arc::new(ratewarden_memory::MemoryStore::default());
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
    /// Some rule with a refusal cache writes abuse events, so asking the
    /// caches may wait on a sink.
    caches_wait: bool,
    /// The road every request takes, from what the rules need.
    road: Road,
    /// The largest cost every rule can admit, so that a valid cost is
    /// checked with one comparison.
    max_cost: u32,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.rules)
            .field("clock", &self.clock)
            .finish()
    }
}

/// The progress of `$limiter.begin($key, $cost)`, or, when it decided,
/// `return $answer(decision)` from the enclosing function; in a
/// `ratewarden.decision` span ([`Limiter::begin_in_span`]) when a
/// subscriber wants one. The two roads are matched apart: one `match` of
/// either road's answer made every decision a copy of it, about 60
/// instructions (callgrind of the composition bench).
macro_rules! begun_or_return {
    ($limiter:ident, $key:expr, $cost:expr, $answer:expr) => {
        if trace::wanted() {
            match $limiter.begin_in_span($key, $cost) {
                Begun::Decided(decision) => return $answer(decision),
                Begun::Waiting(progress) => progress,
            }
        } else {
            match $limiter.begin($key, $cost) {
                Begun::Decided(decision) => return $answer(decision),
                Begun::Waiting(progress) => progress,
            }
        }
    };
}

/// The road a request takes through a limiter's rules, chosen when the
/// limiter is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Road {
    /// One rule with no refusal cache and no escalation, most limiters:
    /// decided in [`begin`](Limiter::begin) itself.
    OneRule,
    /// Several such rules: [`tiers`](Limiter::tiers).
    Tiers,
    /// Refusal caches or escalations: a [`Progress`] taken through
    /// [`advance`](Limiter::advance) and [`run_awaited`](Limiter::run_awaited).
    Steps,
}

/// How far a request's decision has gone: the rules before `next` have
/// decided, and what they admitted is kept until the request's fate is
/// known. [`Limiter::advance`] takes it as far as it goes without waiting,
/// [`Limiter::run_awaited`] the rest.
pub(crate) struct Progress {
    now: Timestamp,
    /// Taken before the current rule's store is asked: its refusal is
    /// cached only if that rule's key was not given back since.
    ticket: Ticket,
    cost: u32,
    next: Next,
    /// Each admission a later refusal must undo, with its rule's index, in
    /// rule order. The storage key is built again on the refusal path
    /// rather than carried along the admit path.
    pending: Kept,
    /// The admitting decision with the fewest units remaining, so far:
    /// an enforcing rule's if any has admitted, else a shadow rule's.
    tightest: Option<Decision>,
    /// `tightest` is a shadow rule's.
    tightest_shadow: bool,
    /// A rule in shadow mode refused the request, and was not let to.
    shadow_refused: bool,
    /// Keep the last rule's admission too, for an [`Admission`] to give
    /// back after the request is decided.
    keep_all: bool,
    /// The decision's span, if a subscriber wants one, closed when the
    /// decision is made.
    traced: Traced,
}

/// Admissions by rule index: those a later refusal must undo, or all of a
/// request's for an [`Admission`].
type Kept = SmallVec<[(usize, Charge); 3]>;

/// What a [`Progress`] does next.
enum Next {
    /// Ask every rule's refusal cache.
    Caches,
    /// Take rule `i`'s first step.
    Step(usize),
    /// Await what rule `i`'s step left.
    Resume(usize, Tried),
    /// Undo the pending admissions, then answer this refusal.
    Refund(Decision),
}

/// How [`Limiter::begin`] left a request.
// Returned once per request and built in place; boxing the progress would
// cost the awaited path a second allocation.
#[allow(clippy::large_enum_variant)]
enum Begun {
    Decided(Decision),
    Waiting(Progress),
}

/// What one rule's decision did to a request's [`Progress`].
enum Absorbed {
    /// The request is decided.
    Decided(Decision),
    /// `next` says what comes next.
    Going,
}

/// A decision that could not be made without waiting on a store, from
/// [`Limiter::try_check`]: await [`decide`](Self::decide) for it. It owns
/// what it needs (a handle on the limiter and the client key), so it can be
/// moved into a spawned or boxed future; the store calls already made for
/// it are not made again.
pub struct PendingCheck(Box<Waiting>);

/// What a [`PendingCheck`] holds, in one allocation: a client key of up to
/// 64 bytes (an HMAC client key is 32) is held in place.
struct Waiting {
    limiter: Limiter,
    key: SmallVec<[u8; 64]>,
    progress: Progress,
}

impl fmt::Debug for PendingCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingCheck").finish_non_exhaustive()
    }
}

impl PendingCheck {
    /// Waits on the stores still to answer and returns the decision, exactly
    /// as [`Limiter::check`] would have.
    pub async fn decide(self) -> Decision {
        let Waiting {
            limiter,
            key,
            progress,
        } = *self.0;
        limiter.run_awaited(&key, progress).await.0
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

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name() == name)
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
    ///
    /// Each rule's store is asked inline ([`Store::decide_inline`]) at most
    /// once. A request that no store makes wait is decided before the
    /// future is first polled ends its work; one that must wait boxes the
    /// awaited part, once.
    ///
    /// [`Store::decide_inline`]: crate::Store::decide_inline
    pub async fn check(&self, key: &[u8]) -> Decision {
        // Matched before the await, so that what `begin` returns is not kept
        // in this future's state: a match's scrutinee lives to its end.
        let progress = begun_or_return!(self, key, 1, std::convert::identity);
        // Boxed: the awaited path is a round trip away, beside which one
        // allocation is nothing, and its state (timers, refunds, abuse
        // writes) would otherwise be part of every `check`'s future.
        Box::pin(self.run_awaited(key, progress)).await.0
    }

    /// [`begin`](Self::begin) in a `ratewarden.decision` span, for a
    /// subscriber that wants one ([`trace::wanted`]): closed here for a
    /// decision made, carried in the progress to
    /// [`run_awaited`](Self::run_awaited) otherwise.
    #[cold]
    fn begin_in_span(&self, key: &[u8], cost: u32) -> Begun {
        let traced = Traced::start(cost);
        match self.begin(key, cost) {
            Begun::Decided(decision) => {
                traced.end(&decision);
                Begun::Decided(decision)
            }
            Begun::Waiting(mut progress) => {
                progress.traced = traced;
                Begun::Waiting(progress)
            }
        }
    }

    /// [`check`](Self::check) without a future where none is needed: the
    /// decision, made and counted, if no store had to be awaited (rules on
    /// in-process stores, a refusal cache's answer, a dead store's open
    /// breaker); otherwise a [`PendingCheck`] to await, carrying what was
    /// already done, so that nothing is asked twice. The same decisions,
    /// counters and metrics as `check`.
    ///
    /// A caller on a hot path (an HTTP layer) uses it to skip building a
    /// future for a decision that needs none.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Limiter, ManualClock, Policy, Rule};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// // A memory store answers inline; this example store is awaited.
    /// let store: Arc<dyn ratewarden_core::Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(Rule::new("search", store, Policy::gcra(60, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let decision = match limiter.try_check(b"client:1") {
    ///     Ok(decision) => decision,               // decided and counted, no future
    ///     Err(pending) => pending.decide().await, // a store to wait on
    /// };
    /// assert!(decision.allowed);
    /// assert_eq!(limiter.stats()[0].allowed, 1);
    /// # Ok::<(), ratewarden_core::ConfigError>(()) }).unwrap();
    /// ```
    pub fn try_check(&self, key: &[u8]) -> Result<Decision, PendingCheck> {
        self.try_begin(key, 1)
    }

    /// [`try_check`](Self::try_check) for a request that costs `cost`
    /// units, as [`check_cost`](Self::check_cost) decides it: refuses what
    /// `check_cost` refuses, with the same error and before any store is
    /// asked; otherwise the decision, or a [`PendingCheck`] to await.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{ConfigError, Limiter, ManualClock, Policy, Rule};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn ratewarden_core::Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(Rule::new("upload", store, Policy::fixed_window(10, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let decision = match limiter.try_check_cost(b"client:1", 4)? {
    ///     Ok(decision) => decision,
    ///     Err(pending) => pending.decide().await,
    /// };
    /// assert_eq!(decision.remaining, 6);
    /// // No wait could ever admit 11 units of a limit of 10.
    /// assert!(matches!(limiter.try_check_cost(b"client:1", 11), Err(ConfigError::InvalidCost { .. })));
    /// # Ok::<(), ConfigError>(()) }).unwrap();
    /// ```
    pub fn try_check_cost(
        &self,
        key: &[u8],
        cost: u32,
    ) -> Result<Result<Decision, PendingCheck>, ConfigError> {
        self.validate_cost(cost)?;
        Ok(self.try_begin(key, cost))
    }

    /// Refuses a cost some rule could never admit: zero, or more units than
    /// its limit (or its escalation policy's). Every entry that takes a
    /// cost calls it first, so nothing past it checks a cost again.
    fn validate_cost(&self, cost: u32) -> Result<(), ConfigError> {
        if cost != 0 && cost <= self.max_cost {
            return Ok(());
        }
        // The rule that refuses it names its own limit in the error.
        for rule in self.rules.iter() {
            rule.check_cost(cost)?;
        }
        Ok(())
    }

    fn try_begin(&self, key: &[u8], cost: u32) -> Result<Decision, PendingCheck> {
        let progress = begun_or_return!(self, key, cost, Ok);
        Err(PendingCheck(Box::new(Waiting {
            limiter: self.clone(),
            key: SmallVec::from_slice(key),
            progress,
        })))
    }

    /// [`check`](Self::check) for a request that costs `cost` units: each
    /// rule charges `cost` times its own units per request
    /// ([`Rule::with_units_per_request`]), and
    /// refunds as much if a later rule refuses.
    ///
    /// Refuses with [`ConfigError::InvalidCost`], before any store is asked
    /// and charging nothing, a cost that some rule could never admit: zero,
    /// or a charge above the rule's limit (or its escalation policy's).
    /// Such a request is not refused *for now*: no wait would ever admit it,
    /// so it gets no decision and no retry time.
    pub async fn check_cost(&self, key: &[u8], cost: u32) -> Result<Decision, ConfigError> {
        self.validate_cost(cost)?;
        let progress = begun_or_return!(self, key, cost, Ok);
        Ok(Box::pin(self.run_awaited(key, progress)).await.0)
    }

    /// [`check_cost`](Self::check_cost) for a request whose fate is known
    /// only later: the decision, as an [`Admission`] that can be given back
    /// ([`Admission::refund`]) once the request turns out not to count. A
    /// login form that counts only failed attempts decides each attempt
    /// before checking the password (a refused client never reaches the
    /// check) and gives the admission back when the password was right.
    ///
    /// Exact under concurrency on every store: each rule that counted the
    /// request refunds its own admission ([`Store::refund`](crate::Store::refund)).
    /// Until it is given back, the admission is counted, as any request in
    /// flight is. Refuses what `check_cost` refuses.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(Rule::new("login", store, Policy::fixed_window(3, Duration::from_secs(900))?)?)
    ///     .build()?;
    /// for password_ok in [true, true, true, true, false] {
    ///     let attempt = limiter.check_admission(b"alice", 1).await?;
    ///     assert!(attempt.decision().allowed);
    ///     if password_ok {
    ///         attempt.refund().await; // successes do not count
    ///     }
    /// }
    /// assert_eq!(limiter.peek(b"alice").await.remaining, 2); // one failure counted
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn check_admission(&self, key: &[u8], cost: u32) -> Result<Admission, ConfigError> {
        self.validate_cost(cost)?;
        let traced = Traced::start(cost);
        let mut progress = self.start(cost);
        progress.keep_all = true;
        let now = progress.now;
        let (decision, kept) = match self.advance(key, &mut progress) {
            Some(decision) => {
                traced.end(&decision);
                (decision, progress.pending)
            }
            None => {
                progress.traced = traced;
                Box::pin(self.run_awaited(key, progress)).await
            }
        };
        let kept = if decision.allowed { kept } else { Kept::new() };
        Ok(Admission {
            decision,
            limiter: self.clone(),
            key: SmallVec::from_slice(key),
            now,
            cost,
            kept,
        })
    }

    /// The decision [`check`](Self::check) would make for `key` now,
    /// changing nothing: no unit counted in any store, no window opened or
    /// expiry moved, no statistic, no abuse event. Its `remaining` is the
    /// units available now, what the `RateLimit` header's `r` means: a
    /// fresh key of 3 per minute has 3, and a request admitted now would
    /// leave 2. The first rule that
    /// would refuse answers; if all would admit, the one with the fewest
    /// units left, as for `check`. A standing refusal in a rule's refusal
    /// cache answers for that rule; a store that fails or times out leaves
    /// the answer to its fallback, then to its failure policy.
    ///
    /// For telling a client its quota without spending it (an HTTP `GET
    /// /quota`). Each rule's store is asked in turn, one round trip each
    /// for a network store.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(Rule::new("search", store, Policy::fixed_window(3, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// assert_eq!(limiter.peek(b"client:1").await.remaining, 3);
    /// limiter.check(b"client:1").await;
    /// for _ in 0..10 {
    ///     assert_eq!(limiter.peek(b"client:1").await.remaining, 2); // spends nothing
    /// }
    /// assert_eq!(limiter.check(b"client:1").await.remaining, 1);
    /// # Ok::<(), ratewarden_core::ConfigError>(()) }).unwrap();
    /// ```
    pub async fn peek(&self, key: &[u8]) -> Decision {
        self.peek_checked(key, 1).await
    }

    /// [`peek`](Self::peek) for a request that costs `cost` units, as
    /// [`check_cost`](Self::check_cost) would decide it; refuses what
    /// `check_cost` refuses, with the same error.
    pub async fn peek_cost(&self, key: &[u8], cost: u32) -> Result<Decision, ConfigError> {
        self.validate_cost(cost)?;
        Ok(self.peek_checked(key, cost).await)
    }

    async fn peek_checked(&self, key: &[u8], cost: u32) -> Decision {
        let clock = self.clock.as_ref();
        let now = clock.now();
        // As `absorb` decides: a shadow rule's refusal admits, and the
        // enforcing rules' quota is the one shown.
        let mut tightest: Option<(Decision, bool)> = None;
        let mut shadow_refused = false;
        for rule in self.rules.iter() {
            let mut d = rule.peek_at(key, rule.units(cost), now, clock).await;
            let shadow = rule.is_shadow();
            if !d.allowed {
                if !shadow {
                    d.source.shadow_refused = shadow_refused;
                    return d;
                }
                d.allowed = true;
                d.retry_after = Duration::ZERO;
                shadow_refused = true;
            }
            if shown(tightest.as_ref().map(|(t, s)| (t, *s)), &d, shadow) {
                tightest = Some((d, shadow));
            }
        }
        let (mut d, _) = tightest.expect("a limiter has at least one rule");
        d.source.shadow_refused = shadow_refused;
        d
    }

    /// Forgets `key` in every rule: in each rule's stores (its store, its
    /// fallback, its escalation's durable store) and in the refusal caches
    /// of every limiter in front of the same stores, so that the key's next requests get
    /// every rule's full limit. Every store is asked, under its rule's
    /// timeout, even when one fails; the first error is returned, and the
    /// key may then be partly reset (reset again: a reset is idempotent).
    ///
    /// Exact in this process, a refusal decided before the reset and
    /// delivered after it included. Across a fleet, a store that hears
    /// other instances ([`Store::invalidations`](crate::Store::invalidations):
    /// Redis and Postgres do) announces the reset, and every instance's
    /// refusal caches in front of it drop the key when they hear it. In
    /// front of a store that does not, another instance may still refuse
    /// the key from its own refusal cache until the retry time of the
    /// refusal it holds (at most the refusing policy's window, two windows
    /// for the sliding window counter). Either way another instance may
    /// still spend units of a lease in hand
    /// ([`LeasedStore`](crate::lease::LeasedStore), at most
    /// `max_units − 1`) until the window that counted them ends, and a
    /// lease's held refusal until the retry time it told.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(Rule::new("login", store, Policy::fixed_window(2, Duration::from_secs(900))?)?)
    ///     .build()?;
    /// while limiter.check(b"alice").await.allowed {}
    /// limiter.reset(b"alice").await?; // a support engineer lifts the lock
    /// assert_eq!(limiter.check(b"alice").await.remaining, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn reset(&self, key: &[u8]) -> Result<(), StoreError> {
        let mut first_error = None;
        for rule in self.rules.iter() {
            if let Err(e) = rule.reset(key).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Charges `key` `cost` units in every rule now, whether or not they
    /// fit ([`Rule::penalize`], [`Store::penalize`](crate::Store::penalize)):
    /// for a cost the application learns after the request was decided (a
    /// failed payment costs 5), so that the key waits longer even when it is
    /// already over its limit. Nothing is decided and nothing is refused;
    /// penalties are bounded so that no run of them locks a key out for
    /// more than about one window of each rule
    /// ([`algorithm::penalize`](crate::algorithm::penalize)). Every
    /// rule is charged even when one fails; the first error is returned. A
    /// cost some rule could never admit is an
    /// [`InvalidRequest`](crate::ErrorKind::InvalidRequest) error, and
    /// charges no rule.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(Rule::new("payments", store, Policy::fixed_window(10, Duration::from_secs(3600))?)?)
    ///     .build()?;
    /// assert!(limiter.check(b"card:42").await.allowed);
    /// limiter.penalize(b"card:42", 5).await?; // the payment failed
    /// assert_eq!(limiter.peek(b"card:42").await.remaining, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn penalize(&self, key: &[u8], cost: u32) -> Result<(), StoreError> {
        for rule in self.rules.iter() {
            rule.check_cost(cost)
                .map_err(|e| StoreError::invalid_request(rule.store().name(), e))?;
        }
        let mut first_error = None;
        for rule in self.rules.iter() {
            if let Err(e) = rule.penalize(key, cost, &*self.clock).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The decision if no store had to be awaited, else the progress left
    /// to [`run_awaited`](Self::run_awaited). `cost` was checked against every rule.
    #[inline]
    fn begin(&self, key: &[u8], cost: u32) -> Begun {
        match self.road {
            Road::Tiers => return self.tiers(key, cost),
            Road::Steps => return self.stepped(key, cost),
            // Below, in this function: returned from a function of its
            // own, the decision was copied once more, about 25 instructions
            // a request (callgrind of the composition bench).
            Road::OneRule => {}
        }
        // The rule's local decision alone, with nothing to settle and no
        // progress to build unless it must wait.
        let rule = &self.rules[0];
        let now = self.clock.now();
        let mut buf = StorageKey::new();
        let storage_key = rule.fill_storage_key(&mut buf, key);
        let units = rule.units(cost);
        let answer = rule.ask_inline(storage_key, units, now);
        // The store's answer, read in place: the path of nearly every
        // request on a memory store.
        if let Some(Ok(stored)) = &answer {
            let mut decision = copied(stored);
            rule.stamp_enforcing(&mut decision);
            return Begun::Decided(decision);
        }
        match rule.local_after(answer, storage_key, units, now, self.clock.as_ref()) {
            Local::Now(decision, _) => {
                let mut decision = decision;
                rule.stamp_enforcing(&mut decision);
                Begun::Decided(decision)
            }
            Local::Wait(tried) => Begun::Waiting(Progress {
                now,
                // No refusal cache on this path.
                ticket: Ticket::NONE,
                cost,
                next: Next::Resume(0, tried),
                pending: SmallVec::new(),
                tightest: None,
                tightest_shadow: false,
                shadow_refused: false,
                keep_all: false,
                traced: Traced::NONE,
            }),
        }
    }

    /// [`begin`](Self::begin) on [`Road::Steps`], the road that does
    /// everything a limiter can be built to do.
    // Never inlined: inlined into `begin`, it led the compiler to carry the
    // one-rule road's decision through the stack, field by field, on every
    // request (588 instructions a decision of the composition bench's
    // one-rule limiter against 531 without it; `scripts/instructions.sh`).
    #[inline(never)]
    fn stepped(&self, key: &[u8], cost: u32) -> Begun {
        let mut progress = self.start(cost);
        match self.advance(key, &mut progress) {
            Some(decision) => Begun::Decided(decision),
            None => Begun::Waiting(progress),
        }
    }

    /// [`begin`](Self::begin) on [`Road::Tiers`], while each store answers
    /// inline (in-process tiers):
    /// each store's answer is read where it was returned and copied only
    /// when it is the tightest so far, with none of [`Progress`]'s
    /// bookkeeping. Moving a whole decision from rule to progress to
    /// answer made two memory tiers cost about three times one rule, in
    /// store-forwarding stalls (`perf annotate` of the composition bench).
    /// The first answer that is not an inline decision hands the request,
    /// as far as it has gone, to [`advance`](Self::advance), without asking
    /// that store again.
    fn tiers(&self, key: &[u8], cost: u32) -> Begun {
        let now = self.clock.now();
        let mut buf = StorageKey::new();
        let last = self.rules.len() - 1;
        let mut pending = Kept::new();
        let mut tightest: Option<(usize, Decision)> = None;
        for (i, rule) in self.rules.iter().enumerate() {
            let storage_key = rule.fill_storage_key(&mut buf, key);
            let units = rule.units(cost);
            let answer = rule.ask_inline(storage_key, units, now);
            if let Some(Ok(stored)) = &answer {
                if stored.allowed {
                    rule.count(stored);
                    if i < last
                        && let Some(charge) = rule.settle_one(
                            key,
                            units,
                            (now, Ticket::NONE),
                            stored,
                            Some(Holder::Authoritative),
                            true,
                        )
                    {
                        pending.push((i, charge));
                    }
                    if tighter(tightest.as_ref().map(|(_, d)| d), stored) {
                        tightest = Some((i, copied(stored)));
                    }
                    // An answered decision owns nothing (checked below, at
                    // compile time): dropped, the answer was a call to the
                    // drop of `Option<Result<Decision, StoreError>>` per
                    // rule: 1,190 → 1,165 instructions a request of two
                    // memory tiers admitting (composition bench, callgrind).
                    std::mem::forget(answer);
                    continue;
                }
                let mut refusal = copied(stored);
                std::mem::forget(answer);
                rule.stamp_enforcing(&mut refusal);
                if pending.is_empty() {
                    return Begun::Decided(refusal);
                }
                let mut progress = Progress {
                    now,
                    ticket: Ticket::NONE,
                    cost,
                    next: Next::Refund(refusal),
                    pending,
                    tightest: None,
                    tightest_shadow: false,
                    shadow_refused: false,
                    keep_all: false,
                    traced: Traced::NONE,
                };
                return match self.advance(key, &mut progress) {
                    Some(decision) => Begun::Decided(decision),
                    None => Begun::Waiting(progress),
                };
            }
            let mut progress = Progress {
                now,
                // No rule on this path has a refusal cache.
                ticket: Ticket::NONE,
                cost,
                next: Next::Step(i),
                pending,
                tightest: tightest.map(|(j, mut d)| {
                    self.rules[j].label(&mut d);
                    d
                }),
                // No rule on this road is in shadow mode.
                tightest_shadow: false,
                shadow_refused: false,
                keep_all: false,
                traced: Traced::NONE,
            };
            match rule.local_after(answer, storage_key, units, now, self.clock.as_ref()) {
                Local::Now(decision, holder) => {
                    let charge = rule.settle_one(
                        key,
                        units,
                        (now, Ticket::NONE),
                        &decision,
                        holder,
                        i < last,
                    );
                    if let Absorbed::Decided(d) =
                        self.absorb(&mut progress, i, decision, charge.as_slice())
                    {
                        return Begun::Decided(d);
                    }
                }
                Local::Wait(tried) => {
                    progress.next = Next::Resume(i, tried);
                    return Begun::Waiting(progress);
                }
            }
            return match self.advance(key, &mut progress) {
                Some(decision) => Begun::Decided(decision),
                None => Begun::Waiting(progress),
            };
        }
        let (i, mut decision) = tightest.expect("every rule has admitted");
        self.rules[i].label(&mut decision);
        Begun::Decided(decision)
    }

    /// A request's progress before any rule is asked. `cost` was checked
    /// against every rule: their charges cannot overflow.
    fn start(&self, cost: u32) -> Progress {
        Progress {
            now: self.clock.now(),
            ticket: Ticket::NONE,
            cost,
            // A standing refusal from any rule's cache answers before any
            // store is asked, so a hammering offender costs no round trip
            // and no local tier's admit-then-refund either.
            next: if self.caches {
                Next::Caches
            } else {
                Next::Step(0)
            },
            pending: SmallVec::new(),
            tightest: None,
            tightest_shadow: false,
            shadow_refused: false,
            keep_all: false,
            traced: Traced::NONE,
        }
    }

    /// Takes `p` as far as it goes without waiting: the decision, or `None`
    /// when `p.next` must be awaited.
    // Always inlined: left to the compiler, it was an outlined call from
    // `stepped`, which saved and reloaded what both hold in registers
    // (composition bench under callgrind, a dead store failing open: 1,087
    // → 1,052 instructions a decision).
    #[inline(always)]
    fn advance(&self, key: &[u8], p: &mut Progress) -> Option<Decision> {
        let clock = self.clock.as_ref();
        let mut buf = StorageKey::new();
        let last = self.rules.len() - 1;
        loop {
            match p.next {
                Next::Caches => {
                    if self.caches_wait {
                        return None;
                    }
                    for rule in self.rules.iter() {
                        if let Some(d) = rule.cached_refusal_now(key, rule.units(p.cost), p.now) {
                            return Some(d);
                        }
                    }
                    p.next = Next::Step(0);
                }
                Next::Step(i) => {
                    let rule = &self.rules[i];
                    let storage_key = rule.fill_storage_key(&mut buf, key);
                    let units = rule.units(p.cost);
                    p.ticket = rule.ticket(storage_key);
                    let answer = rule.ask_inline(storage_key, units, p.now);
                    let (decision, holder) = match &answer {
                        // The store's answer, read in place: a memory tier.
                        Some(Ok(stored)) if !rule.escalates() => {
                            (copied(stored), Some(Holder::Authoritative))
                        }
                        _ => match rule.local_after(answer, storage_key, units, p.now, clock) {
                            Local::Now(decision, holder) if !rule.escalates() => (decision, holder),
                            Local::Now(decision, holder) => {
                                p.next = Next::Resume(i, Tried::Local(decision, holder));
                                return None;
                            }
                            Local::Wait(tried) => {
                                p.next = Next::Resume(i, tried);
                                return None;
                            }
                        },
                    };
                    let keep = i < last || p.keep_all;
                    let charge =
                        rule.settle_one(key, units, (p.now, p.ticket), &decision, holder, keep);
                    if let Absorbed::Decided(d) = self.absorb(p, i, decision, charge.as_slice()) {
                        return Some(d);
                    }
                }
                Next::Resume(..) => return None,
                Next::Refund(_) => {
                    // Newest first; what must be awaited is left to `run_awaited`.
                    let mut left = SmallVec::new();
                    for (i, charge) in p.pending.iter().rev() {
                        let rule = &self.rules[*i];
                        let storage_key = rule.fill_storage_key(&mut buf, key);
                        let units = rule.units(p.cost);
                        if !rule.refund_charge_now(storage_key, charge, units, p.now) {
                            left.insert(0, (*i, *charge));
                        }
                    }
                    p.pending = left;
                    if !p.pending.is_empty() {
                        return None;
                    }
                    let Next::Refund(decision) = std::mem::replace(&mut p.next, Next::Step(0))
                    else {
                        unreachable!("matched above")
                    };
                    return Some(decision);
                }
            }
        }
    }

    /// Decides what [`advance`](Self::advance) left, awaiting each store
    /// that must be awaited and going on without waiting where it can.
    async fn run_awaited(&self, key: &[u8], mut p: Progress) -> (Decision, Kept) {
        let traced = std::mem::replace(&mut p.traced, Traced::NONE);
        let out = self.run_steps(key, p).instrument(traced.span()).await;
        traced.end(&out.0);
        out
    }

    /// [`run_awaited`](Self::run_awaited), in the decision's span if it
    /// has one.
    async fn run_steps(&self, key: &[u8], mut p: Progress) -> (Decision, Kept) {
        let clock = self.clock.as_ref();
        let mut buf = StorageKey::new();
        let last = self.rules.len() - 1;
        loop {
            match std::mem::replace(&mut p.next, Next::Step(0)) {
                Next::Caches => {
                    for rule in self.rules.iter() {
                        if let Some(d) = rule
                            .cached_refusal(key, rule.units(p.cost), p.now, clock)
                            .await
                        {
                            return (d, Kept::new());
                        }
                    }
                    p.next = Next::Step(0);
                }
                Next::Resume(i, tried) => {
                    let rule = &self.rules[i];
                    let storage_key = rule.fill_storage_key(&mut buf, key);
                    let units = rule.units(p.cost);
                    let Applied { decision, charges } = rule
                        .resume(
                            key,
                            storage_key,
                            units,
                            (p.now, p.ticket),
                            clock,
                            i < last || p.keep_all,
                            tried,
                        )
                        .await;
                    if let Absorbed::Decided(d) = self.absorb(&mut p, i, decision, &charges) {
                        return (d, p.pending);
                    }
                }
                Next::Refund(decision) => {
                    for (i, charge) in p.pending.iter().rev() {
                        let rule = &self.rules[*i];
                        let storage_key = rule.fill_storage_key(&mut buf, key);
                        let units = rule.units(p.cost);
                        rule.refund(storage_key, std::slice::from_ref(charge), units, p.now)
                            .await;
                    }
                    return (decision, Kept::new());
                }
                next @ Next::Step(_) => p.next = next,
            }
            if let Some(decision) = self.advance(key, &mut p) {
                return (decision, p.pending);
            }
        }
    }

    /// Takes rule `i`'s decision into `p`: the request's answer if it is
    /// the last rule's, or a refusal with nothing to refund; otherwise
    /// `next` is the following rule, or the refunds this refusal needs.
    #[inline]
    fn absorb(
        &self,
        p: &mut Progress,
        i: usize,
        mut decision: Decision,
        charges: &[Charge],
    ) -> Absorbed {
        let rule = &self.rules[i];
        rule.stamp(&mut decision);
        p.shadow_refused |= decision.source.shadow_refused;
        decision.source.shadow_refused = p.shadow_refused;
        let last = self.rules.len() - 1;
        // One rule, the common case: nothing to refund, no tightest to pick.
        if last == 0 && !p.keep_all {
            return Absorbed::Decided(decision);
        }
        if !decision.allowed {
            if p.pending.is_empty() {
                return Absorbed::Decided(decision);
            }
            p.next = Next::Refund(decision);
            return Absorbed::Going;
        }
        if i < last || p.keep_all {
            p.pending.extend(charges.iter().map(|c| (i, *c)));
        }
        let shadow = rule.is_shadow();
        if shown(
            p.tightest.as_ref().map(|t| (t, p.tightest_shadow)),
            &decision,
            shadow,
        ) {
            p.tightest = Some(decision);
            p.tightest_shadow = shadow;
        }
        if i == last {
            // Every rule has admitted; the first set `tightest`.
            let mut decision = p.tightest.take().expect("a rule has admitted");
            decision.source.shadow_refused = p.shadow_refused;
            return Absorbed::Decided(decision);
        }
        p.next = Next::Step(i + 1);
        Absorbed::Going
    }

    /// Writes every abuse event held back in memory (refusals counted since
    /// each key's last event), so that none is lost: call it at shutdown,
    /// and periodically if keys may stay quiet for long. Returns how many
    /// events were written.
    pub async fn flush_abuse_events(&self) -> u64 {
        let mono = micros(self.clock.monotonic());
        let mut written = 0;
        for rule in self.rules.iter() {
            written += rule.flush_abuse(mono).await;
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

    /// Appends each of `rules`, in order: the tiers of
    /// [`Rule::tiers`](crate::Rule::tiers).
    pub fn rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.rules.extend(rules);
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
            if self.rules[..i].iter().any(|r| r.name() == rule.name()) {
                return Err(ConfigError::Invalid(format!(
                    "two rules are named {:?}",
                    rule.name()
                )));
            }
        }
        let caches = self.rules.iter().any(Rule::has_refusal_cache);
        let caches_wait = self
            .rules
            .iter()
            .any(|r| r.has_refusal_cache() && r.records_abuse());
        // A shadow rule's decision is settled in `absorb`, on the road of
        // steps: the other two read a store's answer in place.
        let road = if caches || self.rules.iter().any(|r| r.escalates() || r.is_shadow()) {
            Road::Steps
        } else if self.rules.len() == 1 {
            Road::OneRule
        } else {
            Road::Tiers
        };
        let max_cost = self.rules.iter().map(Rule::max_cost).min().unwrap_or(0);
        Ok(Limiter {
            road,
            max_cost,
            rules: self.rules.into(),
            clock: self.clock,
            caches,
            caches_wait,
        })
    }
}

/// A decision that can be given back, from [`Limiter::check_admission`].
/// Dropped, the request stays counted.
pub struct Admission {
    decision: Decision,
    limiter: Limiter,
    key: SmallVec<[u8; 64]>,
    now: Timestamp,
    cost: u32,
    /// What each rule's store counted, to refund; empty for a refusal.
    kept: Kept,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("decision", &self.decision)
            .field("counted_by", &self.kept.len())
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// The decision, as [`Limiter::check_cost`] would have returned it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Gives the request back: every rule that counted it refunds it, as if
    /// it had never been admitted (or stricter, if the key's state has moved
    /// since: [`Store::refund`](crate::Store::refund)), and the refusal
    /// caches of every limiter in front of the same stores stop answering for the key
    /// with a refusal made before the refund, so its next request gets what
    /// the stores would answer. Nothing for a
    /// refusal, which counted nothing. A refund that fails leaves the
    /// request counted (the strict side), as
    /// [`RuleStats::refund_failures`] counts. The decision stays in the
    /// rules' statistics.
    pub async fn refund(self) {
        // Before as well as after the stores have the units back (each
        // rule's refund tells the caches again): the key's next request
        // asks the stores rather than a refusal cached before this
        // give-back, even while the refund is still on its way.
        self.forget_refusals();
        let mut buf = StorageKey::new();
        for (i, charge) in self.kept.iter().rev() {
            let rule = &self.limiter.rules[*i];
            let storage_key = rule.fill_storage_key(&mut buf, &self.key);
            let units = rule.units(self.cost);
            rule.refund(storage_key, std::slice::from_ref(charge), units, self.now)
                .await;
        }
    }
}

impl Admission {
    /// Makes the cached refusals of the key in front of every rule that
    /// counted it stale.
    pub(crate) fn forget_refusals(&self) {
        let mut buf = StorageKey::new();
        for (i, _) in self.kept.iter() {
            let rule = &self.limiter.rules[*i];
            rule.given_back(rule.fill_storage_key(&mut buf, &self.key));
        }
    }
}

/// Whether an admission `decision` is the one to show a client rather than
/// `tightest`, the tightest so far: a store's answer over a failure
/// policy's, then the fewest units remaining.
fn tighter(tightest: Option<&Decision>, decision: &Decision) -> bool {
    match tightest {
        None => true,
        Some(t) => match (t.source.degraded, decision.source.degraded) {
            (true, false) => true,
            (false, true) => false,
            _ => decision.remaining < t.remaining,
        },
    }
}

/// Whether an admission `decision`, from a rule in shadow mode or not
/// (`shadow`), is the one to show a client rather than `tightest`, the one
/// shown so far and whether its rule is in shadow mode: a client is shown
/// the enforcing rules' quota, a shadow rule's only while no enforcing rule
/// has admitted; among the same kind, as [`tighter`] says.
fn shown(tightest: Option<(&Decision, bool)>, decision: &Decision, shadow: bool) -> bool {
    match tightest {
        None => true,
        Some((t, t_shadow)) => match (t_shadow, shadow) {
            (true, false) => true,
            (false, true) => false,
            _ => tighter(Some(t), decision),
        },
    }
}

// `Limiter::tiers` forgets a store's answered decision rather than drop it.
const _: () = assert!(!std::mem::needs_drop::<Decision>());

/// `decision`, copied field by field from where the store's call has just
/// written it. Moved as a whole, it is copied in 16-byte pieces that each
/// span several of the narrower stores that wrote it, which the CPU cannot
/// forward to a load: stalls that took a third of the one-rule path's own
/// samples (`perf annotate` of the composition bench). Copied this way, the
/// fields are read as they were written.
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
            policy: source.policy,
            fallback: source.fallback,
            degraded: source.degraded,
            escalated: source.escalated,
            cached: source.cached,
            // A store's answer, which only a limiter marks.
            shadow_refused: false,
            banned: source.banned,
        },
    }
}
