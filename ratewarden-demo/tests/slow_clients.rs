//! Slow clients against the demo's server loop: connections that never
//! finish their headers cannot starve a normal client, and a request that
//! runs too long is answered, not left hanging.

use std::future::pending;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratewarden_demo::server::{ServerLimits, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Long enough for any loaded machine; the outcome, not the time, is what
/// is checked.
const GUARD: Duration = Duration::from_secs(30);

/// What `future` gives, panicking with `why` if that takes longer than
/// [`GUARD`].
async fn within_guard<T>(future: impl Future<Output = T>, why: &str) -> T {
    tokio::time::timeout(GUARD, future).await.expect(why)
}

async fn get_raw(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn start(limits: ServerLimits) -> std::net::SocketAddr {
    let router = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "late"
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, router, limits, pending()));
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_holding_every_connection_cannot_starve_a_normal_one() {
    // The normal client's headers are read under the same deadline: it is
    // long enough for a loaded machine.
    let addr = start(ServerLimits {
        header_read_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(3600),
        max_connections: 8,
    })
    .await;
    // Every connection slot taken by a client that sends half a header and
    // then nothing.
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: demo\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let reply = within_guard(
        get_raw(addr, "/health"),
        "a normal client must be served once slow ones hit their header deadline",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The slow clients were cut off: each connection ends.
    for mut s in slow {
        let mut rest = Vec::new();
        within_guard(
            s.read_to_end(&mut rest),
            "a client that never finishes its headers is disconnected",
        )
        .await
        .ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_deadline_is_answered_503() {
    // The healthy request after it runs under the same deadline: it is long
    // enough for a loaded machine.
    let addr = start(ServerLimits {
        header_read_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(5),
        max_connections: 8,
    })
    .await;
    let reply = within_guard(
        get_raw(addr, "/slow"),
        "a request past its deadline must be answered",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(get_raw(addr, "/health").await.starts_with("HTTP/1.1 200"));
}
