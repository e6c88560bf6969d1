//! The layer's own answers as gRPC statuses ([`RateLimitLayerBuilder::grpc`](super::RateLimitLayerBuilder::grpc)).

use bytes::Bytes;
use http::{Response, StatusCode};
use ratewarden_core::Decision;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::RateLimitHeaders;

/// A refusal: `RESOURCE_EXHAUSTED`, its retry delay as a
/// `google.rpc.RetryInfo` detail (what gRPC clients and retry policies
/// read), and the rate-limit headers as metadata beside the status.
pub(super) fn refusal(decision: &Decision, headers: &RateLimitHeaders) -> Response<Bytes> {
    let status = Status::with_error_details(
        Code::ResourceExhausted,
        format!("rate limited: retry in {} s", decision.retry_after_secs()),
        ErrorDetails::with_retry_info(Some(decision.retry_after)),
    );
    let mut response = trailers_only(status);
    headers.write(decision, response.headers_mut());
    response
}

/// Another answer of the layer's own, with the code nearest its HTTP
/// status.
pub(super) fn own(status: StatusCode, message: &'static str) -> Response<Bytes> {
    let code = match status {
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
        s if s.is_server_error() => Code::Internal,
        _ => Code::InvalidArgument,
    };
    trailers_only(Status::new(code, message))
}

/// `status` as a response of headers alone (HTTP 200, `grpc-status` among
/// them), the form a server uses for a call that fails before any message.
fn trailers_only(status: Status) -> Response<Bytes> {
    status.into_http::<()>().map(|()| Bytes::new())
}

/// The gRPC answers read back as a tonic client reads them, without a
/// socket or a server: beside `tests/grpc.rs`, which calls through both.
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ratewarden_core::{Limiter, Policy, Rule, Store};

    use super::*;
    use crate::HeaderMode;

    fn status_of(response: &Response<Bytes>) -> Status {
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "a gRPC answer is HTTP 200"
        );
        Status::from_header_map(response.headers()).expect("a grpc-status header")
    }

    #[test]
    fn a_refusal_is_resource_exhausted_with_its_retry_delay_and_headers() {
        let policy = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
        let store: Arc<dyn Store> =
            Arc::new(ratewarden_test_support::stores::AwaitedStore::default());
        let limiter = Limiter::builder()
            .rule(Rule::new("grpc", store, policy).unwrap())
            .build()
            .unwrap();
        let headers = RateLimitHeaders::new(&limiter, HeaderMode::Both);
        let refused = Decision::new(
            false,
            &policy,
            0,
            Duration::from_secs(42),
            Duration::from_millis(41_200),
            "memory",
        );
        let response = refusal(&refused, &headers);
        let status = status_of(&response);
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert_eq!(status.message(), "rate limited: retry in 42 s");
        let retry = status.get_error_details().retry_info().cloned();
        assert_eq!(
            retry.and_then(|r| r.retry_delay),
            Some(Duration::from_millis(41_200))
        );
        assert_eq!(response.headers()["retry-after"], "42");
        assert_eq!(response.headers()["x-ratelimit-remaining"], "0");
        assert!(response.body().is_empty());
    }

    #[test]
    fn the_layers_own_answers_take_the_nearest_code() {
        for (http, code) in [
            (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
            (StatusCode::FORBIDDEN, Code::PermissionDenied),
            (StatusCode::NOT_FOUND, Code::NotFound),
            (StatusCode::TOO_MANY_REQUESTS, Code::ResourceExhausted),
            (StatusCode::SERVICE_UNAVAILABLE, Code::Internal),
            (StatusCode::BAD_REQUEST, Code::InvalidArgument),
        ] {
            let status = status_of(&own(http, "no"));
            assert_eq!(status.code(), code, "{http}");
            assert_eq!(status.message(), "no");
        }
    }
}
