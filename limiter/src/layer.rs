//! A tower [`Layer`] that rate-limits HTTP requests per client.
//!
//! Every request is keyed by a [`ClientIdentity`] and decided by a
//! [`Limiter`]. A refused request gets `429 Too Many Requests` with a JSON
//! body and never reaches the inner service; every response, admitted or
//! refused, carries the rate-limit headers:
//!
//! | header | value |
//! |---|---|
//! | `Retry-After` | (429 only) seconds to wait, rounded up |
//! | `X-RateLimit-Limit` | the limit of the deciding rule |
//! | `X-RateLimit-Remaining` | units still admitted now |
//! | `X-RateLimit-Reset` | seconds until the full quota is back, rounded up |
//! | `RateLimit-Policy` | `"search";q=60;w=60`: rule name, limit, window in seconds |
//! | `RateLimit` | `"search";r=0;t=42`: rule name, remaining, reset seconds |
//!
//! The last two are the structured fields of
//! draft-ietf-httpapi-ratelimit-headers-11. The rule reported is the one that
//! decided: the refusing rule, or the admitting rule with the least
//! remaining.
//!
//! A store failure never becomes a 500: [`Limiter::check`] answers it with
//! the failing rule's [`FailurePolicy`](limiter_core::FailurePolicy) (admit
//! or refuse), so the layer has no error path of its own.
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
//! use limiter::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};
//! # #[derive(Debug)] struct Mem;
//! # #[async_trait::async_trait] impl Store for Mem {
//! #   fn name(&self) -> &'static str { "mem" }
//! #   fn capabilities(&self) -> limiter::Capabilities { limiter::Capabilities {
//! #     algorithms: &limiter::Algorithm::ALL, key_capacity: None, shared: false, server_clock: false } }
//! #   async fn decide(&self, _: &[u8], p: &Policy, c: u32, n: limiter::Timestamp)
//! #     -> Result<limiter::Decision, limiter::StoreError> {
//! #     let mut s = None; let v = limiter::algorithm::apply(&mut s, p, c, n.as_micros());
//! #     Ok(limiter::Decision::from_verdict(v, p, "mem")) } }
//! # fn main() -> Result<(), limiter::ConfigError> {
//! let store: Arc<dyn Store> = Arc::new(Mem);
//! let identity = ClientIdentity::new(b"a secret of at least 32 bytes!!!")?;
//! let per = |name: &str, limit, secs| -> Result<RateLimitLayer, limiter::ConfigError> {
//!     let policy = Policy::sliding_log(limit, Duration::from_secs(secs))?;
//!     let limiter = Limiter::builder().rule(Rule::new(name, store.clone(), policy)?).build()?;
//!     Ok(RateLimitLayer::new(limiter, identity.clone()))
//! };
//! let app: Router = Router::new()
//!     .route("/api/search", get(|| async { "results" }).layer(per("search", 60, 60)?))
//!     .route("/api/feedback", post(|| async { "thanks" }).layer(per("feedback", 5, 3600)?))
//!     .route("/health", get(|| async { "ok" })); // not limited
//! # let _ = app; Ok(()) }
//! ```
//!
//! A layer wrapped around a whole router limits all its routes together,
//! under one quota per client. Layers can be stacked; the outermost one's
//! headers are the ones the client sees. To check several policies on one
//! route and report the tightest, put them as rules in one [`Limiter`].
//!
//! The decision is also inserted into the request's extensions, so a
//! handler can read it (`Extension<Decision>` in axum).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use limiter_core::{Decision, Limiter};
use tower::{Layer, Service};

use crate::identity::{ClientIdentity, peer_addr};

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Rate-limits every request of the wrapped service per client.
///
/// Cheap to clone: one layer can wrap any number of services, and they share
/// its limiter.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    limiter: Limiter,
    identity: ClientIdentity,
    /// (rule name, header-safe policy name, window in whole seconds, window
    /// of its escalation policy).
    rules: Vec<(String, String, u64, Option<u64>)>,
}

impl RateLimitLayer {
    /// A layer deciding with `limiter`, keying clients by `identity`.
    pub fn new(limiter: Limiter, identity: ClientIdentity) -> Self {
        let rules = limiter
            .rules()
            .iter()
            .map(|rule| {
                (
                    rule.name().to_owned(),
                    sf_string(rule.name()),
                    ceil_secs(rule.policy().window()),
                    rule.escalation_policy().map(|p| ceil_secs(p.window())),
                )
            })
            .collect();
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                identity,
                rules,
            }),
        }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }

    /// The client identity.
    pub fn identity(&self) -> &ClientIdentity {
        &self.shared.identity
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

/// Set once the first request without a peer address is seen, so the
/// misconfiguration is logged once rather than per request.
static WARNED_NO_PEER: AtomicBool = AtomicBool::new(false);

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let shared = self.shared.clone();
        if peer_addr(request.extensions()).is_none()
            && !WARNED_NO_PEER.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                "request without a peer address: serve with axum's \
                 into_make_service_with_connect_info::<SocketAddr>() (feature `axum`) or insert \
                 a SocketAddr extension; until then clients without a trusted forwarding header \
                 share one rate-limit key"
            );
        }
        let key = shared.identity.key_for_request(&request);
        // The inner service was driven to readiness in poll_ready; take that
        // one and leave a clone in its place (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let decision = shared.limiter.check(key.as_bytes()).await;
            if !decision.allowed {
                return Ok(shared.refusal(&decision));
            }
            request.extensions_mut().insert(decision.clone());
            let mut response = inner.call(request).await?;
            shared.write_headers(&decision, response.headers_mut());
            Ok(response.map(RateLimitBody::inner))
        })
    }
}

impl Shared {
    /// The deciding rule, and the window of the policy that decided: a
    /// durable refusal of an escalating rule carries the escalation policy's
    /// limit, so it must carry that policy's window too.
    fn rule(&self, decision: &Decision) -> (&str, &str, u64) {
        let name = decision.source.rule;
        let durable = decision.source.escalated && !decision.allowed;
        self.rules
            .iter()
            .find(|(rule, ..)| Some(rule.as_str()) == name)
            .map(|(rule, sf, window, escalated)| {
                let window = escalated.filter(|_| durable).unwrap_or(*window);
                (rule.as_str(), sf.as_str(), window)
            })
            // A limiter always names the deciding rule; be total anyway.
            .unwrap_or(("default", "\"default\"", 0))
    }

    fn write_headers(&self, decision: &Decision, headers: &mut HeaderMap) {
        let (_, policy, window) = self.rule(decision);
        let reset = decision.reset_after_secs();
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(decision.limit));
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(decision.remaining));
        headers.insert(X_RATELIMIT_RESET, HeaderValue::from(reset));
        // sf_string output is printable ASCII, always a valid header value.
        if let Ok(v) = HeaderValue::try_from(format!("{policy};q={};w={window}", decision.limit)) {
            headers.insert(RATELIMIT_POLICY, v);
        }
        if let Ok(v) = HeaderValue::try_from(format!("{policy};r={};t={reset}", decision.remaining))
        {
            headers.insert(RATELIMIT, v);
        }
        if !decision.allowed {
            headers.insert(RETRY_AFTER, HeaderValue::from(decision.retry_after_secs()));
        }
    }

    fn refusal<B>(&self, decision: &Decision) -> Response<RateLimitBody<B>> {
        let (rule, _, window) = self.rule(decision);
        let retry_after = decision.retry_after_secs();
        // Written by hand to keep the documented field order (`error`
        // first); only the rule name needs JSON escaping.
        let body = format!(
            "{{\"error\":\"rate_limited\",\"retry_after\":{retry_after},\"limit\":{},\
             \"remaining\":{},\"reset\":{},\"policy\":{},\"window\":{window},\
             \"message\":\"Too many requests. Retry in {retry_after} s.\"}}",
            decision.limit,
            decision.remaining,
            decision.reset_after_secs(),
            serde_json::Value::from(rule),
        );
        let mut response = Response::new(RateLimitBody::full(Bytes::from(body)));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        self.write_headers(decision, headers);
        response
    }
}

/// `name` as a structured-field string (RFC 9651 §3.3.3): printable ASCII,
/// with `"` and `\` escaped. Other characters cannot be represented and
/// become `_`, so any rule name yields a valid header.
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sf_strings_escape_and_replace() {
        assert_eq!(sf_string("search"), "\"search\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("tab\there é"), "\"tab_here _\"");
    }

    #[test]
    fn windows_round_up_to_seconds() {
        assert_eq!(ceil_secs(Duration::from_secs(60)), 60);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
    }
}
