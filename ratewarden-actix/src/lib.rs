//! actix-web middleware for [`ratewarden`] rate limiting.
//!
//! [`RateLimit`] wraps an actix-web `App` or scope with a
//! [`RateLimitLayer`] built exactly as for tower: the same key extractors
//! (client address, header, plan), the same rate-limit headers, the same
//! `429` with its JSON body and `Retry-After`, the same answers of its own
//! (no key, no address, a cost no rule admits) and the same store-failure
//! behaviour, because every decision is the layer's own
//! ([`RateLimitLayer::gate`]); this crate only carries the request's head
//! and the response across to actix-web's types. A test serves both
//! frameworks side by side and compares what they answer.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use actix_web::{App, HttpServer, web};
//! use ratewarden::memory::MemoryStore;
//! use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};
//! use ratewarden_actix::RateLimit;
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));
//!     let limiter = Limiter::builder()
//!         .rule(Rule::new("search", store, Policy::sliding_window(60, Duration::from_secs(60))?)?)
//!         .build()?;
//!     let layer = RateLimitLayer::new(limiter, ClientIdentity::random()?)?;
//!     HttpServer::new(move || {
//!         App::new()
//!             .wrap(RateLimit::new(layer.clone()))
//!             .route("/search", web::get().to(|| async { "results" }))
//!     })
//!     .bind(("127.0.0.1", 8080))?
//!     .run()
//!     .await?;
//!     Ok(())
//! }
//! ```
//!
//! The client's address is the connection's peer (`HttpRequest::peer_addr`);
//! behind a proxy, give the layer a trusted-proxy [`ClientIdentity`] as for
//! tower. Handlers find the admitting [`Decision`](ratewarden::Decision) in
//! the request's extensions.

use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::rc::Rc;

use actix_web::body::{BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode as ActixStatus;
use actix_web::http::header::{HeaderName as ActixName, HeaderValue as ActixValue};
use actix_web::{Error, HttpMessage, HttpResponse};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use ratewarden::{Gate, RateLimitLayer};

#[cfg(doc)]
use ratewarden::ClientIdentity;

/// Rate-limits every request of the app or scope it wraps, with a
/// [`RateLimitLayer`]; cheap to clone into each worker's `App`.
#[derive(Debug, Clone)]
pub struct RateLimit {
    layer: RateLimitLayer,
}

impl RateLimit {
    /// Middleware deciding as `layer` does.
    pub fn new(layer: RateLimitLayer) -> Self {
        RateLimit { layer }
    }
}

impl<S, B> Transform<S, ServiceRequest> for RateLimit
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B, BoxBody>>;
    type Error = Error;
    type Transform = RateLimitMiddleware<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RateLimitMiddleware {
            service: Rc::new(service),
            layer: self.layer.clone(),
        }))
    }
}

/// The service [`RateLimit`] puts around an app's.
#[derive(Debug)]
pub struct RateLimitMiddleware<S> {
    service: Rc<S>,
    layer: RateLimitLayer,
}

impl<S, B> Service<ServiceRequest> for RateLimitMiddleware<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B, BoxBody>>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Error>>>>;

    forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let service = self.service.clone();
        let layer = self.layer.clone();
        Box::pin(async move {
            let mut admitted = match layer.gate(&head(&request)).await {
                Gate::Admitted(admitted) => admitted,
                Gate::Respond(response) => {
                    let response = request.into_response(to_actix(response));
                    return Ok(response.map_into_right_body());
                }
                // `Pass`, and any answer a later version adds: the
                // handler's response, untouched.
                _ => return service.call(request).await.map(|r| r.map_into_left_body()),
            };
            request.extensions_mut().insert(admitted.decision().clone());
            let mut response = service.call(request).await?;
            // A decision the handler put in its response (the state after
            // a penalty) is shown instead of the admission's.
            let shown = response
                .response()
                .extensions()
                .get::<ratewarden::Decision>()
                .cloned();
            if let Some(shown) = shown {
                admitted.show(shown);
            }
            let status = http::StatusCode::from_u16(response.status().as_u16())
                .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
            let mut headers = http::HeaderMap::new();
            admitted.finish(status, &mut headers).await;
            let target = response.headers_mut();
            for (name, value) in &headers {
                if let Some((name, value)) = to_actix_header(name, value) {
                    target.insert(name, value);
                }
            }
            Ok(response.map_into_left_body())
        })
    }
}

/// The request's head as the layer reads it: method, URI, headers, and the
/// peer address as a `SocketAddr` extension. actix-web carries `http` 0.2
/// types and the layer `http` 1's, so each part is copied across.
fn head(request: &ServiceRequest) -> http::request::Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method =
        http::Method::from_bytes(request.method().as_str().as_bytes()).unwrap_or_default();
    parts.uri = request.uri().to_string().parse().unwrap_or_default();
    for (name, value) in request.headers() {
        // Both crates check names and values alike; a pair one accepted
        // and the other did not would be left out, never a panic.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            parts.headers.append(name, value);
        }
    }
    if let Some(peer) = request.peer_addr() {
        parts.extensions.insert(peer);
    }
    parts
}

fn to_actix_header(name: &HeaderName, value: &HeaderValue) -> Option<(ActixName, ActixValue)> {
    Some((
        ActixName::from_bytes(name.as_str().as_bytes()).ok()?,
        ActixValue::from_bytes(value.as_bytes()).ok()?,
    ))
}

/// One of the layer's own responses (a refusal, an error), as actix-web's.
fn to_actix(response: http::Response<Bytes>) -> HttpResponse {
    let (parts, body) = response.into_parts();
    let status =
        ActixStatus::from_u16(parts.status.as_u16()).unwrap_or(ActixStatus::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        if let Some(pair) = to_actix_header(name, value) {
            builder.append_header(pair);
        }
    }
    builder.body(body)
}
