//! A reference model of every policy: plain, slow and obviously correct.
//!
//! The model keeps, per key, the whole history of admitted requests as a
//! `Vec` of events and recomputes every answer from the definitions in the
//! table of [`ratewarden_core::algorithm`], never from incremental state. It has
//! no eviction, no concurrency and no cleverness, and it shares no code with
//! [`ratewarden_core::algorithm::apply`]: property tests drive a store and this
//! model with the same random requests and require identical decisions, so a
//! bug would have to be written twice, in two different shapes, to hide.
//!
//! In particular `retry_after` is not computed by a formula here: it is
//! *searched for* as the earliest moment at which the same request would be
//! admitted (nothing else being admitted meanwhile), by bisection over the
//! model's own admission test, which is monotone in time for every
//! algorithm.
//!
//! ```
//! use std::time::Duration;
//! use ratewarden_conformance::model::Model;
//! use ratewarden_conformance::ratewarden_core::{Policy, Timestamp};
//!
//! let policy = Policy::sliding_log(2, Duration::from_secs(10))?;
//! let t0 = Timestamp::from_micros(1_767_225_600_000_000);
//! let mut model = Model::new();
//! assert!(model.decide(b"k", &policy, 2, t0)?.allowed);
//! let refused = model.decide(b"k", &policy, 1, t0.saturating_add(Duration::from_secs(4)))?;
//! assert!(!refused.allowed);
//! assert_eq!(refused.retry_after, Duration::from_secs(6));
//! # Ok::<(), ratewarden_conformance::ratewarden_core::ConfigError>(())
//! ```
//!
//! # Time that goes backwards
//!
//! Every algorithm clamps a `now` earlier than its key has seen, and what a
//! key "has seen" is what its state can remember. The model spells that out
//! per algorithm:
//!
//! * **sliding log**: the key remembers the latest effective time `H` it was
//!   asked at; admitted units with `t + W ≤ H` have expired for good. A
//!   request is evaluated at `max(now, newest unexpired admission)`.
//! * **fixed window**: the window opened by the latest admission stays open
//!   until its end; a `now` before its start is inside it.
//! * **sliding window**: the window of the latest admission is the current
//!   one while `now` is in it or before it (evaluated at its start).
//! * **GCRA**: the theoretical arrival time only ever moves forward.
//!
//! # Keys and policies
//!
//! The model keys its histories by (policy, key). A store keys them by
//! (algorithm, key), so drivers comparing the two use one policy per
//! algorithm, as a [`Limiter`](ratewarden_core::Limiter) does by prefixing keys
//! with the rule name.
//!
//! About 730 lines: the model of one store and of a limiter of tiers, with
//! their replays and differentials, which share their step types.

use crate::call;
use std::collections::HashMap;
use std::time::Duration;

use ratewarden_core::{Algorithm, ConfigError, Decision, Policy, Timestamp};

/// What the model says a store must answer; compare it with a
/// [`Decision`] through [`Expected::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// The request is admitted.
    pub allowed: bool,
    /// Units still admissible right after this request.
    pub remaining: u32,
    /// Time until the key holds no counted units.
    pub reset_after: Duration,
    /// Zero when admitted; otherwise the shortest wait after which the same
    /// request is admitted.
    pub retry_after: Duration,
}

impl Expected {
    /// The fields of `decision` the model predicts, for `assert_eq!`.
    pub fn of(decision: &Decision) -> Self {
        Expected {
            allowed: decision.allowed,
            remaining: decision.remaining,
            reset_after: decision.reset_after,
            retry_after: decision.retry_after,
        }
    }
}

/// One admitted request: when it counted (after clamping), its cost, and
/// for the windowed algorithms the window it was counted in.
#[derive(Debug, Clone, Copy)]
struct Admission {
    at: u64,
    cost: u64,
    /// Fixed window: the start of the window it was counted in. Sliding
    /// window: the index `⌊t / W⌋` of that window. Unused otherwise.
    window: u64,
}

/// Everything the model remembers about one (policy, key).
#[derive(Debug, Clone, Default)]
struct History {
    admitted: Vec<Admission>,
    /// Sliding log: the latest effective time the key was evaluated at.
    horizon: u64,
    /// The latest `now` the key was asked at: a bound for the bisection.
    latest_now: u64,
}

/// The reference model: every key's full history, no eviction.
#[derive(Debug, Clone, Default)]
pub struct Model {
    keys: HashMap<(Policy, Vec<u8>), History>,
}

/// The outcome of evaluating a request at a moment, before any change.
struct Evaluation {
    allowed: bool,
    /// Units still admissible after the request (admitted or not).
    remaining_after: u64,
    /// When the key is clear, the request counted if admitted.
    reset_at: u64,
    /// The effective time (after clamping) and the window the request would
    /// be counted in, if admitted.
    at: u64,
    window: u64,
}

impl Model {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything about `key` under `policy`, as a bounded store
    /// does when it evicts the key.
    pub fn forget(&mut self, key: &[u8], policy: &Policy) {
        self.keys.remove(&(*policy, key.to_vec()));
    }

    /// Removes the most recent admission of `key` under `policy`, as if that
    /// request had never been admitted; returns whether there was one. What
    /// evaluating it expired (a sliding log's horizon) stays expired.
    pub fn undo_last(&mut self, key: &[u8], policy: &Policy) -> bool {
        self.keys
            .get_mut(&(*policy, key.to_vec()))
            .and_then(|h| h.admitted.pop())
            .is_some()
    }

    /// Whether the model holds any history for `key` under `policy`.
    pub fn knows(&self, key: &[u8], policy: &Policy) -> bool {
        self.keys.contains_key(&(*policy, key.to_vec()))
    }

    /// Decides a request of `cost` units for `key` at `now`, recording it if
    /// admitted. A cost of zero or above the limit is the error a store
    /// must return.
    pub fn decide(
        &mut self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Expected, ConfigError> {
        policy.validate_cost(cost)?;
        let now = now.as_micros();
        let c = u64::from(cost);
        let history = self.keys.entry((*policy, key.to_vec())).or_default();
        let eval = evaluate(history, policy, c, now);
        history.latest_now = history.latest_now.max(now);
        if policy.algorithm() == Algorithm::SlidingLog {
            // Evaluating at a moment expires what it expires, admitted or not.
            history.horizon = history.horizon.max(eval.at);
        }
        let expected = if eval.allowed {
            history.admitted.push(Admission {
                at: eval.at,
                cost: c,
                window: eval.window,
            });
            Expected {
                allowed: true,
                remaining: clamp_u32(eval.remaining_after),
                reset_after: micros(eval.reset_at.saturating_sub(now)),
                retry_after: Duration::ZERO,
            }
        } else {
            let retry_at = earliest_admission(history, policy, c, now);
            Expected {
                allowed: false,
                remaining: clamp_u32(eval.remaining_after),
                reset_after: micros(eval.reset_at.saturating_sub(now)),
                retry_after: micros(retry_at.saturating_sub(now)),
            }
        };
        Ok(expected)
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

/// Evaluates a request of `c` units at `now` against `history`, changing
/// nothing.
fn evaluate(history: &History, policy: &Policy, c: u64, now: u64) -> Evaluation {
    let l = u64::from(policy.limit());
    let w = policy.window_micros();
    let admitted = &history.admitted;
    match policy.algorithm() {
        Algorithm::SlidingLog => {
            // Units that had not expired by the latest moment the key saw.
            let alive = |a: &&Admission| a.at + w > history.horizon;
            let newest_alive = admitted.iter().filter(alive).map(|a| a.at).max();
            let at = now.max(newest_alive.unwrap_or(0));
            let counted: u64 = admitted
                .iter()
                .filter(alive)
                .filter(|a| a.at + w > at)
                .map(|a| a.cost)
                .sum();
            let allowed = counted + c <= l;
            let after = if allowed { counted + c } else { counted };
            // The key is clear once its newest counted unit expires.
            let newest_counted = admitted
                .iter()
                .filter(alive)
                .filter(|a| a.at + w > at)
                .map(|a| a.at)
                .max()
                .unwrap_or(at);
            Evaluation {
                allowed,
                remaining_after: l.saturating_sub(after),
                reset_at: if allowed { at + w } else { newest_counted + w },
                at,
                window: 0,
            }
        }
        Algorithm::FixedWindow => {
            // The window opened by the latest admission, while it is open.
            let open = admitted
                .last()
                .map(|a| a.window)
                .filter(|&start| now < start + w);
            let start = open.unwrap_or(now);
            let counted: u64 = admitted
                .iter()
                .filter(|a| open == Some(a.window))
                .map(|a| a.cost)
                .sum();
            let allowed = counted + c <= l;
            let after = if allowed { counted + c } else { counted };
            Evaluation {
                allowed,
                remaining_after: l.saturating_sub(after),
                reset_at: start + w,
                at: now,
                window: start,
            }
        }
        Algorithm::SlidingWindow => {
            let latest_window = admitted.iter().map(|a| a.window).max();
            let window = (now / w).max(latest_window.unwrap_or(0));
            let start = window * w;
            let at = now.max(start);
            let sum_in = |k: u64| -> u64 {
                admitted
                    .iter()
                    .filter(|a| a.window == k)
                    .map(|a| a.cost)
                    .sum()
            };
            let current = sum_in(window);
            let previous = if window == 0 { 0 } else { sum_in(window - 1) };
            // The previous window counts in proportion to how much of it the
            // sliding window [at − W, at) still covers.
            let weighted = previous * (w - (at - start));
            let allowed = weighted + (current + c) * w <= l * w;
            let current_after = if allowed { current + c } else { current };
            let remaining = (l * w).saturating_sub(weighted + current_after * w) / w;
            let reset_at = if current_after > 0 {
                start + 2 * w
            } else if previous > 0 {
                start + w
            } else {
                at
            };
            Evaluation {
                allowed,
                remaining_after: remaining,
                reset_at,
                at,
                window,
            }
        }
        Algorithm::Gcra => {
            let t = policy.emission_interval_micros();
            // The theoretical arrival time: every admitted unit pushes it
            // `T` later than the later of itself and the time it came.
            let mut tat = 0u64;
            for a in admitted {
                tat = tat.max(a.at) + a.cost * t;
            }
            let tat = tat.max(now);
            let burst = l * t;
            let allowed = tat + c * t - now <= burst;
            let (after, reset_at) = if allowed {
                (tat + c * t, tat + c * t)
            } else {
                (tat, tat)
            };
            Evaluation {
                allowed,
                remaining_after: burst.saturating_sub(after - now) / t,
                reset_at,
                at: now,
                window: 0,
            }
        }
    }
}

/// The earliest moment `≥ now` at which a request of `c` units is admitted,
/// if nothing else is admitted meanwhile: bisection over [`evaluate`].
fn earliest_admission(history: &History, policy: &Policy, c: u64, now: u64) -> u64 {
    let admits = |t: u64| evaluate(history, policy, c, t).allowed;
    // Every state the model holds is clear three windows after the latest
    // moment it was asked at (or now, if that is later).
    let mut hi = history.latest_now.max(now) + 3 * policy.window_micros();
    debug_assert!(admits(hi), "nothing admits {c} units even at {hi}");
    let mut lo = now; // refused at `now`
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if admits(mid) { hi = mid } else { lo = mid }
    }
    hi
}

/// One request of a random script that [`replay`] sends to a store and to
/// the model alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Which key, by index: [`replay`] turns it into bytes.
    pub key: u8,
    /// Which policy of those given to [`replay`], by index (modulo their
    /// number).
    pub policy: usize,
    /// The request's cost, brought into `1..=limit` as `1 + cost % limit`.
    pub cost: u32,
    /// How far the clock moves before the request, in microseconds; negative
    /// values move it back, as a host with a skewed clock would (saturating
    /// at the epoch).
    pub advance_us: i64,
}

/// Sends `steps` to `store` and to a fresh [`Model`], starting at `start`,
/// and fails at the first decision where they differ (allowed, limit,
/// remaining, reset_after, retry_after) or where the store errs. Returns
/// the number of refusals seen, so callers can check the script exercised
/// both outcomes.
///
/// `key` maps a step's key index to the bytes sent; use it to give each run
/// its own namespace on a shared server. `policies` should hold at most one
/// policy per algorithm (see the [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use ratewarden_conformance::broken::ReferenceStore;
/// use ratewarden_conformance::model::{replay, Step};
/// use ratewarden_conformance::ratewarden_core::{ManualClock, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = ReferenceStore::new(100);
/// let policies = [Policy::gcra(2, Duration::from_millis(10)).unwrap()];
/// // Cost 0 becomes 1 + 0 % limit = 1.
/// let steps = [Step { key: 0, policy: 0, cost: 0, advance_us: 0 }; 4];
/// let refusals = replay(&store, &policies, &steps, |k| vec![k], ManualClock::DEFAULT_START)
///     .await
///     .unwrap();
/// assert_eq!(refusals, 2);
/// # }
/// ```
pub async fn replay(
    store: &dyn ratewarden_core::Store,
    policies: &[Policy],
    steps: &[Step],
    key: impl Fn(u8) -> Vec<u8>,
    start: Timestamp,
) -> Result<usize, crate::Failure> {
    if policies.is_empty() {
        return Err(crate::Failure("replay needs at least one policy".into()));
    }
    let mut model = Model::new();
    let mut now = start.as_micros();
    let mut refusals = 0;
    for (i, step) in steps.iter().enumerate() {
        now = now.saturating_add_signed(step.advance_us);
        let at = Timestamp::from_micros(now);
        let policy = &policies[step.policy % policies.len()];
        let cost = 1 + step.cost % policy.limit();
        let k = key(step.key);
        let expected = model
            .decide(&k, policy, cost, at)
            .map_err(|e| crate::Failure(format!("model refused step {i}: {e}")))?;
        let context = || {
            format!(
                "step {i} of {}: key {:?}, {policy}, cost {cost}, now {}µs after start",
                steps.len(),
                String::from_utf8_lossy(&k),
                now as i128 - start.as_micros() as i128
            )
        };
        let decision = call::decide(store, &k, policy, cost, at)
            .await
            .map_err(|e| crate::Failure(format!("{}: store error {e}", context())))?;
        if decision.limit != policy.limit() {
            return Err(crate::Failure(format!(
                "{}: limit {} instead of {}",
                context(),
                decision.limit,
                policy.limit()
            )));
        }
        let got = Expected::of(&decision);
        if got != expected {
            return Err(crate::Failure(format!(
                "{}: store answered {got:?}, the model {expected:?}",
                context()
            )));
        }
        refusals += usize::from(!expected.allowed);
    }
    Ok(refusals)
}

/// The model of a [`Limiter`](ratewarden_core::Limiter) of tiers, none failing:
/// each tier a policy and a cost, keys namespaced per tier, tiers applied in
/// order; the first refusal wins and the admissions of the tiers before it
/// are undone, as if the request had never come; when every tier admits,
/// the answer is the admission with the fewest units remaining (the first
/// of equals).
#[derive(Debug, Clone)]
pub struct TiersModel {
    tiers: Vec<(Policy, u32)>,
    model: Model,
}

/// What [`TiersModel::check`] says a limiter must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiersExpected {
    /// The decision's fields.
    pub expected: Expected,
    /// The index of the tier whose decision it is.
    pub tier: usize,
}

impl TiersModel {
    /// Tiers of `(policy, cost)`, applied in order.
    pub fn new(tiers: Vec<(Policy, u32)>) -> Self {
        TiersModel {
            tiers,
            model: Model::new(),
        }
    }

    fn tier_key(tier: usize, key: &[u8]) -> Vec<u8> {
        let mut k = vec![u8::try_from(tier).unwrap_or(u8::MAX)];
        k.extend_from_slice(key);
        k
    }

    /// Decides one request for `key` at `now`.
    pub fn check(&mut self, key: &[u8], now: Timestamp) -> Result<TiersExpected, ConfigError> {
        let mut best: Option<TiersExpected> = None;
        for (i, &(policy, cost)) in self.tiers.iter().enumerate() {
            let expected = self
                .model
                .decide(&Self::tier_key(i, key), &policy, cost, now)?;
            if !expected.allowed {
                for (j, (p, _)) in self.tiers[..i].iter().enumerate() {
                    self.model.undo_last(&Self::tier_key(j, key), p);
                }
                return Ok(TiersExpected { expected, tier: i });
            }
            if best.is_none_or(|b| expected.remaining < b.expected.remaining) {
                best = Some(TiersExpected { expected, tier: i });
            }
        }
        best.ok_or_else(|| ConfigError::Invalid("a tiers model needs at least one tier".into()))
    }
}

/// Sends one request per `(key, advance_us)` step to a
/// [`Limiter`](ratewarden_core::Limiter) of one rule per store in `stores`
/// (rule `i` named `t{i}`, with `tiers[i]`'s policy and cost) and to a
/// [`TiersModel`], moving a shared [`ManualClock`](ratewarden_core::ManualClock)
/// forward by `advance_us` before each; fails at the first decision where
/// they differ (allowed, the deciding rule, remaining, reset_after,
/// retry_after). Returns the number of refusals by a tier other than the
/// first, which are the requests whose earlier admissions were refunded.
pub async fn replay_tiers(
    stores: &[std::sync::Arc<dyn ratewarden_core::Store>],
    tiers: &[(Policy, u32)],
    steps: &[(u8, u64)],
) -> Result<usize, crate::Failure> {
    use ratewarden_core::{Limiter, ManualClock, Rule};
    let fail = |m: String| crate::Failure(m);
    if stores.len() != tiers.len() || tiers.is_empty() {
        return Err(fail(
            "replay_tiers needs one store per tier, and a tier".into(),
        ));
    }
    let clock = ManualClock::new();
    let mut builder = Limiter::builder().clock(clock.clone());
    for (i, (store, &(policy, cost))) in stores.iter().zip(tiers).enumerate() {
        let rule = Rule::new(format!("t{i}"), store.clone(), policy)
            .and_then(|r| r.with_units_per_request(cost))
            .and_then(|r| r.with_timeout(Duration::from_secs(30)))
            .map_err(|e| fail(format!("tier {i}: {e}")))?;
        builder = builder.rule(rule);
    }
    let limiter = builder.build().map_err(|e| fail(e.to_string()))?;
    let mut model = TiersModel::new(tiers.to_vec());
    let mut later_refusals = 0;
    for (n, &(key, advance_us)) in steps.iter().enumerate() {
        clock.advance(Duration::from_micros(advance_us));
        let k = [key];
        let want = model
            .check(&k, ratewarden_core::Clock::now(&clock))
            .map_err(|e| fail(format!("model refused step {n}: {e}")))?;
        let d = limiter.check(&k).await;
        let rule = format!("t{}", want.tier);
        if d.source.degraded
            || d.source.rule != Some(rule.as_str())
            || Expected::of(&d) != want.expected
        {
            return Err(fail(format!(
                "step {n} of {} (key {key}, +{advance_us} µs): the limiter answered {:?} by rule \
                 {:?}{}, the model {:?} by rule {rule}",
                steps.len(),
                Expected::of(&d),
                d.source.rule,
                if d.source.degraded {
                    " (degraded: a store failed)"
                } else {
                    ""
                },
                want.expected,
            )));
        }
        later_refusals += usize::from(!want.expected.allowed && want.tier > 0);
    }
    Ok(later_refusals)
}

/// What [`refund_differential`] sent: decisions and refunds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefundCounts {
    /// Decisions compared with [`ratewarden_core::algorithm::apply`].
    pub decisions: u64,
    /// Refunds sent to the store and to [`ratewarden_core::algorithm::refund`].
    pub refunds: u64,
}

/// The policy shapes of the differentials: limits 1 to 100, windows of
/// 1 ms to an hour, some not a multiple of the limit.
const SHAPES: [(u32, Duration); 5] = [
    (1, Duration::from_millis(1)),
    (3, Duration::from_millis(7)),
    (10, Duration::from_secs(1)),
    (7, Duration::from_micros(1_000_003)),
    (100, Duration::from_secs(3600)),
];

/// One decision of a differential: `store` and
/// [`ratewarden_core::algorithm::apply`] on `state` must agree.
async fn decide_as_core(
    store: &dyn ratewarden_core::Store,
    key: &str,
    p: &Policy,
    state: &mut Option<ratewarden_core::algorithm::KeyState>,
    cost: u32,
    now: u64,
    step: usize,
) -> Result<Decision, crate::Failure> {
    let expected = Decision::from_verdict(
        ratewarden_core::algorithm::apply(state, p, cost, now),
        p,
        store.name(),
    );
    let got = call::decide(store, key.as_bytes(), p, cost, Timestamp::from_micros(now))
        .await
        .map_err(|e| crate::Failure(format!("{p}, step {step}, cost {cost}, now {now}: {e}")))?;
    if got != expected {
        return Err(crate::Failure(format!(
            "{p}, step {step}, cost {cost}, now {now}: store answered {got:?}, the core \
             {expected:?}"
        )));
    }
    Ok(got)
}

/// A policy of every algorithm in every one of `shapes`, each with a key of
/// its own, `{algorithm}-{shape}`.
fn keyed_policies(shapes: &[(u32, Duration)]) -> Result<Vec<(Policy, String)>, crate::Failure> {
    let mut policies = Vec::new();
    for algorithm in Algorithm::ALL {
        for (i, &(limit, window)) in shapes.iter().enumerate() {
            let p = Policy::new(algorithm, limit, window)
                .map_err(|e| crate::Failure(format!("{algorithm} shape {i}: {e}")))?;
            policies.push((p, format!("{algorithm}-{i}")));
        }
    }
    Ok(policies)
}

/// A small deterministic generator, so that a failing script reproduces.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }

    /// The next time after `now` for a window of `w` µs: mostly a small
    /// step forward, sometimes a jump past the window or a step back.
    fn step(&mut self, now: u64, w: u64) -> u64 {
        match self.next(20) {
            0 => now.saturating_sub(self.next(w)),
            1 => now + w + self.next(2 * w),
            _ => now + self.next(w / 4 + 1),
        }
    }
}

/// Decisions against [`ratewarden_core::algorithm::apply`], the normative
/// transcription, with no model in between: for every algorithm and five
/// policy shapes (limits 1 to 100, windows of 1 ms to an hour, some not a
/// multiple of the limit), `steps_per_key` decisions on a key of their own,
/// time mostly moving forward in small steps, sometimes jumping a window or
/// going back. The first decision that differs, or any store error, fails.
/// Returns the decisions compared.
///
/// Keys are `{algorithm}-{shape}`, so `store` needs a namespace of its own.
/// The script is fixed (seeded), so a failure reproduces.
pub async fn algorithm_differential(
    store: &dyn ratewarden_core::Store,
    steps_per_key: usize,
) -> Result<u64, crate::Failure> {
    use ratewarden_core::ManualClock;

    let shapes = &SHAPES[..];
    let t0 = ManualClock::DEFAULT_START.as_micros();
    let mut rng = Lcg(42);
    let mut checked = 0;
    for (p, key) in keyed_policies(shapes)? {
        let mut state = None;
        let w = p.window_micros();
        let mut now = t0 + rng.next(w);
        for step in 0..steps_per_key {
            now = rng.step(now, w);
            let cost = 1 + rng.next(u64::from(p.limit()).min(4)) as u32;
            decide_as_core(store, &key, &p, &mut state, cost, now, step).await?;
            checked += 1;
        }
    }
    Ok(checked)
}

/// Refunds against [`ratewarden_core::algorithm::refund`], which the
/// [`Model`] does not replay: for every algorithm and four policy shapes,
/// `steps_per_key` steps on a key of their own, each a decision or (about
/// one in three) a refund of an earlier admission, each refunded at most
/// once, in any order, some long after the fact. The store and the core
/// must leave every key in the same state, as the decisions that follow
/// show: the first decision that differs, or any store error, fails.
///
/// Keys are `{algorithm}-{shape}`, so `store` needs a namespace of its own
/// (a key prefix or a schema). The script is fixed (seeded), so a failure
/// reproduces; the counts returned let the caller check it exercised both
/// operations.
pub async fn refund_differential(
    store: &dyn ratewarden_core::Store,
    steps_per_key: usize,
) -> Result<RefundCounts, crate::Failure> {
    use ratewarden_core::ManualClock;
    use ratewarden_core::algorithm::refund;

    // The hour-long shape adds nothing to refunds but run time.
    let shapes = &SHAPES[..4];
    let t0 = ManualClock::DEFAULT_START.as_micros();
    let mut rng = Lcg(7);
    let mut counts = RefundCounts {
        decisions: 0,
        refunds: 0,
    };
    for (p, key) in keyed_policies(shapes)? {
        let mut state = None;
        let mut admitted: Vec<(u64, u32, Decision)> = Vec::new();
        let w = p.window_micros();
        let mut now = t0 + rng.next(w);
        for step in 0..steps_per_key {
            if !admitted.is_empty() && rng.next(3) == 0 {
                let pick = rng.next(admitted.len() as u64) as usize;
                let (at, cost, d) = admitted.swap_remove(pick);
                let reset_after = d.reset_after.as_micros() as u64;
                refund(&mut state, &p, cost, at, reset_after);
                call::refund(
                    store,
                    key.as_bytes(),
                    &p,
                    cost,
                    Timestamp::from_micros(at),
                    &d,
                )
                .await
                .map_err(|e| crate::Failure(format!("{p}, step {step}: refund failed: {e}")))?;
                counts.refunds += 1;
                continue;
            }
            now = rng.step(now, w);
            let cost = 1 + rng.next(u64::from(p.limit()).min(4)) as u32;
            let got = decide_as_core(store, &key, &p, &mut state, cost, now, step).await?;
            if got.allowed {
                admitted.push((now, cost, got));
            }
            counts.decisions += 1;
        }
    }
    Ok(counts)
}
