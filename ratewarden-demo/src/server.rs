//! Serving the demo's router with defences against slow clients.
//!
//! `axum::serve` reads request headers without a deadline and accepts
//! connections without a cap, so clients that send a header a byte at a
//! time (slow-loris) can hold connections — and file descriptors, memory —
//! for as long as they like. This loop bounds all three: how long a client
//! may take to send its headers, how long a request may run, and how many
//! connections are open at once (further ones wait in the listen backlog
//! until one closes).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::Service;

/// How much a client may hold of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// How long a client may take to send a request's headers; the
    /// connection is closed after that.
    pub header_read_timeout: Duration,
    /// How long a request may take, handler included; after that the
    /// client gets a `503`.
    pub request_timeout: Duration,
    /// Connections open at once; further clients wait to be accepted.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    /// 10 s for headers, 30 s per request, 1,024 connections.
    fn default() -> Self {
        ServerLimits {
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_connections: 1_024,
        }
    }
}

async fn bounded(limit: Duration, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "request timed out\n").into_response(),
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves,
/// then lets open connections finish their requests (for up to 10 s).
/// Handlers see the peer address as `ConnectInfo<SocketAddr>`, as with
/// `into_make_service_with_connect_info`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let timeout = limits.request_timeout;
    let router = router.layer(axum::middleware::from_fn(move |req, next| {
        bounded(timeout, req, next)
    }));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // A failed accept (out of descriptors, a reset before
                // accept) concerns one client, not the server.
                Err(_) => continue,
            },
            () = &mut shutdown => break,
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().call(request.map(axum::body::Body::new))
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
    Ok(())
}
