//! The HTTP layer side by side with `tower_governor`: requests per second
//! and CPU per request of an axum router with no limiter, with this
//! crate's layer (memory store; sliding log and GCRA) and with
//! `tower_governor`, under two traffic shapes:
//!
//! * **clients**: every request from a random one of 100,000 addresses,
//!   given in `X-Forwarded-For` behind one trusted proxy; nearly every
//!   request is admitted;
//! * **abuser**: one address, past its limit, every request refused.
//!
//! This crate's layer writes the two draft-11 headers by default
//! (`RateLimit-Policy` and `RateLimit`, `HeaderMode::Draft11`), as many as
//! tower_governor writes; the `both` row writes five (`HeaderMode::Both`),
//! the `X-RL` row the three `X-RateLimit-*` only, the `no hdrs` row none
//! (`HeaderMode::None`), which leaves what every request pays: the client
//! key, the decision and its request extension. (With axum's
//! `content-length`, seven headers outgrow a response's first `HeaderMap`
//! table, which costs one more allocation per response.) The `same resp.`
//! row has no limiter but sends what the default mode sends (the two
//! headers, and for the abuser the 429 with its JSON body), with fixed
//! values: the ceiling of any limiter
//! that answers as the design asks, so that the limiter's own cost is the
//! difference to that row, and the rest is the response's. The
//! `tower_governor, HMAC` row is tower_governor keyed by this crate's
//! client key instead of the bare address: the same identity work as the
//! layer (the design's HMAC), so that the layer's rows differ from it by
//! the decision and the headers alone. The `HMAC key` row has no limiter
//! but computes each request's client key as the layer does: the part of
//! the layer's cost that comes with the design's keyed digest, before any
//! decision.
//!
//! Run with `cargo bench -p ratewarden --bench http` (`-- --requests N` sets
//! the requests per row, 200,000 by default; `-- --requests 200` is a
//! smoke run; `-- --only GCRA` runs the contenders whose name holds GCRA
//! beside the baseline, `-- --only "=limiter, GCRA"` that one alone,
//! `-- --traffic clients` or `-- --traffic abusive` one traffic shape,
//! `-- --workers 1` one runtime worker thread, `-- --rounds N` N rounds
//! instead of 3, `-- --clients N` N distinct clients instead of 100,000,
//! `-- --wrk SECONDS` over sockets under wrk, SECONDS per row: see
//! `wrk_rows`). After the in-process table, a full
//! run times the client key alone (the address's HMAC, by design), which
//! tower_governor does not compute. Numbers from a busy
//! machine say little: the load average is printed beside them.
//!
//! The load generator runs in the same process and on the same Tokio
//! runtime as the router: each of 64 tasks builds a request, calls the
//! router as a tower `Service` (no sockets, so the figures are the
//! middleware's and the router's, not the kernel's) and reads the
//! response's body. CPU per request is the on-CPU time of all the
//! process's threads (`/proc/self/task/*/schedstat`, which waiting for a CPU
//! does not inflate) over the requests; it includes the generator, which is
//! the same in every row, so the difference to the `none` row is what the
//! limiter adds. Each row is the round with the least CPU per request, of
//! three rounds in which every contender runs once, in turn: on a machine
//! whose speed drifts, a contender measured only after another would be
//! compared with a different machine.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use ratewarden::layer::HeaderMode;
use ratewarden::memory::MemoryStore;
use ratewarden::{AddressSource, ClientIdentity, Limiter, Policy, RateLimitLayer, Rule};
use tower::{Service, ServiceExt};
use tower_governor::GovernorError;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, SmartIpKeyExtractor};

const TASKS: usize = 64;
const ROUNDS: usize = 3;

/// Distinct client addresses of the `clients` traffic unless `--clients N`
/// says otherwise.
const CLIENTS: u32 = 100_000;

/// The distinct client addresses of the `clients` traffic: `--clients N`,
/// else [`CLIENTS`]. Fewer clients than a cache level holds show what the
/// limiter costs when its per-client state stays in cache.
fn clients() -> u32 {
    static N: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let args: Vec<String> = std::env::args().collect();
        args.iter()
            .position(|a| a == "--clients")
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(CLIENTS)
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Traffic {
    Clients,
    Abuser,
}

#[derive(Clone, Copy)]
enum Contender {
    None,
    SlidingLog,
    Gcra,
    /// GCRA with the `X-RateLimit-*` headers only: three headers, against
    /// tower_governor's two.
    GcraLegacyHeaders,
    /// GCRA with the draft-11 headers and the `X-RateLimit-*` trio: five.
    GcraBothHeaders,
    /// GCRA with no rate-limit headers: what the layer costs without them
    /// (the key, the decision and its request extension).
    GcraNoHeaders,
    Governor,
    /// tower_governor keyed by this crate's client key (the address read
    /// from `X-Forwarded-For`, then its HMAC) instead of the address: the
    /// same identity work as the layer, so that the difference to the
    /// layer's rows is the decision and the headers alone.
    GovernorHmac,
    /// No limiter, but every response is the one the layer's default mode
    /// sends (its two headers with fixed values; for the abuser, the 429
    /// with its JSON body and four headers): what the response the design
    /// asks for costs to build and send, with no key, no decision, no store.
    SameResponse,
    /// No limiter, but each request's client key computed as the layer
    /// computes it (the address from `X-Forwarded-For`, then its HMAC) and
    /// dropped: what a limiter keyed by the design's HMAC pays before any
    /// decision, and the ceiling of every such limiter.
    KeyOnly,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::None => "no limiter",
            Contender::SlidingLog => "limiter, sliding log",
            Contender::Gcra => "limiter, GCRA",
            Contender::GcraLegacyHeaders => "limiter, GCRA, X-RL",
            Contender::GcraBothHeaders => "limiter, GCRA, both",
            Contender::GcraNoHeaders => "limiter, GCRA, no hdrs",
            Contender::Governor => "tower_governor",
            Contender::GovernorHmac => "tower_governor, HMAC",
            Contender::SameResponse => "no limiter, same resp.",
            Contender::KeyOnly => "no limiter, HMAC key",
        }
    }
}

fn handler() -> Router {
    Router::new().route("/api/search", get(|| async { "results" }))
}

/// The router of one row. The clients' limit is one no client reaches; the
/// abuser's is 10 an hour, spent in the warm-up.
fn router(contender: Contender, traffic: Traffic) -> Router {
    let (limit, window) = match traffic {
        Traffic::Clients => (1_000, Duration::from_secs(1)),
        Traffic::Abuser => (10, Duration::from_secs(3600)),
    };
    let identity = ClientIdentity::new([42u8; 32])
        .unwrap()
        .with_source(AddressSource::x_forwarded_for(1).unwrap());
    let ours = |policy: Policy, headers: HeaderMode| {
        let store = Arc::new(MemoryStore::new(2 * clients() as usize));
        let limiter = Limiter::builder()
            .rule(Rule::new("search", store, policy).unwrap())
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder(limiter, identity.clone())
            .headers(headers)
            .build()
            .unwrap();
        handler().layer(layer)
    };
    let gcra = Policy::gcra(limit, window).unwrap();
    match contender {
        Contender::None => handler(),
        Contender::SlidingLog => ours(
            Policy::sliding_log(limit, window).unwrap(),
            HeaderMode::default(),
        ),
        Contender::Gcra => ours(gcra, HeaderMode::default()),
        Contender::GcraLegacyHeaders => ours(gcra, HeaderMode::XRateLimit),
        Contender::GcraBothHeaders => ours(gcra, HeaderMode::Both),
        Contender::GcraNoHeaders => ours(gcra, HeaderMode::None),
        Contender::Governor => governed(SmartIpKeyExtractor, limit, window),
        Contender::GovernorHmac => governed(HmacKey(identity), limit, window),
        Contender::SameResponse => same_response(traffic),
        Contender::KeyOnly => handler().layer(tower::util::MapRequestLayer::new(
            move |request: http::Request<Body>| {
                std::hint::black_box(identity.key_for_request(&request));
                request
            },
        )),
    }
}

/// The handler behind tower_governor with the same quota as the layer's
/// rows and its rate-limit headers on, keyed by `key`.
fn governed<K>(key: K, limit: u32, window: Duration) -> Router
where
    K: KeyExtractor + Send + Sync + 'static,
    K::Key: Send + Sync + 'static,
{
    let config = GovernorConfigBuilder::default()
        .period(window / limit)
        .burst_size(limit)
        .key_extractor(key)
        .use_headers()
        .finish()
        .unwrap();
    handler().layer(GovernorLayer::new(config))
}

/// tower_governor's key for [`Contender::GovernorHmac`]: the layer's client
/// key, computed as the layer computes it.
#[derive(Clone)]
struct HmacKey(ClientIdentity);

impl KeyExtractor for HmacKey {
    type Key = [u8; 32];

    fn extract<T>(&self, request: &Request<T>) -> Result<[u8; 32], GovernorError> {
        let key = self.0.key_for_request(request);
        key.as_bytes()
            .try_into()
            .map_err(|_| GovernorError::UnableToExtractKey)
    }
}

/// The router of [`Contender::SameResponse`]: header values as the layer
/// writes them for this traffic's policy (the values are fixed, so they
/// cost no formatting; the layer formats two of them).
fn same_response(traffic: Traffic) -> Router {
    use axum::response::Response;
    use http::HeaderValue;
    use ratewarden::layer::{RATELIMIT, RATELIMIT_POLICY};
    fn write(response: &mut Response, values: [&'static str; 2]) {
        let headers = response.headers_mut();
        let [policy, ratelimit] = values.map(HeaderValue::from_static);
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, ratelimit);
    }
    match traffic {
        Traffic::Clients => handler().layer(tower::util::MapResponseLayer::new(
            |mut response: Response| {
                let values = ["\"search\";q=1000;w=1", "\"search\";r=999;t=1"];
                write(&mut response, values);
                response
            },
        )),
        Traffic::Abuser => Router::new().route(
            "/api/search",
            get(|| async {
                const BODY: &str = "{\"error\":\"rate_limited\",\"retry_after\":360,\"limit\":10,\
                    \"remaining\":0,\"reset\":3600,\"policy\":\"search\",\"window\":3600,\
                    \"message\":\"Too many requests. Retry in 360 s.\"}";
                let mut response = Response::new(Body::from(BODY));
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                let headers = response.headers_mut();
                headers.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                let values = ["\"search\";q=10;w=3600", "\"search\";r=0;t=3600"];
                write(&mut response, values);
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from_static("360"));
                response
            }),
        ),
    }
}

/// The address of request `n` of task `task`: a fixed one for the abuser,
/// a pseudo-random one of `clients()` otherwise (a multiplicative hash of the
/// counter, written here rather than taken from `rand` since any spread
/// does).
fn address(traffic: Traffic, task: usize, n: usize) -> Ipv4Addr {
    match traffic {
        Traffic::Abuser => Ipv4Addr::new(203, 0, 113, 7),
        Traffic::Clients => {
            let x = (task as u64) << 32 | n as u64;
            let i = (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as u32 % clients();
            Ipv4Addr::from(0x0A00_0000 | i)
        }
    }
}

async fn one(router: &mut Router, traffic: Traffic, task: usize, n: usize) -> StatusCode {
    let client = address(traffic, task, n);
    let mut request = Request::get("/api/search?q=rust")
        .header("x-forwarded-for", client.to_string())
        .body(Body::empty())
        .unwrap();
    // The proxy, as `into_make_service_with_connect_info` gives it.
    let proxy = SocketAddr::new(IpAddr::from([127, 0, 0, 1]), 40_000);
    request.extensions_mut().insert(ConnectInfo(proxy));
    let ready = ServiceExt::<Request<Body>>::ready(router)
        .await
        .unwrap_or_else(|e: Infallible| match e {});
    let response = ready.call(request).await.unwrap_or_else(|e| match e {});
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// On-CPU nanoseconds of every thread of the process so far.
fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

#[derive(Clone, Copy)]
struct Row {
    per_sec: f64,
    cpu_ns: f64,
    refused: usize,
}

async fn round(router: &Router, traffic: Traffic, requests: usize) -> Row {
    let per_task = requests.div_ceil(TASKS);
    let cpu = process_cpu_ns();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(TASKS);
    for task in 0..TASKS {
        let mut router = router.clone();
        tasks.push(tokio::spawn(async move {
            let mut refused = 0;
            for n in 0..per_task {
                let status = one(&mut router, traffic, task, n).await;
                refused += usize::from(status == StatusCode::TOO_MANY_REQUESTS);
            }
            refused
        }));
    }
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }
    let wall = start.elapsed();
    let cpu = process_cpu_ns().saturating_sub(cpu);
    let total = per_task * TASKS;
    Row {
        per_sec: total as f64 / wall.as_secs_f64(),
        cpu_ns: cpu as f64 / total as f64,
        refused,
    }
}

/// The rows of `contenders` on `traffic`: every router is built and warmed
/// up first (the abuser spends its quota, the stores allocate), then each
/// round runs every contender once, in turn, so that a machine whose speed
/// drifts during the run slows every contender alike. Each row is the round
/// with the least CPU per request.
async fn rows(
    contenders: &[Contender],
    traffic: Traffic,
    requests: usize,
    rounds: usize,
) -> Vec<Row> {
    let routers: Vec<Router> = contenders.iter().map(|&c| router(c, traffic)).collect();
    for router in &routers {
        let mut warm = router.clone();
        for n in 0..1_000.min(requests) {
            one(&mut warm, traffic, TASKS, n).await;
        }
    }
    let mut best: Vec<Option<Row>> = vec![None; routers.len()];
    for _ in 0..rounds.max(1) {
        for (router, best) in routers.iter().zip(&mut best) {
            keep_least_cpu(best, round(router, traffic, requests).await);
        }
    }
    best.into_iter()
        .map(|r| r.expect("at least one round"))
        .collect()
}

/// Keeps `r` as a contender's row if it took less CPU per request than the
/// row kept so far: each row is its contender's least disturbed round.
fn keep_least_cpu(best: &mut Option<Row>, r: Row) {
    if best.as_ref().is_none_or(|b| r.cpu_ns < b.cpu_ns) {
        *best = Some(r);
    }
}

/// The rows of `contenders` over sockets, as a deployment meets them: each
/// router served by `axum::serve` on a loopback port of this process's
/// runtime, with the peer's address as `ConnectInfo`, and loaded in turn by
/// `wrk -t2 -c64` (a separate process; on a two-core machine it shares the
/// cores with the server, as the issue's own measurement did). Distinct
/// clients come from a Lua script that gives each request a random one of
/// `clients()` addresses in `X-Forwarded-For`. CPU per request is this
/// process's on-CPU time over the requests wrk completed, so wrk's own CPU
/// is not in it; `÷ none` compares requests per second, the goal's
/// "limited ÷ unlimited". Each row is the round with the least CPU per
/// request; every router first serves one second of warm-up.
async fn wrk_rows(
    contenders: &[Contender],
    traffic: Traffic,
    seconds: u64,
    rounds: usize,
) -> Vec<Row> {
    let script =
        std::env::temp_dir().join(format!("ratewarden-http-bench-{}.lua", std::process::id()));
    std::fs::write(&script, wrk_script(traffic)).expect("the wrk script is written");
    let mut ports = Vec::new();
    for &contender in contenders {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        ports.push(listener.local_addr().expect("a bound address").port());
        let app = router(contender, traffic).into_make_service_with_connect_info::<SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    for &port in &ports {
        wrk(port, &script, 1).await;
    }
    let mut best: Vec<Option<Row>> = vec![None; ports.len()];
    for _ in 0..rounds.max(1) {
        for (&port, best) in ports.iter().zip(&mut best) {
            let cpu = process_cpu_ns();
            let run = wrk(port, &script, seconds).await;
            let cpu = process_cpu_ns().saturating_sub(cpu);
            let r = Row {
                per_sec: run.per_sec,
                cpu_ns: cpu as f64 / run.requests.max(1) as f64,
                refused: run.non_2xx,
            };
            keep_least_cpu(best, r);
        }
    }
    let _ = std::fs::remove_file(&script);
    best.into_iter()
        .map(|r| r.expect("at least one round"))
        .collect()
}

/// The Lua script of `traffic` for wrk: a random client address per request
/// (the same spread as the in-process generator's, from wrk's own random
/// numbers), or the abuser's one address.
fn wrk_script(traffic: Traffic) -> String {
    let address = match traffic {
        Traffic::Abuser => "\"203.0.113.7\"".to_owned(),
        Traffic::Clients => format!(
            "(function() local i = math.random(0, {}) \
             return \"10.\" .. math.floor(i / 65536) .. \".\" .. \
             (math.floor(i / 256) % 256) .. \".\" .. (i % 256) end)()",
            clients() - 1
        ),
    };
    format!(
        "request = function()\n  return wrk.format(\"GET\", \"/api/search?q=rust\", \
         {{[\"X-Forwarded-For\"] = {address}}})\nend\n"
    )
}

/// What one wrk run reported.
struct WrkRun {
    requests: u64,
    per_sec: f64,
    non_2xx: usize,
}

/// Runs `wrk -t2 -c64` against `port` for `seconds` with `script`, off the
/// runtime's workers (they serve the requests).
async fn wrk(port: u16, script: &std::path::Path, seconds: u64) -> WrkRun {
    let script = script.to_owned();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new("wrk")
            .args(["-t2", "-c64", &format!("-d{seconds}s"), "-s"])
            .arg(&script)
            .arg(format!("http://127.0.0.1:{port}/api/search?q=rust"))
            .output()
            .unwrap_or_else(|e| {
                panic!("running wrk failed ({e}); install it with `apt-get install wrk`")
            });
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "wrk failed: {text}");
        // "  123456 requests in 5.00s, ...", "Requests/sec:  24691.20",
        // "  Non-2xx or 3xx responses: 123" (only when there are some).
        let field = |line_has: &str, at: usize| -> Option<String> {
            let line = text.lines().find(|l| l.contains(line_has))?;
            line.split_whitespace().nth(at).map(str::to_owned)
        };
        WrkRun {
            requests: field(" requests in ", 0)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no request count in wrk's output: {text}")),
            per_sec: field("Requests/sec:", 1)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no rate in wrk's output: {text}")),
            non_2xx: field("Non-2xx", 4)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
        }
    })
    .await
    .expect("the wrk task completes")
}

fn requests_arg() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--requests")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(200_000)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let requests = requests_arg();
    // `--only NAME` runs the rows whose contender's name contains NAME
    // (besides the `none` baseline), for a profiler; `--only =NAME`, the
    // row whose name is NAME.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    // `--traffic clients` or `--traffic abusive`: one traffic shape only.
    let traffic_only = args
        .iter()
        .position(|a| a == "--traffic")
        .and_then(|i| args.get(i + 1).cloned());
    // `--workers N`: the runtime's worker threads (default: one per core).
    // One worker takes the scheduler's cross-thread handoffs, and most of
    // the run-to-run spread, out of the figures.
    let workers = args
        .iter()
        .position(|a| a == "--workers")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // `--rounds N`: rounds per row, the contenders taking turns (default 3).
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(ROUNDS);
    // `--wrk SECONDS`: over sockets, driven by wrk (see `wrk_rows`).
    let wrk_seconds: Option<u64> = args
        .iter()
        .position(|a| a == "--wrk")
        .and_then(|i| args.get(i + 1)?.parse().ok());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    match wrk_seconds {
        Some(seconds) => println!(
            "wrk -t2 -c64, {seconds} s per row, best of {rounds} rounds in which the contenders \
             take turns, {workers} worker threads, load average {}",
            loadavg()
        ),
        None => println!(
            "{requests} requests per row, best of {rounds} rounds in which the contenders take \
             turns, {TASKS} tasks, {workers} worker threads, load average {}",
            loadavg()
        ),
    }
    runtime.block_on(async {
        for (traffic, title) in [
            (Traffic::Clients, "distinct clients (admitted)"),
            (Traffic::Abuser, "one abusive client (refused)"),
        ] {
            if traffic_only
                .as_ref()
                .is_some_and(|t| !title.contains(t.as_str()))
            {
                continue;
            }
            println!("\n{title}");
            println!(
                "{:<22} {:>12} {:>10} {:>14} {:>14} {:>9}",
                "", "req/s", "÷ none", "CPU ns/req", "added ns/req", "refused"
            );
            let contenders: Vec<Contender> = [
                Contender::None,
                Contender::SlidingLog,
                Contender::Gcra,
                Contender::GcraLegacyHeaders,
                Contender::GcraBothHeaders,
                Contender::GcraNoHeaders,
                Contender::Governor,
                Contender::GovernorHmac,
                Contender::SameResponse,
                Contender::KeyOnly,
            ]
            .into_iter()
            .filter(|c| {
                matches!(c, Contender::None)
                    || only.as_ref().is_none_or(|o| match o.strip_prefix('=') {
                        Some(exact) => c.name() == exact,
                        None => c.name().contains(o.as_str()),
                    })
            })
            .collect();
            let measured = match wrk_seconds {
                Some(seconds) => wrk_rows(&contenders, traffic, seconds, rounds).await,
                None => rows(&contenders, traffic, requests, rounds).await,
            };
            let none = measured[0];
            for (contender, r) in contenders.iter().zip(measured) {
                println!(
                    "{:<22} {:>12.0} {:>10.2} {:>14.0} {:>14.0} {:>9}",
                    contender.name(),
                    r.per_sec,
                    r.per_sec / none.per_sec,
                    r.cpu_ns,
                    r.cpu_ns - none.cpu_ns,
                    r.refused,
                );
            }
        }
    });
    if only.is_none() && traffic_only.is_none() && wrk_seconds.is_none() {
        identity_cost(requests);
    }
    println!("\nload average after: {}", loadavg());
}

/// What the layer's client key costs alone, by design: the address read
/// from `X-Forwarded-For` and its HMAC-SHA-256 (no store ever holds an
/// address; tower_governor keys by the address itself). Timed on this
/// thread for the distinct clients' addresses, headers built beforehand,
/// in wall time: on a quiet machine, one thread's wall time is its CPU
/// time, and a loop of milliseconds is below the scheduler's accounting.
fn identity_cost(requests: usize) {
    let identity = ClientIdentity::new([42u8; 32])
        .unwrap()
        .with_source(AddressSource::x_forwarded_for(1).unwrap());
    let proxy = Some(IpAddr::from([127, 0, 0, 1]));
    let headers: Vec<http::HeaderMap> = (0..requests.min(100_000))
        .map(|n| {
            let mut h = http::HeaderMap::new();
            let client = address(Traffic::Clients, 0, n).to_string();
            h.insert("x-forwarded-for", client.parse().unwrap());
            h
        })
        .collect();
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for h in &headers {
            std::hint::black_box(identity.key(std::hint::black_box(h), proxy));
        }
        best = best.min(start.elapsed().as_nanos() as f64 / headers.len() as f64);
    }
    println!(
        "\nof which the client key alone (address from X-Forwarded-For, then its HMAC-SHA-256): {best:.0} ns per request, one thread"
    );
}
