//! Rate limiting for applications: one crate that brings the
//! [`ratewarden_core`] contract, the stores chosen by Cargo feature, client
//! identity from HTTP requests, and a tower/axum middleware.
//!
//! * Stores: `memory` (default) gives `memory::MemoryStore`; `redis` and
//!   `postgres` add their backends. [`store::from_url`] opens any compiled-in
//!   store from a URL (`memory://`, `redis://…`, `postgres://…`).
//! * [`identity`]: a client key that is an HMAC of the client's normalised
//!   address, from the socket peer or a forwarding header trusted to a
//!   configured number of proxy hops. No store ever sees a raw address.
//! * [`key`]: what a request is charged to — its client address (the
//!   default), a hashed header such as an API key, a hashed id an
//!   authentication layer left in its extensions, or one global key.
//! * [`layer`]: [`RateLimitLayer`], returning 429 with `Retry-After`, a JSON
//!   body and the IETF draft's `RateLimit-Policy` and `RateLimit` headers
//!   (or `X-RateLimit-*`); its builder adds keys, skipped requests, costs, custom
//!   refusals and header modes, and [`RateLimitHeaders`] gives a middleware
//!   of your own the same headers. With `grpc`, it serves tonic services
//!   (`RESOURCE_EXHAUSTED` with the retry delay); [`RateLimitLayer::gate`]
//!   is its whole decision for another server (the `ratewarden-actix`
//!   crate).
//! * [`outbound`]: the other direction, a [`WaitLayer`](outbound::WaitLayer)
//!   that makes each call of a client service wait for a permit
//!   ([`Limiter::acquire`]), to stay under a partner API's quota; with
//!   `reqwest`, the same as a `reqwest-middleware` middleware.
//! * `config` (feature `config`): limits, stores and per-route limits from
//!   a TOML file, reloaded on `SIGHUP` without forgetting counted usage.
//! * Everything public in [`ratewarden_core`] is re-exported here: [`Limiter`],
//!   [`Rule`], [`Policy`], [`Decision`], [`Store`], the clocks and errors.
//!
//! # Example: an axum server limiting search to 60 requests a minute
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule};
//!
//! # #[cfg(feature = "memory")]
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = ratewarden::store::from_url("memory://?capacity=10000").await?;
//! let search = Limiter::builder()
//!     .rule(Rule::new("search", store, Policy::sliding_log(60, Duration::from_secs(60))?)?)
//!     .build()?;
//! // One process counting in its own memory needs no secret of its own; a
//! // store shared by several processes needs `ClientIdentity::new(secret)`.
//! let identity = ClientIdentity::random()?;
//!
//! let app = Router::new().route(
//!     "/api/search",
//!     get(|| async { "results" }).layer(RateLimitLayer::new(search, identity)?),
//! );
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let addr = listener.local_addr().unwrap();
//! let server = tokio::spawn(async move {
//!     // ConnectInfo gives the layer each client's socket address.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! });
//! # let _ = addr;
//! # server.abort();
//! # Ok::<(), ratewarden::ConfigError>(()) }).unwrap();
//! ```
//!
//! # Three common setups
//!
//! Each is a few lines of [`Rule`]s. The examples run as doctests, where no
//! server is reachable, so **memory stores stand in for the shared and
//! durable ones**; the last block shows the real construction.
//!
//! **A fast local limit, escalating to a durable store**, for a fleet of
//! short-lived instances that cannot afford a round trip per request: the
//! memory store is authoritative; one admitted request in
//! every 50 (at a random position in each run of 50, whatever the clients'
//! pace) is also counted in the durable store under a stricter policy, and
//! refusals are recorded as abuse events, one write per key per window.
//!
//! ```
//! # #[cfg(feature = "memory")]
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ratewarden::memory::MemoryStore;
//! use ratewarden::{AbuseEvent, AbuseSink, Limiter, ManualClock, Policy, Rule, Store, StoreError};
//!
//! # #[derive(Debug, Default)] struct Events(std::sync::Mutex<Vec<AbuseEvent>>);
//! # #[async_trait::async_trait] impl AbuseSink for Events {
//! #     async fn record(&self, e: AbuseEvent) -> Result<(), StoreError> {
//! #         self.0.lock().unwrap().push(e); Ok(()) } }
//! // Stand-ins: in production both are one `PostgresStore` (see below).
//! let durable: Arc<dyn Store> = Arc::new(MemoryStore::new(10_000));
//! let events = Arc::new(Events::default());
//!
//! let clock = ManualClock::new();
//! let search = Limiter::builder()
//!     .clock(clock.clone())
//!     .rule(
//!         Rule::new("search", Arc::new(MemoryStore::new(10_000)), Policy::sliding_log(60, Duration::from_secs(60))?)?
//!             // 20 samples an hour, each standing for 50 requests.
//!             .with_escalation(durable, Policy::sliding_log(20, Duration::from_secs(3600))?, 50, Some(events.clone()))?,
//!     )
//!     .build()?;
//!
//! let mut escalated = 0;
//! for n in 1..=50 {
//!     let d = search.check(b"client:1").await;
//!     assert!(d.allowed, "request {n}");
//!     escalated += u32::from(d.source.escalated);
//! }
//! assert_eq!(escalated, 1, "exactly one of the first 50 was checked durably");
//! for _ in 51..=60 {
//!     assert!(search.check(b"client:1").await.allowed);
//! }
//! for _ in 0..100 {
//!     assert!(!search.check(b"client:1").await.allowed);
//! }
//! // 100 refusals, one write; the rest ride on the key's next event.
//! assert_eq!(events.0.lock().unwrap().len(), 1);
//! search.flush_abuse_events().await;
//! let refusals: u64 = events.0.lock().unwrap().iter().map(|e| e.refusals).sum();
//! assert_eq!(refusals, 100);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! **Tiers**, for a form a person fills in: 12 per 5 minutes in memory, then 40 per
//! hour in the durable store. The first refusal wins, so a request refused
//! by the memory tier costs no call to the durable one.
//!
//! ```
//! # #[cfg(feature = "memory")]
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ratewarden::memory::MemoryStore;
//! use ratewarden::{Limiter, ManualClock, Policy, Rule, Store};
//!
//! // Stand-in for `PostgresStore` (see below).
//! let durable: Arc<dyn Store> = Arc::new(MemoryStore::new(10_000));
//! let clock = ManualClock::new();
//! let photo_check = Limiter::builder()
//!     .clock(clock.clone())
//!     .rule(Rule::new("burst", Arc::new(MemoryStore::new(10_000)), Policy::sliding_log(12, Duration::from_secs(300))?)?)
//!     .rule(Rule::new("hourly", durable, Policy::sliding_log(40, Duration::from_secs(3600))?)?)
//!     .build()?;
//!
//! for _ in 0..12 {
//!     assert!(photo_check.check(b"client:1").await.allowed);
//! }
//! let refused = photo_check.check(b"client:1").await;
//! assert_eq!(refused.source.rule, Some("burst"));
//!
//! // A patient client gets 12 every 5 minutes, until the hourly tier says no.
//! let (mut admitted, mut refused_by) = (12, None);
//! for _ in 0..11 {
//!     clock.advance(Duration::from_secs(300));
//!     for _ in 0..12 {
//!         let d = photo_check.check(b"client:1").await;
//!         if d.allowed { admitted += 1 } else { refused_by = d.source.rule }
//!     }
//! }
//! assert_eq!(admitted, 40);
//! assert_eq!(refused_by.as_deref(), Some("hourly"));
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! **A shared store, falling back to memory**, for a fleet behind a load
//! balancer: Redis is
//! authoritative for the fleet; when it errors, times out or its breaker is
//! open, the same policy is answered by the in-process store, and if that
//! fails too the request is admitted (fail open).
//!
//! ```
//! # #[cfg(feature = "memory")]
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ratewarden::memory::MemoryStore;
//! use ratewarden::{BreakerConfig, FailurePolicy, Limiter, Policy, Rule, Store};
//!
//! // Stand-in for `ratewarden::store::from_url("redis://…")` (see below).
//! let shared: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));
//! let forms = Limiter::builder()
//!     .rule(
//!         Rule::new("forms", shared, Policy::sliding_log(5, Duration::from_secs(3600))?)?
//!             .with_timeout(Duration::from_millis(100))?
//!             .with_breaker(BreakerConfig::new(3, Duration::from_secs(5))?)
//!             .with_fallback(Arc::new(MemoryStore::new(10_000)))?
//!             .on_failure(FailurePolicy::Open),
//!     )
//!     .build()?;
//! let d = forms.check(b"client:1").await;
//! assert!(d.allowed && !d.source.fallback);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! The real stores, with the `redis` and `postgres` features:
//!
//! ```no_run
//! # #[cfg(all(feature = "redis", feature = "postgres"))]
//! # async fn real() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use ratewarden::postgres::PostgresStore;
//! use ratewarden::{AbuseSink, Store};
//!
//! // The shared store, opened from configuration.
//! let shared: Arc<dyn Store> = ratewarden::store::from_url("redis://10.0.0.5:6379").await?;
//! // The durable store, which also records
//! // abuse events (`AbuseSink`) with retention.
//! let pg = Arc::new(PostgresStore::builder("postgres://app@10.0.0.6/app").schema("rate_limits").build().await?);
//! let durable: Arc<dyn Store> = pg.clone();
//! let sink: Arc<dyn AbuseSink> = pg;
//! # let _ = (shared, durable, sink); Ok(()) }
//! ```

// Each of the core's items is exported here once, at the root; the core
// crate itself is not re-exported, which would name every item twice.
pub use ratewarden_core::*;

pub mod access;
#[cfg(feature = "config")]
pub mod config;
pub mod customers;
pub mod identity;
pub mod key;
pub mod layer;
pub mod outbound;
pub mod store;

#[cfg(feature = "memory")]
pub use ratewarden_memory as memory;
/// The Postgres store (`ratewarden-postgres`).
#[cfg(feature = "postgres")]
pub use ratewarden_postgres as postgres;
/// The Redis store (`ratewarden-redis`).
#[cfg(feature = "redis")]
pub use ratewarden_redis as redis;

pub use identity::{AddressSource, ClientIdentity, ClientKey};
pub use key::KeyExtractor;
pub use layer::{
    Admitted, Gate, HeaderMode, MissingKey, RateLimit, RateLimitBody, RateLimitHeaders,
    RateLimitLayer, RateLimitLayerBuilder, Refusal,
};

// Every Rust block of the README, compiled as a reader's crate would be
// (doctests are external crates) and run where it needs no server. The
// README uses these features, and actix-web through ratewarden-actix.
#[cfg(all(
    doctest,
    feature = "memory",
    feature = "axum",
    feature = "config",
    feature = "grpc",
    feature = "reqwest"
))]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
