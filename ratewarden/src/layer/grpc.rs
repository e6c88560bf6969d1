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
