//! Fixtures shared by the workspace's tests. Unpublished.
//!
//! Each fixture is written once here and used as a dev-dependency, with the
//! features a test needs, so a test binary compiles only what it uses:
//!
//! * [`WireCounter`]: round trips on the wire (always);
//! * [`stores`]: an exact store that must be awaited ([`stores::AwaitedStore`])
//!   and a wrapper that records the calls reaching a store (always);
//! * [`rss`]: a process's resident memory, for benches (always);
//! * [`threads`]: a process's thread names, for tests (always);
//! * [`Rng`]: a deterministic generator for schedules and keys (always);
//! * [`policy`]: one policy of each algorithm (always);
//! * `http`: a server on a free port and an HTTP client that reads whole
//!   replies and checks the rate-limit headers;
//! * `redis`, `postgres`: servers in containers, shared by address only,
//!   removed when the test process is gone, whichever way it ends;
//! * `tls`: a certificate authority of the test's own;
//! * `model`: proptest strategies for the model tests.

mod rng;
mod wire;

#[cfg(any(feature = "redis", feature = "postgres"))]
pub mod containers;
pub mod fleet;
#[cfg(feature = "http")]
pub mod http;
pub mod policy;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod rss;
pub mod stores;
#[cfg(feature = "model")]
pub mod strategy;
pub mod threads;
#[cfg(feature = "tls")]
pub mod tls;

pub use rng::Rng;
pub use wire::WireCounter;
