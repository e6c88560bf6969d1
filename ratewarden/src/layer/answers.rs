//! The layer's own answers: a refusal, and the errors it gives without
//! asking the inner service (no key, no client address, a cost no rule
//! admits), as JSON or as gRPC statuses.

use super::*;

/// An answer the layer gives itself, without the inner service.
#[derive(Debug, Clone, Copy)]
pub(super) enum Own {
    /// No key, refused with this status ([`MissingKey::Reject`]).
    MissingKey(StatusCode),
    /// Keyed by address, with none to be had: the server's mistake.
    NoAddress,
    /// A cost above what a rule ever admits.
    Cost,
    /// A client on the deny list ([`RateLimitLayerBuilder::access`]).
    Denied,
}

/// The JSON body of an answer of the layer's own, and its message alone
/// (a gRPC status's), written once for both.
macro_rules! own_texts {
    ($error:literal, $message:literal) => {
        (
            concat!(
                "{\"error\":\"",
                $error,
                "\",\"message\":\"",
                $message,
                "\"}"
            ),
            $message,
        )
    };
}

impl Own {
    fn status(self) -> StatusCode {
        match self {
            Own::MissingKey(status) => status,
            Own::NoAddress => StatusCode::INTERNAL_SERVER_ERROR,
            Own::Cost => StatusCode::PAYLOAD_TOO_LARGE,
            Own::Denied => StatusCode::FORBIDDEN,
        }
    }

    fn texts(self) -> (&'static str, &'static str) {
        match self {
            Own::MissingKey(_) => {
                own_texts!("missing_key", "This request carries no rate-limit key.")
            }
            Own::NoAddress => own_texts!(
                "no_client_address",
                "The server cannot see the client's address to rate-limit this request."
            ),
            Own::Cost => own_texts!(
                "cost_exceeds_limit",
                "This request costs more than the rate limit ever admits."
            ),
            Own::Denied => own_texts!("forbidden", "This client is not allowed here."),
        }
    }
}

pub(super) const NOT_LIMITED_BODY: &[u8] = b"{\"error\":\"not_limited\",\
    \"message\":\"Requests like this one are not rate-limited.\"}";

impl Shared {
    pub(super) fn own(&self, own: Own) -> Response<Bytes> {
        let (json, message) = own.texts();
        #[cfg(feature = "grpc")]
        if self.grpc {
            return grpc::own(own.status(), message);
        }
        let _ = message;
        let mut response = Response::new(Bytes::from_static(json.as_bytes()));
        *response.status_mut() = own.status();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    pub(super) fn default_refusal(&self, decision: &Decision, plan: usize) -> Response<Bytes> {
        #[cfg(feature = "grpc")]
        if self.grpc {
            return grpc::refusal(decision, self.headers(plan));
        }
        self.headers(plan).refusal(decision).into_http()
    }

    /// The application's refusal of `decision`, with the rate-limit
    /// headers; the layer's own if the application's body failed.
    pub(super) async fn custom_refusal(&self, decision: &Decision, plan: usize) -> Response<Bytes> {
        let custom = match &self.refusal {
            Some(refusal) => refusal(decision).await,
            None => None,
        };
        let Some(mut response) = custom else {
            return self.default_refusal(decision, plan);
        };
        self.headers(plan).write(decision, response.headers_mut());
        response
    }
}
