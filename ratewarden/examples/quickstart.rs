//! The README's first example, verbatim: an axum server limiting search to
//! 60 requests a minute per client, on the in-process memory store.
//!
//! Run with `cargo run -p ratewarden --example quickstart`, then
//! `curl -i 'http://127.0.0.1:3000/api/search'`.

use axum::{Router, routing::get};
use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule};
use std::net::SocketAddr;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = ratewarden::store::from_url("memory://?capacity=100000").await?;
    let search = Limiter::builder()
        .rule(Rule::new(
            "search",
            store,
            Policy::sliding_log(60, Duration::from_secs(60))?,
        )?)
        .build()?;
    // One process counting in its own memory needs no secret of its own.
    let identity = ClientIdentity::random()?;
    let app = Router::new().route(
        "/api/search",
        get(|| async { "results" }).layer(RateLimitLayer::new(search, identity)?),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    // The layer keys clients by their socket address: serve with ConnectInfo.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
