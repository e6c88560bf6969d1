//! The README's plans snippet, compiled and run: one limit per plan, chosen
//! per request by what authentication put in it, usage shared by the plans.
//!
//! Run with `cargo run -p ratewarden --features memory,axum --example plans`.

use std::sync::Arc;

use axum::{Router, body::Body, extract::ConnectInfo, routing::get};
use http::Request;
use ratewarden::memory::MemoryStore;
use ratewarden::{ClientIdentity, Plans, RateLimitLayer, Store};
use tower::ServiceExt;

/// What the application's authentication puts in a request.
// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[derive(Clone)]
struct Customer { plan: &'static str } // what your authentication put in the request

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));
    let identity = ClientIdentity::new(b"0123456789abcdef0123456789abcdef")?;

    let plans = Plans::builder("api", store)
        .plan("free", "100/h")
        .plan("pro", "1000/h")         // "10/s; 1000/h": several limits, as for Rule::tiers
        .build()?;                     // errors name the plan and the part at fault
    let layer = RateLimitLayer::builder(plans, identity)
        .plan(|parts| parts.extensions.get::<Customer>().map(|c| c.plan))
        .build()?;

    let app = Router::new().route("/", get(|| async { "ok" })).layer(layer.clone());
    let request = |plan| {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(std::net::SocketAddr::from(([192, 0, 2, 1], 4000))));
        request.extensions_mut().insert(Customer { plan });
        request
    };
    for _ in 0..100 {
        assert!(app.clone().oneshot(request("free")).await?.status().is_success());
    }
    let free = app.clone().oneshot(request("free")).await?;
    let pro = app.clone().oneshot(request("pro")).await?;
    println!(
        "free: {} after 100; then pro: {} (RateLimit: {}; RateLimit-Policy: {})",
        free.status(),
        pro.status(),
        pro.headers()["ratelimit"].to_str()?,
        pro.headers()["ratelimit-policy"].to_str()?,
    );
    let client = ClientIdentity::new(b"0123456789abcdef0123456789abcdef")?.key_for_addr([192, 0, 2, 1].into());
    layer.plans().reset(client.as_bytes()).await?;   // every plan, every refusal cache here
    Ok(())
}
