//! Outbound rate limiting: a tower [`Layer`] that makes each call of a
//! client service (a hyper or tonic client, any `tower::Service`) wait for
//! a permit first, so that a fleet sharing a store stays under a partner
//! API's quota. With the `reqwest` feature, `reqwest::WaitMiddleware` does
//! the same for a `reqwest-middleware` client.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ratewarden::outbound::WaitLayer;
//! use ratewarden::{Limiter, ManualClock, Policy, Rule, Store};
//! use tower::{Layer, Service, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let store: Arc<dyn Store> = Arc::new(ratewarden::memory::MemoryStore::default());
//! let partner = Limiter::builder()
//!     .clock(ManualClock::new())
//!     .rule(Rule::new("partner-api", store, Policy::sliding_log(10, Duration::from_secs(1))?)?)
//!     .build()?;
//! // Any client service; here one that answers its request's length.
//! let client = tower::service_fn(|req: String| async move { Ok::<_, std::io::Error>(req.len()) });
//! let mut client = WaitLayer::new(partner, "partner", Duration::from_secs(5)).layer(client);
//! let n = client.ready().await?.call("hello".to_string()).await?;
//! assert_eq!(n, 5);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ratewarden_core::{Limiter, WaitError};
use tower::{Layer, Service};

#[cfg(feature = "reqwest")]
pub mod reqwest;

/// Wraps a client service so that each call first waits for a permit for
/// one key of a [`Limiter`] ([`Limiter::acquire`]), up to a deadline. A
/// call cancelled while it pauses between attempts spends nothing.
#[derive(Debug, Clone)]
pub struct WaitLayer {
    limiter: Limiter,
    key: Arc<[u8]>,
    max_wait: Duration,
}

impl WaitLayer {
    /// Calls through the layer wait for `key` to be admitted by `limiter`,
    /// at most `max_wait` each: one key for the whole quota (the partner's
    /// name), or one per tenant with a layer each.
    pub fn new(limiter: Limiter, key: impl AsRef<[u8]>, max_wait: Duration) -> Self {
        WaitLayer {
            limiter,
            key: Arc::from(key.as_ref()),
            max_wait,
        }
    }
}

impl WaitLayer {
    /// The wait every adapter of this module makes before its call.
    pub(crate) async fn permit(&self) -> Result<ratewarden_core::Permit, WaitError> {
        self.limiter.acquire(&self.key, self.max_wait).await
    }
}

impl<S> Layer<S> for WaitLayer {
    type Service = Wait<S>;

    fn layer(&self, inner: S) -> Wait<S> {
        Wait {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`WaitLayer`] makes: the inner service, called once a
/// permit is granted.
#[derive(Debug, Clone)]
pub struct Wait<S> {
    inner: S,
    layer: WaitLayer,
}

/// What a [`Wait`] service's call fails with.
#[derive(Debug)]
#[non_exhaustive]
pub enum WaitCallError<E> {
    /// No permit before the deadline: the call was not made.
    Wait(WaitError),
    /// The inner service's own error.
    Service(E),
}

impl<E: std::fmt::Display> std::fmt::Display for WaitCallError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitCallError::Wait(e) => write!(f, "no permit for the call: {e}"),
            WaitCallError::Service(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for WaitCallError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitCallError::Wait(e) => Some(e),
            WaitCallError::Service(e) => Some(e),
        }
    }
}

impl<S, R> Service<R> for Wait<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = WaitCallError<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(WaitCallError::Service)
    }

    fn call(&mut self, request: R) -> Self::Future {
        // The service `poll_ready` made ready makes this call, after the
        // wait; a clone takes its place for the next one (tower's advice
        // for a call that outlives `&mut self`).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let permit = layer.permit().await.map_err(WaitCallError::Wait)?;
            // Spent from here on: the call goes out, whether or not its
            // answer is awaited.
            let call = inner.call(request);
            permit.used();
            call.await.map_err(WaitCallError::Service)
        })
    }
}
