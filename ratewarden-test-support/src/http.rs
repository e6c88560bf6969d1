//! An HTTP server on a free port and a client over a real socket.

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::body::HttpBody;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Serves `app` on a fresh port of 127.0.0.1 with peer addresses available
/// to the layer.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Serves `app` as [`serve`] does, handing the layer each peer address as
/// a plain `SocketAddr` request extension, as a server other than axum's
/// would: what the `ratewarden` layer reads when it is built without its
/// `axum` feature, where it does not know axum's `ConnectInfo`.
pub async fn serve_with_socket_addr(app: Router) -> SocketAddr {
    let app = app.layer(axum::middleware::map_request(
        |mut request: Request<axum::body::Body>| async move {
            let peer = request
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|info| info.0);
            if let Some(peer) = peer {
                request.extensions_mut().insert(peer);
            }
            request
        },
    ));
    serve(app).await
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body, as UTF-8.
    pub body: String,
}

impl Reply {
    /// Reads `response` whole.
    pub async fn read<B>(response: Response<B>) -> Reply
    where
        B: HttpBody<Data = Bytes>,
        B::Error: std::fmt::Debug,
    {
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    /// The header `name`; panics if it is missing or not visible ASCII.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:?}"))
            .to_str()
            .unwrap()
    }

    /// The header `name` as a number.
    pub fn header_u64(&self, name: &str) -> u64 {
        self.header(name).parse().unwrap()
    }

    /// The `RateLimit` field (draft-ietf-httpapi-ratelimit-headers): the
    /// deciding policy's name, its remaining units `r` and its reset `t`.
    pub fn ratelimit(&self) -> (String, u64, u64) {
        let field = self.header("ratelimit");
        let parse = || {
            let (name, params) = field.strip_prefix('"')?.split_once('"')?;
            let mut r = None;
            let mut t = None;
            for param in params.split(';').skip(1) {
                match param.split_once('=')? {
                    ("r", n) => r = n.parse().ok(),
                    ("t", n) => t = n.parse().ok(),
                    _ => {}
                }
            }
            Some((name.to_owned(), r?, t?))
        };
        parse().unwrap_or_else(|| panic!("RateLimit {field:?} is not `\"name\";r=N;t=N`"))
    }

    /// The units remaining, as the `RateLimit` field says (`r`).
    pub fn remaining(&self) -> u64 {
        self.ratelimit().1
    }

    /// The seconds until the quota is whole again, as the `RateLimit` field
    /// says (`t`).
    pub fn reset(&self) -> u64 {
        self.ratelimit().2
    }

    /// The deciding policy's limit: the `q` of the `RateLimit-Policy`
    /// member that the `RateLimit` field names.
    pub fn limit(&self) -> u64 {
        let (name, _, _) = self.ratelimit();
        let listed = self.header("ratelimit-policy");
        let head = format!("\"{name}\";q=");
        listed
            .split(", ")
            .find_map(|member| member.strip_prefix(&head)?.split(';').next()?.parse().ok())
            .unwrap_or_else(|| panic!("RateLimit-Policy {listed:?} does not list {name:?}"))
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }

    /// Checks that every rate-limit header says the same as the others:
    /// `RateLimit` names `policy`, and `RateLimit-Policy`, which lists every
    /// policy of the limiter, lists it with the same limit and `window`;
    /// the `X-RateLimit-*` trio, if present, and a refusal's body agree.
    pub fn assert_consistent(&self, policy: &str, window: u64) {
        let (named, remaining, reset) = self.ratelimit();
        assert_eq!(named, policy, "RateLimit names another policy");
        let limit = self.limit();
        let member = format!("\"{policy}\";q={limit};w={window}");
        let listed = self.header("ratelimit-policy");
        assert!(
            listed.split(", ").any(|m| m == member),
            "RateLimit-Policy {listed:?} does not list {member:?}"
        );
        if self.headers.contains_key("x-ratelimit-limit") {
            assert_eq!(self.header_u64("x-ratelimit-limit"), limit);
            assert_eq!(self.header_u64("x-ratelimit-remaining"), remaining);
            assert_eq!(self.header_u64("x-ratelimit-reset"), reset);
        }
        assert!(remaining <= limit);
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            let json = self.json();
            assert_eq!(json["error"], "rate_limited");
            assert_eq!(json["retry_after"], self.header_u64("retry-after"));
            assert_eq!(json["limit"], limit);
            assert_eq!(json["remaining"], remaining);
            assert_eq!(json["reset"], reset);
            assert_eq!(json["policy"], policy);
            assert_eq!(self.header("content-type"), "application/json");
        } else {
            assert!(self.headers.get("retry-after").is_none());
        }
    }
}

/// An HTTP/1 client, optionally bound to a local address (127.0.0.2 is
/// another client on the same machine).
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl TestClient {
    /// A client of `server`, connecting from `local` if given.
    pub fn new(server: SocketAddr, local: Option<IpAddr>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_local_address(local);
        TestClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
            base: format!("http://{server}"),
        }
    }

    /// Sends a request with an empty body and reads the whole reply.
    pub async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send_body(method, path, headers, String::new()).await
    }

    /// [`send`](Self::send) with a body.
    pub async fn send_body(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .client
            .request(request.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        Reply::read(response).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, &[]).await
    }

    /// `GET path` with `X-Forwarded-For: xff`, as a proxy that appended its
    /// client's address sends it (or as a client forging the header).
    pub async fn get_forwarded_for(&self, path: &str, xff: &str) -> Reply {
        self.send(Method::GET, path, &[("x-forwarded-for", xff)])
            .await
    }
}
