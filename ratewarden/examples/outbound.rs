//! The README's outbound snippets, compiled and run: calls to a partner API
//! wait for a permit of its quota, directly and through a tower layer.
//!
//! Run with `cargo run -p ratewarden --features memory --example outbound`.

use std::sync::Arc;
use std::time::Duration;

use ratewarden::memory::MemoryStore;
use ratewarden::outbound::WaitLayer;
use ratewarden::{Limiter, Policy, Rule, Store, WaitError};
use tower::{Layer, Service, ServiceExt};

/// The call the quota guards.
async fn call_partner() {
    println!("called the partner API");
}

/// Preparing a call, which may fail after the permit is granted.
async fn build_request() -> Result<String, Box<dyn std::error::Error>> {
    Ok("report".into())
}

/// Sending it.
async fn send(request: String) {
    println!("sent {request}");
}

/// What the caller answers its own client when no permit comes in time.
fn busy(retry_after: Duration) -> Box<dyn std::error::Error> {
    format!("the partner API is busy; retry in {retry_after:?}").into()
}

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // On a shared store (`ratewarden::store::from_url("redis://…")`) the
    // quota holds across every instance.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(10_000));

    let partner = Limiter::builder()
        .rule(Rule::new("partner-api", store, Policy::gcra(100, Duration::from_secs(1))?)?)
        .build()?;
    match partner.until_ready(b"partner", Duration::from_secs(2)).await {
        Ok(_) => call_partner().await,
        Err(WaitError::Deadline { last, .. }) => return Err(busy(last.retry_after)),
        Err(e) => return Err(e.into()),
    }

    let permit = partner.acquire(b"partner", Duration::from_secs(2)).await?;
    let request = build_request().await?; // on an error the permit is dropped unused: the unit comes back
    permit.used(); // from here the call is made and its unit stays spent
    send(request).await;

    // Any client service: a hyper or tonic client, here one that answers
    // the length of what it was sent.
    let http_client = tower::service_fn(|body: String| async move { Ok::<_, std::io::Error>(body.len()) });
    let mut client = WaitLayer::new(partner, "partner", Duration::from_secs(2)).layer(http_client);
    let sent = client.ready().await?.call("hello".into()).await?;
    println!("the layered client sent {sent} bytes");
    Ok(())
}
