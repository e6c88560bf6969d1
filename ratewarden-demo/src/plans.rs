//! `GET /api/reports`: a limit chosen per request, by the customer of the
//! caller's API key: a plan, or a limit of the customer's own.
//!
//! ```text
//! ratewarden-demo --api-key 0123456789abcdef-pro=pro --api-key 'fedcba9876543210-big=gcra 5/s burst 30'
//! curl -i localhost:3000/api/reports                                  # free: 10 a minute
//! curl -i -H 'x-api-key: 0123456789abcdef-pro' localhost:3000/api/reports  # pro: 100 a minute
//! curl -i -H 'x-api-key: fedcba9876543210-big' localhost:3000/api/reports  # its own: 30 at once
//! ```
//!
//! A request without `X-Api-Key` is on the free plan; one with a key the
//! server was given is its customer's; one with any other key is answered
//! `401` before it is counted. The customer is set by [`authenticate`] (a
//! middleware in front of every route, as an application's authentication
//! would be), never read from a header the client writes itself; its limit
//! comes from the keys given at start ([`ApiKeys::limits`]), as an
//! application's would come from its database. Limits of one algorithm
//! count the same usage (the rule `reports`), so a client that starts
//! using its key keeps what it already spent this minute.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ratewarden::{ConfigError, CustomerLimit, StaticLimits};
use sha2::{Digest, Sha256};

use crate::admin::MIN_TOKEN_LEN;

/// The plans of `GET /api/reports`, the default first, as policy text.
pub const REPORT_PLANS: [(&str, &str); 2] = [("free", "10/min"), ("pro", "100/min")];

/// The header an API key comes in.
pub const API_KEY_HEADER: &str = "x-api-key";

/// The customer [`authenticate`] found for a request: what the rate-limit
/// layer of `/api/reports` finds its limit by. Named after its key's
/// digest (`key-1a2b3c4d`), never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customer(pub String);

/// The API keys the server accepts and their customers' limits, kept as
/// SHA-256 digests: a lookup compares digests, so its time says nothing of
/// how much of a guessed key is right.
#[derive(Clone, Default)]
pub struct ApiKeys(Arc<HashMap<[u8; 32], (String, CustomerLimit)>>);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

impl ApiKeys {
    /// Keys from `KEY=PLAN` or `KEY=LIMIT` pairs (`--api-key`): a plan of
    /// [`REPORT_PLANS`] or one policy of the customer's own (`gcra 5/s
    /// burst 30`). Refuses a pair without `=`, a key shorter than
    /// [`MIN_TOKEN_LEN`] bytes, a limit that is neither, and a key given
    /// twice.
    pub fn parse<'a>(pairs: impl IntoIterator<Item = &'a str>) -> Result<Self, ConfigError> {
        let mut keys = HashMap::new();
        for pair in pairs {
            let Some((key, plan)) = pair.split_once('=') else {
                return Err(ConfigError::Invalid(format!(
                    "--api-key wants KEY=PLAN or KEY=LIMIT, got {:?}",
                    redact(pair)
                )));
            };
            if key.len() < MIN_TOKEN_LEN {
                return Err(ConfigError::Invalid(format!(
                    "an API key must be at least {MIN_TOKEN_LEN} bytes (the one for plan \
                     {plan:?} is {})",
                    key.len()
                )));
            }
            let limit = match REPORT_PLANS.iter().find(|(name, _)| *name == plan) {
                Some((plan, _)) => CustomerLimit::Plan((*plan).to_owned()),
                None => match plan.parse::<ratewarden::Policy>() {
                    Ok(policy) => CustomerLimit::Policies(vec![policy]),
                    Err(e) => {
                        let names: Vec<&str> = REPORT_PLANS.iter().map(|(n, _)| *n).collect();
                        return Err(ConfigError::Invalid(format!(
                            "{plan:?} for an API key is neither a plan {names:?} nor a policy: {e}"
                        )));
                    }
                },
            };
            let digest = digest(key);
            let customer = format!("key-{}", hex::encode(&digest[..4]));
            if keys.insert(digest, (customer, limit)).is_some() {
                return Err(ConfigError::Invalid("an API key is given twice".to_owned()));
            }
        }
        Ok(ApiKeys(Arc::new(keys)))
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The customer of `key`, if the server knows it.
    pub fn customer(&self, key: &[u8]) -> Option<Customer> {
        self.0.get(&digest(key)).map(|(c, _)| Customer(c.clone()))
    }

    /// Every customer's limit: the source of `/api/reports`' limits.
    pub fn limits(&self) -> StaticLimits {
        self.0.values().fold(StaticLimits::new(), |all, (c, l)| {
            all.with(c.clone(), l.clone())
        })
    }
}

fn digest(key: impl AsRef<[u8]>) -> [u8; 32] {
    Sha256::digest(key.as_ref()).into()
}

/// The pair with its key hidden, for an error message.
fn redact(pair: &str) -> String {
    format!("{}…", pair.chars().take(4).collect::<String>())
}

/// The middleware that puts the caller's [`Customer`] in its request:
/// `401` for an unknown key, nothing for a request without one.
pub async fn authenticate(
    State(keys): State<ApiKeys>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(key) = request.headers().get(API_KEY_HEADER) {
        let Some(customer) = keys.customer(key.as_bytes()) else {
            let body = r#"{"error":"unknown_api_key","message":"This API key is not known."}"#;
            return (
                StatusCode::UNAUTHORIZED,
                [(CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response();
        };
        request.extensions_mut().insert(customer);
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_keys_are_refused_at_start() {
        let e = |pairs: &[&str]| {
            ApiKeys::parse(pairs.iter().copied())
                .unwrap_err()
                .to_string()
        };
        assert!(e(&["0123456789abcdef"]).contains("KEY=PLAN or KEY=LIMIT"));
        assert!(
            !e(&["0123456789abcdef"]).contains("0123456789"),
            "the key is not echoed"
        );
        assert!(e(&["short=pro"]).contains("at least 16 bytes"));
        assert!(e(&["0123456789abcdef=gold"]).contains("\"gold\" for an API key is neither"));
        assert!(e(&["0123456789abcdef=pro", "0123456789abcdef=free"]).contains("twice"));
        let keys =
            ApiKeys::parse(["0123456789abcdef=pro", "fedcba9876543210=gcra 5/s burst 30"]).unwrap();
        let pro = keys.customer(b"0123456789abcdef").unwrap();
        assert!(
            pro.0.starts_with("key-") && !pro.0.contains("0123"),
            "{pro:?}"
        );
        assert_eq!(keys.customer(b"0123456789abcdeg"), None);
        assert_eq!(keys.0.len(), 2);
    }
}
