//! `GET /api/quota` and `POST /admin/reset`: the two routes beside the
//! limited ones.
//!
//! ```text
//! curl -i localhost:3000/api/quota                  # search, spending nothing
//! curl -i 'localhost:3000/api/quota?route=feedback'
//! curl -i -X POST -H 'authorization: Bearer TOKEN' \
//!      'localhost:3000/admin/reset?client=192.0.2.7'  # every route, or &route=NAME
//! ```
//!
//! The reset route exists only when the server is given a token:
//! `RATEWARDEN_ADMIN_TOKEN`, or `--admin-token-file PATH`, or
//! `--admin-token` (whose value every user of the machine sees in `ps`).
//! The token is compared in constant time,
//! as SHA-256 digests, so that the time a refusal takes says nothing of its
//! bytes or its length. The client is named by its address, which is
//! turned into the client's key exactly as the layer does (HMAC with the
//! server's secret, IPv6 grouped by its prefix): the raw address is never
//! a key, and it is not logged; the log line names the caller's address,
//! the routes and the hashed key.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use ratewarden::customers::CustomerLayer;
use ratewarden::{ClientIdentity, ConfigError, RateLimitLayer};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The shortest admin token accepted: guessing 16 random bytes is out of
/// reach, and a shorter one is likely a placeholder left in a script.
pub const MIN_TOKEN_LEN: usize = 16;

/// The bearer token of `POST /admin/reset`, kept as its digest.
#[derive(Clone)]
pub struct AdminToken(Arc<[u8; 32]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    /// Refuses a token shorter than [`MIN_TOKEN_LEN`] bytes.
    pub fn new(token: &str) -> Result<Self, ConfigError> {
        if token.len() < MIN_TOKEN_LEN {
            return Err(ConfigError::Invalid(format!(
                "the admin token must be at least {MIN_TOKEN_LEN} bytes (it is {}): generate \
                 one, e.g. `openssl rand -hex 16`",
                token.len()
            )));
        }
        Ok(AdminToken(Arc::new(
            Sha256::digest(token.as_bytes()).into(),
        )))
    }

    /// The token in the file at `path`, without the line end an editor or
    /// `openssl rand -hex 16 > FILE` leaves after it. Refuses a file that
    /// cannot be read or holds a token shorter than [`MIN_TOKEN_LEN`],
    /// naming the file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::Invalid(format!(
                "cannot read the admin token file {}: {e}",
                path.display()
            ))
        })?;
        AdminToken::new(text.trim()).map_err(|e| match e {
            ConfigError::Invalid(reason) => {
                ConfigError::Invalid(format!("{}: {reason}", path.display()))
            }
            other => other,
        })
    }

    /// Whether `headers` carry `Authorization: Bearer <this token>`.
    fn authorizes(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        bool::from(given.ct_eq(&*self.0))
    }
}

/// How a route is limited: one layer, or its customer's.
#[derive(Clone)]
pub enum Limited {
    /// A [`RateLimitLayer`] of its own.
    Layer(RateLimitLayer),
    /// Its customer's limit ([`CustomerLayer`]).
    Customers(CustomerLayer),
}

impl Limited {
    /// The caller's quota on this route.
    async fn quota(&self, parts: &Parts) -> Response {
        match self {
            Limited::Layer(layer) => layer.quota(parts).await.into_response(),
            Limited::Customers(layer) => layer.quota(parts).await.into_response(),
        }
    }

    /// Forgets `key`'s usage under every limit of the route.
    async fn reset(&self, key: &[u8]) -> Result<(), ratewarden::StoreError> {
        match self {
            Limited::Layer(layer) => layer.plans().reset(key).await,
            Limited::Customers(layer) => layer.limits().reset(key).await,
        }
    }
}

/// The limited routes by name, and how their clients are keyed.
#[derive(Clone)]
pub struct Routes {
    layers: Arc<[(&'static str, Limited)]>,
    identity: ClientIdentity,
}

impl Routes {
    /// The routes' layers, by rule name.
    pub fn new(layers: Vec<(&'static str, Limited)>, identity: ClientIdentity) -> Self {
        Routes {
            layers: layers.into(),
            identity,
        }
    }

    fn find(&self, name: &str) -> Option<&Limited> {
        self.layers.iter().find(|(n, _)| *n == name).map(|(_, l)| l)
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.layers.iter().map(|(n, _)| *n).collect();
        names.join(", ")
    }
}

/// The query of both routes.
#[derive(Debug, Deserialize)]
pub struct Target {
    route: Option<String>,
    client: Option<String>,
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /api/quota[?route=NAME]`: the caller's quota on one route (`search`
/// unless named), with the headers a request there would get back, and
/// nothing spent.
pub async fn quota(
    State(routes): State<Routes>,
    Query(target): Query<Target>,
    parts: Parts,
) -> Response {
    let name = target.route.as_deref().unwrap_or("search");
    match routes.find(name) {
        Some(layer) => layer.quota(&parts).await,
        None => error(
            StatusCode::NOT_FOUND,
            "unknown_route",
            &format!("no route named {name:?}; the routes are {}", routes.names()),
        ),
    }
}

/// `POST /admin/reset?client=ADDR[&route=NAME]`: forgets the client's
/// usage on one route, or on every route, on this server's stores.
pub async fn reset(
    State((routes, token)): State<(Routes, AdminToken)>,
    Query(target): Query<Target>,
    parts: Parts,
) -> Response {
    let caller = ratewarden::identity::peer_addr(&parts.extensions)
        .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
    if !token.authorizes(&parts.headers) {
        tracing::warn!(%caller, "admin reset refused: bad or missing token");
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "POST /admin/reset needs the header `Authorization: Bearer <admin token>`",
        );
    }
    let Some(addr) = target
        .client
        .as_deref()
        .and_then(|c| c.parse::<IpAddr>().ok())
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_client",
            "name the client by its address: ?client=192.0.2.7 or ?client=2001:db8::7",
        );
    };
    let chosen: Vec<(&str, &Limited)> = match target.route.as_deref() {
        None => routes.layers.iter().map(|(n, l)| (*n, l)).collect(),
        Some(name) => match routes.find(name) {
            Some(layer) => vec![(name, layer)],
            None => {
                return error(
                    StatusCode::NOT_FOUND,
                    "unknown_route",
                    &format!("no route named {name:?}; the routes are {}", routes.names()),
                );
            }
        },
    };
    let key = routes.identity.key_for_addr(addr);
    let mut reset = Vec::new();
    for (name, layer) in chosen {
        if let Err(e) = layer.reset(key.as_bytes()).await {
            tracing::error!(%caller, route = name, key = key.as_str(), error = %e,
                "admin reset failed");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_failed",
                &format!("the {name} route's store failed: {e}; routes reset before it: {reset:?}"),
            );
        }
        reset.push(name);
    }
    tracing::info!(%caller, routes = ?reset, key = key.as_str(), "admin reset");
    let body = serde_json::json!({ "reset": reset, "key": key.as_str() }).to_string();
    (StatusCode::OK, [(CONTENT_TYPE, "application/json")], body).into_response()
}
