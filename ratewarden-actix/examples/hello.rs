//! The README's actix-web snippet: a route limited to 60 searches a minute
//! per client address, with the same headers and 429 as the tower layer.
//!
//! Run with `cargo run -p ratewarden-actix --example hello`, then
//! `curl -i http://127.0.0.1:8080/search`.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpServer, web};
use ratewarden::memory::MemoryStore;
use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};
use ratewarden_actix::RateLimit;

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));
    let limiter = Limiter::builder()
        .rule(Rule::new("search", store, Policy::sliding_window(60, Duration::from_secs(60))?)?)
        .build()?;

    let layer = RateLimitLayer::new(limiter, ClientIdentity::random()?)?;
    HttpServer::new(move || {
        App::new()
            .wrap(RateLimit::new(layer.clone()))
            .route("/search", web::get().to(|| async { "results" }))
    })
    .bind(("127.0.0.1", 8080))?
    .run()
    .await?;
    Ok(())
}
