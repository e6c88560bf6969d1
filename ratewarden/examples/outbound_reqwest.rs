//! The README's reqwest snippet: a `reqwest-middleware` client whose every
//! request waits for a permit of a partner's quota, here against a local
//! stand-in for the partner.
//!
//! Run with `cargo run -p ratewarden --features memory,reqwest --example outbound_reqwest`.

use std::sync::Arc;
use std::time::Duration;

use axum::{Router, routing::get};
use ratewarden::memory::MemoryStore;
use ratewarden::outbound::reqwest::WaitMiddleware;
use ratewarden::{Limiter, Policy, Rule, Store};
use reqwest_middleware::{ClientBuilder, reqwest};

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let partner_url = format!("http://{}/v1/rates", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, Router::new().route("/v1/rates", get(|| async { "rates" }))).await });
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(10_000));

    let partner = Limiter::builder()
        .rule(Rule::new("partner-api", store, Policy::sliding_log(2, Duration::from_secs(1))?)?)
        .build()?;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(WaitMiddleware::new(partner, "partner", Duration::from_secs(2)))
        .build();
    for _ in 0..3 {
        let rates = client.get(&partner_url).send().await?.text().await?; // the third waits a second
        println!("{rates}");
    }
    Ok(())
}
