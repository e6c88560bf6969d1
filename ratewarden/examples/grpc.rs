//! The README's gRPC snippet, compiled and run: a tonic service (the
//! standard health check) behind the rate-limit layer, called until a
//! refusal comes back as `RESOURCE_EXHAUSTED` with its retry delay.
//!
//! Run with `cargo run -p ratewarden --features memory,grpc --example grpc`.

use std::sync::Arc;
use std::time::Duration;

use ratewarden::memory::MemoryStore;
use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule, Store};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_reporter, health_service) = tonic_health::server::health_reporter();

    let limiter = Limiter::builder()
        .rule(Rule::new("grpc", store, Policy::sliding_window(2, Duration::from_secs(60))?)?)
        .build()?;
    let layer = RateLimitLayer::builder(limiter, ClientIdentity::random()?).grpc().build()?;
    let server = Server::builder().layer(layer).add_service(health_service);
    tokio::spawn(server.serve_with_incoming(TcpListenerStream::new(listener)));

    let channel = Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
    let mut client = HealthClient::new(channel);
    let request = || HealthCheckRequest { service: String::new() };
    for _ in 0..2 {
        let reply = client.check(request()).await?;
        println!("served; {:?} left", reply.metadata().get("ratelimit"));
    }
    let refused = client.check(request()).await.unwrap_err();
    let retry = refused.get_error_details().retry_info().and_then(|r| r.retry_delay);
    println!("{:?}: {}; retry in {retry:?}", refused.code(), refused.message());
    Ok(())
}
