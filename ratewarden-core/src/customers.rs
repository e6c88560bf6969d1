//! [`CustomerLimits`]: each customer's limit read from the application's
//! own data (a table, a billing service) through a [`LimitSource`], cached
//! for a bounded time, so that a limit changes without a deploy.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use hashlink::LruCache;

use crate::plans::tiers_limiter;
use crate::{Clock, ConfigError, Limiter, Policy, Store, StoreError, parse_policies};

/// What a customer is limited to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CustomerLimit {
    /// One of the [`CustomerLimits`]' plans, by name.
    Plan(String),
    /// Limits of the customer's own (an override): one rule per policy, as
    /// [`Rule::tiers`](crate::Rule::tiers) makes them.
    Policies(Vec<Policy>),
}

impl CustomerLimit {
    /// Limits of the customer's own, written as [`parse_policies`] reads
    /// them (`"1000/h"`, `"gcra 20/s burst 100; 10000/d"`).
    pub fn policies(text: &str) -> Result<Self, ConfigError> {
        parse_policies(text)
            .map(CustomerLimit::Policies)
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }
}

/// Where [`CustomerLimits`] reads a customer's limit: the application's own
/// data. Asked at most once per customer per
/// [TTL](CustomerLimitsBuilder::ttl) and process, never on a request whose
/// customer's limit is cached.
///
/// Each distinct limit it returns is built into a limiter once (the last
/// 1,024 are kept built) and its policies are kept for the life of the
/// process, as every rule's are ([`Rule::new`](crate::Rule::new)): limits from an operator's
/// table, not from request data.
///
/// ```
/// use ratewarden_core::{CustomerLimit, LimitSource, StoreError, async_trait};
///
/// /// Customers on the pro plan, from a list the application keeps.
/// #[derive(Debug)]
/// struct Paying(Vec<String>);
///
/// #[async_trait]
/// impl LimitSource for Paying {
///     async fn limit(&self, customer: &str) -> Result<Option<CustomerLimit>, StoreError> {
///         Ok(self.0.iter().any(|c| c == customer).then(|| CustomerLimit::Plan("pro".into())))
///     }
/// }
/// ```
#[async_trait]
pub trait LimitSource: Send + Sync + fmt::Debug + 'static {
    /// The limit of `customer`; `None` for the default plan. An error is
    /// answered with the default plan (and logged), and asked again on the
    /// customer's next request.
    async fn limit(&self, customer: &str) -> Result<Option<CustomerLimit>, StoreError>;
}

/// Customer limits fixed at build time (a limits file's overrides), and
/// every other customer on the default plan.
#[derive(Debug, Default, Clone)]
pub struct StaticLimits {
    limits: Vec<(String, CustomerLimit)>,
}

impl StaticLimits {
    /// No customer of its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// `customer`'s limit; the last one given for a customer wins.
    pub fn with(mut self, customer: impl Into<String>, limit: CustomerLimit) -> Self {
        self.limits.push((customer.into(), limit));
        self
    }
}

#[async_trait]
impl LimitSource for StaticLimits {
    async fn limit(&self, customer: &str) -> Result<Option<CustomerLimit>, StoreError> {
        Ok(self
            .limits
            .iter()
            .rev()
            .find(|(c, _)| c == customer)
            .map(|(_, l)| l.clone()))
    }
}

/// The default [TTL](CustomerLimitsBuilder::ttl): a changed limit takes
/// effect within a minute.
pub const DEFAULT_LIMIT_TTL: Duration = Duration::from_secs(60);

/// The default number of customers whose limit is cached.
pub const DEFAULT_CUSTOMERS_CACHED: usize = 10_000;

/// The most distinct override limits whose limiters are kept built.
const OVERRIDES_KEPT: usize = 1_024;

/// The limiter a customer's request is decided by, and a name for it that
/// stays the same while the customer's limit does (`plan:pro`,
/// `own:gcra 20/s burst 100`): what a layer keys what it builds per limit
/// by.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The limit's name.
    pub name: Arc<str>,
    /// Its limiter.
    pub limiter: Limiter,
}

/// Each customer's limit from a [`LimitSource`], cached, and decided by
/// limiters that count in one rule, so that a customer moved to another
/// limit keeps the usage already counted (the plan-change rule of
/// [`Plans`](crate::Plans), here between limits of the same algorithm; a
/// limit of another algorithm counts apart, from nothing).
///
/// Unlike [`Plans`](crate::Plans), plans may differ in algorithm and
/// window, and a customer may have limits of its own.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ratewarden_core::{CustomerLimit, CustomerLimits, ManualClock, StaticLimits, Store};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
/// let clock = ManualClock::new();
/// let limits = CustomerLimits::builder("api", store)
///     .shared_clock(Arc::new(clock.clone()))
///     .plan("free", "fixed_window 3/min")
///     .plan("pro", "gcra 10/s burst 20")
///     .source(StaticLimits::new()
///         .with("acme", CustomerLimit::Plan("pro".into()))
///         .with("bigco", CustomerLimit::policies("fixed_window 100/min")?))
///     .ttl(Duration::from_secs(30))
///     .build()?;
/// assert_eq!(&*limits.resolve(Some("acme")).await.name, "plan:pro");
/// assert_eq!(&*limits.resolve(Some("bigco")).await.name, "own:fixed_window 100/min");
/// // Anyone else, and a request without a customer: the default plan.
/// let free = limits.resolve(Some("someone")).await.limiter;
/// for _ in 0..3 {
///     assert!(free.check(b"someone").await.allowed);
/// }
/// assert!(!free.check(b"someone").await.allowed);
/// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct CustomerLimits {
    inner: Arc<Inner>,
}

/// Builds the limiter of a list of policies.
type Build = dyn Fn(&[Policy]) -> Result<Limiter, ConfigError> + Send + Sync;

struct Inner {
    rule: String,
    build: Arc<Build>,
    clock: Arc<dyn Clock>,
    /// The default first.
    plans: Vec<(String, Resolved)>,
    source: Arc<dyn LimitSource>,
    ttl: Duration,
    /// Customer → its limit's name and limiter, and when it was read
    /// ([`Clock::monotonic`]).
    cached: Mutex<LruCache<String, (Resolved, Duration)>>,
    /// Limiters built for overrides, by their limit's name.
    overrides: Mutex<LruCache<Arc<str>, Resolved>>,
}

impl fmt::Debug for CustomerLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plans: Vec<&str> = self.inner.plans.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("CustomerLimits")
            .field("rule", &self.inner.rule)
            .field("plans", &plans)
            .field("source", &self.inner.source)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

impl CustomerLimits {
    /// A builder of limits counted in rule `rule` (and `rule-2`, … for a
    /// limit of several policies) of `store`.
    pub fn builder(rule: &str, store: Arc<dyn Store>) -> CustomerLimitsBuilder {
        CustomerLimitsBuilder {
            rule: rule.to_owned(),
            store,
            build: None,
            clock: None,
            plans: Vec::new(),
            default: None,
            source: None,
            ttl: DEFAULT_LIMIT_TTL,
            capacity: DEFAULT_CUSTOMERS_CACHED,
        }
    }

    /// The limiter of `customer`'s limit: from the cache while it is
    /// fresh, else from the source; the default plan's for `None`, for a
    /// customer the source does not know, and when the source fails, names
    /// a plan that does not exist, or gives policies the store refuses
    /// (each logged as a warning). Never an error: a request is never left
    /// unlimited for a lookup that went wrong.
    pub async fn resolve(&self, customer: Option<&str>) -> Resolved {
        let Some(customer) = customer else {
            return self.default_plan().clone();
        };
        if let Some(resolved) = self.cached(customer) {
            return resolved;
        }
        let inner = &self.inner;
        let (resolved, keep) = match inner.source.limit(customer).await {
            Ok(None) => (self.default_plan().clone(), true),
            Ok(Some(limit)) => match self.limit(&limit) {
                Ok(resolved) => (resolved, true),
                Err(e) => {
                    tracing::warn!(error = %e, "a customer's limit is not usable; the default plan applies");
                    (self.default_plan().clone(), true)
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "the customer-limit source failed; the default plan applies");
                (self.default_plan().clone(), false)
            }
        };
        if keep {
            let now = inner.clock.monotonic();
            lock(&inner.cached).insert(customer.to_owned(), (resolved.clone(), now));
        }
        resolved
    }

    /// `customer`'s cached limit, if read less than the TTL ago: what
    /// [`resolve`](Self::resolve) answers without awaiting.
    pub fn cached(&self, customer: &str) -> Option<Resolved> {
        let now = self.inner.clock.monotonic();
        let mut cached = lock(&self.inner.cached);
        match cached.get(customer) {
            Some((resolved, read)) if now.saturating_sub(*read) < self.inner.ttl => {
                Some(resolved.clone())
            }
            _ => None,
        }
    }

    /// Forgets every cached customer limit: the next request of each asks
    /// the source again (after an operator changed many limits at once).
    pub fn forget_cached(&self) {
        lock(&self.inner.cached).clear();
    }

    /// The default plan's limit.
    pub fn default_plan(&self) -> &Resolved {
        &self.inner.plans[0].1
    }

    /// Every plan, by name, the default first.
    pub fn plans(&self) -> impl ExactSizeIterator<Item = (&str, &Resolved)> {
        self.inner.plans.iter().map(|(n, r)| (n.as_str(), r))
    }

    /// Forgets `key`'s usage under every plan and every override limiter
    /// built so far ([`Limiter::reset`]); the first error, after trying
    /// them all.
    pub async fn reset(&self, key: &[u8]) -> Result<(), StoreError> {
        let overrides: Vec<Limiter> = lock(&self.inner.overrides)
            .iter()
            .map(|(_, r)| r.limiter.clone())
            .collect();
        let mut first = None;
        for limiter in self
            .inner
            .plans
            .iter()
            .map(|(_, r)| &r.limiter)
            .chain(&overrides)
        {
            if let Err(e) = limiter.reset(key).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn limit(&self, limit: &CustomerLimit) -> Result<Resolved, ConfigError> {
        match limit {
            CustomerLimit::Plan(name) => self
                .inner
                .plans
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, r)| r.clone())
                .ok_or_else(|| ConfigError::Invalid(format!("no plan named {name:?}"))),
            CustomerLimit::Policies(policies) => {
                let text: Vec<String> = policies.iter().map(Policy::to_string).collect();
                let name: Arc<str> = format!("own:{}", text.join("; ")).into();
                if let Some(resolved) = lock(&self.inner.overrides).get(&name) {
                    return Ok(resolved.clone());
                }
                let inner = &self.inner;
                let limiter = (inner.build)(policies)?;
                let resolved = Resolved { name, limiter };
                lock(&inner.overrides).insert(resolved.name.clone(), resolved.clone());
                Ok(resolved)
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds [`CustomerLimits`]; see [`CustomerLimits::builder`].
pub struct CustomerLimitsBuilder {
    rule: String,
    store: Arc<dyn Store>,
    build: Option<Arc<Build>>,
    clock: Option<Arc<dyn Clock>>,
    plans: Vec<(String, String)>,
    default: Option<String>,
    source: Option<Arc<dyn LimitSource>>,
    ttl: Duration,
    capacity: usize,
}

impl fmt::Debug for CustomerLimitsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomerLimitsBuilder")
            .field("rule", &self.rule)
            .field("plans", &self.plans)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl CustomerLimitsBuilder {
    /// Adds plan `name` with the limits `policies` says
    /// ([`parse_policies`]); plans may differ in algorithm and window. The
    /// first plan is the default unless [`default`](Self::default) says
    /// otherwise.
    pub fn plan(mut self, name: &str, policies: &str) -> Self {
        self.plans.push((name.to_owned(), policies.to_owned()));
        self
    }

    /// The plan of a customer the source does not know, of a request
    /// without a customer, and of every lookup that fails. Make it the
    /// strictest.
    pub fn default(mut self, name: &str) -> Self {
        self.default = Some(name.to_owned());
        self
    }

    /// Where customers' limits are read; without one, every customer is on
    /// the default plan.
    pub fn source(self, source: impl LimitSource) -> Self {
        self.shared_source(Arc::new(source))
    }

    /// [`source`](Self::source), shared.
    pub fn shared_source(mut self, source: Arc<dyn LimitSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// How long a customer's limit is used before the source is asked
    /// again: a changed limit takes effect within it. From one second to
    /// one day; [`DEFAULT_LIMIT_TTL`] unless set.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How many customers' limits are cached, the least recently used
    /// forgotten first; [`DEFAULT_CUSTOMERS_CACHED`] unless set.
    pub fn capacity(mut self, customers: usize) -> Self {
        self.capacity = customers;
        self
    }

    /// Builds each limit's limiter with `build` instead of
    /// [`Rule::tiers`](crate::Rule::tiers) on the builder's store: for limiters composed by
    /// hand (a memory tier in front, a fallback, a failure policy). Every
    /// limiter it builds must count in the same rules, named as
    /// [`Rule::tiers`](crate::Rule::tiers) names them, for usage to carry over between limits,
    /// and read the builder's clock.
    pub fn limiter_with(
        mut self,
        build: impl Fn(&[Policy]) -> Result<Limiter, ConfigError> + Send + Sync + 'static,
    ) -> Self {
        self.build = Some(Arc::new(build));
        self
    }

    /// The clock every limiter reads; the system clock unless set. The
    /// TTL is measured on its [`monotonic`](Clock::monotonic) reading.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The limits. Refuses no plan, a plan's text that is not a list of
    /// policies or that the store refuses (the error names the plan), a
    /// plan given twice, a default that is not a plan, a TTL outside one
    /// second to one day and a capacity of zero.
    pub fn build(self) -> Result<CustomerLimits, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&self.ttl) {
            return Err(invalid(format!(
                "a customer limit's TTL must be from 1 s to 1 day, not {:?}",
                self.ttl
            )));
        }
        let capacity = NonZeroUsize::new(self.capacity).ok_or_else(|| {
            invalid("customer limits need a cache of at least one customer".into())
        })?;
        let clock = self.clock.unwrap_or_else(|| Arc::new(crate::SystemClock));
        let build: Arc<Build> = match self.build {
            Some(build) => build,
            None => {
                let (rule, store, clock) = (self.rule.clone(), self.store.clone(), clock.clone());
                Arc::new(move |policies: &[Policy]| tiers_limiter(&rule, &store, &clock, policies))
            }
        };
        let mut plans: Vec<(String, Resolved)> = Vec::new();
        for (name, text) in &self.plans {
            if plans.iter().any(|(n, _)| n == name) {
                return Err(invalid(format!("plan {name:?} is given twice")));
            }
            let policies =
                parse_policies(text).map_err(|e| invalid(format!("plan {name:?}: {e}")))?;
            let limiter = build(&policies).map_err(|e| invalid(format!("plan {name:?}: {e}")))?;
            let resolved = Resolved {
                name: format!("plan:{name}").into(),
                limiter,
            };
            plans.push((name.clone(), resolved));
        }
        let default = self
            .default
            .or_else(|| plans.first().map(|(n, _)| n.clone()))
            .ok_or_else(|| invalid("customer limits need at least one plan".into()))?;
        let Some(at) = plans.iter().position(|(n, _)| *n == default) else {
            let names: Vec<&str> = plans.iter().map(|(n, _)| n.as_str()).collect();
            return Err(invalid(format!(
                "the default plan {default:?} is not one of the plans {names:?}"
            )));
        };
        plans[..=at].rotate_right(1);
        Ok(CustomerLimits {
            inner: Arc::new(Inner {
                rule: self.rule,
                build,
                clock,
                plans,
                source: self.source.unwrap_or_else(|| Arc::new(StaticLimits::new())),
                ttl: self.ttl,
                cached: Mutex::new(LruCache::new(capacity.get())),
                overrides: Mutex::new(LruCache::new(OVERRIDES_KEPT)),
            }),
        })
    }
}
