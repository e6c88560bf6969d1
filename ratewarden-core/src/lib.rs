//! The core of the limiter workspace: the [`Store`] contract every backend
//! implements, the [`Policy`] and [`algorithm`] semantics they must match,
//! the [`Decision`] they return, the [`Clock`]s that drive them, and the
//! [`Limiter`] that composes stores into tiers.
//!
//! Backends live in their own crates (`ratewarden-memory`, `ratewarden-redis`,
//! `ratewarden-postgres`) and prove themselves against `ratewarden-conformance`,
//! whose scenarios are named in the [`Store`] contract.
//!
//! ```
//! use ratewarden_core::{algorithm, Policy};
//! use std::time::Duration;
//!
//! // 5 feedback posts per hour, exact.
//! let policy = Policy::sliding_log(5, Duration::from_secs(3600))?;
//! let mut state = None;
//! let now = 1_767_225_600_000_000;
//! for _ in 0..5 {
//!     assert!(algorithm::apply(&mut state, &policy, 1, now).allowed);
//! }
//! let refused = algorithm::apply(&mut state, &policy, 1, now + 1);
//! assert!(!refused.allowed);
//! assert_eq!(refused.retry_after_us, 3600 * 1_000_000 - 1);
//! # Ok::<(), ratewarden_core::ConfigError>(())
//! ```
//!
//! # Metrics
//!
//! With the `metrics` feature, every [`Limiter`] reports through the
//! `metrics` facade, to whichever recorder the application installs (a
//! Prometheus exporter, StatsD, …); without a recorder nothing is kept.
//!
//! | series | type | labels |
//! |---|---|---|
//! | `ratewarden_decisions_total` | counter | `rule`, `store`, `outcome`: `allowed`, `refused`, `banned` (a [`Ban`]'s refusal), `shadow_refused` (a rule in shadow mode) |
//! | `ratewarden_store_errors_total` | counter | `rule`, `store`, `kind` |
//! | `ratewarden_breaker_transitions_total` | counter | `rule`, `store`, `to` (`open`, `closed`) |
//! | `ratewarden_breaker_open` | gauge | `rule`, `store`: 1 while the store's breaker is open or probing, 0 once it closed again (absent until it first opens) |
//! | `ratewarden_fallbacks_total` | counter | `rule` |
//! | `ratewarden_store_call_seconds` | histogram | `rule`, `store`, `op` (`decide`, `refund`); awaited calls only, timeouts included |
//! | `ratewarden_memory_keys`, `ratewarden_memory_capacity` | gauge | `store`: set by `ratewarden_memory::MemoryStore::report_metrics` (its `metrics` feature) |
//! | `ratewarden_memory_evictions_total` | counter | `store`, likewise |
//!
//! No label holds a client's key or address.
//!
//! A histogram records one sample per awaited store call. Some recorders
//! hold samples until told to fold them: `metrics-exporter-prometheus`
//! installed with `install_recorder` keeps every one until a scrape or
//! `PrometheusHandle::run_upkeep`, so call that every few seconds (its
//! `install` does), or memory grows with every call to a shared store.

mod abuse;
pub mod algorithm;
pub mod ban;
mod counter;
mod customers;
mod decision;
mod error;
mod failure;
mod intern;
mod invalidation;
pub mod lease;
mod limiter;
mod plans;
mod policy;
mod refusal_cache;
mod store;
mod time;
#[cfg(feature = "url")]
pub mod url;

pub use abuse::{ABUSE_TRACKED_KEYS, AbuseEvent, AbuseSink};
/// Re-exported so that a store crate implements [`Store`] with
/// `#[ratewarden_core::async_trait]` and no dependency of its own.
pub use async_trait::async_trait;
pub use customers::{
    CustomerLimit, CustomerLimits, CustomerLimitsBuilder, DEFAULT_CUSTOMERS_CACHED,
    DEFAULT_LIMIT_TTL, LimitSource, Resolved, StaticLimits,
};
pub use decision::{Decision, Source};
pub use error::{ConfigError, ErrorKind, StoreError};
pub use failure::{BreakerConfig, BreakerState, FailurePolicy};
// For the `ratewarden` crate's header values; not part of the API.
pub use algorithm::Algorithm;
pub use ban::Ban;
#[doc(hidden)]
pub use intern::intern;
pub use invalidation::Invalidations;
pub use limiter::{
    Admission, DEFAULT_TIMEOUT, Limiter, LimiterBuilder, MAX_RULE_NAME, MIN_RETRY, PendingCheck,
    Permit, Rule, RuleStats, WaitError,
};
pub use plans::{Plans, PlansBuilder};
pub use policy::parse::{DEFAULT_ALGORITHM, ParsePolicyError, parse_policies};
pub use policy::{MAX_EXACT, MAX_LIMIT, MAX_LOG_LIMIT, MAX_WINDOW, MIN_WINDOW, Policy};
pub use refusal_cache::REFUSAL_CACHE_KEYS;
pub use store::{
    Capabilities, DEFAULT_KEY_CAPACITY, DEFAULT_MAX_KEY_LEN, Key, Refund, Request, Store,
};
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
