//! A tower [`Layer`] that rate-limits HTTP requests.
//!
//! Every request is keyed (by default by its client's address through a
//! [`ClientIdentity`]; see [`crate::key`] for the others) and decided by a
//! [`Limiter`]. A refused request gets `429 Too Many Requests` with a JSON
//! body and never reaches the inner service; every response, admitted or
//! refused, carries the rate-limit headers: the IETF draft's
//! `RateLimit-Policy` and `RateLimit` by default ([`RateLimitHeaders`]
//! lists them; [`HeaderMode`] chooses others).
//!
//! A store failure never becomes a 500: [`Limiter::check`] answers it with
//! the failing rule's [`FailurePolicy`](ratewarden_core::FailurePolicy) (admit
//! or refuse). The layer's one error is the server's: a request keyed by
//! address that has none (no `ConnectInfo`, no trusted forwarding header) is
//! answered `500 {"error":"no_client_address"}`, and the fix is logged once,
//! since limiting it under a key shared by all such requests would throttle
//! every client of the site together.
//!
//! # The builder
//!
//! [`RateLimitLayer::new`] keys by client address and writes every header.
//! [`RateLimitLayer::builder`] also sets the key, the requests that are not
//! limited, what a request costs, the refusal and the headers:
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use http::StatusCode;
//! use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule};
//! use ratewarden::key::HeaderKey;
//! use ratewarden::layer::{HeaderMode, MissingKey};
//!
//! # #[cfg(feature = "memory")] {
//! # fn main() -> Result<(), ratewarden::ConfigError> {
//! let store = std::sync::Arc::new(ratewarden::memory::MemoryStore::new(10_000));
//! let uploads = Limiter::builder()
//!     .rule(Rule::new("upload", store, Policy::gcra(100, Duration::from_secs(60))?)?)
//!     .build()?;
//! let identity = ClientIdentity::new(b"0123456789abcdef0123456789abcdef")?;
//! let layer = RateLimitLayer::builder(uploads, identity.clone())
//!     // One quota per API key (hashed, never stored) ...
//!     .key(HeaderKey::new(&identity, "x-api-key")?)
//!     // ... and none without one.
//!     .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
//!     // Internal callers are not limited, charged or told about limits.
//!     .skip(|request| request.headers.contains_key("x-internal-token"))
//!     // A batch of n items costs n units.
//!     .cost(|request| {
//!         request.headers.get("x-batch-size")
//!             .and_then(|v| v.to_str().ok()?.parse().ok())
//!             .unwrap_or(1)
//!     })
//!     // The `X-RateLimit-*` trio as well as the draft's two fields.
//!     .headers(HeaderMode::Both)
//!     .build()?;
//! let app: Router = Router::new().route("/api/upload", post(|| async { "stored" }).layer(layer));
//! # let _ = app; Ok(()) }
//! # main().unwrap(); }
//! ```
//!
//! # Per-route limits
//!
//! A layer applies one limiter. For different limits on different routes,
//! give each route its own layer — in axum, layer the route's
//! `MethodRouter` (or use `Router::route_layer` on a sub-router):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use axum::{Router, routing::{get, post}};
//! use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};
//! # fn main() -> Result<(), ratewarden::ConfigError> {
//! # let store: Arc<dyn Store> = Arc::new(ratewarden::memory::MemoryStore::default());
//! # /*
//! let store: Arc<dyn Store> = Arc::new(ratewarden::memory::MemoryStore::default());
//! # */
//! let identity = ClientIdentity::new(b"a secret of at least 32 bytes!!!")?;
//! let per = |name: &str, limit, secs| -> Result<RateLimitLayer, ratewarden::ConfigError> {
//!     let policy = Policy::sliding_log(limit, Duration::from_secs(secs))?;
//!     let limiter = Limiter::builder().rule(Rule::new(name, store.clone(), policy)?).build()?;
//!     RateLimitLayer::new(limiter, identity.clone())
//! };
//! let app: Router = Router::new()
//!     .route("/api/search", get(|| async { "results" }).layer(per("search", 60, 60)?))
//!     .route("/api/feedback", post(|| async { "thanks" }).layer(per("feedback", 5, 3600)?))
//!     .route("/health", get(|| async { "ok" })); // not limited
//! # let _ = app; Ok(()) }
//! ```
//!
//! A layer wrapped around a whole router limits all its routes together,
//! under one quota per key. Layers can be stacked; the outermost one's
//! headers are the ones the client sees. To check several policies on one
//! route, put them as rules in one [`Limiter`]: `RateLimit-Policy` lists
//! them all, and the other headers describe the tightest.
//!
//! The decision is also inserted into the request's extensions, so a
//! handler can read it (`Extension<Decision>` in axum).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use ratewarden_core::{Admission, ConfigError, Decision, Limiter, PendingCheck, Plans, StoreError};
use tower::{Layer, Service};

use crate::access::{Access, AccessList};
use crate::identity::{ClientIdentity, ClientKey, peer_addr};
use crate::key::{ClientAddress, KeyExtractor};

// A request's road, one file per role: `service` (`RateLimit::call`, where
// a tower request enters and is answered at once or boxed), `gate` (the
// road itself: `Shared::begin` takes a request as far as it goes without
// awaiting and makes every choice about it, `Awaiting::gate` awaits the
// rest; `RateLimitLayer::gate` is the same road for other servers),
// `future` (the response future), `answers` (refusals and the layer's own
// errors), `headers` (the rate-limit headers, written in one place),
// `body`; `builder` checks every choice about the layer once, at `build`.
//
// ```text
// RateLimit::call                  layer/service.rs: answered at once, or boxed with what is left
// └ Shared::begin                  layer/gate.rs: every choice about the request, made once
//   ├ classify                     skipped? key (KeyExtractor, ClientIdentity), cost, plan, or an error
//   ├ count_only                   → an Admission to give back later (Limiter::check_admission)
//   └ Limiter::try_check_cost      ratewarden-core/src/limiter.rs: the cost checked once, then the
//     └ Road: one rule | tiers | steps   refusal caches, each rule's Store::decide_inline; a memory
//                                  store decides here, anything else is a PendingCheck to await
// Awaiting::gate                   Store::decide under timeout, breaker, fallback, failure policy
// admitted → inner service, then HeaderWriter::write on its response (layer/headers.rs)
// refused  → the layer's 429 at once, or the application's refusal, awaited (layer/answers.rs)
// ```
mod answers;
mod body;
mod builder;
mod future;
mod gate;
#[cfg(feature = "grpc")]
mod grpc;
mod headers;
mod service;

use answers::{NOT_LIMITED_BODY, Own};
pub use body::RateLimitBody;
pub use builder::RateLimitLayerBuilder;
pub use future::ResponseFuture;
use gate::Step;
pub use gate::{Admitted, Gate};
use service::Classified;
pub use service::RateLimit;

use headers::HeaderWriter;
pub use headers::{
    HeaderMode, RATELIMIT, RATELIMIT_POLICY, RateLimitHeaders, Refusal, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET, X_RATELIMIT_SHADOW,
};

type SkipFn = dyn Fn(&Parts) -> bool + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;
type CountsFn = dyn Fn(StatusCode) -> bool + Send + Sync;
type ChooseFn = dyn for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A custom refusal, its body collected: `None` if the body failed.
type RefusalFn = dyn Fn(&Decision) -> BoxFuture<Option<Response<Bytes>>> + Send + Sync;

/// What the layer does with a request whose key the [`KeyExtractor`] cannot
/// read (no API key header, no user id extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Limit it by its client address, as [`RateLimitLayer::new`] limits
    /// every request. The default: a request is never unlimited for
    /// lacking a key, and telling a client it is unauthenticated is the
    /// authentication layer's business, not the limiter's. Address keys
    /// live in a namespace of their own, so they never share a quota with
    /// an extracted key.
    #[default]
    ClientAddress,
    /// Answer with this status (a client error, 400 to 499) and a JSON body
    /// `{"error":"missing_key"}`, without consulting the limiter and without
    /// rate-limit headers. A `401` should carry `WWW-Authenticate`; add it
    /// in an outer layer if your clients need it.
    Reject(StatusCode),
}

/// Rate-limits every request of the wrapped service.
///
/// Cheap to clone: one layer can wrap any number of services, and they share
/// its limiter.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

struct Shared {
    plans: Plans,
    /// Each plan's limiter and headers, in `plans`' order.
    limiters: Vec<(Limiter, RateLimitHeaders)>,
    choose: Option<Box<ChooseFn>>,
    identity: ClientIdentity,
    key: Box<dyn KeyExtractor>,
    missing: Missing,
    /// Whether the missing-address error has been logged: once per layer,
    /// since every such request gets a 500 anyway.
    no_address_logged: AtomicBool,
    /// Clients refused outright, and clients never limited.
    access: AccessList,
    skip: Option<Box<SkipFn>>,
    cost: Option<Box<CostFn>>,
    counts: Option<Box<CountsFn>>,
    refusal: Option<Box<RefusalFn>>,
    /// Answers of the layer's own are gRPC statuses.
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    grpc: bool,
}

/// What the layer does with a request `key` has no key for.
#[derive(Debug)]
enum Missing {
    /// `key` is the default [`ClientAddress`]: the request has no address
    /// at all, whatever [`MissingKey`] says.
    NoAddress,
    /// [`MissingKey::ClientAddress`]: key it by its address, if it has one.
    Address(ClientAddress),
    /// [`MissingKey::Reject`].
    Reject(StatusCode),
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("plans", &self.plans)
            .field("identity", &self.identity)
            .field("key", &self.key)
            .field("on_missing_key", &self.missing)
            .field("skip", &self.skip.is_some())
            .field("cost", &self.cost.is_some())
            .field("count_only", &self.counts.is_some())
            .field("custom_refusal", &self.refusal.is_some())
            .field("headers", &self.limiters[0].1.mode())
            .field("choose_plan", &self.choose.is_some())
            .finish()
    }
}

impl RateLimitLayer {
    /// A layer deciding with `limiter`, keying requests by client address
    /// through `identity`, writing the `RateLimit-Policy` and `RateLimit`
    /// headers ([`HeaderMode::Draft11`]).
    ///
    /// `limiter` is a [`Limiter`], or [`Plans`] with a limiter per plan
    /// (chosen per request by [`plan`](RateLimitLayerBuilder::plan)).
    ///
    /// Refuses what [`build`](RateLimitLayerBuilder::build) refuses: a
    /// [random identity](ClientIdentity::random) in front of a store that
    /// other processes share.
    pub fn new(limiter: impl Into<Plans>, identity: ClientIdentity) -> Result<Self, ConfigError> {
        RateLimitLayer::builder(limiter, identity).build()
    }

    /// A builder of a layer deciding with `limiter` (a [`Limiter`], or
    /// [`Plans`]). `identity` holds the secret every key is hashed with, and
    /// keys requests by client address unless
    /// [`key`](RateLimitLayerBuilder::key) says otherwise.
    pub fn builder(limiter: impl Into<Plans>, identity: ClientIdentity) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            plans: limiter.into(),
            choose: None,
            identity,
            key: None,
            on_missing_key: MissingKey::default(),
            skip: None,
            cost: None,
            counts: None,
            refusal: None,
            mode: HeaderMode::default(),
            shadow_header: false,
            access: AccessList::default(),
            grpc: false,
        }
    }

    /// The limiter; with several [`Plans`], the default plan's.
    pub fn limiter(&self) -> &Limiter {
        self.shared.plans.default_limiter()
    }

    /// The plans: one, named `default`, for a layer built from a single
    /// [`Limiter`].
    pub fn plans(&self) -> &Plans {
        &self.shared.plans
    }

    /// The client identity.
    pub fn identity(&self) -> &ClientIdentity {
        &self.shared.identity
    }

    /// The headers the layer writes, for a middleware of its own that
    /// answers as the layer does; with several [`Plans`], the default
    /// plan's.
    pub fn headers(&self) -> &RateLimitHeaders {
        &self.shared.limiters[0].1
    }

    /// The decision the layer would make for a request with these `parts`
    /// now, changing nothing ([`Limiter::peek`]): the same key, cost and
    /// rules, no unit spent. `None` for a request the layer would not decide:
    /// one it skips, or one without a key (which it answers with an error).
    pub async fn peek(&self, parts: &Parts) -> Option<Decision> {
        self.peek_on(parts).await.map(|(decision, _)| decision)
    }

    /// Charges the client of a request with these `parts` `units` more in
    /// every rule of its plan, whether or not they fit
    /// ([`Limiter::penalize`]): for what the application learns after the
    /// response (a failed payment costs 5). `Ok(false)` for a request the
    /// layer would not limit (skipped, or without a key).
    pub async fn penalize(&self, parts: &Parts, units: u32) -> Result<bool, StoreError> {
        match self.shared.classify(parts) {
            Classified::Check(key, _, plan) => self
                .shared
                .limiter(plan)
                .penalize(key.as_bytes(), units)
                .await
                .map(|()| true),
            Classified::Skip | Classified::Deny | Classified::Reject(_) | Classified::NoAddress => {
                Ok(false)
            }
        }
    }

    /// [`penalize`](Self::penalize), then the client's quota after it
    /// ([`peek`](Self::peek)): put it in the response's extensions and the
    /// layer writes its headers instead of the admission's, so that a
    /// `402 Payment Required` says what the penalty left. One more store
    /// call than `penalize`. `None` for a request the layer would not
    /// limit.
    ///
    /// ```
    /// use axum::response::{IntoResponse, Response};
    /// # async fn pay(layer: ratewarden::RateLimitLayer, parts: http::request::Parts) -> Response {
    /// let mut response = http::StatusCode::PAYMENT_REQUIRED.into_response();
    /// if let Ok(Some(after)) = layer.penalize_and_peek(&parts, 4).await {
    ///     response.extensions_mut().insert(after);
    /// }
    /// response
    /// # }
    /// ```
    pub async fn penalize_and_peek(
        &self,
        parts: &Parts,
        units: u32,
    ) -> Result<Option<Decision>, StoreError> {
        // One classification (one client key) for both calls.
        let classified = self.shared.classify(parts);
        let Classified::Check(key, cost, plan) = classified else {
            return Ok(None);
        };
        let limiter = self.shared.limiter(plan);
        limiter.penalize(key.as_bytes(), units).await?;
        Ok(limiter.peek_cost(key.as_bytes(), cost).await.ok())
    }

    async fn peek_on(&self, parts: &Parts) -> Option<(Decision, usize)> {
        self.peek_classified(self.shared.classify(parts)).await
    }

    async fn peek_classified(&self, classified: Classified) -> Option<(Decision, usize)> {
        match classified {
            Classified::Check(key, cost, plan) => self
                .shared
                .limiter(plan)
                .peek_cost(key.as_bytes(), cost)
                .await
                .ok()
                .map(|decision| (decision, plan)),
            Classified::Skip | Classified::Deny | Classified::Reject(_) | Classified::NoAddress => {
                None
            }
        }
    }

    /// The answer to a client asking for its quota, for a route of its own
    /// (`GET /api/quota`) that the layer does not wrap: `200 OK` with the
    /// rate-limit headers a decided request's response carries and a JSON
    /// body ([`RateLimitHeaders::quota`]), spending nothing; the layer's
    /// own `403 Forbidden` for a client its [access list](RateLimitLayerBuilder::access)
    /// denies; `404 Not Found` if the layer would not limit such a request
    /// (see [`peek`](Self::peek)).
    ///
    /// The body is a [`Full`], so that an axum handler can return the
    /// response as it is (`http::Response<B>` is an `IntoResponse` for any
    /// such body) and other servers collect it as any `http_body::Body`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// # let store: Arc<dyn Store> = Arc::new(ratewarden::memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("search", store, Policy::fixed_window(60, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let layer = RateLimitLayer::new(limiter, ClientIdentity::new([7u8; 32])?)?;
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 4000)));
    /// let (parts, ()) = request.into_parts();
    /// let quota = layer.quota(&parts).await;
    /// assert_eq!(quota.status(), 200);
    /// // A fresh client: its whole quota is there.
    /// assert_eq!(quota.headers()["ratelimit"], "\"search\";r=60;t=60");
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn quota(&self, parts: &Parts) -> Response<Full<Bytes>> {
        let classified = self.shared.classify(parts);
        if let Classified::Deny = classified {
            return self.shared.own(Own::Denied).map(Full::new);
        }
        match self.peek_classified(classified).await {
            Some((decision, plan)) => self.shared.headers(plan).quota(&decision).map(Full::new),
            None => {
                let mut response = Response::new(Full::new(Bytes::from_static(NOT_LIMITED_BODY)));
                *response.status_mut() = StatusCode::NOT_FOUND;
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
        }
    }
}

impl Shared {
    /// What the layer does with a request, from its head alone: skip it,
    /// answer it for want of a key or an address, or check it under its
    /// key, cost and plan. Made once per request, before any future.
    fn classify(&self, parts: &Parts) -> Classified {
        // A denied client is refused before anything else, a skipped route
        // included: the lists are about who, not what.
        let mut allowed = false;
        if self.access.has_ranges()
            && let Some(addr) = self
                .identity
                .client_addr(&parts.headers, peer_addr(&parts.extensions))
        {
            match self.access.check_addr(addr) {
                Access::Deny => return Classified::Deny,
                Access::Allow => allowed = true,
                Access::Limit => {}
            }
        }
        if self.skip.as_ref().is_some_and(|skip| skip(parts)) {
            return Classified::Skip;
        }
        let key = match self.key.extract(parts) {
            Some(key) => key,
            None => match &self.missing {
                Missing::NoAddress => return self.no_address(),
                Missing::Address(address) => match address.extract(parts) {
                    Some(key) => key,
                    None => return self.no_address(),
                },
                Missing::Reject(status) => return Classified::Reject(*status),
            },
        };
        // Looked up only when some key is listed, so that a layer without
        // key lists does no lookup per request.
        if self.access.has_keys() {
            match self.access.check_key(&key) {
                Access::Deny => return Classified::Deny,
                Access::Allow => return Classified::Skip,
                Access::Limit => {}
            }
        }
        if allowed {
            return Classified::Skip;
        }
        let cost = self.cost.as_ref().map_or(1, |cost| cost(parts).max(1));
        let plan = self
            .choose
            .as_ref()
            .map_or(0, |choose| self.plans.position(choose(parts)));
        Classified::Check(key, cost, plan)
    }

    fn limiter(&self, plan: usize) -> &Limiter {
        &self.limiters[plan].0
    }

    fn headers(&self, plan: usize) -> &RateLimitHeaders {
        &self.limiters[plan].1
    }

    /// A request keyed by address has none: no peer address in its
    /// extensions and no trusted forwarding header. Limiting it under one
    /// key shared by every such request would throttle the whole site
    /// together, so it fails loudly instead, pointing at the fix.
    fn no_address(&self) -> Classified {
        if !self.no_address_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "rate-limit layer: a request without a client address (no peer address in its \
                 extensions, no trusted forwarding header); answering 500. Serve axum with \
                 `into_make_service_with_connect_info::<SocketAddr>()`, or insert each \
                 connection's `SocketAddr` into its requests' extensions"
            );
        }
        Classified::NoAddress
    }
}
