//! A tower [`Layer`] that rate-limits HTTP requests.
//!
//! Every request is keyed (by default by its client's address through a
//! [`ClientIdentity`]; see [`crate::key`] for the others) and decided by a
//! [`Limiter`]. A refused request gets `429 Too Many Requests` with a JSON
//! body and never reaches the inner service; every response, admitted or
//! refused, carries the rate-limit headers ([`RateLimitHeaders`] lists
//! them; [`HeaderMode`] chooses which).
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
//!     .headers(HeaderMode::Draft11)
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
//! # let store: Arc<dyn Store> = Arc::new(ratewarden::example::MapStore::default());
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
use http_body_util::BodyExt;
use ratewarden_core::{Admission, ConfigError, Decision, Limiter, PendingCheck, Plans, StoreError};
use tower::{Layer, Service};

use crate::identity::{ClientIdentity, ClientKey};
use crate::key::{ClientAddress, KeyExtractor};

#[cfg(feature = "grpc")]
mod grpc;
mod headers;

use headers::HeaderWriter;
pub use headers::{
    HeaderMode, RATELIMIT, RATELIMIT_POLICY, RateLimitHeaders, Refusal, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
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
    /// through `identity`, writing every rate-limit header.
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
        match self.shared.plan(parts) {
            Plan::Check(key, _, plan) => self
                .shared
                .limiter(plan)
                .penalize(key.as_bytes(), units)
                .await
                .map(|()| true),
            Plan::Skip | Plan::Reject(_) | Plan::NoAddress => Ok(false),
        }
    }

    async fn peek_on(&self, parts: &Parts) -> Option<(Decision, usize)> {
        match self.shared.plan(parts) {
            Plan::Check(key, cost, plan) => self
                .shared
                .limiter(plan)
                .peek_cost(key.as_bytes(), cost)
                .await
                .ok()
                .map(|decision| (decision, plan)),
            Plan::Skip | Plan::Reject(_) | Plan::NoAddress => None,
        }
    }

    /// The answer to a client asking for its quota, for a route of its own
    /// (`GET /api/quota`) that the layer does not wrap: `200 OK` with the
    /// rate-limit headers a decided request's response carries and a JSON
    /// body ([`RateLimitHeaders::quota`]), spending nothing; `404 Not
    /// Found` if the layer would not limit such a request (see
    /// [`peek`](Self::peek)).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// # let store: Arc<dyn Store> = Arc::new(ratewarden::example::MapStore::default());
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("search", store, Policy::fixed_window(60, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let layer = RateLimitLayer::new(limiter, ClientIdentity::new([7u8; 32])?)?;
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 4000)));
    /// let (parts, ()) = request.into_parts();
    /// let quota = layer.quota(&parts).await;
    /// assert_eq!(quota.status(), 200);
    /// // What the client's next request would leave, as its response would say.
    /// assert_eq!(quota.headers()["x-ratelimit-remaining"], "59");
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn quota(&self, parts: &Parts) -> Response<Bytes> {
        match self.peek_on(parts).await {
            Some((decision, plan)) => self.shared.headers(plan).quota(&decision),
            None => {
                let mut response = Response::new(Bytes::from_static(NOT_LIMITED_BODY));
                *response.status_mut() = StatusCode::NOT_FOUND;
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
        }
    }
}

/// Builds a [`RateLimitLayer`]; see [`RateLimitLayer::builder`].
pub struct RateLimitLayerBuilder {
    plans: Plans,
    choose: Option<Box<ChooseFn>>,
    identity: ClientIdentity,
    key: Option<Box<dyn KeyExtractor>>,
    on_missing_key: MissingKey,
    skip: Option<Box<SkipFn>>,
    cost: Option<Box<CostFn>>,
    counts: Option<Box<CountsFn>>,
    refusal: Option<Box<RefusalFn>>,
    mode: HeaderMode,
    grpc: bool,
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("plans", &self.plans)
            .field("key", &self.key)
            .field("on_missing_key", &self.on_missing_key)
            .field("headers", &self.mode)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder {
    /// Keys requests with `extractor` instead of by client address (see
    /// [`crate::key`]).
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.key = Some(Box::new(extractor));
        self
    }

    /// What to do with a request whose key cannot be extracted;
    /// [`MissingKey::ClientAddress`] unless set.
    pub fn on_missing_key(mut self, on_missing_key: MissingKey) -> Self {
        self.on_missing_key = on_missing_key;
        self
    }

    /// Passes the requests for which `skip` is true straight to the inner
    /// service: not charged, not refused, and without rate-limit headers
    /// (health checks, internal callers). Runs before the key is extracted.
    ///
    /// Whatever the predicate reads must be something a client cannot
    /// forge, or every client will send it.
    pub fn skip(mut self, skip: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.skip = Some(Box::new(skip));
        self
    }

    /// Charges each request what `cost` says instead of 1, in every rule
    /// (times the rule's own [`Rule::with_cost`](ratewarden_core::Rule::with_cost));
    /// see [`Limiter::check_cost`]. A cost of 0 is charged as 1: a request
    /// is never free (skip it instead). A request costing more than some
    /// rule could ever admit is answered `413 Content Too Large`, charged
    /// nothing: no wait would let it through, so a 429 would send its
    /// client into a retry loop.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.cost = Some(Box::new(cost));
        self
    }

    /// Decides each request under the plan `choose` names, among the
    /// [`Plans`] the layer was built with: the plan an authentication layer
    /// put in the request's extensions, or one looked up from the request.
    /// A request for which it names none, or a plan that does not exist,
    /// gets the default plan. Every plan counts the same usage, so a
    /// client's requests count on its new plan after it changes.
    ///
    /// Whatever `choose` reads must be something a client cannot forge
    /// (a verified token, not a header it writes itself), or every client
    /// will claim the largest plan.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use ratewarden::{ClientIdentity, Plans, RateLimitLayer, Store};
    /// # fn f(store: Arc<dyn Store>) -> Result<(), ratewarden::ConfigError> {
    /// /// Set by the application's authentication layer.
    /// #[derive(Clone)]
    /// struct Customer { plan: &'static str }
    ///
    /// let plans = Plans::builder("api", store)
    ///     .plan("free", "100/h")
    ///     .plan("pro", "1000/h")
    ///     .build()?;
    /// let layer = RateLimitLayer::builder(plans, ClientIdentity::new([7u8; 32])?)
    ///     .plan(|parts| parts.extensions.get::<Customer>().map(|c| c.plan))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn plan<F>(mut self, choose: F) -> Self
    where
        F: for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.choose = Some(Box::new(choose));
        self
    }

    /// Counts only the requests whose response status `counts` accepts: a
    /// login route counts its failures (`|s| s == StatusCode::UNAUTHORIZED`),
    /// a route can count only its successes (`|s| s.is_success()`). Each
    /// request is still decided before the inner service sees it, so a
    /// refused client never reaches it; one whose response should not count
    /// is given back to every rule once the response is ready
    /// ([`Limiter::check_admission`](ratewarden_core::Limiter::check_admission)),
    /// before the response is returned. The rate-limit headers are those of
    /// the decision, made before the response was known. A request whose
    /// inner service fails (an error, not a status) stays counted.
    ///
    /// ```
    /// use http::StatusCode;
    /// # fn f(b: ratewarden::layer::RateLimitLayerBuilder) -> ratewarden::layer::RateLimitLayerBuilder {
    /// b.count_only(|status| status == StatusCode::UNAUTHORIZED) // failed logins
    /// # }
    /// ```
    pub fn count_only(
        mut self,
        counts: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.counts = Some(Box::new(counts));
        self
    }

    /// Builds refusals with `refusal` instead of the default JSON body. The
    /// rate-limit headers and `Retry-After` are written over the response
    /// it returns, whatever its status. Its body is read whole before it is
    /// sent; should reading fail, the default refusal is sent instead.
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::response::IntoResponse;
    /// use http::StatusCode;
    /// # fn f(b: ratewarden::layer::RateLimitLayerBuilder) -> ratewarden::layer::RateLimitLayerBuilder {
    /// b.refusal(|decision| {
    ///     let wait = decision.retry_after_secs();
    ///     (StatusCode::TOO_MANY_REQUESTS, format!("Slow down: try again in {wait} s.\n"))
    ///         .into_response()
    /// })
    /// # }
    /// # }
    /// ```
    pub fn refusal<F, B>(mut self, refusal: F) -> Self
    where
        F: Fn(&Decision) -> Response<B> + Send + Sync + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: fmt::Display,
    {
        self.refusal = Some(Box::new(move |decision| {
            let (parts, body) = refusal(decision).into_parts();
            Box::pin(async move {
                match body.collect().await {
                    Ok(body) => Some(Response::from_parts(parts, body.to_bytes())),
                    Err(e) => {
                        tracing::warn!(error = %e, "custom refusal body failed; default sent");
                        None
                    }
                }
            })
        }));
        self
    }

    /// Serves a tonic (gRPC) service: every answer the layer gives itself
    /// is a gRPC status in a trailers-only response, which a tonic client
    /// reads as the call's error. A refusal is `RESOURCE_EXHAUSTED`, its
    /// details a `google.rpc.RetryInfo` with the refusal's retry delay
    /// (`tonic_types::StatusExt::get_error_details`), and the rate-limit
    /// headers come as the status's metadata; a request without a key is
    /// `INVALID_ARGUMENT` (or the code nearest the [`MissingKey::Reject`]
    /// status), one costing more than a rule ever admits
    /// `INVALID_ARGUMENT`, one without a client address `INTERNAL`. A
    /// custom [`refusal`](Self::refusal) still answers as it is written.
    /// Refused with [`count_only`](Self::count_only) by
    /// [`build`](Self::build): a gRPC call's outcome is not its HTTP status.
    ///
    /// Requests are keyed by the peer address tonic records for a plain TCP
    /// connection (`TcpConnectInfo`). Behind tonic's own TLS it records
    /// `TlsConnectInfo` instead, which this feature does not read: key
    /// such a server's requests with a [`key`](Self::key) extractor, or
    /// put the peer's `SocketAddr` into each request's extensions.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = std::sync::Arc::new(ratewarden::example::MapStore::default());
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("grpc", store, Policy::sliding_window(100, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let layer = RateLimitLayer::builder(limiter, ClientIdentity::random()?).grpc().build()?;
    /// // tonic::transport::Server::builder().layer(layer).add_service(…)
    /// # let _ = layer; Ok(()) }
    /// ```
    #[cfg(feature = "grpc")]
    pub fn grpc(mut self) -> Self {
        self.grpc = true;
        self
    }

    /// Which rate-limit headers responses carry; [`HeaderMode::Both`]
    /// unless set.
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.mode = mode;
        self
    }

    /// Builds the layer. Refuses a [`MissingKey::Reject`] status that is not
    /// a client error (400 to 499), and a [random
    /// identity](ClientIdentity::random) with a rule whose store other
    /// processes share: each process would key a client differently, so a
    /// fleet of `N` would admit `N` times the limit.
    ///
    /// Refuses a [`plan`](Self::plan) chooser with a single plan: every
    /// request would get the same limit whatever it names.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if self.choose.is_some() && self.plans.iter().len() == 1 {
            return Err(ConfigError::Invalid(
                "a plan chooser needs several plans to choose from: build the layer from Plans"
                    .into(),
            ));
        }
        if self.identity.is_random()
            && let Some(rule) = self
                .plans
                .iter()
                .flat_map(|(_, limiter)| limiter.rules())
                .find(|rule| rule.store().capabilities().shared)
        {
            return Err(ConfigError::Invalid(format!(
                "rule {:?} counts in a store other processes share, so every process must \
                 derive the same client keys: give each the same secret with \
                 ClientIdentity::new instead of ClientIdentity::random",
                rule.name()
            )));
        }
        if self.grpc && self.counts.is_some() {
            return Err(ConfigError::Invalid(
                "count_only cannot judge a gRPC call: every call answers HTTP 200 and its \
                 outcome travels in grpc-status"
                    .into(),
            ));
        }
        if let MissingKey::Reject(status) = self.on_missing_key
            && !status.is_client_error()
        {
            return Err(ConfigError::Invalid(format!(
                "a request without a key must be refused with a client error (400 to 499), \
                 not {status}"
            )));
        }
        Ok(self.finish())
    }

    fn finish(self) -> RateLimitLayer {
        let limiters = self
            .plans
            .iter()
            .map(|(_, limiter)| (limiter.clone(), RateLimitHeaders::new(limiter, self.mode)))
            .collect();
        let address = || ClientAddress::new(self.identity.clone());
        let (key, missing): (Box<dyn KeyExtractor>, _) = match (self.key, self.on_missing_key) {
            (None, _) => (Box::new(address()), Missing::NoAddress),
            (Some(key), MissingKey::ClientAddress) => (key, Missing::Address(address())),
            (Some(key), MissingKey::Reject(status)) => (key, Missing::Reject(status)),
        };
        RateLimitLayer {
            shared: Arc::new(Shared {
                plans: self.plans,
                limiters,
                choose: self.choose,
                identity: self.identity,
                key,
                missing,
                no_address_logged: AtomicBool::new(false),
                skip: self.skip,
                cost: self.cost,
                counts: self.counts,
                refusal: self.refusal,
                grpc: self.grpc,
            }),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service a [`RateLimitLayer`] wraps around another.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What the layer does with one request, decided before its future is built.
enum Plan {
    Skip,
    Reject(StatusCode),
    /// Keyed by address, with none to be had: the server's mistake.
    NoAddress,
    /// The key, the cost, and the plan's place in the layer's plans.
    Check(ClientKey, u32, usize),
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    // Held while a response that must not count is given back
    // ([`RateLimitLayerBuilder::count_only`]).
    ResBody: Send,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // Moving the head out and back is two moves, and gives the
        // extractor and the closures one type to read, whatever the body.
        let (parts, body) = request.into_parts();
        let plan = self.shared.plan(&parts);
        let mut request = Request::from_parts(parts, body);
        // The limiter is asked here, so that a request that no store makes
        // wait (rules on memory stores) is decided without a boxed future, a
        // clone of the inner service or a count on the shared layer state;
        // one that must wait carries what was asked into the boxed future,
        // which asks nothing again.
        let mut pending = None;
        if let (Plan::Check(key, 1, plan), None) = (&plan, &self.shared.counts) {
            let plan = *plan;
            match self.shared.limiter(plan).try_check(key.as_bytes()) {
                Ok(decision) => {
                    if decision.allowed {
                        let headers = self.shared.headers(plan).writer();
                        request.extensions_mut().insert(decision.clone());
                        return ResponseFuture::inner(self.inner.call(request), decision, headers);
                    }
                    if self.shared.refusal.is_none() {
                        return ResponseFuture::ready(
                            self.shared
                                .default_refusal(&decision, plan)
                                .map(RateLimitBody::full),
                        );
                    }
                    let shared = self.shared.clone();
                    return ResponseFuture::boxed(async move {
                        Ok(shared
                            .refusal(&decision, plan)
                            .await
                            .map(RateLimitBody::full))
                    });
                }
                Err(waiting) => pending = Some(waiting),
            }
        }
        let shared = self.shared.clone();
        // The inner service was driven to readiness in poll_ready; take that
        // one and leave a clone in its place (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::boxed(async move {
            match gate(&shared, plan, pending).await {
                Gate::Pass => {
                    let response = inner.call(request).await?;
                    Ok(response.map(RateLimitBody::inner))
                }
                Gate::Respond(response) => Ok(response.map(RateLimitBody::full)),
                Gate::Admitted(admitted) => {
                    request.extensions_mut().insert(admitted.decision.clone());
                    let mut response = inner.call(request).await?;
                    admitted
                        .finish(response.status(), response.headers_mut())
                        .await;
                    Ok(response.map(RateLimitBody::inner))
                }
            }
        })
    }
}

/// What the layer makes of a request, from its head alone: the one road
/// every request takes that is not decided inline, and the whole road for
/// a server adapter other than tower's (`ratewarden-actix`), so that the
/// adapters cannot drift apart. From [`RateLimitLayer::gate`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Gate {
    /// Not limited ([`RateLimitLayerBuilder::skip`]): call the handler and
    /// send its response as it is.
    Pass,
    /// Admitted: call the handler, then [`finish`](Admitted::finish) its
    /// response.
    Admitted(Admitted),
    /// Send this response instead of calling the handler: a refusal, or an
    /// error of the layer's own (no key, no client address, a weight no
    /// rule admits).
    Respond(Response<Bytes>),
}

/// An admitted request whose response is still to come; see [`Gate`].
#[must_use = "an admitted request is finished with its response's status and headers"]
pub struct Admitted {
    decision: Decision,
    plan: usize,
    shared: Arc<Shared>,
    /// Kept to give the request back if its response must not count
    /// ([`RateLimitLayerBuilder::count_only`]); boxed, since few layers
    /// count only some responses and every `Gate` is moved.
    admission: Option<Box<Admission>>,
}

impl fmt::Debug for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admitted")
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

impl Admitted {
    /// The decision, which the tower layer also puts in the request's
    /// extensions for the handler.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Completes the request once the handler has answered with `status`:
    /// gives the request back if a [`count_only`](RateLimitLayerBuilder::count_only)
    /// rule says that status does not count, and writes the rate-limit
    /// headers into the response's `headers`.
    pub async fn finish(self, status: StatusCode, headers: &mut http::HeaderMap) {
        if let (Some(admission), Some(counts)) = (self.admission, &self.shared.counts)
            && !counts(status)
        {
            admission.refund().await;
        }
        self.shared
            .headers(self.plan)
            .write(&self.decision, headers);
    }
}

impl RateLimitLayer {
    /// Decides a request from its head as the layer would: for serving
    /// through a framework that is not tower's. The peer address, if
    /// requests are keyed by it, goes in `parts.extensions` as a
    /// [`SocketAddr`](std::net::SocketAddr).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden::{ClientIdentity, Gate, Limiter, Policy, RateLimitLayer, Rule};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store = std::sync::Arc::new(ratewarden::example::MapStore::default());
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("api", store, Policy::fixed_window(1, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let layer = RateLimitLayer::new(limiter, ClientIdentity::new([7u8; 32])?)?;
    /// let head = || {
    ///     let mut request = http::Request::new(());
    ///     request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 4000)));
    ///     request.into_parts().0
    /// };
    /// let Gate::Admitted(admitted) = layer.gate(&head()).await else { panic!() };
    /// let mut headers = http::HeaderMap::new(); // the handler's response's
    /// admitted.finish(http::StatusCode::OK, &mut headers).await;
    /// assert_eq!(headers["x-ratelimit-remaining"], "0");
    /// let Gate::Respond(refusal) = layer.gate(&head()).await else { panic!() };
    /// assert_eq!(refusal.status(), 429);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn gate(&self, parts: &Parts) -> Gate {
        let plan = self.shared.plan(parts);
        gate(&self.shared, plan, None).await
    }
}

/// [`Gate`] for `plan`, awaiting `pending` if the limiter began there.
async fn gate(shared: &Arc<Shared>, plan: Plan, pending: Option<PendingCheck>) -> Gate {
    let (key, cost, plan) = match plan {
        Plan::Check(key, cost, plan) => (key, cost, plan),
        Plan::Skip => return Gate::Pass,
        Plan::Reject(status) => return Gate::Respond(shared.own(Own::MissingKey(status))),
        Plan::NoAddress => return Gate::Respond(shared.own(Own::NoAddress)),
    };
    let limiter = shared.limiter(plan);
    let (decision, admission) = if shared.counts.is_some() {
        match limiter.check_admission(key.as_bytes(), cost).await {
            Ok(admission) => (admission.decision().clone(), Some(Box::new(admission))),
            Err(_) => return Gate::Respond(shared.own(Own::Cost)),
        }
    } else {
        match pending {
            Some(pending) => (pending.decide().await, None),
            None => match limiter.check_cost(key.as_bytes(), cost).await {
                Ok(decision) => (decision, None),
                Err(_) => return Gate::Respond(shared.own(Own::Cost)),
            },
        }
    };
    if !decision.allowed {
        return Gate::Respond(shared.refusal(&decision, plan).await);
    }
    Gate::Admitted(Admitted {
        decision,
        plan,
        shared: shared.clone(),
        admission,
    })
}

type BoxResponseFuture<B, E> = BoxFuture<Result<Response<RateLimitBody<B>>, E>>;

pin_project_lite::pin_project! {
    /// The future of a [`RateLimit`] service's response.
    ///
    /// A request decided at once (see
    /// [`Limiter::try_check`](ratewarden_core::Limiter::try_check)) is
    /// the inner service's future and the decision's headers, written when
    /// the response comes; a refusal is a ready response; anything that
    /// waits on a store is boxed.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        Inner {
            #[pin]
            future: F,
            decision: Decision,
            headers: HeaderWriter,
        },
        Ready { response: Option<Response<RateLimitBody<B>>> },
        Boxed { future: BoxResponseFuture<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn inner(future: F, decision: Decision, headers: HeaderWriter) -> Self {
        ResponseFuture {
            state: State::Inner {
                future,
                decision,
                headers,
            },
        }
    }

    fn ready(response: Response<RateLimitBody<B>>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    fn boxed(
        future: impl Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            state: State::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Inner { .. } => "inner",
            State::Ready { .. } => "ready",
            State::Boxed { .. } => "boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner {
                future,
                decision,
                headers,
            } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                headers.write(decision, response.headers_mut());
                Poll::Ready(Ok(response.map(RateLimitBody::inner)))
            }
            StateProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("a ResponseFuture is not polled after it is ready"))),
            StateProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

/// An answer the layer gives itself, without the inner service.
#[derive(Debug, Clone, Copy)]
enum Own {
    /// No key, refused with this status ([`MissingKey::Reject`]).
    MissingKey(StatusCode),
    /// Keyed by address, with none to be had: the server's mistake.
    NoAddress,
    /// A weight above what a rule ever admits.
    Cost,
}

/// The JSON body of an answer of the layer's own, and its message alone
/// (a gRPC status's), written once for both.
macro_rules! own_texts {
    ($error:literal, $message:literal) => {
        (
            concat!(
                "{\"error\":\"",
                $error,
                "\",\"message\":\"",
                $message,
                "\"}"
            ),
            $message,
        )
    };
}

impl Own {
    fn status(self) -> StatusCode {
        match self {
            Own::MissingKey(status) => status,
            Own::NoAddress => StatusCode::INTERNAL_SERVER_ERROR,
            Own::Cost => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    fn texts(self) -> (&'static str, &'static str) {
        match self {
            Own::MissingKey(_) => {
                own_texts!("missing_key", "This request carries no rate-limit key.")
            }
            Own::NoAddress => own_texts!(
                "no_client_address",
                "The server cannot see the client's address to rate-limit this request."
            ),
            Own::Cost => own_texts!(
                "cost_exceeds_limit",
                "This request costs more than the rate limit ever admits."
            ),
        }
    }
}

const NOT_LIMITED_BODY: &[u8] = b"{\"error\":\"not_limited\",\
    \"message\":\"Requests like this one are not rate-limited.\"}";

impl Shared {
    fn own(&self, own: Own) -> Response<Bytes> {
        let (json, message) = own.texts();
        #[cfg(feature = "grpc")]
        if self.grpc {
            return grpc::own(own.status(), message);
        }
        let _ = message;
        let mut response = Response::new(Bytes::from_static(json.as_bytes()));
        *response.status_mut() = own.status();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    fn plan(&self, parts: &Parts) -> Plan {
        if self.skip.as_ref().is_some_and(|skip| skip(parts)) {
            return Plan::Skip;
        }
        let key = match self.key.extract(parts) {
            Some(key) => key,
            None => match &self.missing {
                Missing::NoAddress => return self.no_address(),
                Missing::Address(address) => match address.extract(parts) {
                    Some(key) => key,
                    None => return self.no_address(),
                },
                Missing::Reject(status) => return Plan::Reject(*status),
            },
        };
        let cost = self.cost.as_ref().map_or(1, |cost| cost(parts).max(1));
        let plan = self
            .choose
            .as_ref()
            .map_or(0, |choose| self.plans.position(choose(parts)));
        Plan::Check(key, cost, plan)
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
    fn no_address(&self) -> Plan {
        if !self.no_address_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "rate-limit layer: a request without a client address (no peer address in its \
                 extensions, no trusted forwarding header); answering 500. Serve axum with \
                 `into_make_service_with_connect_info::<SocketAddr>()`, or insert each \
                 connection's `SocketAddr` into its requests' extensions"
            );
        }
        Plan::NoAddress
    }

    fn default_refusal(&self, decision: &Decision, plan: usize) -> Response<Bytes> {
        #[cfg(feature = "grpc")]
        if self.grpc {
            return grpc::refusal(decision, self.headers(plan));
        }
        self.headers(plan).refusal(decision).into_http()
    }

    async fn refusal(&self, decision: &Decision, plan: usize) -> Response<Bytes> {
        let custom = match &self.refusal {
            Some(refusal) => refusal(decision).await,
            None => None,
        };
        let Some(mut response) = custom else {
            return self.default_refusal(decision, plan);
        };
        self.headers(plan).write(decision, response.headers_mut());
        response
    }
}

pin_project_lite::pin_project! {
    /// The body of a rate-limited service's response: the inner service's
    /// body, or the JSON body of a 429.
    #[derive(Debug)]
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        RateLimitBody {
            kind: Kind::Inner { body },
        }
    }

    /// A body of `data` in one frame.
    pub fn full(data: Bytes) -> Self {
        RateLimitBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
