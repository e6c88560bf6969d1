//! The storage contract every backend implements.

mod request;

pub use request::{Key, Refund, Request};

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::policy::Policy;

/// What a store can do, declared so that composition and the conformance
/// suite can adapt to it instead of guessing.
///
/// Build one with [`new`](Self::new) and the methods that apply; fields may
/// be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The algorithms the store implements.
    pub algorithms: &'static [Algorithm],
    /// The most keys the store holds at once, if it is bounded in keys
    /// (an in-process store); `None` for a store whose keys expire on their
    /// own (Redis TTLs, Postgres sweeps).
    pub key_capacity: Option<usize>,
    /// Several processes share the store's state (Redis, Postgres), so one
    /// limit holds across a fleet.
    pub shared: bool,
    /// The store decides with its own server's clock and ignores the `now`
    /// passed to it, so that hosts with skewed clocks agree. A store in this
    /// mode cannot be driven by a manual clock.
    pub server_clock: bool,
    /// The store applies a policy's [`Ban`](crate::Ban) in the same atomic
    /// step as its algorithm (see [`ban`](crate::ban)). A store without
    /// this refuses a banning policy at construction
    /// ([`Store::check_policy`]'s default does), rather than ignore it.
    pub bans: bool,
}

impl Capabilities {
    /// A store applying `algorithms`, unbounded in keys, private to its
    /// process, on the caller's clock.
    pub const fn new(algorithms: &'static [Algorithm]) -> Self {
        Capabilities {
            algorithms,
            key_capacity: None,
            shared: false,
            server_clock: false,
            bans: false,
        }
    }

    /// Holds at most `keys` keys at once.
    pub const fn with_key_capacity(mut self, keys: usize) -> Self {
        self.key_capacity = Some(keys);
        self
    }

    /// Shared by several processes.
    pub const fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// Decides on its own server's clock.
    pub const fn server_clock(mut self) -> Self {
        self.server_clock = true;
        self
    }

    /// Applies bans.
    pub const fn with_bans(mut self) -> Self {
        self.bans = true;
        self
    }
}

/// A place that holds rate-limit state and applies a [`Policy`] to a key
/// atomically.
///
/// The one operation, [`decide`](Store::decide), runs the whole algorithm
/// inside the store — under a lock, in one Lua script, in one SQL statement —
/// never as a read followed by a write from the client. A limiter that makes
/// several round trips per request multiplies the load it exists to shed.
///
/// The trait is object safe and meant to be shared as `Arc<dyn Store>`.
///
/// # Implementing a store
///
/// Eight methods are required: [`name`](Store::name),
/// [`capabilities`](Store::capabilities), [`max_key_len`](Store::max_key_len),
/// [`decide`](Store::decide), [`refund`](Store::refund),
/// [`peek`](Store::peek), [`reset`](Store::reset) and
/// [`penalize`](Store::penalize); a store that
/// implements them to the contract below passes the whole conformance suite.
/// The three others have defaults that pass it too:
/// [`check_policy`](Store::check_policy) reads the capabilities, and
/// [`decide_inline`](Store::decide_inline) and
/// [`refund_inline`](Store::refund_inline) say "await me", which only an
/// in-process store should override. The trait is async through
/// [`async_trait`](crate::async_trait), re-exported here so that a store
/// crate needs no dependency of its own for it (the trait must stay object
/// safe, as `Arc<dyn Store>`, which native `async fn` in traits is not).
///
/// A store is handed its arguments already checked: a [`Request`] holds a
/// cost its policy can admit and a key no longer than
/// [`max_key_len`](Store::max_key_len), a [`Refund`] an admitted decision,
/// a [`Key`] a key within the bound. Only [`Request::new`],
/// [`Refund::new`] and [`Key::new`] make them, and they refuse the rest
/// with an [`InvalidRequest`](crate::ErrorKind::InvalidRequest) error: no
/// store validates arguments, and every store refuses the same mistakes
/// the same way.
///
/// A complete, correct store, which `ratewarden-core/tests/example_store.rs`
/// runs against the whole conformance suite:
///
/// ```
#[doc = include_str!("example.rs")]
/// # fn main() {}
/// ```
///
/// Then two lines in the store crate's `tests/conformance.rs` run every
/// scenario of the contract below against it, and the composition scenarios
/// with it as a limiter's shared tier (`ratewarden-conformance`):
///
/// ```text
/// async fn store() -> Arc<dyn Store> { Arc::new(MapStore::default()) }
/// ratewarden_conformance::conformance_tests!(store);
/// ```
///
/// # Contract
///
/// Each item is the name of a scenario in `ratewarden-conformance`, which checks
/// it against any implementation:
///
/// * `policy_semantics` — every supported algorithm matches
///   [`algorithm`](crate::algorithm) at its boundaries: `remaining`,
///   `reset_after` and `retry_after` are exact, and a request retried after
///   `retry_after` is admitted while one a microsecond earlier is not.
/// * `cost_accounting` — a request of cost `c` consumes `c` units, is
///   admitted only if all `c` fit, and consumes nothing when refused.
/// * `key_independence` — one key's traffic never changes another's
///   decisions.
/// * `refused_hammering` — refused requests are not recorded: a client that
///   keeps hammering regains access exactly when its admitted requests say,
///   never later and never earlier.
/// * `distinct_key_flood` — an offender at its limit stays limited while an
///   attacker floods fresh keys (three times the store's key capacity, if it
///   has one); a bounded store evicts least-recently-*touched* keys and a
///   refusal touches its key. (That a bounded store never holds more than
///   its capacity is for the backend's own tests: the key count is not
///   visible through this trait.)
/// * `window_renewal` — a window's expiry is fixed when it opens; hits inside
///   it never move it, and the count resets when it ends.
/// * `concurrent_exactness` — concurrent callers on one key are admitted
///   exactly `limit` times: no lost updates, no over-admission.
/// * `hostile_keys` — any byte string is a valid, distinct key: empty, 10 KB,
///   newlines, quotes, SQL and Lua syntax, invalid UTF-8.
/// * `clock_regression` — a `now` earlier than one already seen never
///   panics and never admits more than the limit.
/// * `bad_configuration` — policies a store cannot represent are refused by
///   [`check_policy`](Store::check_policy) at construction, and the
///   largest policies it accepts are applied as written.
/// * `key_length_bound` — the store declares the longest key it accepts
///   ([`max_key_len`](Store::max_key_len), at most 1 MiB), and a key of
///   exactly that length is valid and distinct, on every operation. (A
///   longer key never reaches a store: [`Key::new`] refuses it.)
/// * `refund_exactness` — [`refund`](Store::refund) of an admission leaves the
///   key as if the request had never been admitted, for every algorithm and
///   cost, and a refund of units that are no longer held (a closed window, a
///   later GCRA admission, a key never seen) never makes the key more
///   permissive.
/// * `peek_never_records` — [`peek`](Store::peek) answers exactly what
///   `decide` would at that moment, for every algorithm and cost, and
///   changes nothing: peeking a fresh key opens no window, peeking a
///   refused key extends nothing, and any number of peeks leave every later
///   decision as it would have been.
/// * `reset_is_exact` — after [`reset`](Store::reset) an exhausted key
///   admits exactly its full limit, also to concurrent callers, for every
///   algorithm; other keys, and the same key under other algorithms, keep
///   their state; resetting a key never seen is not an error.
/// * `policy_change` — state is kept per (algorithm, key), not per policy:
///   a key decided under one limit and then another of the same window (a
///   plan upgrade or downgrade) is decided on its whole usage, so switching
///   back and forth never admits more than the limit each request is
///   decided under allows.
/// * `penalty_is_counted` — [`penalize`](Store::penalize) records its units
///   whether or not they fit, within its bounds, exactly as
///   [`algorithm::penalize`](crate::algorithm::penalize): a key already
///   over its limit waits longer, a new key is created charged.
/// * `bans_are_exact` — a policy's [`Ban`](crate::Ban) is applied as
///   [`ban`](crate::ban) says, in the same atomic step as the decision (and
///   in a peek, which records nothing): a banned key's refusals record
///   nothing, so a ban never extends itself; a reset lifts it. A store that
///   does not declare [`Capabilities::bans`] refuses a banning policy in
///   [`check_policy`](Store::check_policy), as the default does.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// A short, stable name (`"memory"`, `"redis"`, …), reported in every
    /// [`Decision`] and in metrics.
    fn name(&self) -> &'static str;

    /// What the store can do.
    fn capabilities(&self) -> Capabilities;

    /// Refuses a policy the store cannot apply. Called when a rule is built,
    /// so a bad combination fails at start-up rather than at the first
    /// request. The default checks the algorithm against
    /// [`Capabilities::algorithms`], and a [`Ban`](crate::Ban) against
    /// [`Capabilities::bans`].
    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        let capabilities = self.capabilities();
        if !capabilities.algorithms.contains(&policy.algorithm()) {
            return Err(ConfigError::UnsupportedAlgorithm {
                store: self.name(),
                algorithm: policy.algorithm(),
            });
        }
        if policy.ban().is_some() && !capabilities.bans {
            return Err(ConfigError::UnsupportedBan { store: self.name() });
        }
        Ok(())
    }

    /// Atomically applies the request's policy to its key for its cost at
    /// its time, counting it only if it is admitted.
    ///
    /// State is kept per (algorithm, key): callers that apply several
    /// policies of one algorithm to the same key must namespace the key (a
    /// [`Limiter`](crate::Limiter) prefixes it with the rule's name).
    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError>;

    /// The same answer as [`decide`](Store::decide), given at once without a
    /// future, by a store that never waits: state in process memory under a
    /// short lock, no I/O. `None` (the default) means the store must be
    /// awaited.
    ///
    /// A [`Limiter`](crate::Limiter) asks this once per rule and request,
    /// before anything else, and when it answers spends nothing else on the
    /// call: no boxed future, no timeout timer
    /// and no circuit breaker, which exist for stores that can hang. A store
    /// that answers here must never block the thread for longer than a lock
    /// held for one key's update, and must answer exactly as `decide` would
    /// (the conformance suite sends every other request of its scenarios
    /// here, so a difference fails them).
    fn decide_inline(&self, request: Request<'_>) -> Option<Result<Decision, StoreError>> {
        let _ = request;
        None
    }

    /// The notices by which this store tells the refusal caches in front of
    /// it that a key's state changed elsewhere: a store shared by a fleet
    /// returns one, calls [`Invalidations::invalidate`](crate::Invalidations::invalidate) for every key
    /// another instance [`reset`](Store::reset) (announced by its own
    /// `reset`, through the server's own mechanism: Redis pub/sub, Postgres
    /// `LISTEN`/`NOTIFY`), and [`Invalidations::lost`](crate::Invalidations::lost) while it may miss
    /// such notices. It must return the same table on every call: rules
    /// read it once, when they are built. `None` (the default): a reset
    /// reaches the refusal caches of this process only, and another
    /// instance's cached refusal stands until its retry time.
    fn invalidations(&self) -> Option<std::sync::Arc<crate::Invalidations>> {
        None
    }

    /// The same as [`refund`](Store::refund), given at once by a store that
    /// answers [`decide_inline`](Store::decide_inline); `None` (the default)
    /// means the store must be awaited.
    fn refund_inline(&self, refund: Refund<'_>) -> Option<Result<(), StoreError>> {
        let _ = refund;
        None
    }

    /// The longest key, in bytes, the store accepts; [`Key::new`] refuses a
    /// longer one with an [`InvalidRequest`](crate::ErrorKind::InvalidRequest)
    /// error before the store sees it. Bounded memory per key is an
    /// invariant: an
    /// application passing attacker-chosen bytes must not be able to grow a
    /// store by making keys longer. [`DEFAULT_MAX_KEY_LEN`] is a good
    /// default; the conformance suite checks bounds up to 1 MiB.
    fn max_key_len(&self) -> usize;

    /// Undoes one admission that [`decide`](Store::decide) made: the
    /// refund's [`admitted`](Refund::admitted) decision is the one `decide`
    /// returned for its [`request`](Refund::request), or one with the same
    /// `allowed` and `reset_after` (what locates the admission; a
    /// [`Limiter`](crate::Limiter) keeps only those).
    ///
    /// A [`Limiter`](crate::Limiter) calls it, once per admission and only on
    /// the refusal path, when a later rule refuses a request an earlier rule
    /// admitted, so that a refused request is recorded by no rule. The
    /// semantics are [`algorithm::refund`](crate::algorithm::refund): the key
    /// ends exactly as if the request had never been admitted, or stricter
    /// when other admissions have moved its state since; never more
    /// permissive. (A refusal cannot be refunded: [`Refund::new`] refuses
    /// it.)
    ///
    /// A store that cannot undo an admission answers
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported): a `Limiter` then keeps the admission
    /// (stricter, counted in
    /// [`RuleStats::refund_failures`](crate::RuleStats::refund_failures)),
    /// and the conformance scenario `refund_exactness` fails.
    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError>;

    /// The decision [`decide`](Store::decide) would return for the same
    /// arguments, changing nothing: no unit counted, no window opened, no
    /// expiry moved, no key created or touched (so a peek can neither evict
    /// a key nor keep one from being evicted), no abuse event. What a later
    /// request gets is what it would have got without the peek.
    ///
    /// For telling a client its quota without spending it. Off the hot
    /// path: a store may answer it as a decision it then undoes inside its
    /// own transaction, or from a copy of the state, at a little more cost
    /// than a decision.
    ///
    /// A store whose state lives in one structure can copy it and call
    /// [`algorithm::peek`](crate::algorithm::peek).
    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError>;

    /// Forgets what the store holds for `key` under `policy`'s algorithm,
    /// atomically: the next requests get exactly the policy's full limit,
    /// as a key never seen would. A key the store does not hold is not an
    /// error.
    ///
    /// For operators lifting a limit (a customer locked out by mistake, a
    /// test account). Only the state for that algorithm is forgotten: a
    /// [`Limiter`](crate::Limiter) namespaces each rule's keys, and
    /// [`Limiter::reset`](crate::Limiter::reset) resets every rule's.
    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError>;

    /// Records the request's cost for its key at its time whether or not they fit, as
    /// [`algorithm::penalize`](crate::algorithm::penalize) does: a charge an
    /// application decides late (a failed payment costs 5), which lengthens
    /// the key's wait even when it is already over its limit. Atomic, like
    /// `decide`; bounded as `algorithm::penalize` bounds it.
    ///
    /// A store applies [`algorithm::penalize`](crate::algorithm::penalize)
    /// to the key's state where `decide` applies
    /// [`algorithm::apply`](crate::algorithm::apply). A wrapper forwards
    /// this, as it forwards every provided method
    /// ([`forward_store_identity!`](crate::forward_store_identity) forwards
    /// those that say what the store is): one that does not forward
    /// [`invalidations`](Store::invalidations), say, hides its store's
    /// notices from the rules in front of it.
    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError>;
}

/// Forwards the [`Store`] methods that say what a store is to the store a
/// wrapper holds in `self.$field`: [`name`](Store::name),
/// [`capabilities`](Store::capabilities), [`max_key_len`](Store::max_key_len),
/// [`check_policy`](Store::check_policy) and
/// [`invalidations`](Store::invalidations), inside the wrapper's `impl
/// Store`.
///
/// Written by hand, these are easy to forget, and the compiler does not
/// ask for the provided ones: a wrapper that does not forward
/// `check_policy` accepts a policy its store refuses, and one that does not
/// forward `invalidations` hides its store's notices from the refusal caches
/// in front of it. The decision methods stay the wrapper's own, since they
/// are what it changes (and `async_trait` methods cannot come from a
/// macro); forward `decide_inline` and `refund_inline` too unless the
/// wrapper must see every call.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use ratewarden_core::{Decision, Key, Policy, Refund, Request, Store, StoreError, async_trait};
///
/// /// Counts the decisions that reach the store it wraps.
/// #[derive(Debug)]
/// struct Counting<S> {
///     inner: S,
///     decisions: AtomicU64,
/// }
///
/// #[async_trait]
/// impl<S: Store> Store for Counting<S> {
///     ratewarden_core::forward_store_identity!(inner);
///
///     async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
///         self.decisions.fetch_add(1, Ordering::Relaxed);
///         self.inner.decide(request).await
///     }
///
///     async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
///         self.inner.refund(refund).await
///     }
///
///     async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
///         self.inner.peek(request).await
///     }
///
///     async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
///         self.inner.reset(key, policy).await
///     }
///
///     async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
///         self.inner.penalize(request).await
///     }
/// }
///
/// let store = Counting { inner: ratewarden_memory::MemoryStore::default(), decisions: AtomicU64::new(0) };
/// assert_eq!(store.name(), "memory");
/// ```
#[macro_export]
macro_rules! forward_store_identity {
    ($field:tt) => {
        fn name(&self) -> &'static str {
            $crate::Store::name(&self.$field)
        }

        fn capabilities(&self) -> $crate::Capabilities {
            $crate::Store::capabilities(&self.$field)
        }

        fn max_key_len(&self) -> usize {
            $crate::Store::max_key_len(&self.$field)
        }

        fn check_policy(&self, policy: &$crate::Policy) -> Result<(), $crate::ConfigError> {
            $crate::Store::check_policy(&self.$field, policy)
        }

        fn invalidations(&self) -> Option<std::sync::Arc<$crate::Invalidations>> {
            $crate::Store::invalidations(&self.$field)
        }
    };
}

#[async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }

    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        (**self).check_policy(policy)
    }

    fn max_key_len(&self) -> usize {
        (**self).max_key_len()
    }

    fn invalidations(&self) -> Option<Arc<crate::Invalidations>> {
        (**self).invalidations()
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        (**self).decide(request).await
    }

    fn decide_inline(&self, request: Request<'_>) -> Option<Result<Decision, StoreError>> {
        (**self).decide_inline(request)
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        (**self).refund(refund).await
    }

    fn refund_inline(&self, refund: Refund<'_>) -> Option<Result<(), StoreError>> {
        (**self).refund_inline(refund)
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        (**self).peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        (**self).reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        (**self).penalize(request).await
    }
}

/// The most keys an in-process store holds unless configured otherwise
/// (`ratewarden_memory::MemoryStore::default()`, a `memory://` URL without
/// `?capacity=`): 100,000 keys, a few tens of MiB at most.
pub const DEFAULT_KEY_CAPACITY: usize = 100_000;

/// The longest key a store accepts unless configured otherwise: 16 KiB.
/// Room for any rule name and client key a limiter builds (an HMAC client
/// key is 32 bytes), and for the 10 KB keys of the conformance suite, while
/// keeping what one key can cost a store small and fixed.
pub const DEFAULT_MAX_KEY_LEN: usize = 16 * 1024;
