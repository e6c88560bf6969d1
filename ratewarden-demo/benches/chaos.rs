//! Chaos soak: the demo server, a memory tier in front of Redis and then of
//! Postgres, under steady load while its store is paused, restarted and
//! slowed in turn.
//!
//! ```sh
//! scripts/build-test-images.sh          # once
//! cargo bench -p ratewarden-demo --features redis,postgres --bench chaos -- --phase-seconds 30
//! # --clients N (default 40), --rate R requests/s per client (default 3),
//! # --only redis | postgres
//! # --untiered: the demo on the shared store alone, failing open, where the
//! #   limit check must fail (its own proof of teeth)
//! ```
//!
//! The demo binary runs as a child process (`--tiered --store <URL>`,
//! failing open, the rule's default 250 ms timeout and breaker), its store
//! reached through a TCP proxy of this process that can delay every chunk.
//! `N` clients, each its own address in `X-Forwarded-For`, call
//! `GET /api/search` at a steady rate, above its limit (a sliding log of 20
//! per 10 s). Seven phases of equal length: steady; the store's container
//! paused (`docker pause`: connections open, nothing answers); recovery;
//! the store stopped and started again halfway through the phase (Redis,
//! which keeps nothing on disk here, comes back empty); recovery; every
//! chunk to and from the store delayed by one second; recovery.
//!
//! It checks, and exits non-zero when one fails:
//!
//! * no answer other than 200 or 429, and no transport error;
//! * no answer slower than two seconds (a hang; the figures show how far
//!   above the timeout the slowest answers were);
//! * no client admitted more than its limit in any window (a sliding log
//!   is exact, and the memory tier in front enforces it whatever the shared
//!   store does: the stated bound of a single instance failing open);
//! * recovery: in the second half of each recovery phase the shared store
//!   answers again, and no store error is counted (the demo's `/metrics`);
//! * memory: the demo's resident set never exceeds twice what it was after
//!   the first phase.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ratewarden_test_support::WireCounter;
use ratewarden_test_support::postgres as pg;
use ratewarden_test_support::redis as rd;
use testcontainers::{ContainerAsync, GenericImage};

type Container = ContainerAsync<GenericImage>;

/// The search route's policy, and its limit and window for the check.
const POLICY: &str = "sliding_log 20/10s";
const LIMIT: usize = 20;
const WINDOW: Duration = Duration::from_secs(10);
/// Longer than the rule's timeout (250 ms), so every call through the
/// proxy times out.
const DELAY: Duration = Duration::from_secs(1);
/// An answer slower than this is a hang.
const HANG: Duration = Duration::from_secs(2);
const SECRET: &str = "chaos-soak-secret-chaos-soak-secret!";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Redis,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Postgres => "postgres",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Steady,
    Paused,
    AfterPause,
    Restarted,
    AfterRestart,
    Delayed,
    AfterDelay,
}

const PHASES: [Phase; 7] = [
    Phase::Steady,
    Phase::Paused,
    Phase::AfterPause,
    Phase::Restarted,
    Phase::AfterRestart,
    Phase::Delayed,
    Phase::AfterDelay,
];

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Steady => "steady",
            Phase::Paused => "store paused",
            Phase::AfterPause => "recovery",
            Phase::Restarted => "store restarted",
            Phase::AfterRestart => "recovery",
            Phase::Delayed => "store delayed 1 s",
            Phase::AfterDelay => "recovery",
        }
    }

    fn is_recovery(self) -> bool {
        matches!(
            self,
            Phase::AfterPause | Phase::AfterRestart | Phase::AfterDelay
        )
    }
}

struct Args {
    phase: Duration,
    clients: usize,
    rate: f64,
    only: Option<String>,
    untiered: bool,
}

fn args() -> Args {
    let mut args = Args {
        phase: Duration::from_secs(30),
        clients: 40,
        rate: 3.0,
        only: None,
        untiered: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--phase-seconds" => args.phase = Duration::from_secs(value().parse().unwrap()),
            "--clients" => args.clients = value().parse().unwrap(),
            "--rate" => args.rate = value().parse().unwrap(),
            "--only" => args.only = Some(value()),
            "--untiered" => args.untiered = true,
            // cargo bench passes --bench.
            _ => {}
        }
    }
    // The breaker's cool-down is 5 s: a recovery phase's second half must
    // start after it.
    assert!(
        args.phase >= Duration::from_secs(12),
        "--phase-seconds must be at least 12"
    );
    args
}

/// One answer, as a client saw it.
struct Answer {
    client: usize,
    sent: Instant,
    took: Duration,
    /// The status, or `None` for a transport error.
    status: Option<u16>,
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut failed = Vec::new();
    for backend in [Backend::Redis, Backend::Postgres] {
        if args.only.as_deref().is_some_and(|o| o != backend.name()) {
            continue;
        }
        failed.extend(runtime.block_on(soak(backend, &args)));
    }
    if failed.is_empty() {
        println!("chaos: every check held");
    } else {
        for f in &failed {
            eprintln!("chaos: FAILED: {f}");
        }
        std::process::exit(1);
    }
}

/// Starts the backend on a fixed port (its address survives a restart).
async fn start(backend: Backend) -> (Container, String) {
    match backend {
        Backend::Redis => rd::start_redis_on_fixed_port().await,
        Backend::Postgres => pg::start_on_fixed_port().await,
    }
}

async fn stop(backend: Backend, container: &Container) {
    match backend {
        Backend::Redis => container.stop().await.expect("docker stop"),
        Backend::Postgres => pg::stop(container).await,
    }
}

async fn wait_up(backend: Backend, url: &str) {
    match backend {
        Backend::Redis => rd::wait_until_up(url).await,
        Backend::Postgres => pg::wait_ready(url).await,
    }
}

/// The demo, started on a free port; its address once it listens.
fn spawn_demo(store_url: &str, limits: &std::path::Path, tiered: bool) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratewarden-demo"))
        .args(["--listen", "127.0.0.1:0", "--store", store_url])
        .args(tiered.then_some("--tiered"))
        .args(["--secret", SECRET, "--client-address", "x-forwarded-for:1"])
        .arg("--config")
        .arg(limits)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the demo binary runs");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = lines
        .next()
        .and_then(Result::ok)
        .expect("the demo prints where it listens");
    let addr = first
        .rsplit("http://")
        .next()
        .expect("a listening line")
        .to_string();
    // Keep draining its output so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

fn rss_kib(pid: u32) -> u64 {
    ratewarden_test_support::memory::status_kib(&pid.to_string(), "VmRSS:")
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn get(client: &HttpClient, url: &str, xff: Option<&str>) -> Result<(u16, String), String> {
    let mut request = http::Request::get(url);
    if let Some(xff) = xff {
        request = request.header("x-forwarded-for", xff);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Sums the demo's `/metrics` shows.
#[derive(Clone, Copy, Default)]
struct Scrape {
    /// Store errors of every rule.
    errors: f64,
    /// Calls that reached the shared store.
    calls: f64,
}

/// A recovery phase's scrapes, at its middle and at its end.
struct Recovery {
    phase: Phase,
    middle: Scrape,
    end: Scrape,
}

async fn scrape(client: &HttpClient, base: &str, backend: Backend) -> Scrape {
    let Ok((200, text)) = get(client, &format!("{base}/metrics"), None).await else {
        return Scrape {
            errors: f64::NAN,
            calls: f64::NAN,
        };
    };
    let sum = |keep: &dyn Fn(&str) -> bool| -> f64 {
        text.lines()
            .filter(|l| !l.starts_with('#') && keep(l))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let store = format!("store=\"{}\"", backend.name());
    Scrape {
        errors: sum(&|l| l.starts_with("ratewarden_store_errors_total")),
        calls: sum(&|l| l.starts_with("ratewarden_store_call_seconds_count") && l.contains(&store)),
    }
}

async fn soak(backend: Backend, args: &Args) -> Vec<String> {
    let (container, url) = start(backend).await;
    let proxy = WireCounter::start(rd::tcp_addr(&url))
        .await
        .expect("a proxy on loopback");
    let store_url = rd::via(&url, proxy.addr());
    let limits = std::env::temp_dir().join(format!("ratewarden-chaos-{}.toml", std::process::id()));
    std::fs::write(&limits, format!("[limits.search]\npolicy = \"{POLICY}\"\n")).unwrap();
    let (mut demo, addr) = spawn_demo(&store_url, &limits, !args.untiered);
    let base = format!("http://{addr}");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    for _ in 0..100 {
        if get(&client, &format!("{base}/health"), None).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let started = Instant::now();
    let total = args.phase * PHASES.len() as u32;
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let mut load = Vec::new();
    for c in 0..args.clients {
        let (client, answers) = (client.clone(), answers.clone());
        let url = format!("{base}/api/search?q=x");
        let offset = interval.mul_f64(c as f64 / args.clients as f64);
        let xff = format!("10.{}.{}.{}", c / 65_536, (c / 256) % 256, c % 256);
        load.push(tokio::spawn(async move {
            // Clients start spread over one interval, then keep their pace.
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while started.elapsed() < total {
                tick.tick().await;
                let sent = Instant::now();
                let status = get(&client, &url, Some(&xff)).await.ok().map(|(s, _)| s);
                answers.lock().unwrap().push(Answer {
                    client: c,
                    sent,
                    took: sent.elapsed(),
                    status,
                });
            }
        }));
    }

    // Faults, phase by phase; metrics at each recovery phase's middle and
    // end; the demo's memory every second.
    let pid = demo.id();
    let mut rss = Vec::new();
    let mut recovery = Vec::new();
    let mut restart_took = Duration::ZERO;
    for (i, phase) in PHASES.iter().enumerate() {
        let begins = started + args.phase * i as u32;
        let middle = begins + args.phase / 2;
        let ends = begins + args.phase;
        match phase {
            Phase::Paused => container.pause().await.expect("docker pause"),
            Phase::Restarted => stop(backend, &container).await,
            Phase::Delayed => proxy.set_delay(DELAY),
            _ => {}
        }
        let mut mid_metrics = None;
        while Instant::now() < ends {
            tokio::time::sleep(Duration::from_secs(1).min(ends - Instant::now())).await;
            rss.push((*phase, rss_kib(pid)));
            if Instant::now() >= middle && mid_metrics.is_none() {
                if *phase == Phase::Restarted {
                    let t = Instant::now();
                    container.start().await.expect("docker start");
                    wait_up(backend, &url).await;
                    restart_took = t.elapsed();
                }
                mid_metrics = Some(scrape(&client, &base, backend).await);
            }
        }
        match phase {
            Phase::Paused => container.unpause().await.expect("docker unpause"),
            Phase::Delayed => proxy.set_delay(Duration::ZERO),
            _ => {}
        }
        if phase.is_recovery() {
            let end_metrics = scrape(&client, &base, backend).await;
            recovery.push(Recovery {
                phase: *phase,
                middle: mid_metrics.unwrap_or_default(),
                end: end_metrics,
            });
        }
    }
    for task in load {
        let _ = task.await;
    }
    let _ = demo.kill();
    let _ = demo.wait();
    let _ = std::fs::remove_file(&limits);
    drop(container);

    report(
        backend,
        args,
        started,
        &answers.lock().unwrap(),
        &rss,
        &recovery,
        restart_took,
    )
}

fn phase_of(started: Instant, sent: Instant, phase: Duration) -> Phase {
    let i = (sent.duration_since(started).as_secs_f64() / phase.as_secs_f64()) as usize;
    PHASES[i.min(PHASES.len() - 1)]
}

fn report(
    backend: Backend,
    args: &Args,
    started: Instant,
    answers: &[Answer],
    rss: &[(Phase, u64)],
    recovery: &[Recovery],
    restart_took: Duration,
) -> Vec<String> {
    let mut failed = Vec::new();
    let name = backend.name();
    println!(
        "\n{name}: {} clients × {} requests/s, {} s phases; GET /api/search limited to {POLICY}; \
         the store came back {restart_took:.1?} after its start",
        args.clients,
        args.rate,
        args.phase.as_secs()
    );
    println!(
        "| phase | requests | 200 | 429 | other or error | p99 ms | slowest ms | peak RSS KiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut by_phase: BTreeMap<Phase, Vec<&Answer>> = BTreeMap::new();
    for a in answers {
        by_phase
            .entry(phase_of(started, a.sent, args.phase))
            .or_default()
            .push(a);
    }
    for phase in PHASES {
        let list = by_phase.get(&phase).map(Vec::as_slice).unwrap_or(&[]);
        let count = |s: u16| list.iter().filter(|a| a.status == Some(s)).count();
        let other = list.len() - count(200) - count(429);
        let mut took: Vec<Duration> = list.iter().map(|a| a.took).collect();
        took.sort();
        let p99 = took
            .get(took.len().saturating_sub(1) * 99 / 100)
            .copied()
            .unwrap_or_default();
        let slowest = took.last().copied().unwrap_or_default();
        let peak = rss
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, k)| *k)
            .max()
            .unwrap_or(0);
        println!(
            "| {} | {} | {} | {} | {other} | {:.1} | {:.1} | {peak} |",
            phase.label(),
            list.len(),
            count(200),
            count(429),
            p99.as_secs_f64() * 1e3,
            slowest.as_secs_f64() * 1e3
        );
        if other > 0 {
            failed.push(format!(
                "{name}, {}: {other} answers neither 200 nor 429",
                phase.label()
            ));
        }
        if slowest > HANG {
            failed.push(format!(
                "{name}, {}: an answer took {slowest:?}",
                phase.label()
            ));
        }
    }
    // The limit, per client, in every window: admissions' send times within
    // a window shortened by the slowest answer (a decision falls somewhere
    // between a request's send and its answer).
    let slowest = answers.iter().map(|a| a.took).max().unwrap_or_default();
    let span = WINDOW.saturating_sub(slowest + Duration::from_millis(50));
    let mut admitted: BTreeMap<usize, Vec<Instant>> = BTreeMap::new();
    for a in answers.iter().filter(|a| a.status == Some(200)) {
        admitted.entry(a.client).or_default().push(a.sent);
    }
    let mut worst = 0;
    let mut where_worst = None;
    for (client, times) in admitted.iter_mut() {
        times.sort();
        for (i, t) in times.iter().enumerate() {
            let n = times[i..]
                .iter()
                .take_while(|u| u.duration_since(*t) < span)
                .count();
            if n > worst {
                worst = n;
                where_worst = Some((*client, i));
            }
        }
    }
    println!("most admitted to one client in one window: {worst} (limit {LIMIT})");
    if worst > LIMIT {
        // When, so that a failure says which phase and how the admissions
        // were spread: each admission's send time from the first request.
        let first = answers.iter().map(|a| a.sent).min();
        if let (Some((client, i)), Some(first)) = (where_worst, first) {
            let times: Vec<String> = admitted[&client][i..i + worst]
                .iter()
                .map(|t| format!("{:.3}", t.duration_since(first).as_secs_f64()))
                .collect();
            println!(
                "client {client}'s admissions in that window, s from the first request: {}",
                times.join(" ")
            );
        }
        failed.push(format!(
            "{name}: a client was admitted {worst} times in one window"
        ));
    }
    for Recovery { phase, middle, end } in recovery {
        let errors = end.errors - middle.errors;
        let calls = end.calls - middle.calls;
        println!(
            "{}: second half: {errors} store errors, {calls} calls answered by {name}",
            match phase {
                Phase::AfterPause => "after the pause",
                Phase::AfterRestart => "after the restart",
                _ => "after the delay",
            }
        );
        if errors != 0.0 || calls.is_nan() || calls <= 0.0 {
            failed.push(format!(
                "{name}: no exact recovery in {phase:?}: {errors} errors, {calls} calls"
            ));
        }
    }
    let baseline = rss
        .iter()
        .filter(|(p, _)| *p == Phase::Steady)
        .map(|(_, k)| *k)
        .max()
        .unwrap_or(0);
    let peak = rss.iter().map(|(_, k)| *k).max().unwrap_or(0);
    println!("demo RSS: {baseline} KiB after the steady phase, {peak} KiB at most");
    if peak > baseline * 2 {
        failed.push(format!("{name}: RSS grew from {baseline} to {peak} KiB"));
    }
    failed
}
