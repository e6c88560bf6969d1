//! The README's shared-store snippet, compiled: every instance of a fleet
//! counts in one Redis and derives client keys from one secret.
//!
//! Needs a Redis server and a secret of at least 32 bytes:
//! `RATEWARDEN_SECRET=… cargo run -p ratewarden --features redis --example shared_store`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::post};

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::sync::Arc;
    use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};

    // ratewarden = { path = "…", features = ["redis"] }
    let redis: Arc<dyn Store> = ratewarden::store::from_url("redis://127.0.0.1:6379").await?;
    let uploads = Limiter::builder()
        .rule(Rule::new("uploads", redis, Policy::gcra(100, Duration::from_secs(3600))?)?)
        .build()?;
    // Every instance must derive the same client keys: one secret for all.
    let identity = ClientIdentity::new(std::env::var("RATEWARDEN_SECRET")?)?;
    let layer = RateLimitLayer::new(uploads, identity)?;
    let app = Router::new().route("/api/upload", post(|| async { "stored" }).layer(layer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
