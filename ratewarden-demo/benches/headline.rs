//! The failure this project exists to prevent, reproduced: `GET /api/search`
//! under a bot's flood, with the limit checked four ways, side by side.
//!
//! A bot loops on `/api/search` from four addresses, far above the demo's
//! 60 requests per minute, while honest users (one request in 50, each from
//! an address of its own) keep searching. A search the limiter admits then
//! runs its query, emulated as 1 ms of waiting (a search that hits a
//! database); a refused one costs only the limiter. Each contender serves
//! the same requests through the demo's router:
//!
//! * **(a) naive** — the common hand-written limiter: `GET` the client's counter,
//!   `INCR` it, `EXPIRE` it, three Redis round trips before the handler
//!   runs (a fixed window per minute). Written here, never in the library.
//! * **(b) Redis store** — the demo with `--store redis://…`: one round trip
//!   per request, the whole algorithm in one script.
//! * **(c) memory tier in front of Redis** — the demo with `--tiered`: a
//!   request the local tier refuses costs no round trip; only requests it
//!   admits reach Redis.
//! * **(d) no limiter** — the same handler, unprotected.
//!
//! Requests go through the router in process (`tower::ServiceExt::oneshot`,
//! with the bot's address as `ConnectInfo`), so the latency measured is the
//! server's: limiter, Redis round trips and handler, without a client's
//! socket in the way. Requests arrive at a fixed rate (20,000 per second) on
//! a two-thread runtime; each contender serves `HEADLINE_REQUESTS` (default
//! 40,000) after a warm-up of 2,000, and the contenders take turns for
//! `HEADLINE_ROUNDS` (default 3) rounds, each reporting its best round.
//!
//! ```sh
//! scripts/build-test-images.sh      # once: the Redis image (no registry needed)
//! cargo bench -p ratewarden-demo --features redis --bench headline
//! # or against a server of your own (keys are prefixed per run, nothing is deleted):
//! RATEWARDEN_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p ratewarden-demo --features redis --bench headline
//! ```

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use ratewarden::redis::RedisStore;
use ratewarden::{ClientIdentity, FailurePolicy, Store, SystemClock};
use ratewarden_demo::{FlagLimits, Settings, Stores};
use redis::AsyncCommands;
use tower::ServiceExt;

/// Requests per second, bot and users together: far above what a real
/// bot needs to hurt a site without a limiter, and far below what any contender can serve, so latency is not
/// queueing for the two runtime threads.
const RATE: usize = 20_000;
const QUERY: Duration = Duration::from_millis(1);
/// One request in this many comes from an honest user with an address of
/// its own, admitted; the rest from the bot's four addresses.
const USER_EVERY: usize = 50;
const WARM_UP: usize = 2_000;
const IMAGE: &str = "ratewarden-test-redis:7";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A Redis server for the run: the one named by `RATEWARDEN_REDIS_URL`, or a
/// container of the test image, removed when dropped.
struct Server {
    url: String,
    container: Option<String>,
}

impl Server {
    fn start() -> Server {
        if let Ok(url) = std::env::var("RATEWARDEN_REDIS_URL") {
            return Server {
                url,
                container: None,
            };
        }
        // Host networking on a loopback port: no published port, so no
        // userland proxy adds a hop between the limiter and Redis, and
        // nothing is reached but 127.0.0.1.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port()
            .to_string();
        let run = Command::new("docker")
            .args(["run", "-d", "--rm", "--network", "host", IMAGE])
            .args(["--bind", "127.0.0.1", "--port", &port])
            .output()
            .expect("docker is needed (or set RATEWARDEN_REDIS_URL)");
        assert!(
            run.status.success(),
            "cannot start {IMAGE}: {}\nbuild it with scripts/build-test-images.sh, \
             or set RATEWARDEN_REDIS_URL",
            String::from_utf8_lossy(&run.stderr)
        );
        let id = String::from_utf8_lossy(&run.stdout).trim().to_string();
        Server {
            url: format!("redis://127.0.0.1:{port}"),
            container: Some(id),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(id) = &self.container {
            let _ = Command::new("docker").args(["rm", "-f", id]).output();
        }
    }
}

/// The common hand-written limiter: read the counter, increment it, set its expiry,
/// each a round trip of its own.
#[derive(Clone)]
struct Naive {
    redis: redis::aio::MultiplexedConnection,
    prefix: Arc<str>,
    limit: u64,
}

async fn naive_limit(State(naive): State<Naive>, request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_default();
    let key = format!("{}{peer}", naive.prefix);
    // A connection from the multiplexed one, as an edge function reuses its
    // client: each command below is still a round trip of its own.
    let mut redis = naive.redis.clone();
    let count: Option<u64> = redis.get(&key).await.unwrap_or(None);
    if count.unwrap_or(0) >= naive.limit {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    }
    let _: Result<u64, _> = redis.incr(&key, 1).await;
    let _: Result<bool, _> = redis.expire(&key, 60).await;
    next.run(request).await
}

/// The search query an admitted request runs: waiting on a database, not
/// burning CPU, so the two runtime threads stay free for the limiter.
async fn emulated_query(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.status().is_success() {
        tokio::time::sleep(QUERY).await;
    }
    response
}

async fn search() -> impl IntoResponse {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        r#"{"results":[]}"#,
    )
}

fn demo(stores: Stores) -> Router {
    let settings = Settings {
        limits: FlagLimits::default(),
        stores,
        identity: ClientIdentity::new(b"headline-bench-secret-0123456789").expect("secret"),
        clock: Arc::new(SystemClock),
        on_failure: FailurePolicy::Open,
        admin_token: None,
        api_keys: Default::default(),
        file: None,
        shadow: Vec::new(),
    };
    ratewarden_demo::app(&settings).expect("the demo's default limits are valid")
}

async fn redis_store(url: &str, prefix: &str) -> Arc<dyn Store> {
    Arc::new(
        RedisStore::builder(url)
            .key_prefix(prefix)
            .build()
            .expect("redis store"),
    )
}

struct Outcome {
    latencies: Vec<Duration>,
    /// The honest users' requests alone: what the people the limiter
    /// protects wait.
    users: Vec<Duration>,
    refused: usize,
    elapsed: Duration,
}

/// Sends `requests` requests for `/api/search` at `RATE` per second (open
/// loop: each arrives on schedule whether or not earlier ones are done, and
/// runs as a task of its own, as a server runs each connection's request):
/// one in `USER_EVERY` from a fresh user address, the rest from four bot
/// addresses in turn. `salt` keeps users of different floods apart.
async fn flood(router: &Router, requests: usize, salt: u8) -> Outcome {
    let gap = Duration::from_secs_f64(1.0 / RATE as f64);
    let start = Instant::now();
    let mut sent = Vec::with_capacity(requests);
    for n in 0..requests {
        // The runtime's timer ticks each millisecond: the requests due in
        // one tick leave together, a burst of RATE / 1,000.
        let due = start + gap * n as u32;
        if due > Instant::now() {
            tokio::time::sleep_until(due.into()).await;
        }
        let client = if n.is_multiple_of(USER_EVERY) {
            let [_, b, c, d] = (n as u32).to_be_bytes();
            SocketAddr::from(([10 + salt, b, c, d], 40_000))
        } else {
            SocketAddr::from(([203, 0, 113, 1 + (n % 4) as u8], 40_000))
        };
        let router = router.clone();
        sent.push(tokio::spawn(async move {
            let mut request = Request::get("/api/search?q=rust")
                .body(axum::body::Body::empty())
                .expect("request");
            request.extensions_mut().insert(ConnectInfo(client));
            let sent = Instant::now();
            let response = router.oneshot(request).await.expect("infallible");
            (
                sent.elapsed(),
                response.status() == StatusCode::TOO_MANY_REQUESTS,
            )
        }));
    }
    let mut outcome = Outcome {
        latencies: Vec::with_capacity(requests),
        users: Vec::new(),
        refused: 0,
        elapsed: Duration::ZERO,
    };
    for (n, request) in sent.into_iter().enumerate() {
        let (latency, refused) = request.await.expect("request task");
        outcome.latencies.push(latency);
        if n.is_multiple_of(USER_EVERY) {
            outcome.users.push(latency);
        }
        outcome.refused += usize::from(refused);
    }
    outcome.elapsed = start.elapsed();
    outcome.latencies.sort_unstable();
    outcome.users.sort_unstable();
    outcome
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[derive(Clone, Copy)]
struct Best {
    p50: Duration,
    p99: Duration,
    p999: Duration,
    users_p50: Duration,
    users_p99: Duration,
    per_sec: f64,
    refused_share: f64,
}

fn main() {
    let requests = env_usize("HEADLINE_REQUESTS", 40_000);
    let rounds = env_usize("HEADLINE_ROUNDS", 3);
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let run = std::process::id();
    let names = [
        "(a) naive: GET + INCR + EXPIRE, 3 round trips",
        "(b) Redis store, 1 round trip",
        "(c) memory tier in front of Redis (--tiered)",
        "(d) no limiter",
    ];
    let mut best: [Option<Best>; 4] = [None; 4];
    runtime.block_on(async {
        let client = redis::Client::open(server.url.as_str()).expect("redis url");
        // The container needs a moment to accept connections.
        let mut connection = None;
        for _ in 0..100 {
            match client.get_multiplexed_async_connection().await {
                Ok(c) => {
                    connection = Some(c);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let connection = connection.expect("redis answers");
        for round in 0..rounds {
            for (i, slot) in best.iter_mut().enumerate() {
                // A fresh key space per contender and round: every one starts
                // with the bot's counters empty.
                let prefix = format!("headline:{run}:{round}:{i}:");
                let router = match i {
                    0 => Router::new().route("/api/search", get(search)).layer(
                        middleware::from_fn_with_state(
                            Naive {
                                redis: connection.clone(),
                                prefix: prefix.into(),
                                limit: 60,
                            },
                            naive_limit,
                        ),
                    ),
                    1 => demo(Stores {
                        primary: redis_store(&server.url, &prefix).await,
                        local_tier: None,
                        leased: None,
                    }),
                    2 => demo(Stores {
                        primary: redis_store(&server.url, &prefix).await,
                        local_tier: Some(Arc::new(ratewarden::memory::MemoryStore::new(100_000))),
                        leased: None,
                    }),
                    _ => Router::new().route("/api/search", get(search)),
                };
                let router = router.layer(middleware::from_fn(emulated_query));
                flood(&router, WARM_UP, 0).await;
                let o = flood(&router, requests, 1).await;
                let this = Best {
                    p50: percentile(&o.latencies, 0.50),
                    p99: percentile(&o.latencies, 0.99),
                    p999: percentile(&o.latencies, 0.999),
                    users_p50: percentile(&o.users, 0.50),
                    users_p99: percentile(&o.users, 0.99),
                    per_sec: requests as f64 / o.elapsed.as_secs_f64(),
                    refused_share: o.refused as f64 / requests as f64,
                };
                *slot = Some(match *slot {
                    Some(b) if b.p99 <= this.p99 => b,
                    _ => this,
                });
            }
        }
    });
    let best = best.map(|b| b.expect("every contender ran"));
    let none = best[3];
    println!(
        "\n{requests} requests per round at {RATE}/s, best round (by p99) of {rounds}: \
         4 bot addresses, 1 request in {USER_EVERY} from a new user; limit 60/min; \
         an admitted search waits {QUERY:?}; Redis at {}\n",
        ratewarden::store::redact(&server.url)
    );
    println!(
        "| contender | p50 | p99 | p99.9 | users' p50 | users' p99 | req/s | refused | \
         p99 ÷ (d) | users' p99 ÷ (d) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (name, b) in names.iter().zip(best) {
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} | {:.1} % \
             | {:.2} | {:.2} |",
            us(b.p50),
            us(b.p99),
            us(b.p999),
            us(b.users_p50),
            us(b.users_p99),
            b.per_sec,
            b.refused_share * 100.0,
            b.p99.as_secs_f64() / none.p99.as_secs_f64(),
            b.users_p99.as_secs_f64() / none.users_p99.as_secs_f64(),
        );
    }
}
