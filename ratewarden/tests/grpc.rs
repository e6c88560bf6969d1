//! The layer in front of a tonic service, called by a tonic client over a
//! real socket: admitted calls reach the service with the rate-limit
//! metadata, a refused one is `RESOURCE_EXHAUSTED` with its retry delay in
//! the status details and the same metadata.
#![cfg(feature = "grpc")]

use std::sync::Arc;
use std::time::Duration;

use ratewarden::{ClientIdentity, Limiter, ManualClock, Policy, RateLimitLayer, Rule, Store};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::Server;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

const LIMIT: u32 = 3;

/// A layer's builder: `LIMIT` calls a minute per client address, on a
/// manual clock at the start of a minute.
fn builder() -> ratewarden::RateLimitLayerBuilder {
    let store: Arc<dyn Store> = Arc::new(ratewarden_test_support::stores::AwaitedStore::default());
    let policy = Policy::fixed_window(LIMIT, Duration::from_secs(60)).unwrap();
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(Rule::new("grpc", store, policy).unwrap())
        .build()
        .unwrap();
    RateLimitLayer::builder(limiter, ClientIdentity::new([7u8; 32]).unwrap())
}

/// A health service behind a layer admitting `LIMIT` calls a minute per
/// client address, on a manual clock at the start of a minute; its client.
async fn serve(
    layer: impl FnOnce(ratewarden::RateLimitLayerBuilder) -> ratewarden::RateLimitLayerBuilder,
) -> HealthClient<tonic::transport::Channel> {
    let layer = layer(builder()).build().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test]
async fn admitted_calls_reach_the_service_and_a_refusal_is_resource_exhausted_with_its_retry_delay()
{
    let mut client = serve(|b| b.grpc()).await;
    for n in 1..=LIMIT {
        let response = client.check(check()).await.unwrap();
        assert_eq!(
            response.get_ref().status(),
            ServingStatus::Serving,
            "call {n} reached the service"
        );
        let field = response
            .metadata()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap();
        assert!(field.contains(&format!(";r={};", LIMIT - n)), "{field}");
    }
    let refused = client.check(check()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.message(), "rate limited: retry in 60 s");
    let retry = refused.get_error_details().retry_info().cloned();
    assert_eq!(
        retry.and_then(|r| r.retry_delay),
        Some(Duration::from_secs(60)),
        "{refused:?}"
    );
    let metadata = refused.metadata();
    assert_eq!(metadata.get("retry-after").unwrap(), "60");
    let listed = metadata.get("ratelimit-policy").unwrap().to_str().unwrap();
    assert!(listed.contains(&format!(";q={LIMIT};")), "{listed}");
    let field = metadata.get("ratelimit").unwrap().to_str().unwrap();
    assert!(field.contains(";r=0;"), "{field}");
}

#[tokio::test]
async fn without_grpc_answers_a_tonic_client_gets_an_http_429_it_cannot_read() {
    // What `grpc()` is for: the plain layer's 429 with a JSON body reaches a
    // tonic client as a transport-level failure, with no retry delay.
    let mut client = serve(|b| b).await;
    for _ in 0..LIMIT {
        client.check(check()).await.unwrap();
    }
    let refused = client.check(check()).await.unwrap_err();
    assert_ne!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.get_error_details().retry_info().is_none());
}

#[tokio::test]
async fn a_request_without_a_key_is_invalid_argument() {
    let identity = ClientIdentity::new([7u8; 32]).unwrap();
    let by_key = ratewarden::key::HeaderKey::new(&identity, "x-api-key").unwrap();
    let mut client = serve(|b| {
        b.grpc()
            .key(by_key)
            .on_missing_key(ratewarden::MissingKey::Reject(
                http::StatusCode::BAD_REQUEST,
            ))
    })
    .await;
    let refused = client.check(check()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(refused.message(), "This request carries no rate-limit key.");
    let mut request = tonic::Request::new(check());
    request
        .metadata_mut()
        .insert("x-api-key", "k1".parse().unwrap());
    let response = client.check(request).await.unwrap();
    assert_eq!(response.get_ref().status(), ServingStatus::Serving);
}

#[tokio::test]
async fn a_call_heavier_than_the_limit_is_invalid_argument() {
    let mut client = serve(|b| b.grpc().cost(|_| LIMIT + 1)).await;
    let refused = client.check(check()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(
        refused.message(),
        "This request costs more than the rate limit ever admits."
    );
}

#[test]
fn count_only_is_refused_with_grpc() {
    let err = builder()
        .grpc()
        .count_only(|status| status == http::StatusCode::UNAUTHORIZED)
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("count_only cannot judge a gRPC call"),
        "{err}"
    );
}
