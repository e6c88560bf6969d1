//! Outbound rate limiting for a [`reqwest_middleware`] client: the
//! [`WaitLayer`]'s wait, for an application whose HTTP client is a
//! `reqwest::Client` rather than a `tower::Service`.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ratewarden::outbound::reqwest::WaitMiddleware;
//! use ratewarden::{Limiter, Policy, Rule, Store};
//! use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, reqwest};
//!
//! let store: Arc<dyn Store> = Arc::new(ratewarden::memory::MemoryStore::default());
//! let partner = Limiter::builder()
//!     .rule(Rule::new("partner-api", store, Policy::gcra(100, Duration::from_secs(1))?)?)
//!     .build()?;
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(WaitMiddleware::new(partner, "partner", Duration::from_secs(2)))
//!     .build();
//!
//! // Each request waits for its permit before it is sent; one with no
//! // permit within 2 s fails and never reaches the partner.
//! async fn rates(client: &ClientWithMiddleware) -> reqwest_middleware::Result<String> {
//!     client.get("http://partner.example/v1/rates").send().await?.text().await.map_err(Into::into)
//! }
//! # let _ = rates(&client);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use reqwest_middleware::reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::WaitLayer;
use crate::Limiter;

/// Makes each request of a `reqwest-middleware` client wait for a permit
/// for one key of a [`Limiter`] ([`Limiter::acquire`]), up to a deadline,
/// so that a fleet sharing a store stays under a partner API's quota.
///
/// A request with no permit before the deadline fails with
/// [`reqwest_middleware::Error::Middleware`], displayed as "no permit for
/// the call", whose source is the [`WaitError`](crate::WaitError) that
/// says why; it is never sent. The permit is [used](crate::Permit::used)
/// as the request goes on down the chain; a request cancelled while it
/// pauses between attempts spends nothing.
///
/// Each request that passes through it costs a permit: attached after a
/// retrying middleware, every attempt waits for one of its own, which is
/// what a quota counting requests on the partner's side needs.
#[derive(Debug, Clone)]
pub struct WaitMiddleware {
    wait: WaitLayer,
}

impl WaitMiddleware {
    /// Requests through the middleware wait for `key` to be admitted by
    /// `limiter`, at most `max_wait` each: one key for the whole quota (the
    /// partner's name), or one per tenant with a client each.
    pub fn new(limiter: Limiter, key: impl AsRef<[u8]>, max_wait: Duration) -> Self {
        WaitMiddleware {
            wait: WaitLayer::new(limiter, key, max_wait),
        }
    }
}

#[async_trait::async_trait]
impl Middleware for WaitMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let permit = self.wait.permit().await.map_err(|e| {
            // The context is what the error displays; the wait error, its
            // source, says why and can be downcast to.
            reqwest_middleware::Error::Middleware(
                anyhow::Error::new(e).context("no permit for the call"),
            )
        })?;
        // Spent from here on: the request goes out, whether or not its
        // answer is awaited.
        let call = next.run(req, extensions);
        permit.used();
        call.await
    }
}
