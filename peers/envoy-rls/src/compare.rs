//! The load generator: each contender in a child process, the same calls
//! sent to each in turn, and the figures printed as markdown tables.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::Contender;

/// High enough that the throughput phase is admitted throughout: both
/// contenders take their counting path, not an early refusal.
const LOAD_LIMIT: u64 = 1_000_000;
const EXACT_LIMIT: u64 = 1000;
const EXACT_CALLS: u64 = 5000;
const EXACT_TASKS: usize = 64;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// `memory`, or a redis:// URL every contender counts in.
    #[arg(long, default_value = "memory")]
    store: String,
    /// Concurrent callers, each on its own HTTP/2 connection.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    tasks: Vec<usize>,
    /// Calls per round, for each contender and task count.
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Distinct `user` values, sent round-robin.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Rounds per contender and task count; the best is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Offer this many calls per second in all, the same to every
    /// contender, instead of calling back to back: latencies compared at
    /// one load rather than at each server's own throughput (the best
    /// round is then the one with the lowest p99).
    #[arg(long)]
    rate: Option<f64>,
}

type Client = RateLimitServiceClient<Channel>;

pub async fn run(args: Args) -> Result<(), String> {
    if args.tasks.is_empty() || args.tasks.contains(&0) || args.rounds == 0 || args.keys == 0 {
        return Err("--tasks, --rounds and --keys must be positive".into());
    }
    if args.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err("--rate must be a positive number of calls per second".into());
    }
    let started = Instant::now();
    let contenders: &[Contender] = if args.store == "memory" {
        &[Contender::Ratewarden, Contender::Limitador]
    } else {
        &[
            Contender::Ratewarden,
            Contender::Limitador,
            Contender::RatewardenLeased,
            Contender::LimitadorCached,
        ]
    };
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load1: f64 = loadavg
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0.0);
    println!("load average: {}", loadavg.trim());
    if load1 > 0.5 {
        println!("WARNING: the machine is not quiet (1-minute load {load1} > 0.5)");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let offered = match args.rate {
        Some(rate) => format!("{rate:.0} calls/s offered"),
        None => "calls back to back".to_owned(),
    };
    println!(
        "store {}, {} calls per round, {offered}, {} keys, {} rounds (best reported), {} cores \
         shared by driver and server\n",
        args.store, args.requests, args.keys, args.rounds, cores
    );

    let requests: Arc<[RateLimitRequest]> = (0..args.keys)
        .map(|k| request(&format!("u{k:03}")))
        .collect();
    let mut servers = Vec::new();
    for &c in contenders {
        servers.push(Server::start(c, &args.store, LOAD_LIMIT).await?);
    }
    let most = *args.tasks.iter().max().expect("at least one");
    let warmup = (args.requests / 10).max(args.keys * 2);
    for server in &servers {
        let clients = connect(&[server.addr], most).await?;
        load(&clients, warmup, &requests, None).await?;
    }

    let mut rows = Vec::new();
    for &tasks in &args.tasks {
        let mut clients = Vec::new();
        for server in &servers {
            clients.push(connect(&[server.addr], tasks).await?);
        }
        let mut best: Vec<Option<Row>> = vec![None; servers.len()];
        for round in 0..args.rounds {
            // A different contender goes first each round, so none always
            // meets the machine just after another's burst.
            for i in (0..servers.len()).map(|i| (i + round) % servers.len()) {
                let before = servers[i].cpu_ns()?;
                let sample = load(&clients[i], args.requests, &requests, args.rate).await?;
                let cpu = servers[i].cpu_ns()?.saturating_sub(before);
                if sample.refused * 100 > sample.calls {
                    eprintln!(
                        "note: {} refused {} of {} calls: the load should be admitted",
                        servers[i].contender.name(),
                        sample.refused,
                        sample.calls
                    );
                }
                let row = Row::new(servers[i].contender, tasks, &sample, cpu);
                let better = |b: &Row| match args.rate {
                    Some(_) => row.p99_us < b.p99_us,
                    None => row.rate > b.rate,
                };
                if best[i].as_ref().is_none_or(better) {
                    best[i] = Some(row);
                }
            }
        }
        rows.extend(best.into_iter().flatten());
    }
    drop(servers);
    print_load(&rows);

    println!();
    let mut exact = Vec::new();
    for &c in contenders {
        exact.push(exactness(c, &args.store).await?);
    }
    print_exact(&exact);
    println!("\ntotal time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn request(user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// A contender's process, stopped when dropped.
struct Server {
    contender: Contender,
    addr: SocketAddr,
    child: Child,
}

impl Server {
    async fn start(contender: Contender, store: &str, limit: u64) -> Result<Server, String> {
        // A port free now; the child binds it a moment later.
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?;
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let child = Command::new(exe)
            .args(["serve", contender.name(), "--store", store])
            .args(["--listen", &addr.to_string(), "--limit", &limit.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", contender.name()))?;
        let mut server = Server {
            contender,
            addr,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("{} exited: {status}", contender.name()));
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not listen on {addr}", contender.name()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(server)
    }

    /// On-CPU time of every thread of the process: `/proc/PID/schedstat`
    /// alone is the main thread's, which only waits for the runtime's
    /// workers. The runtime keeps its workers for the process's life, so
    /// no thread's time is lost between two readings.
    fn cpu_ns(&self) -> Result<u64, String> {
        let dir = format!("/proc/{}/task", self.child.id());
        let tasks = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
        let mut total = 0;
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            total += stat
                .split_whitespace()
                .next()
                .and_then(|ns| ns.parse::<u64>().ok())
                .unwrap_or(0);
        }
        Ok(total)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first: the server shuts down as it would in production
        // and removes its configuration file.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tasks` clients, each on a connection of its own, spread over `addrs`.
async fn connect(addrs: &[SocketAddr], tasks: usize) -> Result<Vec<Client>, String> {
    let mut clients = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let addr = addrs[i % addrs.len()];
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    Ok(clients)
}

struct Sample {
    calls: u64,
    admitted: u64,
    refused: u64,
    elapsed: Duration,
    /// Client-observed latency of every call, nanoseconds, sorted.
    latencies: Vec<u64>,
}

/// `calls` calls over `clients`, the `i`th call with `requests[i % len]`:
/// back to back on each client, or with `rate`, the `i`th call not before
/// `i / rate` seconds from the start. A call's latency runs from when it is
/// sent, so at a rate the server keeps up with it is the server's answer
/// time under that load. Tokio's timer wakes in whole milliseconds, so the
/// calls of each millisecond leave together: the same for every contender.
async fn load(
    clients: &[Client],
    calls: u64,
    requests: &Arc<[RateLimitRequest]>,
    rate: Option<f64>,
) -> Result<Sample, String> {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = clients
        .iter()
        .map(|client| {
            let (mut client, next, requests) = (client.clone(), next.clone(), requests.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity((calls / 8) as usize);
                let mut admitted = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= calls {
                        break;
                    }
                    if let Some(rate) = rate {
                        let due = start + Duration::from_secs_f64(i as f64 / rate);
                        tokio::time::sleep_until(due.into()).await;
                    }
                    let request = requests[(i % requests.len() as u64) as usize].clone();
                    let t = Instant::now();
                    let response = client
                        .should_rate_limit(request)
                        .await
                        .map_err(|e| format!("ShouldRateLimit: {e}"))?;
                    latencies.push(t.elapsed().as_nanos() as u64);
                    if response.get_ref().overall_code == Code::Ok as i32 {
                        admitted += 1;
                    }
                }
                Ok::<_, String>((latencies, admitted))
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(calls as usize);
    let mut admitted = 0;
    for handle in handles {
        let (l, a) = handle.await.map_err(|e| e.to_string())??;
        latencies.extend(l);
        admitted += a;
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Ok(Sample {
        calls,
        admitted,
        refused: calls - admitted,
        elapsed,
        latencies,
    })
}

#[derive(Clone)]
struct Row {
    contender: Contender,
    tasks: usize,
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
}

impl Row {
    fn new(contender: Contender, tasks: usize, s: &Sample, cpu_ns: u64) -> Row {
        let at = |q: f64| {
            let i = ((s.latencies.len() as f64 * q).ceil() as usize).clamp(1, s.latencies.len());
            s.latencies[i - 1] as f64 / 1000.0
        };
        Row {
            contender,
            tasks,
            rate: s.calls as f64 / s.elapsed.as_secs_f64(),
            p50_us: at(0.50),
            p99_us: at(0.99),
            cpu_us: cpu_ns as f64 / 1000.0 / s.calls as f64,
        }
    }
}

fn print_load(rows: &[Row]) {
    println!(
        "| contender | tasks | decisions/s | p50 µs | p99 µs | server CPU µs/decision \
         | ÷ decisions/s | ÷ p50 | ÷ p99 | ÷ CPU |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        let ours = row.contender.baseline().and_then(|baseline| {
            rows.iter()
                .find(|r| r.tasks == row.tasks && r.contender == baseline)
        });
        let ratios = match ours {
            Some(rw) => format!(
                "{:.2} | {:.2} | {:.2} | {:.2}",
                rw.rate / row.rate,
                rw.p50_us / row.p50_us,
                rw.p99_us / row.p99_us,
                rw.cpu_us / row.cpu_us
            ),
            _ => "– | – | – | –".into(),
        };
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {ratios} |",
            row.contender.name(),
            row.tasks,
            row.rate,
            row.p50_us,
            row.p99_us,
            row.cpu_us
        );
    }
    println!(
        "\n÷: ratewarden's figure over the peer's at the same task count, limitador against \
         ratewarden and limitador-cached against ratewarden-leased (decisions/s: higher is \
         better for ratewarden; latency and CPU: lower is)."
    );
}

struct Exact {
    contender: Contender,
    processes: usize,
    admitted: u64,
}

/// `EXACT_CALLS` calls for one fresh key from `EXACT_TASKS` callers, over
/// two processes sharing a Redis (one for memory, which cannot be shared).
async fn exactness(contender: Contender, store: &str) -> Result<Exact, String> {
    let processes = if store == "memory" { 1 } else { 2 };
    let mut servers = Vec::new();
    for _ in 0..processes {
        servers.push(Server::start(contender, store, EXACT_LIMIT).await?);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let clients = connect(&addrs, EXACT_TASKS).await?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Unique per run: a Redis keeps counts from earlier runs for an hour.
    let key = format!("exact-{}-{}-{nanos}", contender.name(), std::process::id());
    let requests: Arc<[RateLimitRequest]> = Arc::new([request(&key)]);
    let sample = load(&clients, EXACT_CALLS, &requests, None).await?;
    Ok(Exact {
        contender,
        processes,
        admitted: sample.admitted,
    })
}

fn print_exact(rows: &[Exact]) {
    println!(
        "Exactness: {EXACT_CALLS} calls for one fresh key, limit {EXACT_LIMIT}/hour, \
         {EXACT_TASKS} concurrent callers split over the processes.\n"
    );
    println!("| contender | processes | admitted | admitted ÷ limit |");
    println!("|---|--:|--:|--:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.3} |",
            r.contender.name(),
            r.processes,
            r.admitted,
            r.admitted as f64 / EXACT_LIMIT as f64
        );
    }
}
