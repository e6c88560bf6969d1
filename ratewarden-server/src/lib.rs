//! Envoy's rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`,
//! `ShouldRateLimit`) on ratewarden's stores and algorithms.
//!
//! Envoy, Istio, Envoy Gateway and Contour ask a central service whether a
//! request is over its limit, naming it by *descriptors*: lists of
//! `(key, value)` entries such as `[(remote_address, 10.0.0.1)]` or
//! `[(path, /login), (remote_address, 10.0.0.1)]`. This crate answers them
//! from a YAML file in envoyproxy/ratelimit's format ([`config`]), each
//! limited descriptor counted by a ratewarden [`Limiter`](ratewarden::Limiter)
//! on one store: memory, Redis (Cluster, Sentinel) or Postgres, with the
//! algorithms only ratewarden has (sliding window, GCRA with a burst) and
//! leases that cut a shared store's round trips without going over.
//!
//! The binary (`ratewarden-server --config FILE`) is [`Server`]; the
//! service alone, for a tonic server of an application's own, is
//! [`RateLimitServer`]:
//!
//! ```
//! use std::sync::Arc;
//! use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
//!     RateLimitDescriptor, rate_limit_descriptor::Entry,
//! };
//! use envoy_types::pb::envoy::service::ratelimit::v3::{
//!     RateLimitRequest, rate_limit_response::Code,
//! };
//! use ratewarden_server::{Domains, RateLimitServer, RuleOptions};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let yaml = "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: minute, requests_per_unit: 2 }
//! ";
//! let rules = RuleOptions::new(Arc::new(ratewarden::memory::MemoryStore::default()));
//! let service = RateLimitServer::new(Domains::parse([("edge.yaml", yaml)], &rules)?);
//!
//! let request = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "remote_address".into(), value: "10.0.0.1".into() }],
//!         ..Default::default()
//!     }],
//!     ..Default::default()
//! };
//! let mut codes = Vec::new();
//! for _ in 0..3 {
//!     codes.push(service.decide(&request).await?.overall_code);
//! }
//! let ok = Code::Ok as i32;
//! assert_eq!(codes, [ok, ok, Code::OverLimit as i32]);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! Each response's `response_headers_to_add` carries the rate-limit
//! headers of its most restrictive descriptor (the draft's `RateLimit-Policy`
//! and `RateLimit` by default, `Retry-After` on a refusal), which Envoy
//! adds to the client's response.

pub mod config;
mod server;
mod service;

pub use config::{Domains, Limit, LoadError, RuleOptions};
pub use server::{DEFAULT_GRPC, DEFAULT_HTTP, Options, ReloadHandle, Server, StartError};
pub use service::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_KEY_BYTES, RateLimitServer};
