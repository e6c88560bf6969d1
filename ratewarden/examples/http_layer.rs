//! The HTTP layer's options, one route each: the key extractors, a skip
//! predicate and a cost, the header modes and a custom refusal. The README
//! quotes this file.
//!
//! Run with `cargo run -p ratewarden --example http_layer`: it sends a few
//! requests to each route in-process and prints what came back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, http::StatusCode};
use ratewarden::key::{ExtensionKey, GlobalKey, HeaderKey, LimitKey};
use ratewarden::memory::MemoryStore;
use ratewarden::{
    AddressSource, ClientIdentity, ClientKey, ConfigError, Decision, HeaderMode, Limiter,
    MissingKey, Policy, RateLimitLayer, Rule,
};
use tower::ServiceExt;

/// What an authentication layer leaves in the request's extensions.
#[derive(Clone)]
struct UserId(u64);

impl LimitKey for UserId {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.0.to_be_bytes()
    }
}

/// A stand-in for real authentication: `Authorization: Bearer user-<n>`.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok()?.strip_prefix("Bearer user-")?.parse().ok());
    match user {
        Some(id) => {
            request.extensions_mut().insert(UserId(id));
            next.run(request).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

fn limiter(name: &str, limit: u32, per: Duration) -> Result<Limiter, ConfigError> {
    let store = Arc::new(MemoryStore::new(100_000));
    Limiter::builder()
        .rule(Rule::new(name, store, Policy::sliding_log(limit, per)?)?)
        .build()
}

fn app() -> Result<Router, ConfigError> {
    let minute = Duration::from_secs(60);
    // One secret for every key: addresses, API keys and user ids are all
    // hashed with it, and no store holds any of them.
    let identity = ClientIdentity::new(b"0123456789abcdef0123456789abcdef")?
        // Behind one reverse proxy that appends the client's address.
        .with_source(AddressSource::x_forwarded_for(1)?);

    // By client address: the simple path.
    let search = RateLimitLayer::new(limiter("search", 60, minute)?, identity.clone())?;

    // By API key; a request without one is limited by its address.
    let api = RateLimitLayer::builder(limiter("api", 600, minute)?, identity.clone())
        .key(HeaderKey::new(&identity, "x-api-key")?)
        .build()?;

    // By the user an authentication layer found (a `UserId: LimitKey` extension); none, no entry.
    let account = RateLimitLayer::builder(limiter("account", 100, minute)?, identity.clone())
        .key(ExtensionKey::<UserId>::new(&identity, "user"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .build()?;

    // Everyone together: what the upstream can take. Monitoring is not
    // limited, and a batch costs one unit per item.
    let upstream = RateLimitLayer::builder(limiter("upstream", 1_000, minute)?, identity.clone())
        .key(GlobalKey::new(&identity))
        .skip(|request| request.headers.contains_key("x-monitoring"))
        .cost(|request| {
            request
                .headers
                .get("x-batch-size")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .build()?;

    // Only the draft-11 headers, and a refusal in plain text (the headers
    // and Retry-After are still written).
    let feedback = RateLimitLayer::builder(limiter("feedback", 1, minute)?, identity)
        .headers(HeaderMode::Draft11)
        .refusal(|decision| {
            let wait = decision.retry_after_secs();
            (
                StatusCode::TOO_MANY_REQUESTS,
                format!("Thanks! Once a minute is plenty; {wait} s to go.\n"),
            )
                .into_response()
        })
        .build()?;

    Ok(Router::new()
        .route("/api/search", get(|| async { "results" }).layer(search))
        .route("/api/data", get(|| async { "data" }).layer(api))
        .route(
            "/api/account",
            // Layers run outside in: authentication first, then the limit.
            get(|| async { "account" })
                .layer(account)
                .layer(middleware::from_fn(authenticate)),
        )
        .route("/api/batch", post(|| async { "queued" }).layer(upstream))
        .route("/api/feedback", post(|| async { "thanks" }).layer(feedback)))
}

async fn send(app: &Router, method: &str, path: &str, headers: &[(&str, &str)]) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("x-forwarded-for", "203.0.113.7");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(Body::empty()).expect("a valid request");
    // What `into_make_service_with_connect_info::<SocketAddr>()` adds.
    let proxy: SocketAddr = ([10, 0, 0, 1], 41_000).into();
    request.extensions_mut().insert(ConnectInfo(proxy));
    let response = app
        .clone()
        .oneshot(request)
        .await
        .unwrap_or_else(|e| match e {});
    let mut shown = vec![response.status().to_string()];
    for (name, value) in response.headers() {
        if name.as_str().contains("ratelimit") || name == "retry-after" {
            shown.push(format!("{name}: {}", value.to_str().unwrap_or("?")));
        }
    }
    println!("{method} {path} {headers:?}\n    {}", shown.join("\n    "));
}

/// A decision without a future where none is needed, as the layer itself
/// decides a request.
async fn decide(limiter: &Limiter, key: &ClientKey) -> Decision {
    match limiter.try_check(key.as_bytes()) {
        Ok(decision) => decision, // decided, counted, no future
        Err(pending) => pending.decide().await,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), ConfigError> {
    let limiter = limiter("direct", 2, Duration::from_secs(60))?;
    let identity = ClientIdentity::new([7u8; 32])?;
    let key = identity.key_for_addr([203, 0, 113, 7].into());
    for _ in 0..3 {
        let d = decide(&limiter, &key).await;
        println!("direct: allowed {} remaining {}", d.allowed, d.remaining);
    }
    let app = app()?;
    send(&app, "GET", "/api/search", &[]).await;
    send(&app, "GET", "/api/data", &[("x-api-key", "k-123")]).await;
    send(
        &app,
        "GET",
        "/api/account",
        &[("authorization", "Bearer user-42")],
    )
    .await;
    send(&app, "POST", "/api/batch", &[("x-batch-size", "25")]).await;
    send(&app, "POST", "/api/batch", &[("x-monitoring", "1")]).await;
    send(&app, "POST", "/api/feedback", &[]).await;
    send(&app, "POST", "/api/feedback", &[]).await;
    Ok(())
}
