//! Rate limiting for applications: one crate that brings the
//! [`limiter_core`] contract, the stores chosen by Cargo feature, client
//! identity from HTTP requests, and a tower/axum middleware.
//!
//! * Stores: `memory` (default) gives [`memory::MemoryStore`]; `redis` and
//!   `postgres` add their backends. [`store::from_url`] opens any compiled-in
//!   store from a URL (`memory://`, `redis://…`, `postgres://…`).
//! * [`identity`]: a client key that is an HMAC of the client's normalised
//!   address, from the socket peer or a forwarding header trusted to a
//!   configured number of proxy hops. No store ever sees a raw address.
//! * [`layer`]: [`RateLimitLayer`], returning 429 with `Retry-After`, a JSON
//!   body and `X-RateLimit-*` / IETF `RateLimit-Policy` / `RateLimit`
//!   headers.
//! * Everything public in [`limiter_core`] is re-exported here: [`Limiter`],
//!   [`Rule`], [`Policy`], [`Decision`], [`Store`], the clocks and errors.
//!
//! # Example: an axum server limiting search to 60 requests a minute
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use limiter::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule};
//!
//! # #[cfg(feature = "memory")]
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = limiter::store::from_url("memory://?capacity=10000").await?;
//! let search = Limiter::builder()
//!     .rule(Rule::new("search", store, Policy::sliding_log(60, Duration::from_secs(60))?)?)
//!     .build()?;
//! // In production read the secret from configuration; 32 bytes at least.
//! let identity = ClientIdentity::new(b"0123456789abcdef0123456789abcdef")?;
//!
//! let app = Router::new().route(
//!     "/api/search",
//!     get(|| async { "results" }).layer(RateLimitLayer::new(search, identity)),
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
//! # Ok::<(), limiter::ConfigError>(()) }).unwrap();
//! ```

pub use limiter_core;
pub use limiter_core::*;

pub mod identity;
pub mod layer;
pub mod store;

#[cfg(feature = "memory")]
pub use limiter_memory as memory;
/// The Postgres store (`limiter-postgres`).
#[cfg(feature = "postgres")]
pub use limiter_postgres as postgres;
/// The Redis store (`limiter-redis`).
#[cfg(feature = "redis")]
pub use limiter_redis as redis;

pub use identity::{AddressSource, ClientIdentity, ClientKey};
pub use layer::{RateLimit, RateLimitBody, RateLimitLayer};
