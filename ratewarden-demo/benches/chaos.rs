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
//!   above the timeout the slowest answers were, and how many answers
//!   waited 100 ms or more);
//! * no client admitted more than its limit in any window (a sliding log
//!   is exact, and the memory tier in front enforces it whatever the shared
//!   store does: the stated bound of a single instance failing open). The
//!   demo's limiter counts in wall-clock time and this process in monotonic
//!   time, so a window counts the admissions sent within it by both clocks
//!   (see [`admitted_in_a_window`]);
//! * recovery: in the second half of each recovery phase the shared store
//!   answers again, and no store error is counted (the demo's `/metrics`);
//! * memory: the demo's resident set never exceeds twice what it was after
//!   the first phase.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

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
/// An answer this slow waited for the store until the rule's timeout
/// (250 ms) or close to it: the figures count them, since a p99 alone
/// cannot tell 30 such answers in a phase from 300.
const WAITED: Duration = Duration::from_millis(100);
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
    /// The wall clock when it was sent: the clock the demo's limiter reads.
    wall: SystemTime,
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
    ratewarden_test_support::rss::status_kib(&pid.to_string(), "VmRSS:")
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
                let wall = SystemTime::now();
                let status = get(&client, &url, Some(&xff)).await.ok().map(|(s, _)| s);
                answers.lock().unwrap().push(Answer {
                    client: c,
                    sent,
                    wall,
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
        "| phase | requests | 200 | 429 | other or error | p99 ms | slowest ms | over {} ms | peak RSS KiB |",
        WAITED.as_millis()
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
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
        let waited = took.iter().filter(|&&t| t >= WAITED).count();
        let peak = rss
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, k)| *k)
            .max()
            .unwrap_or(0);
        println!(
            "| {} | {} | {} | {} | {other} | {:.1} | {:.1} | {waited} | {peak} |",
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
    // between a request's send and its answer), in both clocks.
    let slowest = answers.iter().map(|a| a.took).max().unwrap_or_default();
    let span = WINDOW.saturating_sub(slowest + Duration::from_millis(50));
    let (admitted, windows) = admitted_in_a_window(answers, span);
    let first = answers.iter().map(|a| a.sent).min();
    let offsets: Vec<f64> = first
        .map(|first| {
            answers
                .iter()
                .map(|a| wall_offset(first, a.sent, a.wall))
                .collect()
        })
        .unwrap_or_default();
    let (low, high) = range_ms(&offsets);
    println!("wall clock against this process's clock: {low:+.1} to {high:+.1} ms over the run");
    println!(
        "most admitted to one client in one window: {} (limit {LIMIT})",
        windows.both.n
    );
    // When, so that an excess says which phase and how the admissions were
    // spread: each admission's send time from the first request, and how
    // far the wall clock moved against this process's clock meanwhile.
    let show = |worst: &Worst| {
        let Some(first) = first else { return };
        let window = window(&admitted[&worst.client], worst.first, span, worst.both);
        let times: Vec<String> = window
            .iter()
            .map(|(t, _)| format!("{:.3}", t.duration_since(first).as_secs_f64()))
            .collect();
        let offsets: Vec<f64> = window
            .iter()
            .map(|&(t, w)| wall_offset(first, t, w))
            .collect();
        let (low, high) = range_ms(&offsets);
        println!(
            "client {}'s admissions in that window, s from the first request: {}; \
             the wall clock meanwhile: {low:+.1} to {high:+.1} ms",
            worst.client,
            times.join(" ")
        );
    };
    if windows.monotonic.n > LIMIT && windows.both.n <= LIMIT {
        println!(
            "note: {} admitted to one client within one window of this process's clock, \
             but no more than {LIMIT} within one of the wall clock the demo's limiter reads: \
             the wall clock was stepped",
            windows.monotonic.n
        );
        show(&windows.monotonic);
    }
    if windows.both.n > LIMIT {
        show(&windows.both);
        failed.push(format!(
            "{name}: a client was admitted {} times in one window",
            windows.both.n
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

/// Where one client got the most admissions in one window: `n` of its
/// admissions from its `first`th, in the order they were sent, counted in
/// `both` clocks or in this process's alone.
#[derive(Clone, Copy, Default)]
struct Worst {
    n: usize,
    client: usize,
    first: usize,
    both: bool,
}

/// The most admissions one client got in one window: counted in both
/// clocks, and in this process's clock alone.
#[derive(Default)]
struct Windows {
    both: Worst,
    monotonic: Worst,
}

/// Admissions' send times by client, in this process's clock and the wall
/// clock, in the order they were sent.
type Admitted = BTreeMap<usize, Vec<(Instant, SystemTime)>>;

/// Each client's admissions, and the most that one client got in one
/// window: admissions sent within `span` of the window's first one, by
/// this process's monotonic clock and by the wall clock.
///
/// The demo's limiter reads the wall clock (`SystemClock`) and keeps its
/// limit in every window of that clock, and the two clocks agree unless
/// the host's wall clock is stepped (NTP, a virtual machine resumed). A
/// step forward makes a sliding log forget what it counted, so it admits
/// up to one window more in real time: a step of 3.5 s or more at the
/// wrong moment admits every request of a 10 s window, 30 where the limit
/// is 20, while the limit holds on the limiter's own clock. A step back is
/// clamped by the limiter (stricter in real time), but moves the wall
/// times of later sends back among earlier ones. Each step inflates the
/// count of one clock only; with no step the count in both is either's.
fn admitted_in_a_window(answers: &[Answer], span: Duration) -> (Admitted, Windows) {
    let mut admitted = Admitted::new();
    for a in answers.iter().filter(|a| a.status == Some(200)) {
        admitted.entry(a.client).or_default().push((a.sent, a.wall));
    }
    let mut windows = Windows::default();
    for times in admitted.values_mut() {
        times.sort();
    }
    for (&client, times) in &admitted {
        for first in 0..times.len() {
            for (both, worst) in [(true, &mut windows.both), (false, &mut windows.monotonic)] {
                let n = window(times, first, span, both).len();
                if n > worst.n {
                    *worst = Worst {
                        n,
                        client,
                        first,
                        both,
                    };
                }
            }
        }
    }
    (admitted, windows)
}

/// The admissions in the window that opens at `times[first]`: those sent
/// within `span` of it by this process's clock and, if `both`, by the wall
/// clock too. One sent at a wall time before the first's (the wall clock
/// was stepped back) is in it: the strict side.
fn window(
    times: &[(Instant, SystemTime)],
    first: usize,
    span: Duration,
    both: bool,
) -> Vec<(Instant, SystemTime)> {
    let (t, wall) = times[first];
    times[first..]
        .iter()
        .take_while(|(u, _)| u.duration_since(t) < span)
        .filter(|(_, w)| !both || w.duration_since(wall).map_or(true, |d| d < span))
        .copied()
        .collect()
}

/// The wall clock at `sent` (`wall`, read then) less the time since
/// `first` by this process's clock, in seconds: the same for every send
/// until the wall clock is stepped or slewed.
fn wall_offset(first: Instant, sent: Instant, wall: SystemTime) -> f64 {
    let wall = wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    wall - sent.duration_since(first).as_secs_f64()
}

/// The spread of `offsets` (s) around the first, in milliseconds.
fn range_ms(offsets: &[f64]) -> (f64, f64) {
    let Some(&base) = offsets.first() else {
        return (0.0, 0.0);
    };
    offsets.iter().fold((0.0, 0.0), |(low, high), &o| {
        let d = (o - base) * 1e3;
        (f64::min(low, d), f64::max(high, d))
    })
}
