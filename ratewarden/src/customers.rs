//! Limits per customer at the edge: [`CustomerLayer`] finds the request's
//! customer (what the authentication put in it), resolves its limit through
//! [`CustomerLimits`] (the cache, or the application's [`LimitSource`]), and
//! hands the request to a [`RateLimitLayer`] built once per distinct limit.
//!
//! ```
//! use std::sync::Arc;
//! use ratewarden::customers::CustomerLayer;
//! use ratewarden::{ClientIdentity, CustomerLimit, CustomerLimits, RateLimitLayer, StaticLimits, Store};
//!
//! #[derive(Clone)]
//! struct Customer { id: String } // what your authentication put in the request
//! # fn example(store: Arc<dyn Store>, identity: ClientIdentity) -> Result<(), Box<dyn std::error::Error>> {
//! let limits = CustomerLimits::builder("api", store)
//!     .plan("free", "100/h")
//!     .plan("pro", "gcra 20/s burst 100") // plans may differ in algorithm and window
//!     .source(StaticLimits::new().with("acme", CustomerLimit::Plan("pro".into())))
//!     .build()?;
//! let layer = CustomerLayer::new(
//!     limits,
//!     |parts| parts.extensions.get::<Customer>().map(|c| c.id.clone()),
//!     move |limiter| RateLimitLayer::builder(limiter, identity.clone()).build(),
//! )?;
//! # let _ = layer; Ok(()) }
//! ```
//!
//! [`LimitSource`]: ratewarden_core::LimitSource

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use hashlink::LruCache;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::Full;
use ratewarden_core::{ConfigError, CustomerLimits, Limiter, Resolved};
use tower::{Layer, Service};

use crate::layer::{RateLimit, RateLimitBody, RateLimitLayer};

/// The most distinct limits whose layers are kept built; another is built
/// again when next needed.
const LAYERS_KEPT: usize = 1_024;

type CustomerOf = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type BuildLayer = dyn Fn(Limiter) -> Result<RateLimitLayer, ConfigError> + Send + Sync;

/// A layer that limits each request under its customer's limit; see the
/// [module](self).
#[derive(Clone)]
pub struct CustomerLayer {
    shared: Arc<Shared>,
}

struct Shared {
    limits: CustomerLimits,
    customer: Box<CustomerOf>,
    build: Box<BuildLayer>,
    /// The layer of each limit, by [`Resolved::name`].
    layers: Mutex<LruCache<Arc<str>, RateLimitLayer>>,
    /// The default plan's, the answer when a layer cannot be built.
    default: RateLimitLayer,
}

impl fmt::Debug for CustomerLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomerLayer")
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl CustomerLayer {
    /// A layer deciding each request under the limit of the customer
    /// `customer` names (`None`: the default plan), with the
    /// [`RateLimitLayer`] `build` makes of that limit's limiter: the
    /// headers, key, cost and answers are `build`'s, the limit the
    /// customer's.
    ///
    /// `build` runs here for every plan, so that a layer it cannot build
    /// fails at start-up, and then once for each limit of a customer's own.
    pub fn new(
        limits: CustomerLimits,
        customer: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
        build: impl Fn(Limiter) -> Result<RateLimitLayer, ConfigError> + Send + Sync + 'static,
    ) -> Result<Self, ConfigError> {
        let mut layers = LruCache::new(LAYERS_KEPT);
        for (_, plan) in limits.plans() {
            layers.insert(plan.name.clone(), build(plan.limiter.clone())?);
        }
        let default_name = &limits.default_plan().name;
        let default = layers
            .get(default_name)
            .cloned()
            .ok_or_else(|| ConfigError::Invalid("the default plan has no layer".into()))?;
        Ok(CustomerLayer {
            shared: Arc::new(Shared {
                limits,
                customer: Box::new(customer),
                build: Box::new(build),
                layers: Mutex::new(layers),
                default,
            }),
        })
    }

    /// The limits the layer decides under.
    pub fn limits(&self) -> &CustomerLimits {
        &self.shared.limits
    }

    /// The [`RateLimitLayer`] a request with these `parts` is decided by:
    /// its customer's limit's.
    pub async fn layer_for(&self, parts: &Parts) -> RateLimitLayer {
        let customer = (self.shared.customer)(parts);
        let resolved = self.shared.limits.resolve(customer.as_deref()).await;
        self.shared.layer(&resolved)
    }

    /// [`RateLimitLayer::quota`] under the request's customer's limit.
    pub async fn quota(&self, parts: &Parts) -> Response<Full<Bytes>> {
        self.layer_for(parts).await.quota(parts).await
    }
}

impl Shared {
    /// The layer of `resolved`'s limit, built on first use.
    fn layer(&self, resolved: &Resolved) -> RateLimitLayer {
        let mut layers = self.layers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(layer) = layers.get(&resolved.name) {
            return layer.clone();
        }
        match (self.build)(resolved.limiter.clone()) {
            Ok(layer) => {
                layers.insert(resolved.name.clone(), layer.clone());
                layer
            }
            Err(e) => {
                tracing::warn!(limit = %resolved.name, error = %e,
                    "no layer for a customer's limit; the default plan applies");
                self.default.clone()
            }
        }
    }
}

impl<S> Layer<S> for CustomerLayer {
    type Service = CustomerRateLimit<S>;

    fn layer(&self, inner: S) -> CustomerRateLimit<S> {
        CustomerRateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service a [`CustomerLayer`] wraps around another.
#[derive(Clone)]
pub struct CustomerRateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for CustomerRateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomerRateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What a [`CustomerRateLimit`] answers.
pub type CustomerFuture<ResBody, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<ResBody>>, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for CustomerRateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    RateLimit<S>: Service<
            Request<ReqBody>,
            Response = Response<RateLimitBody<ResBody>>,
            Error = S::Error,
            Future: Send + 'static,
        >,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = CustomerFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let customer = (self.shared.customer)(&parts);
        let request = Request::from_parts(parts, body);
        // The inner service was driven to readiness in poll_ready; take that
        // one and leave a clone in its place (tower's usual pattern). The
        // rate-limit service around it is ready when it is.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        // A customer whose limit is cached is decided without awaiting
        // the source.
        let cached = match customer.as_deref() {
            None => Some(shared.limits.default_plan().clone()),
            Some(c) => shared.limits.cached(c),
        };
        if let Some(resolved) = cached {
            return Box::pin(shared.layer(&resolved).layer(inner).call(request));
        }
        Box::pin(async move {
            let resolved = shared.limits.resolve(customer.as_deref()).await;
            shared.layer(&resolved).layer(inner).call(request).await
        })
    }
}
