//! Limits described in a TOML file, and reloaded without a restart
//! (feature `config`).
//!
//! ```toml
//! # Stores by name, as `ratewarden::store::from_url` opens them. An
//! # application can also hand its own in (`LimitsBuilder::store`).
//! [stores]
//! local = "memory://?capacity=100000"
//! shared = "redis://10.0.0.5:6379"
//!
//! # A limit of one rule: a store (default: the one named "default") and a
//! # policy in `Policy`'s text.
//! [limits.feedback]
//! store = "shared"
//! policy = "5/hour"
//! on_failure = "closed"          # or "open" (the default)
//!
//! # A limit of several rules, checked in order: a memory tier in front of
//! # the shared store, which is bought in leases of 16 units.
//! [limits.search]
//! rules = [
//!   { name = "search-local", store = "local", policy = "60/minute" },
//!   { store = "shared", policy = "60/minute", lease = 16, timeout_ms = 100, fallback = "local" },
//! ]
//!
//! # Escalation: decided in memory, one admission in `every` confirmed by
//! # the durable store.
//! [limits.contact]
//! store = "local"
//! policy = "10/day"
//! escalate = { store = "shared", policy = "10/day", every = 10 }
//!
//! # Shadow mode: decided and counted, never refused (`Rule::with_shadow`).
//! # Set it to false and reload to switch the limit on: it keeps its counts.
//! [limits.upload]
//! policy = "20/hour"
//! shadow = true
//!
//! # Per-route limits: which limit each route takes.
//! [routes]
//! "/api/search" = "search"
//! "/api/feedback" = "feedback"
//!
//! # Limits per customer (`Limits::customers`, `CustomerLimits`): plans,
//! # which may differ in algorithm and window, the default plan, and
//! # customers' own limits, a plan's name or limits of their own. An
//! # application adds its own source (a table) with
//! # `LimitsBuilder::customer_source`, read after these overrides.
//! [customers.api]
//! store = "shared"
//! default = "free"
//! plans = { free = "100/hour", pro = "gcra 20/s burst 100" }
//! overrides = { acme = "pro", bigco = "fixed_window 5000/hour" }
//! ttl_s = 60                     # a changed limit applies within it
//!
//! # Clients refused outright (403) and clients never limited, by address
//! # range and by client key (`ratewarden::access`; `Limits::access`).
//! [access]
//! allow = ["10.0.0.0/8", "2001:db8:cafe::/48"]
//! deny = ["192.0.2.0/24"]
//! deny_keys = ["0123456789abcdef0123456789abcdef"]
//! ```
//!
//! [`Limits`] holds what a file built: a [`Limiter`] per limit, and per
//! route. Anything wrong with a file (not TOML, an unknown key, a policy
//! that does not parse, a store no one named, a rule a store cannot apply)
//! is refused with the file's name, the line and column, and the line
//! itself, so the key at fault is in the message.
//!
//! A file that would limit nothing is refused too, as an empty or cut-short
//! file would otherwise lift every limit without a word: one with no limit
//! at all, and at a reload one whose `[routes]` are gone while the limits
//! in force have routes. [`LimitsBuilder::allow_empty`] accepts them. A
//! route must start with `/`.
//!
//! **Reloading.** [`Limits::reload`] reads the file again and builds new
//! limiters on the *same* stores: a store whose name and URL did not change
//! is kept, with everything it has counted, and so are leases. A limit whose
//! policy changes keeps its clients' usage as long as its rules keep their
//! names and algorithms (state is kept per rule name and algorithm). A
//! store or lease the file stops using is set aside for one reload: if the
//! next reload that loads names it again (the store with the same URL), it
//! comes back with its counts and units; otherwise it is dropped then. So a
//! limit taken out of the file and put back by the next reload has lost
//! nothing. A file that does not load changes nothing, and does not count
//! as a reload. [`Reloader`] puts it together
//! for a server: it rebuilds the application's service from the new limits
//! and swaps it into a [`Reloadable`] service, on [`Reloader::reload`] or on
//! `SIGHUP` ([`Reloader::reload_on_sighup`]); requests in flight finish on
//! the service they started on. A rebuild that fails or panics is reported
//! and leaves the limits and the service in place.

// About 890 lines, 65 of them these docs: the file's format, its errors
// (file, line, column), the stores and rules it builds and the reload that
// keeps them, which share the parsed types.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::access::AccessList;
use ratewarden_core::lease::{LeaseConfig, LeasedStore};
use ratewarden_core::{
    Clock, ConfigError, FailurePolicy, Limiter, Policy, Rule, Store, SystemClock,
};
use ratewarden_core::{CustomerLimit, CustomerLimits, LimitSource, StaticLimits, StoreError};
use serde::Deserialize;
use toml::Spanned;

/// A file's customer overrides, then the application's source.
#[derive(Debug)]
struct FileFirst {
    file: StaticLimits,
    then: Option<Arc<dyn LimitSource>>,
}

#[ratewarden_core::async_trait]
impl LimitSource for FileFirst {
    async fn limit(&self, customer: &str) -> Result<Option<CustomerLimit>, StoreError> {
        if let Some(limit) = self.file.limit(customer).await? {
            return Ok(Some(limit));
        }
        match &self.then {
            Some(source) => source.limit(customer).await,
            None => Ok(None),
        }
    }
}
use tower::Service;
use tower::util::{Oneshot, ServiceExt};

/// The store a limit or rule uses when it names none.
pub const DEFAULT_STORE: &str = "default";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    stores: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    limits: BTreeMap<String, Spanned<LimitSpec>>,
    #[serde(default)]
    routes: BTreeMap<Spanned<String>, Spanned<String>>,
    access: Option<AccessSpec>,
    #[serde(default)]
    customers: BTreeMap<String, Spanned<CustomersSpec>>,
}

/// `[customers.NAME]`: a [`CustomerLimits`] counted in rule `NAME`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomersSpec {
    store: Option<Spanned<String>>,
    default: Spanned<String>,
    plans: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    overrides: BTreeMap<String, Spanned<String>>,
    ttl_s: Option<Spanned<u64>>,
    capacity: Option<Spanned<usize>>,
}

/// `[access]`: the allow and deny lists every layer built from the file
/// gets ([`Limits::access`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessSpec {
    #[serde(default)]
    allow: Vec<Spanned<String>>,
    #[serde(default)]
    deny: Vec<Spanned<String>>,
    #[serde(default)]
    allow_keys: Vec<Spanned<String>>,
    #[serde(default)]
    deny_keys: Vec<Spanned<String>>,
}

/// One limit: the fields of a single rule, or `rules`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitSpec {
    rules: Option<Vec<Spanned<RuleSpec>>>,
    name: Option<String>,
    store: Option<Spanned<String>>,
    policy: Option<Spanned<Policy>>,
    on_failure: Option<Spanned<String>>,
    timeout_ms: Option<Spanned<u64>>,
    fallback: Option<Spanned<String>>,
    lease: Option<Spanned<u32>>,
    escalate: Option<Spanned<EscalateSpec>>,
    shadow: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    name: Option<String>,
    store: Option<Spanned<String>>,
    policy: Spanned<Policy>,
    on_failure: Option<Spanned<String>>,
    timeout_ms: Option<Spanned<u64>>,
    fallback: Option<Spanned<String>>,
    lease: Option<Spanned<u32>>,
    escalate: Option<Spanned<EscalateSpec>>,
    shadow: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EscalateSpec {
    store: Spanned<String>,
    policy: Spanned<Policy>,
    every: u32,
}

/// A leased view of a store, with the store it leases from.
type Lease = (Arc<dyn Store>, Arc<LeasedStore>);

/// A store the file opened, with the URL it was opened from.
#[derive(Clone)]
struct Opened {
    url: String,
    store: Arc<dyn Store>,
}

/// What a file built: a [`Limiter`] for each of its limits and routes.
/// Cheap to clone.
#[derive(Clone)]
pub struct Limits {
    origin: String,
    path: Option<PathBuf>,
    given: Arc<BTreeMap<String, Arc<dyn Store>>>,
    clock: Arc<dyn Clock>,
    opened: BTreeMap<String, Opened>,
    /// Leased views of stores, by store name and batch size, kept across
    /// reloads so that units in hand are not stranded.
    leases: BTreeMap<(String, u32), Lease>,
    /// What the limits before these opened or leased and these do not use,
    /// kept for the next reload to take back, counts and all.
    retired: BTreeMap<String, Opened>,
    retired_leases: BTreeMap<(String, u32), Lease>,
    /// Whether a file that limits nothing is accepted; reloads keep it.
    allow_empty: bool,
    limiters: BTreeMap<String, Limiter>,
    /// The limits that name nothing but a policy.
    bare: BTreeMap<String, Policy>,
    routes: BTreeMap<String, String>,
    access: AccessList,
    customers: BTreeMap<String, CustomerLimits>,
    /// The application's sources of customer limits, by name.
    sources: Arc<BTreeMap<String, Arc<dyn LimitSource>>>,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limits")
            .field("origin", &self.origin)
            .field("limits", &self.limiters.keys().collect::<Vec<_>>())
            .field("routes", &self.routes)
            .finish_non_exhaustive()
    }
}

/// Builds [`Limits`]; see [`Limits::builder`].
#[derive(Clone)]
pub struct LimitsBuilder {
    given: BTreeMap<String, Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    allow_empty: bool,
    sources: BTreeMap<String, Arc<dyn LimitSource>>,
}

impl fmt::Debug for LimitsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitsBuilder")
            .field("stores", &self.given.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl LimitsBuilder {
    /// Names one of the application's own stores, for the file to use
    /// like those under `[stores]` (which may not reuse the name). A store
    /// named [`DEFAULT_STORE`] decides every rule that names none.
    pub fn store(mut self, name: impl Into<String>, store: Arc<dyn Store>) -> Self {
        self.given.insert(name.into(), store);
        self
    }

    /// Where `[customers.NAME]` reads the limits of customers the file
    /// does not list (a table of the application's, say), at every load
    /// and reload. A source for a name the file does not have is unused.
    pub fn customer_source(
        mut self,
        name: impl Into<String>,
        source: Arc<dyn LimitSource>,
    ) -> Self {
        self.sources.insert(name.into(), source);
        self
    }

    /// The clock every limiter reads; the system's unless set.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Accepts a file that defines no limit, and at a reload one without
    /// `[routes]` while the limits in force have some. Without it such a
    /// file is refused like a broken one, at the first load and at every
    /// reload: an empty or cut-short file would otherwise lift every limit.
    pub fn allow_empty(mut self, allow: bool) -> Self {
        self.allow_empty = allow;
        self
    }

    /// Reads and builds the file at `path`.
    pub async fn load(self, path: impl AsRef<Path>) -> Result<Limits, ConfigError> {
        let path = path.as_ref();
        let text = read(path)?;
        let empty = self.empty(path.display().to_string(), Some(path.to_owned()));
        empty.rebuilt(&text).await
    }

    /// Builds the limits in `text`; errors name it `origin`.
    pub async fn parse(self, text: &str, origin: &str) -> Result<Limits, ConfigError> {
        self.empty(origin.to_owned(), None).rebuilt(text).await
    }

    fn empty(self, origin: String, path: Option<PathBuf>) -> Limits {
        let mut limits = Limits::empty(
            origin,
            path,
            Arc::new(self.given),
            self.clock,
            self.allow_empty,
        );
        limits.sources = Arc::new(self.sources);
        limits
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Invalid(format!("cannot read {}: {e}", path.display())))
}

impl Limits {
    /// Nothing built yet, from `origin` with the application's `given`
    /// stores and `clock`: where a load and every reload start.
    fn empty(
        origin: String,
        path: Option<PathBuf>,
        given: Arc<BTreeMap<String, Arc<dyn Store>>>,
        clock: Arc<dyn Clock>,
        allow_empty: bool,
    ) -> Limits {
        Limits {
            origin,
            path,
            given,
            clock,
            opened: BTreeMap::new(),
            leases: BTreeMap::new(),
            retired: BTreeMap::new(),
            retired_leases: BTreeMap::new(),
            allow_empty,
            limiters: BTreeMap::new(),
            bare: BTreeMap::new(),
            routes: BTreeMap::new(),
            access: AccessList::default(),
            customers: BTreeMap::new(),
            sources: Arc::default(),
        }
    }

    /// A builder, to hand in the application's own stores or a clock.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder {
            given: BTreeMap::new(),
            clock: Arc::new(SystemClock),
            allow_empty: false,
            sources: BTreeMap::new(),
        }
    }

    /// Reads and builds the file at `path`, with no store but its own.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let text = r#"
    ///     [stores]
    ///     default = "memory://"
    ///
    ///     [limits.search]
    ///     policy = "60/minute"
    ///
    ///     [routes]
    ///     "/api/search" = "search"
    /// "#;
    /// let limits = ratewarden::config::Limits::builder().parse(text, "limits.toml").await?;
    /// let search = limits.route("/api/search").unwrap();
    /// assert!(search.check(b"client").await.allowed);
    ///
    /// let err = ratewarden::config::Limits::builder()
    ///     .parse("[limits.search]\npolicy = \"60/mnute\"\n", "limits.toml")
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("limits.toml: line 2, column 10: `policy = \"60/mnute\"`:"), "{err}");
    /// # Ok::<(), ratewarden::ConfigError>(()) }).unwrap();
    /// ```
    pub async fn from_file(path: impl AsRef<Path>) -> Result<Limits, ConfigError> {
        Limits::builder().load(path).await
    }

    /// The limiter of the limit `name`.
    pub fn limiter(&self, name: &str) -> Option<&Limiter> {
        self.limiters.get(name)
    }

    /// The policy of the limit `name` if the file gives it nothing else
    /// (no store, no rules, no option): for an application that composes
    /// such limits itself, around its own stores. [`limiter`](Self::limiter)
    /// still builds it on the [`DEFAULT_STORE`].
    pub fn bare_policy(&self, name: &str) -> Option<Policy> {
        self.bare.get(name).copied()
    }

    /// Every limit, by name.
    pub fn limiters(&self) -> impl Iterator<Item = (&str, &Limiter)> {
        self.limiters.iter().map(|(n, l)| (n.as_str(), l))
    }

    /// The limiter of the limit `route` takes under `[routes]`.
    pub fn route(&self, route: &str) -> Option<&Limiter> {
        self.limiters.get(self.routes.get(route)?)
    }

    /// Every route and its limiter, in the routes' order.
    pub fn routes(&self) -> impl Iterator<Item = (&str, &Limiter)> {
        self.routes
            .iter()
            .filter_map(|(route, name)| Some((route.as_str(), self.limiters.get(name)?)))
    }

    /// The store `name` names under `[stores]` (or handed in with
    /// [`LimitsBuilder::store`]), as opened: without any lease a rule puts
    /// on it. For a program that counts limits of its own on the file's
    /// stores.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let text = "[stores]\ndefault = \"memory://\"\n";
    /// let limits = ratewarden::config::Limits::builder()
    ///     .allow_empty(true)
    ///     .parse(text, "limits.toml")
    ///     .await?;
    /// assert_eq!(limits.store("default").unwrap().name(), "memory");
    /// assert!(limits.store("shared").is_none());
    /// # Ok::<(), ratewarden::ConfigError>(()) }).unwrap();
    /// ```
    pub fn store(&self, name: &str) -> Option<Arc<dyn Store>> {
        self.given
            .get(name)
            .or_else(|| self.opened.get(name).map(|o| &o.store))
            .cloned()
    }

    /// Hands every unspent unit of these limits' leases back to the stores
    /// they were leased from ([`LeasedStore::release`]), for a server that
    /// is shutting down: another instance of the fleet can then spend them
    /// in this window. Returns the units handed back. Leases go on working
    /// afterwards, buying new batches.
    pub async fn release_leases(&self) -> u64 {
        let now = self.clock.now();
        let mut released = 0;
        for (_, leased) in self.leases.values() {
            released += leased.release(now).await;
        }
        released
    }

    /// The file's `[access]` lists, for each layer the application builds
    /// from these limits ([`RateLimitLayerBuilder::access`](crate::RateLimitLayerBuilder::access)),
    /// so that a reload changes them too; empty without the section.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use ratewarden::access::Access;
    /// let text = r#"
    ///     [limits.search]
    ///     store = "memory"
    ///     policy = "60/minute"
    ///
    ///     [stores]
    ///     memory = "memory://"
    ///
    ///     [access]
    ///     deny = ["192.0.2.0/24"]
    /// "#;
    /// let limits = ratewarden::config::Limits::builder().parse(text, "limits.toml").await?;
    /// assert_eq!(limits.access().check_addr([192, 0, 2, 9].into()), Access::Deny);
    /// # Ok::<(), ratewarden::ConfigError>(()) }).unwrap();
    /// ```
    pub fn access(&self) -> &AccessList {
        &self.access
    }

    /// The limits of `[customers.NAME]`, for a
    /// [`CustomerLayer`](crate::customers::CustomerLayer).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let text = r#"
    ///     [stores]
    ///     default = "memory://"
    ///
    ///     [customers.api]
    ///     default = "free"
    ///     plans = { free = "fixed_window 100/hour", pro = "gcra 20/s burst 100" }
    ///     overrides = { acme = "pro", bigco = "fixed_window 5000/hour" }
    /// "#;
    /// let limits = ratewarden::config::Limits::builder().parse(text, "limits.toml").await?;
    /// let api = limits.customers("api").unwrap();
    /// assert_eq!(&*api.resolve(Some("acme")).await.name, "plan:pro");
    /// assert_eq!(&*api.resolve(Some("bigco")).await.name, "own:fixed_window 5000/h");
    /// assert_eq!(&*api.resolve(Some("anyone")).await.name, "plan:free");
    /// # Ok::<(), ratewarden::ConfigError>(()) }).unwrap();
    /// ```
    pub fn customers(&self, name: &str) -> Option<&CustomerLimits> {
        self.customers.get(name)
    }

    /// The file read again, built on these limits' stores: see
    /// [reloading](self#reloading). Refused, with these limits untouched,
    /// if the file does not load; refused for limits that were not read
    /// from a file ([`LimitsBuilder::parse`]: use
    /// [`reload_from`](Self::reload_from)).
    pub async fn reload(&self) -> Result<Limits, ConfigError> {
        let path = self.path.as_ref().ok_or_else(|| {
            ConfigError::Invalid(format!("{}: not read from a file", self.origin))
        })?;
        self.rebuilt(&read(path)?).await
    }

    /// [`reload`](Self::reload) from `text` instead of the file.
    pub async fn reload_from(&self, text: &str) -> Result<Limits, ConfigError> {
        self.rebuilt(text).await
    }

    /// Limits built from `text`, keeping what this one opened where it
    /// still applies.
    async fn rebuilt(&self, text: &str) -> Result<Limits, ConfigError> {
        let at = |span: std::ops::Range<usize>, message: String| {
            ConfigError::Invalid(locate(&self.origin, text, span, &message))
        };
        let file: File = toml::from_str(text).map_err(|e| match e.span() {
            Some(span) => at(span, e.message().trim_end().to_owned()),
            None => ConfigError::Invalid(format!("{}: {}", self.origin, e.message().trim_end())),
        })?;
        self.refuse_emptied(&file)?;
        let mut next = Limits::empty(
            self.origin.clone(),
            self.path.clone(),
            self.given.clone(),
            self.clock.clone(),
            self.allow_empty,
        );
        next.sources = self.sources.clone();
        for (name, url) in &file.stores {
            if self.given.contains_key(name) {
                return Err(at(
                    url.span(),
                    format!("the store {name:?} is the application's own; name this one otherwise"),
                ));
            }
            let kept = [self.opened.get(name), self.retired.get(name)]
                .into_iter()
                .flatten()
                .find(|o| &o.url == url.get_ref());
            let store = match kept {
                Some(opened) => opened.store.clone(),
                None => crate::store::from_url(url.get_ref())
                    .await
                    .map_err(|e| at(url.span(), e.to_string()))?,
            };
            next.opened.insert(
                name.clone(),
                Opened {
                    url: url.get_ref().clone(),
                    store,
                },
            );
        }
        let mut rule_names: BTreeMap<String, String> = BTreeMap::new();
        for (name, spec) in file.limits {
            if let Some(policy) = spec.get_ref().bare() {
                next.bare.insert(name.clone(), policy);
            }
            let span = spec.span();
            let rules = spec
                .into_inner()
                .rules(name.clone())
                .map_err(|m| at(span.clone(), m))?;
            let mut built = Vec::with_capacity(rules.len());
            for (i, rule) in rules.into_iter().enumerate() {
                let default_name = match i {
                    0 => name.clone(),
                    _ => format!("{name}-{}", i + 1),
                };
                built.push(next.rule(self, rule, default_name, &at)?);
            }
            // Rules of one name share their counts in a store: two limits
            // must not meet there by accident (a limit `a-2` beside the
            // second rule of `a`).
            for rule in &built {
                if let Some(other) = rule_names.insert(rule.name().to_owned(), name.clone()) {
                    return Err(at(
                        span,
                        format!(
                            "limit {name:?} has a rule named {:?}, as limit {other:?} does; \
                             rules of one name share their counts, so name one otherwise",
                            rule.name()
                        ),
                    ));
                }
            }
            let limiter = Limiter::builder()
                .shared_clock(next.clock.clone())
                .rules(built)
                .build()
                .map_err(|e| at(span, e.to_string()))?;
            next.limiters.insert(name, limiter);
        }
        for (route, limit) in file.routes {
            // A router would refuse it, axum's with a panic.
            if !route.get_ref().starts_with('/') {
                return Err(at(
                    route.span(),
                    format!(
                        "the route {:?} does not start with `/` (\"/{}\"?)",
                        route.get_ref(),
                        route.get_ref()
                    ),
                ));
            }
            if !next.limiters.contains_key(limit.get_ref()) {
                return Err(at(
                    limit.span(),
                    format!("no limit is named {:?}", limit.get_ref()),
                ));
            }
            next.routes.insert(route.into_inner(), limit.into_inner());
        }
        if let Some(access) = &file.access {
            next.access = access_list(access, &at)?;
        }
        for (name, spec) in file.customers {
            if rule_names.contains_key(&name) {
                return Err(at(
                    spec.span(),
                    format!(
                        "customers {name:?} count in rule {name:?}, as limit {:?} does; rules of \
                         one name share their counts, so name one otherwise",
                        rule_names[&name]
                    ),
                ));
            }
            let built = next.customer_limits(self, &name, spec, &at)?;
            next.customers.insert(name, built);
        }
        next.retire(self);
        Ok(next)
    }

    /// Refuses, unless allowed, a file that would limit nothing: no limit
    /// at all, or no route where the limits in force have routes.
    fn refuse_emptied(&self, file: &File) -> Result<(), ConfigError> {
        if self.allow_empty {
            return Ok(());
        }
        let allow = "or build the limits with `LimitsBuilder::allow_empty(true)` if that is meant";
        if file.limits.is_empty() && file.customers.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{}: no limit is defined, so nothing would be limited (is the file empty or cut \
                 short?); write at least one [limits.NAME] or [customers.NAME], {allow}",
                self.origin
            )));
        }
        if file.routes.is_empty() && !self.routes.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{}: [routes] is gone, so the {} routes in force would lose their limits (is the \
                 file cut short?); write the routes back, {allow}",
                self.origin,
                self.routes.len()
            )));
        }
        Ok(())
    }

    /// Sets aside what `before` opened or leased and these limits do not
    /// use, for the next reload only: a store that leaves the file and
    /// comes back by then keeps its counts, and one that does not is
    /// dropped, so that retired stores cannot pile up.
    fn retire(&mut self, before: &Limits) {
        for (name, opened) in &before.opened {
            let in_use = self
                .opened
                .get(name)
                .is_some_and(|o| Arc::ptr_eq(&o.store, &opened.store));
            if !in_use {
                self.retired.insert(name.clone(), opened.clone());
            }
        }
        for (id, lease) in &before.leases {
            let in_use = self
                .leases
                .get(id)
                .is_some_and(|(_, leased)| Arc::ptr_eq(leased, &lease.1));
            if !in_use {
                self.retired_leases.insert(id.clone(), lease.clone());
            }
        }
    }

    /// The store `name` names, leased in batches of `lease` if given.
    fn store_for_rule(
        &mut self,
        before: &Limits,
        name: &Spanned<String>,
        lease: Option<&Spanned<u32>>,
        at: &impl Fn(std::ops::Range<usize>, String) -> ConfigError,
    ) -> Result<Arc<dyn Store>, ConfigError> {
        let key = name.get_ref();
        let store = match self.given.get(key) {
            Some(store) => store.clone(),
            None => match self.opened.get(key) {
                Some(opened) => opened.store.clone(),
                None => {
                    let mut known: Vec<&str> = self.given.keys().map(String::as_str).collect();
                    known.extend(self.opened.keys().map(String::as_str));
                    return Err(at(
                        name.span(),
                        format!("no store is named {key:?} (stores: {})", known.join(", ")),
                    ));
                }
            },
        };
        let Some(units) = lease else {
            return Ok(store);
        };
        let config =
            LeaseConfig::new(*units.get_ref()).map_err(|e| at(units.span(), e.to_string()))?;
        let id = (key.clone(), *units.get_ref());
        // The same lease as before (in use or set aside) if it leases the
        // same store: its units in hand stay spendable.
        let leased = [before.leases.get(&id), before.retired_leases.get(&id)]
            .into_iter()
            .flatten()
            .find(|(shared, _)| Arc::ptr_eq(shared, &store))
            .map_or_else(
                || Arc::new(LeasedStore::new(store.clone(), config)),
                |(_, old)| old.clone(),
            );
        self.leases.insert(id, (store, leased.clone()));
        Ok(leased)
    }

    /// `[customers.NAME]`'s limits: its plans, its overrides read before
    /// the application's source for `name`, if it gave one.
    fn customer_limits(
        &mut self,
        before: &Limits,
        name: &str,
        spec: Spanned<CustomersSpec>,
        at: &impl Fn(std::ops::Range<usize>, String) -> ConfigError,
    ) -> Result<CustomerLimits, ConfigError> {
        let span = spec.span();
        let spec = spec.into_inner();
        let default_store = Spanned::new(span.clone(), DEFAULT_STORE.to_owned());
        let store = self.store_for_rule(
            before,
            spec.store.as_ref().unwrap_or(&default_store),
            None,
            at,
        )?;
        let mut builder = CustomerLimits::builder(name, store)
            .shared_clock(self.clock.clone())
            .default(spec.default.get_ref());
        if !spec.plans.contains_key(spec.default.get_ref()) {
            let plans: Vec<&str> = spec.plans.keys().map(String::as_str).collect();
            return Err(at(
                spec.default.span(),
                format!(
                    "the default plan {:?} is not one of the plans ({})",
                    spec.default.get_ref(),
                    plans.join(", ")
                ),
            ));
        }
        for (plan, text) in &spec.plans {
            ratewarden_core::parse_policies(text.get_ref())
                .map_err(|e| at(text.span(), e.to_string()))?;
            builder = builder.plan(plan, text.get_ref());
        }
        let mut overrides = StaticLimits::new();
        for (customer, limit) in spec.overrides {
            let limit = if spec.plans.contains_key(limit.get_ref()) {
                CustomerLimit::Plan(limit.into_inner())
            } else {
                CustomerLimit::policies(limit.get_ref()).map_err(|e| {
                    let plans: Vec<&str> = spec.plans.keys().map(String::as_str).collect();
                    at(
                        limit.span(),
                        format!(
                            "neither a plan ({}) nor limits of its own: {e}",
                            plans.join(", ")
                        ),
                    )
                })?
            };
            overrides = overrides.with(customer, limit);
        }
        builder = builder.source(FileFirst {
            file: overrides,
            then: self.sources.get(name).cloned(),
        });
        if let Some(ttl) = &spec.ttl_s {
            builder = builder.ttl(Duration::from_secs(*ttl.get_ref()));
        }
        if let Some(capacity) = &spec.capacity {
            builder = builder.capacity(*capacity.get_ref());
        }
        builder.build().map_err(|e| at(span, e.to_string()))
    }

    fn rule(
        &mut self,
        before: &Limits,
        spec: Spanned<RuleSpec>,
        default_name: String,
        at: &impl Fn(std::ops::Range<usize>, String) -> ConfigError,
    ) -> Result<Rule, ConfigError> {
        let span = spec.span();
        let spec = spec.into_inner();
        let default_store = Spanned::new(span.clone(), DEFAULT_STORE.to_owned());
        let store_name = spec.store.as_ref().unwrap_or(&default_store);
        let store = self.store_for_rule(before, store_name, spec.lease.as_ref(), at)?;
        let policy = spec.policy;
        let name = spec.name.unwrap_or(default_name);
        let mut rule = Rule::new(name, store, *policy.get_ref())
            .map_err(|e| at(policy.span(), e.to_string()))?;
        if let Some(on_failure) = spec.on_failure {
            rule = rule.on_failure(match on_failure.get_ref().as_str() {
                "open" => FailurePolicy::Open,
                "closed" => FailurePolicy::Closed,
                other => {
                    return Err(at(
                        on_failure.span(),
                        format!("on_failure is \"open\" or \"closed\", not {other:?}"),
                    ));
                }
            });
        }
        if let Some(ms) = spec.timeout_ms {
            rule = rule
                .with_timeout(Duration::from_millis(*ms.get_ref()))
                .map_err(|e| at(ms.span(), e.to_string()))?;
        }
        if let Some(fallback) = spec.fallback {
            let store = self.store_for_rule(before, &fallback, None, at)?;
            rule = rule
                .with_fallback(store)
                .map_err(|e| at(fallback.span(), e.to_string()))?;
        }
        if let Some(escalate) = spec.escalate {
            let span = escalate.span();
            let escalate = escalate.into_inner();
            let durable = self.store_for_rule(before, &escalate.store, None, at)?;
            rule = rule
                .with_escalation(durable, *escalate.policy.get_ref(), escalate.every, None)
                .map_err(|e| at(span, e.to_string()))?;
        }
        Ok(rule.with_shadow(spec.shadow.unwrap_or(false)))
    }
}

impl LimitSpec {
    /// Whether the limit sets any field of a single rule but its policy:
    /// the one list of them (the pattern names every field), so that a new
    /// one cannot be forgotten in [`bare`](Self::bare).
    fn has_rule_options(&self) -> bool {
        let LimitSpec {
            rules: _,
            policy: _,
            name,
            store,
            on_failure,
            timeout_ms,
            fallback,
            lease,
            escalate,
            shadow,
        } = self;
        name.is_some()
            || store.is_some()
            || on_failure.is_some()
            || timeout_ms.is_some()
            || fallback.is_some()
            || lease.is_some()
            || escalate.is_some()
            || shadow.is_some()
    }

    /// The policy, if the limit names nothing else.
    fn bare(&self) -> Option<Policy> {
        if self.rules.is_some() || self.has_rule_options() {
            return None;
        }
        self.policy.as_ref().map(|p| *p.get_ref())
    }

    /// The rules of the limit: `rules`, or the one rule its own fields
    /// describe.
    fn rules(self, limit: String) -> Result<Vec<Spanned<RuleSpec>>, String> {
        let single = self.policy.is_some() || self.has_rule_options();
        match (self.rules, single) {
            (Some(_), true) => Err(format!(
                "limit {limit:?} has both `rules` and the fields of a single rule; keep one"
            )),
            (Some(rules), false) if rules.is_empty() => {
                Err(format!("limit {limit:?} has no rules"))
            }
            (Some(rules), false) => Ok(rules),
            (None, _) => {
                let Some(policy) = self.policy else {
                    return Err(format!("limit {limit:?} needs a `policy` (or `rules`)"));
                };
                let span = policy.span();
                Ok(vec![Spanned::new(
                    span,
                    RuleSpec {
                        name: self.name,
                        store: self.store,
                        policy,
                        on_failure: self.on_failure,
                        timeout_ms: self.timeout_ms,
                        fallback: self.fallback,
                        lease: self.lease,
                        escalate: self.escalate,
                        shadow: self.shadow,
                    },
                )])
            }
        }
    }
}

/// The lists `[access]` describes; an entry that does not parse is refused
/// at its line.
fn access_list(
    spec: &AccessSpec,
    at: &impl Fn(std::ops::Range<usize>, String) -> ConfigError,
) -> Result<AccessList, ConfigError> {
    let mut list = AccessList::new();
    // The reason alone: `at` says it is invalid configuration, and where.
    let fail = |entry: &Spanned<String>, e: ConfigError| match e {
        ConfigError::Invalid(reason) => at(entry.span(), reason),
        other => at(entry.span(), other.to_string()),
    };
    for range in &spec.allow {
        list = list.allow(range.get_ref()).map_err(|e| fail(range, e))?;
    }
    for range in &spec.deny {
        list = list.deny(range.get_ref()).map_err(|e| fail(range, e))?;
    }
    for key in &spec.allow_keys {
        list = list.allow_key(key.get_ref().parse().map_err(|e| fail(key, e))?);
    }
    for key in &spec.deny_keys {
        list = list.deny_key(key.get_ref().parse().map_err(|e| fail(key, e))?);
    }
    Ok(list)
}

/// `message` about the text at `span` of `origin`: its line and column
/// (from 1) and the line itself, which names the key.
fn locate(origin: &str, text: &str, span: std::ops::Range<usize>, message: &str) -> String {
    let start = span.start.min(text.len());
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let content = text[line_start..].lines().next().unwrap_or("").trim();
    format!("{origin}: line {line}, column {column}: `{content}`: {message}")
}

/// A tower service that can be replaced while it serves: each call goes to
/// the service in place when it starts. Cheap to clone; clones share the
/// place.
///
/// Serve it behind a fixed router so that connection details still reach
/// it (`Router::new().fallback_service(reloadable)` and
/// `into_make_service_with_connect_info`).
pub struct Reloadable<S> {
    current: Arc<ArcSwap<S>>,
}

impl<S> Clone for Reloadable<S> {
    fn clone(&self) -> Self {
        Reloadable {
            current: self.current.clone(),
        }
    }
}

impl<S> fmt::Debug for Reloadable<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloadable").finish_non_exhaustive()
    }
}

impl<S> Reloadable<S> {
    /// Serves with `service` until it is replaced.
    pub fn new(service: S) -> Self {
        Reloadable {
            current: Arc::new(ArcSwap::from_pointee(service)),
        }
    }

    /// Serves every call that starts from now on with `service`.
    pub fn replace(&self, service: S) {
        self.current.store(Arc::new(service));
    }
}

impl<S, R> Service<R> for Reloadable<S>
where
    S: Service<R> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Oneshot<S, R>;

    /// Always ready: readiness is the service's in place when a call
    /// starts, which `call` waits for.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        S::clone(&self.current.load()).oneshot(request)
    }
}

type BuildFn<S> = dyn Fn(&Limits) -> Result<S, ConfigError> + Send + Sync;

/// Reloads [`Limits`] and rebuilds the service that uses them: what a
/// server needs to apply an edited file without a restart.
pub struct Reloader<S> {
    limits: tokio::sync::Mutex<Limits>,
    service: Reloadable<S>,
    build: Box<BuildFn<S>>,
}

impl<S> fmt::Debug for Reloader<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloader").finish_non_exhaustive()
    }
}

impl<S: Send + Sync + 'static> Reloader<S> {
    /// Builds the service from `limits` with `build`, and returns the
    /// reloader with the service to serve. A `build` that panics is an
    /// error here too.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ratewarden::config::{Limits, Reloader};
    /// use ratewarden::{ClientIdentity, RateLimitLayer};
    /// use axum::{Router, routing::get};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let identity = ClientIdentity::random()?;
    /// let file = "[stores]\ndefault = \"memory://\"\n[limits.search]\npolicy = \"60/minute\"\n[routes]\n\"/search\" = \"search\"\n";
    /// let limits = Limits::builder().parse(file, "limits.toml").await?;
    /// let (reloader, app) = Reloader::new(limits, move |limits: &Limits| {
    ///     let mut router = Router::new();
    ///     for (route, limiter) in limits.routes() {
    ///         let layer = RateLimitLayer::new(limiter.clone(), identity.clone())?;
    ///         router = router.route(route, get(|| async { "results" }).route_layer(layer));
    ///     }
    ///     Ok(router)
    /// })?;
    /// let app: Router = Router::new().fallback_service(app); // serve this
    /// reloader.reload_from(&file.replace("60/minute", "120/minute")).await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn new(
        limits: Limits,
        build: impl Fn(&Limits) -> Result<S, ConfigError> + Send + Sync + 'static,
    ) -> Result<(Arc<Reloader<S>>, Reloadable<S>), ConfigError> {
        let build: Box<BuildFn<S>> = Box::new(build);
        let service = Reloadable::new(built(&*build, &limits)?);
        let reloader = Arc::new(Reloader {
            limits: tokio::sync::Mutex::new(limits),
            service: service.clone(),
            build,
        });
        Ok((reloader, service))
    }

    /// Reads the file again ([`Limits::reload`]) and swaps in the service
    /// built from it. On any error nothing changes, and a build that
    /// returns an error or panics is such an error (a panic is caught unless
    /// the program aborts on panics).
    pub async fn reload(&self) -> Result<(), ConfigError> {
        // One reload at a time: two racing would each keep the stores of
        // the limits they started from.
        let mut current = self.limits.lock().await;
        let limits = current.reload().await?;
        self.swap(&mut current, limits)
    }

    /// [`reload`](Self::reload) from `text`.
    pub async fn reload_from(&self, text: &str) -> Result<(), ConfigError> {
        let mut current = self.limits.lock().await;
        let limits = current.reload_from(text).await?;
        self.swap(&mut current, limits)
    }

    /// The limits in force.
    pub async fn limits(&self) -> Limits {
        self.limits.lock().await.clone()
    }

    fn swap(&self, current: &mut Limits, limits: Limits) -> Result<(), ConfigError> {
        let service = built(&*self.build, &limits)?;
        self.service.replace(service);
        *current = limits;
        Ok(())
    }

    /// Reloads on every `SIGHUP` until the runtime stops, logging each
    /// outcome with `tracing`; a file that does not load, or a build that
    /// fails or panics, leaves the limits and the service in force.
    #[cfg(unix)]
    pub fn reload_on_sighup(self: Arc<Self>) -> std::io::Result<tokio::task::JoinHandle<()>> {
        self.reload_on_sighup_with(|outcome| match outcome {
            Ok(()) => tracing::info!("limits reloaded"),
            Err(e) => tracing::error!(error = %e, "limits not reloaded; the old ones stay"),
        })
    }

    /// [`reload_on_sighup`](Self::reload_on_sighup), telling `report` each
    /// outcome instead of logging it.
    #[cfg(unix)]
    pub fn reload_on_sighup_with(
        self: Arc<Self>,
        report: impl Fn(&Result<(), ConfigError>) + Send + 'static,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        Ok(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let outcome = self.reload().await;
                // A report that panics must not end the loop, or later
                // hangups would reload nothing, and say nothing.
                if std::panic::catch_unwind(AssertUnwindSafe(|| report(&outcome))).is_err() {
                    tracing::error!("the report of a reload panicked; hangups still reload");
                }
            }
        }))
    }
}

/// The service `build` makes of `limits`, its panic made an error.
fn built<S>(build: &BuildFn<S>, limits: &Limits) -> Result<S, ConfigError> {
    // `AssertUnwindSafe`: a panic leaves nothing of the reloader half
    // changed, since the limits and the service in force are replaced only
    // once a build has returned; what the closure captured is the
    // application's, and it is called again at the next reload just as
    // after an error it returned. A router that panics on a path it
    // refuses (axum) must not take the `SIGHUP` loop down with it.
    std::panic::catch_unwind(AssertUnwindSafe(|| build(limits))).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("no message");
        Err(ConfigError::Invalid(format!(
            "{}: building the service from these limits panicked: {message}",
            limits.origin
        )))
    })
}
